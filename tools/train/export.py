#!/usr/bin/env python3
"""Exports trained weights (train.py's weights.npz) to the released Kimi K3 layout.

Usage: export.py WORK_DIR OUT_DIR

Layout (spec §3, as `k3d synth` writes it): nested config.json with quantization_config; one
shard per layer plus one for the model-level tensors, `model-0000K-of-0000N.safetensors`, data
ordered F32, BF16, U8, each by bytewise name, compact JSON header space-padded to a multiple
of 8; `model.safetensors.index.json`; generation_config.json; the tokenizer files copied from
WORK_DIR. Dtypes as released: BF16 matrices and norm gains (rounded to nearest even), F32
conv taps / A_log (padded) / dt_bias / o_norm / correction bias, MXFP4 experts (mlx's `mxfp4`
quantiser, group 32, E8M0 scales). The exported values are the model: mlx-lm reloads them and
its held-out loss on them is reported.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_config as mc  # noqa: E402

F32, BF16, U8 = "F32", "BF16", "U8"
GROUP = {F32: 0, BF16: 1, U8: 2}


def bf16_bytes(a):
    """Round-to-nearest-even f32 -> bf16, little-endian bytes."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return rounded.tobytes()


def mxfp4(w):
    """[out, in] f32 -> (packed U8 [out, in/2], scales U8 [out, in/32]) with mlx's quantiser,
    whose packing is the compressed-tensors byte layout mlx-lm reads back (spec §3.5)."""
    q, scales = mx.quantize(mx.array(w), group_size=32, bits=4, mode="mxfp4")[:2]
    out, inp = w.shape
    packed = np.array(q).view(np.uint8).reshape(out, inp // 2)
    return packed, np.array(scales).astype(np.uint8).reshape(out, inp // 32)


def tensors(w, tc):
    """Released name -> (dtype, shape, bytes) of every tensor, by shard index."""
    lp = "language_model.model.layers"
    h = tc["hidden_size"]
    lin = tc["linear_attn_config"]
    P = lin["num_heads"] * lin["head_dim"]
    shards = []

    def put(shard, name, dtype, arr):
        arr = np.asarray(arr)
        if dtype == BF16:
            data = bf16_bytes(arr)
        elif dtype == F32:
            data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        else:
            data = np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
        shard[name] = (dtype, list(arr.shape), data)

    for l in range(tc["num_hidden_layers"]):
        s, src, dst = {}, f"language_model.{lp[len('language_model.'):]}.{l}.", f"{lp}.{l}."
        g = lambda k: w[src + k]
        for k in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
                  "self_attention_res_proj", "mlp_res_norm", "mlp_res_proj"):
            put(s, dst + k + ".weight", BF16, g(k + ".weight"))
        if (l + 1) in lin["kda_layers"]:
            qkv = g("self_attn.qkv_proj.weight")
            conv = g("self_attn.qkv_conv.conv.weight")  # [3P, K, 1]
            for i, p in enumerate("qkv"):
                put(s, f"{dst}self_attn.{p}_proj.weight", BF16, qkv[i * P : (i + 1) * P])
                put(s, f"{dst}self_attn.{p}_conv1d.weight", F32,
                    np.moveaxis(conv[i * P : (i + 1) * P], 2, 1))
            for k in ("g_proj", "o_proj", "f_a_proj", "f_b_proj", "b_proj"):
                put(s, f"{dst}self_attn.{k}.weight", BF16, g(f"self_attn.{k}.weight"))
            a_log = np.zeros(mc.A_LOG_LEN, np.float32)
            a_log[: lin["num_heads"]] = g("self_attn.A_log")
            put(s, dst + "self_attn.A_log", F32, a_log)
            put(s, dst + "self_attn.dt_bias", F32, g("self_attn.dt_bias"))
            put(s, dst + "self_attn.o_norm.weight", F32, g("self_attn.o_norm.weight"))
        else:
            for k in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                      "kv_a_layernorm", "o_proj", "g_proj"):
                put(s, f"{dst}self_attn.{k}.weight", BF16, g(f"self_attn.{k}.weight"))
            wk = g("self_attn.embed_q.weight")  # [heads, kv_lora, nope]
            wv = g("self_attn.unembed_out.weight")  # [heads, v, kv_lora]
            kv_b = np.concatenate([np.swapaxes(wk, -1, -2), wv], axis=1)
            put(s, dst + "self_attn.kv_b_proj.weight", BF16, kv_b.reshape(-1, wk.shape[1]))
        if l >= tc["first_k_dense_replace"]:
            m = dst + "block_sparse_moe."
            put(s, m + "gate.weight", BF16, g("mlp.gate.weight"))
            put(s, m + "gate.e_score_correction_bias", F32, g("mlp.e_score_correction_bias"))
            for k in ("routed_expert_down_proj", "routed_expert_up_proj", "routed_expert_norm",
                      "shared_experts.gate_proj", "shared_experts.up_proj",
                      "shared_experts.down_proj"):
                put(s, f"{m}{k}.weight", BF16, g(f"mlp.{k}.weight"))
            for part, k in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")):
                stacked = g(f"mlp.switch_mlp.{k}.weight")
                for e in range(tc["num_experts"]):
                    packed, scales = mxfp4(stacked[e])
                    put(s, f"{m}experts.{e}.{part}.weight_packed", U8, packed)
                    put(s, f"{m}experts.{e}.{part}.weight_scale", U8, scales)
        else:
            for k in ("gate_proj", "up_proj", "down_proj"):
                put(s, f"{dst}mlp.{k}.weight", BF16, g(f"mlp.{k}.weight"))
        shards.append(s)
    s = {}
    for k in ("model.embed_tokens", "lm_head", "model.norm", "model.output_attn_res_norm",
              "model.output_attn_res_proj"):
        put(s, f"language_model.{k}.weight", BF16, w[f"language_model.{k}.weight"])
    shards.append(s)
    return shards


def write_shard(path, shard):
    order = sorted(shard, key=lambda n: (GROUP[shard[n][0]], n.encode()))
    parts, at = [], 0
    for n in order:
        dtype, shape, data = shard[n]
        parts.append(
            json.dumps(n) + f':{{"dtype":"{dtype}","shape":[{",".join(map(str, shape))}],'
            f'"data_offsets":[{at},{at + len(data)}]}}'
        )
        at += len(data)
    header = "{" + ",".join(parts) + "}"
    header += " " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header.encode())
        for n in order:
            f.write(shard[n][2])
    return at


def main():
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model-*.safetensors"):
        old.unlink()
    n_ranks = sum(1 for line in (work / "tiktoken.model").read_text().splitlines() if line)
    config = mc.config_json(n_ranks)
    tc = config["text_config"]
    w = dict(np.load(work / "weights.npz"))
    shards = tensors(w, tc)
    weight_map, total = {}, 0
    n = len(shards)
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        total += write_shard(out / name, shard)
        weight_map.update({t: name for t in shard})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"bos_token_id": tc["bos_token_id"], "eos_token_id": tc["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for f in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(work / f, out / f)
    print(f"exported {n} shards, {total} bytes of tensor data to {out}")


if __name__ == "__main__":
    main()
