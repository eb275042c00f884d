//! Guided decoding: a [`Guide`] restricts which ids a generation may produce next — constrained
//! decoding (a reply that must parse, arguments valid against a schema) and the thinking budget
//! (spec §8.4: the think channel closed after N ids) are guides built by the serve core
//! (`crate::constrain`). The engine only asks a generation's [`Guiding`] which ids are allowed
//! before each choice and tells it the id chosen.
//!
//! Exactness: a guide only masks. Greedy takes the first maximum among the allowed ids; sampling
//! draws among them with the same rules as without a guide; a position where every allowed id
//! set is "any" is decided exactly as without a guide. When exactly one id is allowed it is
//! decided without looking at the logits (and without a random draw), which lets the
//! generation feed a run of such forced ids in one forward (see the generation module).

use std::fmt::Debug;

/// The spec of a guide, shared by every generation of the requests that use it.
pub trait Guide: Send + Sync + Debug {
    /// A fresh matcher at the start of the output.
    fn start(&self) -> Box<dyn Guiding>;
}

/// One generation's position in its guide.
pub trait Guiding: Send {
    /// The ids allowed next. Never an empty set: a guide whose state allows nothing is a bug of
    /// the guide, reported by the generation as an internal error.
    fn allowed(&mut self) -> Allowed<'_>;
    /// The id chosen next (always one [`Guiding::allowed`] allowed).
    fn accept(&mut self, id: u32);
}

/// Which ids may come next.
#[derive(Debug, Clone, Copy)]
pub enum Allowed<'a> {
    /// No restriction.
    Any,
    /// Exactly one id: it is decided without consulting the logits.
    Forced(u32),
    /// Only these ids.
    Only(&'a IdSet),
}

/// A set of ids `0..len` as a bit set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdSet {
    words: Vec<u64>,
    len: usize,
}

impl IdSet {
    /// The empty set over ids `0..len`.
    pub fn new(len: usize) -> IdSet {
        IdSet {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Adds `id`; ids outside `0..len` are ignored.
    pub fn insert(&mut self, id: u32) {
        let i = id as usize;
        if i < self.len {
            self.words[i / 64] |= 1 << (i % 64);
        }
    }

    pub fn contains(&self, id: u32) -> bool {
        let i = id as usize;
        i < self.len && self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Adds every id of `other` (same length).
    pub fn union_with(&mut self, other: &IdSet) {
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w |= o;
        }
    }

    /// How many ids the set holds.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(k, &word)| {
            let mut w = word;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros();
                w &= w - 1;
                Some((k * 64) as u32 + bit)
            })
        })
    }

    /// The only id of a one-id set.
    pub fn single(&self) -> Option<u32> {
        let mut ids = self.iter();
        let first = ids.next()?;
        ids.next().is_none().then_some(first)
    }
}

#[cfg(test)]
mod tests {
    use super::IdSet;

    #[test]
    fn id_set_holds_what_was_inserted_in_order() {
        let mut s = IdSet::new(200);
        assert!(s.is_empty());
        for id in [199, 0, 64, 63, 130, 500] {
            s.insert(id);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 63, 64, 130, 199]);
        assert_eq!(s.count(), 5);
        assert!(s.contains(130) && !s.contains(131) && !s.contains(500));
        assert_eq!(s.single(), None);
        let mut one = IdSet::new(200);
        one.insert(77);
        assert_eq!(one.single(), Some(77));
        one.union_with(&s);
        assert_eq!(one.count(), 6);
        one.clear();
        assert!(one.is_empty() && one.single().is_none());
    }
}
