//! The Hub's HTTP API, as `huggingface_hub` uses it: a revision resolved to its commit
//! (`GET /api/models/REPO/revision/REV`, field `sha`), the files at that commit
//! (`GET /api/models/REPO/tree/COMMIT?recursive=true`, paged by `Link: rel="next"`, each file with
//! its git blob `oid`, `size` and, for LFS files, `lfs.oid` = sha256), and a file's bytes
//! (`/REPO/resolve/COMMIT/PATH`: small files directly, LFS files by a redirect to a CDN on
//! another host, which is sent no token). Refusals become [`PullError`]s naming the repo,
//! revision or file, read from the Hub's `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`,
//! `EntryNotFound`, `GatedRepo`).

use super::auth::Token;
use super::error::PullError;
use super::retry::{self, Backoff, Transient};
use reqwest::header::{AUTHORIZATION, HeaderMap, LINK};
use reqwest::{Client, Response, Url};
use std::time::Duration;

/// One file of the repository at the pulled commit, as the tree listing gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    pub path: String,
    pub size: u64,
    /// The git blob id (sha1 of `blob SIZE\0` + bytes): what a small file is checked against.
    pub git_oid: String,
    /// sha256 of the bytes, for files stored in LFS.
    pub lfs_sha256: Option<String>,
}

/// What a request was for, to name it when the Hub refuses.
pub enum Subject<'a> {
    Revision(&'a str),
    Listing(&'a str),
    File(&'a str, &'a str),
}

pub struct Hub {
    client: Client,
    pub endpoint: String,
    pub repo: String,
    token: Option<Token>,
}

/// Shapes of the tree listing (fields the Hub sends beyond these are ignored).
#[derive(serde::Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    oid: String,
    #[serde(default)]
    size: u64,
    lfs: Option<LfsEntry>,
}

#[derive(serde::Deserialize)]
struct LfsEntry {
    oid: String,
    size: u64,
}

#[derive(serde::Deserialize)]
struct RevisionInfo {
    sha: Option<String>,
}

