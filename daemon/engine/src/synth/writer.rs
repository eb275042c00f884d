//! Writing one safetensors shard exactly as the released files are laid out (spec §3.2):
//! compact JSON header (entries in data order, keys `dtype`, `shape`, `data_offsets`), no
//! `__metadata__`, space-padded to a multiple of 8; data ordered F32, then BF16, then U8,
//! each group by bytewise name. Data is generated and written in bounded batches of chunks,
//! never a whole tensor or shard in memory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::SynthError;
use super::tensors::{ShardSpec, Tensor};
use super::values::{CHUNK, chunk_bytes, tensor_seed};
use crate::checkpoint::safetensors::{TensorSpec, data_order, encode_header};

/// Chunks generated in parallel per batch: ≤ 32 × 64 Ki elements × 4 B = 8 MiB in flight.
const BATCH_CHUNKS: u64 = 32;

/// A shard with its tensors in file order and its serialized header.
#[derive(Debug, Clone)]
pub struct PlannedShard {
    pub file_name: String,
    pub tensors: Vec<Tensor>,
    /// The 8-byte length prefix followed by the padded JSON.
    pub header: Vec<u8>,
    pub data_len: u64,
}

impl PlannedShard {
    pub fn file_size(&self) -> u64 {
        self.header.len() as u64 + self.data_len
    }
}

/// Orders the tensors as the data will be written and builds the header (the release's
/// encoding, [`encode_header`]).
pub fn plan(file_name: String, spec: ShardSpec) -> Result<PlannedShard, SynthError> {
    let mut tensors = spec.tensors;
    tensors.sort_by(|a, b| data_order(&a.spec).cmp(&data_order(&b.spec)));
    let specs: Vec<TensorSpec> = tensors.iter().map(|t| t.spec.clone()).collect();
    let Some((header, data_len)) = encode_header(&specs) else {
        return Err(SynthError::DataOverflow { file: file_name });
    };
    Ok(PlannedShard {
        file_name,
        tensors,
        header,
        data_len,
    })
}

/// A writer that hashes everything passing through it.
pub struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// Flushes and returns the lowercase hex SHA-256 of all bytes written.
    pub fn finish(mut self) -> std::io::Result<String> {
        self.inner.flush()?;
        Ok(hex(&self.hasher.finalize()))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes the shard to `dir`, calling `progress(bytes)` after each batch with the number of
/// bytes just written. Returns the file's SHA-256.
pub fn write(
    shard: &PlannedShard,
    dir: &Path,
    seed: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<String, SynthError> {
    let path = dir.join(&shard.file_name);
    let io = |error| SynthError::Io {
        path: path.clone(),
        error,
    };
    let file = File::create(&path).map_err(io)?;
    let mut w = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    w.write_all(&shard.header).map_err(io)?;
    progress(shard.header.len() as u64);
    for t in &shard.tensors {
        let tseed = tensor_seed(seed, &t.spec.name);
        let numel = t.numel();
        let chunks = numel.div_ceil(CHUNK);
        let mut c0 = 0;
        while c0 < chunks {
            let c1 = (c0 + BATCH_CHUNKS).min(chunks);
            let batch: Vec<Vec<u8>> = (c0..c1)
                .into_par_iter()
                .map(|c| {
                    let first = c * CHUNK;
                    let n = (numel - first).min(CHUNK) as usize;
                    let mut out = Vec::with_capacity(n * t.spec.dtype.size());
                    chunk_bytes(t, tseed, first, n, &mut out);
                    out
                })
                .collect();
            let mut written = 0;
            for b in &batch {
                w.write_all(b).map_err(io)?;
                written += b.len() as u64;
            }
            progress(written);
            c0 = c1;
        }
    }
    w.finish().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::super::tensors::Init;
    use super::*;
    use crate::checkpoint::safetensors::Dtype;

    fn t(name: &str, dtype: Dtype, n: u64) -> Tensor {
        Tensor {
            spec: TensorSpec {
                name: name.into(),
                dtype,
                shape: vec![n],
            },
            init: Init::Bytes,
        }
    }

    #[test]
    fn order_and_header_follow_the_release() {
        let spec = ShardSpec {
            tensors: vec![
                t("b.u8", Dtype::U8, 3),
                t("z.f32", Dtype::F32, 1),
                t("a.bf16", Dtype::Bf16, 2),
                t("a.u8", Dtype::U8, 1),
                t("experts.10.x", Dtype::U8, 1),
                t("experts.2.x", Dtype::U8, 1),
            ],
        };
        let p = plan("s".into(), spec).unwrap();
        let names: Vec<&str> = p.tensors.iter().map(|t| t.spec.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "z.f32",
                "a.bf16",
                "a.u8",
                "b.u8",
                "experts.10.x",
                "experts.2.x"
            ]
        );
        let n = u64::from_le_bytes(p.header[..8].try_into().unwrap()) as usize;
        assert_eq!(n % 8, 0);
        assert_eq!(p.header.len(), 8 + n);
        let json = std::str::from_utf8(&p.header[8..]).unwrap();
        assert!(json.starts_with(
            "{\"z.f32\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a.bf16\""
        ));
        let parsed: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(parsed["b.u8"]["data_offsets"], serde_json::json!([9, 12]));
        assert_eq!(p.data_len, 4 + 4 + 1 + 3 + 1 + 1);
    }
}
