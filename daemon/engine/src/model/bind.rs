//! Checked views of weight bytes: a tensor's [`Slice`] cut out of its run's bytes, with dtype and
//! shape compared against what the op expects (a disagreement is an error, never a reshape —
//! spec §2.3 rule 6).

use std::fmt;

use super::ModelError;
use crate::checkpoint::layout::Slice;
use crate::checkpoint::safetensors::Dtype;
use crate::kernels::matmul::{bf16_vector, f32_vector};
use crate::kernels::{Bf16Matrix, Mxfp4Matrix, mxfp4};

/// Names a tensor in errors: its layer (`None` = model level), routed expert if any, and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorName {
    pub layer: Option<usize>,
    pub expert: Option<usize>,
    pub name: &'static str,
}

impl TensorName {
    pub fn layer(layer: usize, name: &'static str) -> Self {
        TensorName {
            layer: Some(layer),
            expert: None,
            name,
        }
    }

    pub fn model(name: &'static str) -> Self {
        TensorName {
            layer: None,
            expert: None,
            name,
        }
    }

    pub fn expert(layer: usize, expert: usize, name: &'static str) -> Self {
        TensorName {
            layer: Some(layer),
            expert: Some(expert),
            name,
        }
    }
}

impl fmt::Display for TensorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.layer, self.expert) {
            (Some(l), Some(e)) => write!(f, "layer {l}, expert {e}, tensor {}", self.name),
            (Some(l), None) => write!(f, "layer {l}, tensor {}", self.name),
            _ => write!(f, "model tensor {}", self.name),
        }
    }
}

fn problem(tensor: TensorName, problem: String) -> ModelError {
    ModelError::Tensor { tensor, problem }
}

/// The tensor's bytes, after checking dtype and shape.
fn checked<'a>(
    run: &'a [u8],
    s: &Slice,
    dtype: Dtype,
    shape: &[usize],
    t: TensorName,
) -> Result<&'a [u8], ModelError> {
    if s.dtype != dtype {
        return Err(problem(
            t,
            format!("dtype {:?}, expected {dtype:?}", s.dtype),
        ));
    }
    if s.shape != shape {
        return Err(problem(
            t,
            format!("shape {:?}, expected {shape:?}", s.shape),
        ));
    }
    let n: usize = shape.iter().product();
    let range = s.start..s.start.saturating_add(s.len);
    match run.get(range) {
        Some(b) if b.len() == n * dtype.size() => Ok(b),
        _ => Err(problem(
            t,
            format!(
                "bytes {}..+{} do not hold {n} elements inside its {}-byte run",
                s.start,
                s.len,
                run.len()
            ),
        )),
    }
}

/// A BF16 matrix `[rows, cols]`.
pub fn bf16_matrix<'a>(
    run: &'a [u8],
    s: &Slice,
    rows: usize,
    cols: usize,
    t: TensorName,
) -> Result<Bf16Matrix<'a>, ModelError> {
    let b = checked(run, s, Dtype::Bf16, &[rows, cols], t)?;
    Ok(Bf16Matrix::new(b, rows, cols))
}

/// A BF16 tensor of the given shape, widened exactly to f32 (small vectors only).
pub fn bf16_values(
    run: &[u8],
    s: &Slice,
    shape: &[usize],
    t: TensorName,
) -> Result<Vec<f32>, ModelError> {
    Ok(bf16_vector(checked(run, s, Dtype::Bf16, shape, t)?))
}

/// An F32 tensor of the given shape.
pub fn f32_values(
    run: &[u8],
    s: &Slice,
    shape: &[usize],
    t: TensorName,
) -> Result<Vec<f32>, ModelError> {
    Ok(f32_vector(checked(run, s, Dtype::F32, shape, t)?))
}

/// An MXFP4 matrix `[rows, cols]` from its packed `[rows, cols/2]` and scale `[rows, cols/32]`
/// tensors (spec §3.5).
pub fn mxfp4_matrix<'a>(
    run: &'a [u8],
    packed: &Slice,
    scales: &Slice,
    rows: usize,
    cols: usize,
    t: (TensorName, TensorName),
) -> Result<Mxfp4Matrix<'a>, ModelError> {
    if !cols.is_multiple_of(mxfp4::GROUP) {
        return Err(problem(
            t.0,
            format!("input width {cols} is not a multiple of {}", mxfp4::GROUP),
        ));
    }
    let p = checked(run, packed, Dtype::U8, &[rows, cols / 2], t.0)?;
    let s = checked(run, scales, Dtype::U8, &[rows, cols / mxfp4::GROUP], t.1)?;
    Ok(Mxfp4Matrix::new(p, s, rows, cols))
}
