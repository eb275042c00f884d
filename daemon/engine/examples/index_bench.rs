//! Benchmark: index the headers of a checkpoint the size of the release.
//!
//! Writes 96 shards with the released names, dtypes, shapes and header encoding of the text
//! model (497,052 tensors) plus 168 vision/projector tensors with placeholder names (their real
//! names are not in the spec), 497,220 in all. Data regions are sparse (`set_len`), so only the
//! headers use disk. Then times, median of several runs: indexing every header, the index-file
//! cross-check, the layout binding, and `Checkpoint::open` end to end; and shows that indexing
//! read only header bytes.
//!
//! `cargo run --release -p k3-engine --example index_bench [DIR] [RUNS]`
//! (DIR defaults to /work/scratch/checkpoint/index_bench; removed afterwards.)

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k3_engine::checkpoint::inventory::{layer_tensors, model_tensors};
use k3_engine::checkpoint::layout::bind;
use k3_engine::checkpoint::safetensors::{Dtype, TensorSpec, encode_header};
use k3_engine::checkpoint::{Checkpoint, ModelConfig, TensorIndex};

const RELEASED_CONFIG: &str = include_str!("../src/checkpoint/testdata/released_config.json");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "/work/scratch/checkpoint/index_bench".into()),
    );
    let runs: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(7);
    let config = ModelConfig::from_json(RELEASED_CONFIG)?;

    let t = Instant::now();
    let header_bytes = write_release_shaped(&dir, &config)?;
    println!("wrote 96 sparse shards + index file in {:.1?}", t.elapsed());
    let (apparent, allocated) = disk_use(&dir)?;
    println!(
        "apparent size {:.3} TB, allocated on disk {:.1} MB (headers {:.1} MB)",
        apparent as f64 / 1e12,
        allocated as f64 / 1e6,
        header_bytes as f64 / 1e6
    );

    let index = TensorIndex::open_dir(&dir)?;
    println!(
        "tensors {}, index heap {:.1} MB = {:.1} B per tensor",
        index.len(),
        index.heap_bytes() as f64 / 1e6,
        index.heap_bytes() as f64 / index.len() as f64
    );
    // The index must read headers only: compare the bytes this process read (rchar) with the
    // header bytes on disk.
    let before = read_chars()?;
    let again = TensorIndex::open_dir(&dir)?;
    let read = read_chars()? - before;
    println!(
        "bytes read while indexing: {read} ({:.4} × the header bytes)",
        read as f64 / header_bytes as f64
    );
    drop(again);

    let index_time = median(runs, || TensorIndex::open_dir(&dir).map(drop))?;
    let check_time = median(runs, || {
        index.check_index_file(&dir.join("model.safetensors.index.json"))
    })?;
    let bind_time = median(runs, || bind(&config, &index).map(drop))?;
    let open_time = median(runs, || Checkpoint::open(&dir).map(drop))?;
    println!("median of {runs} runs:");
    println!("  index 96 headers        {index_time:>10.1?}");
    println!("  check index json        {check_time:>10.1?}");
    println!("  bind layout             {bind_time:>10.1?}");
    println!("  Checkpoint::open total  {open_time:>10.1?}");

    fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Median wall time of `runs` calls.
fn median<E>(runs: usize, mut f: impl FnMut() -> Result<(), E>) -> Result<Duration, E> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// Shards as released (spec §3.1): layer k in shard k+1, model level in 94, projector in 95,
/// vision in 96. Returns the header bytes written (8-byte prefixes included).
fn write_release_shaped(dir: &Path, config: &ModelConfig) -> std::io::Result<u64> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    fs::write(dir.join("config.json"), RELEASED_CONFIG)?;
    let mut shards: Vec<Vec<TensorSpec>> = (0..config.num_hidden_layers)
        .map(|l| layer_tensors(config, l, 128).expect("released dims fit"))
        .collect();
    shards.push(model_tensors(config));
    shards.push(placeholders("mm_projector", 3));
    shards.push(placeholders("vision_tower", 165));
    let n = shards.len();
    let mut header_bytes = 0;
    let mut weight_map = serde_json::Map::new();
    for (i, tensors) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{n:06}.safetensors", i + 1);
        let (header, data_len) = encode_header(tensors).expect("released dims fit");
        let mut f = File::create(dir.join(&name))?;
        f.write_all(&header)?;
        f.set_len(header.len() as u64 + data_len)?;
        header_bytes += header.len() as u64;
        for t in tensors {
            weight_map.insert(t.name.clone(), name.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    fs::write(dir.join("model.safetensors.index.json"), index.to_string())?;
    Ok(header_bytes)
}

/// Out-of-scope tensors with placeholder names and shapes (the reader ignores them).
fn placeholders(prefix: &str, count: usize) -> Vec<TensorSpec> {
    (0..count)
        .map(|i| TensorSpec {
            name: format!("{prefix}.placeholder.{i}.weight"),
            dtype: Dtype::Bf16,
            shape: vec![1152, 1152],
        })
        .collect()
}

fn disk_use(dir: &Path) -> std::io::Result<(u64, u64)> {
    let mut apparent = 0;
    let mut allocated = 0;
    for entry in fs::read_dir(dir)? {
        let m = entry?.metadata()?;
        apparent += m.len();
        allocated += m.blocks() * 512;
    }
    Ok((apparent, allocated))
}

/// `rchar` of /proc/self/io: bytes this process has read through read-like system calls.
fn read_chars() -> std::io::Result<u64> {
    let io = fs::read_to_string("/proc/self/io")?;
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other("no rchar in /proc/self/io"))
}
