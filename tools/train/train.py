#!/usr/bin/env python3
"""Trains the tiny K3 of tests/fixtures/trained with mlx-lm's `kimi_k3` (CPU, float32).

Usage: train.py WORK_DIR [--steps N]

Seeded and deterministic for a given interpreter (its standard library is the text). Writes to
WORK_DIR: the tokenizer files, `weights.npz` (the f32 training weights, mlx-lm's names),
`train_log.json` (loss per step, held-out loss before and after) and `corpus.json` (which files
were used). `export.py` turns the weights into the released layout.

Correction bias: mlx-lm's router adds `e_score_correction_bias` only inside the top-k choice,
which has no gradient, so training never moves it. It is updated with the auxiliary-loss-free
rule of DeepSeek-V3: after each step, per MoE layer, b_i += γ · sign(mean load − load_i), with
the load counted over the step's tokens; γ = BIAS_RATE. It is frozen for the optimiser.

Experts are trained quantisation-aware: they compute with MXFP4-rounded weights (the values
the export stores) and pass gradients straight through to their f32 master weights.
"""

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten
from mlx_lm.models import kimi_k3, switch_layers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import model_config as mc  # noqa: E402

SEED = 20261202
BATCH = 16
SEQ = 64
DIALOGUE_ROWS = 2  # rows per batch drawn from the dialogue stream
PEAK_LR = 5e-3
WARMUP = 8
CLIP = 1.0
BIAS_RATE = 0.01  # short training: 10x DeepSeek-V3's 0.001
MAX_FILE_BYTES = 40_000
TRAIN_BYTES = 600_000
HELD_OUT_EVERY = 10  # every 10th selected file is held out
DIALOGUES = 600
EVAL_ROWS = 32


def select_files():
    lib, files = corpus.stdlib_files()
    small = [(n, t) for n, t in files if len(t.encode()) <= MAX_FILE_BYTES]
    train, held, total = [], [], 0
    for i, (n, t) in enumerate(small):
        if total >= TRAIN_BYTES:
            break
        if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1:
            held.append((n, t))
        else:
            train.append((n, t))
            total += len(t.encode())
    return lib, files, train, held


def windows(stream, rows, rng):
    starts = [rng.randrange(len(stream) - SEQ - 1) for _ in range(rows)]
    return [stream[s : s + SEQ + 1] for s in starts]


def mxfp4_round(w):
    """The values MXFP4 export will store for `w` (mlx's `mxfp4` quantiser, group 32)."""
    q, scales = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")[:2]
    return mx.dequantize(q, scales, group_size=32, bits=4, mode="mxfp4").astype(w.dtype)


def train_experts_quantisation_aware():
    """Routed experts compute with their MXFP4-rounded weights, gradients pass straight
    through to the f32 weights (straight-through estimator), so the model is trained on the
    values the export stores."""

    def call(self, x, indices, sorted_indices=False):
        w = self["weight"]
        w = w + mx.stop_gradient(mxfp4_round(w) - w)
        return mx.gather_mm(x, w.swapaxes(-1, -2), rhs_indices=indices, sorted_indices=sorted_indices)

    switch_layers.SwitchLinear.__call__ = call


