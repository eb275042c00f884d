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
    /// The text.
    text: String,
    /// Recognise special-token strings such as <|open|>.
    #[arg(long)]
    allow_special: bool,
}

pub async fn status(socket: &SocketPath, args: Args) -> Result<(), Failure> {
    let mut client = connect::connect(socket).await?;
    let s = client.status(pb::StatusRequest {}).await?.into_inner();
    if args.json {
        println!("{}", json(&s));
    } else {
        print!("{}", readable(&s, socket));
    }
    Ok(())
}

pub async fn tokenize(socket: &SocketPath, args: TokenizeArgs) -> Result<(), Failure> {
    let mut client = connect::connect(socket).await?;
    let reply = client
        .tokenize(pb::TokenizeRequest {
            text: args.text,
            allow_special: args.allow_special,
        })
        .await?
        .into_inner();
    let ids: Vec<String> = reply.ids.iter().map(u32::to_string).collect();
    println!("{}", ids.join(" "));
    Ok(())
}

/// Bytes in the largest binary unit that keeps the number at least 1 (tiny test models read
/// kilobytes, real ones terabytes).
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
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
        line("loading", format!("{}/{}", p.done, p.total));
    }
    if let Some(m) = &s.model {
        line("model", format!("{} ({})", m.name, m.dir));
        line("fingerprint", m.fingerprint.clone());
        line("config", m.config.clone());
    }
    line(
        "requests",
        format!(
            "{} running, {} queued (max {} running, {} queued); {} done, {} cancelled, {} failed, {} refused",
            s.active_requests,
            s.queued_requests,
            s.max_active,
            s.max_queue,
            s.requests_completed,
            s.requests_cancelled,
            s.requests_failed,
            s.requests_rejected
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
                    "{} ({} in memory of {} allowed) in {}",
                    x.count,
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

fn json(s: &pb::StatusReply) -> serde_json::Value {
    serde_json::json!({
        "state": s.state,
        "load_progress": s.load_progress.map(|p| serde_json::json!({"done": p.done, "total": p.total})),
        "model": s.model.as_ref().map(|m| serde_json::json!({
            "name": m.name, "dir": m.dir, "fingerprint": m.fingerprint, "config": m.config,
        })),
        "plan": s.plan,
        "pinned_layers": s.pinned_layers,
        "cache": s.cache.map(|c| serde_json::json!({
            "capacity_bytes": c.capacity_bytes, "used_bytes": c.used_bytes, "hits": c.hits, "misses": c.misses,
        })),
        "bytes_read": s.bytes_read,
        "bytes_avoided": s.bytes_avoided,
        "rss_bytes": s.rss_bytes,
        "peak_rss_bytes": s.peak_rss_bytes,
        "uptime_seconds": s.uptime_seconds,
        "active_requests": s.active_requests,
        "queued_requests": s.queued_requests,
        "max_active": s.max_active,
        "max_queue": s.max_queue,
        "requests_completed": s.requests_completed,
        "requests_cancelled": s.requests_cancelled,
        "requests_failed": s.requests_failed,
        "requests_rejected": s.requests_rejected,
        "threads": s.threads,
        "max_batch": s.max_batch,
        "forward_passes": s.forward_passes,
        "batched_passes": s.batched_passes,
        "widest_batch": s.widest_batch,
        "sessions": s.sessions.as_ref().map(|x| serde_json::json!({
            "count": x.count, "memory_bytes": x.memory_bytes,
            "allowance_bytes": x.allowance_bytes, "dir": x.dir, "error": x.error,
        })),
    })
}
