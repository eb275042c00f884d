#!/usr/bin/env bash
# The HTTP API's benchmarks (tests/http/bench.py) against a real daemon: HTTP vs gRPC per-token
# overhead and prefix-reuse time to first token, on a synthetic checkpoint of SHAPE (default
# tiny; `small` for the prefix-reuse figure the issue asks for), or of an existing checkpoint
# when the first argument is a directory (the `bench` shape is 13.4 GB: synthesise it once).
# `--only ttft` measures time to first token of a long chat, cold and warm, starting a daemon
# per run itself (flags for it in K3_SERVE_ARGS, e.g. "--ram-gb 13 --threads 2"); `--only
# session` likewise a new session's with a long shared prelude: cold, warm in memory, and warm
# from disk after a restart.
# Needs the venv tests/run.sh installs (target/venv-http). Binaries: debug, or release with
# K3_BENCH_PROFILE=release.
#
#   tests/http/bench.sh [SHAPE|MODEL_DIR] [bench.py options...]
#   K3_SERVE_ARGS="--ram-gb 13 --threads 2" tests/http/bench.sh MODEL_DIR --only ttft \
#       --ttft-tokens 1000 --runs 3
set -euo pipefail
cd "$(dirname "$0")/../.."
shape=${1:-tiny}
shift || true
python=target/venv-http/bin/python
[[ -x $python ]] || { echo "bench: run tests/run.sh once (it installs $python)" >&2; exit 1; }
profile=${K3_BENCH_PROFILE:-debug}
case $profile in
    debug) cargo build -q -p k3d -p k3 --bins ;;
    release) cargo build -q --release -p k3d -p k3 --bins ;;
    *) echo "bench: K3_BENCH_PROFILE is debug or release" >&2; exit 1 ;;
esac
bin=target/$profile
work=$(mktemp -d -t k3-http-bench-XXXX)
daemon=
trap '[[ -n $daemon ]] && { kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; }; rm -rf "$work"' EXIT
if [[ -d $shape ]]; then
    model=$shape
    shape=$(basename "$model")
else
    model=$work/$shape
    $bin/k3d synth --shape "$shape" "$model" >/dev/null
fi
if [[ " $* " == *" --only ttft "* || " $* " == *" --only session "* ]]; then
    "$python" tests/http/bench.py --k3d $bin/k3d --model-dir "$model" --work "$work" \
        --model "$shape" --serve-args "${K3_SERVE_ARGS:-}" "$@"
    exit
fi
# One request at a time: the figures are per request, not under contention.
$bin/k3d serve --model "$model" --socket "$work/k3d.sock" \
    --http "unix:$work/http.sock" --session-dir "$work/sessions" --session-gb 1 \
    --max-active 1 ${K3_SERVE_ARGS:-} 2>"$work/k3d.log" &
daemon=$!
for _ in $(seq 6000); do  # up to 10 minutes: `bench` loads 13.4 GB
    $bin/k3 --socket "$work/k3d.sock" status 2>/dev/null | grep -q '^daemon *ready' && break
    sleep 0.1
done
"$python" tests/http/bench.py --k3 $bin/k3 --grpc-socket "$work/k3d.sock" \
    --http-socket "$work/http.sock" --model "$shape" "$@"
