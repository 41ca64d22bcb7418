//! The stats every reporter sends the autoscaler: [`Stat`], the [`StatSink`] seam, and its
//! in-process channel ([`stat_channel`]).
//!
//! Neutral ground: the activator and the queue sidecar report through it, the autoscaler's
//! collector reads it, and neither side imports the other. It uses nothing but the revision key
//! and tokio's channel.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use crate::revision::RevisionKey;

/// One reporter's view of one revision over one second.
#[derive(Debug, Clone, PartialEq)]
pub struct Stat {
    pub revision: RevisionKey,
    /// Who reported it (an activator's or queue sidecar's name). The collector sums different
    /// sources in one second and never counts one source twice in the same second.
    pub source: Arc<str>,
    /// The whole second (on [`crate::clock`]) the stat describes.
    pub at: u64,
    /// Time-weighted average in-flight requests over that second, held requests included.
    pub average_concurrency: f64,
    /// Requests that arrived in that second.
    pub requests: u64,
    /// The part of `average_concurrency` that came through an activator. A queue sidecar
    /// counts requests carrying `K-Proxy-Request`; an activator reports 0. The activator
    /// reports those requests itself, so the collector subtracts this share from pod stats
    /// and no request counts twice (as Knative's autoscaler does).
    pub proxied_concurrency: f64,
    /// The part of `requests` that came through an activator (see `proxied_concurrency`).
    pub proxied_requests: u64,
}

/// The most average concurrency one stat may carry: a million requests in flight at one
/// reporter in one second (an activator holds at most `max-held-requests`, 50,000 by default,
/// and its connections are bounded). Larger values are clamped to it and counted
/// (`thaw_autoscaler_stats_clamped_total`), so one report can neither overflow a window nor
/// pin a revision at max-scale by itself.
pub const MAX_STAT_CONCURRENCY: f64 = 1_000_000.0;
/// The most requests one stat may count in one second (clamped likewise).
pub const MAX_STAT_REQUESTS: u64 = 100_000_000;

impl Stat {
    /// Clamps the stat's values to [`MAX_STAT_CONCURRENCY`] and [`MAX_STAT_REQUESTS`] (the
    /// proxied shares to the whole); whether anything changed. Negative and non-finite values
    /// are left for the collector to reject.
    pub fn clamp(&mut self) -> bool {
        let mut changed = false;
        if self.average_concurrency > MAX_STAT_CONCURRENCY {
            self.average_concurrency = MAX_STAT_CONCURRENCY;
            changed = true;
        }
        if self.proxied_concurrency > self.average_concurrency {
            self.proxied_concurrency = self.average_concurrency;
            changed = true;
        }
        if self.requests > MAX_STAT_REQUESTS {
            self.requests = MAX_STAT_REQUESTS;
            changed = true;
        }
        if self.proxied_requests > self.requests {
            self.proxied_requests = self.requests;
            changed = true;
        }
        changed
    }
}

/// What a queue sidecar serves on its admin port at [`POD_STATS_PATH`] for the autoscaler to
/// pull each second (JSON, camelCase): the last complete second of its pod. The autoscaler
/// stamps it with its own receipt second and the pod's name as the source.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// The pod's name (`Stat::source`).
    pub pod: String,
    /// Time-weighted average requests in the sidecar (queued and in the user container).
    pub average_concurrency: f64,
    /// Requests that arrived.
    pub requests: u64,
    /// The share of `average_concurrency` from requests carrying `K-Proxy-Request` (through
    /// an activator).
    pub proxied_concurrency: f64,
    /// The share of `requests` that carried `K-Proxy-Request`.
    pub proxied_requests: u64,
}

/// The sidecar admin path the autoscaler pulls [`PodStats`] from.
pub const POD_STATS_PATH: &str = "/stats";

/// The name of the private Service's (and so its EndpointSlices') port that reaches the
/// sidecar's admin port (Knative's name for the queue-proxy's autoscaler metrics port). A
/// revision whose slices carry no such port has no pod stats: the activator stays in its path.
pub const POD_STATS_PORT_NAME: &str = "http-autometric";

/// Which sidecar a pod runs, and so how the autoscaler pulls its stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum PodStatsWire {
    /// thaw's sidecar: [`PodStats`] as JSON at [`POD_STATS_PATH`] on the port the private
    /// slices name [`POD_STATS_PORT_NAME`].
    #[default]
    Thaw,
    /// Knative's queue-proxy, on a pod not yet rolled to thaw's sidecar: its protobuf `Stat`
    /// at `/metrics` on its metrics port (`crate::roles::queue_proxy_stat`).
    QueueProxy,
}

