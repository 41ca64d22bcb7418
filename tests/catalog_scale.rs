//! Not a check but a measurement (docs/benchmarks.md, "An activator with 10,000 revisions"):
//! an activator following 10,000 Revisions, none of them requested, as `thaw activator` holds
//! them: the Revision watch's follower (each revision's last valid input), the catalog, the
//! Kubernetes platform's per-revision entry, and the activator's table. It prints the RSS per
//! known revision and the time to apply one Revision change (resolve, catalog, platform, and
//! the activator's table following it) at 1,000 and at 10,000 revisions.
//!
//! Uses jemalloc, the `thaw` binary's allocator, so the RSS is what the binary would show. The
//! API server runs in the process but holds no Revision (the follower is fed directly), so its
//! memory does not grow with the count. Run:
//! `cargo test --release --test catalog_scale -- --ignored --nocapture`.

mod kube_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};
use thaw::activator::{Activator, ActivatorDeps, NextHop};
use thaw::config::ActivatorConfig;
use thaw::config::live::LiveConfig;
use thaw::knative::Revision;
use thaw::platform::kubernetes::revisions::Follower;
use thaw::platform::kubernetes::{KubeOptions, KubePlatform};
use thaw::revision::RevisionCatalog;
use thaw::stats::stat_channel;
use thaw::telemetry::Telemetry;
use thaw::telemetry::platform::PlatformMetrics;
use tokio::time::Instant;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A Revision as the controller would write it: one container, labels, a few annotations.
fn revision(i: usize, cc: i64) -> Revision {
    let name = format!("svc{}-{:05}", i / 3, i);
    let mut r = Revision::new(
        &name,
        thaw::knative::RevisionSpec {
            pod_spec: PodSpec {
                containers: vec![Container {
                    name: "user-container".into(),
                    image: Some("example.com/app@sha256:0123456789abcdef".into()),
                    ports: Some(vec![ContainerPort {
                        container_port: 8080,
                        name: Some("http1".into()),
                        ..ContainerPort::default()
                    }]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            },
            container_concurrency: Some(cc),
            timeout_seconds: Some(300),
            ..thaw::knative::RevisionSpec::default()
        },
    );
    r.metadata.namespace = Some(format!("team{}", i % 20));
    r.metadata.labels = Some(BTreeMap::from([
        (
            "serving.knative.dev/service".to_string(),
            format!("svc{}", i / 3),
        ),
        (
            "serving.knative.dev/configuration".to_string(),
            format!("svc{}", i / 3),
        ),
        ("serving.knative.dev/revision".to_string(), name.clone()),
    ]));
    r.metadata.annotations = Some(BTreeMap::from([
        (
            "autoscaling.knative.dev/min-scale".to_string(),
            "0".to_string(),
        ),
        (
            "autoscaling.knative.dev/target".to_string(),
            "50".to_string(),
        ),
    ]));
    r
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Applies `rounds` changes to revisions spread over the first `known` (containerConcurrency
/// `base` or `base + 1`), each followed by the activator's table; returns (median, p99).
fn change_times(
    follower: &mut Follower,
    activator: &Activator,
    known: usize,
    rounds: usize,
    base: i64,
) -> (Duration, Duration) {
    let mut took = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let i = (round * 7919) % known;
        // Each pass over the revisions sets a value the previous pass did not: every change is
        // a real one.
        let rev = revision(i, base + ((round / known) % 2) as i64);
        let start = Instant::now();
        follower.apply(&rev);
        activator.sync();
        took.push(start.elapsed());
    }
    took.sort();
    let q = |f: f64| took[((took.len() as f64 - 1.0) * f) as usize];
    (q(0.5), q(0.99))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn measure_ten_thousand_idle_revisions() {
    let api = kube_support::TestApi::start().await;
    let platform = KubePlatform::start(
        api.client(),
        KubeOptions::default(),
        PlatformMetrics::default(),
    );
    platform.wait_synced().await;
    let catalog = Arc::new(RevisionCatalog::default());
    let (sink, _stats) = stat_channel(1024);
    let activator = Activator::new(ActivatorDeps {
        catalog: catalog.clone(),
        endpoints: Arc::new(platform.clone()),
        stats: Arc::new(sink),
        scale_states: None,
        config: Arc::new(ArcSwap::from_pointee(ActivatorConfig::default())),
        telemetry: Arc::new(Telemetry::new()),
        source_name: "measure".into(),
        next_hop: NextHop::Sidecar,
    });
    let mut follower = Follower::new(
        catalog.clone(),
        platform.clone(),
        LiveConfig::default(),
        PlatformMetrics::default(),
    );
    let add = |follower: &mut Follower, range: std::ops::Range<usize>| {
        for i in range {
            follower.apply(&revision(i, 0));
            activator.sync();
        }
    };
    // Warm the allocator and every lazily built structure before the first reading; memory is
    // read before any change is timed (a change frees the old spec, which jemalloc may keep).
    add(&mut follower, 0..100);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut readings = vec![(100, rss_bytes())];
    for upto in [1_000, 2_500, 5_000, 7_500, 10_000] {
        add(&mut follower, readings.last().unwrap().0..upto);
        readings.push((upto, rss_bytes()));
    }
    assert_eq!(catalog.load().len(), 10_000);
    assert_eq!(activator.revision_counts(), (10_000, 0), "none requested");
    let kib = |(n0, r0): (usize, u64), (n1, r1): (usize, u64)| {
        r1.saturating_sub(r0) as f64 / (n1 - n0) as f64 / 1024.0
    };
    let steps: Vec<String> = readings
        .windows(2)
        .map(|w| format!("{}->{}: {:.2}", w[0].0, w[1].0, kib(w[0], w[1])))
        .collect();
    println!(
        "RSS per known revision: {:.2} KiB over 100 -> 10,000 (steps, KiB: {}); RSS at \
         10,000: {:.1} MiB",
        kib(readings[0], readings[readings.len() - 1]),
        steps.join(", "),
        readings[readings.len() - 1].1 as f64 / 1048576.0
    );
    // The same change at 1,000 (the first 1,000 revisions only) and at 10,000.
    let (med_1k, p99_1k) = change_times(&mut follower, &activator, 1_000, 5_000, 2);
    let (med_10k, p99_10k) = change_times(&mut follower, &activator, 10_000, 5_000, 4);
    println!(
        "one Revision change applied (follower + catalog + platform + activator table): \
         among 1,000 median {med_1k:?} p99 {p99_1k:?}; among 10,000 median {med_10k:?} p99 \
         {p99_10k:?}"
    );
    platform.shutdown();
}
