//! Reading byte runs of the shards with `O_DIRECT` through 4096-aligned windows
//! (engine-lessons §2.1, §2.3; rust-stack.md §5).
//!
//! A run (`ByteRun`: shard, absolute offset, length) is usually not aligned: the safetensors
//! header has arbitrary length. So the read covers the aligned window
//! `[off & !4095, round_up(off + len, 4096))` and the payload sits at `pad = off − window start`
//! inside the buffer. At end of file a short read is accepted only if it covers the payload.
//!
//! Where a filesystem refuses `O_DIRECT` the shard is read buffered, and that is loud: a warning
//! on stderr at open and a queryable [`ReadMode`] per shard ([`ShardSet::read_mode`]), because a
//! run that claims direct reads while going through the page cache is a known trap
//! (engine-lessons §2.1).

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::direct_buffer::{ALIGN, AlignedBuf, round_up};
use crate::checkpoint::layout::ByteRun;

/// Largest single `pread`: macOS fails above `INT_MAX` bytes (engine-lessons §2.4), so every
/// platform clamps to 1 GiB and loops.
pub const MAX_SINGLE_READ: usize = 1 << 30;
pub use crate::plan::buffers::{MAX_CHUNK, MIN_CHUNK};

/// How a shard is actually being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadMode {
    /// `O_DIRECT`: no page cache, no second copy charged to the daemon's cgroup.
    Direct,
    /// Through the page cache, with the reason (filesystem refused `O_DIRECT`, or asked for).
    Buffered { reason: String },
}

/// Whether to try `O_DIRECT` at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectPolicy {
    /// Use `O_DIRECT`; fall back to buffered (loudly) where the filesystem refuses it.
    Prefer,
    /// Buffered on purpose (warm-cache experiments, filesystems known to refuse).
    Off,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("shard index {shard} out of range: {count} shards are open")]
    NoSuchShard { shard: usize, count: usize },
    #[error("cannot open {path}: {error} (errno {errno})")]
    Open {
        path: PathBuf,
        errno: i32,
        error: io::Error,
    },
    #[error("reading {path}: {len} bytes at offset {offset}: {error} (errno {errno})")]
    Io {
        path: PathBuf,
        offset: u64,
        len: usize,
        errno: i32,
        error: io::Error,
    },
    #[error(
        "reading {path}: {len} bytes at offset {offset}: end of file after {got} bytes, \
         {required} needed to cover the payload"
    )]
    ShortRead {
        path: PathBuf,
        offset: u64,
        len: usize,
        got: usize,
        required: usize,
    },
    #[error(
        "run of shard {shard} at offset {offset}, length {len}: its aligned window needs \
         {needed} bytes, the buffer has {capacity}"
    )]
    BufferTooSmall {
        shard: usize,
        offset: u64,
        len: u64,
        needed: u64,
        capacity: usize,
    },
    #[error("run of shard {shard} at offset {offset}, length {len} overflows the address space")]
    RunOverflow { shard: usize, offset: u64, len: u64 },
    #[error(
        "read of shard {shard} at offset {offset}, length {len} cancelled: its batch was dropped"
    )]
    Cancelled { shard: usize, offset: u64, len: u64 },
    #[error(
        "read of shard {shard} at offset {offset}, length {len}: buffer still lent out after \
         every request completed (internal error)"
    )]
    BufferLost { shard: usize, offset: u64, len: u64 },
    #[error("chunk size {chunk} must be a multiple of 4096 between {MIN_CHUNK} and {MAX_CHUNK}")]
    BadChunk { chunk: usize },
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// The aligned window that covers a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First file byte read (a multiple of 4096).
    pub start: u64,
    /// Bytes read (a multiple of 4096).
    pub len: usize,
    /// Offset of the payload inside the window.
    pub pad: usize,
    /// The run's length.
    pub payload_len: usize,
}

impl Window {
    pub fn of(run: ByteRun) -> Result<Self, ReadError> {
        let overflow = ReadError::RunOverflow {
            shard: run.shard,
            offset: run.offset,
            len: run.len,
        };
        let start = run.offset & !(ALIGN as u64 - 1);
        let end = run.offset.checked_add(run.len).and_then(round_up);
        let (Some(end), Ok(payload_len)) = (end, usize::try_from(run.len)) else {
            return Err(overflow);
        };
        let Ok(len) = usize::try_from(end - start) else {
            return Err(overflow);
        };
        Ok(Self {
            start,
            len,
            pad: (run.offset - start) as usize,
            payload_len,
        })
    }

