//! A short measurement of the machine's f32 and f64 matrix-multiply rates, the yardsticks for
//! prefill arithmetic (issues 30, 41): `k3d bench` runs them on the engine's own thread pool in
//! the same process, right before it times a prefill, so the ratio of the two is a property of
//! the code, not of the machine or of what else it was doing that hour. Weight products run in
//! f32 (spec §6.1 rule 2), so the f32 rate is the one a prefill is held against.
//!
//! The reference is a conventional BLAS-style GEMM `C += A·B` (SGEMM or DGEMM, the formulation
//! OpenBLAS and BLIS use): both operands packed once into micro-panels, a register-blocked
//! micro-kernel that broadcasts one element of B against a column of A held in three registers
//! — 3 registers × 8 columns of accumulators on AVX-512, 3 × 4 on AVX2 — and k-blocks of [`KC`]
//! so the panels stay in L1/L2. Columns of
//! C are split among threads. Unlike the engine's kernels it is free to sum in any order: it
//! measures what the FMA units deliver when nothing else constrains them. Packing is done once
//! before the clock starts (it is O(n²) against the O(n³) multiply); the rate counts
//! `2·M·N·K` floating-point operations per call. On the development machine (AMD EPYC,
//! AVX-512, one core) it measured 50 GFLOP/s, where numpy's OpenBLAS DGEMM did 45 per core.

use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;

use crate::kernels::isa::{Isa, IsaKind};
use crate::kernels::scratch::Aligned;

/// Rows of A (and C): a multiple of both micro-kernels' heights.
const M: usize = 480;
/// Columns of B (and C).
const N: usize = 512;
/// The shared dimension.
const K: usize = 1024;
/// Inner-dimension block: an 8-column B panel of 256 × 8 × 8 B = 16 KiB stays in L1.
const KC: usize = 256;
/// Rows of A kept in L2 while a thread passes over its columns: 96 × 256 × 8 B = 192 KiB
/// (f64; half that in f32). A multiple of every micro-kernel height.
const MC: usize = 96;

/// What the probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct GemmProbe {
    /// Floating-point operations (2 per multiply-add) per second.
    pub flops_per_second: f64,
    pub calls: u64,
    pub seconds: f64,
    /// Threads of the pool it ran on.
    pub threads: usize,
    /// The kernel path: `avx512` (three registers × 8 micro-kernel), `avx2` (three registers × 4)
    /// or `portable`.
    pub isa: &'static str,
    /// `f32` or `f64`.
    pub precision: &'static str,
    /// `[M, N, K]` of one call.
    pub shape: [usize; 3],
}

/// An element type the probe multiplies: its name, its micro-kernels and their shapes.
trait Element:
    Copy + Default + Send + Sync + std::ops::AddAssign + std::ops::Mul<Output = Self>
{
    const NAME: &'static str;
    /// Values per AVX2 register (a 256-bit register holds 8 f32 or 4 f64).
    const AVX2_WIDTH: usize;

    fn of(v: f64) -> Self;

    /// One `MR × NR` tile of [`micro`] on a SIMD path.
    ///
    /// # Safety
    /// `isa` must be Avx512 or Avx2 (a value of which proves the CPU has its features).
    #[cfg(target_arch = "x86_64")]
    unsafe fn simd_micro(isa: Isa, a: &[Self], b: &[Self], c: &mut [Self]);

    /// Micro-kernel shape `(MR, NR)` of a path: three registers of A's column against NR
    /// broadcasts of B.
    fn tile(isa: Isa) -> (usize, usize) {
        match isa.kind() {
            IsaKind::Avx512 => (3 * 2 * Self::AVX2_WIDTH, 8),
            IsaKind::Avx2 => (3 * Self::AVX2_WIDTH, 4),
            IsaKind::Portable => (4, 4),
        }
    }
}

impl Element for f64 {
    const NAME: &'static str = "f64";
    const AVX2_WIDTH: usize = 4;

    fn of(v: f64) -> Self {
        v
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn simd_micro(isa: Isa, a: &[f64], b: &[f64], c: &mut [f64]) {
        // SAFETY: the caller's contract: `isa` is a SIMD kind the CPU supports.
        unsafe {
            match isa.kind() {
                IsaKind::Avx512 => x86::dgemm_avx512(a, b, c),
                _ => x86::dgemm_avx2(a, b, c),
            }
        }
    }
}

impl Element for f32 {
    const NAME: &'static str = "f32";
    const AVX2_WIDTH: usize = 8;

