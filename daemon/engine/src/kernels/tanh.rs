//! `tanh` on eight lanes, bit for bit the pure-Rust `libm::tanh` (spec §6.1 rule 6).
//!
//! SiTU-GLU (spec §4.1) takes two `tanh` and one `exp` per element of every MLP's hidden
//! width; scalar, they were about 5 % of a long prompt's prefill (issue 30). As for
//! [`super::exp`], libm's algorithm (musl's `tanh.c` over FreeBSD's `s_expm1.c`) is a fixed
//! sequence of correctly rounded IEEE operations, so evaluating the same sequence on vector
//! lanes gives the same bits; its branches become per-lane selects, every arm computed and one
//! chosen. For `a = |x|`, `tanh` is
//!
//! * `a > 20` (high word above `0x40340000`): `1 − 0/a`, i.e. 1;
//! * `log(3)/2 < a ≤ 20`: `1 − 2/(expm1(2a) + 2)`;
//! * `log(5/3)/2 < a ≤ log(3)/2`: `t/(t + 2)` with `t = expm1(2a)`;
//! * `2⁻¹⁰²² ≤ a ≤ log(5/3)/2`: `−t/(t + 2)` with `t = expm1(−2a)`;
//! * subnormal or zero: `a`;
//!
//! then the sign of `x`. The `expm1` arguments this leaves are in `[−0.52, 40]`, where libm's
//! `expm1` has no special case but its tiny-argument return: its reduction `x = k·ln2 + r`
//! (`k = 0`, `±1`, or `trunc(x/ln2 ± ½)`) is one formula for all three (`x − 0·ln2hi = x`,
//! `x − (−1)·ln2hi = x + ln2hi` exactly), and its result is one of five expressions chosen by
//! `k` (0, −1, 1, 2 … 56 split at 20, 57 and 58), each copied here operation for operation.
//! NaN takes libm itself; every other `f64` (±∞ included) takes the lanes. `tests` compares
//! the lanes with `libm::tanh` on millions of arguments and at every threshold.

use super::exp::{INVLN2, LANES, LN2HI as LN2_HI, LN2LO as LN2_LO, MAGIC};

// libm's expm1 constants, by their bits (its source gives each bit pattern beside the decimal);
// its ln2 split and 1/ln2 are exp's.
const Q1: f64 = f64::from_bits(0xbfa1_1111_1111_10f4);
const Q2: f64 = f64::from_bits(0x3f5a_01a0_19fe_5585);
const Q3: f64 = f64::from_bits(0xbf14_ce19_9eaa_dbb7);
const Q4: f64 = f64::from_bits(0x3ed0_cfca_86e6_5239);
const Q5: f64 = f64::from_bits(0xbe8a_fdb7_6e09_c32d);

/// Whether `x` takes the lanes (every value but NaN).
#[inline(always)]
pub(super) fn in_domain(x: f64) -> bool {
    !x.is_nan()
}

/// `libm::tanh` of eight arguments in the domain, branch-free (the module doc).
#[inline(always)]
pub(super) fn lanes(x: [f64; LANES]) -> [f64; LANES] {
    let mut out = [0.0; LANES];
    for (o, &x) in out.iter_mut().zip(&x) {
        let bits = x.to_bits();
        let a = f64::from_bits(bits & (u64::MAX >> 1));
        let w = (bits >> 32) as u32 & 0x7fff_ffff;
        let saturated = w > 0x4034_0000;
        let above_mid = w > 0x3fd0_58ae;
        // Saturated lanes use 1 whatever expm1 says: give it a harmless argument.
        let arg = if saturated {
            0.0
        } else if above_mid {
            2.0 * a
        } else {
            -2.0 * a
        };
        let t = expm1(arg);
        let big = 1.0 - 2.0 / (t + 2.0);
        let mid = t / (t + 2.0);
        let small = -t / (t + 2.0);
        let r = if saturated {
            1.0 - 0.0 / a
        } else if w > 0x3fe1_93ea {
            big
        } else if above_mid {
            mid
        } else if w >= 0x0010_0000 {
            small
        } else {
            a
        };
        *o = if bits >> 63 == 1 { -r } else { r };
    }
    out
}

