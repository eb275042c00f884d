//! `GET /metrics` in the Prometheus text format (prometheus-client, the Prometheus project's
//! own Rust client). Per-request figures (requests by endpoint and status, tokens, time to
//! first token, decode seconds per token) are recorded as HTTP requests end; the daemon-wide
//! ones (queue depth, batching, bytes read and avoided, cache, RSS, the budget) are read from
//! the serve core at each scrape, so they are never stale and cost nothing between scrapes.

use k3_engine::serve::Core;
use k3_engine::system::ProcessMemory;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    tokens: Family<DirectionLabels, Counter>,
    ttft: Histogram,
    decode: Histogram,
}

impl Metrics {
    /// `budget_bytes` is the RAM budget the model was planned in (`None` = unbounded).
    pub fn new(core: Arc<Core>, budget_bytes: Option<u64>) -> Metrics {
        let mut registry = Registry::with_prefix("k3d");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by endpoint (route) and status",
            requests.clone(),
        );
        let tokens = Family::<DirectionLabels, Counter>::default();
        registry.register(
            "tokens",
            "Tokens through the HTTP API: in = prompt tokens, out = generated tokens",
            tokens.clone(),
        );
        // 10 ms .. ~5.5 min: tiny models answer in milliseconds, K3 streaming from disk in minutes.
        let ttft = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        registry.register(
            "time_to_first_token_seconds",
            "From the request's arrival to its first generated text",
            ttft.clone(),
        );
        let decode = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "decode_seconds_per_token",
            "Decode time per generated token after the first, per request",
            decode.clone(),
        );
        registry.register_collector(Box::new(CoreFigures { core, budget_bytes }));
        Metrics {
            registry,
            requests,
            tokens,
            ttft,
            decode,
        }
    }

    pub fn request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.to_string(),
                status,
            })
            .inc();
    }

    /// A generation ended: its token counts and timings (seconds).
    pub fn generation(
        &self,
        prompt: usize,
        generated: usize,
        ttft: Option<f64>,
        decode: Option<f64>,
    ) {
        self.tokens
            .get_or_create(&DirectionLabels { direction: "in" })
            .inc_by(prompt as u64);
        self.tokens
            .get_or_create(&DirectionLabels { direction: "out" })
            .inc_by(generated as u64);
        if let Some(t) = ttft {
            self.ttft.observe(t);
        }
        if let Some(d) = decode {
            self.decode.observe(d);
        }
    }

    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// The serve core's figures, read at scrape time.
struct CoreFigures {
    core: Arc<Core>,
    budget_bytes: Option<u64>,
}

/// `Collector` requires `Debug`; the core's state is not worth printing.
impl std::fmt::Debug for CoreFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoreFigures")
    }
}

impl CoreFigures {
    fn counter(
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        value: u64,
    ) -> Result<(), std::fmt::Error> {
        let metric = ConstCounter::new(value);
        metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
    }

    fn gauge(
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        value: i64,
    ) -> Result<(), std::fmt::Error> {
        let metric = ConstGauge::new(value);
        metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
    }
}

