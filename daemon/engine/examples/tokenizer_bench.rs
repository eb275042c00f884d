//! Tokenizer benchmark: load time of a 163,840-id vocabulary (median of 5) and encode speed,
//! for our encoder and the two alternatives rust-stack.md §4 considered, in the same run.
//!
//! Usage: `tests/tokenizer/bench.sh` (finds o200k_base.tiktoken in the tiktoken-rs sources), or
//! `cargo run --release -p k3-engine --example tokenizer_bench -- O200K_FILE K3_CONFIG CORPUS SCRATCH`.
//!
//! The vocabulary stands in for K3's: o200k's first 163,584 ranks plus K3's added-token table
//! (ids 163,584..163,839). Exits 1 if our median load takes 1.5 s or more.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k3_engine::tokenizer::{Specials, Tokenizer, pretokenize::PATTERN};

const K3_RANKS: usize = 163_584;
const RUNS: usize = 5;

/// Wall and process CPU times of repeated runs. The machine is shared, so routes are measured
/// round-robin (each sees the same background load) and CPU time is reported next to wall time.
#[derive(Default)]
struct Times {
    wall: Vec<Duration>,
    cpu: Vec<Duration>,
}

impl Times {
    fn run<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (cpu0, wall0) = (cpu_time(), Instant::now());
        let out = f();
        self.wall.push(wall0.elapsed());
        self.cpu.push(cpu_time().saturating_sub(cpu0));
        out
    }

    fn medians(&self) -> (Duration, Duration) {
        (median(self.wall.clone()), median(self.cpu.clone()))
    }
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// User + system CPU time of this process (all threads).
fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(usage.user_time()) + tv(usage.system_time())
}

/// (bytes, rank) pairs of a tiktoken file, for the alternatives' constructors.
fn parse_ranks(path: &Path) -> Vec<(Vec<u8>, u32)> {
    let b64 = base64::engine::general_purpose::STANDARD;
    std::fs::read_to_string(path)
        .expect("rank file")
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (t, r) = l.split_once(' ').expect("two fields");
            (b64.decode(t).expect("base64"), r.parse().expect("rank"))
        })
        .collect()
}

/// GPT-2's byte-to-character map, which byte-level BPE in `tokenizers` expects.
fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        map[b as usize] = if printable {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("valid")
        };
    }
    map
}

