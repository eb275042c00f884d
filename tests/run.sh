#!/usr/bin/env bash
# The k3 test suite, from a fresh clone: installs what the tests need that a fresh machine of
# this kind may lack, then runs every test of the workspace. README.md names this script as
# the test command, and .ci/run calls it through the README.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v tmux >/dev/null 2>&1 || missing+=(tmux)                       # REPL tests drive a real terminal
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)         # packaging tests lint the units
command -v nvim >/dev/null 2>&1 || missing+=(neovim)                     # the editor plugin's headless test
command -v curl >/dev/null 2>&1 || missing+=(curl)                       # SSE over the socket, the plugin's transport
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv) # the HTTP API's real-client tests
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "tests: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
        exit 1
    fi
    echo "tests: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "tests: cargo not found; install Rust 1.95 (rustup)" >&2; exit 1; }

# The HTTP API is tested with the official `openai` and `anthropic` packages (tests/e2e_http.rs
# runs pytest in this venv and fails, naming this script, when it is missing), constrained
# replies checked against their schemas by `jsonschema` (an independent validator); `k3d pull`'s
# Hub lookalike is proven against the official `huggingface_hub`. Pinned: what the tests judge.
venv=target/venv-http
if ! "$venv/bin/python" -c 'import openai, anthropic, httpx2, pytest, jsonschema, huggingface_hub' >/dev/null 2>&1; then
    echo "tests: installing the openai and anthropic clients into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'openai==3.51.0' 'anthropic==2.10.0' 'httpx2==2.16.2' 'pytest==9.2.0' 'jsonschema==4.26.0' 'huggingface_hub==2.4.0'
fi

# The real coding agents (Claude Code, Codex, aider, opencode) that tests/e2e_agents.rs drives against
# k3d, pinned, under target/.
tests/install_agents.sh

# A full build of the suite takes about 6 GB of target/ (more with incremental caches, which a
# one-off run never reuses); say so plainly before the linker runs out of room halfway.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
free_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if ((free_kb < 8 * 1024 * 1024)); then
    echo "tests: only $((free_kb / 1024)) MiB free on $(df -P . | awk 'NR==2 {print $6}'); the suite needs about 8 GiB for target/" >&2
    exit 1
fi

# The end-to-end tests spawn the real k3d and k3 binaries from target/debug.
cargo build --workspace --bins
# Every test binary runs even after one fails, so one failure does not hide others; cargo still
# exits non-zero if any test failed (and `set -e` passes that on).
cargo test --workspace --no-fail-fast "$@"
