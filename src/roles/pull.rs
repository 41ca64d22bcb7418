//! The autoscaler's pod-stats puller: each second, for each revision whose pods serve stats
//! (their private slices carry the port [`crate::stats::POD_STATS_PORT_NAME`]), it GETs
//! [`crate::stats::POD_STATS_PATH`] from a sample of the ready pods, as Knative's scraper
//! does: all pods up to 3, else ceil(N·X/(N+X−1)) with X = 1.96²·100/5² (about 16 at most),
//! sums them, scales by N/n and records one stat for the revision. The proxied share is
//! scaled alike; the collector subtracts it (the activators report those requests).
//! Pods that still run Knative's queue-proxy (a cluster moved from Knative Serving, before
//! their revision rolls to thaw's sidecar; the platform tells them by their spec,
//! [`crate::stats::PodStatsWire`]) are pulled as Knative's autoscaler scrapes them: `GET
//! /metrics` on their metrics port with `Accept: application/protobuf`, the answer Knative's
//! protobuf `Stat` ([`super::queue_proxy_stat`]); the rest of the sample is the same, so a
//! revision may mix both kinds of pod.
//! Revisions with `target-burst-capacity: -1` are not pulled (the activator is always in
//! their path and reports everything). The pull is the autoscaler's own initiative: no
//! credential lives in user namespaces.
//!
//! Pod stats degrade per revision, never globally ([`PullOptions`] holds the figures):
//! - a revision's sample is pulled concurrently, under one deadline (800 ms after its tick)
//!   and a short connect timeout (250 ms); a pod that has not answered by then counts as
//!   failed and the stat is made of the pods that did;
//! - the ticker never waits for a sample: each revision's result is recorded when its own
//!   sample ends (stamped with the second the tick sampled), and a revision whose previous
//!   sample is still in flight is skipped for that tick (at most one sample per revision in
//!   flight);
//! - pulls in flight across all revisions are bounded ([`PullOptions::max_in_flight`]); a pull
//!   that finds no free slot before its revision's deadline fails as `busy`. Idle kept-alive
//!   connections are at most one per pod pulled (a pod is never pulled twice at once) and close
//!   after 30 s unused.
//!
//! Whether a revision's pod stats flow ([`PodStatsFlow::flows`]: a successful sample within
//! the last 3 s) decides whether the serving-mode swap may take the activator out of its path;
//! only the revision whose stats stopped returns to the activators.
//!
//! Why a revision's stats do not flow, for the autoscaler's admin `/revisions`:
//! - [`PodStatsFlow::health`]`(key) -> Option<`[`StatsHealth`]`>`: `None` while the stats flow
//!   (or the revision is not pulled: no ready pod serving stats, or `target-burst-capacity:
//!   -1`); else the last success, since when it has been failing and the last failed sample
//!   ([`SampleFailure`]: pulls by [`PullFailure`] cause). [`StatsHealth::reason`] (also its
//!   `Display`) is one line, e.g. `pod stats: 3 of 3 pulls timed out (failing for 12 s)`.
//! - [`PodStatsFlow::stale`]: every such revision with its health, one pass over the revisions
//!   pulled (no allocation for the others).
//!
//! Revisions that leave the catalog, or stop being pulled, are forgotten at the next tick.
//! Metrics (`telemetry::remote`): `thaw_autoscaler_pod_stats_pulls_total{result}` per pull,
//! `thaw_autoscaler_pod_stats_stale_revisions` (the count [`PodStatsFlow::stale`] lists, as of
//! the last tick) and `thaw_autoscaler_pod_stats_sample_seconds` per revision's sample.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use dashmap::DashMap;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::seq::IndexedRandom;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::{Duration, Instant, MissedTickBehavior, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::mesh::{Mesh, Reach, SERVICE_PULL_TRIES};
use super::queue_proxy_stat::{self, KnativeStat};
use crate::platform::kubernetes::KubePlatform;
use crate::revision::{RevisionCatalog, RevisionKey};
use crate::stats::{
    POD_STATS_PATH, POD_STATS_PORT_NAME, PodStats, PodStatsWire, Stat, StatMessage, StatsTarget,
};
use crate::telemetry::remote::RemoteMetrics;

