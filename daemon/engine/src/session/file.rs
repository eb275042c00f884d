//! The session file: what a session is on disk, written atomically and refused unless it is
//! whole, unmodified and made for the loaded model (engine-lessons §7).
//!
//! Layout, all integers little-endian:
//!
//! ```text
//! magic "K3SESSN\n"  8 bytes
//! version            u32   (FORMAT_VERSION)
//! header_len         u32
//! header             fingerprint (u16 len + UTF-8), name (u16 len + UTF-8),
//!                    owner (u8 0 = unknown | 1 + u32 uid), tokens u64, state_bytes u64
//! payload_len        u64
//! payload            u32 snapshot count; per snapshot: u64 n + n × u32 history ids,
//!                    u32 layer count; per layer u8 kind (0 KDA, 1 MLA) and its f32 arrays
//!                    (KDA: matrix, q/k/v conv histories; MLA: latent cache rows), each
//!                    u64 count + raw f32
//! sha256             32 bytes over everything before it
//! ```
//!
//! Loading checks, in order: magic, version, the header, the total length (a short file is
//! "truncated", a long one has trailing bytes), the checksum, the fingerprint, then decodes
//! the payload. Every refusal is a [`FileError`] naming the file and the field.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::dir::SessionDir;
use super::snapshot::Snapshot;
use crate::model::State;
use crate::model::kda::KdaState;
use crate::model::mla::MlaCache;
use crate::model::state::LayerState;

pub const MAGIC: &[u8; 8] = b"K3SESSN\n";
pub const FORMAT_VERSION: u32 = 1;
/// File name extension of session files.
pub const EXTENSION: &str = "k3s";
const CHECKSUM_LEN: u64 = 32;
/// Bytes before the header: magic, version, header_len.
const PREAMBLE_LEN: u64 = 16;
/// Largest header accepted (fingerprint and name are short).
const MAX_HEADER_LEN: u32 = 4096;

/// Why a session file was not written or not loaded.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("session file {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("session file {path}: field `magic`: not a k3 session file")]
    Magic { path: PathBuf },
    #[error(
        "session file {path}: field `version`: format version {found}, this k3d reads {supported}"
    )]
    Version {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error(
        "session file {path}: truncated in field `{field}`: needs {needed} bytes, {available} present"
    )]
    Truncated {
        path: PathBuf,
        field: &'static str,
        needed: u64,
        available: u64,
    },
    #[error(
        "session file {path}: field `sha256`: checksum mismatch (the file was modified or damaged)"
    )]
    Checksum { path: PathBuf },
    #[error(
        "session file {path}: field `fingerprint`: made for model {file}, the loaded model is {model}"
    )]
    Fingerprint {
        path: PathBuf,
        file: String,
        model: String,
    },
    #[error("session file {path}: field `{field}`: {detail}")]
    Field {
        path: PathBuf,
        field: &'static str,
        detail: String,
    },
    /// Only a file the daemon itself wrote (its uid owns it) is believed about its `owner`:
    /// anyone else's could name any uid.
    #[error(
        "session file {path}: owned by uid {file_uid}, not by the daemon's uid {daemon_uid}: \
         its `owner` field is not trusted"
    )]
    Untrusted {
        path: PathBuf,
        file_uid: u32,
        daemon_uid: u32,
    },
}

/// What a session file says about itself, readable without loading the states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHeader {
    pub fingerprint: String,
    pub name: String,
    pub owner: Option<u32>,
    /// Length of the longest snapshot history.
    pub tokens: u64,
    /// Bytes of state held by the snapshots.
    pub state_bytes: u64,
}

/// The stem of the file of `owner`'s session `name`: `1000@work` (`unknown@work` for a caller
/// the kernel did not name). Sessions are named per uid (issue 35 point 6: B's `work` is not
/// A's), and `@` is not allowed in a name, so the stem says whose session it is unambiguously.
pub fn stem(owner: Option<u32>, name: &str) -> String {
    match owner {
        Some(uid) => format!("{uid}@{name}"),
        None => format!("unknown@{name}"),
    }
}

