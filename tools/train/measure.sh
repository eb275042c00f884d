#!/usr/bin/env bash
# Runs the measurements of tests/fixtures/trained/README.md on the trained model and writes the
# raw documents to OUT (one JSON per run) plus summary.md, the figures the README's tables quote.
# Counts (drafts, bytes, guesses) are exact and repeatable; the wall-clock columns are not.
#
#   tools/train/measure.sh OUT [MODEL]     (MODEL defaults to tests/fixtures/trained/model)
#
# Needs a release build (`cargo build --release -p k3d`, done here if missing), python3 for the
# speed-up estimate and the venv of make_trained.sh for routing_stats.py (skipped, and said so,
# without it). The speed-up on `bench` prices each forward with the c(d) measured there
# (`k3d bench --prompt-tokens K`) at 4.75 GiB (docs/measurements/issue-16/c*.json), 2 GiB and
# 1 GiB (docs/measurements/issue-16/budget-*/c*.json); see the fixture README.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:?usage: measure.sh OUT [MODEL]}"
model="${2:-$repo/tests/fixtures/trained/model}"
venv="${K3_TRAIN_VENV:-$repo/venv}"
k3d="$repo/target/release/k3d"
[[ -x "$k3d" ]] || (cd "$repo" && cargo build --quiet --release -p k3d --bin k3d)
mkdir -p "$out"

# Exact speculation (issue 16 item 4): repetitive prompts, 128 ids, off / N = 4 / N = 8.
declare -A prompts=(
    [list]=$'names = [\n    \'alpha\',\n    \'beta\',\n    \'gamma\',\n    \'delta\',\n]\nnames = [\n    \'alpha\',\n    \'beta\',\n'
    [function]=$'def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n\n\ndef add(a, b):\n'
    [imports]=$'import os\nimport sys\nimport re\n\n\nimport os\nimport sys\n'
    [fibonacci]=$'def fibonacci(n):\n'
)
budgets=(4.75gib 2gib 1gib)
declare -A cost_dir=(
    [4.75gib]="$repo/docs/measurements/issue-16"
    [2gib]="$repo/docs/measurements/issue-16/budget-2gib"
    [1gib]="$repo/docs/measurements/issue-16/budget-1gib"
)
for name in list function imports fibonacci; do
    for n in 0 4 8; do
        echo "speculation: $name, N = $n" >&2
        "$k3d" run "$model" --prompt "${prompts[$name]}" --gen 128 --json --speculate "$n" \
            >"$out/spec-$name-$n.json"
    done
    for budget in "${budgets[@]}"; do
        costs=()
        for k in 1 2 3 4 5 6 7 8 9; do costs+=(--bench "${cost_dir[$budget]}/c$k.json"); done
        python3 "$repo/tools/speculation_speedup.py" --plain "$out/spec-$name-0.json" "${costs[@]}" \
            "$out/spec-$name-4.json" "$out/spec-$name-8.json" >"$out/speedup-$name-$budget.txt"
    done
done

# Routing lookahead per layer and across the dense layer: whole trunk resident, a small cache.
for mode in off input mlp-input; do
    echo "lookahead: --dense-lookahead $mode" >&2
    "$k3d" run "$model" --prompt "${prompts[fibonacci]}" --gen 128 --ram-gb 0.004 --json \
        --dense-lookahead "$mode" >"$out/lookahead-$mode.json"
done

# Expert cache policies: replayed on the run's trace, and in place (the store's own cache; five
# runs each, as the reads issued ahead land at times that vary, and with them what a slot holds).
echo "cache policies: replay" >&2
"$k3d" bench "$model" --ram-gb 0.004 --tokens 64 --runs 1 --policy-slots 4,8,16,32,64 --json \
    >"$out/policy-replay.json" 2>/dev/null
for slots in 8 16 32 64; do
    gib="$(python3 -c "print($slots * 8192 / 2**30)")"
    for policy in lru lfu-aging; do
        echo "cache policies: $policy in place, $slots slots" >&2
        "$k3d" bench "$model" --ram-gb 0.005 --cache-gb "$gib" --tokens 64 --runs 5 \
            --cache-policy "$policy" --json >"$out/policy-$policy-$slots.json" 2>/dev/null
    done
done

# Routing on real text vs random ids (mlx-lm's routing of the exported model).
if [[ -x "$venv/bin/python" ]]; then
    "$venv/bin/python" "$repo/tools/train/routing_stats.py" "$model" >"$out/routing.txt"
else
    echo "routing_stats.py skipped: no venv at $venv (tools/train/make_trained.sh makes it)" \
        | tee "$out/routing.txt" >&2
fi

python3 - "$out" <<'EOF' | tee "$out/summary.md"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
load = lambda name: json.loads((out / name).read_text())
print("## speculation (decoded ids, forwards, drafts per forward, ids/forward)")
for name in ["list", "function", "imports", "fibonacci"]:
    plain = load(f"spec-{name}-0.json")
    for n in (4, 8):
        r = load(f"spec-{name}-{n}.json")
        assert r["generated_ids"] == plain["generated_ids"], f"{name} N={n}: ids differ from greedy"
        hist = " ".join(f"{d}:{c}" for d, c in enumerate(r["drafts_per_forward"]) if c)
        print(f"{name} N={n}: proposed {r['drafts_proposed']} accepted {r['drafts_accepted']} "
              f"forwards {r['decode_forwards']} ({hist}) "
              f"ids/forward {(r['decode_forwards'] + r['drafts_accepted']) / r['decode_forwards']:.2f}")
    for budget in ["4.75gib", "2gib", "1gib"]:
        print(f"priced at {budget}:")
        print((out / f"speedup-{name}-{budget}.txt").read_text())
print("## lookahead, share of each MoE layer's routing guessed")
for mode in ["off", "input", "mlp-input"]:
    s = load(f"lookahead-{mode}.json")["store"]
    layers = " ".join(f"{l['layer']}:{100 * l['confirmed'] / max(1, l['routed']):.1f}%"
                      for l in s["lookahead_by_layer"])
    read, unused = s["lookahead_bytes_read"], s["lookahead_unused_bytes"]
    print(f"{mode}: {layers}; guessed bytes {read}, wrong {unused} "
          f"({100 * (read - unused) / max(1, read):.1f}% confirmed)")
print("## cache policies in place: expert bytes read, median of 5 runs [range] (lru -> lfu-aging)")
for slots in [8, 16, 32, 64]:
    got = {}
    for p in ["lru", "lfu-aging"]:
        runs = load(f"policy-{p}-{slots}.json")["budgets"][0]["runs"]
        got[p] = sorted(r["prefill"]["expert_bytes"] + r["decode"]["expert_bytes"] for r in runs)
    median = {p: v[len(v) // 2] for p, v in got.items()}
    print(f"{slots} slots: {median['lru']} [{got['lru'][0]}-{got['lru'][-1]}] -> "
          f"{median['lfu-aging']} [{got['lfu-aging'][0]}-{got['lfu-aging'][-1]}] "
          f"({100 * (median['lfu-aging'] - median['lru']) / median['lru']:+.1f}%)")
print("## cache policies replayed: share of expert bytes avoided")
rows = {}
for r in load("policy-replay.json")["budgets"][0]["runs"][0]["policies"]:
    share = 100 * r["bytes_avoided"] / (r["bytes_avoided"] + r["bytes_read"])
    rows.setdefault(r["policy"], []).append(f"{r['slots']}: {share:.1f}%")
for policy, cells in rows.items():
    print(f"{policy}: " + " ".join(cells))
print("## routing")
print((out / "routing.txt").read_text())
EOF