    fn of(v: f64) -> Self {
        v as f32
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn simd_micro(isa: Isa, a: &[f32], b: &[f32], c: &mut [f32]) {
        // SAFETY: the caller's contract: `isa` is a SIMD kind the CPU supports.
        unsafe {
            match isa.kind() {
                IsaKind::Avx512 => x86::sgemm_avx512(a, b, c),
                _ => x86::sgemm_avx2(a, b, c),
            }
        }
    }
}

/// The f64 rate: multiplies repeatedly for at least `duration` (and at least twice) on the
/// current rayon pool with the fastest path this CPU has.
pub fn measure(duration: Duration) -> GemmProbe {
    measure_with(Isa::detect(), duration)
}

/// [`measure`] on a chosen path.
pub fn measure_with(isa: Isa, duration: Duration) -> GemmProbe {
    probe::<f64>(isa, [M, N, K], duration)
}

/// The f32 rate, as [`measure`]: the yardstick of weight products (spec §6.1 rule 2).
pub fn measure_f32(duration: Duration) -> GemmProbe {
    measure_f32_with(Isa::detect(), duration)
}

/// [`measure_f32`] on a chosen path.
pub fn measure_f32_with(isa: Isa, duration: Duration) -> GemmProbe {
    probe::<f32>(isa, [M, N, K], duration)
}

/// The probe for `C[m×n] += A[m×k]·B[k×n]` (`m`, `n`, `k` multiples of the tile and of [`KC`]).
fn probe<E: Element>(isa: Isa, [m, n, k]: [usize; 3], duration: Duration) -> GemmProbe {
    let (mr, nr) = E::tile(isa);
    assert!(
        m % mr == 0 && n % nr == 0 && k % KC == 0,
        "probe shape {m}×{n}×{k} is not tiled by {mr}×{nr}×{KC}"
    );
    // Values in [-1, 1): the rate does not depend on them (no subnormals).
    let value =
        |i: usize| E::of(((i.wrapping_mul(2_654_435_761) >> 7) % 2048) as f64 / 1024.0 - 1.0);
    // A as [K/KC][M/MR][KC][MR], B as [N/NR][K][NR]: each micro-kernel call reads contiguous
    // panels.
    let mut a_buf = Aligned::<E>::zeros(m * k);
    let a = a_buf.as_mut_slice();
    for kb in 0..k / KC {
        for ib in 0..m / mr {
            for p in 0..KC {
                for i in 0..mr {
                    a[((kb * (m / mr) + ib) * KC + p) * mr + i] =
                        value((ib * mr + i) * k + kb * KC + p);
                }
            }
        }
    }
    let mut b_buf = Aligned::<E>::zeros(k * n);
    let b = b_buf.as_mut_slice();
    for jb in 0..n / nr {
        for p in 0..k {
            for j in 0..nr {
                b[(jb * k + p) * nr + j] = value(p * n + jb * nr + j + m * k);
            }
        }
    }
    let (a, b) = (&*a, &*b);
    // C as [N/NR][M][NR]: each thread owns a contiguous run of column blocks and, as BLIS
    // does, keeps one MC-row block of A in its L2 cache while it passes over all of them.
    let mut c = vec![E::default(); m * n];
    let per_thread = (n / nr).div_ceil(rayon::current_num_threads().max(1));
    let row_tiles_per_block = (MC / mr).max(1);
    let call = |c: &mut [E]| {
        c.par_chunks_mut(m * nr * per_thread)
            .enumerate()
            .for_each(|(part, cs)| {
                for kb in 0..k / KC {
                    for ib0 in (0..m / mr).step_by(row_tiles_per_block) {
                        let ib1 = (ib0 + row_tiles_per_block).min(m / mr);
                        for (local, cb) in cs.chunks_mut(m * nr).enumerate() {
                            let jb = part * per_thread + local;
                            let bp = &b[(jb * k + kb * KC) * nr..(jb * k + (kb + 1) * KC) * nr];
                            for ib in ib0..ib1 {
                                let ap = &a[(kb * (m / mr) + ib) * KC * mr..][..KC * mr];
                                micro(isa, ap, bp, &mut cb[ib * mr * nr..(ib + 1) * mr * nr]);
                            }
                        }
                    }
                }
            });
    };
    call(&mut c); // warm-up: caches, page faults, the pool's threads
    let started = Instant::now();
    let mut calls = 0u64;
    while calls < 2 || started.elapsed() < duration {
        call(&mut c);
        calls += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    std::hint::black_box(&c);
    GemmProbe {
        flops_per_second: 2.0 * (m * n * k) as f64 * calls as f64 / seconds,
        calls,
        seconds,
        threads: rayon::current_num_threads(),
        isa: isa.kind().name(),
        precision: E::NAME,
        shape: [m, n, k],
    }
}

/// `c[i][j] += Σ_p a[p][i] · b[p][j]` for one `MR × NR` tile (`a` is `[KC][MR]`, `b` `[KC][NR]`,
/// `c` `[MR][NR]`).
fn micro<E: Element>(isa: Isa, a: &[E], b: &[E], c: &mut [E]) {
    match isa.kind() {
        // SAFETY: an `Isa` of a SIMD kind is only constructed after `IsaKind::is_supported`
        // detected its features.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 | IsaKind::Avx2 => unsafe { E::simd_micro(isa, a, b, c) },
        _ => {
            let (mr, nr) = E::tile(isa);
            let mut acc = [[E::default(); 4]; 4];
            for (ap, bp) in a.chunks_exact(mr).zip(b.chunks_exact(nr)) {
                for (i, row) in acc.iter_mut().enumerate() {
                    for (j, v) in row.iter_mut().enumerate() {
                        *v += ap[i] * bp[j];
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (j, v) in row.iter().enumerate() {
                    c[i * nr + j] += *v;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Defines `$name(a, b, c)`: an `MR × NR` tile with MR = three registers of `$width` values
    /// of type `$t`, A's column held in them against `NR` broadcasts of B, `3·NR` accumulators.
    macro_rules! gemm_tile {
        ($name:ident, $t:ty, $features:literal, $width:expr, $nr:expr,
         $zero:ident, $load:ident, $set1:ident, $fma:ident, $store:ident) => {
            /// # Safety
            /// The running CPU must support the target features named here.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(a: &[$t], b: &[$t], c: &mut [$t]) {
                const W: usize = $width;
                const MR: usize = 3 * W;
                const NR: usize = $nr;
                let k = a.len() / MR;
                assert!(b.len() >= k * NR && c.len() >= MR * NR, "gemm tile bounds");
                let mut acc = [[$zero(); 3]; NR];
                for p in 0..k {
                    // SAFETY: p < k = a.len()/MR, so the MR values at MR·p are in `a`.
                    let col = unsafe {
                        let pa = a.as_ptr().add(p * MR);
                        [$load(pa), $load(pa.add(W)), $load(pa.add(2 * W))]
                    };
                    for (j, accj) in acc.iter_mut().enumerate() {
                        // SAFETY: p < k and j < NR, so p·NR + j < k·NR ≤ b.len() (asserted).
                        let bj = $set1(unsafe { *b.as_ptr().add(p * NR + j) });
                        for (q, v) in accj.iter_mut().enumerate() {
                            *v = $fma(col[q], bj, *v);
                        }
                    }
                }
                // C is [MR][NR]: element (i, j) is lane i % W of register i / W of column j.
                let mut col: [$t; MR] = [0.0; MR];
                for (j, accj) in acc.iter().enumerate() {
                    for (q, v) in accj.iter().enumerate() {
                        // SAFETY: `col` holds MR = 3·W values; the store writes W·q … W·q + W − 1.
                        unsafe { $store(col.as_mut_ptr().add(W * q), *v) };
                    }
                    for (i, v) in col.iter().enumerate() {
                        c[i * NR + j] += v;
                    }
                }
            }
        };
    }

    gemm_tile!(
        dgemm_avx512,
        f64,
        "avx512f",
        8,
        8,
        _mm512_setzero_pd,
        _mm512_loadu_pd,
        _mm512_set1_pd,
        _mm512_fmadd_pd,
        _mm512_storeu_pd
    );
    gemm_tile!(
        dgemm_avx2,
        f64,
        "avx2,fma",
        4,
        4,
        _mm256_setzero_pd,
        _mm256_loadu_pd,
        _mm256_set1_pd,
        _mm256_fmadd_pd,
        _mm256_storeu_pd
    );
    gemm_tile!(
        sgemm_avx512,
        f32,
        "avx512f",
        16,
        8,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps
    );
    gemm_tile!(
        sgemm_avx2,
        f32,
        "avx2,fma",
        8,
        4,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn computes_the_product<E: Element + PartialEq + std::fmt::Debug + std::iter::Sum>() {
        for isa in Isa::all_supported() {
            let (mr, nr) = E::tile(isa);
            let k = 40;
            let a: Vec<E> = (0..k * mr).map(|i| E::of((i % 7) as f64 - 3.0)).collect();
            let b: Vec<E> = (0..k * nr).map(|i| E::of((i % 5) as f64 - 2.0)).collect();
            let mut c = vec![E::of(1.0); mr * nr];
            micro(isa, &a, &b, &mut c);
            for i in 0..mr {
                for j in 0..nr {
                    let mut want = E::of(1.0);
                    want += (0..k).map(|p| a[p * mr + i] * b[p * nr + j]).sum::<E>();
                    assert_eq!(c[i * nr + j], want, "{isa} {} ({i}, {j})", E::NAME);
                }
            }
        }
    }

    /// Every path multiplies correctly (the rate of a wrong product would mean nothing): one
    /// tile against a direct sum, with small integers so any order is exact.
    #[test]
    fn every_path_computes_the_product() {
        computes_the_product::<f64>();
        computes_the_product::<f32>();
    }

    #[test]
    fn the_probe_reports_a_rate() {
        for isa in Isa::all_supported() {
            for p in [
                probe::<f64>(isa, [96, 16, KC], Duration::from_millis(1)),
                probe::<f32>(isa, [96, 16, KC], Duration::from_millis(1)),
            ] {
                assert!(p.calls >= 2 && p.seconds > 0.0 && p.flops_per_second > 0.0);
                assert_eq!((p.shape, p.isa), ([96, 16, KC], isa.kind().name()));
            }
        }
    }
}