/// A commit id as the Hub writes it: 40 lower-case hex digits.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Hub {
    /// A client for `repo` (`owner/name`) at `endpoint`. Redirects are not followed: the CDN
    /// URL is fetched separately, without the token.
    pub fn new(endpoint: &str, repo: &str, token: Option<Token>) -> Result<Hub, PullError> {
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2
            || parts
                .iter()
                .any(|p| p.is_empty() || *p == "." || *p == "..")
        {
            return Err(PullError::Usage(format!(
                "{repo:?} is not a repository id: expected OWNER/NAME (e.g. moonshotai/Kimi-K3)"
            )));
        }
        Url::parse(endpoint)
            .map_err(|e| PullError::Usage(format!("HF_ENDPOINT {endpoint:?} is not a URL: {e}")))?;
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(30))
            // A connection that delivers nothing for a minute is dropped and retried.
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("k3d/", env!("CARGO_PKG_VERSION"), "; pull"))
            .build()
            .map_err(|e| PullError::Usage(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Hub {
            client,
            endpoint: endpoint.to_string(),
            repo: repo.to_string(),
            token,
        })
    }

    /// `endpoint` + each of `segments`, each percent-encoded as one path segment.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = Url::parse(&self.endpoint).expect("checked in Hub::new");
        url.path_segments_mut()
            .expect("an http(s) endpoint has a path")
            .pop_if_empty()
            .extend(segments);
        url
    }

    /// A GET to the Hub itself, with the token (never to the CDN).
    pub fn get(&self, url: Url) -> reqwest::RequestBuilder {
        let req = self.client.get(url);
        match &self.token {
            Some(t) => req.header(AUTHORIZATION, format!("Bearer {}", t.secret)),
            None => req,
        }
    }

    /// A GET to another host (the CDN a redirect named): no token.
    pub fn get_foreign(&self, url: Url) -> reqwest::RequestBuilder {
        self.client.get(url)
    }

    /// `/REPO/resolve/COMMIT/PATH`.
    pub fn resolve_url(&self, commit: &str, path: &str) -> Url {
        let (owner, name) = self.repo.split_once('/').expect("checked in Hub::new");
        let mut segments = vec![owner, name, "resolve", commit];
        segments.extend(path.split('/'));
        self.url(&segments)
    }

    /// Sends `req`, retrying transient failures; returns the first answer that is not one.
    pub async fn send(
        &self,
        what: &str,
        make: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<Response, PullError> {
        let mut backoff = Backoff::new(what);
        loop {
            let cause = match make().send().await {
                Ok(r) if retry::transient_status(r.status().as_u16()) => {
                    Transient::Status(r.status().as_u16(), retry::retry_after(r.headers()))
                }
                Ok(r) => return Ok(r),
                Err(e) => Transient::Network(describe(&e)),
            };
            backoff.failed(cause).await?;
        }
    }

    /// The error for a 4xx answer about `subject` (`None` when `response` is a success or a
    /// redirect).
    pub fn refusal(&self, subject: Subject<'_>, response: &Response) -> Option<PullError> {
        let status = response.status().as_u16();
        if status < 400 {
            return None;
        }
        let headers = response.headers();
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let code = header("x-error-code");
        let message = header("x-error-message");
        let detail = if message.is_empty() {
            String::new()
        } else {
            format!(": {message}")
        };
        let repo = &self.repo;
        // The Hub answers 401 for a repository it will not admit exists (RepoNotFound).
        let status = if code == "RepoNotFound" { 404 } else { status };
        Some(match status {
            401 | 403 => PullError::Refused {
                endpoint: self.endpoint.clone(),
                repo: repo.clone(),
                status,
                why: format!(
                    "{}{detail}",
                    if code == "GatedRepo" {
                        "the repository is gated"
                    } else if status == 401 {
                        "the token is missing, invalid or expired"
                    } else {
                        "the token may not read this repository"
                    }
                ),
                token: match &self.token {
                    Some(t) => format!(" (the token sent came from {})", t.source),
                    None => " (no token was sent)".to_string(),
                },
            },
            404 => {
                let (what, advice) = match (code.as_str(), subject) {
                    ("RepoNotFound", _) | (_, Subject::Listing(_))
                        if code != "RevisionNotFound" =>
                    {
                        (
                            format!("repository {repo}"),
                            "check its name; a private repository also answers 404 without a token that may read it",
                        )
                    }
                    (_, Subject::Revision(rev)) | (_, Subject::Listing(rev)) => (
                        format!("revision {rev} of {repo}"),
                        "name an existing branch, tag or commit with --revision",
                    ),
                    (_, Subject::File(commit, path)) => (
                        format!("file {path} of {repo} at commit {commit}"),
                        "the listing of that commit named it: the Hub may be inconsistent; run the same command again later",
                    ),
                };
                PullError::NotFound {
                    endpoint: self.endpoint.clone(),
                    what,
                    detail,
                    advice,
                }
            }
            _ => PullError::Protocol {
                url: response.url().to_string(),
                detail: format!("HTTP {status}{detail}"),
            },
        })
    }

    /// The commit `revision` names now.
    pub async fn commit(&self, revision: &str) -> Result<String, PullError> {
        let (owner, name) = self.repo.split_once('/').expect("checked in Hub::new");
        let url = self.url(&["api", "models", owner, name, "revision", revision]);
        let what = format!("{}@{revision}", self.repo);
        let response = self.send(&what, || self.get(url.clone())).await?;
        if let Some(e) = self.refusal(Subject::Revision(revision), &response) {
            return Err(e);
        }
        let info: RevisionInfo = json(response).await?;
        match info.sha {
            Some(sha) if is_commit(&sha) => Ok(sha),
            other => Err(PullError::Protocol {
                url: url.to_string(),
                detail: format!("`sha` is {other:?}, not a 40-digit commit id"),
            }),
        }
    }

    /// Every file of the repository at `commit`, following the listing's pages.
    pub async fn files(&self, commit: &str) -> Result<Vec<RemoteFile>, PullError> {
        let (owner, name) = self.repo.split_once('/').expect("checked in Hub::new");
        let mut url = self.url(&["api", "models", owner, name, "tree", commit]);
        url.query_pairs_mut().append_pair("recursive", "true");
        let mut files = Vec::new();
        let mut next = Some(url);
        while let Some(url) = next.take() {
            let what = format!("the file listing of {}@{commit}", self.repo);
            let response = self.send(&what, || self.get(url.clone())).await?;
            if let Some(e) = self.refusal(Subject::Listing(commit), &response) {
                return Err(e);
            }
            next = next_page(response.headers(), &url)?;
            let page: Vec<TreeEntry> = json(response).await?;
            for entry in page.into_iter().filter(|e| e.kind == "file") {
                files.push(remote_file(entry, &url)?);
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        files.dedup_by(|a, b| a.path == b.path);
        Ok(files)
    }
}

/// A listing entry checked: a plain relative path, a git oid, and an LFS sha256 whose size
/// agrees with the entry's.
fn remote_file(entry: TreeEntry, url: &Url) -> Result<RemoteFile, PullError> {
    let bad = |detail: String| PullError::Protocol {
        url: url.to_string(),
        detail,
    };
    let plain = !entry.path.starts_with('/')
        && entry
            .path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if !plain {
        return Err(bad(format!(
            "path {:?} is not inside the repository",
            entry.path
        )));
    }
    if entry.oid.len() != 40 || !entry.oid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(format!(
            "{}: oid {:?} is not a git blob id",
            entry.path, entry.oid
        )));
    }
    let lfs_sha256 = match entry.lfs {
        Some(lfs) if !is_sha256(&lfs.oid) => {
            return Err(bad(format!(
                "{}: lfs.oid {:?} is not a sha256",
                entry.path, lfs.oid
            )));
        }
        Some(lfs) if lfs.size != entry.size => {
            return Err(bad(format!(
                "{}: lfs.size {} differs from size {}",
                entry.path, lfs.size, entry.size
            )));
        }
        Some(lfs) => Some(lfs.oid.to_ascii_lowercase()),
        None => None,
    };
    Ok(RemoteFile {
        path: entry.path,
        size: entry.size,
        git_oid: entry.oid.to_ascii_lowercase(),
        lfs_sha256,
    })
}

