//! Who a request is from, as its transport vouches for it (issue 34 point 5, issue 35 point 7).
//!
//! The serve core keeps state for a caller between its requests (automatic prefix reuse,
//! [`super::prefix`]) and must never continue one caller's request from another's state: a
//! reused prefix shows in the usage (`cached_tokens`), so sharing it would tell one caller
//! what another sent. So a caller is only what something the caller cannot forge says it is:
//!
//! * a local account, as the kernel names it: a Unix socket peer's credentials, or the owner
//!   of a loopback TCP peer's socket (the kernel's socket table, read by the transport);
//! * a TCP caller holding one of the daemon's API keys. Behind one key, a per-request name
//!   (OpenAI's `prompt_cache_key`, Anthropic's `metadata.user_id`) separates the key's users
//!   further — believed only because the key authenticates the request;
//! * anyone else (a keyless TCP peer whose owner could not be named, a Unix peer without
//!   credentials) is [`Caller::Unknown`]: nothing is kept for it, since nothing says two of
//!   its requests come from the same caller. For limits and fair turns the unknown callers
//!   are one account together.

use std::fmt;

/// Who a request is from (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    /// A local account named by the kernel.
    Uid(u32),
    /// A TCP caller that presented the daemon's API key number `key` (its index in the key
    /// list), and the name it gave itself under that key, if any.
    Key { key: usize, scope: Option<String> },
    /// Nobody vouches for the caller: no state is kept for it or reused by it.
    Unknown,
}

impl Caller {
    /// The account's uid, for what belongs to a local user (named sessions, cancel by id).
    pub fn uid(&self) -> Option<u32> {
        match self {
            Caller::Uid(uid) => Some(*uid),
            Caller::Key { .. } | Caller::Unknown => None,
        }
    }

    /// This caller narrowed to the name it gave itself in a request (OpenAI's
    /// `prompt_cache_key`, Anthropic's `metadata.user_id`). Only a key's holder is narrowed:
    /// the key vouches that the name is its holder's to give. Anyone else stays itself, so a
    /// name can never make two callers one, and naming nothing changes nothing. The name is
    /// kept as its SHA-256 digest (a client's text of any length, compared by value).
    pub fn scoped(self, scope: Option<&str>) -> Caller {
        match (self, scope) {
            (Caller::Key { key, .. }, Some(name)) => Caller::Key {
                key,
                scope: Some(hex_digest(name)),
            },
            (other, _) => other,
        }
    }

    /// Whether something the caller cannot forge names it, so state may be kept for it.
    pub fn is_known(&self) -> bool {
        !matches!(self, Caller::Unknown)
    }

    /// The account the caller belongs to, which limits and fair shares count: the caller
    /// without the name it gave itself under a key (one key's users share its share).
    pub fn account(&self) -> Caller {
        match self {
            Caller::Key { key, .. } => Caller::Key {
                key: *key,
                scope: None,
            },
            other => other.clone(),
        }
    }
}

fn hex_digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl fmt::Display for Caller {
    /// For logs: `uid 1000`, `key #0`, `key #0 (scope 3f2a9c01)`, `an unknown caller` (a
    /// scope by the start of its digest: the caller's own text is not logged).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Uid(uid) => write!(f, "uid {uid}"),
            Caller::Key { key, scope: None } => write!(f, "key #{key}"),
            Caller::Key {
                key,
                scope: Some(s),
            } => write!(f, "key #{key} (scope {})", s.get(..8).unwrap_or(s)),
            Caller::Unknown => write!(f, "an unknown caller"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_drops_only_a_keys_scope() {
        let scoped = Caller::Key {
            key: 2,
            scope: Some("agent-7".into()),
        };
        assert_eq!(
            scoped.account(),
            Caller::Key {
                key: 2,
                scope: None
            }
        );
        assert_ne!(scoped, scoped.account(), "two scopes are two callers");
        assert_eq!(Caller::Uid(5).account(), Caller::Uid(5));
        assert_eq!(Caller::Unknown.account(), Caller::Unknown);
        assert_eq!(Caller::Uid(5).uid(), Some(5));
        assert_eq!(scoped.uid(), None);
        assert_eq!(Caller::Unknown.uid(), None);
        assert!(scoped.is_known() && Caller::Uid(0).is_known() && !Caller::Unknown.is_known());
        assert_eq!(scoped.to_string(), "key #2 (scope agent-7)");
    }

    #[test]
    fn only_a_keys_holder_is_narrowed_by_the_name_it_gives() {
        let key = Caller::Key {
            key: 0,
            scope: None,
        };
        let a = key.clone().scoped(Some("session-a"));
        assert_ne!(a, key);
        assert_eq!(a, key.clone().scoped(Some("session-a")));
        assert_ne!(a, key.clone().scoped(Some("session-b")));
        assert_eq!(key.clone().scoped(None), key);
        assert_eq!(a.account(), key);
        // A uid or an unknown caller cannot name itself into another identity.
        assert_eq!(Caller::Uid(7).scoped(Some("x")), Caller::Uid(7));
        assert_eq!(Caller::Unknown.scoped(Some("x")), Caller::Unknown);
        let Caller::Key { scope: Some(s), .. } = &a else {
            panic!("{a:?}")
        };
        assert_eq!(s.len(), 64, "kept as a digest, not the caller's text");
        assert!(a.to_string().starts_with("key #0 (scope "));
    }
}