class RoutingCounter:
    """Wraps mlx-lm's expert selection to count, per MoE call of a forward, how often each
    expert is chosen (the load for the bias update)."""

    def __init__(self, num_experts):
        self.num_experts = num_experts
        self.loads = []
        self.select = kimi_k3._group_expert_select

        def hook(gates, bias, top_k, *rest):
            inds, w = self.select(gates, bias, top_k, *rest)
            onehot = mx.stop_gradient(inds)[..., None] == mx.arange(num_experts)
            self.loads.append(onehot.reshape(-1, num_experts).sum(axis=0))
            return inds, w

        kimi_k3._group_expert_select = hook


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--steps", type=int, default=90)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)
    mx.random.seed(SEED)
    rng = random.Random(SEED)

    lib, all_files, train_files, held_files = select_files()
    t0 = time.time()
    ranks = corpus.learn_ranks([t for _, t in train_files], mc.N_RANKS)
    tok = corpus.Tokenizer(ranks)
    tok.write(a.work)
    stream = []
    for _, t in train_files:
        stream += tok.encode(t)
    held = []
    for _, t in held_files:
        held += tok.encode(t)
    chats, n_facts = corpus.dialogues(tok, all_files, DIALOGUES, SEED)
    chat_stream = [i for d in chats for i in d]
    print(
        f"tokenizer {tok.n_ranks} ranks in {time.time() - t0:.0f} s; train {len(stream)} ids, "
        f"held-out {len(held)}, dialogues {len(chat_stream)} ids",
        flush=True,
    )

    tc = mc.training_text_config(tok.n_ranks)
    model = kimi_k3.Model(kimi_k3.ModelArgs.from_dict({"model_type": "kimi_k3", "text_config": tc}))
    model.set_dtype(mx.float32)
    # AttnRes pseudo-queries start at zero: every source weighted equally (uniform softmax).
    for layer in model.language_model.model.layers:
        layer.self_attention_res_proj.weight = mx.zeros_like(layer.self_attention_res_proj.weight)
        layer.mlp_res_proj.weight = mx.zeros_like(layer.mlp_res_proj.weight)
    lm = model.language_model.model
    lm.output_attn_res_proj.weight = mx.zeros_like(lm.output_attn_res_proj.weight)
    model.freeze(keys=["e_score_correction_bias"], strict=False)
    model.train()
    moe_layers = [l.mlp for l in lm.layers if isinstance(l.mlp, kimi_k3.KimiK3SparseMoE)]
    counter = RoutingCounter(tc["num_experts"])
    train_experts_quantisation_aware()

    def loss_fn(m, x):
        counter.loads = []
        logits = m(x[:, :-1])
        loss = nn.losses.cross_entropy(logits, x[:, 1:]).mean()
        return loss, mx.stack(counter.loads)

    def held_out_loss():
        erng = random.Random(SEED + 1)
        rows = mx.array(windows(held, EVAL_ROWS, erng))
        losses = []
        for i in range(0, EVAL_ROWS, BATCH):
            loss, _ = loss_fn(model, rows[i : i + BATCH])
            losses.append(float(loss))
        return sum(losses) / len(losses)

    def schedule(s):
        """Linear warm-up, then cosine decay to a tenth of the peak (mx ops: s is an array)."""
        warm = mx.minimum(1.0, (s + 1) / WARMUP)
        return PEAK_LR * warm * (0.1 + 0.45 * (1 + mx.cos(math.pi * mx.minimum(1.0, s / a.steps))))

    opt = optim.Adam(learning_rate=schedule)
    step_fn = nn.value_and_grad(model, loss_fn)
    log = {"held_out_before": held_out_loss(), "steps": []}
    print(f"held-out loss before: {log['held_out_before']:.3f}", flush=True)
    start = time.time()
    for step in range(a.steps):
        rows = windows(stream, BATCH - DIALOGUE_ROWS, rng) + windows(chat_stream, DIALOGUE_ROWS, rng)
        (loss, loads), grads = step_fn(model, mx.array(rows))
        grads, norm = optim.clip_grad_norm(grads, CLIP)
        opt.update(model, grads)
        for moe, load in zip(moe_layers, loads):
            load = load.astype(mx.float32)
            moe.e_score_correction_bias = moe.e_score_correction_bias + BIAS_RATE * mx.sign(
                load.mean() - load
            )
        mx.eval(loss, model.parameters(), opt.state)
        entry = {"step": step, "loss": float(loss), "grad_norm": float(norm), "seconds": time.time() - start}
        log["steps"].append(entry)
        print(json.dumps(entry), flush=True)
        if step % 10 == 9 or step == a.steps - 1:
            save(model, a.work / "weights.npz")
    log["held_out_after"] = held_out_loss()
    log["train_seconds"] = time.time() - start
    print(f"held-out loss after: {log['held_out_after']:.3f}", flush=True)
    (a.work / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    meta = {
        "stdlib": str(lib),
        "python": sys.version.split()[0],
        "train_files": [n for n, _ in train_files],
        "held_out_files": [n for n, _ in held_files],
        "train_ids": len(stream),
        "held_out_ids": len(held),
        "dialogues": DIALOGUES,
        "dialogue_ids": len(chat_stream),
        "docstring_facts": n_facts,
        "seed": SEED,
        "batch": BATCH,
        "seq": SEQ,
        "steps": a.steps,
        "peak_lr": PEAK_LR,
        "bias_rate": BIAS_RATE,
    }
    (a.work / "corpus.json").write_text(json.dumps(meta, indent=1) + "\n")


def save(model, path):
    flat = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **flat)
    tmp.rename(path)


if __name__ == "__main__":
    main()
