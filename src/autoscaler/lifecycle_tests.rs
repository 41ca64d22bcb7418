//! Bounds and scale-to-zero timing on a virtual clock (seconds from the clock's epoch).

use super::*;
use crate::clock;

fn at(s: u64) -> Instant {
    clock::instant_of(s)
}

fn facts(ready: u32, activator_since: Option<u64>, now: u64) -> Facts {
    Facts {
        ready,
        reachable: true,
        activator_since: activator_since.map(at),
        now: at(now),
    }
}

fn spec() -> AutoscalingSpec {
    AutoscalingSpec::default()
}

/// A lifecycle that has become active at `since` with one ready pod.
fn active_since(s: &AutoscalingSpec, since: u64) -> Lifecycle {
    let mut l = Lifecycle::new(s, true, at(0));
    l.observe(s, 1, &facts(1, Some(0), since));
    assert_eq!(l.activity(), Activity::Active { since: at(since) });
    l
}

#[test]
fn bounds_follow_min_max_and_initial_scale() {
    let mut s = spec();
    s.min_scale = 2;
    s.max_scale = 5;
    let l = Lifecycle::new(&s, true, at(0));
    assert_eq!(l.bounds(&s, true), (2, 5));
    assert_eq!(
        l.bounds(&s, false),
        (0, 5),
        "min-scale ignored when unreachable"
    );
    let f = facts(0, Some(0), 1);
    assert_eq!(l.verdict(&s, 9, &f).want, 5);
    assert_eq!(l.verdict(&s, 0, &f).want, 2);
    // initial-scale > 1 is a floor until the revision has reached it once.
    s.initial_scale = 4;
    let mut l = Lifecycle::new(&s, true, at(0));
    assert_eq!(l.verdict(&s, 1, &f).want, 4);
    l.observe(&s, 4, &facts(4, Some(0), 2));
    assert!(l.initialized());
    assert_eq!(l.verdict(&s, 1, &facts(4, Some(0), 3)).want, 2);
}

#[test]
fn a_revision_starting_at_zero_is_inactive() {
    let mut s = spec();
    s.initial_scale = 0;
    let l = Lifecycle::new(&s, true, at(0));
    assert!(matches!(l.activity(), Activity::Inactive { .. }));
    let l = Lifecycle::new(&spec(), true, at(0));
    assert_eq!(l.activity(), Activity::Activating { since: at(0) });
}

#[test]
fn no_answer_yet_leaves_a_settled_revision_alone_but_bounds_an_activating_one() {
    let mut s = spec();
    let l = active_since(&s, 5);
    let v = l.verdict(&s, -1, &facts(1, Some(0), 6));
    assert_eq!((v.want, v.apply, v.why), (-1, false, Why::NoDecisionYet));
    s.min_scale = 2;
    let l = Lifecycle::new(&s, true, at(0));
    let v = l.verdict(&s, -1, &facts(0, Some(0), 1));
    assert_eq!((v.want, v.apply), (2, true));
}

#[test]
fn scale_to_zero_disabled_keeps_one_pod() {
    let mut s = spec();
    s.enable_scale_to_zero = false;
    let l = active_since(&s, 0);
    let v = l.verdict(&s, 0, &facts(1, Some(0), 1000));
    assert_eq!(
        (v.want, v.apply, v.why),
        (1, true, Why::ScaleToZeroDisabled)
    );
}

#[test]
fn activating_holds_until_the_activation_timeout() {
    let s = spec(); // activation timeout 630s
    let mut l = Lifecycle::new(&s, true, at(10));
    let v = l.verdict(&s, 0, &facts(0, Some(0), 640));
    assert_eq!((v.want, v.apply, v.why), (-1, false, Why::Activating));
    l.observe(&s, v.want, &facts(0, Some(0), 640));
    assert_eq!(l.activity(), Activity::Activating { since: at(10) });
    let v = l.verdict(&s, 0, &facts(0, Some(0), 641));
    assert_eq!((v.want, v.apply, v.why), (0, true, Why::ActivationTimedOut));
    assert!(l.observe(&s, v.want, &facts(0, Some(0), 641)));
    assert_eq!(
        l.activity(),
        Activity::Inactive {
            since: at(641),
            reason: InactiveReason::TimedOut
        }
    );
}

