//! What a pulled file is checked against: an LFS file's sha256 (the listing's `lfs.oid`, which
//! is also the `X-Linked-Etag` of its `resolve`), a small file's git blob id (sha1 of
//! `blob SIZE\0` followed by the bytes), and for both the size the listing gives. The sha256 of
//! every file is kept either way: it is what the `SHA256SUMS` manifest lists for `k3d verify`.

use super::hub::RemoteFile;
use k3_engine::checkpoint::manifest::hex;
use sha1::Sha1;
use sha2::{Digest as _, Sha256};
use std::io::Read;
use std::path::Path;

/// The digests of a file's bytes so far, fed as they arrive.
#[derive(Clone)]
pub struct Digest {
    sha256: Sha256,
    /// Only for files the listing gives no sha256 for.
    git: Option<Sha1>,
    len: u64,
}

/// A file whose bytes are not the ones the Hub lists.
#[derive(Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub what: &'static str,
    pub expected: String,
    pub actual: String,
}

impl Digest {
    /// Empty digests for `file` (the git header needs the size, which the listing gives).
    pub fn new(file: &RemoteFile) -> Digest {
        let git = file.lfs_sha256.is_none().then(|| {
            let mut h = Sha1::new();
            h.update(format!("blob {}\0", file.size).as_bytes());
            h
        });
        Digest {
            sha256: Sha256::new(),
            git,
            len: 0,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.sha256.update(bytes);
        if let Some(g) = &mut self.git {
            g.update(bytes);
        }
        self.len += bytes.len() as u64;
    }

    /// The digests of the first `len` bytes of the file at `path` (a partial file being
    /// resumed, or a complete one found without a record of its check).
    pub fn of_prefix(file: &RemoteFile, path: &Path, len: u64) -> std::io::Result<Digest> {
        let mut digest = Digest::new(file);
        let mut reader = std::fs::File::open(path)?.take(len);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            digest.update(&buf[..n]);
        }
        if digest.len != len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} ends at byte {} of {len}", path.display(), digest.len),
            ));
        }
        Ok(digest)
    }

    /// The file's sha256 if its size and digest are the ones listed for it.
    pub fn check(self, file: &RemoteFile) -> Result<[u8; 32], Mismatch> {
        if self.len != file.size {
            return Err(Mismatch {
                what: "size",
                expected: file.size.to_string(),
                actual: self.len.to_string(),
            });
        }
        let sha256: [u8; 32] = self.sha256.finalize().into();
        let (what, expected, actual) = match (&file.lfs_sha256, self.git) {
            (Some(expected), _) => ("sha256", expected.clone(), hex(&sha256)),
            (None, Some(git)) => {
                let oid: String = git.finalize().iter().map(|b| format!("{b:02x}")).collect();
                ("git blob id", file.git_oid.clone(), oid)
            }
            (None, None) => unreachable!("Digest::new keeps a git digest for non-LFS files"),
        };
        if expected == actual {
            Ok(sha256)
        } else {
            Err(Mismatch {
                what,
                expected,
                actual,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(bytes: &[u8], oid: &str) -> RemoteFile {
        RemoteFile {
            path: "config.json".into(),
            size: bytes.len() as u64,
            git_oid: oid.into(),
            lfs_sha256: None,
        }
    }

    #[test]
    fn git_blob_ids_are_gits() {
        // `printf 'hello\n' | git hash-object --stdin`
        let file = small(b"hello\n", "ce013625030ba8dba906f756967f9e9ca394464a");
        let mut d = Digest::new(&file);
        d.update(b"hel");
        d.update(b"lo\n");
        assert!(d.check(&file).is_ok());
        let mut d = Digest::new(&file);
        d.update(b"hellO\n");
        assert_eq!(d.check(&file).unwrap_err().what, "git blob id");
    }

    #[test]
    fn lfs_files_are_checked_by_sha256_and_size() {
        let file = RemoteFile {
            path: "m.safetensors".into(),
            size: 3,
            git_oid: "0".repeat(40),
            // `printf abc | sha256sum`
            lfs_sha256: Some(
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into(),
            ),
        };
        let mut d = Digest::new(&file);
        d.update(b"abc");
        assert!(d.check(&file).is_ok());
        let mut d = Digest::new(&file);
        d.update(b"ab");
        assert_eq!(d.check(&file).unwrap_err().what, "size");
        let mut d = Digest::new(&file);
        d.update(b"abd");
        assert_eq!(d.check(&file).unwrap_err().what, "sha256");
    }
}
