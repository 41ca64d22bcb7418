//! The decider's rules one by one, then sequences on a virtual clock (seconds of
//! [`crate::clock`], so the 2-second delay slots line up with the test's seconds).

use std::time::Duration;

use super::*;

fn at(s: u64) -> Instant {
    clock::instant_of(s)
}

fn obs(stable: f64, panic: f64, ready: u32) -> Observation {
    Observation {
        stable,
        panic,
        ready,
        reachable: true,
    }
}

/// Knative's defaults: target 70 (100 × 0.7), TBC 211, panic at 200%, 60s stable window.
fn spec() -> AutoscalingSpec {
    AutoscalingSpec::default()
}

#[test]
fn desired_is_the_stable_average_over_the_target_rounded_up() {
    let s = spec();
    let mut d = Decider::new(&s, 3, at(0));
    let mut d1 = Decider::new(&s, 1, at(0));
    // A fresh decider with 3 ready pods panics; use one with a single pod for the plain rule.
    assert!(d.panicking());
    let r = d1.decide(&s, &obs(150.0, 150.0, 3), at(2));
    assert_eq!((r.desired, r.desired_stable, r.panicking), (3, 3, false));
    let r = d1.decide(&s, &obs(140.0, 140.0, 3), at(4));
    assert_eq!(r.desired, 2);
    let r = d.decide(&s, &obs(0.0, 0.0, 0), at(2));
    assert_eq!(r.desired_stable, 0);
}

#[test]
fn scale_up_is_limited_by_max_scale_up_rate() {
    let mut s = spec();
    s.max_scale_up_rate = 2.0;
    let mut d = Decider::new(&s, 0, at(0));
    // ceil(2 × 2) = 4 pods at most from 2 ready.
    let r = d.decide(&s, &obs(700.0, 0.0, 2), at(2));
    assert_eq!(r.desired, 4);
    // From zero ready pods the base is 1: ceil(2 × 1) = 2.
    let r = d.decide(&s, &obs(700.0, 0.0, 0), at(4));
    assert_eq!(r.desired, 2);
    // A rate of 1.1 still allows one more pod: ceil(1.1 × 3) = 4.
    s.max_scale_up_rate = 1.1;
    let r = d.decide(&s, &obs(700.0, 0.0, 3), at(6));
    assert_eq!(r.desired, 4);
}

#[test]
fn scale_down_is_limited_by_max_scale_down_rate_when_reachable() {
    let s = spec();
    let mut d = Decider::new(&s, 1, at(0));
    // floor(10 / 2) = 5 pods at least.
    let r = d.decide(&s, &obs(0.0, 0.0, 10), at(2));
    assert_eq!(r.desired, 5);
    let unreachable = Observation {
        reachable: false,
        ..obs(0.0, 0.0, 10)
    };
    let r = d.decide(&s, &unreachable, at(4));
    assert_eq!(r.desired, 0);
}

#[test]
fn activation_scale_raises_a_non_zero_answer() {
    let mut s = spec();
    s.activation_scale = 3;
    let mut d = Decider::new(&s, 0, at(0));
    let r = d.decide(&s, &obs(1.0, 1.0, 0), at(2));
    assert_eq!((r.desired_stable, r.desired_panic, r.desired), (3, 3, 3));
    let r = d.decide(&s, &obs(0.0, 0.0, 0), at(4));
    assert_eq!(r.desired, 0, "zero stays zero");
    let r = d.decide(&s, &obs(400.0, 400.0, 3), at(6));
    assert_eq!(r.desired, 6, "above activation scale: unchanged");
}

#[test]
fn panic_threshold_compares_the_unclamped_panic_count() {
    let mut s = spec();
    s.max_scale_up_rate = 1.5;
    let mut d = Decider::new(&s, 1, at(0));
    // dppc = ceil(700 / 70) = 10 ≥ 2 × 1 ready, though the answer is capped at ceil(1.5) = 2.
    let r = d.decide(&s, &obs(70.0, 700.0, 1), at(2));
    assert!(r.panicking);
    assert_eq!((r.desired_panic, r.desired), (2, 2));
}

#[test]
fn panic_takes_the_larger_of_stable_and_panic() {
    let s = spec();
    let mut d = Decider::new(&s, 1, at(0));
    // dppc = ceil(141 / 70) = 3 over 1 ready pod: panic.
    let r = d.decide(&s, &obs(70.0, 141.0, 1), at(2));
    assert_eq!((r.panicking, r.desired_stable, r.desired), (true, 1, 3));
    // Still panicking, the stable answer is the larger one now.
    let r = d.decide(&s, &obs(400.0, 141.0, 3), at(4));
    assert_eq!((r.panicking, r.desired), (true, 6));
}

#[test]
fn panic_never_scales_down_and_ends_a_stable_window_after_the_last_surge() {
    let s = spec();
    let mut d = Decider::new(&s, 1, at(0));
    assert!(d.decide(&s, &obs(70.0, 350.0, 1), at(10)).panicking);
    assert_eq!(d.decide(&s, &obs(70.0, 350.0, 1), at(10)).desired, 5);
    // Load falls: not over the threshold, but the panic holds the 5 pods.
    let r = d.decide(&s, &obs(70.0, 70.0, 5), at(12));
    assert_eq!((r.panicking, r.desired), (true, 5));
    // A new surge refreshes the panic clock at 50.
    let r = d.decide(&s, &obs(70.0, 700.0, 5), at(50));
    assert_eq!((r.panicking, r.desired), (true, 10));
    // 50 + 60 = 110 is not before 110: still panicking, still 10.
    let r = d.decide(&s, &obs(70.0, 70.0, 10), at(110));
    assert_eq!((r.panicking, r.desired), (true, 10));
    // After 110 the first calm decision ends the panic: back to the stable answer (bounded
    // by max-scale-down-rate: floor(10 / 2) = 5).
    let r = d.decide(&s, &obs(70.0, 70.0, 10), at(112));
    assert_eq!((r.panicking, r.desired), (false, 5));
}