#[test]
fn an_active_revision_keeps_one_pod_for_a_stable_window_then_turns_inactive() {
    let s = spec(); // stable window 60s
    let mut l = active_since(&s, 100);
    let v = l.verdict(&s, 0, &facts(1, Some(0), 159));
    assert_eq!(
        (v.want, v.apply, v.why),
        (1, true, Why::StableWindowNotOver)
    );
    l.observe(&s, v.want, &facts(1, Some(0), 159));
    let v = l.verdict(&s, 0, &facts(1, Some(0), 160));
    assert_eq!((v.want, v.apply, v.why), (0, false, Why::Deactivating));
    assert!(l.observe(&s, v.want, &facts(1, Some(0), 160)));
    // With the activator in the path for longer than the grace period, the pod goes now.
    let v = l.verdict(&s, 0, &facts(1, Some(0), 160));
    assert_eq!((v.want, v.apply, v.why), (0, true, Why::GraceElapsed));
}

#[test]
fn the_grace_period_counts_from_when_the_activator_entered_the_path() {
    let s = spec(); // grace 30s, no retention
    let mut l = active_since(&s, 0);
    assert!(l.observe(&s, 0, &facts(1, Some(100), 100)));
    // The activator entered at 100: wait until 130.
    let v = l.verdict(&s, 0, &facts(1, Some(100), 129));
    assert_eq!((v.apply, v.why), (false, Why::GracePending));
    let v = l.verdict(&s, 0, &facts(1, Some(100), 130));
    assert_eq!((v.apply, v.why), (true, Why::InactiveLongEnough));
    // An activator that entered after the revision turned inactive: its own 30s count.
    let v = l.verdict(&s, 0, &facts(1, Some(120), 129));
    assert_eq!(v.why, Why::GracePending);
    // Without the activator in the path the pod never goes.
    let v = l.verdict(&s, 0, &facts(1, None, 10_000));
    assert_eq!((v.apply, v.why), (false, Why::ActivatorNotInPath));
}

#[test]
fn pod_retention_keeps_the_last_pod_after_going_inactive() {
    let mut s = spec();
    s.scale_to_zero_pod_retention_period = Duration::from_secs(90);
    let mut l = active_since(&s, 0);
    assert!(l.observe(&s, 0, &facts(1, Some(0), 100)));
    let v = l.verdict(&s, 0, &facts(1, Some(0), 189));
    assert_eq!((v.apply, v.why), (false, Why::PodRetention));
    let v = l.verdict(&s, 0, &facts(1, Some(0), 190));
    assert_eq!((v.apply, v.why), (true, Why::InactiveLongEnough));
    // Unreachable revisions skip retention.
    let v = l.verdict(
        &s,
        0,
        &Facts {
            reachable: false,
            ..facts(1, Some(0), 101)
        },
    );
    assert_eq!((v.apply, v.why), (true, Why::GraceElapsed));
    // Retention shorter than grace: after it, the grace period decides.
    s.scale_to_zero_pod_retention_period = Duration::from_secs(10);
    let v = l.verdict(&s, 0, &facts(1, Some(95), 110));
    assert_eq!((v.apply, v.why), (false, Why::GracePending));
    let v = l.verdict(&s, 0, &facts(1, Some(95), 125));
    assert_eq!((v.apply, v.why), (true, Why::GraceElapsed));
}

#[test]
fn traffic_wakes_an_inactive_revision_through_activating() {
    let s = spec();
    let mut l = active_since(&s, 0);
    l.observe(&s, 0, &facts(0, Some(0), 100));
    let v = l.verdict(&s, 1, &facts(0, Some(0), 200));
    assert_eq!((v.want, v.apply, v.why), (1, true, Why::Decided));
    l.observe(&s, v.want, &facts(0, Some(0), 200));
    assert_eq!(l.activity(), Activity::Activating { since: at(200) });
    l.observe(&s, 1, &facts(1, Some(0), 203));
    assert_eq!(l.activity(), Activity::Active { since: at(203) });
    // No decision yet (−1) keeps an inactive revision inactive.
    let mut idle = active_since(&s, 0);
    idle.observe(&s, 0, &facts(1, Some(0), 100));
    assert!(!idle.observe(&s, -1, &facts(1, Some(0), 102)));
    assert!(matches!(idle.activity(), Activity::Inactive { .. }));
}

