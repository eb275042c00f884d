//! Routing lookahead (plan rule 4, `WeightStore::prefetch_experts`): experts read on a guessed
//! routing are adopted when the routing confirms them — counted as reads, never as bytes
//! avoided (engine-lessons §4.2) — and wrong guesses are withdrawn or reported as unused. The
//! bytes handed out are the stored bytes whatever was guessed.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use k3_engine::checkpoint::Checkpoint;
use k3_engine::checkpoint::layout::FfnLayout;
use k3_engine::plan::{Budget, Lookahead, Plan, PlanInputs};
use k3_engine::store::{ExpertPrefetch, StoreError, StoreOptions, WeightStore};

mod synth_support;
use synth_support::synth;

/// A store under the largest budget below `max`: the whole trunk resident, a cache that cannot
/// hold every expert, and (unless `lookahead` is off) top-k lookahead slots.
fn store(c: &Checkpoint, lookahead: Lookahead) -> WeightStore {
    let max = Plan::for_model(&c.config, &c.layout, &PlanInputs::default()).expect("max plan");
    let inputs = PlanInputs {
        budget: Budget {
            ram: Some(max.total() - 4096),
            // The minimum cache: left to the plan it would take the spare and hold nearly
            // every expert.
            cache: Some(1),
            lookahead,
            ..Budget::default()
        },
        ..PlanInputs::default()
    };
    let plan = Plan::for_model(&c.config, &c.layout, &inputs).expect("plan");
    let shards: Vec<PathBuf> = c.shards.iter().map(|s| s.path.clone()).collect();
    WeightStore::open(
        c.layout.clone(),
        &shards,
        plan,
        StoreOptions::default(),
        &k3_engine::checkpoint::layout::LayerLayout::stream_order,
    )
    .expect("store")
}

fn first_moe_layer(c: &Checkpoint) -> usize {
    c.layout
        .layers
        .iter()
        .position(|l| matches!(l.ffn, FfnLayout::Moe(_)))
        .expect("a MoE layer")
}

/// A `tiny` checkpoint, its store and its first MoE layer; the directory goes with it.
struct Setup {
    _dir: tempfile::TempDir,
    c: Checkpoint,
    s: WeightStore,
    l: usize,
}

fn setup(name: &str, lookahead: Lookahead) -> Setup {
    let dir = tempfile::Builder::new()
        .prefix(&format!("k3d-lookahead-{name}-"))
        .tempdir()
        .expect("temp dir");
    synth("tiny", dir.path());
    let c = Checkpoint::open(dir.path()).expect("checkpoint");
    let s = store(&c, lookahead);
    let l = first_moe_layer(&c);
    Setup { _dir: dir, c, s, l }
}

/// The stored bytes of expert `e` of layer `l`, read with plain file I/O.
fn stored(c: &Checkpoint, l: usize, e: usize) -> Vec<u8> {
    let FfnLayout::Moe(m) = &c.layout.layers[l].ffn else {
        panic!("layer {l} is not MoE")
    };
    let run = m.experts[e].0;
    let mut f = std::fs::File::open(&c.shards[run.shard].path).expect("shard");
    f.seek(SeekFrom::Start(run.offset)).expect("seek");
    let mut out = vec![0u8; run.len as usize];
    f.read_exact(&mut out).expect("read");
    out
}

/// `experts_each` and what it handed out, checked against the stored bytes.
fn fetch(
    s: &WeightStore,
    c: &Checkpoint,
    l: usize,
    ids: &[usize],
    ahead: Option<k3_engine::store::ExpertPrefetch<'_>>,
) {
    let mut got = Vec::new();
    s.experts_each(
        l,
        ids,
        ahead,
        || {},
        |views| {
            for v in views {
                assert!(
                    v.bytes() == stored(c, l, v.expert),
                    "expert {} bytes",
                    v.expert
                );
                got.push(v.expert);
            }
            Ok::<(), StoreError>(())
        },
    )
    .expect("experts");
    got.sort_unstable();
    assert_eq!(got, ids, "every expert handed out once");
}

