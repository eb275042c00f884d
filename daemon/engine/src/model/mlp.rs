//! The SiTU-GLU MLP `y = down · SiTU-GLU(gate · x, up · x)` (spec §4.1, §4.8–§4.9).
//!
//! One implementation serves the layer-0 dense MLP and the shared experts (BF16 weights) and the
//! routed experts (MXFP4 weights, `w1` = gate, `w3` = up, `w2` = down): the weight format is
//! abstracted by [`Linear`]. A trunk matrix is a [`Matrix`]: resident bytes, or a matrix whose
//! rows stream in chunks ([`crate::plan::StreamScheme::Chunks`]) and are multiplied as they land.

use std::borrow::Cow;

use super::ModelError;
use crate::kernels::elementwise::situ_glu_into;
use crate::kernels::scratch::zeroed;
use crate::kernels::{Bf16Matrix, Mxfp4Matrix, matmul_bf16, matmul_mxfp4};
use crate::store::WeightStore;

/// A bias-free linear layer `[rows, cols]` applied to T token rows: `ys[T, rows] = xs[T, cols]·Wᵀ`.
/// Fallible because a streamed weight is read while it is applied.
pub trait Linear {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    fn apply(&self, xs: &[f32], ys: &mut [f32]) -> Result<(), ModelError>;
}

impl Linear for Bf16Matrix<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn apply(&self, xs: &[f32], ys: &mut [f32]) -> Result<(), ModelError> {
        matmul_bf16(*self, xs, ys);
        Ok(())
    }
}

impl Linear for Mxfp4Matrix<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn apply(&self, xs: &[f32], ys: &mut [f32]) -> Result<(), ModelError> {
        matmul_mxfp4(*self, xs, ys);
        Ok(())
    }
}

/// A BF16 trunk matrix `[rows, cols]`: its bytes in memory, or streamed by row ranges.
pub enum Matrix<'a> {
    Resident(Bf16Matrix<'a>),
    Streamed(StreamedMatrix<'a>),
}

impl<'a> From<Bf16Matrix<'a>> for Matrix<'a> {
    fn from(m: Bf16Matrix<'a>) -> Self {
        Matrix::Resident(m)
    }
}

/// A matrix of a layer whose trunk streams in chunks: `start` keys it within the layer's run.
pub struct StreamedMatrix<'a> {
    pub(super) store: &'a WeightStore,
    pub(super) layer: usize,
    pub(super) start: usize,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl StreamedMatrix<'_> {
    /// `f(first_row, rows' bytes)` for each piece, in row order, as it lands.
    fn pieces(&self, mut f: impl FnMut(usize, &[u8])) -> Result<(), ModelError> {
        self.store
            .trunk_rows(self.layer, self.start, |first, bytes: &[u8]| {
                f(first, bytes);
                Ok::<(), ModelError>(())
            })
    }
}

impl Matrix<'_> {
    /// The whole matrix's bytes, for ops that read its rows in another order than storage
    /// (MLA's per-head `kv_b_proj`): borrowed when resident, gathered from the stream otherwise
    /// (the plan counts that buffer, `Census::gather_bytes`).
    pub fn whole(&self) -> Result<Cow<'_, [u8]>, ModelError> {
        match self {
            Matrix::Resident(m) => Ok(Cow::Borrowed(m.bytes)),
            Matrix::Streamed(s) => {
                let mut all = Vec::with_capacity(2 * s.rows * s.cols);
                s.pieces(|_, bytes| all.extend_from_slice(bytes))?;
                Ok(Cow::Owned(all))
            }
        }
    }
}

impl Linear for Matrix<'_> {
    fn rows(&self) -> usize {
        match self {
            Matrix::Resident(m) => m.rows,
            Matrix::Streamed(s) => s.rows,
        }
    }
    fn cols(&self) -> usize {
        match self {
            Matrix::Resident(m) => m.cols,
            Matrix::Streamed(s) => s.cols,
        }
    }
    /// A streamed matrix is multiplied piece by piece as its rows land: output element
    /// `(t, r)` depends on weight row `r` only, and the kernels compute it the same way
    /// whatever rows share the call (spec §6.1 rules 4–5), so the bits are those of the whole
    /// matrix.
    fn apply(&self, xs: &[f32], ys: &mut [f32]) -> Result<(), ModelError> {
        let s = match self {
            Matrix::Resident(m) => return m.apply(xs, ys),
            Matrix::Streamed(s) => s,
        };
        let t = xs.len() / s.cols.max(1);
        let mut block = Vec::new();
        s.pieces(|first, bytes| {
            let n = bytes.len() / (2 * s.cols).max(1);
            let w = Bf16Matrix::new(bytes, n, s.cols);
            if t == 1 {
                matmul_bf16(w, xs, &mut ys[first..first + n]);
                return;
            }
            block.resize(t * n, 0.0);
            matmul_bf16(w, xs, &mut block);
            for (dst, src) in ys.chunks_exact_mut(s.rows).zip(block.chunks_exact(n)) {
                dst[first..first + n].copy_from_slice(src);
            }
        })
    }
}

/// Applies `w` to `xs` (T rows) into a fresh buffer.
pub fn apply<W: Linear>(w: &W, xs: &[f32]) -> Result<Vec<f32>, ModelError> {
    let t = xs.len() / w.cols();
    let mut ys = zeroed(t * w.rows());
    w.apply(xs, &mut ys)?;
    Ok(ys)
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
    pub fn forward(&self, act: Situ, xs: &[f32], out: &mut [f32]) -> Result<(), ModelError> {
        let g = apply(&self.gate, xs)?;
        let u = apply(&self.up, xs)?;
        let mut a = zeroed(g.len());
        situ_glu_into(&g, &u, act.beta1, act.beta2, &mut a);
        self.down.apply(&a, out)
    }
}
