//! Direct-I/O bandwidth of this machine's drive for the read shapes `k3d` uses
//! (engine-lessons §2.2–§2.3), through the engine's own reader pool:
//!
//! * `experts`: 17,547,264-byte runs at unaligned, expert-like offsets (header-shifted, so every
//!   read goes through an aligned window), 16 per batch like one MoE layer, at several depths;
//! * `layer`: one 1,267,744,256-byte run (a KDA+MoE trunk layer) into one buffer, split into
//!   32 / 64 MiB requests read by `qd` threads — the whole-layer ring slot scheme;
//! * `stream`: the same two layers read as consecutive 32 / 64 MiB runs, `qd` in flight, each buffer reused
//!   as soon as it is consumed — the fixed-chunk scheme.
//!
//! The page cache is dropped before every run (`sync; echo 3 > /proc/sys/vm/drop_caches`, needs
//! root; refused loudly otherwise unless `--no-drop`). Reports the median of `--runs` runs.
//!
//! ```text
//! cargo run --release -p k3-engine --example read_bench -- [--dir D] [--size-gib N] [--runs N]
//!     [--only experts,layer,stream] [--qd 1,4,8,16] [--chunk-mib 32,64] [--buffered]
//!     [--no-drop] [--keep]
//! ```

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use k3_engine::checkpoint::layout::ByteRun;
use k3_engine::store::direct_buffer::AlignedBuf;
use k3_engine::store::direct_io::{DirectPolicy, ShardSet, Window};
use k3_engine::store::reader::{ReadBatch, ReaderConfig, ReaderPool};

const EXPERT: u64 = 17_547_264;
const KDA_LAYER: u64 = 1_267_744_256;
/// Offset of the first "expert": an arbitrary safetensors-header-like shift.
const HEADER_SHIFT: u64 = 8 + 123_461;
const GIB: u64 = 1 << 30;

struct Args {
    dir: PathBuf,
    size_gib: u64,
    runs: usize,
    only: Option<String>,
    qds: Vec<usize>,
    chunks_mib: Vec<usize>,
    buffered: bool,
    drop: bool,
    keep: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        dir: PathBuf::from("/work/scratch/io"),
        size_gib: 4,
        runs: 3,
        only: None,
        qds: vec![1, 4, 8, 16],
        chunks_mib: vec![32, 64],
        buffered: false,
        drop: true,
        keep: false,
    };
    let list = |v: &str| -> Result<Vec<usize>, String> {
        v.split(',')
            .map(|x| x.parse().map_err(|e| format!("{x}: {e}")))
            .collect()
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--dir" => a.dir = PathBuf::from(val()?),
            "--size-gib" => a.size_gib = val()?.parse().map_err(|e| format!("{e}"))?,
            "--runs" => a.runs = val()?.parse().map_err(|e| format!("{e}"))?,
            "--only" => a.only = Some(val()?),
            "--qd" => a.qds = list(&val()?)?,
            "--chunk-mib" => a.chunks_mib = list(&val()?)?,
            "--buffered" => a.buffered = true,
            "--no-drop" => a.drop = false,
            "--keep" => a.keep = true,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    Ok(a)
}

/// The byte at file position `p`: cheap, position-dependent, not compressible by the device.
fn pattern(p: u64) -> u8 {
    let x = p.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (p >> 12) as u8
}

fn make_file(path: &Path, bytes: u64) -> Result<(), String> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == bytes) {
        return Ok(());
    }
    eprintln!(
        "writing {} GiB scratch file {}",
        bytes / GIB,
        path.display()
    );
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let block = 64 << 20;
    let mut buf = vec![0u8; block];
    let mut at = 0u64;
    while at < bytes {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = pattern(at + i as u64);
        }
        let n = block.min((bytes - at) as usize);
        f.write_all(&buf[..n]).map_err(|e| format!("write: {e}"))?;
        at += n as u64;
    }
    f.sync_all().map_err(|e| format!("fsync: {e}"))
}