/// The source name of pulled stats (Knative's `service-scraper`).
pub const SOURCE: &str = "pod-stats";
/// Pod stats count as flowing while the last successful sample is this recent.
const FLOWING_FOR: Duration = Duration::from_secs(3);
/// The longest pod-stats answer read.
const BODY_LIMIT: usize = 64 * 1024;

/// Knative's sample size for a population of `n` pods.
pub fn sample_size(n: usize) -> usize {
    if n <= 3 {
        return n;
    }
    let x = 1.96f64 * 1.96 * 100.0 / 25.0;
    let nf = n as f64;
    ((nf * x) / (nf + x - 1.0)).ceil() as usize
}

/// The puller's timings and bounds. [`run`] uses the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullOptions {
    /// How often each revision is sampled (1 s).
    pub tick: Duration,
    /// The longest one revision's whole sample may take from its tick (800 ms): connect,
    /// waiting for a slot, answer and body.
    pub deadline: Duration,
    /// The longest one TCP connect may take (250 ms).
    pub connect_timeout: Duration,
    /// Pulls in flight at once across all revisions (1,024).
    pub max_in_flight: usize,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            tick: Duration::from_secs(1),
            deadline: Duration::from_millis(800),
            connect_timeout: Duration::from_millis(250),
            max_in_flight: 1024,
        }
    }
}

/// Where the puller finds a revision's pods: name, stats address and sidecar of each ready pod
/// that serves stats. The Kubernetes platform reads them from the private EndpointSlices and
/// its pod watch.
pub trait StatsTargets: Send + Sync + 'static {
    fn stats_targets(&self, revision: &RevisionKey) -> Vec<StatsTarget>;

    /// The one address the revision's pods are pulled through, when they are not pulled at
    /// their own (its private Service, `super::mesh`).
    fn through(&self, _revision: &RevisionKey) -> Option<SocketAddr> {
        None
    }

    /// Told of each ended sample: whether it went [`StatsTargets::through`] the Service, and
    /// how its pulls ended.
    fn sampled(
        &self,
        _revision: &RevisionKey,
        _through: bool,
        _results: &[Result<PodStats, PullFailure>],
    ) {
    }
}

/// The Kubernetes platform's targets under mesh-compatibility-mode (`super::mesh`): the pods,
/// or their private Service. Under `auto`, a sample whose every pull was refused as a mesh
/// refuses plain text is tried through the Service next; a successful sample decides.
pub struct MeshTargets {
    pub platform: KubePlatform,
    pub mesh: Arc<Mesh>,
    /// Revisions whose next sample tries the Service (`auto`).
    trying: DashMap<RevisionKey, ()>,
}

impl MeshTargets {
    pub fn new(platform: KubePlatform, mesh: Arc<Mesh>) -> Self {
        Self {
            platform,
            mesh,
            trying: DashMap::new(),
        }
    }
}

impl StatsTargets for MeshTargets {
    fn stats_targets(&self, revision: &RevisionKey) -> Vec<StatsTarget> {
        self.platform.stats_targets(revision)
    }

    fn through(&self, revision: &RevisionKey) -> Option<SocketAddr> {
        let service = || self.mesh.service_addr(revision, POD_STATS_PORT_NAME);
        match self.mesh.reach(revision) {
            Reach::Service => service(),
            Reach::Unknown if self.trying.contains_key(revision) => service(),
            _ => None,
        }
    }

    fn sampled(
        &self,
        revision: &RevisionKey,
        through: bool,
        results: &[Result<PodStats, PullFailure>],
    ) {
        if self.mesh.reach(revision) != Reach::Unknown {
            return;
        }
        let answered = results.iter().any(Result::is_ok);
        if through {
            self.trying.remove(revision);
            if answered {
                self.mesh.decide(revision, Reach::Service);
            }
        } else if answered {
            self.mesh.decide(revision, Reach::Pods);
        } else if !results.is_empty()
            && results
                .iter()
                .all(|r| matches!(r, Err(f) if f.mesh_refused()))
        {
            self.trying.insert(revision.clone(), ());
        }
    }
}

