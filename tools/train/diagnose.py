#!/usr/bin/env python3
"""Does a trained fixture use its deep layers and its context? Three checks in mlx-lm (f32).

Usage: diagnose.py RUN_DIR [--weights FILE] [--scenes N]
       diagnose.py --model MODEL_DIR [--scenes N]   (an exported checkpoint, e.g. the committed one)

1. The AttnRes output mix: the softmax weight of each source (the embedding, each finished
   block, the last block's partial sum) in the model's output, mean over 256 ids of
   `textwrap.py`. Uniform is 1/4 each; a collapse onto the first sources cuts the later layers
   (and with them every MLA layer) out of the model: session 3 found 0.63/0.33/0.02/0.01.
2. Each layer's token mixer zeroed (its o_proj): the loss on 512 ids of `textwrap.py`. A layer
   whose removal changes nothing is not used.
3. Context reach: the loss of the first two ids of held-out SimpleScenes replies (thinking on,
   where the reply's kind is decided) from the whole conversation and from only its last 10
   ids. The same loss means the model cannot see whether tools were declared.
4. Each layer's token mixer zeroed: the loss of those scenes' decision ids and replies. The
   conversation is read through the mixers; an MLA layer whose removal changes nothing there
   does not read it.
"""

import argparse
import sys
import sysconfig
from pathlib import Path

import numpy as np
import mlx.core as mx
from mlx.utils import tree_unflatten
from mlx_lm.models import kimi_k3

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conversations as cv  # noqa: E402
import corpus  # noqa: E402
import model_config as mc  # noqa: E402

EVAL_SEED = 777  # chat_eval's held-out seed


def load(a):
    """(model, tokenizer) of a training run's weights or of an exported checkpoint."""
    if a.model:
        from mlx_lm.utils import load_model

        return load_model(a.model)[0], corpus.Tokenizer.read(a.model)
    tok = corpus.Tokenizer.read(a.run)
    tc = mc.training_text_config(tok.n_ranks)
    model = kimi_k3.Model(kimi_k3.ModelArgs.from_dict({"model_type": "kimi_k3", "text_config": tc}))
    model.set_dtype(mx.float32)
    flat = dict(np.load(a.run / a.weights))
    # resume.npz holds the optimiser too: its model weights are the "model." entries
    flat = {k[len("model."):]: v for k, v in flat.items() if k.startswith("model.")} or flat
    model.update(tree_unflatten([(k, mx.array(v)) for k, v in flat.items()]))
    return model, tok


def nll(model, ids):
    """Per-position negative log-likelihood of ids[1:]."""
    logits = model(mx.array([ids[:-1]]))[0]
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return -mx.take_along_axis(lp, mx.array(ids[1:])[:, None], axis=-1)[:, 0]


def output_mix(model, ids):
    """The AttnRes output mix (check 1): mlx-lm's combine, recording its softmax weights."""
    seen = []
    original = kimi_k3._attn_res_combine

    def combine(raw, inv_rms, partial_sum, w_eff, eps):
        pf = partial_sum.astype(mx.float32)
        p_logit = (pf @ w_eff) * mx.rsqrt((pf * pf).mean(axis=-1) + eps)
        logits = mx.concatenate([(raw.astype(mx.float32) @ w_eff) * inv_rms, p_logit[None]])
        p = mx.softmax(logits, axis=0, precise=True)
        seen.append(p.mean(axis=(1, 2)).tolist())
        return ((p[:-1, ..., None] * raw).sum(axis=0) + p[-1, ..., None] * partial_sum).astype(
            partial_sum.dtype)

    kimi_k3._attn_res_combine = combine
    try:
        model(mx.array([ids]))
    finally:
        kimi_k3._attn_res_combine = original
    return seen[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path, nargs="?")
    ap.add_argument("--weights", default="weights.npz")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--scenes", type=int, default=16)
    a = ap.parse_args()
    if not (a.run or a.model):
        ap.error("give RUN_DIR or --model")
    mx.set_default_device(mx.cpu)
    model, tok = load(a)
    model.train()  # mlx-lm caches the AttnRes weights outside training mode
    text = tok.encode((Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()[:8000])

    mix = output_mix(model, text[:256])
    print("1. AttnRes output mix (embedding, blocks..., partial):", " ".join(f"{p:.2f}" for p in mix))

    print("2. loss on 512 ids of textwrap.py, nats/id:")
    base = float(nll(model, text[:512]).mean())
    print(f"   full model {base:.3f}")
    for i, layer in enumerate(model.language_model.model.layers):
        o_proj = layer.self_attn.o_proj
        kept = o_proj.weight
        o_proj.weight = mx.zeros_like(kept)
        print(f"   layer {i} ({type(layer.self_attn).__name__}) mixer zeroed: "
              f"{float(nll(model, text[:512]).mean()) - base:+.3f}")
        o_proj.weight = kept

    _, files = corpus.stdlib_files()
    scenes = cv.SimpleScenes(corpus.docstring_paragraphs(files), corpus.docstring_facts(files),
                             EVAL_SEED)
    held = []
    while len(held) < a.scenes:
        scene = scenes.make()
        if scene["thinking"]:
            held.append(cv.render(tok, scene, decisions=True))
    # mask[j] is the role of ids[j]: 2 the ids where the reply's kind is decided (the first of
    # the thinking: "I will call …" / "The command finished …" / "The user wants …"), 1 the
    # rest of the reply. The first two reply ids together say which of the three it is.
    full, tail = np.zeros(2), np.zeros(2)
    for ids, mask in held:
        first = mask.index(2)
        for k in range(2):
            full[k] += float(nll(model, ids[: first + k + 1])[-1])
            tail[k] += float(nll(model, ids[first + k - 10 : first + k + 1])[-1])
    n = len(held)
    print(f"3. first two reply ids over {n} held-out scenes (thinking on), nats: whole "
          f"conversation {full[0] / n:.3f} / {full[1] / n:.3f}, last 10 ids only "
          f"{tail[0] / n:.3f} / {tail[1] / n:.3f}")

    def decided():
        """Mean loss of the decision ids and of the whole replies over the held-out scenes."""
        sums = np.zeros(4)
        for ids, mask in held:
            losses = np.array(nll(model, ids))
            m = np.array(mask[1:])
            sums += [(losses * (m == 2)).sum(), (m == 2).sum(), (losses * (m >= 1)).sum(),
                     (m >= 1).sum()]
        return sums[0] / sums[1], sums[2] / sums[3]

    base = decided()
    print(f"4. the same scenes, decision ids / replies, nats/id: full model {base[0]:.3f} / "
          f"{base[1]:.3f}")
    for i, layer in enumerate(model.language_model.model.layers):
        o_proj = layer.self_attn.o_proj
        kept = o_proj.weight
        o_proj.weight = mx.zeros_like(kept)
        d = decided()
        print(f"   layer {i} ({type(layer.self_attn).__name__}) mixer zeroed: "
              f"{d[0] - base[0]:+.3f} / {d[1] - base[1]:+.3f}")
        o_proj.weight = kept

if __name__ == "__main__":
    main()