/// A new leader continues the activity the earlier one recorded (Knative's PodAutoscaler
/// `Active` and its last transition) when the facts agree with it: the stable window of
/// activity, the grace period and the activation timeout run on from the recorded `since`.
#[test]
fn an_adopted_revision_continues_the_recorded_activity() {
    let s = spec();
    let adopt = |ready, replicas, recorded| {
        Lifecycle::adopted(&s, true, ready, Some(replicas), Some(recorded), at(1000))
    };
    // Active for 50 s under the earlier leader: idle for 10 s more, it turns inactive.
    let l = adopt(1, 1, Activity::Active { since: at(950) });
    assert_eq!(l.activity(), Activity::Active { since: at(950) });
    let idle = |now| l.verdict(&s, 0, &facts(1, Some(1000), now)).why;
    assert_eq!(idle(1009), Why::StableWindowNotOver);
    assert_eq!(idle(1010), Why::Deactivating);

    // Inactive for 20 s with its last pod: it goes once inactive for the grace period, though
    // this leader confirmed the activators in its path only at takeover.
    let inactive = Activity::Inactive {
        since: at(980),
        reason: InactiveReason::NoTraffic,
    };
    let l = adopt(1, 1, inactive);
    assert_eq!(l.activity(), inactive);
    let v = |now| l.verdict(&s, 0, &facts(1, Some(1000), now));
    assert_eq!(v(1009).why, Why::GracePending);
    assert_eq!(
        v(1010),
        Verdict {
            want: 0,
            apply: true,
            why: Why::InactiveLongEnough
        }
    );

    // Activating with no pod ready since 500: the activation timeout (630 s) runs out at 1131.
    let l = adopt(0, 1, Activity::Activating { since: at(500) });
    assert_eq!(l.activity(), Activity::Activating { since: at(500) });
    assert_eq!(
        l.verdict(&s, 0, &facts(0, Some(1000), 1131)).why,
        Why::ActivationTimedOut
    );
}

/// A recorded activity the facts contradict (a status write the earlier leader did not make)
/// starts over from now, as with none recorded; a time ahead of this clock is now; an active
/// revision stays active a few seconds into the term however long ago it became active.
#[test]
fn a_recorded_activity_the_facts_contradict_starts_over() {
    let s = spec();
    let adopt = |ready, replicas, recorded: Activity| {
        Lifecycle::adopted(&s, true, ready, Some(replicas), Some(recorded), at(1000)).activity()
    };
    let long_ago = at(10);
    // Recorded active long ago: active for a stable window RESUME_SETTLE into the term, not
    // at once (the new leader's first seconds of stats may miss a reporter).
    let l = Lifecycle::adopted(
        &s,
        true,
        1,
        Some(1),
        Some(Activity::Active { since: long_ago }),
        at(1000),
    );
    assert_eq!(l.activity(), Activity::Active { since: at(946) });
    assert_eq!(
        l.verdict(&s, 0, &facts(1, Some(1000), 1005)).why,
        Why::StableWindowNotOver
    );
    assert_eq!(
        l.verdict(&s, 0, &facts(1, Some(1000), 1006)).why,
        Why::Deactivating
    );
    // Recorded active, found at zero: inactive from now.
    assert_eq!(
        adopt(0, 0, Activity::Active { since: long_ago }),
        Activity::Inactive {
            since: at(1000),
            reason: InactiveReason::NoTraffic
        }
    );
    // Recorded inactive, pods asked for and none ready (a scale-up under way): activating.
    assert_eq!(
        adopt(
            0,
            1,
            Activity::Inactive {
                since: long_ago,
                reason: InactiveReason::NoTraffic
            }
        ),
        Activity::Activating { since: at(1000) }
    );
    // Recorded activating, a pod ready: active from now.
    assert_eq!(
        adopt(1, 1, Activity::Activating { since: long_ago }),
        Activity::Active { since: at(1000) }
    );
    // A recorded time ahead of this replica's clock counts from now.
    assert_eq!(
        adopt(1, 1, Activity::Active { since: at(2000) }),
        Activity::Active { since: at(1000) }
    );
}
