//! The numerics contract of spec §6, in one place.
//!
//! Every reduction accumulates in f64 with one fixed tree ([`reduce`]), every elementwise
//! function is evaluated in f64 with the pure-Rust `libm` and rounded to f32 once
//! ([`elementwise`]), and parallelism is only ever over independent outputs (rows). So the
//! result of every kernel is a function of its inputs alone — not of thread count, batch size,
//! memory budget or SIMD path.

pub(crate) mod aligned;
pub mod elementwise;
pub mod exp;
pub mod isa;
pub mod matmul;
pub mod mxfp4;
pub mod norm;
pub mod reduce;
pub mod softmax;
mod tanh;
pub mod transposed;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use isa::{Isa, IsaKind};
pub use matmul::{
    Bf16Matrix, Mxfp4Matrix, matmul_bf16, matmul_bf16_with, matmul_f32, matmul_f32_with,
    matmul_mxfp4, matmul_mxfp4_with,
};
pub use transposed::{
    matmul_bf16_transposed, matmul_bf16_transposed_with, matvec_f32_transposed,
    matvec_f32_transposed_with,
};
