//! Cold start of one real replica through the local platform: `scale(rev, 1)` until the ready
//! snapshot arrives, with the release `thaw sample-app` as the replica.
//!
//! Besides criterion's figure, prints the medians of the total, of the replica's own
//! spawn-to-ready time as the platform measured it (`last_startup`), and of their difference
//! (what the platform adds around the replica's start-up: spawn bookkeeping and publishing).

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use thaw::platform::local::{
    LocalOptions, LocalPlatform, LocalRevision, LogSink, ProbeOptions, Stream,
};
use thaw::platform::{EndpointSource, Platform};
use thaw::revision::RevisionKey;
use thaw::telemetry::platform::PlatformMetrics;
use tokio::time::Instant;

/// Drops replica output: the bench measures the platform, not the terminal.
struct Quiet;
impl LogSink for Quiet {
    fn line(&self, _: &RevisionKey, _: u32, _: Stream, _: &str) {}
    fn suppressed(&self, _: &RevisionKey, _: u32, _: Stream, _: u64) {}
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn cold_start(c: &mut Criterion) {
    cold_start_with(c, "default_probe", ProbeOptions::default());
    // Probing every 50 us: the difference to the default probe's spawn-to-ready is how late
    // the default backoff notices a replica that started listening.
    cold_start_with(
        c,
        "eager_probe_50us",
        ProbeOptions {
            initial_backoff: Duration::from_micros(50),
            early_cap: Duration::from_micros(50),
            max_backoff: Duration::from_micros(50),
            ..ProbeOptions::default()
        },
    );
}

fn cold_start_with(c: &mut Criterion, name: &str, probe: ProbeOptions) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let platform = LocalPlatform::new(
        LocalOptions {
            thaw_exe: env!("CARGO_BIN_EXE_thaw").into(),
            log_sink: Arc::new(Quiet),
            probe,
            ..LocalOptions::default()
        },
        PlatformMetrics::default(),
    );
    let key = RevisionKey::new("default", "bench-00001");
    platform.upsert(LocalRevision::new(key.clone(), ["thaw", "sample-app"]));
    let mut totals = Vec::new();
    let mut startups = Vec::new();

    let mut group = c.benchmark_group("platform_local");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(10));
    group.bench_function(format!("scale_0_to_1_until_ready_snapshot/{name}"), |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let mut rx = platform.endpoints(&key);
                    let t0 = Instant::now();
                    platform.scale(&key, 1).await.unwrap();
                    let snap = rx.wait_for(|s| !s.ready.is_empty()).await.unwrap().clone();
                    let total = t0.elapsed();
                    timed += total;
                    totals.push(total);
                    startups.push(platform.status(&key).unwrap().last_startup.unwrap());
                    // Stop outside the timed part: drain at once, wait for the process to go.
                    platform.scale(&key, 0).await.unwrap();
                    platform.drained(&key, snap.ready[0]);
                    rx.wait_for(|s| s.terminating.is_empty()).await.unwrap();
                    while !platform.status(&key).unwrap().replicas.is_empty() {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                timed
            })
        })
    });
    group.finish();
    let mut overhead: Vec<Duration> = totals
        .iter()
        .zip(&startups)
        .map(|(t, s)| t.saturating_sub(*s))
        .collect();
    eprintln!(
        "{name}: cold starts: {}; median total {:?}, median replica spawn-to-ready {:?}, median platform-added {:?}",
        totals.len(),
        median(&mut totals),
        median(&mut startups),
        median(&mut overhead)
    );
    rt.block_on(platform.shutdown());
}

criterion_group!(benches, cold_start);
criterion_main!(benches);