/// One pod the autoscaler may pull stats from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StatsTarget {
    /// The pod's name (its endpoint's `targetRef`, else its address).
    pub pod: String,
    /// Where its sidecar serves stats.
    pub addr: std::net::SocketAddr,
    /// How.
    pub wire: PodStatsWire,
}

impl From<(String, std::net::SocketAddr)> for StatsTarget {
    /// A pod running thaw's sidecar.
    fn from((pod, addr): (String, std::net::SocketAddr)) -> Self {
        Self {
            pod,
            addr,
            wire: PodStatsWire::Thaw,
        }
    }
}

/// Where reporters send stats. Implementations never block and are bounded: when the receiver
/// falls behind, stats are dropped and counted, never queued without limit.
pub trait StatSink: Send + Sync + 'static {
    /// Once a second per revision per reporter, zeros included, so idle windows decay.
    fn record(&self, stat: Stat);
    /// At once, on the first request for a revision with no ready endpoints; carries
    /// `average_concurrency >= 1`. The autoscaler decides immediately instead of at its tick.
    fn poke(&self, stat: Stat);
}

/// What travels on the in-process stats channel.
#[derive(Debug, Clone, PartialEq)]
pub enum StatMessage {
    Record(Stat),
    Poke(Stat),
}

/// A [`StatSink`] over a bounded tokio channel: the transport in `thaw local`.
#[derive(Debug, Clone)]
pub struct ChannelStatSink {
    tx: mpsc::Sender<StatMessage>,
    /// Stats that could not be sent (a prometheus counter, so it can be exported as
    /// `thaw_activator_stats_dropped_total`; see [`ChannelStatSink::count_drops_in`]).
    dropped: Counter,
}

impl ChannelStatSink {
    /// Stats that could not be sent because the channel was full or closed.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Counts drops in `counter` (e.g. `Telemetry::activator.stats_dropped`) from now on.
    pub fn count_drops_in(mut self, counter: Counter) -> Self {
        self.dropped = counter;
        self
    }

    fn send(&self, msg: StatMessage) {
        if self.tx.try_send(msg).is_err() {
            self.dropped.inc();
        }
    }
}

impl StatSink for ChannelStatSink {
    fn record(&self, stat: Stat) {
        self.send(StatMessage::Record(stat));
    }

    fn poke(&self, stat: Stat) {
        self.send(StatMessage::Poke(stat));
    }
}

/// A bounded stats channel: the sink for reporters and the receiver for the collector.
pub fn stat_channel(capacity: usize) -> (ChannelStatSink, mpsc::Receiver<StatMessage>) {
    let (tx, rx) = mpsc::channel(capacity);
    (
        ChannelStatSink {
            tx,
            dropped: Counter::default(),
        },
        rx,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_is_clamped_to_the_ceilings() {
        let mut s = Stat {
            revision: RevisionKey::new("ns", "r"),
            source: "pod".into(),
            at: 1,
            average_concurrency: 1e20,
            requests: u64::MAX,
            proxied_concurrency: f64::MAX,
            proxied_requests: u64::MAX,
        };
        assert!(s.clamp());
        assert_eq!(s.average_concurrency, MAX_STAT_CONCURRENCY);
        assert_eq!(s.proxied_concurrency, MAX_STAT_CONCURRENCY);
        assert_eq!(
            (s.requests, s.proxied_requests),
            (MAX_STAT_REQUESTS, MAX_STAT_REQUESTS)
        );
        assert!(!s.clamp(), "clamping twice changes nothing");
        let mut ok = Stat {
            average_concurrency: 3.5,
            requests: 7,
            proxied_concurrency: 1.0,
            proxied_requests: 2,
            ..s
        };
        assert!(!ok.clamp());
    }

    #[tokio::test]
    async fn channel_is_bounded_and_counts_drops() {
        let exported = Counter::default();
        let (sink, mut rx) = stat_channel(1);
        let sink = sink.count_drops_in(exported.clone());
        let stat = Stat {
            revision: RevisionKey::new("ns", "r"),
            source: "a".into(),
            at: 1,
            average_concurrency: 1.0,
            requests: 1,
            proxied_concurrency: 0.0,
            proxied_requests: 0,
        };
        sink.poke(stat.clone());
        sink.record(stat.clone());
        assert_eq!(sink.dropped(), 1);
        assert_eq!(exported.get(), 1, "the exported counter sees the drop");
        assert_eq!(rx.recv().await, Some(StatMessage::Poke(stat)));
    }
}