impl StatsTargets for KubePlatform {
    fn stats_targets(&self, revision: &RevisionKey) -> Vec<StatsTarget> {
        KubePlatform::stats_targets(self, revision)
    }
}

/// `(pod name, address)` pairs of pods running thaw's sidecar, or whole [`StatsTarget`]s
/// (tests and benchmarks).
impl<F, T> StatsTargets for F
where
    F: Fn(&RevisionKey) -> Vec<T> + Send + Sync + 'static,
    T: Into<StatsTarget>,
{
    fn stats_targets(&self, revision: &RevisionKey) -> Vec<StatsTarget> {
        self(revision).into_iter().map(Into::into).collect()
    }
}

/// Why one pull (one pod's stats) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullFailure {
    /// No whole answer before the revision's deadline.
    Timeout,
    /// The connection was refused or not made within the connect timeout.
    Connect,
    /// The pod answered with this status instead of 200.
    Status(u16),
    /// The answer was not valid pod stats (or too long).
    Rejected,
    /// The connection failed after it was made (reset, closed early).
    Error,
    /// No free pull slot before the deadline ([`PullOptions::max_in_flight`]).
    Busy,
}

impl PullFailure {
    /// Whether the pull was refused as a mesh refuses plain text (502 or 503, or the
    /// connection lost before an answer).
    pub fn mesh_refused(self) -> bool {
        matches!(self, Self::Error | Self::Status(502 | 503))
    }

    /// The `result` label of `thaw_autoscaler_pod_stats_pulls_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Connect => "connect",
            Self::Status(_) => "status",
            Self::Rejected => "rejected",
            Self::Error => "error",
            Self::Busy => "busy",
        }
    }
}

impl fmt::Display for PullFailure {
    /// What the pulls did, after "N pulls": `timed out`, `answered 503`, ...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("timed out"),
            Self::Connect => f.write_str("could not connect"),
            Self::Status(code) => write!(f, "answered {code}"),
            Self::Rejected => f.write_str("returned invalid stats"),
            Self::Error => f.write_str("lost the connection"),
            Self::Busy => f.write_str("found no free pull slot"),
        }
    }
}

/// A revision's sample in which no pull succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleFailure {
    /// Pods pulled (all failed).
    pub pulls: usize,
    /// The failed pulls by cause, commonest first.
    pub causes: Vec<(PullFailure, usize)>,
    /// When the sample ended.
    pub at: Instant,
}

impl SampleFailure {
    fn new(failures: impl IntoIterator<Item = PullFailure>, at: Instant) -> Self {
        let mut causes: Vec<(PullFailure, usize)> = Vec::new();
        for f in failures {
            match causes.iter_mut().find(|(c, _)| *c == f) {
                Some((_, n)) => *n += 1,
                None => causes.push((f, 1)),
            }
        }
        causes.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        let pulls = causes.iter().map(|(_, n)| n).sum();
        Self { pulls, causes, at }
    }
}

