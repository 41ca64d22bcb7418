use std::time::Duration;

use super::*;
use crate::config::Aggregation;

fn key() -> RevisionKey {
    RevisionKey::new("ns", "rev")
}

fn stat(source: &str, at: u64, concurrency: f64) -> Stat {
    Stat {
        revision: key(),
        source: source.into(),
        at,
        average_concurrency: concurrency,
        requests: 0,
        proxied_concurrency: 0.0,
        proxied_requests: 0,
    }
}

fn collector(spec: &AutoscalingSpec) -> Collector {
    let mut c = Collector::new();
    c.watch(&key(), spec, 0);
    c
}

fn stable(c: &Collector, spec: &AutoscalingSpec, now: u64) -> f64 {
    c.observe(&key(), spec, now).expect("data").stable
}

#[test]
fn reporters_in_one_second_add_up() {
    let spec = AutoscalingSpec::default();
    let mut c = collector(&spec);
    c.record(&stat("activator-a", 10, 3.0), 10).unwrap();
    c.record(&stat("activator-b", 10, 4.0), 10).unwrap();
    c.record(&stat("queue-pod-1", 10, 0.5), 10).unwrap();
    let o = c.observe(&key(), &spec, 10).unwrap();
    assert_eq!((o.stable, o.panic), (7.5, 7.5));
}

#[test]
fn one_reporter_twice_in_a_second_replaces_not_adds() {
    let spec = AutoscalingSpec::default();
    let mut c = collector(&spec);
    c.record(&stat("a", 10, 3.0), 10).unwrap();
    c.record(&stat("b", 10, 2.0), 10).unwrap();
    c.record(&stat("a", 10, 5.0), 11).unwrap();
    assert_eq!(stable(&c, &spec, 10), 7.0);
    // The next second is separate.
    c.record(&stat("a", 11, 1.0), 11).unwrap();
    assert_eq!(stable(&c, &spec, 11), (7.0 + 1.0) / 2.0);
    // A late replacement of second 10 still lands in second 10.
    c.record(&stat("a", 10, 0.0), 12).unwrap();
    assert_eq!(stable(&c, &spec, 11), (2.0 + 1.0) / 2.0);
}

#[test]
fn a_poke_is_replaced_by_the_regular_report_of_its_second() {
    let spec = AutoscalingSpec::default();
    let mut c = collector(&spec);
    c.poke(&stat("a", 10, 1.0), 10).unwrap();
    assert_eq!(stable(&c, &spec, 10), 1.0);
    c.record(&stat("a", 10, 0.25), 11).unwrap();
    assert_eq!(stable(&c, &spec, 10), 0.25);
}

#[test]
fn bad_stats_are_rejected_with_a_reason() {
    let spec = AutoscalingSpec::default();
    let mut c = collector(&spec);
    let other = Stat {
        revision: RevisionKey::new("ns", "other"),
        ..stat("a", 10, 1.0)
    };
    assert_eq!(c.record(&other, 10), Err(Rejected::UnknownRevision));
    assert_eq!(c.record(&stat("a", 10, -1.0), 10), Err(Rejected::Invalid));
    assert_eq!(
        c.record(&stat("a", 10, f64::NAN), 10),
        Err(Rejected::Invalid)
    );
    assert_eq!(
        c.record(&stat("a", 13, 1.0), 10),
        Err(Rejected::FromTheFuture)
    );
    assert!(c.record(&stat("a", 12, 1.0), 10).is_ok());
    assert_eq!(c.record(&stat("a", 3, 1.0), 20), Err(Rejected::TooLate));
    assert!(c.record(&stat("a", 4, 1.0), 20).is_ok());
    assert_eq!(Rejected::TooLate.label(), "too_late");
}

#[test]
fn no_data_differs_from_zero_load() {
    let spec = AutoscalingSpec::default();
    let mut c = collector(&spec);
    assert_eq!(c.observe(&key(), &spec, 5), None, "never reported");
    c.record(&stat("a", 5, 0.0), 5).unwrap();
    assert_eq!(
        c.observe(&key(), &spec, 5),
        Some(Observed {
            stable: 0.0,
            panic: 0.0
        })
    );
    // More than a stable window (60s) without any report.
    assert!(c.observe(&key(), &spec, 65).is_some());
    assert_eq!(c.observe(&key(), &spec, 66), None);
    c.forget(&key());
    assert!(!c.contains(&key()));
    assert_eq!(c.observe(&key(), &spec, 5), None);
}