    /// Buffer bytes that hold the window of *any* run of `len` bytes, whatever its offset
    /// ([`crate::plan::buffers::window_capacity`], which the plan prices).
    pub fn capacity_for(len: u64) -> Option<u64> {
        crate::plan::buffers::window_capacity(len)
    }

    /// The window's requests of at most `chunk` bytes, in file order. Each names the bytes it
    /// must get before end of file still leaves the payload covered.
    pub fn chunks(&self, chunk: usize) -> Result<Vec<Chunk>, ReadError> {
        check_chunk(chunk)?;
        let payload_end = self.pad + self.payload_len;
        let mut out = Vec::with_capacity(self.len.div_ceil(chunk));
        let mut at = 0;
        while at < self.len {
            let len = chunk.min(self.len - at);
            out.push(Chunk {
                file_offset: self.start + at as u64,
                buf_start: at,
                len,
                required: payload_end.saturating_sub(at).min(len),
            });
            at += len;
        }
        Ok(out)
    }
}

/// Refuse a request size outside 8–64 MiB or not a multiple of 4096.
pub fn check_chunk(chunk: usize) -> Result<(), ReadError> {
    if (MIN_CHUNK..=MAX_CHUNK).contains(&chunk) && chunk.is_multiple_of(ALIGN) {
        Ok(())
    } else {
        Err(ReadError::BadChunk { chunk })
    }
}

/// One request: `len` bytes at `file_offset` into the buffer at `buf_start`; the first
/// `required` bytes must arrive (the rest may lie beyond end of file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub file_offset: u64,
    pub buf_start: usize,
    pub len: usize,
    pub required: usize,
}

/// A run that was read completely: its window in an aligned buffer.
#[derive(Debug)]
pub struct LoadedRun {
    buf: AlignedBuf,
    pad: usize,
    len: usize,
}

impl LoadedRun {
    /// Only constructed after every byte of the payload arrived.
    pub(crate) fn new(buf: AlignedBuf, window: &Window) -> Self {
        Self {
            buf,
            pad: window.pad,
            len: window.payload_len,
        }
    }

    /// The run's bytes.
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_slice()[self.pad..self.pad + self.len]
    }

    /// The buffer, for reuse.
    pub fn into_buffer(self) -> AlignedBuf {
        self.buf
    }
}

/// A failed read: the error, and the buffer back for reuse (its contents are not data).
#[derive(Debug)]
pub struct ReadFailure {
    pub error: ReadError,
    pub buf: Option<AlignedBuf>,
}

/// One open shard file.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    file: File,
    mode: ReadMode,
}