impl fmt::Display for SampleFailure {
    /// `3 of 3 pulls timed out`, or `3 of 3 pulls failed (2 timed out, 1 could not connect)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.causes.as_slice() {
            [(cause, n)] => write!(f, "{n} of {} pulls {cause}", self.pulls),
            causes => {
                write!(f, "{} of {} pulls failed (", self.pulls, self.pulls)?;
                for (i, (cause, n)) in causes.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{n} {cause}")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// Why a pulled revision's pod stats are not flowing ([`PodStatsFlow::health`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsHealth {
    /// The last successful sample (`None`: none since the revision was first pulled).
    pub last_success: Option<Instant>,
    /// Since when the stats have not been arriving: the first failed sample after the last
    /// success, else the last success, else the first pull.
    pub since: Instant,
    /// The last failed sample (`None` when no sample has ended since the last success).
    pub last_failure: Option<SampleFailure>,
}

impl StatsHealth {
    /// One line for an operator, e.g. `pod stats: 3 of 3 pulls timed out (failing for 12 s)`.
    pub fn reason(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for StatsHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.since.elapsed().as_secs();
        match &self.last_failure {
            Some(failure) => write!(f, "pod stats: {failure} (failing for {secs} s)"),
            None => write!(f, "pod stats: no sample ended in {secs} s"),
        }
    }
}

/// One pulled revision's record.
#[derive(Debug)]
struct Entry {
    /// When it was first pulled (since it was last forgotten).
    tracked: Instant,
    last_success: Option<Instant>,
    /// The first failed sample after the last success.
    failing_since: Option<Instant>,
    last_failure: Option<SampleFailure>,
    /// The puller's last tick that saw the revision (to forget the others).
    seen: u64,
}

impl Entry {
    fn flows(&self, now: Instant) -> bool {
        self.last_success
            .is_some_and(|t| now.saturating_duration_since(t) <= FLOWING_FOR)
    }

    /// `Some` when the stats do not flow and that is news: a sample failed, or none succeeded
    /// within [`FLOWING_FOR`] of the first pull.
    fn health(&self, now: Instant) -> Option<StatsHealth> {
        if self.flows(now)
            || (self.last_failure.is_none()
                && now.saturating_duration_since(self.tracked) <= FLOWING_FOR)
        {
            return None;
        }
        Some(StatsHealth {
            last_success: self.last_success,
            since: self
                .failing_since
                .or(self.last_success)
                .unwrap_or(self.tracked),
            last_failure: self.last_failure.clone(),
        })
    }
}

/// Per pulled revision: when its pod stats last arrived, and why they did not since.
#[derive(Debug, Default)]
pub struct PodStatsFlow {
    revisions: DashMap<RevisionKey, Entry>,
}

impl PodStatsFlow {
    /// Whether `revision`'s pod stats arrived within the last few seconds.
    pub fn flows(&self, revision: &RevisionKey) -> bool {
        self.revisions
            .get(revision)
            .is_some_and(|e| e.flows(Instant::now()))
    }

    /// Why `revision`'s pod stats are not flowing; `None` while they flow, while its first
    /// sample is young, or when it is not pulled.
    pub fn health(&self, revision: &RevisionKey) -> Option<StatsHealth> {
        self.revisions
            .get(revision)
            .and_then(|e| e.health(Instant::now()))
    }

    /// Every pulled revision whose pod stats are not flowing, with why (one pass).
    pub fn stale(&self) -> Vec<(RevisionKey, StatsHealth)> {
        let now = Instant::now();
        self.revisions
            .iter()
            .filter_map(|e| e.health(now).map(|h| (e.key().clone(), h)))
            .collect()
    }

    fn stale_count(&self) -> usize {
        let now = Instant::now();
        self.revisions
            .iter()
            .filter(|e| e.health(now).is_some())
            .count()
    }

    /// The puller sees `revision` at tick `generation`.
    fn see(&self, revision: &RevisionKey, generation: u64) {
        match self.revisions.get_mut(revision) {
            Some(mut e) => e.seen = generation,
            None => {
                self.revisions.insert(
                    revision.clone(),
                    Entry {
                        tracked: Instant::now(),
                        last_success: None,
                        failing_since: None,
                        last_failure: None,
                        seen: generation,
                    },
                );
            }
        }
    }

    /// Forgets the revisions the tick `generation` did not see.
    fn forget_unseen(&self, generation: u64) {
        self.revisions.retain(|_, e| e.seen == generation);
    }

    fn succeeded(&self, revision: &RevisionKey, at: Instant) {
        if let Some(mut e) = self.revisions.get_mut(revision) {
            e.last_success = Some(at);
            e.failing_since = None;
            e.last_failure = None;
        }
    }