#[test]
fn the_spec_picks_metric_and_aggregation() {
    let mut spec = AutoscalingSpec {
        metric: Metric::Rps,
        ..AutoscalingSpec::default()
    };
    let mut c = collector(&spec);
    c.record(
        &Stat {
            requests: 40,
            proxied_concurrency: 0.0,
            proxied_requests: 0,
            ..stat("a", 1, 2.0)
        },
        1,
    )
    .unwrap();
    assert_eq!(stable(&c, &spec, 1), 40.0);
    spec.metric = Metric::Concurrency;
    assert_eq!(stable(&c, &spec, 1), 2.0);
    spec.aggregation = Aggregation::WeightedExponential;
    // One bucket weighted α = 0.2 (60s window); the 6s panic window has α ≈ 0.78.
    let o = c.observe(&key(), &spec, 1).unwrap();
    assert!((o.stable - 0.4).abs() < 1e-9, "{}", o.stable);
    assert!(o.panic > 1.5 && o.panic < 1.6, "{}", o.panic);
}

#[test]
fn window_sizes_follow_the_spec() {
    let mut spec = AutoscalingSpec::default();
    let mut c = collector(&spec);
    for s in 0..10 {
        c.record(&stat("a", s, if s < 5 { 10.0 } else { 0.0 }), s)
            .unwrap();
    }
    // Panic window of 6s: seconds 4..=9 hold 10, 0, 0, 0, 0, 0.
    assert_eq!(c.observe(&key(), &spec, 9).unwrap().panic, 1.666666);
    spec.panic_window = Duration::from_secs(2);
    spec.stable_window = Duration::from_secs(6);
    c.watch(&key(), &spec, 9);
    let o = c.observe(&key(), &spec, 9).unwrap();
    assert_eq!((o.stable, o.panic), (1.666666, 0.0));
}

#[test]
fn sources_are_bounded_and_silent_ones_make_room() {
    let spec = AutoscalingSpec::default();
    let mut c = collector(&spec);
    for i in 0..MAX_SOURCES {
        c.record(&stat(&format!("s{i}"), 10, 1.0), 10).unwrap();
    }
    assert_eq!(
        c.record(&stat("one-too-many", 10, 1.0), 10),
        Err(Rejected::TooManySources)
    );
    assert_eq!(stable(&c, &spec, 10), MAX_SOURCES as f64);
    // Once the others have been silent for LATE_SECONDS, a new source fits.
    let later = 10 + LATE_SECONDS + 1;
    assert!(c.record(&stat("newcomer", later, 1.0), later).is_ok());
}

/// A pod's stat counts only the share that did not come through an activator (the activator
/// reports that share itself): 5 in the pod, 3 of them proxied, plus the activator's 3 = 5.
/// A proxied share larger than the whole is rejected.
#[test]
fn the_proxied_share_of_pod_stats_is_not_counted_twice() {
    let spec = AutoscalingSpec::default();
    let mut c = collector(&spec);
    c.record(
        &Stat {
            requests: 10,
            proxied_concurrency: 3.0,
            proxied_requests: 6,
            ..stat("pod-1", 1, 5.0)
        },
        1,
    )
    .unwrap();
    c.record(&stat("activator", 1, 3.0), 1).unwrap();
    assert_eq!(stable(&c, &spec, 1), 5.0);
    let bad = Stat {
        proxied_concurrency: 6.0,
        ..stat("pod-2", 1, 5.0)
    };
    assert_eq!(c.record(&bad, 1), Err(Rejected::Invalid));
    let bad = Stat {
        requests: 1,
        proxied_requests: 2,
        ..stat("pod-2", 1, 5.0)
    };
    assert_eq!(c.record(&bad, 1), Err(Rejected::Invalid));
}

#[test]
fn the_open_second_is_not_a_gap_for_a_one_second_panic_window() {
    // A 10 s stable window: a 1 s panic window. Reporters send second s during s + 1.
    let spec = AutoscalingSpec {
        stable_window: Duration::from_secs(10),
        panic_window: Duration::from_secs(1),
        ..AutoscalingSpec::default()
    };
    let mut c = collector(&spec);
    for s in 1..=5 {
        c.record(&stat("activator", s, 5.0), s + 1).unwrap();
    }
    let o = c.observe(&key(), &spec, 6).unwrap();
    assert_eq!(
        (o.stable, o.panic),
        (5.0, 5.0),
        "read up to the closed second 5"
    );
    // Once something is recorded for the current second, it counts.
    c.record(&stat("poke", 6, 9.0), 6).unwrap();
    assert_eq!(c.observe(&key(), &spec, 6).unwrap().panic, 9.0);
}
