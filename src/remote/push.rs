//! The activator's side of the stats push: [`HttpStatSink`], a [`StatSink`] that never blocks
//! the request path (a bounded queue; what does not fit is dropped and counted) and a task
//! that sends each second's records as one batch, and each poke at once, to the autoscaler
//! leader it learns from the Lease (`holderIdentity` is the leader's stats address).
//!
//! The queue's bound follows the number of revisions that may report: the reporter sends one
//! record per revision each second, all at once, and a cold revision a poke besides, so a fixed
//! bound drops whole seconds of records once the activator knows more revisions than it holds.
//! It holds [`SINK_SECONDS`] seconds of a record and a poke per revision the catalog knows
//! (re-read each second), and never less than [`SINK_FLOOR`].
//!
//! A POST per batch over a kept-alive connection (hyper's pooled client) rather than one
//! long-lived streaming request: docs/benchmarks.md ("Stats push") has the comparison. A 503
//! (not the leader) or a failed send is retried once if the Lease names another leader by then,
//! else the batch is dropped and counted: stats are a stream of 1 s samples, and the next one
//! supersedes it. A push refused (401) with the current token is sent again with the token it
//! replaced, while that one is in its grace period ([`super::token`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, watch};
use tokio::time::{Duration, timeout};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::token::{Token, Tokens};
use super::wire::{CONTENT_TYPE, MAX_BATCH_BYTES, STATS_PATH, StatsBatch, WireStat};
use crate::stats::{StatMessage, StatSink};
use crate::telemetry::remote::RemoteMetrics;

/// The least the sink holds before dropping, however few revisions there are.
pub const SINK_FLOOR: usize = 16 * 1024;
/// Seconds of reports (a record and a poke per revision) the sink holds.
pub const SINK_SECONDS: usize = 3;
/// How often the bound is brought in line with the number of revisions.
const RESIZE_EVERY: Duration = Duration::from_secs(1);
/// The longest one push may take.
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the sender waits for more records of the same second before sending the batch.
const GATHER: Duration = Duration::from_millis(5);

/// What the sink holds for `revisions` revisions that may report.
pub fn capacity_for(revisions: usize) -> usize {
    revisions.saturating_mul(2 * SINK_SECONDS).max(SINK_FLOOR)
}

/// The queue's occupancy and bound, shared by the sink's clones and the sender.
#[derive(Debug)]
struct Room {
    queued: AtomicUsize,
    capacity: AtomicUsize,
}