    fn failed(&self, revision: &RevisionKey, failure: SampleFailure) {
        if let Some(mut e) = self.revisions.get_mut(revision) {
            e.failing_since.get_or_insert(failure.at);
            e.last_failure = Some(failure);
        }
    }
}

/// Pulls every second until `stop`, recording into `stats` (the scaler's channel), with the
/// default [`PullOptions`].
pub async fn run<T: StatsTargets>(
    targets: T,
    catalog: Arc<RevisionCatalog>,
    stats: mpsc::Sender<StatMessage>,
    flow: Arc<PodStatsFlow>,
    metrics: RemoteMetrics,
    stop: CancellationToken,
) {
    run_with(
        PullOptions::default(),
        targets,
        catalog,
        stats,
        flow,
        metrics,
        stop,
    )
    .await
}

type PullClient = Client<HttpConnector, Empty<Bytes>>;

/// One revision's ended sample.
struct Sampled {
    key: RevisionKey,
    population: usize,
    /// The second the sample is for.
    at: u64,
    started: Instant,
    /// Pulled through the private Service.
    through: bool,
    results: Vec<Result<PodStats, PullFailure>>,
}

/// [`run`] with other timings (tests and benchmarks).
pub async fn run_with<T: StatsTargets>(
    options: PullOptions,
    targets: T,
    catalog: Arc<RevisionCatalog>,
    stats: mpsc::Sender<StatMessage>,
    flow: Arc<PodStatsFlow>,
    metrics: RemoteMetrics,
    stop: CancellationToken,
) {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(options.connect_timeout));
    connector.set_nodelay(true);
    let client: PullClient = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector);
    let slots = Arc::new(Semaphore::new(options.max_in_flight.max(1)));
    // Ticks at the clock's whole seconds, as the activators' reporters do: a sample covers the
    // second that just closed, and reaches the scaler before its decisions half a second on.
    let first = crate::clock::next_at_offset(Instant::now(), Duration::ZERO);
    let mut tick = tokio::time::interval_at(first, options.tick);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let source: Arc<str> = Arc::from(SOURCE);
    // At most one sample per revision in flight: the revisions in `samples`, by task.
    let mut samples: JoinSet<Sampled> = JoinSet::new();
    let mut in_flight: HashMap<Id, RevisionKey> = HashMap::new();
    let mut busy: HashSet<RevisionKey> = HashSet::new();
    let mut generation = 0u64;
    let ended = |done: Result<(Id, Sampled), JoinError>,
                 in_flight: &mut HashMap<Id, RevisionKey>,
                 busy: &mut HashSet<RevisionKey>| {
        let id = match &done {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        if let Some(key) = in_flight.remove(&id) {
            busy.remove(&key);
        }
        if let Ok((_, sampled)) = done {
            targets.sampled(&sampled.key, sampled.through, &sampled.results);
            record(sampled, &source, &stats, &flow, &metrics);
        }
    };
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            Some(done) = samples.join_next_with_id(), if !samples.is_empty() => {
                ended(done, &mut in_flight, &mut busy);
                continue;
            }
            _ = tick.tick() => {}
        }
        while let Some(done) = samples.try_join_next_with_id() {
            ended(done, &mut in_flight, &mut busy);
        }
        generation += 1;
        let span = tracing::debug_span!("pull_tick", generation, started = tracing::field::Empty);
        let _enter = span.enter();
        let at = crate::clock::now_second().saturating_sub(1);
        let deadline = Instant::now() + options.deadline;
        let mut started = 0usize;
        for spec in catalog.load().revisions() {
            if spec.autoscaling.target_burst_capacity < 0.0 {
                continue;
            }
            let key = &spec.key;
            if busy.contains(key) {
                // Its last sample has not ended: skip this tick, keep its record.
                flow.see(key, generation);
                continue;
            }
            let pods = targets.stats_targets(key);
            if pods.is_empty() {
                continue;
            }
            flow.see(key, generation);
            let n = sample_size(pods.len());
            let through = targets.through(key);
            // Through the Service: pulled `n` times there instead.
            let addrs: Vec<(SocketAddr, PodStatsWire)> = match through {
                Some(_) => Vec::new(),
                None => pods
                    .sample(&mut rand::rng(), n)
                    .map(|t| (t.addr, t.wire))
                    .collect(),
            };
            let (client, slots, metrics) = (client.clone(), slots.clone(), metrics.clone());
            let (key, population) = (key.clone(), pods.len());
            let handle = samples.spawn(
                async move {
                    let started = Instant::now();
                    let results = if let Some(service) = through {
                        sample_through(&client, &slots, service, n, deadline, &metrics).await
                    } else {
                        sample(&client, &slots, &addrs, deadline, &metrics).await
                    };
                    Sampled {
                        key,
                        population,
                        at,
                        started,
                        through: through.is_some(),
                        results,
                    }
                }
                .instrument(tracing::debug_span!("pull", revision = %spec.key)),
            );
            in_flight.insert(handle.id(), spec.key.clone());
            busy.insert(spec.key.clone());
            started += 1;
        }
        flow.forget_unseen(generation);
        metrics.stale_revisions.set(flow.stale_count() as i64);
        span.record("started", started);
    }
}