/// What a file stem names ([`parse_stem`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stem<'a> {
    /// [`stem`]'s form: whose session and its name.
    Owned { owner: Option<u32>, name: &'a str },
    /// A bare name: a file an earlier k3d wrote, before names were per uid; its header says
    /// whose it is.
    Bare(&'a str),
}

/// The session a file stem names, if it names one.
pub fn parse_stem(stem: &str) -> Option<Stem<'_>> {
    let parsed = match stem.split_once('@') {
        Some(("unknown", name)) => Stem::Owned { owner: None, name },
        Some((uid, name)) if !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()) => {
            Stem::Owned {
                owner: Some(uid.parse().ok()?),
                name,
            }
        }
        Some(_) => return None,
        None => Stem::Bare(stem),
    };
    let (Stem::Owned { name, .. } | Stem::Bare(name)) = parsed;
    super::valid_name(name).then_some(parsed)
}

/// The file name of the file stem `stem`.
pub fn file_name(stem: &str) -> String {
    format!("{stem}.{EXTENSION}")
}

/// The file of `owner`'s session `name` in `dir`.
pub fn path_of(dir: &Path, owner: Option<u32>, name: &str) -> PathBuf {
    dir.join(file_name(&stem(owner, name)))
}

/// Whether `file_name` is a session save's temporary file ([`save_as`]), which only a save in
/// progress or one interrupted by a crash leaves behind.
pub fn is_temp_name(file_name: &str) -> bool {
    file_name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(&format!(".{EXTENSION}.tmp")))
        .and_then(parse_stem)
        .is_some()
}

// ---------------------------------------------------------------------------------------------
// Writing

/// Writes `snapshots` as session `header.name` of `header.owner` in `dir` (its [`stem`]'s
/// file) atomically ([`save_as`]). Returns the file size.
pub fn save(
    dir: &SessionDir,
    header: &FileHeader,
    snapshots: &[Snapshot],
) -> Result<u64, FileError> {
    let name = file_name(&stem(header.owner, &header.name));
    save_as(dir, &name, header, snapshots)
}

/// Writes `snapshots` with `header` as the file `name` of `dir` atomically: a new temporary
/// file `.NAME.tmp` in the same directory (mode 0600, created exclusively and never through a
/// symlink, see [`SessionDir::create_new`]), written, fsynced, renamed over the old file, then
/// the directory fsynced so the rename survives a crash. Returns the file size.
pub fn save_as(
    dir: &SessionDir,
    name: &str,
    header: &FileHeader,
    snapshots: &[Snapshot],
) -> Result<u64, FileError> {
    let tmp = format!(".{name}.tmp");
    let io = |file: &str| {
        let path = dir.path().join(file);
        move |error| FileError::Io { path, error }
    };
    let file = dir.create_new(&tmp).map_err(io(&tmp))?;
    let size = match write_all(file, header, snapshots) {
        Ok(size) => size,
        Err(error) => {
            // Best effort: a half-written temporary file is useless.
            let _ = dir.remove(&tmp);
            return Err(io(&tmp)(error));
        }
    };
    dir.rename(&tmp, name).map_err(io(name))?;
    dir.sync().map_err(|error| FileError::Io {
        path: dir.path().to_path_buf(),
        error,
    })?;
    Ok(size)
}

/// Hashes everything written through it.
struct Hashing<W: Write> {
    inner: W,
    hash: Sha256,
    written: u64,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash.update(bytes);
        self.written += bytes.len() as u64;
        self.inner.write_all(bytes)
    }

    fn floats(&mut self, values: &[f32]) -> std::io::Result<()> {
        self.put(&(values.len() as u64).to_le_bytes())?;
        // Chunked so the conversion buffer stays small for large caches.
        let mut buf = Vec::with_capacity(4 * 4096);
        for chunk in values.chunks(4096) {
            buf.clear();
            for v in chunk {
                buf.extend_from_slice(&v.to_le_bytes());
            }
            self.put(&buf)?;
        }
        Ok(())
    }
}

