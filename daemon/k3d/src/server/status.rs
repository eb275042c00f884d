//! The `Status` reply: the scheduler's published snapshot plus process figures read here
//! (resident memory from /proc, engine-lessons §8.1: report real peak RSS).

use super::admission::{Phase, Shared};
use k3proto::v1 as pb;

pub fn reply(shared: &Shared, threads: usize, sessions: pb::SessionFigures) -> pb::StatusReply {
    let snap = shared.snapshot();
    let (state, load_progress) = match (&snap.phase, snap.accepting) {
        (_, false) => ("shutting down".to_string(), None),
        (Phase::Loading { done, total }, true) => (
            "loading".to_string(),
            Some(pb::Progress {
                phase: pb::Phase::Load.into(),
                done: *done,
                total: *total,
            }),
        ),
        (Phase::Ready, true) => ("ready".to_string(), None),
        (Phase::Failed(msg), true) => (format!("failed: {msg}"), None),
    };
    let (rss_bytes, peak_rss_bytes) = memory();
    let info = snap.info.as_ref();
    pb::StatusReply {
        state,
        load_progress,
        model: info.map(|i| pb::ModelInfo {
            name: i.name.clone(),
            dir: i.dir.display().to_string(),
            fingerprint: i.fingerprint.clone(),
            config: format!("{}\n{}", i.summary, i.plan),
        }),
        plan: info.map(|i| i.plan.clone()).unwrap_or_default(),
        pinned_layers: info
            .map(|i| {
                i.pinned_layers
                    .iter()
                    .map(|&l| super::convert::count(l))
                    .collect()
            })
            .unwrap_or_default(),
        cache: info.map(|i| pb::CacheFigures {
            capacity_bytes: i.cache_capacity_bytes,
            used_bytes: snap.stats.cache_resident_bytes,
            hits: snap.stats.cache_hits,
            misses: snap.stats.cache_misses,
        }),
        bytes_read: snap.stats.bytes_read,
        bytes_avoided: snap.stats.bytes_avoided,
        rss_bytes,
        peak_rss_bytes,
        uptime_seconds: shared.started.elapsed().as_secs_f64(),
        active_requests: super::convert::count(snap.active),
        queued_requests: super::convert::count(snap.queued),
        max_queue: super::convert::count(shared.limits.max_queue),
        requests_completed: snap.counters.completed,
        requests_cancelled: snap.counters.cancelled,
        requests_failed: snap.counters.failed,
        requests_rejected: snap.counters.rejected,
        threads: super::convert::count(threads),
        max_active: super::convert::count(shared.limits.max_active),
        max_batch: super::convert::count(shared.limits.max_batch),
        forward_passes: snap.stats.forward_passes,
        batched_passes: snap.stats.batched_passes,
        widest_batch: u32::try_from(snap.stats.widest_batch).unwrap_or(u32::MAX),
        sessions: Some(sessions),
    }
}

/// Current and peak resident set (VmRSS, VmHWM) in bytes; 0 where /proc does not say.
pub fn memory() -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}