/// Records one revision's ended sample: its stat when a pull succeeded, its failure if none.
fn record(
    sampled: Sampled,
    source: &Arc<str>,
    stats: &mpsc::Sender<StatMessage>,
    flow: &PodStatsFlow,
    metrics: &RemoteMetrics,
) {
    let now = Instant::now();
    metrics
        .sample_seconds
        .observe(now.saturating_duration_since(sampled.started).as_secs_f64());
    let got: Vec<&PodStats> = sampled
        .results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .collect();
    if got.is_empty() {
        let failures = sampled
            .results
            .iter()
            .filter_map(|r| r.as_ref().err().copied());
        flow.failed(&sampled.key, SampleFailure::new(failures, now));
        return;
    }
    flow.succeeded(&sampled.key, now);
    let scale = sampled.population as f64 / got.len() as f64;
    let sum = |f: fn(&PodStats) -> f64| got.iter().map(|s| f(s)).sum::<f64>() * scale;
    let stat = Stat {
        revision: sampled.key,
        source: source.clone(),
        at: sampled.at,
        average_concurrency: sum(|s| s.average_concurrency),
        requests: sum(|s| s.requests as f64).round() as u64,
        proxied_concurrency: sum(|s| s.proxied_concurrency),
        proxied_requests: sum(|s| s.proxied_requests as f64).round() as u64,
    };
    let _ = stats.try_send(StatMessage::Record(stat));
}

/// Pulls every address at once, each its own way and under `deadline`; counts each outcome.
async fn sample(
    client: &PullClient,
    slots: &Semaphore,
    addrs: &[(SocketAddr, PodStatsWire)],
    deadline: Instant,
    metrics: &RemoteMetrics,
) -> Vec<Result<PodStats, PullFailure>> {
    futures::future::join_all(addrs.iter().map(|&(addr, wire)| async move {
        let result = match timeout_at(deadline, slots.acquire()).await {
            Ok(Ok(_slot)) => timeout_at(deadline, pull(client, addr, wire))
                .await
                .unwrap_or(Err(PullFailure::Timeout)),
            _ => Err(PullFailure::Busy),
        };
        metrics.pulled(result.as_ref().err().map_or("ok", |f| f.label()));
        result
    }))
    .await
}

