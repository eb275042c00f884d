#!/usr/bin/env bash
# Trains (unless already trained), exports and writes the reference fixtures of the trained
# model: tests/fixtures/trained/model (the checkpoint, released layout) and
# tests/fixtures/trained/reference (mlx-lm 0.32.2 greedy ids and logits on it). CI never runs
# this: the outputs are committed. See tools/train/README.md.
#
#   tools/train/make_trained.sh [--retrain]
#
# Environment: K3_TRAIN_VENV  python venv with mlx[cpu]==0.32.4, mlx-lm==0.32.2 (created if
#                             missing; default venv/ at the repository root, gitignored)
#              K3_TRAIN_WORK  training work directory (default tools/train/work/run, gitignored)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${K3_TRAIN_VENV:-$repo/venv}"
work="${K3_TRAIN_WORK:-$repo/tools/train/work/run}"
model="$repo/tests/fixtures/trained/model"
reference="$repo/tests/fixtures/trained/reference"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating venv $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" numpy regex
fi
py="$venv/bin/python"

if [[ "${1:-}" == "--retrain" || ! -f "$work/train_log.json" ]]; then
    # The machine is shared: train at low priority (~30 min on 2 busy cores).
    nice -n 10 "$py" "$repo/tools/train/train.py" "$work"
fi
"$py" "$repo/tools/train/export.py" "$work" "$model"
cp "$work/train_log.json" "$work/corpus.json" "$repo/tests/fixtures/trained/"

(cd "$repo" && cargo build --quiet -p k3d --bin k3d)
k3d="$repo/target/debug/k3d"
"$k3d" check "$model" >/dev/null

# In-domain prompts, tokenised by the engine (so the fixture also pins the tokenizer files).
prompts="$(mktemp)"
trap 'rm -f "$prompts"' EXIT
{
    printf '['
    sep=
    for text in $'def fibonacci(n):\n' $'import os\nimport sys\n\n' $'class Error(Exception):\n    def __init__(self, msg):\n'; do
        printf '%s' "$sep"
        printf '%s' "$text" | "$k3d" tokenize --tok "$model" --json | "$py" -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["ids"]), end="")'
        sep=,
    done
    printf ']\n'
} >"$prompts"

fingerprint="$(cd "$model" && sha256sum -- * | LC_ALL=C sort -k2 | sha256sum | cut -d' ' -f1)"
"$py" "$repo/tests/reference/make_fixtures.py" "$model" "$reference" \
    --shape trained --seed 0 --fingerprint "$fingerprint" --prompts "$prompts"
du -sh "$model" "$reference" >&2
