//! Shared helpers of the `model_*` tests: a seeded RNG, random weights in their stored formats,
//! and small f64 reference primitives written from spec §4.1 (not calling the engine).
#![allow(dead_code)] // each test binary uses a different subset

use k3_engine::kernels::{Bf16Matrix, Mxfp4Matrix};

/// SplitMix64: tiny, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn normals(&mut self, n: usize, std: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * std) as f32).collect()
    }
    pub fn uniforms(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n)
            .map(|_| (lo + (hi - lo) * self.uniform()) as f32)
            .collect()
    }
}

/// A BF16 matrix: stored bytes plus its exact values in f64.
pub struct Bf16Weights {
    pub bytes: Vec<u8>,
    pub rows: usize,
    pub cols: usize,
    pub vals: Vec<f64>,
}

impl Bf16Weights {
    pub fn random(rng: &mut Rng, rows: usize, cols: usize, std: f64) -> Self {
        let mut bytes = Vec::with_capacity(rows * cols * 2);
        let mut vals = Vec::with_capacity(rows * cols);
        for _ in 0..rows * cols {
            let bits = ((rng.normal() * std) as f32).to_bits() >> 16;
            bytes.extend_from_slice(&(bits as u16).to_le_bytes());
            vals.push(f32::from_bits(bits << 16) as f64);
        }
        Bf16Weights {
            bytes,
            rows,
            cols,
            vals,
        }
    }
    pub fn matrix(&self) -> Bf16Matrix<'_> {
        Bf16Matrix::new(&self.bytes, self.rows, self.cols)
    }
    /// The values widened to f32 (what a BF16 vector decodes to).
    pub fn f32s(&self) -> Vec<f32> {
        self.vals.iter().map(|&v| v as f32).collect()
    }
    pub fn mul(&self, x: &[f64]) -> Vec<f64> {
        matvec(&self.vals, self.rows, self.cols, x)
    }
}

/// An MXFP4 matrix with nibbles uniform over 0–15 and scale bytes in 122–125 (spec §9.1),
/// plus its values decoded independently: low nibble = even element, E2M1 · 2^(s−127).
pub struct Fp4 {
    pub packed: Vec<u8>,
    pub scales: Vec<u8>,
    pub rows: usize,
    pub cols: usize,
    pub vals: Vec<f64>,
}

impl Fp4 {
    pub fn random(rng: &mut Rng, rows: usize, cols: usize) -> Self {
        const MAG: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let packed: Vec<u8> = (0..rows * cols / 2)
            .map(|_| (rng.next_u64() & 0xff) as u8)
            .collect();
        let scales: Vec<u8> = (0..rows * cols / 32)
            .map(|_| 122 + (rng.next_u64() % 4) as u8)
            .collect();
        let mut vals = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for i in 0..cols {
                let byte = packed[(r * cols + i) / 2];
                let code = if i % 2 == 0 { byte & 15 } else { byte >> 4 };
                let m = MAG[(code & 7) as usize];
                let v = if code & 8 != 0 { -m } else { m };
                let s = scales[(r * cols + i) / 32] as i32;
                vals.push(v * 2f64.powi(s - 127));
            }
        }
        Fp4 {
            packed,
            scales,
            rows,
            cols,
            vals,
        }
    }
    pub fn matrix(&self) -> Mxfp4Matrix<'_> {
        Mxfp4Matrix::new(&self.packed, &self.scales, self.rows, self.cols)
    }
    pub fn mul(&self, x: &[f64]) -> Vec<f64> {
        matvec(&self.vals, self.rows, self.cols, x)
    }
}

pub fn matvec(w: &[f64], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    (0..rows)
        .map(|r| (0..cols).map(|i| w[r * cols + i] * x[i]).sum())
        .collect()
}

pub fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `w_i · x_i / sqrt(mean(x²) + ε)`.
pub fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(a, b)| a * inv * b).collect()
}

/// `x_i / sqrt(Σx² + 1e-6)`.
pub fn l2_norm(x: &[f64]) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
    x.iter().map(|a| a * inv).collect()
}