#[test]
fn confirmed_guesses_are_reads_and_wrong_ones_are_unused_or_withdrawn() {
    let Setup { c, s, l, .. } = &setup("adopt", Lookahead::Auto);
    let l = *l;
    let slots = s.plan().lookahead_slots;
    assert_eq!(
        slots, c.config.num_experts_per_token,
        "top-k lookahead slots"
    );
    let expert_len = stored(c, l, 0).len() as u64;
    // Guess 0..slots; the routing wants 0 and `slots` (not guessed).
    let guesses: Vec<usize> = (0..slots).collect();
    let wanted = [0, slots];
    let before = s.stats();
    let ahead = s.prefetch_experts(l, &guesses).expect("prefetch");
    assert!(ahead.is_some(), "the plan has lookahead slots");
    fetch(s, c, l, &wanted, ahead);
    let after = s.stats();
    let read = after.lookahead_bytes_read - before.lookahead_bytes_read;
    let unused = after.lookahead_unused_bytes - before.lookahead_unused_bytes;
    assert_eq!(read - unused, expert_len, "one guess was confirmed");
    assert!(unused <= (slots as u64 - 1) * expert_len);
    assert_eq!(
        after.expert_bytes_read - before.expert_bytes_read,
        2 * expert_len + unused,
        "the confirmed guess, the unguessed expert and the unused guesses were read"
    );
    assert_eq!(
        after.bytes_avoided, before.bytes_avoided,
        "a guessed read is not a byte avoided"
    );
    // Both are resident now: served without reads, and counted as avoided.
    fetch(s, c, l, &wanted, None);
    let again = s.stats();
    assert_eq!(again.expert_bytes_read, after.expert_bytes_read);
    assert_eq!(again.bytes_avoided - after.bytes_avoided, 2 * expert_len);
    // A guess of a resident expert is a hit when the routing asks for it, and avoids its bytes.
    // This one counts as made before an earlier layer ran (across a dense layer, issue 16).
    let ahead = s
        .prefetch_experts(l, &[0])
        .expect("prefetch")
        .map(ExpertPrefetch::early);
    fetch(s, c, l, &[0], ahead);
    let last = s.stats();
    assert_eq!(last.expert_bytes_read, again.expert_bytes_read);
    assert_eq!(last.bytes_avoided - again.bytes_avoided, expert_len);
    assert_eq!(last.cache.hits - again.cache.hits, 1);
    // The guesses are scored in experts, read or resident: 1 of `slots` right, then 1 of 1
    // (guessed early).
    assert_eq!(
        s.lookahead_by_layer(),
        [k3_engine::store::LayerGuesses {
            layer: l,
            guessed_passes: 2,
            early_passes: 1,
            predicted: slots as u64 + 1,
            routed: 3,
            confirmed: 2,
        }]
    );
}

#[test]
fn a_guess_for_another_layer_or_too_many_guesses_change_nothing_computed() {
    let Setup { c, s, l, .. } = &setup("other", Lookahead::Auto);
    let l = *l;
    let next = (l + 1..c.layout.layers.len())
        .find(|&n| matches!(c.layout.layers[n].ffn, FfnLayout::Moe(_)))
        .expect("a second MoE layer");
    let ahead = s.prefetch_experts(l, &[1, 2]).expect("prefetch");
    // Handed to another layer's request, the guess is dropped and its slots emptied.
    fetch(s, c, next, &[1, 2], ahead);
    fetch(s, c, l, &[1, 2], None);
    assert!(
        s.lookahead_by_layer().is_empty(),
        "a dropped guess scores nothing"
    );
    let too_many: Vec<usize> = (0..=s.plan().lookahead_slots).collect();
    assert!(
        s.prefetch_experts(l, &too_many)
            .expect("prefetch")
            .is_none()
    );
}

#[test]
fn lookahead_off_reserves_no_slots() {
    let Setup { s, l, .. } = &setup("off", Lookahead::Off);
    let l = *l;
    assert_eq!(s.plan().lookahead_slots, 0);
    assert!(s.prefetch_experts(l, &[0]).expect("prefetch").is_none());
}

#[test]
fn a_failed_guessed_read_fails_the_request_with_file_and_offset() {
    let Setup { c, s, l, .. } = &setup("fail", Lookahead::Auto);
    let l = *l;
    let FfnLayout::Moe(m) = &c.layout.layers[l].ffn else {
        unreachable!()
    };
    let run = m.experts[1].0;
    let path = c.shards[run.shard].path.clone();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open shard")
        .set_len(run.offset + 10)
        .expect("truncate");
    let ahead = s.prefetch_experts(l, &[1]).expect("prefetch");
    let err = s
        .experts_each(l, &[1], ahead, || {}, |_| Ok::<(), StoreError>(()))
        .expect_err("a truncated expert cannot be served");
    // The failing request is the expert's aligned window: it starts at the 4096-byte boundary
    // at or below the run.
    let text = err.to_string();
    let window = run.offset / 4096 * 4096;
    assert!(
        text.contains(&path.display().to_string())
            && text.contains(&format!("offset {window}"))
            && text.contains("expert 1"),
        "{text}"
    );
    // Not cached: asked again, it fails again rather than serving a partial buffer.
    assert!(
        s.experts_each(l, &[1], None, || {}, |_| Ok::<(), StoreError>(()))
            .is_err()
    );
}

#[test]
fn guesses_ride_with_the_first_group_so_later_groups_do_not_waste_them() {
    let Setup { c, s, l, .. } = &setup("groups", Lookahead::Auto);
    let l = *l;
    let per_group = s.plan().cache_slots - s.plan().lookahead_slots;
    let slots = s.plan().lookahead_slots;
    // A union larger than one group, the last `slots` of it guessed.
    let needed: Vec<usize> = (0..per_group + slots + 1).collect();
    let guessed: Vec<usize> = needed[needed.len() - slots..].to_vec();
    let ahead = s.prefetch_experts(l, &guessed).expect("prefetch");
    let groups = s.expert_groups(&needed, ahead.as_ref());
    let mut first = groups[0].clone();
    first.sort_unstable();
    let mut expect: Vec<usize> = needed[..per_group].to_vec();
    expect.extend(&guessed);
    assert_eq!(first, expect, "the first group carries every guess");
    assert!(groups.iter().skip(1).all(|g| g.len() <= per_group));
    let before = s.stats();
    let mut ahead = ahead;
    for g in &groups {
        fetch(s, c, l, g, ahead.take());
    }
    let after = s.stats();
    assert_eq!(
        after.lookahead_unused_bytes, before.lookahead_unused_bytes,
        "every guess was used"
    );
    let mut all: Vec<usize> = groups.concat();
    all.sort_unstable();
    assert_eq!(all, needed);
}
