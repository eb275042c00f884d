//! The numerics contract of spec §6, in one place.
//!
//! Weight products (a BF16 or MXFP4 row times an activation row) accumulate in f32 by fused
//! multiply-add with the weight tree, every other reduction in f64 with the f64 tree — one
//! fixed order each ([`tree`]); every elementwise function is evaluated in f64 with the
//! pure-Rust `libm` and rounded to f32 once ([`elementwise`]); parallelism is only ever over
//! independent outputs (rows). So the result of every kernel is a function of its inputs
//! alone — not of thread count, batch size, memory budget or SIMD path.
//!
//! Layers, lowest first (no module imports one above it): [`tree`], [`matrix`], [`mxfp4`],
//! [`isa`], `aligned` → the x86 code → [`reduce`], [`matmul`] and the rest.

pub mod elementwise;
pub mod exp;
pub mod isa;
pub mod matmul;
pub mod matrix;
pub mod mxfp4;
pub mod norm;
pub mod reduce;
pub(crate) mod scratch;
pub mod softmax;
mod tanh;
pub mod transposed;
pub mod tree;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use isa::{Isa, IsaKind};
pub use matmul::{
    matmul_bf16, matmul_bf16_with, matmul_f32, matmul_f32_with, matmul_mxfp4, matmul_mxfp4_with,
};
pub use matrix::{Bf16Matrix, Mxfp4Matrix};
pub use transposed::{
    matmul_bf16_transposed, matmul_bf16_transposed_with, matvec_f32_transposed,
    matvec_f32_transposed_with,
};