fn write_all(file: File, header: &FileHeader, snapshots: &[Snapshot]) -> std::io::Result<u64> {
    let mut w = Hashing {
        inner: BufWriter::with_capacity(1 << 20, file),
        hash: Sha256::new(),
        written: 0,
    };
    let head = encode_header(header)?;
    w.put(MAGIC)?;
    w.put(&FORMAT_VERSION.to_le_bytes())?;
    w.put(&(head.len() as u32).to_le_bytes())?;
    w.put(&head)?;
    w.put(&payload_len(snapshots).to_le_bytes())?;
    w.put(&(snapshots.len() as u32).to_le_bytes())?;
    for s in snapshots {
        w.put(&(s.history.len() as u64).to_le_bytes())?;
        let ids: Vec<u8> = s.history.iter().flat_map(|id| id.to_le_bytes()).collect();
        w.put(&ids)?;
        w.put(&(s.state.layers.len() as u32).to_le_bytes())?;
        for layer in &s.state.layers {
            match layer {
                LayerState::Kda(k) => {
                    w.put(&[0])?;
                    w.floats(&k.s)?;
                    for h in &k.history {
                        w.floats(h)?;
                    }
                }
                LayerState::Mla(m) => {
                    w.put(&[1])?;
                    w.floats(&m.rows)?;
                }
            }
        }
    }
    let digest = w.hash.clone().finalize();
    w.put(&digest)?;
    let size = w.written;
    let file = w.inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(size)
}

