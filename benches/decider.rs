//! The autoscaler's cost per decision round: one decision for each of 10,000 revisions, as a
//! 2 s tick does. Target: under 5 ms per round on one core.
//!
//! - `decider/10k`: the pure KPA decision (`Decider::decide`) for 10,000 revisions;
//! - `scaler_tick/10k`: a whole `Scaler::tick` over 10,000 revisions with filled 60 s windows
//!   (window averages, decider, bounds and scale-to-zero rules, ScaleState publish, gauges),
//!   in steady state (no platform call changes anything);
//! - `collector/10k_stats`: ingesting one second of reports for 10,000 revisions.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use thaw::autoscaler::decider::{Decider, Observation};
use thaw::autoscaler::scaler::{ActivatorPath, ScaleStates, Scaler, ScalerOptions};
use thaw::clock;
use thaw::config::AutoscalingSpec;
use thaw::platform::memory::MemoryPlatform;
use thaw::revision::{CatalogSnapshot, RevisionCatalog, RevisionKey, RevisionSpec};
use thaw::stats::{Stat, StatMessage};
use thaw::telemetry::Telemetry;

const REVISIONS: usize = 10_000;

fn name(i: usize) -> String {
    format!("rev-{i:05}")
}

fn load(i: usize, s: u64) -> f64 {
    ((i * 7 + s as usize * 3) % 300) as f64
}

fn bench_decider(c: &mut Criterion) {
    let spec = AutoscalingSpec::default();
    let start = clock::instant_of(1000);
    let mut deciders: Vec<Decider> = (0..REVISIONS)
        .map(|i| Decider::new(&spec, (i % 4) as u32, start))
        .collect();
    let observations: Vec<Observation> = (0..REVISIONS)
        .map(|i| Observation {
            stable: load(i, 0),
            panic: load(i, 1),
            ready: (i % 7) as u32,
            reachable: true,
        })
        .collect();
    let now = clock::instant_of(1002);
    c.bench_function("decider/10k", |b| {
        b.iter(|| {
            for (d, o) in deciders.iter_mut().zip(&observations) {
                black_box(d.decide(&spec, o, now));
            }
        })
    });
}

fn stat(i: usize, s: u64) -> StatMessage {
    StatMessage::Record(Stat {
        revision: RevisionKey::new("bench", name(i)),
        source: Arc::from("activator"),
        at: s,
        average_concurrency: load(i, s),
        requests: 1,
        proxied_concurrency: 0.0,
        proxied_requests: 0,
    })
}

fn scaler() -> (Scaler, tokio::runtime::Runtime) {
    let revisions = (0..REVISIONS).map(|i| RevisionSpec::test("bench", &name(i)));
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(revisions, [])));
    let platform = MemoryPlatform::new();
    let telemetry = Telemetry::new();
    let options = ScalerOptions {
        activator_path: ActivatorPath::Always {
            since: clock::instant_of(0),
        },
        ..ScalerOptions::default()
    };
    let mut scaler = Scaler::new(catalog, platform, ScaleStates::new(), &telemetry, options);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        scaler.sync_catalog(clock::instant_of(1000)).await;
        // A full stable window of history, and the decisions it leads to.
        for s in 1000..1060 {
            for i in 0..REVISIONS {
                scaler.ingest(stat(i, s), clock::instant_of(s));
            }
            if s % 2 == 0 {
                scaler.tick(clock::instant_of(s)).await;
            }
        }
    });
    (scaler, rt)
}

fn bench_scaler(c: &mut Criterion) {
    let (mut scaler, rt) = scaler();
    let now = clock::instant_of(1060);
    rt.block_on(scaler.tick(now));
    c.bench_function("scaler_tick/10k", |b| {
        b.iter(|| rt.block_on(scaler.tick(now)))
    });
    let at = clock::instant_of(1061);
    let stats: Vec<StatMessage> = (0..REVISIONS).map(|i| stat(i, 1061)).collect();
    c.bench_function("collector/10k_stats", |b| {
        b.iter_batched(
            || stats.clone(),
            |stats| {
                for s in stats {
                    black_box(scaler.ingest(s, at));
                }
            },
            criterion::BatchSize::LargeInput,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench_decider, bench_scaler
}
criterion_main!(benches);
