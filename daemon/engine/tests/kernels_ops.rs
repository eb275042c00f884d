//! Op-level checks against small independent computations (spec §3.5, §4.1, §6.1), run on every
//! instruction set the CPU supports, and the MXFP4 traps of §3.5 pinned one test each.

use k3_engine::kernels::elementwise::{sigmoid, silu, situ_glu};
use k3_engine::kernels::norm::{L2_NORM_EPS, l2_norm, rms_norm};
use k3_engine::kernels::reduce::dot_f32_with;
use k3_engine::kernels::{Bf16Matrix, Isa, Mxfp4Matrix, matmul_bf16_with, matmul_mxfp4_with};

fn bf16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| {
            assert_eq!(v.to_bits() & 0xffff, 0, "{v} is not a BF16 value");
            ((v.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

/// `ys = W·x` for an MXFP4 matrix on one path (one token).
fn mxfp4_matvec(
    isa: Isa,
    packed: &[u8],
    scales: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) -> Vec<f32> {
    let mut y = vec![0.0f32; rows];
    matmul_mxfp4_with(isa, Mxfp4Matrix::new(packed, scales, rows, cols), x, &mut y);
    y
}

fn one_hot(cols: usize, i: usize, v: f32) -> Vec<f32> {
    let mut x = vec![0.0f32; cols];
    x[i] = v;
    x
}

#[test]
fn bf16_matmul_of_small_integers_is_exact() {
    // Integer weights and activations: every partial sum is an exactly representable integer,
    // so the result must be the exact integer dot whatever the association.
    let (rows, cols) = (3usize, 37usize);
    let w: Vec<f32> = (0..rows * cols)
        .map(|k| ((k * 7) % 11) as f32 - 5.0)
        .collect();
    let x: Vec<f32> = (0..2 * cols).map(|k| ((k * 5) % 9) as f32 - 4.0).collect();
    let bytes = bf16_bytes(&w);
    for isa in Isa::all_supported() {
        let mut y = vec![0.0f32; 2 * rows];
        matmul_bf16_with(isa, Bf16Matrix::new(&bytes, rows, cols), &x, &mut y);
        for t in 0..2 {
            for r in 0..rows {
                let exact: i64 = (0..cols)
                    .map(|i| w[r * cols + i] as i64 * x[t * cols + i] as i64)
                    .sum();
                assert_eq!(y[t * rows + r], exact as f32, "{isa} t={t} r={r}");
            }
        }
    }
}

#[test]
fn bf16_matmul_agrees_with_a_naive_f64_dot_on_well_conditioned_data() {
    let (rows, cols) = (16usize, 7168usize);
    // Positive, bounded data: no cancellation. The weight tree sums in f32 (spec §6.1 rule 2):
    // each of its 16 lanes fuses 448 positive terms, then 4 levels of folding, so the classic
    // bound for a positive sum gives a relative error of at most (448 + 4)·2^-24; the naive f64
    // sum is exact to ~1e-13. A wrong product, lane or nibble is off by far more.
    let w: Vec<f32> = (0..rows * cols)
        .map(|k| f32::from_bits((0.5f32 + ((k * 37) % 101) as f32 / 202.0).to_bits() & 0xffff_0000))
        .collect();
    let x: Vec<f32> = (0..cols)
        .map(|k| 0.25 + ((k * 13) % 17) as f32 / 68.0)
        .collect();
    let bytes = bf16_bytes(&w);
    for isa in Isa::all_supported() {
        let mut y = vec![0.0f32; rows];
        matmul_bf16_with(isa, Bf16Matrix::new(&bytes, rows, cols), &x, &mut y);
        for r in 0..rows {
            let naive: f64 = (0..cols)
                .map(|i| w[r * cols + i] as f64 * x[i] as f64)
                .sum();
            let rel = ((y[r] as f64 - naive) / naive).abs();
            assert!(
                rel <= 452.0 * 2f64.powi(-24),
                "{isa} r={r}: {} vs {naive} (rel {rel})",
                y[r]
            );
        }
    }
}

#[test]
fn dot_is_accumulated_in_f64_not_f32() {
    // 1 + 2^-30·k: an f32 accumulator would lose every small term; f64 keeps them.
    let n = 64;
    let a: Vec<f32> = (0..n)
        .map(|i| if i == 0 { 1.0 } else { 2f32.powi(-30) })
        .collect();
    let b = vec![1.0f32; n];
    for isa in Isa::all_supported() {
        assert_eq!(
            dot_f32_with(isa, &a, &b),
            1.0 + 63.0 * 2f64.powi(-30),
            "{isa}"
        );
    }
}

// ---- MXFP4 traps (spec §3.5) -------------------------------------------------------------

/// The one output of a 1×32 MXFP4 row whose first byte is `byte0` (every other nibble code 0)
/// with scale byte `scale`, for x one-hot at `element` with value `v`: `W[element]·v`.
fn one_group(isa: Isa, byte0: u8, scale: u8, element: usize, v: f32) -> f32 {
    let mut packed = [0u8; 16];
    packed[0] = byte0;
    mxfp4_matvec(isa, &packed, &[scale], 1, 32, &one_hot(32, element, v))[0]
}

#[test]
fn mxfp4_low_nibble_is_the_even_element() {
    // Byte 0 = 0x71: low nibble 1 (0.5) is element 0, high nibble 7 (6.0) is element 1.
    // Swapping nibbles would give 6.0 and 0.5.
    for isa in Isa::all_supported() {
        assert_eq!(one_group(isa, 0x71, 127, 0, 1.0), 0.5, "{isa}");
        assert_eq!(one_group(isa, 0x71, 127, 1, 1.0), 6.0, "{isa}");
    }
}

#[test]
fn mxfp4_every_code_decodes_to_its_e2m1_value() {
    // Row r holds code r in every nibble; x is all ones over one group → 32·E2M1(r).
    let cols = 32;
    let values = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let packed: Vec<u8> = (0..16u8).flat_map(|c| [c | (c << 4); 16]).collect();
    let scales = [127u8; 16];
    for isa in Isa::all_supported() {
        let y = mxfp4_matvec(isa, &packed, &scales, 16, cols, &[1.0; 32]);
        for c in 0..16 {
            let v = values[c & 7] * if c & 8 != 0 { -1.0 } else { 1.0 };
            assert_eq!(y[c], 32.0 * v, "{isa} code {c}");
        }
    }
}

#[test]
fn mxfp4_scale_bias_is_127() {
    // Code 2 (1.0) with scale byte 130 → 2^3 = 8. Bias 128 would give 4, bias 126 16.
    for isa in Isa::all_supported() {
        assert_eq!(one_group(isa, 0x02, 130, 0, 1.0), 8.0, "{isa}");
        assert_eq!(one_group(isa, 0x02, 127, 0, 1.0), 1.0, "{isa}");
        assert_eq!(one_group(isa, 0x02, 1, 0, 2f32.powi(126)), 1.0, "{isa}");
    }
}

#[test]
fn mxfp4_scale_zero_is_two_to_the_minus_127_not_zero() {
    // Code 7 (6.0), scale byte 0 (2^-127), x = 2^100 → 6·2^-27. Building the multiplier by
    // shifting s into the f32 exponent field gives 0 instead.
    for isa in Isa::all_supported() {
        assert_eq!(
            one_group(isa, 0x07, 0, 0, 2f32.powi(100)),
            6.0 * 2f32.powi(-27),
            "{isa}"
        );
    }
}

#[test]
fn mxfp4_scale_groups_run_along_each_row() {
    // 2 rows × 64 inputs: scales[r][g] with r-major layout. Row 0: [127, 128], row 1: [129, 130].
    // Element 40 (group 1) holds code 2 (1.0) in both rows → row 0: 2, row 1: 8. A column-major
    // reading of the scales (group-major) would give 4 and 2.
    let (rows, cols) = (2usize, 64usize);
    let mut packed = vec![0u8; rows * cols / 2];
    packed[40 / 2] = 0x02;
    packed[cols / 2 + 40 / 2] = 0x02;
    let scales = [127u8, 128, 129, 130];
    for isa in Isa::all_supported() {
        let y = mxfp4_matvec(isa, &packed, &scales, rows, cols, &one_hot(cols, 40, 1.0));
        assert_eq!(y, [2.0, 8.0], "{isa}");
        // Group 0 of row 1 is scale 129: element 0.
        let mut p0 = vec![0u8; rows * cols / 2];
        p0[cols / 2] = 0x02;
        let y0 = mxfp4_matvec(isa, &p0, &scales, rows, cols, &one_hot(cols, 0, 1.0));
        assert_eq!(y0, [0.0, 4.0], "{isa}");
    }
}

// ---- norms and elementwise (spec §4.1, §6.1 rules 6–7) -----------------------------------

#[test]
fn rms_norm_is_mean_of_squares_with_eps_and_plain_gain() {
    let x = [3.0f32, 4.0, 0.0, -12.0];
    let gain = [1.0f32, 2.0, 5.0, 0.5];
    let eps = 1e-5;
    let mut out = [0.0f32; 4];
    rms_norm(&x, &gain, eps, &mut out);
    // Σx² = 169, n = 4: inv = 1/sqrt(42.25 + 1e-5); y_i = (x_i·inv)·w_i, no `1 + w`.
    let inv = 1.0 / (42.25f64 + 1e-5).sqrt();
    for i in 0..4 {
        assert_eq!(
            out[i],
            ((x[i] as f64 * inv) * gain[i] as f64) as f32,
            "i={i}"
        );
    }
    assert!((out[0] - 3.0 / 6.5).abs() < 1e-6 && (out[3] + 0.5 * 12.0 / 6.5).abs() < 1e-6);
    // A zero gain gives zero (it would not under a `1 + w` convention).
    rms_norm(&x, &[0.0; 4], eps, &mut out);
    assert_eq!(out, [0.0; 4]);
}

#[test]
fn l2_norm_is_a_sum_with_eps_inside_the_root() {
    let mut out = [0.0f32; 2];
    l2_norm(&[3.0, 4.0], &mut out);
    // A sum (25), not a mean (12.5).
    let inv = 1.0 / (25.0f64 + L2_NORM_EPS).sqrt();
    assert_eq!(out, [(3.0 * inv) as f32, (4.0 * inv) as f32]);
    assert!((out[0] - 0.6).abs() < 1e-6);
    // ε inside the root matters for small vectors: 1e-4 / sqrt(1e-8 + 1e-6) ≈ 0.0995, whereas
    // ε outside (1e-4 / (1e-4 + 1e-6)) would be ≈ 0.99.
    l2_norm(&[1e-4, 0.0], &mut out);
    let want = 1e-4f32 as f64 / ((1e-4f32 as f64).powi(2) + 1e-6).sqrt();
    assert_eq!(out[0], want as f32);
    assert!((out[0] - 0.0995).abs() < 1e-4);
    assert_eq!(L2_NORM_EPS, 1e-6);
}

#[test]
fn sigmoid_and_silu_values() {
    assert_eq!(sigmoid(0.0), 0.5);
    for &x in &[-30.0, -3.5, -1.0, 0.25, 2.0, 17.0] {
        let s = sigmoid(x);
        assert!((s - 1.0 / (1.0 + (-x).exp())).abs() <= 1e-15, "σ({x})");
        assert!((s + sigmoid(-x) - 1.0).abs() <= 1e-15, "σ({x}) + σ(−{x})");
        assert_eq!(silu(x as f32), (x * s) as f32, "SiLU({x})");
    }
}

#[test]
fn situ_glu_takes_sigma_of_the_uncapped_gate_and_caps_up_at_25() {
    let (b1, b2) = (4.0, 25.0);
    let reference =
        |g: f64, u: f64| b1 * (g / b1).tanh() * (1.0 / (1.0 + (-g).exp())) * b2 * (u / b2).tanh();
    for &(g, u) in &[
        (-6.0f32, 3.0f32),
        (0.5, -2.0),
        (3.0, 40.0),
        (-1.0, -1000.0),
        (60.0, 1e6),
    ] {
        let got = situ_glu(g, u, b1, b2) as f64;
        let want = reference(g as f64, u as f64);
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1e-30),
            "SiTU({g}, {u}) = {got}, want {want}"
        );
    }
    // σ on the capped gate would give σ(4·tanh(-2/4)) = σ(-1.848…) ≈ 0.136 instead of
    // σ(-2) ≈ 0.119: a 14 % difference.
    let g = -2.0f64;
    let capped_sigma = b1 * (g / b1).tanh() * (1.0 / (1.0 + (-(b1 * (g / b1).tanh())).exp()));
    let got = situ_glu(g as f32, 1.0, b1, b2) as f64 / (b2 * (1.0 / b2).tanh());
    assert!(
        (got - capped_sigma).abs() > 1e-3,
        "σ must take the uncapped gate"
    );
    // The β₂ cap: a huge up value saturates at 25, so |result| ≤ 4·25 = 100 (strictly below in
    // exact arithmetic; tanh rounds to 1 in f64 far out, giving exactly 100).
    for &(g, u) in &[(1e6f32, 1e30f32), (-1e6, -1e30), (30.0, -3e4), (-3.0, 1e30)] {
        assert!(situ_glu(g, u, b1, b2).abs() <= 100.0);
    }
    assert_eq!(situ_glu(1e6, 1e30, b1, b2), 100.0);
    assert_eq!(
        situ_glu(10.0, 1e30, b1, b2),
        (4.0 * libm::tanh(2.5) * (1.0 / (1.0 + libm::exp(-10.0))) * 25.0) as f32
    );
}