/// libm's `expm1` for `x ∈ [−0.52, 40]`, branch-free (the module doc).
#[inline(always)]
fn expm1(x: f64) -> f64 {
    let bits = x.to_bits();
    let hx = (bits >> 32) as u32 & 0x7fff_ffff;
    let negative = bits >> 63 == 1;
    let (half, one) = if negative { (-0.5, -1.0) } else { (0.5, 1.0) };
    let k = if hx > 0x3fd6_2e42 {
        if hx < 0x3ff0_a2b2 {
            one
        } else {
            (INVLN2 * x + half).trunc()
        }
    } else {
        0.0
    };
    let hi = x - k * LN2_HI;
    let lo = k * LN2_LO;
    let x = hi - lo;
    let c = (hi - x) - lo;
    let hfx = 0.5 * x;
    let hxs = x * hfx;
    let r1 = 1.0 + hxs * (Q1 + hxs * (Q2 + hxs * (Q3 + hxs * (Q4 + hxs * Q5))));
    let t = 3.0 - r1 * hfx;
    let e = hxs * ((r1 - t) / (6.0 - x * t));
    let at_zero = x - (x * e - hxs);
    let e = x * (e - c) - c;
    let e = e - hxs;
    let at_minus_one = 0.5 * (x - e) - 0.5;
    let at_one = if x < -0.25 {
        -2.0 * (e - (x + 0.5))
    } else {
        1.0 + 2.0 * (x - e)
    };
    // k ∈ [−1, 58] here, so 2^k and 2^−k are normal numbers built from their bits.
    let k_int = (k + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits()) as i64;
    let twopk = f64::from_bits((0x3ff_i64.wrapping_add(k_int) as u64) << 52);
    let uf = f64::from_bits((0x3ff_i64.wrapping_sub(k_int) as u64) << 52);
    let above_56 = (x - e + 1.0) * twopk - 1.0;
    let below_20 = (x - e + (1.0 - uf)) * twopk;
    let from_20 = (x - (e + uf) + 1.0) * twopk;
    if hx < 0x3c90_0000 {
        f64::from_bits(bits)
    } else if k_int == 0 {
        at_zero
    } else if k_int == -1 {
        at_minus_one
    } else if k_int == 1 {
        at_one
    } else if k_int > 56 {
        above_56
    } else if k_int < 20 {
        below_20
    } else {
        from_20
    }
}

#[cfg(test)]
mod tests {
    use super::super::exp::xorshift;
    use super::*;

    /// The lanes against `libm::tanh`, bit for bit; NaN is outside the lanes' domain.
    fn check(xs: &[f64]) {
        for step in xs.chunks(LANES) {
            let mut x = [0.0; LANES];
            x[..step.len()].copy_from_slice(step);
            if !x.iter().all(|&v| in_domain(v)) {
                assert!(x.iter().any(|v| v.is_nan()));
                continue;
            }
            let y = lanes(x);
            for (&x, &y) in x.iter().zip(&y) {
                assert_eq!(
                    y.to_bits(),
                    libm::tanh(x).to_bits(),
                    "tanh({x:e}) = {y:e}, libm {:e}",
                    libm::tanh(x)
                );
            }
        }
    }

    #[test]
    fn uniform_arguments_match_libm() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let unit = move || (next() >> 11) as f64 / (1u64 << 53) as f64;
        let mut unit = unit;
        // Where the MLPs' gates and ups divided by the caps fall, and beyond saturation.
        let xs: Vec<f64> = (0..3_000_000)
            .map(|i| match i % 3 {
                0 => 2.0 * unit() - 1.0,
                1 => 12.0 * unit() - 6.0,
                _ => 60.0 * unit() - 30.0,
            })
            .collect();
        check(&xs);
    }

    #[test]
    fn arguments_of_every_magnitude_match_libm() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let xs: Vec<f64> = (0..3_000_000).map(|_| f64::from_bits(next())).collect();
        check(&xs);
    }

    #[test]
    fn thresholds_and_special_values_match_libm() {
        let mut xs = vec![
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::from_bits(1),
            20.0,
            -0.25,
        ];
        let mut around = |at: f64| {
            for sign in [1.0, -1.0] {
                let mut v = at;
                for _ in 0..64 {
                    xs.push(sign * v);
                    v = f64::from_bits(v.to_bits() + 1);
                }
                let mut v = at;
                for _ in 0..64 {
                    xs.push(sign * v);
                    v = f64::from_bits(v.to_bits().saturating_sub(1));
                }
            }
        };
        // tanh's thresholds on |x|, and the tiny-argument threshold of expm1 (on 2|x|).
        for w in [
            0x4034_0000u64,
            0x3fe1_93ea,
            0x3fd0_58ae,
            0x0010_0000,
            0x3c80_0000,
        ] {
            around(f64::from_bits(w << 32));
            around(f64::from_bits((w << 32) | 0xffff_ffff));
        }
        // expm1's reduction thresholds (0.5·ln2, 1.5·ln2) and every k's rounding boundary,
        // on its argument 2|x|; k = 20 and k = 56/57 change the result's formula.
        for hx in [0x3fd6_2e42u64, 0x3ff0_a2b2] {
            around(f64::from_bits(hx << 32) / 2.0);
        }
        for k in 1..=58 {
            around((k as f64 - 0.5) / INVLN2 / 2.0);
        }
        // Reduced arguments below −0.25 at k = 1 take libm's other formula.
        for i in 0..20_000 {
            xs.push(0.26 + 0.27 * i as f64 / 20_000.0);
        }
        check(&xs);
    }
}