impl Collector for CoreFigures {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snap = self.core.metrics();
        let s = snap.engine;
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let memory = ProcessMemory::now();
        Self::gauge(
            &mut e,
            "queue_depth",
            "Requests waiting for a compute slot",
            gauge(snap.queue_depth as u64),
        )?;
        Self::gauge(
            &mut e,
            "active_requests",
            "Requests being computed",
            gauge(snap.active as u64),
        )?;
        Self::gauge(
            &mut e,
            "batch_size_max",
            "The most requests one forward pass has served",
            gauge(s.widest_batch),
        )?;
        Self::counter(
            &mut e,
            "forward_passes",
            "Forward passes run",
            s.forward_passes,
        )?;
        Self::counter(
            &mut e,
            "batched_passes",
            "Forward passes that served two or more requests",
            s.batched_passes,
        )?;
        {
            let mut metric = e.encode_descriptor(
                "weight_bytes_read",
                "Weight bytes read from disk, by class (trunk, experts, embedding, head)",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (class, bytes) in [
                ("trunk", s.store.trunk_bytes_read),
                ("experts", s.store.expert_bytes_read),
                ("embedding", s.store.embedding_bytes_read),
                ("head", s.store.head_bytes_read),
            ] {
                let labels = ClassLabels { class };
                ConstCounter::new(bytes).encode(metric.encode_family(&labels)?)?;
            }
        }
        Self::counter(
            &mut e,
            "prefix_warmed_tokens",
            "History tokens fed after replies to warm each caller's next turn (prefix reuse)",
            snap.timings.warmed_tokens,
        )?;
        let files = snap.prefix_files;
        for (name, help, value) in [
            (
                "prefix_disk_hits",
                "Requests with prefix reuse that continued from a kept state loaded from disk",
                files.hits,
            ),
            (
                "prefix_disk_misses",
                "Requests with prefix reuse of a local account for which the disk held no \
                 longer kept state than memory",
                files.misses,
            ),
            (
                "prefix_disk_evictions",
                "Kept states removed from disk to make room in their owner's allowance",
                files.evictions,
            ),
            (
                "prefix_disk_written_bytes",
                "Bytes of kept states written to disk",
                files.bytes_written,
            ),
            (
                "prefix_disk_failures",
                "Kept states not written (refused or failed) and damaged ones removed",
                files.failed,
            ),
        ] {
            Self::counter(&mut e, name, help, value)?;
        }
        Self::gauge(
            &mut e,
            "prefix_disk_bytes",
            "Bytes of kept prefix states on disk",
            gauge(files.bytes),
        )?;
        Self::counter(
            &mut e,
            "weight_bytes_avoided",
            "Weight bytes needed that pinned layers or caches supplied",
            s.store.bytes_avoided,
        )?;
        Self::counter(
            &mut e,
            "expert_cache_hits",
            "Routed-expert requests served from memory",
            s.store.cache.hits,
        )?;
        Self::counter(
            &mut e,
            "expert_cache_misses",
            "Routed-expert requests that needed a read",
            s.store.cache.misses(),
        )?;
        Self::gauge(
            &mut e,
            "expert_cache_bytes",
            "Bytes of the expert cache holding an expert",
            gauge(s.store.cache_resident_bytes),
        )?;
        Self::gauge(
            &mut e,
            "rss_bytes",
            "Resident set size of the daemon",
            gauge(memory.rss),
        )?;
        Self::gauge(
            &mut e,
            "peak_rss_bytes",
            "Peak resident set size of the daemon",
            gauge(memory.peak_rss),
        )?;
        if let Some(budget) = self.budget_bytes {
            Self::gauge(
                &mut e,
                "budget_bytes",
                "The RAM budget the model is planned in",
                gauge(budget),
            )?;
        }
        let c = snap.counters;
        Self::counter(
            &mut e,
            "requests_completed",
            "Generations completed (every transport)",
            c.completed,
        )?;
        Self::counter(
            &mut e,
            "requests_cancelled",
            "Generations cancelled (every transport)",
            c.cancelled,
        )?;
        Self::counter(
            &mut e,
            "requests_failed",
            "Generations failed (every transport)",
            c.failed,
        )?;
        Self::counter(
            &mut e,
            "requests_rejected",
            "Generations refused, nothing computed: full queue, invalid request, session refused, not serving (every transport)",
            c.rejected,
        )?;
        Self::counter(
            &mut e,
            "requests_stalled",
            "Generations whose reader took nothing for the stall timeout while others waited: parked, or cancelled without room to keep their state",
            c.stalled,
        )?;
        Self::gauge(
            &mut e,
            "parked_requests",
            "Generations parked now: their reader stalled, their state kept, no compute slot",
            gauge(snap.parked as u64),
        )
    }
}
