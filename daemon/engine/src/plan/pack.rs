//! What the plan does with a trunk pack ([`crate::pack`], issue 31): the pack only changes
//! which bytes a chunk stream reads, never what is resident, so the plan is made as without it
//! (plus one decode buffer, reserved before anything is placed) and then priced with the
//! figures the store measured when it opened the pack: the bytes one token reads from the pack
//! and from the shards, the bytes those decode to, and the decoder's rate against the drive's.
//!
//! The pack pays when the decoder keeps up with the drive: the chunk stream decodes a piece on
//! the compute threads while the reader threads fetch the next ones, so a token streamed from
//! the drive costs the larger of its read time (fewer bytes with the pack) and its compute
//! plus decode time. A decoder slower than the drive would make the compute side the limit of
//! a token that was limited by the drive: the plan then does not use the pack, and says why.

use std::fmt;

use super::{Plan, StreamScheme, gb};

/// The pack's part in a plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PackPlan {
    /// No pack was given.
    #[default]
    None,
    /// A pack was given: its decode buffer is reserved, the store has not priced it yet.
    Reserved { buffer: u64 },
    /// Streamed matrices the pack holds are read from it.
    Used(PackFigures),
    /// The pack is not read; the reserved buffer stays unused.
    NotUsed { buffer: u64, why: PackRefusal },
}

/// A priced pack: per token, and the rates it was judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PackFigures {
    /// Pack bytes one token reads.
    pub read: u64,
    /// The shard bytes they decode to (what the same matrices read without the pack).
    pub decoded: u64,
    /// The decode buffer.
    pub buffer: u64,
    /// Measured at load: pack bytes per second the decoder consumed on the compute threads,
    /// and the drive delivered through the reader threads.
    pub decode_rate: u64,
    pub drive_rate: u64,
    pub threads: usize,
}

/// Why a given pack is not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PackRefusal {
    /// Every trunk matrix and lm_head is resident: nothing is read per token.
    NothingStreams,
    /// A ring of whole-layer slots reads each layer's run as one piece; the pack's blocks pass
    /// only through the chunk stream.
    RingScheme,
    /// No streamed matrix has a packed copy whose blocks fit a chunk.
    NoPackedMatrix,
    /// The decoder is slower than the drive (see the module doc).
    DoesNotPay(PackFigures),
}

/// What the store measured and cut: [`Plan::price_pack`]'s input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackMeasure {
    /// Bytes one token reads (the chunk stream's cycle) with the pack: trunk and lm_head.
    pub trunk_read: u64,
    pub lm_head_read: u64,
    pub figures: PackFigures,
}

impl PackPlan {
    /// The decode buffer the plan reserved for a pack (0 without one).
    pub fn buffer(&self) -> u64 {
        match *self {
            PackPlan::None => 0,
            PackPlan::Reserved { buffer } | PackPlan::NotUsed { buffer, .. } => buffer,
            PackPlan::Used(f) => f.buffer,
        }
    }

    /// The decode buffer a pack needs under `scheme` (as fitted to the model): one chunk's
    /// payload (reserved whole).
    pub fn reserve(scheme: StreamScheme) -> u64 {
        match scheme {
            StreamScheme::Chunks { chunk, .. } => chunk,
            StreamScheme::Ring { .. } => 0,
        }
    }
}

impl Plan {
    /// Whether a pack could be read at all: something streams, through chunks.
    pub fn pack_refusal(&self) -> Option<PackRefusal> {
        if self.pinned_layers.len() == self.layer_count
            && self.lm_head == super::Residency::Resident
        {
            Some(PackRefusal::NothingStreams)
        } else if matches!(self.scheme, StreamScheme::Ring { .. }) {
            Some(PackRefusal::RingScheme)
        } else {
            None
        }
    }

