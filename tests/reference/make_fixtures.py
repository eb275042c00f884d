#!/usr/bin/env python3
"""Reference fixtures from mlx-lm 0.32.2 (CPU, float32) for the tiny synthetic checkpoints.

Usage: make_fixtures.py CKPT_DIR OUT_DIR --shape NAME --seed N --fingerprint HEX [--prompts FILE]

--prompts: a JSON list of prompts (lists of ids) to use instead of the seeded random ones (the
trained model's in-domain prompts, tools/train/make_trained.sh).

For each prompt: greedy continuation computed incrementally with mlx's KV/state cache and
checked against full-recompute argmax, and teacher-forced logits of the full pass over
prompt + generated[:-1]. Format: tests/fixtures/reference/README.md.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import mlx.core as mx
import mlx_lm
from mlx_lm.models import kimi_k3
from mlx_lm.utils import load_model

MLX_VERSION = "0.32.4"
MLX_LM_VERSION = "0.32.2"
GEN_TOKENS = 12
# Prompt lengths; prompt 0 also contains added-token ids (embedding rows past the ranks).
PROMPT_LENS = [8, 5, 13]


def fail(msg):
    print(f"make_fixtures.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def fingerprint(ckpt: Path) -> str:
    """SHA-256 of the sha256sum manifest of every file, lines sorted by name (= k3d synth)."""
    lines = []
    for p in sorted(ckpt.iterdir(), key=lambda p: p.name.encode()):
        if p.is_file():
            lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def prompts(vocab: int, n_ranks: int):
    rng = np.random.default_rng(20261129)
    out = []
    for i, n in enumerate(PROMPT_LENS):
        ids = [int(t) for t in rng.integers(0, n_ranks, size=n)]
        if i == 0:
            # <|open|> and <|sep|> (spec §7.2 offsets 3 and 5 after the ranks)
            ids[0] = n_ranks + 3
            ids[3] = n_ranks + 5
        out.append(ids)
    return out


def greedy(model, prompt):
    """Prefill in one call, then one token per call with the cache. Returns the generated
    ids and the cached-path logits for every fed position."""
    cache = model.make_cache()
    rows = [model(mx.array([prompt]), cache=cache)[0]]
    gen = []
    while True:
        last = np.array(rows[-1][-1])
        if not np.all(np.isfinite(last)):
            fail("non-finite logits")
        gen.append(int(np.argmax(last)))  # first index of the maximum (spec §6.1 rule 12)
        if len(gen) == GEN_TOKENS:
            break
        rows.append(model(mx.array([[gen[-1]]]), cache=cache)[0])
    cached = np.array(mx.concatenate(rows, axis=0))
    return gen, cached


class Stats:
    """Conditioning statistics gathered by wrapping mlx-lm's SiTU and router functions."""

    def __init__(self):
        self.gate_max = 0.0
        self.up_max = 0.0
        self.gate_capped = 0
        self.up_capped = 0
        self.values = 0
        self.experts = {}  # call index within a forward -> set of chosen experts

    def install(self):
        situ, select = kimi_k3._situ, kimi_k3._group_expert_select

        def situ_hook(x, gate, beta, linear_beta):
            g, u = np.abs(np.array(gate)), np.abs(np.array(x))
            self.gate_max = max(self.gate_max, float(g.max()))
            self.up_max = max(self.up_max, float(u.max()))
            self.gate_capped += int((g > beta).sum())
            self.up_capped += int((u > linear_beta).sum())
            self.values += g.size
            return situ(x, gate, beta, linear_beta)

        def select_hook(gates, bias, top_k, *rest):
            inds, w = select(gates, bias, top_k, *rest)
            key = len(self.experts_seen_this_pass)
            self.experts_seen_this_pass.append(None)
            self.experts.setdefault(key, set()).update(np.array(inds).ravel().tolist())
            return inds, w

        self.experts_seen_this_pass = []
        kimi_k3._situ, kimi_k3._group_expert_select = situ_hook, select_hook
        return lambda: setattr(kimi_k3, "_situ", situ) or setattr(
            kimi_k3, "_group_expert_select", select
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--fingerprint", required=True)
    ap.add_argument("--prompts", type=Path)
    a = ap.parse_args()

    if mx.__version__ != MLX_VERSION or mlx_lm.__version__ != MLX_LM_VERSION:
        fail(
            f"need mlx {MLX_VERSION} and mlx-lm {MLX_LM_VERSION}, "
            f"have {mx.__version__} and {mlx_lm.__version__}"
        )
    mx.set_default_device(mx.cpu)
    fp = fingerprint(a.ckpt)
    if fp != a.fingerprint:
        fail(f"{a.ckpt}: files hash to {fp}, k3d synth reported {a.fingerprint}")

    config = json.loads((a.ckpt / "config.json").read_text())
    tc = config["text_config"]
    vocab = tc["vocab_size"]
    n_ranks = sum(1 for line in (a.ckpt / "tiktoken.model").read_text().splitlines() if line)
    if vocab != n_ranks + 256 or config["bos_token_id"] != n_ranks:
        fail(f"vocab {vocab} / bos {config['bos_token_id']} inconsistent with {n_ranks} ranks")

    model, _ = load_model(a.ckpt)
    model.set_dtype(mx.float32)  # BF16 weights -> f32; packed MXFP4 experts stay packed

    a.out.mkdir(parents=True, exist_ok=True)
    for old in a.out.glob("prompt*.f32"):
        old.unlink()
    records, margins = [], []
    chosen = json.loads(a.prompts.read_text()) if a.prompts else prompts(vocab, n_ranks)
    for i, prompt in enumerate(chosen):
        gen, cached = greedy(model, prompt)
        fed = prompt + gen[:-1]
        full = np.array(model(mx.array([fed]))[0], dtype=np.float32)
        rows = len(prompt) + GEN_TOKENS - 1
        if full.shape != (rows, vocab) or cached.shape != (rows, vocab):
            fail(f"prompt {i}: shapes {full.shape} / {cached.shape}, want ({rows}, {vocab})")
        recompute = [int(t) for t in np.argmax(full[len(prompt) - 1 :], axis=-1)]
        if recompute != gen:
            fail(f"prompt {i}: cached greedy {gen} != full-recompute argmax {recompute}")
        top2 = np.sort(full, axis=-1)[:, -2:]
        margin = float((top2[:, 1] - top2[:, 0]).min())
        margins.append(margin)
        name = f"prompt{i}.f32"
        (a.out / name).write_bytes(full.astype("<f4").tobytes())
        records.append(
            {
                "prompt": prompt,
                "generated": gen,
                "rows": rows,
                "logits": name,
                "max_abs_logit": float(np.abs(full).max()),
                "full_vs_cached_max_abs_diff": float(np.abs(full - cached).max()),
                "min_top1_top2_margin": margin,
            }
        )

    # Conditioning: one more full pass per prompt with the SiTU and router hooks installed.
    stats = Stats()
    restore = stats.install()
    for r in records:
        stats.experts_seen_this_pass = []
        mx.eval(model(mx.array([r["prompt"] + r["generated"][:-1]])))
    restore()
    n_moe = len(stats.experts)
    conditioning = {
        "situ_values": stats.values,
        "situ_max_abs_gate": stats.gate_max,
        "situ_max_abs_up": stats.up_max,
        "situ_gate_capped": stats.gate_capped,
        "situ_up_capped": stats.up_capped,
        "moe_layers": n_moe,
        "distinct_experts_per_moe_layer": [len(stats.experts[k]) for k in sorted(stats.experts)],
        "num_experts": tc["num_experts"],
        "min_top1_top2_margin": min(margins),
    }

    meta = {
        "shape": a.shape,
        "seed": a.seed,
        "fingerprint": fp,
        "vocab_size": vocab,
        "n_ranks": n_ranks,
        "gen_tokens": GEN_TOKENS,
        "dtype": "float32 little-endian",
        "reference": f"mlx {MLX_VERSION}, mlx-lm {MLX_LM_VERSION}, CPU, model.set_dtype(float32)",
        "prompts": records,
        "conditioning": conditioning,
    }
    (a.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps({"shape": a.shape, "fingerprint": fp, **conditioning}))


if __name__ == "__main__":
    main()
