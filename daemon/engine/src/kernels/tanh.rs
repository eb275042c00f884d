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
//! then the sign of `x`. The lanes take the first arm as 1 (`a > 20` is neither 0 nor NaN, so
//! `0/a = 0`). The three middle arms share their divisor, and each lane takes one of them:
//! `−t/(t + 2)` is `−(t/(t + 2))` (round-to-nearest is symmetric in sign) and `1 − 2/(t + 2)`
//! divides `2` where the others divide `t`, so one division per lane — the numerator picked
//! first — gives all three. The `expm1` arguments this leaves are in `[−0.52, 40]`, where
//! libm's `expm1` has no special case but its tiny-argument return: its reduction `x = k·ln2 + r`
//! (`k = 0`, `±1`, or `trunc(x/ln2 ± ½)`) is one formula for all three (`x − 0·ln2hi = x`,
//! `x − (−1)·ln2hi = x + ln2hi` exactly), and its result is one of five expressions chosen by
//! `k` (0, −1, 1, 2 … 56 split at 20, 57 and 58), each copied here operation for operation.
//! NaN takes libm itself; every other `f64` (±∞ included) takes the lanes. `tests` compares
//! the lanes with `libm::tanh` on millions of arguments and at every threshold.

use std::array::from_fn;

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

/// Eight lanes of f64.
type V = [f64; LANES];
/// Eight lanes' conditions.
type Mask = [bool; LANES];

/// Lane by lane `if c { a } else { b }`, both already computed.
///
/// Why every step below is a whole-lane array (`from_fn` over the eight lanes) rather than one
/// loop body per lane: with a lane's branches in one body the compiler kept them as branches —
/// a division computed only on its branch's side — and the body stayed scalar (perf annotate
/// of a 256-token prefill: 2,594 scalar instructions against 166 vector ones, 13 ns per
/// `tanh`). Step by step each operation is eight independent lanes, which the instruction set
/// of the calling `#[target_feature]` function vectorises (5.5 ns per `tanh` on AVX-512).
#[inline(always)]
fn pick(c: Mask, a: V, b: V) -> V {
    from_fn(|i| if c[i] { a[i] } else { b[i] })
}

/// `libm::tanh` of eight arguments in the domain, branch-free (the module doc).
#[inline(always)]
pub(super) fn lanes(x: V) -> V {
    let bits: [u64; LANES] = from_fn(|i| x[i].to_bits());
    let a: V = from_fn(|i| f64::from_bits(bits[i] & (u64::MAX >> 1)));
    let w: [u32; LANES] = from_fn(|i| (bits[i] >> 32) as u32 & 0x7fff_ffff);
    let saturated: Mask = from_fn(|i| w[i] > 0x4034_0000);
    let above_mid: Mask = from_fn(|i| w[i] > 0x3fd0_58ae);
    let above_big: Mask = from_fn(|i| w[i] > 0x3fe1_93ea);
    let normal: Mask = from_fn(|i| w[i] >= 0x0010_0000);
    // Saturated lanes use 1 whatever expm1 says: give it a harmless argument.
    let twice: V = from_fn(|i| 2.0 * a[i]);
    let minus_twice: V = from_fn(|i| -2.0 * a[i]);
    let arg = pick(saturated, [0.0; LANES], pick(above_mid, twice, minus_twice));
    let t = expm1(arg);
    // One division per lane for the three arms (the module doc): 2/(t+2) or t/(t+2).
    let q: V = {
        let num = pick(above_big, [2.0; LANES], t);
        from_fn(|i| num[i] / (t[i] + 2.0))
    };
    let big: V = from_fn(|i| 1.0 - q[i]);
    let small: V = from_fn(|i| -q[i]);
    let r = pick(
        saturated,
        [1.0; LANES],
        pick(above_big, big, pick(above_mid, q, pick(normal, small, a))),
    );
    from_fn(|i| f64::from_bits(r[i].to_bits() ^ (bits[i] & (1 << 63))))
}