impl Room {
    /// A place for one message, if the queue is below its bound.
    fn take(&self) -> bool {
        let cap = self.capacity.load(Ordering::Relaxed);
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < cap).then_some(q + 1)
            })
            .is_ok()
    }

    /// One message left the queue.
    fn give(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A [`StatSink`] that pushes to the autoscaler leader. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HttpStatSink {
    tx: mpsc::UnboundedSender<StatMessage>,
    room: Arc<Room>,
    dropped: Counter,
}

impl HttpStatSink {
    fn send(&self, m: StatMessage) {
        if !self.room.take() {
            self.dropped.inc();
            return;
        }
        if self.tx.send(m).is_err() {
            self.room.give();
            self.dropped.inc();
        }
    }

    /// Messages the sink holds now, and its bound.
    pub fn occupancy(&self) -> (usize, usize) {
        (
            self.room.queued.load(Ordering::Acquire),
            self.room.capacity.load(Ordering::Relaxed),
        )
    }
}

impl StatSink for HttpStatSink {
    fn record(&self, stat: crate::stats::Stat) {
        self.send(StatMessage::Record(stat));
    }

    fn poke(&self, stat: crate::stats::Stat) {
        self.send(StatMessage::Poke(stat));
    }
}

/// The sink and the receiving end of its queue, bounded for `revisions()` (the sender task's
/// part; [`start`] wires both).
fn sink(revisions: &(dyn Fn() -> usize + Send + Sync), dropped: Counter) -> (HttpStatSink, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    let room = Arc::new(Room {
        queued: AtomicUsize::new(0),
        capacity: AtomicUsize::new(capacity_for(revisions())),
    });
    let sink = HttpStatSink {
        tx,
        room: room.clone(),
        dropped,
    };
    (sink, Inbox { rx, room })
}

/// The sender's end of the sink's queue: each message taken gives its place back.
struct Inbox {
    rx: mpsc::UnboundedReceiver<StatMessage>,
    room: Arc<Room>,
}

impl Inbox {
    async fn recv(&mut self) -> Option<StatMessage> {
        let m = self.rx.recv().await;
        if m.is_some() {
            self.room.give();
        }
        m
    }

    /// Brings the bound in line with `revisions` revisions.
    fn resize(&self, revisions: usize) {
        let cap = capacity_for(revisions);
        if self.room.capacity.swap(cap, Ordering::Relaxed) != cap {
            tracing::debug!(
                revisions,
                capacity = cap,
                "stats sink bound follows the revisions"
            );
        }
    }
}

/// Where and how to push.
pub struct PushSettings {
    /// The leader's stats address (`host:port`), `None` while there is none.
    pub leader: watch::Receiver<Option<String>>,
    /// The token in force (and, for a push refused with it, the one it replaced).
    pub token: Tokens,
    /// This activator's name (the stats' source).
    pub source: String,
    pub metrics: RemoteMetrics,
    /// Counts stats dropped before sending (`thaw_activator_stats_dropped_total`).
    pub dropped: Counter,
    /// How many revisions may report now (the catalog's size): the sink's bound follows it.
    pub revisions: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// Starts the sender task; returns the sink. The task ends on `stop` or when every sink clone
/// is dropped.
pub fn start(settings: PushSettings, stop: CancellationToken) -> HttpStatSink {
    let (sink, inbox) = sink(&*settings.revisions, settings.dropped.clone());
    tokio::spawn(run(settings, inbox, stop).instrument(tracing::info_span!("stats_push")));
    sink
}

async fn run(settings: PushSettings, mut rx: Inbox, stop: CancellationToken) {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build_http();
    let mut resize = tokio::time::interval(RESIZE_EVERY);
    resize.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return,
            _ = resize.tick() => {
                rx.resize((settings.revisions)());
                continue;
            }
            m = rx.recv() => match m { Some(m) => m, None => return },
        };
        let mut batch = Vec::new();
        let mut poked = push_into(&mut batch, first);
        // A poke goes at once; records of one second arrive together: gather them.
        while !poked {
            match timeout(GATHER, rx.recv()).await {
                Ok(Some(m)) => poked = push_into(&mut batch, m),
                Ok(None) | Err(_) => break,
            }
            if batch.len() >= 50_000 {
                break;
            }
        }
        let bodies = encode(&settings.source, batch, MAX_BATCH_BYTES);
        if bodies.len() > 1 {
            settings
                .metrics
                .batch_splits
                .inc_by(bodies.len() as u64 - 1);
            tracing::debug!(
                parts = bodies.len(),
                "stats batch split below the receiver's limit"
            );
        }
        for body in bodies {
            send(&client, &settings, body).await;
        }
    }
}

/// The batch as request bodies of at most `limit` bytes each: one body normally, halves
/// (recursively) when the whole would pass the receiver's limit (a single stat, whose names
/// are bounded by Kubernetes', always fits).
fn encode(source: &str, stats: Vec<WireStat>, limit: usize) -> Vec<Bytes> {
    let body = StatsBatch {
        source: source.to_string(),
        stats,
    };
    let bytes = serde_json::to_vec(&body).expect("stats serialize");
    if bytes.len() <= limit || body.stats.len() <= 1 {
        return vec![Bytes::from(bytes)];
    }
    let mut first = body.stats;
    let second = first.split_off(first.len() / 2);
    let mut out = encode(source, first, limit);
    out.extend(encode(source, second, limit));
    out
}

/// Adds a message to the batch; true for a poke (send now).
fn push_into(batch: &mut Vec<WireStat>, m: StatMessage) -> bool {
    match m {
        StatMessage::Record(s) => {
            batch.push(WireStat::from_stat(&s, false));
            false
        }
        StatMessage::Poke(s) => {
            batch.push(WireStat::from_stat(&s, true));
            true
        }
    }
}