fn build_tokenizers(ranks: &[(Vec<u8>, u32)]) -> tokenizers::Tokenizer {
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::{
        byte_level::ByteLevel,
        sequence::Sequence,
        split::{Split, SplitPattern},
    };
    let chars = byte_chars();
    let name = |b: &[u8]| b.iter().map(|&x| chars[x as usize]).collect::<String>();
    let lookup: HashMap<&[u8], u32> = ranks.iter().map(|(b, r)| (b.as_slice(), *r)).collect();
    let vocab: tokenizers::models::bpe::Vocab = ranks.iter().map(|(b, r)| (name(b), *r)).collect();
    // Every split of a token into two tokens is a merge, ordered by the result's rank.
    // (result rank, left rank, right rank, left bytes, right bytes)
    type Merge<'a> = (u32, u32, u32, &'a [u8], &'a [u8]);
    let mut merges: Vec<Merge> = Vec::new();
    for (bytes, rank) in ranks {
        for cut in 1..bytes.len() {
            let (l, r) = bytes.split_at(cut);
            if let (Some(&rl), Some(&rr)) = (lookup.get(l), lookup.get(r)) {
                merges.push((*rank, rl, rr, l, r));
            }
        }
    }
    merges.sort_unstable_by_key(|m| (m.0, m.1, m.2));
    let merges = merges.into_iter().map(|m| (name(m.3), name(m.4))).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(true)
        .build()
        .expect("BPE");
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    let split = Split::new(
        SplitPattern::Regex(PATTERN.into()),
        tokenizers::SplitDelimiterBehavior::Isolated,
        false,
    )
    .expect("split");
    let byte_level = ByteLevel::new(false, false, false);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![split.into(), byte_level.into()])));
    tokenizer
}

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [o200k, k3_config, corpus, scratch] = args.as_slice() else {
        eprintln!("usage: tokenizer_bench O200K_FILE K3_CONFIG CORPUS SCRATCH_DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(scratch).expect("scratch dir");
    let model = scratch.join("tiktoken.model");
    let text = std::fs::read_to_string(o200k).expect("o200k");
    let head: String = text
        .lines()
        .take(K3_RANKS)
        .flat_map(|l| [l, "\n"])
        .collect();
    std::fs::write(&model, head).expect("write stand-in");

    let ranks = parse_ranks(&model);
    let (mut ours_load, mut core_load, mut hf_load) =
        (Times::default(), Times::default(), Times::default());
    let (mut ours, mut core, mut hf) = (None, None, None);
    for _ in 0..RUNS {
        ours = Some(ours_load.run(|| Tokenizer::from_files(&model, k3_config).expect("load")));
        core = Some(core_load.run(|| {
            let encoder: rustc_hash::FxHashMap<Vec<u8>, u32> =
                parse_ranks(&model).into_iter().collect();
            tiktoken_rs::CoreBPE::new(encoder, Default::default(), PATTERN).expect("CoreBPE")
        }));
        hf = Some(hf_load.run(|| build_tokenizers(&parse_ranks(&model))));
    }
    let (ours, core, hf) = (ours.expect("ran"), core.expect("ran"), hf.expect("ran"));
    assert_eq!(ours.vocab_size(), 163_840);

    let corpus = std::fs::read_to_string(corpus).expect("corpus").repeat(16);
    let mb = corpus.len() as f64 / 1e6;
    // The pre-tokeniser alone bounds every route that runs this pattern on fancy_regex.
    let pattern = fancy_regex::Regex::new(PATTERN).expect("pattern");
    let (mut ours_enc, mut core_enc, mut hf_enc, mut split) = (
        Times::default(),
        Times::default(),
        Times::default(),
        Times::default(),
    );
    let (mut ours_ids, mut core_ids, mut hf_ids, mut pieces) =
        (Vec::new(), Vec::new(), Vec::new(), 0);
    for _ in 0..RUNS {
        ours_ids = ours_enc.run(|| ours.encode(&corpus, Specials::Plain).expect("encode"));
        core_ids = core_enc.run(|| core.encode_ordinary(&corpus));
        hf_ids = hf_enc.run(|| {
            hf.encode_fast(corpus.as_str(), false)
                .expect("encode")
                .get_ids()
                .to_vec()
        });
        pieces = split.run(|| pattern.find_iter(&corpus).count());
    }
    let differ = |ids: &[u32]| {
        ids.iter().zip(&ours_ids).filter(|(a, b)| a != b).count()
            + ids.len().abs_diff(ours_ids.len())
    };
    println!(
        "vocabulary: {} ranks + 256 added = {} ids",
        ranks.len(),
        ours.vocab_size()
    );
    println!(
        "corpus: {mb:.2} MB, {} ids (ours); medians of {RUNS}, routes interleaved",
        ours_ids.len()
    );
    println!(
        "route                        load wall / cpu s    encode MB/s wall / cpu   ids differing"
    );
    let rate = |t: Duration| mb / t.as_secs_f64();
    for (name, load, enc, diff) in [
        ("k3d rank BPE (fancy_regex)", &ours_load, &ours_enc, 0),
        (
            "tiktoken-rs CoreBPE",
            &core_load,
            &core_enc,
            differ(&core_ids),
        ),
        (
            "tokenizers byte-level BPE",
            &hf_load,
            &hf_enc,
            differ(&hf_ids),
        ),
    ] {
        let ((lw, lc), (ew, ec)) = (load.medians(), enc.medians());
        println!(
            "{name:<28} {:>7.3} / {:<7.3} {:>11.2} / {:<8.2} {diff:>10}",
            lw.as_secs_f64(),
            lc.as_secs_f64(),
            rate(ew),
            rate(ec),
        );
    }
    let (sw, sc) = split.medians();
    println!(
        "pre-tokeniser split alone ({pieces} pieces): {:.2} / {:.2} MB/s",
        rate(sw),
        rate(sc)
    );
    let ours_load = ours_load.medians().0;
    let _ = std::fs::remove_file(&model);
    if ours_load >= Duration::from_millis(1500) {
        eprintln!(
            "FAIL: median load {:.3} s is not under 1.5 s",
            ours_load.as_secs_f64()
        );
        std::process::exit(1);
    }
    println!("PASS: median load {:.3} s < 1.5 s", ours_load.as_secs_f64());
}
