//! One file's bytes, into `NAME.k3d-partial` beside its final name: resumed from the bytes
//! already there (a `Range` request; a server that ignores it restarts the file), retried
//! through [`Backoff`], checked against the listing ([`super::checksum`]) and only then renamed
//! to `NAME`. A name without the suffix is therefore always a complete, checked file; a
//! mismatch deletes the copy and fetches it once more before failing, naming the file.

use super::checksum::Digest;
use super::display::Progress;
use super::error::PullError;
use super::hub::{Hub, RemoteFile, Subject, describe};
use super::retry::{self, Backoff, Stop, Transient};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_RANGE, LOCATION, RANGE};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The suffix of a file still being fetched (never a name the engine or `k3d verify` reads).
pub const PARTIAL_SUFFIX: &str = ".k3d-partial";

pub fn partial_path(final_path: &Path) -> PathBuf {
    let mut name = final_path.as_os_str().to_owned();
    name.push(PARTIAL_SUFFIX);
    PathBuf::from(name)
}

/// A failed send or body read: worth another attempt.
pub fn network(e: reqwest::Error) -> Stop {
    Stop::Again(Transient::Network(describe(&e)))
}

/// An `ETag`-style header without quotes or the weak marker.
fn etag(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    let v = headers.get(name)?.to_str().ok()?.trim();
    Some(
        v.trim_start_matches("W/")
            .trim_matches('"')
            .to_ascii_lowercase(),
    )
}

/// The first byte a 206 answer says it carries.
pub fn content_range_start(response: &reqwest::Response) -> Option<u64> {
    response
        .headers()
        .get(CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes "))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.parse::<u64>().ok())
}

/// What one file is fetched with.
pub struct Fetch<'a> {
    pub hub: &'a Hub,
    pub commit: &'a str,
    pub file: &'a RemoteFile,
    pub dir: &'a Path,
    pub progress: &'a Progress,
    /// Connections open at once, across files and pieces (`--jobs`).
    pub connections: &'a tokio::sync::Semaphore,
    /// Files larger than this are fetched in pieces of this size ([`super::pieces`]).
    pub piece: u64,
}