#[test]
fn leaving_panic_forgets_its_maximum() {
    let s = spec();
    let mut d = Decider::new(&s, 1, at(0));
    d.decide(&s, &obs(0.0, 700.0, 1), at(2));
    let r = d.decide(&s, &obs(0.0, 0.0, 1), at(64));
    assert!(!r.panicking);
    // A new panic starts from its own maximum, not the old 10.
    let r = d.decide(&s, &obs(0.0, 210.0, 1), at(66));
    assert_eq!((r.panicking, r.desired), (true, 3));
}

#[test]
fn scale_down_delay_holds_the_maximum_of_the_delay() {
    let mut s = spec();
    s.scale_down_delay = Duration::from_secs(10);
    let mut d = Decider::new(&s, 1, at(0));
    let r = d.decide(&s, &obs(350.0, 0.0, 5), at(0));
    assert_eq!((r.desired, r.delayed), (5, false));
    for t in [2, 4, 6, 8] {
        let r = d.decide(&s, &obs(70.0, 0.0, 5), at(t));
        assert_eq!((r.desired, r.delayed), (5, true), "t={t}");
    }
    // 10s after the 5 was decided it leaves the window: the plain answer, 1 pod raised to
    // floor(5 / 2) = 2 by max-scale-down-rate.
    let r = d.decide(&s, &obs(70.0, 0.0, 5), at(10));
    assert_eq!((r.desired, r.delayed), (2, false));
    // Unreachable revisions are not delayed.
    let mut d = Decider::new(&s, 1, at(0));
    d.decide(&s, &obs(350.0, 0.0, 5), at(0));
    let r = d.decide(
        &s,
        &Observation {
            reachable: false,
            ..obs(0.0, 0.0, 5)
        },
        at(2),
    );
    assert_eq!(r.desired, 0);
}

#[test]
fn a_changed_scale_down_delay_applies_at_once() {
    let mut s = spec();
    s.scale_down_delay = Duration::from_secs(60);
    let mut d = Decider::new(&s, 1, at(0));
    d.decide(&s, &obs(350.0, 0.0, 5), at(0));
    assert_eq!(d.decide(&s, &obs(70.0, 0.0, 5), at(2)).desired, 5);
    // Knative keeps the 60s window; here a 4s delay drops the 5 as soon as it is 4s old.
    s.scale_down_delay = Duration::from_secs(4);
    assert_eq!(d.decide(&s, &obs(70.0, 0.0, 5), at(4)).desired, 2);
    // Turning the delay off applies the plain answer at once (a 4s delay would hold the 2).
    s.scale_down_delay = Duration::ZERO;
    assert_eq!(d.decide(&s, &obs(0.0, 0.0, 2), at(6)).desired, 1);
    // And turning it on again starts a new window.
    s.scale_down_delay = Duration::from_secs(4);
    assert_eq!(d.decide(&s, &obs(350.0, 0.0, 5), at(8)).desired, 5);
    assert_eq!(d.decide(&s, &obs(0.0, 0.0, 5), at(10)).desired, 5);
}

#[test]
fn excess_burst_capacity_uses_the_real_ready_count() {
    let mut s = spec();
    let mut d = Decider::new(&s, 1, at(0));
    // floor(2 × 100 − 211 − 50.5) = −62
    assert_eq!(
        d.decide(&s, &obs(50.0, 50.5, 2), at(2))
            .excess_burst_capacity,
        -62
    );
    // Zero pods: floor(0 − 211 − 0) = −211 (not max(1, ready)).
    assert_eq!(
        d.decide(&s, &obs(0.0, 0.0, 0), at(4)).excess_burst_capacity,
        -211
    );
    // Enough pods: floor(3 × 100 − 211 − 10) = 79.
    assert_eq!(
        d.decide(&s, &obs(10.0, 10.0, 3), at(6))
            .excess_burst_capacity,
        79
    );
    s.target_burst_capacity = 0.0;
    assert_eq!(
        d.decide(&s, &obs(0.0, 500.0, 0), at(8))
            .excess_burst_capacity,
        0
    );
    s.target_burst_capacity = -1.0;
    assert_eq!(
        d.decide(&s, &obs(0.0, 0.0, 9), at(10))
            .excess_burst_capacity,
        -1
    );
}

#[test]
fn a_new_decider_with_several_ready_pods_starts_in_panic_holding_them() {
    let s = spec();
    let mut d = Decider::new(&s, 4, at(100));
    assert!(d.panicking());
    // No load (history lost): the panic keeps the 4 pods for a stable window.
    let r = d.decide(&s, &obs(0.0, 0.0, 4), at(102));
    assert_eq!((r.panicking, r.desired), (true, 4));
    let r = d.decide(&s, &obs(0.0, 0.0, 4), at(160));
    assert_eq!((r.panicking, r.desired), (true, 4));
    let r = d.decide(&s, &obs(0.0, 0.0, 4), at(162));
    assert_eq!((r.panicking, r.desired), (false, 2));
    // With one or no pod it starts calm.
    assert!(!Decider::new(&s, 1, at(0)).panicking());
    assert!(!Decider::new(&s, 0, at(0)).panicking());
}