/// The `rel="next"` URL of a paged listing, relative to `base`.
fn next_page(headers: &HeaderMap, base: &Url) -> Result<Option<Url>, PullError> {
    let Some(link) = headers.get(LINK).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    for part in link.split(',') {
        let Some((target, params)) = part.split_once(';') else {
            continue;
        };
        let is_next = params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"");
        let target = target.trim().trim_start_matches('<').trim_end_matches('>');
        if is_next {
            return base
                .join(target)
                .map(Some)
                .map_err(|e| PullError::Protocol {
                    url: base.to_string(),
                    detail: format!("Link header names {target:?}: {e}"),
                });
        }
    }
    Ok(None)
}

/// A JSON body, or a protocol error naming the URL.
async fn json<T: serde::de::DeserializeOwned>(response: Response) -> Result<T, PullError> {
    let url = response.url().to_string();
    let bytes = response.bytes().await.map_err(|e| PullError::Protocol {
        url: url.clone(),
        detail: describe(&e),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| PullError::Protocol {
        url,
        detail: format!("not the JSON expected: {e}"),
    })
}

/// A reqwest error with its causes (reqwest's own text omits them: "error sending request").
pub fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_page_follows_rel_next_only() {
        let base = Url::parse("http://127.0.0.1:1/api/models/a/b/tree/c?recursive=true").unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(next_page(&h, &base).unwrap(), None);
        h.insert(
            LINK,
            "<http://127.0.0.1:1/api/models/a/b/tree/c?recursive=true&cursor=x>; rel=\"next\""
                .parse()
                .unwrap(),
        );
        assert_eq!(
            next_page(&h, &base).unwrap().unwrap().query(),
            Some("recursive=true&cursor=x")
        );
        h.insert(LINK, "</p?c=1>; rel=\"prev\"".parse().unwrap());
        assert_eq!(next_page(&h, &base).unwrap(), None);
    }

    #[test]
    fn listing_entries_are_checked() {
        let url = Url::parse("http://h/x").unwrap();
        let entry = |path: &str, oid: &str, lfs: Option<(&str, u64)>| TreeEntry {
            kind: "file".into(),
            path: path.into(),
            oid: oid.into(),
            size: 5,
            lfs: lfs.map(|(oid, size)| LfsEntry {
                oid: oid.into(),
                size,
            }),
        };
        let oid = "a".repeat(40);
        let sha = "b".repeat(64);
        assert!(remote_file(entry("a/b.json", &oid, None), &url).is_ok());
        assert!(remote_file(entry("../x", &oid, None), &url).is_err());
        assert!(remote_file(entry("/etc/x", &oid, None), &url).is_err());
        assert!(remote_file(entry("x", "zz", None), &url).is_err());
        assert!(remote_file(entry("x", &oid, Some((&sha, 6))), &url).is_err());
        assert_eq!(
            remote_file(entry("x", &oid, Some((&sha, 5))), &url)
                .unwrap()
                .lfs_sha256,
            Some(sha)
        );
    }

    #[test]
    fn urls_encode_each_segment() {
        let hub = Hub::new("http://127.0.0.1:9/", "o/n", None).unwrap();
        assert_eq!(
            hub.resolve_url(&"c".repeat(40), "dir/a b.json").path(),
            format!("/o/n/resolve/{}/dir/a%20b.json", "c".repeat(40))
        );
        assert!(Hub::new("http://h", "no-owner", None).is_err());
        assert!(Hub::new("http://h", "o/n/x", None).is_err());
    }
}