impl Fetch<'_> {
    /// Fetches the file and checks it, then renames it into place; returns its sha256.
    pub async fn run(&self) -> Result<[u8; 32], PullError> {
        let final_path = self.dir.join(&self.file.path);
        let part = partial_path(&final_path);
        if let Some(parent) = final_path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| PullError::write(parent, e))?;
        }
        let mut second = false;
        loop {
            let digest = if self.file.size > self.piece {
                self.download_pieces(&part, self.piece).await?
            } else {
                self.download(&part).await?
            };
            match digest.check(self.file) {
                Ok(sha256) => {
                    let out = std::fs::File::open(&part).map_err(|e| PullError::write(&part, e))?;
                    out.sync_all().map_err(|e| PullError::write(&part, e))?;
                    std::fs::rename(&part, &final_path)
                        .map_err(|e| PullError::write(&final_path, e))?;
                    return Ok(sha256);
                }
                Err(m) => {
                    std::fs::remove_file(&part).map_err(|e| PullError::write(&part, e))?;
                    super::pieces::forget(&part)?;
                    if second {
                        return Err(PullError::Corrupt {
                            file: self.file.path.clone(),
                            what: m.what,
                            expected: m.expected,
                            actual: m.actual,
                        });
                    }
                    self.progress.line(&format!(
                        "{}: {} mismatch (expected {}, got {}): deleted, fetching it once more",
                        self.file.path, m.what, m.expected, m.actual
                    ));
                    self.progress.refetch(self.file.size);
                    second = true;
                }
            }
        }
    }

    /// Brings the partial file to the listed size; returns the digests of all its bytes.
    async fn download(&self, part: &Path) -> Result<Digest, PullError> {
        let size = self.file.size;
        if super::pieces::forget(part)? {
            // Left by a run with a smaller --piece-mib: its bytes are not a prefix.
            match std::fs::remove_file(part) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(PullError::write(part, e));
                }
                _ => {}
            }
        }
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(part)
            .map_err(|e| PullError::write(part, e))?;
        let mut len = out.metadata().map_err(|e| PullError::write(part, e))?.len();
        if len > size {
            out.set_len(0).map_err(|e| PullError::write(part, e))?;
            len = 0;
        }
        let mut digest = {
            let (file, path) = (self.file.clone(), part.to_path_buf());
            tokio::task::spawn_blocking(move || Digest::of_prefix(&file, &path, len))
                .await
                .map_err(|e| PullError::Usage(format!("hashing task failed: {e}")))?
                .map_err(|e| PullError::write(part, e))?
        };
        let mut backoff = Backoff::new(&self.file.path);
        while len < size {
            let before = len;
            let outcome = async {
                let _permit = self.connections.acquire().await.expect("never closed");
                self.attempt(part, &mut out, &mut len, &mut digest).await
            }
            .await;
            backoff.settle(len > before, outcome, len, size).await?;
        }
        Ok(digest)
    }

    /// One request for the bytes from `len` on, appended to `out` as they arrive.
    async fn attempt(
        &self,
        part: &Path,
        out: &mut std::fs::File,
        len: &mut u64,
        digest: &mut Digest,
    ) -> Result<(), Stop> {
        let range = format!("bytes={len}-");
        let mut response = self.request(&range).await?;
        match response.status() {
            StatusCode::PARTIAL_CONTENT => {
                let start = content_range_start(&response);
                if start != Some(*len) {
                    return Err(Stop::Fatal(PullError::Protocol {
                        url: response.url().to_string(),
                        detail: format!("asked for {range}, got Content-Range {start:?}"),
                    }));
                }
            }
            StatusCode::OK => {
                // The server ignored the range: the bytes come from the start again.
                if *len > 0 {
                    out.set_len(0).map_err(|e| PullError::write(part, e))?;
                    *len = 0;
                    *digest = Digest::new(self.file);
                    self.progress.refetch(0);
                }
            }
            other => {
                return Err(Stop::Fatal(PullError::Protocol {
                    url: response.url().to_string(),
                    detail: format!("HTTP {other} for {range} of {}", self.file.path),
                }));
            }
        }
        while let Some(chunk) = response.chunk().await.map_err(network)? {
            // Bytes beyond the listed size cannot belong to the file: the digest check decides.
            let keep = chunk.len().min((self.file.size - *len) as usize);
            let bytes = &chunk[..keep];
            out.write_all(bytes)
                .map_err(|e| PullError::write(part, e))?;
            digest.update(bytes);
            *len += keep as u64;
            self.progress.add(keep as u64);
            if *len == self.file.size {
                break;
            }
        }
        Ok(())
    }

    /// A GET of `range` of the file from its `resolve` URL, following an LFS redirect to the
    /// CDN; refusals are fatal, 5xx/408/429 worth another attempt.
    pub async fn request(&self, range: &str) -> Result<reqwest::Response, Stop> {
        let resolve = self.hub.resolve_url(self.commit, &self.file.path);
        let response = self
            .hub
            .get(resolve.clone())
            .header(RANGE, range)
            .send()
            .await
            .map_err(network)?;
        self.again_on(&response)?;
        if let Some(e) = self
            .hub
            .refusal(Subject::File(self.commit, &self.file.path), &response)
        {
            return Err(Stop::Fatal(e));
        }
        if response.status().is_redirection() {
            return self.follow(&resolve, &response, range).await;
        }
        Ok(response)
    }

    /// A 5xx, 408 or 429 is tried again, after its `Retry-After`.
    fn again_on(&self, response: &reqwest::Response) -> Result<(), Stop> {
        let status = response.status().as_u16();
        if retry::transient_status(status) {
            return Err(Stop::Again(Transient::Status(
                status,
                retry::retry_after(response.headers()),
            )));
        }
        Ok(())
    }

    /// The redirect of an LFS file to its CDN: checked against the listing, then fetched (with
    /// the token only if it stays on the Hub's host).
    async fn follow(
        &self,
        resolve: &reqwest::Url,
        response: &reqwest::Response,
        range: &str,
    ) -> Result<reqwest::Response, Stop> {
        let headers = response.headers();
        if let (Some(linked), Some(listed)) = (
            etag(headers, "x-linked-etag"),
            self.file.lfs_sha256.as_ref(),
        ) && &linked != listed
        {
            return Err(Stop::Fatal(PullError::Protocol {
                url: resolve.to_string(),
                detail: format!(
                    "X-Linked-Etag {linked} differs from the listing's lfs.oid {listed} for {}",
                    self.file.path
                ),
            }));
        }
        let target = headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|l| resolve.join(l).ok())
            .ok_or_else(|| {
                Stop::Fatal(PullError::Protocol {
                    url: resolve.to_string(),
                    detail: format!("a {} without a usable Location", response.status()),
                })
            })?;
        let same_host = target.host_str() == resolve.host_str()
            && target.port_or_known_default() == resolve.port_or_known_default();
        let request = if same_host {
            self.hub.get(target)
        } else {
            self.hub.get_foreign(target)
        };
        let cdn = request.header(RANGE, range).send().await.map_err(network)?;
        self.again_on(&cdn)?;
        // A signed CDN URL that expired (403/410) is resolved anew by the next attempt.
        if matches!(cdn.status().as_u16(), 403 | 410) {
            return Err(Stop::Again(Transient::Status(cdn.status().as_u16(), None)));
        }
        Ok(cdn)
    }
}
