#!/usr/bin/env bash
# A first run from a fresh clone: build, make a tiny model, serve it, stream a generation.
#
#   ./packaging/demo.sh [PROMPT]
#
# 1. builds release binaries (cargo does nothing if they are up to date), or uses the `k3d` and
#    `k3` in $K3_BIN_DIR when it is set (the test suite runs this script with its own build);
# 2. uses the trained tiny model committed in tests/fixtures/trained/model (released layout,
#    2 MB, trained on the CPython standard library: it continues Python code as Python code);
# 3. starts `k3d serve` on a socket in a temporary directory, in the background;
# 4. says what the model is, then streams a generation through `k3 run` (a 2 MB model: expect
#    text shaped like its training data that repeats itself, not a correct program);
# 5. stops the daemon (SIGTERM) and removes the socket, also on Ctrl-C or failure; the daemon's
#    log is kept and its path printed, with the next steps (a daemon of your own, `k3 chat`).
set -euo pipefail

# The prompt the fixture continues best, measured by tools/train/demo_prompt.py: two lines of
# the table of build flags in CPython's sysconfig data, which it was trained on.
prompt=${1:-$' \'HAVE_LIBDLD\': 0,\n \'HAVE_LIBGDBM_COMPAT\': 0,\n'}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
started=$(date +%s)
say() { printf '\033[1mdemo:\033[0m %s\n' "$*" >&2; }

if [[ -n "${K3_BIN_DIR:-}" ]]; then
    bin_dir=$K3_BIN_DIR
    say "using the binaries in $bin_dir (K3_BIN_DIR)"
else
    command -v cargo >/dev/null || { say "cargo not found: install Rust (https://rustup.rs) first"; exit 1; }
    say "building release binaries (cargo build --release -p k3d -p k3; the first build takes a few minutes)"
    cargo build --release -p k3d -p k3
    bin_dir="$repo/target/release"
fi
k3d="$bin_dir/k3d"
k3="$bin_dir/k3"

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

say "the model: a 2 MB Kimi K3 (the real architecture, tiny sizes) trained for 18 minutes on Python's standard library, to test every K3 feature; it learned the shape of its text and repeats itself. The real Kimi K3 is 1.56 TB on disk, best on a fast NVMe drive, and runs in 1.3 GiB of RAM or more (more RAM, faster): docs/running-k3.md"
say "k3 run \"$prompt\""
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
