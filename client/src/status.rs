//! `k3 status` and `k3 tokenize`: the daemon's one-shot calls.

use crate::connect::{self, SocketPath};
use crate::failure::Failure;
use k3proto::v1 as pb;

#[derive(clap::Args)]
pub struct Args {
    /// Print the reply as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// The text; `-` reads it from stdin.
    text: String,
    /// Recognise special-token strings such as <|open|>.
    #[arg(long)]
    allow_special: bool,
    /// Print `{"ids": [...]}` instead of space-separated ids.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    /// Token ids; none reads them from stdin.
    ids: Vec<String>,
}

pub async fn status(socket: &SocketPath, args: Args) -> Result<(), Failure> {
    let mut client = connect::connect(socket).await?;
    let s = client.status(pb::StatusRequest {}).await?.into_inner();
    if args.json {
        crate::print_json(&s)
    } else {
        crate::print(&readable(&s, socket))
    }
}

pub async fn tokenize(socket: &SocketPath, args: TokenizeArgs) -> Result<(), Failure> {
    let text = crate::argument_or_stdin(args.text)?;
    let mut client = connect::connect(socket).await?;
    let reply = client
        .tokenize(pb::TokenizeRequest {
            text,
            allow_special: args.allow_special,
        })
        .await?
        .into_inner();
    if args.json {
        return crate::print_json(&reply);
    }
    let ids: Vec<String> = reply.ids.iter().map(u32::to_string).collect();
    crate::print(&format!("{}\n", ids.join(" ")))
}

pub async fn detokenize(socket: &SocketPath, args: DetokenizeArgs) -> Result<(), Failure> {
    let text = if args.ids.is_empty() {
        crate::argument_or_stdin("-".into())?
    } else {
        args.ids.join(" ")
    };
    let ids = crate::run::parse_ids(&text)?;
    let mut client = connect::connect(socket).await?;
    let reply = client
        .detokenize(pb::DetokenizeRequest { ids })
        .await?
        .into_inner();
    crate::print(&reply.text)
}

/// Bytes in binary units (tiny test models read kilobytes, real ones terabytes).
pub fn size(bytes: u64) -> String {
    bytesize::ByteSize::b(bytes).display().iec().to_string()
}

/// `part of whole` as a percentage with no false precision (`74 %`, `0.4 %`, `-` of nothing).
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    let p = part as f64 * 100.0 / whole as f64;
    if p >= 10.0 || p == 0.0 {
        format!("{p:.0} %")
    } else {
        format!("{p:.1} %")
    }
}

/// `0-8`, `0-3, 7`: layer numbers as ranges.
fn ranges(layers: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            layers[i].to_string()
        } else {
            format!("{}-{}", layers[i], layers[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// `42 s`, `12 min`, `3 h 5 min`, `2 days 4 h`.
fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        s => format!("{} days {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `; per user N running, M queued` for the limits the daemon sets on one uid, or nothing.
fn per_user_limits(active: Option<u32>, queued: Option<u32>) -> String {
    let parts: Vec<String> = [(active, "running"), (queued, "waiting")]
        .into_iter()
        .filter_map(|(n, what)| n.map(|n| format!("{n} {what}")))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("; per user {}", parts.join(", "))
    }
}

fn readable(s: &pb::StatusReply, socket: &SocketPath) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<12} {v}\n"));
    line(
        "daemon",
        format!("{} on {}", s.state, socket.path.display()),
    );
    if let Some(p) = &s.load_progress {
        line("loading", p.text.clone());
    }
    if let Some(m) = &s.model {
        line("model", format!("{} ({})", m.name, m.dir));
        line("fingerprint", m.fingerprint.clone());
        line("config", m.config.clone());
    }
    line(
        "requests",
        format!(
            "{} running, {} waiting, {} paused for a slow reader (at most {} running, {} waiting{}); since start {} done, {} cancelled, {} failed, {} refused, {} paused",
            s.active_requests,
            s.queued_requests,
            s.parked_requests,
            s.max_active,
            s.max_queue,
            per_user_limits(s.max_active_per_uid, s.max_queued_per_uid),
            s.requests_completed,
            s.requests_cancelled,
            s.requests_failed,
            s.requests_rejected,
            s.requests_stalled
        ),
    );
    line(
        "limits",
        format!(
            "prompts up to {} tokens, replies up to {} tokens; a reader that takes nothing for {:.0} s gives its slot back",
            s.max_prompt_tokens, s.max_tokens_cap, s.stall_timeout_seconds
        ),
    );
    line(
        "weights",
        format!(
            "since start {} read from disk; {} more needed were already in memory (pinned or cached)",
            size(s.bytes_read),
            size(s.bytes_avoided)
        ),
    );
    if let Some(c) = &s.cache {
        let lookups = c.hits + c.misses;
        line(
            "experts",
            format!(
                "cache {} of {} in use; {} of {lookups} expert uses found there ({})",
                size(c.used_bytes),
                size(c.capacity_bytes),
                c.hits,
                percent(c.hits, lookups)
            ),
        );
    }
    if !s.pinned_layers.is_empty() {
        line(
            "pinned",
            format!("layers {} kept in memory", ranges(&s.pinned_layers)),
        );
    }
    line(
        "memory",
        format!(
            "the daemon uses {} (at most {} so far)",
            size(s.rss_bytes),
            size(s.peak_rss_bytes)
        ),
    );
    line("threads", format!("{} computing", s.threads));
    line(
        "batching",
        format!(
            "up to {} requests per forward pass; {} passes, {} of them shared by several requests, at most {} at once",
            s.max_batch, s.forward_passes, s.batched_passes, s.widest_batch
        ),
    );
    if let Some(x) = &s.sessions {
        line(
            "sessions",
            if x.error.is_empty() {
                format!(
                    "{} kept ({} in use by a request; {} in memory of the {} allowed) in {}",
                    x.count,
                    x.leased,
                    size(x.memory_bytes),
                    size(x.allowance_bytes),
                    x.dir
                )
            } else {
                format!("unavailable: {}", x.error)
            },
        );
    }
    line("uptime", duration(s.uptime_seconds));
    if !s.plan.is_empty() {
        out.push_str("plan:\n");
        for l in s.plan.lines() {
            out.push_str(&format!("  {l}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{duration, per_user_limits, percent, ranges};

    #[test]
    fn per_user_limits_are_said_only_where_the_daemon_sets_them() {
        assert_eq!(per_user_limits(None, None), "");
        assert_eq!(per_user_limits(Some(1), None), "; per user 1 running");
        assert_eq!(
            per_user_limits(Some(2), Some(0)),
            "; per user 2 running, 0 waiting"
        );
    }

    /// Issue 46.5: figures a user reads at a glance — no "67,417.8444/s", no `[0, 1, 2, …]`.
    #[test]
    fn figures_read_at_a_glance() {
        assert_eq!(percent(372, 500), "74 %");
        assert_eq!(percent(2, 500), "0.4 %");
        assert_eq!(percent(0, 0), "-");
        assert_eq!(ranges(&[0, 1, 2, 3, 4, 5, 6, 7, 8]), "0-8");
        assert_eq!(ranges(&[0, 1, 3, 5, 6]), "0-1, 3, 5-6");
        assert_eq!(duration(3.4), "3 s");
        assert_eq!(duration(725.0), "12 min");
        assert_eq!(duration(11_100.0), "3 h 5 min");
    }
}