pub fn softmax(s: &[f64]) -> Vec<f64> {
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|v| v / z).collect()
}

/// SiTU-GLU with β₁ = 4, β₂ = 25; `capped_sigma` reproduces the §5.3 item 11 trap.
pub fn situ(g: f64, u: f64, capped_sigma: bool) -> f64 {
    let capped = 4.0 * (g / 4.0).tanh();
    let a = capped * sigmoid(if capped_sigma { capped } else { g });
    a * 25.0 * (u / 25.0).tanh()
}

/// `max|a − b| / max|b|`: error relative to the output's scale (op-level comparisons).
pub fn rel_err(ours: &[f32], reference: &[f64]) -> f64 {
    rel_err64(&f64s(ours), reference)
}

/// Same metric between two f64 vectors (e.g. a trapped vs. the correct reference).
pub fn rel_err64(a: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(a.len(), reference.len(), "compared lengths");
    let scale = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(scale > 0.0, "reference is all zeros");
    let diff = a
        .iter()
        .zip(reference)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// `max|a − b| / max(1, max|b|)`: the logit gate metric of spec §6.2.
pub fn gate_err(ours: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(ours.len(), reference.len(), "compared lengths");
    let scale = reference.iter().fold(1.0f64, |m, v| m.max(v.abs() as f64));
    let diff = ours
        .iter()
        .zip(reference)
        .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - *b as f64).abs()));
    diff / scale
}

/// A checkpoint written by `k3d synth` into a fresh temporary directory, removed on drop.
pub struct TempCheckpoint {
    pub dir: std::path::PathBuf,
    pub fingerprint: String,
    _scratch: tempfile::TempDir,
}

/// Writes the synth checkpoint `shape` with `seed` (the library behind `k3d synth`).
pub fn synth(shape: &str, seed: u64) -> TempCheckpoint {
    let s = k3_engine::synth::shape::Shape::named(shape)
        .unwrap_or_else(|| panic!("no synth shape {shape}"));
    let plan = k3_engine::synth::blueprint(&s).unwrap_or_else(|e| panic!("k3d synth {shape}: {e}"));
    let scratch = tempfile::Builder::new()
        .prefix(&format!("k3d-model-test-{shape}-{seed}-"))
        .tempdir()
        .expect("temp dir");
    let dir = scratch.path().join("model");
    let summary = k3_engine::synth::write(&plan, &dir, seed, false, &mut |_| {})
        .unwrap_or_else(|e| panic!("k3d synth {shape}: {e}"));
    TempCheckpoint {
        dir,
        fingerprint: summary.content_sha256,
        _scratch: scratch,
    }
}

/// An engine on `dir` at `threads` compute threads whose memory plan is made for `plan`.
pub fn open_engine(
    dir: &std::path::Path,
    threads: usize,
    plan: k3_engine::plan::PlanInputs,
) -> k3_engine::engine::Engine {
    let options = k3_engine::engine::EngineOptions {
        threads,
        model: k3_engine::model::LoadOptions {
            plan,
            ..k3_engine::model::LoadOptions::default()
        },
        ..k3_engine::engine::EngineOptions::default()
    };
    k3_engine::engine::Engine::open(dir, options, &mut |_| {})
        .unwrap_or_else(|e| panic!("engine on {}: {e}", dir.display()))
}

/// Opens and loads a checkpoint directory.
pub fn load(dir: &std::path::Path) -> k3_engine::model::Model {
    let ck = k3_engine::checkpoint::Checkpoint::open(dir)
        .unwrap_or_else(|e| panic!("open {}: {e}", dir.display()));
    k3_engine::model::Model::load(&ck, k3_engine::model::LoadOptions::default())
        .unwrap_or_else(|e| panic!("load {}: {e}", dir.display()))
}

/// Never cancels.
pub fn no_cancel() -> bool {
    false
}

/// Bit patterns, for exact comparisons.
pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}