fn drop_caches(enabled: bool) -> Result<(), String> {
    if !enabled {
        return Ok(());
    }
    // SAFETY: sync(2) takes no arguments, touches no memory of ours and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("cannot drop the page cache (root needed; --no-drop to skip): {e}"))
}

fn check(payload: &[u8], run: ByteRun) -> Result<(), String> {
    let n = payload.len().min(64);
    for i in (0..n).chain(payload.len() - n..payload.len()) {
        if payload[i] != pattern(run.offset + i as u64) {
            return Err(format!("wrong byte at {} of run {run:?}", i));
        }
    }
    Ok(())
}

/// Deterministic pseudo-random stream for picking experts.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// 4 layers × 16 distinct random experts into 16 slot buffers kept in `bufs` across runs;
/// returns window bytes read.
fn experts(
    pool: &ReaderPool,
    file_len: u64,
    seed: u64,
    bufs: &mut Vec<AlignedBuf>,
) -> Result<u64, String> {
    let count = (file_len - HEADER_SHIFT) / EXPERT;
    let cap = Window::capacity_for(EXPERT).unwrap_or(EXPERT * 2) as usize;
    while bufs.len() < 16 {
        bufs.push(AlignedBuf::zeroed(cap).map_err(|e| e.to_string())?);
    }
    let mut rng = Rng(seed | 1);
    let mut bytes = 0;
    for _layer in 0..4 {
        let mut picks: Vec<u64> = Vec::new();
        while picks.len() < 16 {
            let e = rng.next() % count;
            if !picks.contains(&e) {
                picks.push(e);
            }
        }
        let runs: Vec<_> = picks
            .iter()
            .zip(bufs.drain(..))
            .map(|(&e, b)| {
                let run = ByteRun {
                    shard: 0,
                    offset: HEADER_SHIFT + e * EXPERT,
                    len: EXPERT,
                };
                (run, b)
            })
            .collect();
        let ids: Vec<ByteRun> = runs.iter().map(|(r, _)| *r).collect();
        let mut batch = pool.submit(runs);
        while let Some((id, r)) = batch.wait_any() {
            let loaded = r.map_err(|f| f.error.to_string())?;
            check(loaded.payload(), ids[id])?;
            bytes += Window::of(ids[id]).map_err(|e| e.to_string())?.len as u64;
            bufs.push(loaded.into_buffer());
        }
    }
    Ok(bytes)
}

/// Two KDA-layer-sized runs into one buffer.
fn layer(pool: &ReaderPool, buf: &mut Option<AlignedBuf>) -> Result<u64, String> {
    let mut bytes = 0;
    for i in 0..2 {
        let run = ByteRun {
            shard: 0,
            offset: HEADER_SHIFT + i * KDA_LAYER,
            len: KDA_LAYER,
        };
        let b = buf.take().ok_or("buffer lost")?;
        let loaded = pool.read(run, b).map_err(|f| f.error.to_string())?;
        check(loaded.payload(), run)?;
        bytes += Window::of(run).map_err(|e| e.to_string())?.len as u64;
        *buf = Some(loaded.into_buffer());
    }
    Ok(bytes)
}

