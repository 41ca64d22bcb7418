//! Pods held for many lightly used containerConcurrency-1 revisions, with the activators in
//! their path (two activators, Knative's defaults otherwise): each revision needs one pod for
//! its load, and nothing else should raise that. Prints the total.

mod autoscaler_common;

use std::sync::Arc;

use autoscaler_common::{harness, key, revision, stat};
use thaw::autoscaler::scaler::{ActivatorPath, InPath, Trigger};
use thaw::clock;
use thaw::platform::memory::MemoryPlatform;
use thaw::stats::StatMessage;

const REVISIONS: usize = 1000;

#[tokio::test(start_paused = true)]
async fn a_thousand_light_cc1_revisions_hold_one_pod_each() {
    let names: Vec<String> = (0..REVISIONS).map(|i| format!("light-{i:04}")).collect();
    let revisions = names
        .iter()
        .map(|n| {
            let mut r = revision(n, |_| {});
            r.container_concurrency = 1;
            let mut a = (*r.autoscaling).clone();
            a.container_concurrency = 1;
            a.total_value = 1.0;
            a.target_value = 0.7;
            r.autoscaling = Arc::new(a);
            r
        })
        .collect();
    let platform = MemoryPlatform::new();
    let in_path = Arc::new(InPath::default());
    let mut h = harness(
        revisions,
        platform.clone(),
        ActivatorPath::Confirmed(in_path.clone()),
    );
    for n in &names {
        in_path.confirm(&key(n), clock::instant_of(0));
    }
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    // A request every few seconds each: an average concurrency of 0.2 through the activators.
    for s in 1000..1180u64 {
        let now = clock::instant_of(s);
        for n in &names {
            let k = key(n);
            let replicas = platform.replicas(&k).unwrap_or(0);
            platform.set_ready(&k, replicas as usize);
            if let Some(poked) = h.scaler.ingest(StatMessage::Record(stat(n, s, 0.2)), now) {
                h.scaler.decide(&poked, Trigger::Poke, now).await;
            }
        }
        if s.is_multiple_of(2) {
            h.scaler.tick(now).await;
        }
    }
    let held: u32 = names
        .iter()
        .map(|n| platform.replicas(&key(n)).unwrap_or(0))
        .sum();
    println!("pods held for {REVISIONS} light cc=1 revisions: {held}");
    assert_eq!(held, REVISIONS as u32, "one pod per revision");
}
