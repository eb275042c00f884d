#!/usr/bin/env python3
"""Trains the tiny K3 of tests/fixtures/trained with mlx-lm's `kimi_k3` (CPU, float32).

Usage: train.py WORK_DIR [--steps N] [--minutes M]

Seeded and deterministic for a given interpreter (its standard library is the text). Writes to
WORK_DIR: the tokenizer files, `weights.npz` (the f32 training weights, mlx-lm's names),
`train_log.json` (loss per step, held-out losses before and after) and `corpus.json` (which
files were used). `export.py` turns the weights into the released layout.

Each step: BATCH rows of standard-library source, and CHAT_ROWS rows each ending with one
conversation of `conversations.py` (source text before it). The loss is the mean
cross-entropy of the source rows, plus that of the conversations' replies (what the model is
taught to say), plus PROMPT_WEIGHT times that of the rest of the conversation rows (the
prompts, which the model reads but is not asked to write). The tokenizer is learned on the
source and on the text of conversations from another seed.

--minutes M ends the process after about M minutes with the whole state in WORK_DIR (exit 75);
running it again continues exactly where it stopped (same ids, same weights: checked), so a
shared machine can run the training in short segments.

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
import signal
import sys
import time
from pathlib import Path

import numpy as np
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import kimi_k3, switch_layers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conversations  # noqa: E402
import corpus  # noqa: E402
import model_config as mc  # noqa: E402

SEED = 20261202
BATCH = 4  # rows of source text per step
SEQ = 128
SHORT_ROWS = 12  # rows per step ending with one bare conversation (source text before it)
SHORT_SEQ = 288
CHAT_ROWS = 2  # rows per step ending with one full conversation
CHAT_SEQ = 768
PROMPT_WEIGHT = 0.1  # loss weight of a conversation's prompt against its reply's
TOKENIZER_CHAT_CHARS = 200_000  # conversation text the tokenizer learns from, with the source
PEAK_LR = 4e-3
WARMUP = 8
DECAY_FROM = 0.7  # the learning rate holds its peak until this share of the steps, then decays
CLIP = 1.0
BIAS_RATE = 0.01  # short training: 10x DeepSeek-V3's 0.001
MAX_FILE_BYTES = 40_000
TRAIN_BYTES = 600_000
HELD_OUT_EVERY = 10  # every 10th selected file is held out
EVAL_ROWS = 32
STEPS = 300
EXIT_RESUMABLE = 75  # a segment ended, the run goes on (EX_TEMPFAIL)
# --data simple (run r4): bare scenes of `conversations.SimpleScenes`, each at the start of its
# row as k3d renders a request (position 0), source text after it (no loss); fewer source rows
# and the replies weighted up, so that the step is spent on what the reply depends on.
SIMPLE_BATCH = 2
SIMPLE_ROWS = 12
SIMPLE_SEQ = 512  # session 5 (448 before): the scenes declare up to four tools
SIMPLE_REPLY_WEIGHT = 2.0
# ... and the ids where a reply's kind is decided (mask 2: `conversations.decision_segments`),
# a mean of their own: ~3 of a reply's ~60 ids, where the reply reads the conversation. Without
# it run r4 reached a reply loss of ~0.4 with every reply the same call (the template ids
# dominate the mean).
SIMPLE_DECISION_WEIGHT = 5.0


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
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--data", choices=["full", "simple"], default="full",
                    help="the conversations: session 2's full scenes, or SimpleScenes (r4)")
    ap.add_argument("--init", type=Path,
                    help="start from this run's weights and tokenizer (its resume.npz, else "
                    "weights.npz) instead of random ones; fresh optimiser and schedule")
    ap.add_argument("--peak-lr", type=float, default=PEAK_LR,
                    help="the held learning rate (a run from --init weights diverged at 4e-3 "
                    "with a fresh optimiser)")
    ap.add_argument("--source-after", action="store_true",
                    help="--data simple: the source text after each conversation carries the "
                    "source loss too (session 5)")
    ap.add_argument("--freeze-attn-res", action="store_true",
                    help="keep every AttnRes pseudo-query at zero (uniform mixing of the block "
                    "sources): learned, they collapsed onto the embedding and the first block, "
                    "and layers 3-8 (all MLA layers) got ~1/30-1/1000 of the gradient")
    ap.add_argument("--minutes", type=float, default=0,
                    help="stop after about this many minutes with a resumable state in WORK "
                    f"(exit {EXIT_RESUMABLE}); the next run continues it. 0: run to the end")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)
    mx.random.seed(SEED)
    rng = random.Random(SEED)

    lib, all_files, train_files, held_files = select_files()
    docs, facts = corpus.docstring_paragraphs(all_files), corpus.docstring_facts(all_files)
    t0 = time.time()
    simple = a.data == "simple"
    batch = SIMPLE_BATCH if simple else BATCH
    reply_weight = SIMPLE_REPLY_WEIGHT if simple else 1.0
    decision_weight = SIMPLE_DECISION_WEIGHT if simple else 0.0
    Scenes = conversations.SimpleScenes if simple else conversations.Scenes
    if Resume(a.work).exists():
        # A resumed run keeps the tokenizer it started with: its weights are for those ids.
        tok = corpus.Tokenizer.read(a.work)
    elif a.init:
        tok = corpus.Tokenizer.read(a.init)  # the initial weights are for its ids
        tok.write(a.work)
    else:
        chat_text, scenes = [], conversations.Scenes(docs, facts, SEED + 2)
        while sum(map(len, chat_text)) < TOKENIZER_CHAT_CHARS:
            chat_text.append("".join(conversations.texts(scenes.make())))
        tok = corpus.Tokenizer(corpus.learn_ranks([t for _, t in train_files] + chat_text,
                                                  mc.N_RANKS))
        tok.write(a.work)
    stream = []
    for _, t in train_files:
        stream += tok.encode(t)
    held = []
    for _, t in held_files:
        held += tok.encode(t)
    scenes = Scenes(docs, facts, SEED)
    print(
        f"tokenizer {tok.n_ranks} ranks in {time.time() - t0:.0f} s; train {len(stream)} ids, "
        f"held-out {len(held)}; {len(docs)} docstring paragraphs, {len(facts)} facts",
        flush=True,
    )

    def chat_rows(scene_source, n, seq, short, text_rng):
        """n rows of seq + 1 ids, each ending with one conversation (`Scenes.make(short)`),
        source text before it, and the mask of its reply. A conversation longer than a row is
        drawn again, but for the long ones (`Scenes.long`), which keep their end: the model
        sees every part of most conversations, and some cut as a real agent's prompt is
        to its memory."""
        rows, replies = [], []
        for _ in range(n):
            while True:
                ids, mask = conversations.render(tok, scene_source.make(short))
                if len(ids) <= seq + 1 or scene_source.long:
                    break
            ids, mask = ids[-(seq + 1) :], mask[-(seq + 1) :]
            fill = seq + 1 - len(ids)
            if fill:
                s = text_rng.randrange(len(stream) - fill)
                ids, mask = stream[s : s + fill] + ids, [0] * fill + mask
            rows.append(ids)
            replies.append(mask[1:])
        return mx.array(rows), mx.array(replies, dtype=mx.float32)

    def first_rows(scene_source, n, seq, text_rng):
        """n rows of seq + 1 ids, each starting with one conversation (drawn again if longer
        than the row), source text after it; mask 1 on the reply (2 on its decision ids), 0 on
        the prompt, -1 on the source after it (no loss)."""
        rows, masks = [], []
        for _ in range(n):
            while True:
                ids, mask = conversations.render(tok, scene_source.make(True), decisions=True)
                if len(ids) <= seq + 1:
                    break
            fill = seq + 1 - len(ids)
            if fill:
                s = text_rng.randrange(len(stream) - fill)
                ids, mask = ids + stream[s : s + fill], mask + [-1] * fill
            rows.append(ids)
            masks.append(mask[1:])
        return mx.array(rows), mx.array(masks, dtype=mx.float32)

    def step_rows(scene_source, text_rng):
        """One step's conversation rows: (bare rows, their masks, full rows, their masks)."""
        if simple:
            return first_rows(scene_source, SIMPLE_ROWS, SIMPLE_SEQ, text_rng)
        return (*chat_rows(scene_source, SHORT_ROWS, SHORT_SEQ, True, text_rng),
                *chat_rows(scene_source, CHAT_ROWS, CHAT_SEQ, False, text_rng))

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
    res_projs = [lm.output_attn_res_proj] + [p for l in lm.layers
                                             for p in (l.self_attention_res_proj, l.mlp_res_proj)]
    if a.freeze_attn_res:
        for proj in res_projs:
            proj.freeze()
    model.train()
    moe_layers = [l.mlp for l in lm.layers if isinstance(l.mlp, kimi_k3.KimiK3SparseMoE)]
    counter = RoutingCounter(tc["num_experts"])
    train_experts_quantisation_aware()

    def chat_sums(m, *pairs):
        """Sums and counts of the cross-entropy of the conversations' replies (mask ≥ 1), the
        rest of their conversations (mask 0), the decision ids (mask 2) and the source text
        after a conversation (mask -1); (rows, mask) pairs."""
        sums = mx.zeros(8)
        for rows, mask in zip(pairs[::2], pairs[1::2]):
            ce = nn.losses.cross_entropy(m(rows[:, :-1]), rows[:, 1:])
            rest, taught, decided, after = mask == 0, mask >= 1, mask == 2, mask == -1
            sums = sums + mx.stack([(ce * taught).sum(), taught.sum(), (ce * rest).sum(),
                                    rest.sum(), (ce * decided).sum(), decided.sum(),
                                    (ce * after).sum(), after.sum()])
        return sums

    def chat_losses(m, *pairs):
        """Mean cross-entropy of the replies, the rest of the conversations, the decision ids."""
        sums = chat_sums(m, *pairs)
        return sums[0] / sums[1], sums[2] / sums[3], sums[4] / mx.maximum(sums[5], 1)

    def losses(m, code, *chats):
        """Cross-entropy of the source: the source rows and, with --source-after, the source
        after each conversation of --data simple (its logits are computed anyway; session 5:
        r6's 2 source rows × 128 ids per step left the fixture a poor Python model), then the
        conversations' means as `chat_losses`."""
        counter.loads = []
        code_ce = nn.losses.cross_entropy(m(code[:, :-1]), code[:, 1:])
        sums = chat_sums(m, *chats)
        if a.source_after:
            code_loss = (code_ce.sum() + sums[6]) / (code_ce.size + sums[7])
        else:
            code_loss = code_ce.mean()
        return code_loss, sums[0] / sums[1], sums[2] / sums[3], sums[4] / mx.maximum(sums[5], 1)

    def loss_fn(m, *rows):
        code_loss, reply_loss, context_loss, decision_loss = losses(m, *rows)
        loss = (code_loss + reply_weight * reply_loss + PROMPT_WEIGHT * context_loss
                + decision_weight * decision_loss)
        return loss, (code_loss, reply_loss, decision_loss, mx.stack(counter.loads))

    eval_rows = step_rows(Scenes(docs, facts, SEED + 3), random.Random(SEED + 3))

    def held_out_loss():
        """(source text, conversation replies): held-out files and the conversations of a step
        drawn from a seed training never uses."""
        erng = random.Random(SEED + 1)
        rows = mx.array(windows(held, EVAL_ROWS, erng))
        code = []
        for i in range(0, EVAL_ROWS, batch):
            code.append(float(nn.losses.cross_entropy(model(rows[i : i + batch, :-1]),
                                                      rows[i : i + batch, 1:]).mean()))
        return sum(code) / len(code), float(chat_losses(model, *eval_rows)[0])

    def schedule(s):
        """Linear warm-up, the peak until DECAY_FROM of the steps, then cosine decay to a tenth
        of the peak (mx ops: s is an array). A run stopped before its decay is a prefix of a
        run of more steps, so the length can be chosen late."""
        warm = mx.minimum(1.0, (s + 1) / WARMUP)
        start = DECAY_FROM * a.steps
        t = mx.clip((s - start) / (a.steps - start), 0.0, 1.0)
        return a.peak_lr * warm * (0.1 + 0.45 * (1 + mx.cos(math.pi * t)))

    opt = optim.Adam(learning_rate=schedule)
    step_fn = nn.value_and_grad(model, loss_fn)
    resume = Resume(a.work)
    if a.init and not resume.exists():
        source = a.init / "resume.npz" if (a.init / "resume.npz").exists() else a.init / "weights.npz"
        flat = dict(np.load(source))
        flat = {k[len("model."):]: v for k, v in flat.items() if k.startswith("model.")} or flat
        model.update(tree_unflatten([(k, mx.array(v)) for k, v in flat.items()]))
        print(f"initial weights from {source}", flush=True)
        if a.freeze_attn_res:
            for proj in res_projs:
                proj.weight = mx.zeros_like(proj.weight)
    if resume.exists():
        first, log = resume.load(model, opt, rng, scenes.rng)
        print(f"resuming at step {first}", flush=True)
    else:
        before = held_out_loss()
        first, log = 0, {"held_out_before": before[0], "held_out_reply_before": before[1],
                         "steps": []}
        print(f"held-out loss before: source {before[0]:.3f}, replies {before[1]:.3f}", flush=True)
    # SIGUSR1 ends the process like the end of a segment (resumable, exit 75): a run can be
    # paused for the CPU, or continued with another --steps (the schedule is read per process).
    stop = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append(True))
    segment = time.time()
    start = segment - (log["steps"][-1]["seconds"] if log["steps"] else 0)
    for step in range(first, a.steps):
        if stop or (a.minutes and time.time() - segment > a.minutes * 60):
            resume.save(step, log, model, opt, rng, scenes.rng)
            print(f"segment ended before step {step}; run again to continue", flush=True)
            sys.exit(EXIT_RESUMABLE)
        code = mx.array(windows(stream, batch, rng))
        (loss, (code_loss, reply_loss, decision_loss, loads)), grads = step_fn(model, code, *step_rows(scenes, rng))
        grads, norm = optim.clip_grad_norm(grads, CLIP)
        opt.update(model, grads)
        # All passes of the step counted: loads has one row per MoE layer and pass.
        loads = loads.reshape(-1, len(moe_layers), loads.shape[-1]).sum(axis=0)
        for moe, load in zip(moe_layers, loads):
            load = load.astype(mx.float32)
            moe.e_score_correction_bias = moe.e_score_correction_bias + BIAS_RATE * mx.sign(
                load.mean() - load
            )
        mx.eval(loss, model.parameters(), opt.state)
        entry = {"step": step, "loss": float(loss), "source_loss": float(code_loss),
                 "reply_loss": float(reply_loss), "decision_loss": float(decision_loss),
                 "grad_norm": float(norm),
                 "seconds": time.time() - start}
        log["steps"].append(entry)
        print(json.dumps(entry), flush=True)
        if step % 10 == 9 or step == a.steps - 1:
            save(model, a.work / "weights.npz")
    resume.clear()
    after = held_out_loss()
    log["held_out_after"], log["held_out_reply_after"] = after
    log["train_seconds"] = time.time() - start
    print(f"held-out loss after: source {after[0]:.3f}, replies {after[1]:.3f}", flush=True)
    (a.work / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    meta = {
        "stdlib": str(lib),
        "python": sys.version.split()[0],
        "train_files": [n for n, _ in train_files],
        "held_out_files": [n for n, _ in held_files],
        "train_ids": len(stream),
        "held_out_ids": len(held),
        "docstring_paragraphs": len(docs),
        "docstring_facts": len(facts),
        "tokenizer_chat_chars": TOKENIZER_CHAT_CHARS,
        "seed": SEED,
        "data": a.data,
        "init": str(a.init) if a.init else None,
        "batch": batch,
        "reply_weight": reply_weight,
        "decision_weight": decision_weight,
        "seq": SEQ,
        **({"simple_rows": SIMPLE_ROWS, "simple_seq": SIMPLE_SEQ} if simple else {}),
        "short_rows": SHORT_ROWS,
        "short_seq": SHORT_SEQ,
        "chat_rows": CHAT_ROWS,
        "chat_seq": CHAT_SEQ,
        "prompt_weight": PROMPT_WEIGHT,
        "steps": a.steps,
        "peak_lr": a.peak_lr,
        "decay_from": DECAY_FROM,
        "bias_rate": BIAS_RATE,
        "freeze_attn_res": a.freeze_attn_res,
        "source_after": a.source_after,
    }
    (a.work / "corpus.json").write_text(json.dumps(meta, indent=1) + "\n")


class Resume:
    """A run's state between segments (`--minutes`): weights, optimizer state, both random
    generators, the next step and the log, so that a resumed run computes what an
    uninterrupted one does."""

    def __init__(self, work):
        self.arrays, self.meta = work / "resume.npz", work / "resume.json"

    def exists(self):
        return self.meta.exists()

    def save(self, step, log, model, opt, rng, scene_rng):
        flat = {"model." + k: np.array(v) for k, v in tree_flatten(model.parameters())}
        flat.update({"opt." + k: np.array(v) for k, v in tree_flatten(opt.state)})
        tmp = self.arrays.with_suffix(".tmp.npz")
        np.savez(tmp, **flat)
        tmp.rename(self.arrays)
        meta = {"step": step, "log": log, "rng": rng.getstate(), "scene_rng": scene_rng.getstate()}
        self.meta.with_suffix(".tmp").write_text(json.dumps(meta))
        self.meta.with_suffix(".tmp").rename(self.meta)

    def load(self, model, opt, rng, scene_rng):
        flat = dict(np.load(self.arrays))
        part = lambda prefix: tree_unflatten(
            [(k[len(prefix) :], mx.array(v)) for k, v in flat.items() if k.startswith(prefix)])
        model.update(part("model."))
        opt.init(model.trainable_parameters())
        opt.state = part("opt.")
        meta = json.loads(self.meta.read_text())
        for generator, state in ((rng, meta["rng"]), (scene_rng, meta["scene_rng"])):
            generator.setstate((state[0], tuple(state[1]), state[2]))
        return meta["step"], meta["log"]

    def clear(self):
        self.arrays.unlink(missing_ok=True)
        self.meta.unlink(missing_ok=True)


def save(model, path):
    flat = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **flat)
    tmp.rename(path)


if __name__ == "__main__":
    main()
