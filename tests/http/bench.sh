#!/usr/bin/env bash
# The HTTP API's benchmarks (tests/http/bench.py) against a real daemon: HTTP vs gRPC per-token
# overhead and prefix-reuse time to first token, on a synthetic checkpoint of SHAPE (default
# tiny; `small` for the prefix-reuse figure the issue asks for), or of an existing checkpoint
# when the first argument is a directory (the `bench` shape is 13.4 GB: synthesise it once).
# Needs the venv tests/run.sh installs (target/venv-http) and the debug binaries.
#
#   tests/http/bench.sh [SHAPE|MODEL_DIR] [bench.py options...]
set -euo pipefail
cd "$(dirname "$0")/../.."
shape=${1:-tiny}
shift || true
python=target/venv-http/bin/python
[[ -x $python ]] || { echo "bench: run tests/run.sh once (it installs $python)" >&2; exit 1; }
cargo build -q --bins
work=$(mktemp -d -t k3-http-bench-XXXX)
trap 'kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; rm -rf "$work"' EXIT
if [[ -d $shape ]]; then
    model=$shape
    shape=$(basename "$model")
else
    model=$work/$shape
    target/debug/k3d synth --shape "$shape" "$model" >/dev/null
fi
# One request at a time: the figures are per request, not under contention.
target/debug/k3d serve --model "$model" --socket "$work/k3d.sock" \
    --http "unix:$work/http.sock" --session-dir "$work/sessions" --session-gb 1 \
    --max-active 1 2>"$work/k3d.log" &
daemon=$!
for _ in $(seq 6000); do  # up to 10 minutes: `bench` loads 13.4 GB
    target/debug/k3 --socket "$work/k3d.sock" status 2>/dev/null | grep -q '^state: *ready' && break
    sleep 0.1
done
"$python" tests/http/bench.py --k3 target/debug/k3 --grpc-socket "$work/k3d.sock" \
    --http-socket "$work/http.sock" --model "$shape" "$@"
