//! The autoscaler's judgment across leadership terms, on a virtual clock: each term is a new
//! scaler over the same in-memory platform, finding what the earlier term left as the
//! Kubernetes platform reads it back (the Deployment's replicas, `ScaleTargetInitialized`,
//! the serving mode, and the `Active` condition with its last transition), with the
//! activators confirmed in the path at takeover (the serving task's adoption). Knative's
//! default settings: a stable window of 60 s, a grace period of 30 s, no pod retention.
//!
//! The same churn with the activity left out of what a new leader finds is the behaviour
//! before the activity was recorded: every term starts the stable window of activity over, so
//! an idle revision keeps its pod for as long as the churn lasts. It is run too, so the test
//! shows the difference rather than assuming it.

mod autoscaler_common;

use std::sync::Arc;

use autoscaler_common::{harness, key, revision, stat};
use thaw::autoscaler::lifecycle::{Activity, InactiveReason};
use thaw::autoscaler::scaler::{ActivatorPath, InPath, Trigger};
use thaw::clock;
use thaw::platform::memory::MemoryPlatform;
use thaw::platform::{Found, FoundActivity};
use thaw::stats::StatMessage;

const IDLE: &str = "idle";
/// 50 requests in flight on a target of 70 per pod: one pod, steadily.
const BUSY: &str = "busy";
const BUSY_LOAD: f64 = 50.0;
/// The revisions appear at this second (the first term starts here).
const START: u64 = 1000;
/// The churn runs this long: far past a stable window and a grace period.
const CHURN: u64 = 600;

/// What a new leader finds of `name` after `h`'s term: as recorded on the Revision's status
/// when `recorded`, else the activity left out.
fn found_after(h: &autoscaler_common::Harness, name: &str, recorded: bool) -> Found {
    let st = h.states.get(&key(name)).expect("a published state");
    let activity = st.activity.filter(|_| recorded).map(|a| match a {
        Activity::Active { since } => FoundActivity::Active { since },
        Activity::Activating { since } => FoundActivity::Activating { since },
        Activity::Inactive { since, reason } => FoundActivity::Inactive {
            since,
            timed_out: reason == InactiveReason::TimedOut,
        },
    });
    Found {
        replicas: h.platform.replicas(&key(name)),
        initialized: st.initialized,
        activator_in_path: Some(st.activator_in_path),
        activity,
    }
}

/// Runs terms of `period` seconds (the first one `first` long) for [`CHURN`] seconds: every
/// second the pods that were asked for are ready and report (zeros for the idle revision),
/// every even second is a decision round. Returns the second the idle revision reached zero.
async fn churn(period: u64, first: u64, recorded: bool) -> (Option<u64>, Arc<MemoryPlatform>) {
    let platform = MemoryPlatform::new();
    let mut found: Vec<(&str, Found)> = Vec::new();
    let mut term_start = START;
    let mut term_end = START + first;
    let mut at_zero = None;
    while term_start < START + CHURN {
        for (name, f) in &found {
            platform.set_found(&key(name), *f);
        }
        // The serving task of the new term adopts the activators it finds in the path.
        let in_path = Arc::new(InPath::default());
        let mut h = harness(
            vec![revision(IDLE, |_| {}), revision(BUSY, |_| {})],
            platform.clone(),
            ActivatorPath::Confirmed(in_path.clone()),
        );
        h.scaler.sync_catalog(clock::instant_of(term_start)).await;
        for s in term_start..term_end {
            let now = clock::instant_of(s);
            for (name, load) in [(IDLE, 0.0), (BUSY, BUSY_LOAD)] {
                let k = key(name);
                let replicas = h.platform.replicas(&k).unwrap_or(0);
                h.platform.set_ready(&k, replicas as usize);
                if h.states.get(&k).is_some_and(|st| st.activator_in_path) {
                    in_path.confirm(&k, now);
                } else {
                    in_path.clear(&k);
                }
                if replicas > 0
                    && let Some(poked) = h
                        .scaler
                        .ingest(StatMessage::Record(stat(name, s, load)), now)
                {
                    h.scaler.decide(&poked, Trigger::Poke, now).await;
                }
            }
            if s.is_multiple_of(2) {
                h.scaler.tick(now).await;
            }
            if at_zero.is_none() && h.platform.replicas(&key(IDLE)) == Some(0) {
                at_zero = Some(s);
            }
        }
        found = vec![
            (IDLE, found_after(&h, IDLE, recorded)),
            (BUSY, found_after(&h, BUSY, recorded)),
        ];
        term_start = term_end;
        term_end += period;
    }
    (at_zero, platform)
}

/// The replicas each revision was asked for, in order.
fn calls(platform: &MemoryPlatform, name: &str) -> Vec<u32> {
    platform
        .scale_calls()
        .iter()
        .filter(|c| c.revision == key(name))
        .map(|c| c.replicas)
        .collect()
}

/// A leader change every 60 s, the first 30 s after the revisions appear (so no term sees a
/// whole stable window of the idle revision's activity): the idle revision reaches zero, a
/// stable window of activity and the grace period after its pod came up, and neither
/// revision gets a `/scale` call at any takeover. Without the recorded activity it keeps its
/// pod through the ten minutes.
#[tokio::test(start_paused = true)]
async fn an_idle_revision_reaches_zero_with_a_leader_change_every_minute() {
    let (at_zero, platform) = churn(60, 30, true).await;
    let at_zero = at_zero.expect("the idle revision at zero");
    println!(
        "leader change every 60 s: the idle revision at zero {} s after it appeared",
        at_zero - START
    );
    // Active for a stable window from its first decision, then the grace period at most.
    assert!(
        (START + 60..=START + 60 + 30 + 2).contains(&at_zero),
        "{at_zero}"
    );
    assert_eq!(calls(&platform, IDLE), [1, 0], "initial scale, then zero");
    assert_eq!(calls(&platform, BUSY), [1], "initial scale only");

    let (never, platform) = churn(60, 30, false).await;
    assert_eq!(never, None, "without the recorded activity");
    assert_eq!(calls(&platform, IDLE), [1]);
}

/// Faster churn (a term every 25 s) turns the revision inactive in one term and leaves the
/// grace period to the next: it continues from the recorded `Active=False` and its time, so
/// the pod goes a grace period after the revision turned inactive, not a grace period after
/// the takeover confirmed the activators in the path.
#[tokio::test(start_paused = true)]
async fn the_grace_period_continues_across_a_leader_change() {
    let (at_zero, platform) = churn(25, 25, true).await;
    let at_zero = at_zero.expect("the idle revision at zero");
    println!(
        "leader change every 25 s: the idle revision at zero {} s after it appeared",
        at_zero - START
    );
    assert!(
        (START + 60 + 30..=START + 60 + 30 + 2).contains(&at_zero),
        "{at_zero}"
    );
    assert_eq!(calls(&platform, IDLE), [1, 0]);
    assert_eq!(calls(&platform, BUSY), [1]);

    let (never, _) = churn(25, 25, false).await;
    assert_eq!(never, None, "without the recorded activity");
}