/// The bytes of `layer` (two KDA layers) as consecutive runs ending on `chunk` boundaries,
/// `qd` in flight, consumed in order. Buffers are kept in `bufs` across runs, as an engine
/// allocates them once at load (fresh memory would add page faults to the timing).
fn stream(
    pool: &ReaderPool,
    chunk: usize,
    qd: usize,
    bufs: &mut Vec<AlignedBuf>,
) -> Result<u64, String> {
    let end = HEADER_SHIFT + 2 * KDA_LAYER;
    let mut inflight: VecDeque<(ByteRun, ReadBatch)> = VecDeque::new();
    let mut next = HEADER_SHIFT;
    let mut bytes = 0;
    // Submit the next run into `buf`, or give `buf` back when the region is done.
    let submit = |next: &mut u64, buf: AlignedBuf| -> Result<(ByteRun, ReadBatch), AlignedBuf> {
        if *next >= end {
            return Err(buf);
        }
        let boundary = (*next / chunk as u64 + 1) * chunk as u64;
        let run = ByteRun {
            shard: 0,
            offset: *next,
            len: boundary.min(end) - *next,
        };
        *next += run.len;
        Ok((run, pool.submit(vec![(run, buf)])))
    };
    bufs.retain(|b| b.capacity() == chunk);
    while bufs.len() < qd {
        bufs.push(AlignedBuf::zeroed(chunk).map_err(|e| e.to_string())?);
    }
    let mut idle = Vec::new();
    for b in bufs.drain(..qd).collect::<Vec<_>>() {
        match submit(&mut next, b) {
            Ok(x) => inflight.push_back(x),
            Err(b) => idle.push(b),
        }
    }
    while let Some((run, mut batch)) = inflight.pop_front() {
        let loaded = batch
            .wait(0)
            .ok_or("completion lost")?
            .map_err(|f| f.error.to_string())?;
        check(loaded.payload(), run)?;
        bytes += run.len;
        match submit(&mut next, loaded.into_buffer()) {
            Ok(x) => inflight.push_back(x),
            Err(b) => idle.push(b),
        }
    }
    bufs.extend(idle);
    Ok(bytes)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if let Err(e) = run() {
        eprintln!("read_bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let a = parse()?;
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("{}: {e}", a.dir.display()))?;
    let path = a.dir.join("read_bench.bin");
    let file_len = a.size_gib * GIB;
    make_file(&path, file_len)?;
    let policy = if a.buffered {
        DirectPolicy::Off
    } else {
        DirectPolicy::Prefer
    };
    let shards =
        Arc::new(ShardSet::open(std::slice::from_ref(&path), policy).map_err(|e| e.to_string())?);
    println!("read mode: {}", shards.read_mode());
    println!("| test | chunk MiB | qd | median GB/s | min | max | GB per run |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let want = |t: &str| {
        a.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|x| x == t))
    };
    let mut layer_buf = None;
    let mut stream_bufs = Vec::new();
    let mut expert_bufs = Vec::new();
    let mut cases: Vec<(&str, usize, usize)> = Vec::new();
    if want("experts") {
        cases.extend(a.qds.iter().map(|&q| ("experts", 32, q)));
    }
    for &c in &a.chunks_mib {
        for &q in &a.qds {
            if want("layer") {
                cases.push(("layer", c, q));
            }
            if want("stream") {
                cases.push(("stream", c, q));
            }
        }
    }
    for (test, chunk_mib, qd) in cases {
        let config = ReaderConfig {
            queue_depth: qd,
            chunk: chunk_mib << 20,
        };
        let pool = ReaderPool::new(Arc::clone(&shards), config).map_err(|e| e.to_string())?;
        if test == "layer" && layer_buf.is_none() {
            let cap = Window::capacity_for(KDA_LAYER).ok_or("size")? as usize;
            layer_buf = Some(AlignedBuf::zeroed(cap).map_err(|e| e.to_string())?);
        }
        let mut rates = Vec::new();
        let mut gb = 0.0;
        for r in 0..a.runs {
            drop_caches(a.drop)?;
            let t = Instant::now();
            let bytes = match test {
                "experts" => experts(&pool, file_len, 0x5EED + r as u64, &mut expert_bufs)?,
                "layer" => layer(&pool, &mut layer_buf)?,
                _ => stream(&pool, chunk_mib << 20, qd, &mut stream_bufs)?,
            };
            let s = t.elapsed().as_secs_f64();
            gb = bytes as f64 / 1e9;
            rates.push(gb / s);
        }
        let (lo, hi) = rates
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        let chunk_col = if test == "experts" {
            "-".to_string()
        } else {
            chunk_mib.to_string()
        };
        println!(
            "| {test} | {chunk_col} | {qd} | {:.3} | {lo:.3} | {hi:.3} | {gb:.2} |",
            median(rates)
        );
    }
    if !a.keep {
        std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
