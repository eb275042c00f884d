#!/usr/bin/env bash
# A first run from a fresh clone: build, make a tiny model, serve it, stream a generation.
#
#   ./packaging/demo.sh [PROMPT]
#
# 1. builds release binaries (cargo does nothing if they are up to date);
# 2. uses the trained tiny model committed in tests/fixtures/trained/model (released layout,
#    2 MB, trained on the CPython standard library: it continues Python code as Python code);
# 3. starts `k3d serve` on a socket in a temporary directory, in the background;
# 4. streams a generation through `k3 run` (a 2 MB model: expect Python-shaped text that
#    repeats itself, not a correct program);
# 5. stops the daemon (SIGTERM) and removes the socket, also on Ctrl-C or failure; the daemon's
#    log is kept and its path printed, with the next steps (a daemon of your own, `k3 chat`).
set -euo pipefail

prompt=${1:-$'def fibonacci(n):\n'}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
started=$(date +%s)
say() { printf '\033[1mdemo:\033[0m %s\n' "$*" >&2; }

command -v cargo >/dev/null || { say "cargo not found: install Rust (https://rustup.rs) first"; exit 1; }
say "building release binaries (cargo build --release -p k3d -p k3; the first build takes a few minutes)"
cargo build --release -p k3d -p k3
k3d="$repo/target/release/k3d"
k3="$repo/target/release/k3"

model="$repo/tests/fixtures/trained/model"
say "using the trained tiny model in $model"

rundir=$(mktemp -d "${TMPDIR:-/tmp}/k3-demo.XXXXXX")
socket="$rundir/k3d.sock"
# The log outlives the demo (it is what to read when something went wrong).
log="${TMPDIR:-/tmp}/k3-demo-$(date +%Y%m%d-%H%M%S).log"
daemon_pid=
cleanup() {
    if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
        say "stopping the daemon (pid $daemon_pid)"
        kill -TERM "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    rm -rf "$rundir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "starting k3d serve on $socket (log: $log)"
"$k3d" serve --model "$model" --socket "$socket" --socket-mode 0600 >"$log" 2>&1 &
daemon_pid=$!

# Ready when `k3 status` answers; give up after 60 s or if the daemon dies.
for _ in $(seq 1 600); do
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
        say "the daemon exited during start-up:"; cat "$log" >&2; exit 1
    fi
    if [[ -S "$socket" ]] && "$k3" --socket "$socket" status >/dev/null 2>&1; then
        break
    fi
    sleep 0.1
done
"$k3" --socket "$socket" status >/dev/null || { say "daemon not ready after 60 s:"; cat "$log" >&2; exit 1; }

say "k3 run \"$prompt\" (a 2 MB model trained on Python sources)"
"$k3" --socket "$socket" run --max-tokens 24 "$prompt"
echo
cleanup
daemon_pid=
say "daemon stopped, socket removed; done in $(( $(date +%s) - started )) s; its log: $log"
say "next: run a daemon of your own and talk to it:"
cat >&2 <<EOF
    $k3d serve --model $model &      # socket: \$XDG_RUNTIME_DIR/k3d.sock, where k3 looks
    $k3 chat                         # /help lists the commands; Ctrl-D ends
    $k3 run "Once upon a time"
EOF