/// [`sample`] through one address standing for several pods (a private Service, whose
/// sidecars are taken to be thaw's): the Service is pulled once per pod sampled (`n`), each
/// on a new connection, up to
/// [`SERVICE_PULL_TRIES`] times until it reaches a pod no other pull of the sample reached, as
/// Knative's scraper does; a slot that only found pods already sampled counts as its last
/// failure, or as [`PullFailure::Rejected`] when every try answered.
async fn sample_through(
    client: &PullClient,
    slots: &Semaphore,
    addr: SocketAddr,
    n: usize,
    deadline: Instant,
    metrics: &RemoteMetrics,
) -> Vec<Result<PodStats, PullFailure>> {
    let seen = std::sync::Mutex::new(HashSet::<String>::new());
    let seen = &seen;
    futures::future::join_all((0..n).map(|_| async move {
        let mut last = Err(PullFailure::Rejected);
        for _ in 0..SERVICE_PULL_TRIES {
            let result = match timeout_at(deadline, slots.acquire()).await {
                Ok(Ok(_slot)) => {
                    timeout_at(deadline, pull_with(client, addr, PodStatsWire::Thaw, true))
                        .await
                        .unwrap_or(Err(PullFailure::Timeout))
                }
                _ => Err(PullFailure::Busy),
            };
            metrics.pulled(result.as_ref().err().map_or("ok", |f| f.label()));
            match result {
                Ok(stats) => {
                    if seen
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(stats.pod.clone())
                    {
                        return Ok(stats);
                    }
                }
                Err(f @ (PullFailure::Timeout | PullFailure::Busy)) => return Err(f),
                Err(f) => last = Err(f),
            }
        }
        last
    }))
    .await
}

async fn pull(
    client: &PullClient,
    addr: SocketAddr,
    wire: PodStatsWire,
) -> Result<PodStats, PullFailure> {
    pull_with(client, addr, wire, false).await
}

/// One pull, as the pod's sidecar (`wire`) serves its stats; `close`: on a connection of its
/// own (`Connection: close`).
async fn pull_with(
    client: &PullClient,
    addr: SocketAddr,
    wire: PodStatsWire,
    close: bool,
) -> Result<PodStats, PullFailure> {
    let (path, limit) = match wire {
        PodStatsWire::Thaw => (POD_STATS_PATH, BODY_LIMIT),
        PodStatsWire::QueueProxy => (queue_proxy_stat::PATH, queue_proxy_stat::BODY_LIMIT),
    };
    let mut req = Request::get(format!("http://{addr}{path}"));
    if wire == PodStatsWire::QueueProxy {
        req = req.header(http::header::ACCEPT, queue_proxy_stat::PROTOBUF);
    }
    if close {
        req = req.header(http::header::CONNECTION, "close");
    }
    let req = req.body(Empty::new()).map_err(|_| PullFailure::Error)?;
    let resp = client.request(req).await.map_err(|e| {
        if e.is_connect() {
            PullFailure::Connect
        } else {
            PullFailure::Error
        }
    })?;
    if resp.status() != StatusCode::OK {
        return Err(PullFailure::Status(resp.status().as_u16()));
    }
    // Knative's scraper refuses any other media type (queue-proxy answers Prometheus text to a
    // client that does not ask for protobuf).
    if wire == PodStatsWire::QueueProxy
        && resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes())
            != Some(queue_proxy_stat::PROTOBUF.as_bytes())
    {
        return Err(PullFailure::Rejected);
    }
    let body = Limited::new(resp.into_body(), limit)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                PullFailure::Rejected
            } else {
                PullFailure::Error
            }
        })?
        .to_bytes();
    if wire == PodStatsWire::QueueProxy {
        return KnativeStat::decode_body(&body)
            .and_then(|s| s.to_pod_stats())
            .map_err(|_| PullFailure::Rejected);
    }
    let s: PodStats = serde_json::from_slice(&body).map_err(|_| PullFailure::Rejected)?;
    let valid = s.average_concurrency.is_finite()
        && s.average_concurrency >= 0.0
        && s.proxied_concurrency.is_finite()
        && (0.0..=s.average_concurrency).contains(&s.proxied_concurrency)
        && s.proxied_requests <= s.requests;
    if valid {
        Ok(s)
    } else {
        Err(PullFailure::Rejected)
    }
}

#[cfg(test)]
#[path = "pull_tests.rs"]
mod tests;
