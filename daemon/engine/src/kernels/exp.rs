//! `exp` over a slice, bit for bit the pure-Rust `libm::exp` (spec §6.1 rule 6), eight or
//! four at a time.
//!
//! Attention's softmax (spec §6.1 rule 8) takes one `exp` per query and visible position: at a
//! 40,000-token prompt that is most of the prefill's time, and `libm::exp` is scalar. Its
//! algorithm (FreeBSD's `e_exp.c`) is a fixed sequence of IEEE additions, multiplications
//! and one division — argument reduction `x = k·ln2 + r` with `r = hi − lo`, a degree-5
//! polynomial in `r²`, then `2^k` applied by one multiplication — each correctly rounded, so
//! the same sequence evaluated on vector lanes gives the same bits (Rust never contracts a
//! multiply and an add into an FMA). The branches of that code become per-lane selects,
//! computed for every lane and chosen afterwards, and `k` is kept as an exact f64 integer:
//!
//! * `|x| > 1.5·ln2`: `k = trunc(x/ln2 ± ½)` (libm's `as i32`, which truncates);
//! * `0.5·ln2 < |x| ≤ 1.5·ln2`: `k = ±1`;
//! * `2⁻²⁸ < |x| ≤ 0.5·ln2`: `k = 0`, where `hi = x − 0·ln2hi = x` and `lo = 0` are exactly
//!   libm's values for that branch, and `y·2⁰ = y`;
//! * `|x| ≤ 2⁻²⁸`: `1 + x`.
//!
//! `2^k` is built from its bits for `−1022 ≤ k ≤ 1021`, where libm's `scalbn` is that one
//! multiplication too. Only `x ∈ [−708, 708]` takes the lanes (the softmax's `s − max` lies
//! there, and so does the `−g` of a sigmoid of any gate an MLP meets; `|k| ≤ 1022` holds);
//! anything else — NaN, ±∞, huge arguments, libm's overflow and underflow paths — goes
//! through `libm::exp` itself. `tests` compares every path with `libm::exp` on millions of
//! arguments and the branch boundaries.

use super::isa::{Isa, IsaKind};

/// Lanes of one vector step (eight f64: one AVX-512 register, two AVX2 ones).
pub(super) const LANES: usize = 8;
/// The lanes' domain: `[LOW, HIGH]`.
pub(super) const LOW: f64 = -708.0;
pub(super) const HIGH: f64 = 708.0;

// libm's constants, by their bits (its source gives each bit pattern beside the decimal).
pub(super) const LN2HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
pub(super) const LN2LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
pub(super) const INVLN2: f64 = f64::from_bits(0x3ff7_1547_652b_82fe);
const P1: f64 = f64::from_bits(0x3fc5_5555_5555_553e);
const P2: f64 = f64::from_bits(0xbf66_c16c_16be_bd93);
const P3: f64 = f64::from_bits(0x3f11_566a_af25_de2c);
const P4: f64 = f64::from_bits(0xbebb_bd41_c5d2_6bf1);
const P5: f64 = f64::from_bits(0x3e66_3769_72be_a4d0);
/// 1.5·2⁵²: adding it to an integer-valued f64 of magnitude below 2⁵¹ puts the integer in
/// the low bits of the sum's encoding, exactly.
pub(super) const MAGIC: f64 = 6_755_399_441_055_744.0;

/// `xs[i] = exp(xs[i])` for every element, with the bits of `libm::exp`.
pub fn exp_in_place(xs: &mut [f64]) {
    exp_in_place_with(Isa::detect(), xs)
}

/// [`exp_in_place`] on a chosen path; every path gives the same bits.
pub fn exp_in_place_with(isa: Isa, xs: &mut [f64]) {
    match isa.kind() {
        // SAFETY: an `Isa` of kind Avx512 is only constructed after `IsaKind::is_supported`
        // detected AVX-512F, AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => unsafe { exp_avx512(xs) },
        // SAFETY: an `Isa` of kind Avx2 is only constructed after `IsaKind::is_supported`
        // detected AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => unsafe { exp_avx2(xs) },
        _ => exp_steps(xs),
    }
}

/// # Safety
/// The running CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn exp_avx512(xs: &mut [f64]) {
    exp_steps(xs)
}

/// # Safety
/// The running CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_avx2(xs: &mut [f64]) {
    exp_steps(xs)
}

/// Whole steps of [`LANES`] through [`lanes`] when every argument is in its domain, the rest
/// one by one through `libm::exp`. Inlined into each target-feature wrapper, whose
/// instruction set the compiler then vectorises the lane loops for.
#[inline(always)]
fn exp_steps(xs: &mut [f64]) {
    let mut steps = xs.chunks_exact_mut(LANES);
    for step in &mut steps {
        let x: &mut [f64; LANES] = step.try_into().expect("chunks_exact");
        if x.iter().all(|&v| (LOW..=HIGH).contains(&v)) {
            *x = lanes(*x);
        } else {
            for v in x.iter_mut() {
                *v = libm::exp(*v);
            }
        }
    }
    for v in steps.into_remainder() {
        *v = libm::exp(*v);
    }
}