/// libm's `expm1` for `x ∈ [−0.52, 40]`, branch-free (the module doc).
#[inline(always)]
fn expm1(x: V) -> V {
    let bits: [u64; LANES] = from_fn(|i| x[i].to_bits());
    let hx: [u32; LANES] = from_fn(|i| (bits[i] >> 32) as u32 & 0x7fff_ffff);
    let negative: Mask = from_fn(|i| bits[i] >> 63 == 1);
    let half = pick(negative, [-0.5; LANES], [0.5; LANES]);
    let one = pick(negative, [-1.0; LANES], [1.0; LANES]);
    let rounded: V = from_fn(|i| (INVLN2 * x[i] + half[i]).trunc());
    let reduces: Mask = from_fn(|i| hx[i] > 0x3fd6_2e42);
    let near: Mask = from_fn(|i| hx[i] < 0x3ff0_a2b2);
    let k = pick(reduces, pick(near, one, rounded), [0.0; LANES]);
    let hi: V = from_fn(|i| x[i] - k[i] * LN2_HI);
    let lo: V = from_fn(|i| k[i] * LN2_LO);
    let x: V = from_fn(|i| hi[i] - lo[i]);
    let c: V = from_fn(|i| (hi[i] - x[i]) - lo[i]);
    let hfx: V = from_fn(|i| 0.5 * x[i]);
    let hxs: V = from_fn(|i| x[i] * hfx[i]);
    let r1: V = from_fn(|i| {
        let h = hxs[i];
        1.0 + h * (Q1 + h * (Q2 + h * (Q3 + h * (Q4 + h * Q5))))
    });
    let t: V = from_fn(|i| 3.0 - r1[i] * hfx[i]);
    let e: V = from_fn(|i| hxs[i] * ((r1[i] - t[i]) / (6.0 - x[i] * t[i])));
    let at_zero: V = from_fn(|i| x[i] - (x[i] * e[i] - hxs[i]));
    let e: V = from_fn(|i| (x[i] * (e[i] - c[i]) - c[i]) - hxs[i]);
    let at_minus_one: V = from_fn(|i| 0.5 * (x[i] - e[i]) - 0.5);
    let at_one = pick(
        from_fn(|i| x[i] < -0.25),
        from_fn(|i| -2.0 * (e[i] - (x[i] + 0.5))),
        from_fn(|i| 1.0 + 2.0 * (x[i] - e[i])),
    );
    // k ∈ [−1, 58] here, so 2^k and 2^−k are normal numbers built from their bits.
    let k_int: [i64; LANES] =
        from_fn(|i| (k[i] + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits()) as i64);
    let twopk: V = from_fn(|i| f64::from_bits((0x3ff_i64.wrapping_add(k_int[i]) as u64) << 52));
    let uf: V = from_fn(|i| f64::from_bits((0x3ff_i64.wrapping_sub(k_int[i]) as u64) << 52));
    let above_56: V = from_fn(|i| (x[i] - e[i] + 1.0) * twopk[i] - 1.0);
    let below_20: V = from_fn(|i| (x[i] - e[i] + (1.0 - uf[i])) * twopk[i]);
    let from_20: V = from_fn(|i| (x[i] - (e[i] + uf[i]) + 1.0) * twopk[i]);
    let r = pick(
        from_fn(|i| k_int[i] > 56),
        above_56,
        pick(from_fn(|i| k_int[i] < 20), below_20, from_20),
    );
    let r = pick(from_fn(|i| k_int[i] == 1), at_one, r);
    let r = pick(from_fn(|i| k_int[i] == -1), at_minus_one, r);
    let r = pick(from_fn(|i| k_int[i] == 0), at_zero, r);
    // The tiny-argument return is the argument itself.
    pick(
        from_fn(|i| hx[i] < 0x3c90_0000),
        from_fn(|i| f64::from_bits(bits[i])),
        r,
    )
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
