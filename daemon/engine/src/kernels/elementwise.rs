//! Elementwise functions (spec §4.1, §6.1 rule 6): evaluated in f64 with the pure-Rust `libm`
//! (never the platform libm, never a SIMD approximation) and rounded to f32 once.

/// σ(x) = 1 / (1 + e^(−x)), in f64.
#[inline]
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + libm::exp(-x))
}

/// SiLU(x) = x·σ(x), rounded to f32.
#[inline]
pub fn silu(x: f32) -> f32 {
    let x = x as f64;
    (x * sigmoid(x)) as f32
}

/// SiTU-GLU(g, u) = β₁·tanh(g/β₁)·σ(g) · β₂·tanh(u/β₂) (spec §4.1): σ takes the **uncapped**
/// gate; one rounding at the end.
#[inline]
pub fn situ_glu(g: f32, u: f32, beta1: f64, beta2: f64) -> f32 {
    let g = g as f64;
    let u = u as f64;
    let a = beta1 * libm::tanh(g / beta1) * sigmoid(g);
    let c = beta2 * libm::tanh(u / beta2);
    (a * c) as f32
}

/// Applies [`situ_glu`] pairwise: `out[i] = SiTU-GLU(gate[i], up[i])`.
pub fn situ_glu_into(gate: &[f32], up: &[f32], beta1: f64, beta2: f64, out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "situ_glu length mismatch"
    );
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = situ_glu(g, u, beta1, beta2);
    }
}
