#!/usr/bin/env python3
"""Routing statistics of the exported trained model under mlx-lm (the engine routes the same,
tests/fixtures/trained/reference): distinct experts per prefill chunk on real text vs uniformly
random ids, and expert popularity skew. Usage: routing_stats.py MODEL_DIR

Real text: the held-out standard-library files of tests/fixtures/trained/corpus.json.
"""

import json
import random
import sys
import sysconfig
from pathlib import Path

import numpy as np
import mlx.core as mx
from mlx_lm.models import kimi_k3
from mlx_lm.utils import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

CHUNKS = [8, 32, 128]
TOKENS = 1024


def routing(model, ids):
    """[moe layer][position] -> chosen experts, from one full pass."""
    seen = []
    select = kimi_k3._group_expert_select

    def hook(gates, bias, top_k, *rest):
        inds, w = select(gates, bias, top_k, *rest)
        seen.append(np.array(inds)[0])
        return inds, w

    kimi_k3._group_expert_select = hook
    try:
        mx.eval(model(mx.array([ids])))
    finally:
        kimi_k3._group_expert_select = select
    return seen


def stats(layers, num_experts):
    out = {}
    for c in CHUNKS:
        per = [
            len(set(layer[s : s + c].ravel().tolist()))
            for layer in layers
            for s in range(0, len(layer) - c + 1, c)
        ]
        out[f"distinct_per_chunk_{c}"] = round(float(np.mean(per)), 2)
    shares = []
    for layer in layers:
        counts = np.bincount(layer.ravel(), minlength=num_experts) / layer.size
        shares.append(sorted(counts, reverse=True))
    shares = np.mean(np.array(shares), axis=0)
    out["top1_expert_share"] = round(float(shares[0]), 3)
    out["top4_experts_share"] = round(float(shares[:4].sum()), 3)
    out["uniform_share"] = round(1 / num_experts, 3)
    return out


def main():
    model_dir = Path(sys.argv[1])
    mx.set_default_device(mx.cpu)
    model, _ = load_model(model_dir)
    model.set_dtype(mx.float32)
    ranks = [
        __import__("base64").b64decode(line.split()[0])
        for line in (model_dir / "tiktoken.model").read_text().splitlines()
        if line
    ]
    tok = corpus.Tokenizer(ranks)
    meta = json.loads((model_dir.parent / "corpus.json").read_text())
    lib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join((lib / n).read_text() for n in meta["held_out_files"])
    real = tok.encode(text)[:TOKENS]
    rng = random.Random(0)
    rand = [rng.randrange(tok.n_ranks) for _ in range(TOKENS)]
    n = json.loads((model_dir / "config.json").read_text())["text_config"]["num_experts"]
    print(json.dumps({"real_text": stats(routing(model, real), n), "random_ids": stats(routing(model, rand), n)}, indent=1))


if __name__ == "__main__":
    main()