/// `libm::exp` of arguments in `[LOW, HIGH]`, branch-free (the module doc).
#[inline(always)]
pub(super) fn lanes(x: [f64; LANES]) -> [f64; LANES] {
    let mut out = [0.0; LANES];
    for (o, &x) in out.iter_mut().zip(&x) {
        let bits = x.to_bits();
        let hx = (bits >> 32) as u32 & 0x7fff_ffff;
        let negative = bits >> 63 == 1;
        let (half, one) = if negative { (-0.5, -1.0) } else { (0.5, 1.0) };
        let k = if hx >= 0x3ff0_a2b2 {
            (INVLN2 * x + half).trunc()
        } else if hx > 0x3fd6_2e42 {
            one
        } else {
            0.0
        };
        let hi = x - k * LN2HI;
        let lo = k * LN2LO;
        let r = hi - lo;
        let rr = r * r;
        let c = r - rr * (P1 + rr * (P2 + rr * (P3 + rr * (P4 + rr * P5))));
        let y = 1.0 + (r * c / (2.0 - c) - lo + hi);
        // k ∈ [−1022, 1021] here: 2^k is a normal number with biased exponent 1023 + k.
        let k_int = (k + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits()) as i64;
        let scale = f64::from_bits(((1023 + k_int) as u64) << 52);
        *o = if hx > 0x3e30_0000 { y * scale } else { 1.0 + x };
    }
    out
}

/// A fixed xorshift stream: reproducible test arguments without a dependency (the exp, tanh
/// and SiTU lane tests).
#[cfg(test)]
pub(super) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path against `libm::exp`, element by element, bit for bit.
    fn check(xs: &[f64]) {
        for isa in Isa::all_supported() {
            let mut got = xs.to_vec();
            exp_in_place_with(isa, &mut got);
            for (&x, &y) in xs.iter().zip(&got) {
                assert_eq!(
                    y.to_bits(),
                    libm::exp(x).to_bits(),
                    "{isa:?}: exp({x:e}) = {y:e}, libm {:e}",
                    libm::exp(x)
                );
            }
        }
    }

    #[test]
    fn uniform_arguments_over_the_domain_and_beyond_match_libm() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let xs: Vec<f64> = (0..2_000_000)
            .map(|_| -760.0 * (next() >> 11) as f64 / (1u64 << 53) as f64)
            .collect();
        check(&xs);
    }

    #[test]
    fn positive_arguments_over_the_domain_and_beyond_match_libm() {
        let mut next = xorshift(0x6a09_e667_f3bc_c908);
        let xs: Vec<f64> = (0..2_000_000)
            .map(|_| 760.0 * (next() >> 11) as f64 / (1u64 << 53) as f64)
            .collect();
        check(&xs);
    }

    #[test]
    fn arguments_of_every_magnitude_match_libm() {
        // Random bit patterns of both signs: every exponent, hence every branch.
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let xs: Vec<f64> = (0..4_000_000)
            .map(|i| {
                let x = f64::from_bits(next() >> 1);
                if i % 2 == 0 { -x } else { x }
            })
            .collect();
        check(&xs);
    }

    #[test]
    fn branch_boundaries_and_special_values_match_libm() {
        let mut xs = vec![
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            LOW,
            HIGH,
            f64::from_bits(HIGH.to_bits() + 1),
            709.782_712_893_384,
            -708.396_418_532_264_1,
            -745.133_219_101_941_1,
            -800.0,
            1.0,
            709.0,
            f64::MIN_POSITIVE,
        ];
        // Each threshold of libm's high word, and the neighbours of each, of both signs.
        for (hx, sign) in [0x3e30_0000u64, 0x3fd6_2e42, 0x3ff0_a2b2, 0x4086_232b]
            .into_iter()
            .flat_map(|hx| [(hx, -1.0), (hx, 1.0)])
        {
            let at = sign * f64::from_bits(hx << 32);
            let mut v = at;
            for _ in 0..64 {
                xs.push(v);
                v = f64::from_bits(v.to_bits() + 1);
            }
            let mut v = at;
            for _ in 0..64 {
                xs.push(v);
                v = f64::from_bits(v.to_bits() - 1);
            }
            xs.push(sign * f64::from_bits((hx << 32) | 0xffff_ffff));
        }
        // Where x/ln2 ± ½ crosses an integer (k's rounding), for every k of the domain.
        for k in -1022..=1022 {
            let at = (k as f64 - 0.5f64.copysign(k as f64)) / INVLN2;
            let mut v = at;
            for _ in 0..8 {
                xs.push(v);
                v = f64::from_bits(v.to_bits() + 1);
            }
            let mut v = at;
            for _ in 0..8 {
                xs.push(v);
                v = f64::from_bits(v.to_bits().wrapping_sub(1));
            }
        }
        // A mixed step: one argument out of the domain sends its step to libm.
        xs.extend([-1.0, -2.0, -3.0, f64::NAN, -5.0, -6.0, -7.0, -8.0, -9.0]);
        check(&xs);
    }
}
