//! The logit transform of a request ([`LogitTransform`]: OpenAI's `logit_bias`,
//! `frequency_penalty`, `presence_penalty`) applied to one row of logits, from the counts of
//! the ids generated so far. Deterministic: a function of the row, the request and the
//! generated ids only, computed per id in a fixed order (no reduction), so it is the same at
//! every thread count, budget and batch composition.

use std::borrow::Cow;

use rustc_hash::FxHashMap;

use super::request::LogitTransform;

/// How often each id was generated so far (kept only when a penalty is set).
#[derive(Debug, Clone, Default)]
pub(super) struct Counts(FxHashMap<u32, u32>);

impl Counts {
    pub(super) fn add(&mut self, id: u32) {
        *self.0.entry(id).or_insert(0) += 1;
    }
}

impl LogitTransform {
    /// True when a generated id changes later logits (a penalty is set).
    pub(super) fn counts_ids(&self) -> bool {
        self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }

    /// `row` transformed: `(l + bias) - (c * frequency_penalty + [c > 0] * presence_penalty)`
    /// per id, in f32, in that order; the row itself (not copied) when nothing changes it.
    pub(super) fn apply<'a>(&self, row: &'a [f32], counts: &Counts) -> Cow<'a, [f32]> {
        let penalised = self.counts_ids() && !counts.0.is_empty();
        if self.bias.is_empty() && !penalised {
            return Cow::Borrowed(row);
        }
        let mut out = row.to_vec();
        for &(id, bias) in &self.bias {
            if let Some(l) = out.get_mut(id as usize) {
                *l += bias;
            }
        }
        if penalised {
            for (&id, &c) in &counts.0 {
                if let Some(l) = out.get_mut(id as usize) {
                    *l -= c as f32 * self.frequency_penalty + self.presence_penalty;
                }
            }
        }
        Cow::Owned(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_borrows_and_changes_nothing() {
        let row = [1.0f32, -0.0, 3.5];
        let t = LogitTransform::default();
        assert!(matches!(
            t.apply(&row, &Counts::default()),
            Cow::Borrowed(_)
        ));
        // Penalties with nothing generated yet change nothing either.
        let t = LogitTransform {
            frequency_penalty: 1.0,
            presence_penalty: 0.5,
            ..LogitTransform::default()
        };
        assert!(matches!(
            t.apply(&row, &Counts::default()),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn bias_then_penalties_by_the_formula() {
        let row = [1.0f32, 2.0, 3.0, 4.0];
        let mut counts = Counts::default();
        for id in [2, 2, 3] {
            counts.add(id);
        }
        let t = LogitTransform {
            bias: vec![(0, 100.0), (2, -0.25)],
            frequency_penalty: 0.5,
            presence_penalty: 0.125,
        };
        let out = t.apply(&row, &counts);
        // id 0: bias only; id 1: untouched; id 2: (3 - 0.25) - (2 * 0.5 + 0.125);
        // id 3: 4 - (1 * 0.5 + 0.125).
        let expect = [
            101.0f32,
            2.0,
            (3.0 - 0.25) - (2.0 * 0.5 + 0.125),
            4.0 - 0.625,
        ];
        assert_eq!(
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            expect.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // Negative penalties reward repetition, as OpenAI's do.
        let reward = LogitTransform {
            presence_penalty: -2.0,
            ..LogitTransform::default()
        };
        assert_eq!(reward.apply(&row, &counts)[3], 6.0);
    }
}
