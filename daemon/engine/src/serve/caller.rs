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

impl fmt::Display for Caller {
    /// For logs: `uid 1000`, `key #0`, `key #0 (scope of 12 bytes)`, `an unknown caller`. A
    /// scope is the caller's own text, so only its length is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Uid(uid) => write!(f, "uid {uid}"),
            Caller::Key { key, scope: None } => write!(f, "key #{key}"),
            Caller::Key {
                key,
                scope: Some(s),
            } => write!(f, "key #{key} (scope of {} bytes)", s.len()),
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
        assert_eq!(scoped.to_string(), "key #2 (scope of 7 bytes)");
    }
}
