//! The `Status` reply: the serve core's status plus process figures read here (resident memory:
//! `system::ProcessMemory`, engine-lessons §8.1: report real peak RSS).

use super::convert::{count, load_progress};
use k3_engine::serve::{Health, Status};
use k3proto::v1 as pb;

pub fn reply(s: &Status, threads: usize) -> pb::StatusReply {
    let admission = &s.admission;
    let (state, load_progress) = match (&admission.health, admission.accepting) {
        (_, false) => ("shutting down".to_string(), None),
        (Health::Loading(figures), true) => ("loading".to_string(), Some(load_progress(figures))),
        (Health::Ready, true) => ("ready".to_string(), None),
        (Health::Failed(e), true) => (format!("failed: {e}"), None),
    };
    let memory = k3_engine::system::ProcessMemory::now();
    let info = admission.info.as_ref();
    pb::StatusReply {
        state,
        load_progress,
        model: info.map(|i| pb::ModelInfo {
            name: i.name.clone(),
            dir: i.dir.display().to_string(),
            fingerprint: i.fingerprint.clone(),
            config: i.summary.clone(),
        }),
        plan: info.map(|i| i.plan.clone()).unwrap_or_default(),
        pinned_layers: info
            .map(|i| i.pinned_layers.iter().map(|&l| count(l)).collect())
            .unwrap_or_default(),
        cache: info.map(|i| pb::CacheFigures {
            capacity_bytes: i.cache_capacity_bytes,
            used_bytes: admission.stats.store.cache_resident_bytes,
            hits: admission.stats.store.cache.hits,
            misses: admission.stats.store.cache.misses(),
        }),
        bytes_read: admission.stats.store.bytes_read,
        bytes_avoided: admission.stats.store.bytes_avoided,
        rss_bytes: memory.rss,
        peak_rss_bytes: memory.peak_rss,
        uptime_seconds: s.uptime.as_secs_f64(),
        active_requests: count(admission.active),
        queued_requests: count(admission.queued),
        max_queue: count(s.capacity.max_queue),
        requests_completed: admission.counters.completed,
        requests_cancelled: admission.counters.cancelled,
        requests_failed: admission.counters.failed,
        requests_rejected: admission.counters.rejected,
        threads: count(threads),
        max_active: count(s.capacity.max_active),
        max_batch: count(s.capacity.max_batch),
        max_active_per_uid: uid_limit(s.capacity.per_uid.max_active),
        max_queued_per_uid: uid_limit(s.capacity.per_uid.max_queued),
        forward_passes: admission.stats.forward_passes,
        batched_passes: admission.stats.batched_passes,
        widest_batch: u32::try_from(admission.stats.widest_batch).unwrap_or(u32::MAX),
        sessions: Some(super::convert::session_figures(&s.sessions)),
        parked_requests: count(admission.parked),
        requests_stalled: admission.counters.stalled,
        max_prompt_tokens: count(s.limits.max_prompt_tokens),
        max_tokens_cap: count(s.limits.max_tokens_cap),
        stall_timeout_seconds: s.stall_timeout.as_secs_f64(),
    }
}

/// A per-uid limit on the wire: `usize::MAX` is [`k3_engine::serve::UidLimits`]' "no limit of
/// its own", sent as absent.
fn uid_limit(n: usize) -> Option<u32> {
    (n != usize::MAX).then(|| count(n))
}
