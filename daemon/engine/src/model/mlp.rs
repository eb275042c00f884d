//! The SiTU-GLU MLP `y = down · SiTU-GLU(gate · x, up · x)` (spec §4.1, §4.8–§4.9).
//!
//! One implementation serves the layer-0 dense MLP and the shared experts (BF16 weights) and the
//! routed experts (MXFP4 weights, `w1` = gate, `w3` = up, `w2` = down): the weight format is
//! abstracted by [`Linear`].

use crate::kernels::elementwise::situ_glu_into;
use crate::kernels::{Bf16Matrix, Mxfp4Matrix, matmul_bf16, matmul_mxfp4};

/// A bias-free linear layer `[rows, cols]` applied to T token rows: `ys[T, rows] = xs[T, cols]·Wᵀ`.
pub trait Linear {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    fn apply(&self, xs: &[f32], ys: &mut [f32]);
}

impl Linear for Bf16Matrix<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn apply(&self, xs: &[f32], ys: &mut [f32]) {
        matmul_bf16(*self, xs, ys)
    }
}

impl Linear for Mxfp4Matrix<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn apply(&self, xs: &[f32], ys: &mut [f32]) {
        matmul_mxfp4(*self, xs, ys)
    }
}

/// Applies `w` to `xs` (T rows) into a fresh buffer.
pub fn apply<W: Linear>(w: &W, xs: &[f32]) -> Vec<f32> {
    let t = xs.len() / w.cols();
    let mut ys = vec![0.0f32; t * w.rows()];
    w.apply(xs, &mut ys);
    ys
}

/// The two SiTU caps (spec §4.1): β₁ caps the gate, β₂ the up projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Situ {
    pub beta1: f64,
    pub beta2: f64,
}

/// A SiTU-GLU MLP with weights of format `W`.
pub struct Mlp<W> {
    pub gate: W,
    pub up: W,
    pub down: W,
}

impl<W: Linear> Mlp<W> {
    /// `out[T, down.rows] = down · SiTU-GLU(gate · x, up · x)` for the T rows of `xs`.
    pub fn forward(&self, act: Situ, xs: &[f32], out: &mut [f32]) {
        let g = apply(&self.gate, xs);
        let u = apply(&self.up, xs);
        let mut a = vec![0.0f32; g.len()];
        situ_glu_into(&g, &u, act.beta1, act.beta2, &mut a);
        self.down.apply(&a, out);
    }
}