impl Shard {
    pub fn open(path: &Path, policy: DirectPolicy) -> Result<Self, ReadError> {
        let open_err = |error: io::Error| ReadError::Open {
            path: path.to_path_buf(),
            errno: errno_of(&error),
            error,
        };
        let buffered = |reason: String| -> Result<Self, ReadError> {
            let file = File::open(path).map_err(open_err)?;
            Ok(Self {
                path: path.to_path_buf(),
                file,
                mode: ReadMode::Buffered { reason },
            })
        };
        if policy == DirectPolicy::Off {
            return buffered("direct I/O turned off by configuration".into());
        }
        let Some(flag) = direct_flag() else {
            return buffered("O_DIRECT does not exist on this operating system".into());
        };
        use std::os::unix::fs::OpenOptionsExt;
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flag)
            .open(path)
        {
            Ok(f) => f,
            Err(e) => match refusal(&e) {
                Some(reason) => return warn_buffered(path, buffered(reason)),
                None => return Err(open_err(e)),
            },
        };
        // Some filesystems accept the flag at open and refuse the reads: probe one page.
        let mut probe = AlignedBuf::zeroed(ALIGN)
            .map_err(|_| open_err(io::Error::new(io::ErrorKind::OutOfMemory, "probe buffer")))?;
        loop {
            match file.read_at(probe.as_mut_slice(), 0) {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => match refusal(&e) {
                    Some(reason) => return warn_buffered(path, buffered(reason)),
                    None => return Err(open_err(e)),
                },
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            mode: ReadMode::Direct,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn mode(&self) -> &ReadMode {
        &self.mode
    }

    /// Read `dst.len()` bytes at `offset` (both 4096-aligned on the direct path), retrying
    /// `EINTR` and short reads, at most [`MAX_SINGLE_READ`] per `pread`. End of file is an error
    /// unless at least `required` bytes arrived.
    pub fn read_chunk(
        &self,
        offset: u64,
        dst: &mut [u8],
        required: usize,
    ) -> Result<(), ReadError> {
        let mut got = 0;
        while got < dst.len() {
            let n = (dst.len() - got).min(MAX_SINGLE_READ);
            match self
                .file
                .read_at(&mut dst[got..got + n], offset + got as u64)
            {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(self.io_error(offset, dst.len(), error)),
            }
        }
        if got < required {
            return Err(self.short_read(offset, dst.len(), got, required));
        }
        Ok(())
    }

    fn io_error(&self, offset: u64, len: usize, error: io::Error) -> ReadError {
        ReadError::Io {
            path: self.path.clone(),
            offset,
            len,
            errno: errno_of(&error),
            error,
        }
    }

    fn short_read(&self, offset: u64, len: usize, got: usize, required: usize) -> ReadError {
        ReadError::ShortRead {
            path: self.path.clone(),
            offset,
            len,
            got,
            required,
        }
    }

    /// [`Self::read_chunk`] failing as `kind` (feature `fault-injection`): `EIO` before any
    /// byte, or end of file after half the required bytes (whole pages, really read).
    #[cfg(feature = "fault-injection")]
    fn read_failing(
        &self,
        kind: super::fault::FaultKind,
        offset: u64,
        dst: &mut [u8],
        required: usize,
    ) -> Result<(), ReadError> {
        use super::fault::FaultKind;
        match kind {
            FaultKind::Eio => {
                Err(self.io_error(offset, dst.len(), io::Error::from_raw_os_error(libc::EIO)))
            }
            FaultKind::Short => {
                let got = (required.min(dst.len()) / 2) & !(ALIGN - 1);
                self.read_chunk(offset, &mut dst[..got], got)?;
                Err(self.short_read(offset, dst.len(), got, required))
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn direct_flag() -> Option<i32> {
    Some(libc::O_DIRECT)
}

#[cfg(not(target_os = "linux"))]
fn direct_flag() -> Option<i32> {
    None
}

/// `EINVAL` on open or on an aligned read is how Linux filesystems refuse `O_DIRECT`
/// (rust-stack.md §5); every other error is real.
pub fn refusal(e: &io::Error) -> Option<String> {
    (e.raw_os_error() == Some(libc::EINVAL))
        .then(|| format!("the filesystem refused O_DIRECT ({e})"))
}

fn warn_buffered(path: &Path, shard: Result<Shard, ReadError>) -> Result<Shard, ReadError> {
    if let Ok(Shard {
        mode: ReadMode::Buffered { reason },
        ..
    }) = &shard
    {
        eprintln!(
            "k3d: warning: {}: {reason}; reading it BUFFERED through the page cache",
            path.display()
        );
    }
    shard
}

/// All shards of a checkpoint, indexed as in `ByteRun::shard`.
#[derive(Debug)]
pub struct ShardSet {
    shards: Vec<Shard>,
    /// Reads a test made to fail (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    faults: Option<&'static super::fault::Faults>,
}

impl ShardSet {
    pub fn open(paths: &[PathBuf], policy: DirectPolicy) -> Result<Self, ReadError> {
        let shards = paths
            .iter()
            .map(|p| Shard::open(p, policy))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            shards,
            #[cfg(feature = "fault-injection")]
            faults: None,
        })
    }

    /// The same shards, failing the reads `faults` is armed for.
    #[cfg(feature = "fault-injection")]
    pub fn with_faults(self, faults: Option<&'static super::fault::Faults>) -> Self {
        Self { faults, ..self }
    }

    /// Request `c` of the read of `run` into `dst`: every weight read goes through here.
    pub fn read_chunk(&self, run: ByteRun, c: &Chunk, dst: &mut [u8]) -> Result<(), ReadError> {
        let shard = self.shard(run.shard)?;
        #[cfg(feature = "fault-injection")]
        if let Some(kind) = self.faults.and_then(|f| f.hit(run)) {
            return shard.read_failing(kind, c.file_offset, dst, c.required);
        }
        shard.read_chunk(c.file_offset, dst, c.required)
    }

    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    pub fn shard(&self, shard: usize) -> Result<&Shard, ReadError> {
        self.shards.get(shard).ok_or(ReadError::NoSuchShard {
            shard,
            count: self.shards.len(),
        })
    }

    /// The read mode in effect over all shards, for logs and status.
    pub fn read_mode(&self) -> ReadModeSummary<'_> {
        ReadModeSummary { set: self }
    }

    /// Check that `buf` can hold the window of `run` and return the window.
    pub fn window_for(&self, run: ByteRun, buf: &AlignedBuf) -> Result<Window, ReadError> {
        self.shard(run.shard)?;
        let w = Window::of(run)?;
        if w.len > buf.capacity() {
            return Err(ReadError::BufferTooSmall {
                shard: run.shard,
                offset: run.offset,
                len: run.len,
                needed: w.len as u64,
                capacity: buf.capacity(),
            });
        }
        Ok(w)
    }

    /// Read one run on the calling thread, in requests of `chunk` bytes. The reader pool
    /// (`store::reader`) does the same with several threads.
    pub fn read_run(
        &self,
        run: ByteRun,
        mut buf: AlignedBuf,
        chunk: usize,
    ) -> Result<LoadedRun, ReadFailure> {
        let result = (|| {
            let w = self.window_for(run, &buf)?;
            for c in w.chunks(chunk)? {
                let dst = &mut buf.as_mut_slice()[c.buf_start..c.buf_start + c.len];
                self.read_chunk(run, &c, dst)?;
            }
            Ok(w)
        })();
        match result {
            Ok(w) => Ok(LoadedRun::new(buf, &w)),
            Err(error) => Err(ReadFailure {
                error,
                buf: Some(buf),
            }),
        }
    }
}

/// Displays "direct (N shards)" or names every buffered shard and why.
pub struct ReadModeSummary<'a> {
    set: &'a ShardSet,
}

impl ReadModeSummary<'_> {
    /// True if every shard is read with `O_DIRECT`.
    pub fn all_direct(&self) -> bool {
        self.set.shards.iter().all(|s| s.mode == ReadMode::Direct)
    }
}

impl fmt::Display for ReadModeSummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.set.shards.len();
        let buffered: Vec<_> = self
            .set
            .shards
            .iter()
            .filter_map(|s| match &s.mode {
                ReadMode::Buffered { reason } => Some((s.path.display(), reason)),
                ReadMode::Direct => None,
            })
            .collect();
        if buffered.is_empty() {
            return write!(f, "direct (O_DIRECT) for all {n} shards");
        }
        write!(f, "BUFFERED for {} of {n} shards", buffered.len())?;
        for (p, r) in buffered {
            write!(f, "; {p}: {r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_of_unaligned_run() {
        let w = Window::of(ByteRun {
            shard: 0,
            offset: 5000,
            len: 17_547_264,
        })
        .unwrap();
        assert_eq!(w.start, 4096);
        assert_eq!(w.pad, 904);
        assert_eq!(w.len, 17_547_264 + 4096);
        assert_eq!(Window::capacity_for(17_547_264), Some(17_551_360));
        let aligned = Window::of(ByteRun {
            shard: 0,
            offset: 8192,
            len: 4096,
        })
        .unwrap();
        assert_eq!((aligned.start, aligned.len, aligned.pad), (8192, 4096, 0));
    }

    #[test]
    fn window_overflow_is_an_error() {
        let e = Window::of(ByteRun {
            shard: 3,
            offset: u64::MAX - 10,
            len: 100,
        });
        assert!(matches!(e, Err(ReadError::RunOverflow { shard: 3, .. })));
    }

    #[test]
    fn chunks_tile_window_and_require_only_payload() {
        let w = Window::of(ByteRun {
            shard: 0,
            offset: 100,
            len: (20 << 20) - 200,
        })
        .unwrap();
        let cs = w.chunks(MIN_CHUNK).unwrap();
        assert_eq!(cs.len(), 3);
        assert_eq!(cs.iter().map(|c| c.len).sum::<usize>(), w.len);
        assert!(
            cs.windows(2)
                .all(|p| p[0].buf_start + p[0].len == p[1].buf_start)
        );
        assert_eq!(cs[0].required, MIN_CHUNK);
        // Payload ends 100 bytes before the 20 MiB window end.
        assert_eq!(cs[2].required, cs[2].len - 100);
        assert!(w.chunks(MIN_CHUNK - ALIGN).is_err());
        assert!(w.chunks(MAX_CHUNK + ALIGN).is_err());
        assert!(w.chunks(MIN_CHUNK + 1).is_err());
    }

    #[test]
    fn einval_is_a_refusal_other_errors_are_not() {
        assert!(refusal(&io::Error::from_raw_os_error(libc::EINVAL)).is_some());
        assert!(refusal(&io::Error::from_raw_os_error(libc::EIO)).is_none());
    }
}
