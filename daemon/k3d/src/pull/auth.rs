//! Where `k3d pull` finds the Hub's endpoint and token, in the order `huggingface_hub` uses:
//! `--token`, then `HF_TOKEN`, then the file `huggingface-cli login` writes (`$HF_TOKEN_PATH`,
//! else `$HF_HOME/token`, else `$XDG_CACHE_HOME/huggingface/token`, else
//! `~/.cache/huggingface/token`). The source is kept so that a refusal can name it.

use std::path::PathBuf;

/// The public Hub, unless `HF_ENDPOINT` names another (a mirror, an enterprise Hub, a test).
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A token and where it came from ("--token", "HF_TOKEN", or the file's path).
#[derive(Clone)]
pub struct Token {
    pub secret: String,
    pub source: String,
}

impl std::fmt::Debug for Token {
    /// Never the secret itself: errors and logs name only where it came from.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(from {})", self.source)
    }
}

/// `HF_ENDPOINT` without a trailing slash, or the public Hub.
pub fn endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .map(|e| e.trim().trim_end_matches('/').to_string())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
}

/// The token file `huggingface-cli login` writes.
fn token_file() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(p) = var("HF_TOKEN_PATH") {
        return Some(PathBuf::from(p));
    }
    if let Some(home) = var("HF_HOME") {
        return Some(PathBuf::from(home).join("token"));
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("huggingface").join("token"))
}

/// The token to send, if any: `flag` (`--token`) first, then `HF_TOKEN`, then the login file.
/// An empty value counts as none (as in `huggingface_hub`).
pub fn token(flag: Option<&str>) -> Option<Token> {
    let found = |secret: &str, source: String| {
        let secret = secret.trim();
        (!secret.is_empty()).then(|| Token {
            secret: secret.to_string(),
            source,
        })
    };
    if let Some(t) = flag.and_then(|t| found(t, "--token".into())) {
        return Some(t);
    }
    if let Some(t) = std::env::var("HF_TOKEN")
        .ok()
        .and_then(|t| found(&t, "HF_TOKEN".into()))
    {
        return Some(t);
    }
    let path = token_file()?;
    let text = std::fs::read_to_string(&path).ok()?;
    found(&text, path.display().to_string())
}
