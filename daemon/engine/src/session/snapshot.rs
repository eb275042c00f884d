//! Snapshots and the reuse rule.
//!
//! A snapshot is a model [`State`] together with the exact ids it has consumed. A request may
//! continue from a snapshot only if the snapshot's history is a *strict* prefix of its prompt:
//! at least one prompt token must remain to be fed, because the logits of the snapshot's last
//! position are not kept (they would cost `vocab` floats per snapshot — 650 KB for K3 — and
//! recomputing them needs the token before, which the state has already consumed). A prompt
//! equal to a snapshot's history therefore falls back to the longest strictly shorter
//! snapshot, or to a fresh state.

use crate::model::State;

/// Snapshots kept per session: the newest ones win. Four covers the end of the prompt prefill
/// and the end of the generation of the last two turns, which is what a chat that re-renders
/// its previous turn differently (e.g. without its reasoning) needs.
pub const MAX_SNAPSHOTS: usize = 4;

/// A state and the ids it consumed (`state.positions() == history.len()`).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub history: Vec<u32>,
    pub state: State,
}

/// The snapshot a prompt continues from: the longest one whose history is a strict prefix of
/// `prompt` (index into `snapshots`), or `None` for a fresh state.
/// Takes owned or borrowed snapshots.
pub fn best<S: std::borrow::Borrow<Snapshot>>(snapshots: &[S], prompt: &[u32]) -> Option<usize> {
    snapshots
        .iter()
        .map(|s| &s.borrow().history)
        .enumerate()
        .filter(|(_, h)| h.len() < prompt.len() && prompt.starts_with(h))
        .max_by_key(|(_, h)| h.len())
        .map(|(i, _)| i)
}

/// Adds `snap` as the newest snapshot, replacing one with the same history, and drops the
/// oldest beyond [`MAX_SNAPSHOTS`].
pub fn push(snapshots: &mut Vec<Snapshot>, snap: Snapshot) {
    snapshots.retain(|s| s.history != snap.history);
    snapshots.push(snap);
    if snapshots.len() > MAX_SNAPSHOTS {
        let excess = snapshots.len() - MAX_SNAPSHOTS;
        snapshots.drain(..excess);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::kda::KdaState;
    use crate::model::mla::MlaCache;
    use crate::model::state::LayerState;

    /// A small two-layer state (one KDA, one MLA with 2 floats per row) whose values are
    /// derived from `history`, so different histories give different states.
    pub(crate) fn state_for(history: &[u32]) -> State {
        let seed = history.iter().fold(1.0f32, |a, &id| a * 0.5 + id as f32);
        let kda = KdaState {
            s: vec![seed; 4],
            history: [vec![seed + 1.0; 2], vec![seed + 2.0; 2], vec![-seed; 2]],
            journal: None,
        };
        let mla = MlaCache {
            rows: (0..history.len() * 2).map(|i| i as f32 * seed).collect(),
        };
        State {
            layers: vec![LayerState::Kda(kda), LayerState::Mla(mla)],
            positions: history.len(),
            poisoned: false,
            speculation: None,
        }
    }

    /// A fresh, empty scratch directory for one unit test, removed on drop.
    pub(crate) fn scratch(tag: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("k3-session-{tag}-"))
            .tempdir()
            .expect("scratch dir")
    }

    pub(crate) fn snap(history: &[u32]) -> Snapshot {
        Snapshot {
            history: history.to_vec(),
            state: state_for(history),
        }
    }

    #[test]
    fn extends_exactly() {
        let snaps = vec![snap(&[1, 2]), snap(&[1, 2, 3, 4])];
        assert_eq!(best(&snaps, &[1, 2, 3, 4, 5]), Some(1));
        // Diverges after the short snapshot: only it is an exact prefix.
        assert_eq!(best(&snaps, &[1, 2, 9, 4, 5]), Some(0));
    }

    #[test]
    fn never_partial_and_never_equal() {
        let snaps = vec![snap(&[1, 2, 3])];
        // Shares two tokens only: the state cannot be truncated, so nothing is reused.
        assert_eq!(best(&snaps, &[1, 2, 7, 8]), None);
        // Equal to the history: its last logits are not kept, so it is not usable.
        assert_eq!(best(&snaps, &[1, 2, 3]), None);
        // Shorter than the history.
        assert_eq!(best(&snaps, &[1, 2]), None);
        let two = vec![snap(&[1]), snap(&[1, 2, 3])];
        assert_eq!(best(&two, &[1, 2, 3]), Some(0));
        assert_eq!(best::<Snapshot>(&[], &[1]), None);
    }

    #[test]
    fn bounded_newest_kept() {
        let mut snaps = Vec::new();
        for n in 1..=6u32 {
            push(&mut snaps, snap(&(0..n).collect::<Vec<_>>()));
        }
        assert_eq!(snaps.len(), MAX_SNAPSHOTS);
        assert_eq!(snaps[0].history.len(), 3);
        assert_eq!(snaps[MAX_SNAPSHOTS - 1].history.len(), 6);
        // The same history again replaces, not duplicates.
        push(&mut snaps, snap(&[0, 1, 2]));
        assert_eq!(snaps.len(), MAX_SNAPSHOTS);
        assert_eq!(snaps.last().map(|s| s.history.len()), Some(3));
    }
}
