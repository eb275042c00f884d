#!/bin/sh
# Runs daemon/engine/examples/tokenizer_bench.rs on the o200k-based 163,840-id stand-in vocabulary.
# o200k_base.tiktoken comes from the tiktoken-rs dev-dependency's sources (cargo metadata).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
crate=$(cargo metadata --format-version 1 --offline --manifest-path "$root/Cargo.toml" |
    python3 -c 'import json,sys,os; print(next(os.path.dirname(p["manifest_path"]) for p in json.load(sys.stdin)["packages"] if p["name"]=="tiktoken-rs"))')
o200k="$crate/assets/o200k_base.tiktoken"
[ -f "$o200k" ] || { echo "missing $o200k" >&2; exit 1; }
scratch=${TMPDIR:-/tmp}/k3-tokenizer-bench.$$
trap 'rm -rf "$scratch"' EXIT
cargo run --release -q -p k3-engine --example tokenizer_bench -- \
    "$o200k" "$root/tests/fixtures/tokenizer/k3/tokenizer_config.json" \
    "$root/tests/fixtures/tokenizer/o200k/corpus.txt" "$scratch"