fn encode_header(h: &FileHeader) -> std::io::Result<Vec<u8>> {
    let too_long = || std::io::Error::other("fingerprint or name longer than 65535 bytes");
    let mut out = Vec::new();
    for s in [&h.fingerprint, &h.name] {
        let len = u16::try_from(s.len()).map_err(|_| too_long())?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    match h.owner {
        None => out.push(0),
        Some(uid) => {
            out.push(1);
            out.extend_from_slice(&uid.to_le_bytes());
        }
    }
    out.extend_from_slice(&h.tokens.to_le_bytes());
    out.extend_from_slice(&h.state_bytes.to_le_bytes());
    Ok(out)
}

/// The exact payload size `write_all` produces.
fn payload_len(snapshots: &[Snapshot]) -> u64 {
    let array = |n: usize| 8 + 4 * n as u64;
    4 + snapshots
        .iter()
        .map(|s| {
            8 + 4 * s.history.len() as u64
                + 4
                + s.state
                    .layers
                    .iter()
                    .map(|l| {
                        1 + match l {
                            LayerState::Kda(k) => {
                                array(k.s.len())
                                    + k.history.iter().map(|h| array(h.len())).sum::<u64>()
                            }
                            LayerState::Mla(m) => array(m.rows.len()),
                        }
                    })
                    .sum::<u64>()
        })
        .sum::<u64>()
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Reads fields from `r`, of which `remaining` bytes belong to the part being read; a field
/// that would run past them is reported as truncation of that field (and nothing is allocated
/// for it, so a damaged length cannot make us allocate more than the file holds).
struct Cursor<'p, R: Read> {
    path: &'p Path,
    r: R,
    remaining: u64,
}

impl<'p, R: Read> Cursor<'p, R> {
    fn take(&mut self, field: &'static str, n: u64) -> Result<Vec<u8>, FileError> {
        if n > self.remaining {
            return Err(FileError::Truncated {
                path: self.path.to_path_buf(),
                field,
                needed: n,
                available: self.remaining,
            });
        }
        let mut buf = vec![0u8; n as usize];
        self.r.read_exact(&mut buf).map_err(io_err(self.path))?;
        self.remaining -= n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], FileError> {
        let b = self.take(field, N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&b);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, FileError> {
        Ok(self.array::<1>(field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, FileError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, FileError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, FileError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn string(&mut self, field: &'static str) -> Result<String, FileError> {
        let n = self.u16(field)?;
        let b = self.take(field, u64::from(n))?;
        String::from_utf8(b).map_err(|_| FileError::Field {
            path: self.path.to_path_buf(),
            field,
            detail: "not UTF-8".into(),
        })
    }

    /// A `u64` count, then that many 4-byte little-endian words.
    fn words<T>(
        &mut self,
        field: &'static str,
        word: fn([u8; 4]) -> T,
    ) -> Result<Vec<T>, FileError> {
        let n = self.u64(field)?;
        let b = self.take(field, n.saturating_mul(4))?;
        Ok(b.chunks_exact(4)
            .map(|c| word([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn floats(&mut self, field: &'static str) -> Result<Vec<f32>, FileError> {
        self.words(field, f32::from_le_bytes)
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> FileError + '_ {
    move |error| FileError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Magic, version, header and payload length from the start of `file`, whose size is
/// `file_len`. Returns the header, the payload length and the payload's offset.
fn read_preamble(
    path: &Path,
    file: &mut File,
    file_len: u64,
) -> Result<(FileHeader, u64, u64), FileError> {
    let mut c = Cursor {
        path,
        r: BufReader::new(file),
        remaining: file_len,
    };
    if c.take("magic", 8)? != MAGIC {
        return Err(FileError::Magic {
            path: path.to_path_buf(),
        });
    }
    let version = c.u32("version")?;
    if version != FORMAT_VERSION {
        return Err(FileError::Version {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let header_len = c.u32("header_len")?;
    if header_len > MAX_HEADER_LEN {
        return Err(FileError::Field {
            path: path.to_path_buf(),
            field: "header_len",
            detail: format!("{header_len} bytes (at most {MAX_HEADER_LEN})"),
        });
    }
    let fingerprint = c.string("fingerprint")?;
    let name = c.string("name")?;
    let owner = match c.u8("owner")? {
        0 => None,
        1 => Some(c.u32("owner")?),
        other => {
            return Err(FileError::Field {
                path: path.to_path_buf(),
                field: "owner",
                detail: format!("tag {other} (0 or 1 expected)"),
            });
        }
    };
    let tokens = c.u64("tokens")?;
    let state_bytes = c.u64("state_bytes")?;
    let used = file_len - c.remaining - PREAMBLE_LEN;
    if used != u64::from(header_len) {
        return Err(FileError::Field {
            path: path.to_path_buf(),
            field: "header_len",
            detail: format!("says {header_len} bytes, the fields take {used}"),
        });
    }
    let payload_len = c.u64("payload_len")?;
    let header = FileHeader {
        fingerprint,
        name,
        owner,
        tokens,
        state_bytes,
    };
    Ok((header, payload_len, file_len - c.remaining))
}

fn open(path: &Path) -> Result<File, FileError> {
    crate::input_file::open(path).map_err(io_err(path))
}

fn len_of(path: &Path, file: &File) -> Result<u64, FileError> {
    Ok(file.metadata().map_err(io_err(path))?.len())
}

/// Reads only the header of the file at `path` (see [`read_header_from`]).
pub fn read_header(path: &Path) -> Result<FileHeader, FileError> {
    read_header_from(path, &mut open(path)?)
}

/// Reads only the header (for listing) of `file`, opened from `path` (named in errors):
/// magic, version and header fields are checked, the rest is not (loading checks it).
pub fn read_header_from(path: &Path, file: &mut File) -> Result<FileHeader, FileError> {
    let len = len_of(path, file)?;
    Ok(read_preamble(path, file, len)?.0)
}

/// Loads and verifies the session file at `path` (see [`load_from`]).
pub fn load(path: &Path, fingerprint: &str) -> Result<(FileHeader, Vec<Snapshot>), FileError> {
    load_from(path, open(path)?, fingerprint)
}

/// Loads and verifies session file `file`, opened from `path` (named in errors), for the model
/// with `fingerprint`. Nothing from a file that fails any check is returned. Two streaming
/// passes (checksum, then decoding), so the memory needed is the snapshots' own, not the
/// file's on top.
pub fn load_from(
    path: &Path,
    mut file: File,
    fingerprint: &str,
) -> Result<(FileHeader, Vec<Snapshot>), FileError> {
    let len = len_of(path, &file)?;
    let (header, payload_len, payload_at) = read_preamble(path, &mut file, len)?;
    let needed = payload_len.saturating_add(CHECKSUM_LEN);
    let available = len - payload_at;
    if available < needed {
        return Err(FileError::Truncated {
            path: path.to_path_buf(),
            field: "payload",
            needed,
            available,
        });
    }
    if available > needed {
        return Err(FileError::Field {
            path: path.to_path_buf(),
            field: "payload_len",
            detail: format!("{} bytes follow the checksum", available - needed),
        });
    }
    let body = len - CHECKSUM_LEN;
    file.seek(SeekFrom::Start(0)).map_err(io_err(path))?;
    let mut hash = Sha256::new();
    let mut reader = BufReader::with_capacity(1 << 20, &mut file);
    std::io::copy(&mut (&mut reader).take(body), &mut hash).map_err(io_err(path))?;
    let mut stored = [0u8; CHECKSUM_LEN as usize];
    reader.read_exact(&mut stored).map_err(io_err(path))?;
    if hash.finalize().as_slice() != stored {
        return Err(FileError::Checksum {
            path: path.to_path_buf(),
        });
    }
    if header.fingerprint != fingerprint {
        return Err(FileError::Fingerprint {
            path: path.to_path_buf(),
            file: header.fingerprint,
            model: fingerprint.to_string(),
        });
    }
    file.seek(SeekFrom::Start(payload_at))
        .map_err(io_err(path))?;
    let mut p = Cursor {
        path,
        r: BufReader::with_capacity(1 << 20, &mut file),
        remaining: payload_len,
    };
    let count = p.u32("snapshots")?;
    let mut snapshots = Vec::new();
    for _ in 0..count {
        let history = p.words("history", u32::from_le_bytes)?;
        let layer_count = p.u32("layers")?;
        let mut layers = Vec::new();
        for _ in 0..layer_count {
            layers.push(match p.u8("layer kind")? {
                0 => LayerState::Kda(KdaState {
                    s: p.floats("kda state")?,
                    history: [
                        p.floats("kda conv history")?,
                        p.floats("kda conv history")?,
                        p.floats("kda conv history")?,
                    ],
                    journal: None,
                }),
                1 => LayerState::Mla(MlaCache {
                    rows: p.floats("mla cache")?,
                }),
                other => {
                    return Err(FileError::Field {
                        path: path.to_path_buf(),
                        field: "layer kind",
                        detail: format!("{other} (0 = KDA, 1 = MLA)"),
                    });
                }
            });
        }
        let positions = history.len();
        snapshots.push(Snapshot {
            history,
            state: State {
                layers,
                positions,
                poisoned: false,
                speculation: None,
            },
        });
    }
    if p.remaining != 0 {
        return Err(FileError::Field {
            path: path.to_path_buf(),
            field: "payload_len",
            detail: format!("{} payload bytes left after the last snapshot", p.remaining),
        });
    }
    Ok((header, snapshots))
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::tests::{scratch, snap};
    use super::*;

    #[test]
    fn a_file_stem_says_whose_session_it_is() {
        assert_eq!(stem(Some(1000), "work"), "1000@work");
        assert_eq!(stem(None, "work"), "unknown@work");
        let owned = |owner, name| Some(Stem::Owned { owner, name });
        assert_eq!(parse_stem("1000@work"), owned(Some(1000), "work"));
        assert_eq!(parse_stem("unknown@a.b-c"), owned(None, "a.b-c"));
        assert_eq!(parse_stem("work"), Some(Stem::Bare("work")));
        for bad in [
            "x@work",
            "@work",
            "1000@",
            "1000@.hidden",
            "99999999999@w",
            "a@b@c",
            ".w",
        ] {
            assert_eq!(parse_stem(bad), None, "{bad}");
        }
        assert!(is_temp_name(".1000@work.k3s.tmp") && is_temp_name(".work.k3s.tmp"));
        assert!(!is_temp_name("1000@work.k3s") && !is_temp_name(".x@w.k3s.tmp"));
    }

    fn header(name: &str) -> FileHeader {
        FileHeader {
            fingerprint: "abc123".into(),
            name: name.into(),
            owner: Some(1234),
            tokens: 5,
            state_bytes: 99,
        }
    }

    fn written(tag: &str) -> (tempfile::TempDir, PathBuf, Vec<Snapshot>) {
        let dir = scratch(&format!("file-{tag}"));
        let snaps = vec![snap(&[1, 2, 3]), snap(&[1, 2, 3, 4, 5])];
        let size = save(
            &SessionDir::open(dir.path()).unwrap(),
            &header("s1"),
            &snaps,
        )
        .unwrap();
        let path = path_of(dir.path(), Some(1234), "s1");
        assert!(path.ends_with("1234@s1.k3s"), "{}", path.display());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        (dir, path, snaps)
    }

    #[test]
    fn round_trip_mode_and_header() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, path, snaps) = written("round");
        let (h, back) = load(&path, "abc123").unwrap();
        assert_eq!(h, header("s1"));
        assert_eq!(back, snaps);
        assert_eq!(read_header(&path).unwrap(), header("s1"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn refuses_other_model() {
        let (_dir, path, _) = written("fp");
        match load(&path, "other") {
            Err(FileError::Fingerprint { file, model, .. }) => {
                assert_eq!((file.as_str(), model.as_str()), ("abc123", "other"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refuses_flipped_byte_anywhere_in_payload() {
        let (_dir, path, _) = written("flip");
        let good = std::fs::read(&path).unwrap();
        // Every byte after the header: a flip is always caught (checksum, or the length check
        // when it hits payload_len).
        let at = {
            let mut f = open(&path).unwrap();
            let len = len_of(&path, &f).unwrap();
            read_preamble(&path, &mut f, len).unwrap().2 - 8
        };
        for i in at as usize..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let e = load(&path, "abc123").unwrap_err();
            assert!(
                matches!(
                    e,
                    FileError::Checksum { .. }
                        | FileError::Truncated { .. }
                        | FileError::Field { .. }
                ),
                "byte {i}: {e:?}"
            );
            assert!(e.to_string().contains(&path.display().to_string()));
        }
        let mut bad = good.clone();
        bad[at as usize + 20] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(
            load(&path, "abc123"),
            Err(FileError::Checksum { .. })
        ));
    }

    #[test]
    fn refuses_truncation_magic_version_trailing() {
        let (_dir, path, _) = written("trunc");
        let good = std::fs::read(&path).unwrap();
        for cut in [0, 5, 12, 20, 40, good.len() - 1] {
            std::fs::write(&path, &good[..cut]).unwrap();
            let e = load(&path, "abc123").unwrap_err();
            assert!(matches!(e, FileError::Truncated { .. }), "cut {cut}: {e:?}");
        }
        let mut bad = good.clone();
        bad[0] = b'X';
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(
            load(&path, "abc123"),
            Err(FileError::Magic { .. })
        ));
        let mut bad = good.clone();
        bad[8] = 9;
        std::fs::write(&path, &bad).unwrap();
        match load(&path, "abc123") {
            Err(FileError::Version {
                found: 9,
                supported: 1,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let mut bad = good.clone();
        bad.push(0);
        std::fs::write(&path, &bad).unwrap();
        match load(&path, "abc123") {
            Err(FileError::Field {
                field: "payload_len",
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}