    /// Prices the pack the store measured: reads it (the reads per token become the pack's)
    /// when the decoder keeps up with the drive or `always`, else records why not and leaves
    /// the reads as they are. The decode buffer was reserved by [`Plan::for_model`].
    pub fn price_pack(&mut self, m: PackMeasure, always: bool) -> bool {
        let buffer = self.pack.buffer();
        let figures = PackFigures {
            buffer,
            ..m.figures
        };
        if always || figures.decode_rate >= figures.drive_rate {
            self.reads.trunk = m.trunk_read;
            self.reads.lm_head = m.lm_head_read;
            self.pack = PackPlan::Used(figures);
            true
        } else {
            self.refuse_pack(PackRefusal::DoesNotPay(figures));
            false
        }
    }

    /// Records that the given pack is not read, and why.
    pub fn refuse_pack(&mut self, why: PackRefusal) {
        let buffer = self.pack.buffer();
        self.pack = PackPlan::NotUsed { buffer, why };
    }
}

fn rate(b: u64) -> String {
    format!("{:.2} GB/s", b as f64 / 1e9)
}

impl fmt::Display for PackFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "decoder {} on {} threads vs drive {}",
            rate(self.decode_rate),
            self.threads,
            rate(self.drive_rate)
        )
    }
}

impl fmt::Display for PackPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackPlan::None => Ok(()),
            PackPlan::Reserved { buffer } => {
                write!(f, "given, {} decode buffer reserved", gb(*buffer))
            }
            PackPlan::Used(p) => write!(
                f,
                "read: {} per token from the pack instead of {} from the shards ({:.1} %), {} \
                 decode buffer; {}",
                gb(p.read),
                gb(p.decoded),
                100.0 * p.read as f64 / p.decoded.max(1) as f64,
                gb(p.buffer),
                p
            ),
            PackPlan::NotUsed { buffer, why } => {
                write!(f, "not read ({} decode buffer unused): ", gb(*buffer))?;
                match why {
                    PackRefusal::NothingStreams => write!(f, "nothing streams at this budget"),
                    PackRefusal::RingScheme => {
                        write!(
                            f,
                            "the ring scheme reads whole layers; the pack needs chunks"
                        )
                    }
                    PackRefusal::NoPackedMatrix => {
                        write!(f, "no streamed matrix has packed blocks that fit a chunk")
                    }
                    PackRefusal::DoesNotPay(p) => {
                        write!(
                            f,
                            "it does not pay, the decoder is slower than the drive: {p}"
                        )
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(decode_rate: u64, drive_rate: u64) -> PackMeasure {
        PackMeasure {
            trunk_read: 700,
            lm_head_read: 70,
            figures: PackFigures {
                read: 770,
                decoded: 1100,
                buffer: 0,
                decode_rate,
                drive_rate,
                threads: 2,
            },
        }
    }

    /// Released K3 at 8 GiB: most of the trunk streams through chunks.
    fn streaming_plan() -> Plan {
        let budget = crate::plan::Budget {
            ram: Some(8 * crate::plan::GIB),
            ..Default::default()
        };
        let mut plan =
            Plan::new(&crate::plan::tests::k3(), budget, StreamScheme::default()).expect("plan");
        plan.pack = PackPlan::Reserved { buffer: 4096 };
        plan
    }

    #[test]
    fn a_decoder_slower_than_the_drive_is_not_used() {
        let mut plan = streaming_plan();
        let before = plan.reads;
        assert!(!plan.price_pack(figures(1, 2), false));
        assert_eq!(plan.reads, before);
        assert!(matches!(
            plan.pack,
            PackPlan::NotUsed {
                buffer: 4096,
                why: PackRefusal::DoesNotPay(_)
            }
        ));
        assert!(plan.to_string().contains("does not pay"), "{plan}");
    }

    #[test]
    fn a_decoder_that_keeps_up_changes_the_reads() {
        let mut plan = streaming_plan();
        assert!(plan.price_pack(figures(3, 2), false));
        assert_eq!((plan.reads.trunk, plan.reads.lm_head), (700, 70));
        assert_eq!(plan.pack.buffer(), 4096);
        let mut forced = streaming_plan();
        assert!(forced.price_pack(figures(1, 2), true));
    }
}
