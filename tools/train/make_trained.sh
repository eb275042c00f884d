#!/usr/bin/env bash
# Trains (unless already trained), exports and writes the reference fixtures of the trained
# model: tests/fixtures/trained/model (the checkpoint, released layout) and
# tests/fixtures/trained/reference (mlx-lm 0.32.2 greedy ids and logits on it). CI never runs
# this: the outputs are committed. See tools/train/README.md.
#
#   tools/train/make_trained.sh [--retrain | --reference]
#
# Trains when the work directory holds no finished run (continuing an interrupted one), or
# from scratch with --retrain; --reference only re-runs the reference on the committed model.
#
# Environment: K3_TRAIN_VENV     python venv with mlx[cpu]==0.32.4, mlx-lm==0.32.2 (created if
#                                missing; default venv/ at the repository root, gitignored)
#              K3_TRAIN_WORK     training work directory (default tools/train/work/run, gitignored)
#              K3_TRAIN_MINUTES  train in segments of about this many minutes, each its own
#                                process resuming the last (default 0: one process); the result
#                                is the same, and a shared machine gets its CPU back in between
#              K3_TRAIN_LAUNCH   command prefix of each training segment (default `nice -n 10`;
#                                e.g. a wrapper that takes a shared CPU lock)
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

mode="${1:-}"
if [[ "$mode" == "--retrain" ]]; then
    rm -f "$work/train_log.json" "$work/resume.npz" "$work/resume.json"
fi
if [[ "$mode" != "--reference" ]]; then
    if [[ ! -f "$work/train_log.json" ]]; then
        # The machine is shared: train at low priority (~1 h on 2 busy cores).
        read -r -a launch <<<"${K3_TRAIN_LAUNCH:-nice -n 10}"
        while :; do
            rc=0
            "${launch[@]}" "$py" "$repo/tools/train/train.py" "$work" --minutes "${K3_TRAIN_MINUTES:-0}" || rc=$?
            ((rc == 75)) || break # 75: a segment ended, the run goes on
        done
        ((rc == 0)) || exit "$rc"
    fi
    "$py" "$repo/tools/train/export.py" "$work" "$model"
    cp "$work/train_log.json" "$work/corpus.json" "$repo/tests/fixtures/trained/"
fi

(cd "$repo" && cargo build --quiet -p k3d --bin k3d)
k3d="$repo/target/debug/k3d"
"$k3d" check "$model" >/dev/null

# In-domain prompts, tokenised by the engine (so the fixture also pins the tokenizer files):
# three of Python source, and a chat prompt as the template renders it (spec §8: a tool
# declared, thinking off, a question the tool answers; daemon/engine/tests/model_reference.rs
# renders the same conversation and checks it gives these ids).
chat=$'<|open|>message role="system" type="tool-declare"<|sep|># Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n[{"function":{"name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}},"type":"function"}]\n```<|close|>message<|sep|><|end_of_msg|><|open|>message role="user"<|sep|>What\'s the weather in Paris?<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>response<|sep|>'
prompts="$(mktemp)"
trap 'rm -f "$prompts"' EXIT
ids() {
    "$k3d" tokenize --tok "$model" --json "$@" | "$py" -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["ids"]), end="")'
}
{
    printf '['
    for text in $'def fibonacci(n):\n' $'import os\nimport sys\n\n' $'class Error(Exception):\n    def __init__(self, msg):\n'; do
        printf '%s' "$text" | ids
        printf ','
    done
    printf '%s' "$chat" | ids --specials
    printf ']\n'
} >"$prompts"

fingerprint="$(cd "$model" && sha256sum -- * | LC_ALL=C sort -k2 | sha256sum | cut -d' ' -f1)"
"$py" "$repo/tests/reference/make_fixtures.py" "$model" "$reference" \
    --shape trained --seed 0 --fingerprint "$fingerprint" --prompts "$prompts"
du -sh "$model" "$reference" >&2