async fn send(client: &Client<HttpConnector, Full<Bytes>>, s: &PushSettings, body: Bytes) {
    let mut tried: Option<String> = None;
    for _ in 0..2 {
        let Some(leader) = s.leader.borrow().clone() else {
            s.metrics.pushed("no_leader");
            return;
        };
        if tried.as_ref() == Some(&leader) {
            break;
        }
        let Some(token) = s.token.current() else {
            s.metrics.pushed("no_token");
            return;
        };
        let mut result = post(client, &leader, &token, body.clone()).await;
        // The leader may not have seen a rotation yet: the previous token is still good there.
        if result == "unauthorized"
            && let Some(previous) = s.token.previous()
        {
            result = post(client, &leader, &previous, body.clone()).await;
        }
        s.metrics.pushed(result);
        if result == "ok" || result == "unauthorized" || result == "rejected" {
            if result != "ok" {
                tracing::warn!(leader = %leader, result, "stats push refused");
            }
            return;
        }
        tracing::debug!(leader = %leader, result, "stats push failed");
        tried = Some(leader);
    }
}

async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    leader: &str,
    token: &Token,
    body: Bytes,
) -> &'static str {
    let Ok(req) = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{leader}{STATS_PATH}"))
        .header(header::AUTHORIZATION, token.header())
        .header(header::CONTENT_TYPE, CONTENT_TYPE)
        .body(Full::new(body))
    else {
        return "error";
    };
    match timeout(PUSH_TIMEOUT, client.request(req)).await {
        Err(_) => "timeout",
        Ok(Err(_)) => "error",
        Ok(Ok(resp)) => match resp.status() {
            StatusCode::ACCEPTED | StatusCode::OK => "ok",
            StatusCode::SERVICE_UNAVAILABLE => "not_leader",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "rejected",
            _ => "error",
        },
    }
}

impl HttpStatSink {
    /// Stats dropped before sending.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::revision::RevisionKey;
    use crate::stats::Stat;

    fn stat(i: usize) -> Stat {
        Stat {
            revision: RevisionKey::new("ns", format!("r-{i}")),
            source: "activator-1".into(),
            at: 1,
            average_concurrency: 0.0,
            requests: 0,
            proxied_concurrency: 0.0,
            proxied_requests: 0,
        }
    }

    /// A second's reports of 50,000 revisions (one record each, all at once, as the reporter
    /// sends them) all fit, with a poke each besides; past the bound they are dropped and
    /// counted. The bound follows the revisions when their number changes, and never goes
    /// below the floor.
    #[tokio::test]
    async fn the_sink_holds_a_second_of_every_reporting_revision() {
        let revisions = Arc::new(AtomicUsize::new(50_000));
        let count = revisions.clone();
        let (sink, mut inbox) = sink(&move || count.load(Ordering::Relaxed), Counter::default());
        for i in 0..50_000 {
            sink.record(stat(i));
            sink.poke(stat(i));
        }
        assert_eq!(sink.dropped(), 0, "a second of 50,000 revisions");
        assert_eq!(sink.occupancy(), (100_000, 300_000));
        for i in 0..200_001 {
            sink.record(stat(i));
        }
        assert_eq!(sink.dropped(), 1, "past the bound");
        // Taking a message gives its place back.
        assert!(inbox.recv().await.is_some());
        sink.record(stat(0));
        assert_eq!(sink.dropped(), 1);
        // Fewer revisions: the floor.
        inbox.resize(10);
        assert_eq!(sink.occupancy().1, SINK_FLOOR);
        revisions.store(1_000_000, Ordering::Relaxed);
        inbox.resize((*revisions).load(Ordering::Relaxed));
        assert_eq!(sink.occupancy().1, 6_000_000);
    }

    /// A second's stats for 50,000 revisions with long names (about 11 MiB as one batch)
    /// go as several bodies, each under the receiver's limit, with every stat once.
    #[test]
    fn a_large_second_is_split_below_the_receivers_limit() {
        let stats: Vec<WireStat> = (0..50_000)
            .map(|i| WireStat {
                namespace: format!("tenant-{:0>50}", i % 97),
                name: format!("revision-{i:0>54}"),
                concurrency: 1.5,
                requests: 3,
                poke: false,
            })
            .collect();
        let bodies = encode("activator-1", stats.clone(), MAX_BATCH_BYTES);
        assert!(bodies.len() > 1, "one body of an oversize second");
        let mut back = Vec::new();
        for b in &bodies {
            assert!(b.len() <= MAX_BATCH_BYTES, "{} bytes", b.len());
            let batch: StatsBatch = serde_json::from_slice(b).unwrap();
            assert_eq!(batch.source, "activator-1");
            back.extend(batch.stats);
        }
        assert_eq!(back, stats);
        // A small second stays one body.
        assert_eq!(encode("a", stats[..10].to_vec(), MAX_BATCH_BYTES).len(), 1);
    }
}
