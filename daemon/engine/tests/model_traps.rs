//! The silent-failure traps of spec §5.3 that live in the forward pass: one test per op, each
//! going through every trap of that op (named in its failure message).
//!
//! Each test runs an engine op on random weights and inputs, and compares it with a small f64
//! reference written here from spec §4 (it never calls engine code). The engine must match the
//! correct reference to `TOL`; the same reference with a trap reintroduced must be far away —
//! so each test shows both that the engine is right and that each trap would be caught.

// The references index like the spec's formulas (S[i][j], π_b·s_b[i]) on purpose.
#![allow(clippy::needless_range_loop)]

mod model_support;

use k3_engine::model::attn_res::{aggregate, fold_query, is_block_start};
use k3_engine::model::kda::{self, KdaDims, KdaMatrices, KdaParams, KdaState};
use k3_engine::model::mla::{self, MlaCache, MlaDims, MlaMatrices, MlaParams};
use k3_engine::model::mlp::{Mlp, Situ};
use k3_engine::model::moe::{self, MoeDims, MoeMatrices, MoeParams};
use k3_engine::model::router::{RouterConfig, route};
use model_support::*;

/// Engine vs. correct f64 reference, relative to the output scale.
const TOL: f64 = 1e-5;
/// A trap must move the output by at least this much (relative) to count as detected.
const TRAP: f64 = 100.0 * TOL;

