//! Which instruction set the hot kernels run on, chosen at run time.
//!
//! Every path computes the same bits (spec §6.1 rule 3: one tree, identical in scalar and SIMD
//! code), so the choice only changes speed. An [`Isa`] value can only be obtained for an
//! instruction set the running CPU supports; holding one is the proof the `unsafe` SIMD calls
//! rely on. Forcing a path (tests, benchmarks, a command-line flag) goes through
//! [`Isa::new`] with an explicit [`IsaKind`] — there is no global switch.

use std::fmt;
use std::str::FromStr;

/// The kernel implementations that exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IsaKind {
    /// Plain Rust, the reference for every other path.
    Portable,
    /// x86-64 AVX2 + FMA, 4 f64 lanes per register.
    Avx2,
    /// x86-64 AVX-512F (with AVX2 + FMA), 8 f64 lanes per register.
    Avx512,
}

impl IsaKind {
    /// Every kind, slowest first.
    pub const ALL: [IsaKind; 3] = [IsaKind::Portable, IsaKind::Avx2, IsaKind::Avx512];

    /// The name accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            IsaKind::Portable => "portable",
            IsaKind::Avx2 => "avx2",
            IsaKind::Avx512 => "avx512",
        }
    }

    /// Whether the running CPU has every feature this kind's code is compiled for.
    pub fn is_supported(self) -> bool {
        match self {
            IsaKind::Portable => true,
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512 => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            IsaKind::Avx2 | IsaKind::Avx512 => false,
        }
    }
}

impl fmt::Display for IsaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`IsaKind::name`].
#[derive(Debug, thiserror::Error)]
#[error("unknown instruction set {0:?} (expected portable, avx2 or avx512)")]
pub struct UnknownIsa(pub String);

impl FromStr for IsaKind {
    type Err = UnknownIsa;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IsaKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownIsa(s.to_string()))
    }
}

/// A kernel path the running CPU is known to support (invariant of the type: the only
/// constructors check [`IsaKind::is_supported`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Isa {
    kind: IsaKind,
}

impl Isa {
    /// The fastest supported path. Feature detection is cached by std, so this is cheap enough
    /// to call per kernel invocation.
    pub fn detect() -> Isa {
        let kind = if IsaKind::Avx512.is_supported() {
            IsaKind::Avx512
        } else if IsaKind::Avx2.is_supported() {
            IsaKind::Avx2
        } else {
            IsaKind::Portable
        };
        Isa { kind }
    }

    /// The portable reference path (always available).
    pub fn portable() -> Isa {
        Isa {
            kind: IsaKind::Portable,
        }
    }

    /// `kind` if the running CPU supports it.
    pub fn new(kind: IsaKind) -> Option<Isa> {
        kind.is_supported().then_some(Isa { kind })
    }

    /// Every path the running CPU supports, portable first.
    pub fn all_supported() -> Vec<Isa> {
        IsaKind::ALL.into_iter().filter_map(Isa::new).collect()
    }

    pub fn kind(self) -> IsaKind {
        self.kind
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for k in IsaKind::ALL {
            assert_eq!(k.name().parse::<IsaKind>().unwrap(), k);
        }
        assert!("sse9".parse::<IsaKind>().is_err());
    }

    #[test]
    fn detect_picks_a_supported_path_and_portable_is_always_there() {
        assert!(Isa::detect().kind().is_supported());
        assert_eq!(Isa::all_supported()[0], Isa::portable());
        assert!(Isa::all_supported().contains(&Isa::detect()));
    }
}
