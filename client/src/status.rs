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

/// `; per user N running, M queued` for the limits the daemon sets on one uid, or nothing.
fn per_user_limits(active: Option<u32>, queued: Option<u32>) -> String {
    let parts: Vec<String> = [(active, "running"), (queued, "queued")]
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
            "{} running, {} queued, {} parked (max {} running, {} queued{}); {} done, {} cancelled, {} failed, {} refused, {} stalled",
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
            "prompt at most {} tokens, {} new; a reader that stalls {:.0} s gives its slot back",
            s.max_prompt_tokens, s.max_tokens_cap, s.stall_timeout_seconds
        ),
    );
    line(
        "weights",
        format!(
            "{} read from disk, {} avoided",
            size(s.bytes_read),
            size(s.bytes_avoided)
        ),
    );
    if let Some(c) = &s.cache {
        line(
            "cache",
            format!(
                "{} of {}, {} hits, {} misses",
                size(c.used_bytes),
                size(c.capacity_bytes),
                c.hits,
                c.misses
            ),
        );
    }
    if !s.pinned_layers.is_empty() {
        line("pinned", format!("{:?}", s.pinned_layers));
    }
    line(
        "memory",
        format!(
            "RSS {} (peak {})",
            size(s.rss_bytes),
            size(s.peak_rss_bytes)
        ),
    );
    line("threads", s.threads.to_string());
    line(
        "batching",
        format!(
            "up to {} per pass; {} passes, {} shared by several requests, widest {}",
            s.max_batch, s.forward_passes, s.batched_passes, s.widest_batch
        ),
    );
    if let Some(x) = &s.sessions {
        line(
            "sessions",
            if x.error.is_empty() {
                format!(
                    "{} ({} in use, {} in memory of {} allowed) in {}",
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
    line("uptime", format!("{:.0} s", s.uptime_seconds));
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
    use super::per_user_limits;

    #[test]
    fn per_user_limits_are_said_only_where_the_daemon_sets_them() {
        assert_eq!(per_user_limits(None, None), "");
        assert_eq!(per_user_limits(Some(1), None), "; per user 1 running");
        assert_eq!(
            per_user_limits(Some(2), Some(0)),
            "; per user 2 running, 0 queued"
        );
    }
}
