#!/usr/bin/env bash
# The real coding agents tests/e2e_agents.rs runs against k3d, installed under target/ (as the
# HTTP clients' venv is), each skipped when its pinned version is already there. Called by
# tests/run.sh; runnable alone (`tests/install_agents.sh`) to set up or refresh them.
#   - Claude Code, Codex CLI and opencode from npm (each ships a native binary as an optional
#     dependency);
#   - aider from PyPI, in a venv of its own (it pins its whole dependency tree).
# Pinned: the versions whose requests are captured in tests/fixtures/agent-requests and that
# docs/agents.md's recipes were written for; a newer agent is a new test run, not a silent one.
set -euo pipefail
cd "$(dirname "$0")/.."

CLAUDE_CODE=2.1.197
CODEX=0.171.0
OPENCODE=1.18.33
AIDER=0.86.2

# No update checks, no notifier, no telemetry while installing.
export NO_UPDATE_NOTIFIER=1 npm_config_update_notifier=false npm_config_fund=false \
    npm_config_audit=false PIP_DISABLE_PIP_VERSION_CHECK=1 DISABLE_AUTOUPDATER=1

npm_dir=target/agents-npm
bin=$npm_dir/node_modules/.bin
version_of() { "$@" --version 2>/dev/null | head -n1 || true; }
if [[ $(version_of "$bin/claude") != "$CLAUDE_CODE "* || $(version_of "$bin/codex") != *" $CODEX" ||
    $(version_of "$bin/opencode") != "$OPENCODE" ]]; then
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || {
        echo "tests: node and npm are missing; the agent tests need Node.js >= 18 (apt-get install nodejs npm)" >&2
        exit 1
    }
    node_major=$(node -p 'process.versions.node.split(".")[0]')
    if ((node_major < 18)); then
        echo "tests: node $(node --version) is too old; Claude Code and Codex need Node.js >= 18" >&2
        exit 1
    fi
    echo "tests: installing Claude Code $CLAUDE_CODE, Codex $CODEX and opencode $OPENCODE into $npm_dir"
    mkdir -p "$npm_dir"
    npm install --prefix "$npm_dir" --no-save --loglevel=error \
        "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX" "opencode-ai@$OPENCODE"
    [[ $(version_of "$bin/claude") == "$CLAUDE_CODE "* ]] || {
        echo "tests: $bin/claude does not run as Claude Code $CLAUDE_CODE after the install" >&2
        exit 1
    }
    [[ $(version_of "$bin/codex") == *" $CODEX" ]] || {
        echo "tests: $bin/codex does not run as Codex $CODEX after the install" >&2
        exit 1
    }
    [[ $(version_of "$bin/opencode") == "$OPENCODE" ]] || {
        echo "tests: $bin/opencode does not run as opencode $OPENCODE after the install" >&2
        exit 1
    }
fi

venv=target/venv-aider
if [[ $(version_of "$venv/bin/aider") != "aider $AIDER" ]]; then
    # aider 0.86 supports Python 3.10 to 3.12.
    python3 -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' || {
        echo "tests: aider $AIDER needs Python 3.10-3.12; python3 is $(python3 --version 2>&1)" >&2
        exit 1
    }
    echo "tests: installing aider $AIDER into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "aider-chat==$AIDER"
    [[ $(version_of "$venv/bin/aider") == "aider $AIDER" ]] || {
        echo "tests: $venv/bin/aider does not run as aider $AIDER after the install" >&2
        exit 1
    }
fi
