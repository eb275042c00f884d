#!/usr/bin/env bash
# Regenerates tests/fixtures/reference/<shape>/ for every tiny shape: builds k3d, writes each
# checkpoint with `k3d synth`, and runs make_fixtures.py under mlx-lm 0.32.2 (CPU, float32).
#
# Environment: K3_REF_VENV  python venv with the pinned mlx/mlx-lm (created if missing;
#                           default tests/reference/.venv)
#              K3_REF_TMP   scratch directory for the checkpoints (default: mktemp -d)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${K3_REF_VENV:-$repo/tests/reference/.venv}"
shapes=(tiny tiny-b tiny-c)
seed=0

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating venv $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" numpy
fi

(cd "$repo" && cargo build --quiet -p k3d --bin k3d)
k3d="$repo/target/debug/k3d"

tmp="${K3_REF_TMP:-$(mktemp -d)}"
cleanup() { if [[ -z "${K3_REF_TMP:-}" ]]; then rm -rf "$tmp"; fi; }
trap cleanup EXIT

for shape in "${shapes[@]}"; do
    ckpt="$tmp/$shape"
    # `k3d synth` prints: shape S seed N vocab V bytes B content-sha256 C fingerprint F; the
    # fixtures record C (the files' bytes) under the name `fingerprint`.
    line="$("$k3d" synth --shape "$shape" --seed "$seed" --force "$ckpt")"
    fingerprint="${line##* content-sha256 }"
    fingerprint="${fingerprint%% *}"
    "$venv/bin/python" "$repo/tests/reference/make_fixtures.py" "$ckpt" \
        "$repo/tests/fixtures/reference/$shape" \
        --shape "$shape" --seed "$seed" --fingerprint "$fingerprint"
done
du -sh "$repo/tests/fixtures/reference" >&2