fn check(name: &str, ours: &[f32], correct: &[f64], traps: &[(&str, Vec<f64>)]) {
    let e = rel_err(ours, correct);
    println!("{name}: engine vs f64 reference: max rel err {e:.3e}");
    assert!(
        e <= TOL,
        "{name}: engine differs from the reference: {e:.3e}"
    );
    for (trap, trapped) in traps {
        let d = rel_err(ours, trapped);
        println!("{name}: trap `{trap}`: engine vs trapped reference {d:.3e}");
        assert!(
            d >= TRAP,
            "{name}: trap `{trap}` is not distinguishable ({d:.3e})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// KDA (§4.5): traps 2 (A_log per channel / all stored entries), 4 (q scaled before L2), 7 (gate
// before o_norm).

#[derive(Clone, Copy, PartialEq)]
enum KdaTrap {
    None,
    ALogPerChannel,
    QScaledBeforeL2,
    GateBeforeNorm,
}

struct KdaCase {
    dims: KdaDims,
    q: Bf16Weights,
    k: Bf16Weights,
    v: Bf16Weights,
    g: Bf16Weights,
    o: Bf16Weights,
    fa: Bf16Weights,
    fb: Bf16Weights,
    b: Bf16Weights,
    conv: [Vec<f32>; 3],
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    o_norm: Vec<f32>,
    xs: Vec<f32>,
}

fn kda_case() -> KdaCase {
    let mut r = Rng::new(11);
    let dims = KdaDims {
        hidden: 64,
        heads: 4,
        head_dim: 16,
        conv: 4,
        rank: 16,
        lower_bound: -5.0,
        eps: 1e-5,
    };
    let (h, p) = (dims.hidden, dims.width());
    let sd = |n: usize| 0.5 / (n as f64).sqrt();
    // Stored A_log has 8 entries for 4 heads; the tail gets values too, which must be ignored.
    let mut a_log: Vec<f32> = (0..8)
        .map(|_| (1.0 + 15.0 * r.uniform()).ln() as f32)
        .collect();
    a_log[5] = 0.0;
    KdaCase {
        q: Bf16Weights::random(&mut r, p, h, sd(h)),
        k: Bf16Weights::random(&mut r, p, h, sd(h)),
        v: Bf16Weights::random(&mut r, p, h, sd(h)),
        g: Bf16Weights::random(&mut r, p, h, sd(h)),
        o: Bf16Weights::random(&mut r, h, p, sd(p)),
        fa: Bf16Weights::random(&mut r, dims.rank, h, sd(h)),
        fb: Bf16Weights::random(&mut r, p, dims.rank, sd(dims.rank)),
        b: Bf16Weights::random(&mut r, dims.heads, h, sd(h)),
        conv: [
            r.normals(p * 4, 0.5),
            r.normals(p * 4, 0.5),
            r.normals(p * 4, 0.5),
        ],
        a_log,
        dt_bias: r.normals(p, 0.5),
        o_norm: r.uniforms(dims.head_dim, 0.8, 1.2),
        xs: r.normals(7 * h, 1.0),
        dims,
    }
}

fn kda_engine(c: &KdaCase) -> Vec<f32> {
    let m = KdaMatrices {
        q_proj: c.q.matrix().into(),
        k_proj: c.k.matrix().into(),
        v_proj: c.v.matrix().into(),
        g_proj: c.g.matrix().into(),
        o_proj: c.o.matrix().into(),
        f_a_proj: c.fa.matrix().into(),
        f_b_proj: c.fb.matrix().into(),
        b_proj: c.b.matrix().into(),
    };
    let p = KdaParams::new(
        &c.dims,
        c.conv.clone(),
        &c.a_log,
        c.dt_bias.clone(),
        c.o_norm.clone(),
    );
    let mut state = KdaState::new(&c.dims);
    let mut out = vec![0.0f32; c.xs.len()];
    kda::forward(&c.dims, &m, &p, &c.xs, &mut state, &mut out).expect("resident weights");
    out
}

/// §4.5 in f64, token by token.
fn kda_reference(c: &KdaCase, trap: KdaTrap) -> Vec<f64> {
    let (h, nh, d, kk) = (c.dims.hidden, c.dims.heads, c.dims.head_dim, c.dims.conv);
    let p = nh * d;
    let mut hist = vec![vec![vec![0.0f64; p]; kk - 1]; 3];
    let mut s = vec![vec![vec![0.0f64; d]; d]; nh];
    let mut out = Vec::new();
    for x in c.xs.chunks(h).map(f64s) {
        let proj = [c.q.mul(&x), c.k.mul(&x), c.v.mul(&x)];
        let z = c.fb.mul(&c.fa.mul(&x));
        let bl = c.b.mul(&x);
        let gl = c.g.mul(&x);
        let mut conv = vec![vec![0.0f64; p]; 3];
        for st in 0..3 {
            for ch in 0..p {
                let w = &c.conv[st][ch * kk..(ch + 1) * kk];
                let mut acc = w[kk - 1] as f64 * proj[st][ch];
                for (j, hj) in hist[st].iter().enumerate() {
                    acc += w[j] as f64 * hj[ch];
                }
                conv[st][ch] = silu(acc);
            }
            hist[st].remove(0);
            hist[st].push(proj[st].clone());
        }
        let mut o_all = vec![0.0f64; p];
        for hh in 0..nh {
            let r = hh * d..(hh + 1) * d;
            let scale = 1.0 / (d as f64).sqrt();
            let q: Vec<f64> = if trap == KdaTrap::QScaledBeforeL2 {
                l2_norm(
                    &conv[0][r.clone()]
                        .iter()
                        .map(|v| v * scale)
                        .collect::<Vec<_>>(),
                )
            } else {
                l2_norm(&conv[0][r.clone()])
                    .iter()
                    .map(|v| v * scale)
                    .collect()
            };
            let k = l2_norm(&conv[1][r.clone()]);
            let v = &conv[2][r.clone()];
            let beta = sigmoid(bl[hh]);
            let sh = &mut s[hh];
            for i in 0..d {
                let ch = hh * d + i;
                let a_log = if trap == KdaTrap::ALogPerChannel {
                    c.a_log[ch % c.a_log.len()]
                } else {
                    c.a_log[hh]
                } as f64;
                let g = -5.0 * sigmoid(a_log.exp() * (z[ch] + c.dt_bias[ch] as f64));
                for sij in sh[i].iter_mut() {
                    *sij *= g.exp();
                }
            }
            let u: Vec<f64> = (0..d)
                .map(|j| (0..d).map(|i| k[i] * sh[i][j]).sum())
                .collect();
            for i in 0..d {
                for j in 0..d {
                    sh[i][j] += k[i] * beta * (v[j] - u[j]);
                }
            }
            let o: Vec<f64> = (0..d)
                .map(|j| (0..d).map(|i| q[i] * sh[i][j]).sum())
                .collect();
            let gate: Vec<f64> = gl[r.clone()].iter().map(|&g| sigmoid(g)).collect();
            let on = f64s(&c.o_norm);
            let y: Vec<f64> = if trap == KdaTrap::GateBeforeNorm {
                let gated: Vec<f64> = o.iter().zip(&gate).map(|(a, b)| a * b).collect();
                rms_norm(&gated, &on, 1e-5)
            } else {
                rms_norm(&o, &on, 1e-5)
                    .iter()
                    .zip(&gate)
                    .map(|(a, b)| a * b)
                    .collect()
            };
            o_all[r].copy_from_slice(&y);
        }
        out.extend(c.o.mul(&o_all));
    }
    out
}

/// Traps 2 (A_log read per head, first `heads` entries only), 4 (q scaled after its L2 norm) and 7
/// (o_norm before the gate): one engine run against the correct reference and each trapped one.
#[test]
fn kda_catches_its_traps() {
    let c = kda_case();
    let trap = |label, t| (label, kda_reference(&c, t));
    check(
        "KDA",
        &kda_engine(&c),
        &kda_reference(&c, KdaTrap::None),
        &[
            trap(
                "A_log per channel, all stored entries",
                KdaTrap::ALogPerChannel,
            ),
            trap("q scaled before the L2 norm", KdaTrap::QScaledBeforeL2),
            trap("gate before o_norm", KdaTrap::GateBeforeNorm),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// MLA (§4.6): trap 8 (rope slot dropped, scale 1/√nope, kv_b split [v | k]) and 16 (latent
// norms at ε = 1e-5).

#[derive(Clone, Copy, PartialEq)]
enum MlaTrap {
    None,
    RopeDropped,
    ScaleNope,
    KvSplitVK,
    LatentEps1e5,
}

struct MlaCase {
    dims: MlaDims,
    qa: Bf16Weights,
    qb: Bf16Weights,
    kva: Bf16Weights,
    kvb: Bf16Weights,
    o: Bf16Weights,
    g: Bf16Weights,
    qa_norm: Bf16Weights,
    kva_norm: Bf16Weights,
    xs: Vec<f32>,
}

fn mla_case() -> MlaCase {
    let mut r = Rng::new(22);
    // nope = v as released, so a [v | k] split reads equal-width blocks in the wrong order.
    let dims = MlaDims {
        hidden: 64,
        heads: 4,
        q_lora: 32,
        kv_lora: 32,
        nope: 16,
        rope: 8,
        v: 16,
    };
    let h = dims.hidden;
    let sd = |n: usize| 0.5 / (n as f64).sqrt();
    // Small q_a / kv_a outputs (rms ≈ 0.05) make the latent-norm ε visible, as trap 16 needs.
    MlaCase {
        qa: Bf16Weights::random(&mut r, dims.q_lora, h, 0.05 / (h as f64).sqrt()),
        qb: Bf16Weights::random(&mut r, dims.heads * dims.qk(), dims.q_lora, sd(dims.q_lora)),
        kva: Bf16Weights::random(
            &mut r,
            dims.kv_lora + dims.rope,
            h,
            0.05 / (h as f64).sqrt(),
        ),
        kvb: Bf16Weights::random(
            &mut r,
            dims.heads * (dims.nope + dims.v),
            dims.kv_lora,
            2.0 / (dims.kv_lora as f64).sqrt(),
        ),
        o: Bf16Weights::random(&mut r, h, dims.heads * dims.v, sd(dims.heads * dims.v)),
        g: Bf16Weights::random(&mut r, dims.heads * dims.v, h, sd(h)),
        qa_norm: Bf16Weights::random(&mut r, 1, dims.q_lora, 1.0),
        kva_norm: Bf16Weights::random(&mut r, 1, dims.kv_lora, 1.0),
        xs: r.normals(6 * h, 1.0),
        dims,
    }
}

fn mla_engine(c: &MlaCase, split: usize) -> Vec<f32> {
    let m = MlaMatrices {
        q_a_proj: c.qa.matrix().into(),
        q_b_proj: c.qb.matrix().into(),
        kv_a_proj: c.kva.matrix().into(),
        kv_b_proj: c.kvb.matrix().into(),
        o_proj: c.o.matrix().into(),
        g_proj: Some(c.g.matrix().into()),
    };
    let p = MlaParams {
        q_a_norm: c.qa_norm.f32s(),
        kv_a_norm: c.kva_norm.f32s(),
    };
    let mut cache = MlaCache::default();
    let mut out = vec![0.0f32; c.xs.len()];
    let cut = split * c.dims.hidden;
    let (x0, x1) = c.xs.split_at(cut);
    let (o0, o1) = out.split_at_mut(cut);
    mla::forward(&c.dims, &m, &p, x0, &mut cache, o0).expect("resident weights");
    mla::forward(&c.dims, &m, &p, x1, &mut cache, o1).expect("resident weights");
    out
}

fn mla_reference(c: &MlaCase, trap: MlaTrap) -> Vec<f64> {
    let d = c.dims;
    let (nh, qk, hw) = (d.heads, d.qk(), d.nope + d.v);
    let eps = if trap == MlaTrap::LatentEps1e5 {
        1e-5
    } else {
        1e-6
    };
    let mut lats: Vec<Vec<f64>> = Vec::new();
    let mut krs: Vec<Vec<f64>> = Vec::new();
    let mut out = Vec::new();
    for x in c.xs.chunks(d.hidden).map(f64s) {
        let q = c.qb.mul(&rms_norm(&c.qa.mul(&x), &c.qa_norm.vals, eps));
        let ckv = c.kva.mul(&x);
        lats.push(rms_norm(&ckv[..d.kv_lora], &c.kva_norm.vals, eps));
        krs.push(ckv[d.kv_lora..].to_vec());
        let kv: Vec<Vec<f64>> = lats.iter().map(|l| c.kvb.mul(l)).collect();
        let scale = if trap == MlaTrap::ScaleNope {
            1.0 / (d.nope as f64).sqrt()
        } else {
            1.0 / (qk as f64).sqrt()
        };
        let gate = c.g.mul(&x);
        let mut o = vec![0.0f64; nh * d.v];
        for h in 0..nh {
            let qh = &q[h * qk..(h + 1) * qk];
            // Per head rows: [k_nope | v] (correct) or [v | k_nope] (trap).
            let (k_at, v_at) = if trap == MlaTrap::KvSplitVK {
                (d.v, 0)
            } else {
                (0, d.nope)
            };
            let scores: Vec<f64> = (0..kv.len())
                .map(|s| {
                    let row = &kv[s][h * hw..(h + 1) * hw];
                    let mut dot: f64 = (0..d.nope).map(|i| qh[i] * row[k_at + i]).sum();
                    if trap != MlaTrap::RopeDropped {
                        dot += (0..d.rope).map(|i| qh[d.nope + i] * krs[s][i]).sum::<f64>();
                    }
                    dot * scale
                })
                .collect();
            let pi = softmax(&scores);
            for j in 0..d.v {
                let val: f64 = (0..kv.len())
                    .map(|s| pi[s] * kv[s][h * hw + v_at + j])
                    .sum();
                o[h * d.v + j] = val * sigmoid(gate[h * d.v + j]);
            }
        }
        out.extend(c.o.mul(&o));
    }
    out
}

/// Trap 8: the rope slot kept and scored, scale 1/√(nope + rope), kv_b rows [k_nope | v]. Each
/// trap is checked on a different prefill split, so the cache carried across two calls is
/// exercised at several cut points.
#[test]
fn mla_catches_its_traps() {
    let c = mla_case();
    let correct = mla_reference(&c, MlaTrap::None);
    for (split, label, trap) in [
        (2, "rope slot dropped", MlaTrap::RopeDropped),
        (3, "scale 1/sqrt(nope)", MlaTrap::ScaleNope),
        (1, "kv_b split [v | k]", MlaTrap::KvSplitVK),
    ] {
        check(
            "MLA",
            &mla_engine(&c, split),
            &correct,
            &[(label, mla_reference(&c, trap))],
        );
    }
}

#[test]
fn mla_latent_norms_use_eps_1e6() {
    // ε enters as a small drift (spec §5.3 item 16), so this trap is held to a tighter bar:
    // the engine must match the ε = 1e-6 reference 20× closer than the ε = 1e-5 one.
    let c = mla_case();
    let ours = mla_engine(&c, 4);
    let good = rel_err(&ours, &mla_reference(&c, MlaTrap::None));
    let trapped = rel_err(&ours, &mla_reference(&c, MlaTrap::LatentEps1e5));
    println!("MLA: ε 1e-6 reference {good:.3e}, trap `latent ε 1e-5` {trapped:.3e}");
    assert!(good <= TOL);
    assert!(trapped >= 20.0 * good, "ε 1e-5 not distinguishable");
}

// ---------------------------------------------------------------------------------------------
// Router (§4.7): trap 9 (biased weights, softmax, no renormalisation).

#[derive(Clone, Copy, PartialEq)]
enum RouterTrap {
    None,
    BiasedWeights,
    Softmax,
    NoRenorm,
}

fn router_reference(
    logits: &[f32],
    bias: &[f32],
    k: usize,
    trap: RouterTrap,
) -> (Vec<usize>, Vec<f64>) {
    let l = f64s(logits);
    let s: Vec<f64> = if trap == RouterTrap::Softmax {
        softmax(&l)
    } else {
        l.iter().map(|&v| sigmoid(v)).collect()
    };
    let choice: Vec<f64> = s.iter().zip(bias).map(|(a, &b)| a + b as f64).collect();
    let mut idx: Vec<usize> = (0..s.len()).collect();
    idx.sort_by(|&a, &b| choice[b].partial_cmp(&choice[a]).unwrap().then(a.cmp(&b)));
    idx.truncate(k);
    let raw: Vec<f64> = idx
        .iter()
        .map(|&e| {
            if trap == RouterTrap::BiasedWeights {
                choice[e]
            } else {
                s[e]
            }
        })
        .collect();
    let sum: f64 = raw.iter().sum();
    let w = if trap == RouterTrap::NoRenorm {
        raw
    } else {
        raw.iter().map(|v| v / (sum + 1e-20)).collect()
    };
    (idx, w)
}

#[test]
fn router_sigmoid_unbiased_renormalised_weights() {
    let mut r = Rng::new(33);
    let cfg = RouterConfig {
        top_k: 4,
        renormalize: true,
        scaling_factor: 1.0,
    };
    let mut ours = Vec::new();
    let mut correct = Vec::new();
    let mut traps: Vec<(&str, Vec<f64>)> = vec![
        ("weights from the biased choice", vec![]),
        ("softmax instead of sigmoid", vec![]),
        ("no renormalisation", vec![]),
    ];
    for _ in 0..8 {
        let logits = r.normals(16, 1.0);
        let bias = r.normals(16, 0.1);
        let got = route(cfg, &logits, &bias);
        let (ids, w) = router_reference(&logits, &bias, 4, RouterTrap::None);
        assert_eq!(got.experts, ids, "selection or top-k order differs");
        ours.extend(got.weights);
        correct.extend(w);
        for (slot, t) in [
            RouterTrap::BiasedWeights,
            RouterTrap::Softmax,
            RouterTrap::NoRenorm,
        ]
        .into_iter()
        .enumerate()
        {
            traps[slot]
                .1
                .extend(router_reference(&logits, &bias, 4, t).1);
        }
    }
    check("router", &ours, &correct, &traps);
}

#[test]
fn router_ties_go_to_the_lower_index_in_top_k_order() {
    let cfg = RouterConfig {
        top_k: 3,
        renormalize: true,
        scaling_factor: 1.0,
    };
    // Experts 1, 3, 5 tie on the biased choice; 5 > 3 on the unbiased score must not matter.
    let logits = [0.0f32, 0.5, 0.0, 0.5, 0.0, 0.5];
    let bias = [0.0f32; 6];
    assert_eq!(route(cfg, &logits, &bias).experts, vec![1, 3, 5]);
    let bias = [0.0f32, 0.0, 0.0, 0.0, 0.0, 0.3];
    assert_eq!(route(cfg, &logits, &bias).experts, vec![5, 1, 3]);
}

// ---------------------------------------------------------------------------------------------
// SiTU-GLU (§4.1): trap 11 (σ applied to the capped gate).

fn mlp_reference(
    g: &Bf16Weights,
    u: &Bf16Weights,
    dn: &Bf16Weights,
    x: &[f64],
    capped_sigma: bool,
) -> Vec<f64> {
    let gv = g.mul(x);
    let uv = u.mul(x);
    let a: Vec<f64> = gv
        .iter()
        .zip(&uv)
        .map(|(&a, &b)| situ(a, b, capped_sigma))
        .collect();
    dn.mul(&a)
}

#[test]
fn situ_sigma_takes_the_uncapped_gate() {
    let mut r = Rng::new(44);
    let (h, w) = (64, 96);
    // Gate weights N(0, 0.75²) so that |g| often exceeds β₁ = 4 and the cap engages (spec §9.1).
    let g = Bf16Weights::random(&mut r, w, h, 0.75);
    let u = Bf16Weights::random(&mut r, w, h, 0.5 / (h as f64).sqrt());
    let dn = Bf16Weights::random(&mut r, h, w, 0.5 / (w as f64).sqrt());
    let xs = r.normals(3 * h, 1.0);
    let mlp = Mlp {
        gate: g.matrix(),
        up: u.matrix(),
        down: dn.matrix(),
    };
    let mut ours = vec![0.0f32; xs.len()];
    mlp.forward(
        Situ {
            beta1: 4.0,
            beta2: 25.0,
        },
        &xs,
        &mut ours,
    )
    .expect("resident weights");
    let reference = |capped| -> Vec<f64> {
        xs.chunks(h)
            .flat_map(|x| mlp_reference(&g, &u, &dn, &f64s(x), capped))
            .collect()
    };
    check(
        "SiTU MLP",
        &ours,
        &reference(false),
        &[("σ on the capped gate", reference(true))],
    );
}

// ---------------------------------------------------------------------------------------------
// LatentMoE (§4.8): trap 10 (per-expert norm, experts fed x).

#[derive(Clone, Copy, PartialEq)]
enum MoeTrap {
    None,
    PerExpertNorm,
    ExpertsFedX,
}

struct MoeCase {
    dims: MoeDims,
    router: Bf16Weights,
    bias: Vec<f32>,
    down: Bf16Weights,
    up: Bf16Weights,
    norm: Bf16Weights,
    shared: [Bf16Weights; 3],
    experts: Vec<[Fp4; 3]>,
    xs: Vec<f32>,
}

fn moe_case() -> MoeCase {
    let mut r = Rng::new(55);
    // latent = hidden, so that the "experts fed x" trap is expressible at all.
    let (h, latent, width, n_exp) = (64, 64, 32, 8);
    let sd = |n: usize| 0.5 / (n as f64).sqrt();
    MoeCase {
        dims: MoeDims {
            hidden: h,
            latent,
            act: Situ {
                beta1: 4.0,
                beta2: 25.0,
            },
            router: RouterConfig {
                top_k: 3,
                renormalize: true,
                scaling_factor: 1.0,
            },
            eps: 1e-5,
        },
        router: Bf16Weights::random(&mut r, n_exp, h, sd(h)),
        bias: r.normals(n_exp, 0.1),
        down: Bf16Weights::random(&mut r, latent, h, sd(h)),
        up: Bf16Weights::random(&mut r, h, latent, sd(latent)),
        norm: Bf16Weights::random(&mut r, 1, latent, 1.0),
        shared: [
            Bf16Weights::random(&mut r, 2 * width, h, 0.75),
            Bf16Weights::random(&mut r, 2 * width, h, sd(h)),
            Bf16Weights::random(&mut r, h, 2 * width, sd(2 * width)),
        ],
        experts: (0..n_exp)
            .map(|_| {
                [
                    Fp4::random(&mut r, width, latent),
                    Fp4::random(&mut r, latent, width),
                    Fp4::random(&mut r, width, latent),
                ]
            })
            .collect(),
        xs: r.normals(5 * h, 1.0),
    }
}

fn moe_engine(c: &MoeCase) -> Vec<f32> {
    let m = MoeMatrices {
        router: c.router.matrix().into(),
        latent_down: c.down.matrix().into(),
        latent_up: c.up.matrix().into(),
        shared: Mlp {
            gate: c.shared[0].matrix().into(),
            up: c.shared[1].matrix().into(),
            down: c.shared[2].matrix().into(),
        },
    };
    let p = MoeParams {
        score_bias: c.bias.clone(),
        routed_norm: Some(c.norm.f32s()),
    };
    let plan = moe::plan(&c.dims, &m, &p, &c.xs).expect("resident weights");
    let experts: Vec<_> = plan
        .needed
        .iter()
        .map(|&e| Mlp {
            gate: c.experts[e][0].matrix(),
            up: c.experts[e][2].matrix(),
            down: c.experts[e][1].matrix(),
        })
        .collect();
    let outputs =
        moe::run_experts(&c.dims, &plan, &plan.needed, &experts).expect("resident weights");
    let shared = moe::shared(&c.dims, &m, &c.xs).expect("resident weights");
    moe::combine(&c.dims, &m, &p, &plan, &outputs, shared).expect("resident weights")
}

fn moe_reference(c: &MoeCase, trap: MoeTrap) -> Vec<f64> {
    let mut out = Vec::new();
    for x in c.xs.chunks(c.dims.hidden).map(f64s) {
        let logits: Vec<f32> = c.router.mul(&x).iter().map(|&v| v as f32).collect();
        let (ids, w) = router_reference(&logits, &c.bias, 3, RouterTrap::None);
        let z = c.down.mul(&x);
        let input = if trap == MoeTrap::ExpertsFedX { &x } else { &z };
        let mut acc = vec![0.0f64; c.dims.latent];
        for (&e, &wj) in ids.iter().zip(&w) {
            let [w1, w2, w3] = &c.experts[e];
            let a: Vec<f64> = w1
                .mul(input)
                .iter()
                .zip(w3.mul(input))
                .map(|(&g, u)| situ(g, u, false))
                .collect();
            let mut y = w2.mul(&a);
            if trap == MoeTrap::PerExpertNorm {
                y = rms_norm(&y, &c.norm.vals, 1e-5);
            }
            for (s, v) in acc.iter_mut().zip(y) {
                *s += wj * v;
            }
        }
        if trap != MoeTrap::PerExpertNorm {
            acc = rms_norm(&acc, &c.norm.vals, 1e-5);
        }
        let routed = c.up.mul(&acc);
        let shared = mlp_reference(&c.shared[0], &c.shared[1], &c.shared[2], &x, false);
        out.extend(routed.iter().zip(shared).map(|(a, b)| a + b));
    }
    out
}

/// Trap 10: the routed norm on the weighted aggregate (not per expert), experts fed the latent.
#[test]
fn moe_catches_its_traps() {
    let c = moe_case();
    check(
        "LatentMoE",
        &moe_engine(&c),
        &moe_reference(&c, MoeTrap::None),
        &[
            (
                "RMSNorm per expert",
                moe_reference(&c, MoeTrap::PerExpertNorm),
            ),
            ("experts fed x", moe_reference(&c, MoeTrap::ExpertsFedX)),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// AttnRes (§4.3–§4.4): trap 13 (values normalised; block start (L+1) mod B).

#[test]
fn attn_res_values_are_raw_sources() {
    let mut r = Rng::new(66);
    let h = 64;
    let norm = Bf16Weights::random(&mut r, 1, h, 1.0);
    let proj = Bf16Weights::random(&mut r, 1, h, 0.15);
    let f = fold_query(&norm.f32s(), &proj.f32s());
    let mut ours = Vec::new();
    let mut correct = Vec::new();
    let mut trapped = Vec::new();
    for m in 1..=5 {
        // Sources of very different magnitudes, as inside a block.
        let sources: Vec<Vec<f32>> = (0..m).map(|b| r.normals(h, 0.5 + 2.0 * b as f64)).collect();
        let refs: Vec<&[f32]> = sources.iter().map(|s| s.as_slice()).collect();
        let mut out = vec![0.0f32; h];
        aggregate(&refs, &f, 1e-5, &mut out);
        ours.extend(out);
        let inv: Vec<f64> = sources
            .iter()
            .map(|s| 1.0 / (f64s(s).iter().map(|v| v * v).sum::<f64>() / h as f64 + 1e-5).sqrt())
            .collect();
        let scores: Vec<f64> = sources
            .iter()
            .zip(&inv)
            .map(|(s, i)| {
                i * s
                    .iter()
                    .zip(&f)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
            })
            .collect();
        let pi = softmax(&scores);
        for i in 0..h {
            correct.push((0..m).map(|b| pi[b] * sources[b][i] as f64).sum());
            trapped.push((0..m).map(|b| pi[b] * sources[b][i] as f64 * inv[b]).sum());
        }
    }
    check(
        "AttnRes",
        &ours,
        &correct,
        &[("values RMS-normalised", trapped)],
    );
}

#[test]
fn attn_res_block_starts_at_l_mod_b() {
    // Released schedule (spec §2.4): snapshots at L = 0, 12, …, 84 for 93 layers, B = 12.
    let starts: Vec<usize> = (0..93).filter(|&l| is_block_start(l, 12)).collect();
    assert_eq!(starts, (0..8).map(|b| 12 * b).collect::<Vec<_>>());
    // The trap `(L+1) mod B` would bank at 11, 23, … and not at layer 0.
    assert!(is_block_start(0, 3) && !is_block_start(2, 3) && is_block_start(3, 3));
}
