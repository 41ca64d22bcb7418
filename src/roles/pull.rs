//! The autoscaler's pod-stats puller: each second, for each revision whose pods serve stats
//! (their private slices carry the port [`crate::stats::POD_STATS_PORT_NAME`]), it GETs
//! [`crate::stats::POD_STATS_PATH`] from a sample of the ready pods, as Knative's scraper
//! does: all pods up to 3, else ceil(N·X/(N+X−1)) with X = 1.96²·100/5² (about 16 at most),
//! sums them, scales by N/n and records one stat for the revision. The proxied share is
//! scaled alike; the collector subtracts it (the activators report those requests).
//! Revisions with `target-burst-capacity: -1` are not pulled (the activator is always in
//! their path and reports everything). The pull is the autoscaler's own initiative: no
//! credential lives in user namespaces.
//!
//! Whether a revision's pod stats flow ([`PodStatsFlow::flows`]) decides whether the
//! serving-mode swap may take the activator out of its path.

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
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant, MissedTickBehavior, timeout};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::platform::kubernetes::KubePlatform;
use crate::revision::{RevisionCatalog, RevisionKey};
use crate::stats::{POD_STATS_PATH, PodStats, Stat, StatMessage};
use crate::telemetry::remote::RemoteMetrics;

/// The source name of pulled stats (Knative's `service-scraper`).
pub const SOURCE: &str = "pod-stats";
/// One pull's longest wait.
const PULL_TIMEOUT: Duration = Duration::from_millis(900);
/// Pod stats count as flowing while the last successful pull is this recent.
const FLOWING_FOR: Duration = Duration::from_secs(3);

/// Knative's sample size for a population of `n` pods.
pub fn sample_size(n: usize) -> usize {
    if n <= 3 {
        return n;
    }
    let x = 1.96f64 * 1.96 * 100.0 / 25.0;
    let nf = n as f64;
    ((nf * x) / (nf + x - 1.0)).ceil() as usize
}

/// When each revision's pod stats last arrived.
#[derive(Debug, Default)]
pub struct PodStatsFlow {
    last: DashMap<RevisionKey, Instant>,
}

impl PodStatsFlow {
    /// Whether `revision`'s pod stats arrived within the last few seconds.
    pub fn flows(&self, revision: &RevisionKey) -> bool {
        self.last
            .get(revision)
            .is_some_and(|t| t.elapsed() <= FLOWING_FOR)
    }
}

/// Pulls every second until `stop`, recording into `stats` (the scaler's channel).
pub async fn run(
    platform: KubePlatform,
    catalog: Arc<RevisionCatalog>,
    stats: mpsc::Sender<StatMessage>,
    flow: Arc<PodStatsFlow>,
    metrics: RemoteMetrics,
    stop: CancellationToken,
) {
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build_http();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let source: Arc<str> = Arc::from(SOURCE);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut round = tokio::task::JoinSet::new();
        for spec in catalog.load().revisions() {
            if spec.autoscaling.target_burst_capacity < 0.0 {
                continue;
            }
            let targets = platform.stats_targets(&spec.key);
            if targets.is_empty() {
                continue;
            }
            let n = sample_size(targets.len());
            let sample: Vec<(String, SocketAddr)> =
                targets.sample(&mut rand::rng(), n).cloned().collect();
            let (client, key, metrics) = (client.clone(), spec.key.clone(), metrics.clone());
            let population = targets.len();
            round.spawn(
                async move {
                    let mut got = Vec::new();
                    for (_pod, addr) in &sample {
                        match pull(&client, *addr).await {
                            Ok(s) => {
                                metrics.pulled("ok");
                                got.push(s);
                            }
                            Err(result) => metrics.pulled(result),
                        }
                    }
                    (key, population, got)
                }
                .instrument(tracing::debug_span!("pull", revision = %spec.key)),
            );
        }
        let at = crate::clock::now_second().saturating_sub(1);
        while let Some(done) = round.join_next().await {
            let Ok((key, population, got)) = done else {
                continue;
            };
            if got.is_empty() {
                continue;
            }
            flow.last.insert(key.clone(), Instant::now());
            let scale = population as f64 / got.len() as f64;
            let sum = |f: fn(&PodStats) -> f64| got.iter().map(f).sum::<f64>() * scale;
            let stat = Stat {
                revision: key,
                source: source.clone(),
                at,
                average_concurrency: sum(|s| s.average_concurrency),
                requests: sum(|s| s.requests as f64).round() as u64,
                proxied_concurrency: sum(|s| s.proxied_concurrency),
                proxied_requests: sum(|s| s.proxied_requests as f64).round() as u64,
            };
            let _ = stats.try_send(StatMessage::Record(stat));
        }
    }
}

async fn pull(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
) -> Result<PodStats, &'static str> {
    let req = Request::get(format!("http://{addr}{POD_STATS_PATH}"))
        .body(Empty::new())
        .map_err(|_| "error")?;
    let resp = timeout(PULL_TIMEOUT, client.request(req))
        .await
        .map_err(|_| "timeout")?
        .map_err(|_| "error")?;
    if resp.status() != StatusCode::OK {
        return Err("error");
    }
    let body = timeout(
        PULL_TIMEOUT,
        Limited::new(resp.into_body(), 64 * 1024).collect(),
    )
    .await
    .map_err(|_| "timeout")?
    .map_err(|_| "error")?
    .to_bytes();
    let s: PodStats = serde_json::from_slice(&body).map_err(|_| "rejected")?;
    let valid = s.average_concurrency.is_finite()
        && s.average_concurrency >= 0.0
        && s.proxied_concurrency.is_finite()
        && (0.0..=s.average_concurrency).contains(&s.proxied_concurrency)
        && s.proxied_requests <= s.requests;
    if valid { Ok(s) } else { Err("rejected") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_sizes_are_knatives() {
        assert_eq!(sample_size(0), 0);
        assert_eq!(sample_size(3), 3);
        assert_eq!(sample_size(10), 7);
        assert_eq!(sample_size(100), 14);
        assert!(sample_size(100_000) <= 16);
    }
}
