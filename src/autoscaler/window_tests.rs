use std::time::Duration;

use super::*;

fn window(secs: u64) -> Window {
    Window::new(Duration::from_secs(secs))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn bucket_counts_round_up_to_whole_seconds() {
    assert_eq!(buckets_for(Duration::from_secs(60)), 60);
    assert_eq!(buckets_for(Duration::from_millis(5500)), 6);
    assert_eq!(buckets_for(Duration::ZERO), 1);
}

#[test]
fn first_samples_are_not_diluted_by_the_empty_window() {
    let mut w = window(60);
    w.record(100, 10.0);
    assert_eq!(w.linear_average(100), 10.0);
    w.record(101, 20.0);
    assert_eq!(w.linear_average(101), 15.0);
}

#[test]
fn trailing_seconds_without_writes_are_dropped() {
    let mut w = window(60);
    w.record(100, 10.0);
    w.record(101, 20.0);
    // Seconds 102 and 103 have no data yet: still the average of the two samples.
    assert_eq!(w.linear_average(103), 15.0);
}

#[test]
fn gaps_between_writes_count_as_zeros() {
    let mut w = window(60);
    w.record(100, 10.0);
    w.record(103, 20.0);
    assert_eq!(w.linear_average(103), 7.5);
}

#[test]
fn the_window_slides() {
    let mut w = window(3);
    for (s, v) in [(1, 3.0), (2, 6.0), (3, 9.0)] {
        w.record(s, v);
    }
    assert_eq!(w.linear_average(3), 6.0);
    // At second 4 with no write yet, second 1 has left the window and 4 is trailing.
    assert_eq!(w.linear_average(4), 7.5);
    w.record(4, 12.0);
    assert_eq!(w.linear_average(4), 9.0);
}

#[test]
fn an_idle_window_averages_zero_and_restarts_fresh() {
    let mut w = window(6);
    w.record(100, 10.0);
    assert_eq!(w.linear_average(105), 10.0);
    assert_eq!(w.linear_average(106), 0.0);
    assert!(!w.is_empty_at(106));
    assert!(w.is_empty_at(107));
    // A write after a whole idle window is averaged alone, not with six stale zeros.
    w.record(112, 3.0);
    assert_eq!(w.linear_average(112), 3.0);
}

#[test]
fn a_gap_shorter_than_the_window_keeps_the_old_first_write() {
    let mut w = window(6);
    for s in 0..=5 {
        w.record(s, 6.0);
    }
    w.record(10, 3.0);
    // Seconds 5..=10: 6, 0, 0, 0, 0, 3.
    assert_eq!(w.linear_average(10), 1.5);
}

#[test]
fn linear_average_rounds_down_to_six_digits() {
    let mut w = window(3);
    w.record(1, 1.0);
    w.record(2, 1.0);
    w.record(3, 0.0);
    assert_eq!(w.linear_average(3), 0.666666);
}

#[test]
fn late_values_within_the_window_are_kept_older_ones_ignored() {
    let mut w = window(6);
    w.record(10, 5.0);
    assert!(w.record(9, 3.0));
    assert_eq!(w.linear_average(10), 4.0);
    w.record(20, 1.0);
    assert!(!w.record(14, 100.0), "a window older than the newest write");
    assert!(w.record(15, 5.0));
    // 15..=20: 5, 0, 0, 0, 0, 1 over the six seconds since the (late) first write 15.
    assert_eq!(w.linear_average(20), 1.0);
}

#[test]
fn a_negative_delta_replaces_a_value() {
    let mut w = window(6);
    w.record(5, 3.0);
    w.record(5, 4.0 - 3.0);
    assert_eq!(w.linear_average(5), 4.0);
}

#[test]
fn weighted_average_weighs_recent_seconds_more() {
    // A 60s window has α = 0.2 (the minimum).
    let mut w = window(60);
    assert!(close(smoothing_coefficient(60), 0.2));
    w.record(1, 10.0);
    w.record(2, 10.0);
    w.record(3, 5.0);
    // 0.2·5 + 0.16·10 + 0.128·10
    assert!(
        close(w.weighted_average(3), 3.88),
        "{}",
        w.weighted_average(3)
    );
    // A trailing second without data counts as zero: 0.16·5 + 0.128·10 + 0.1024·10
    assert!(close(w.weighted_average(4), 3.104));
    assert_eq!(w.weighted_average(63), 0.0, "60 trailing zeros");
    assert_eq!(w.weighted_average(64), 0.0, "more than a window idle");
    assert_eq!(
        w.average(3, Aggregation::WeightedExponential),
        w.weighted_average(3)
    );
}

#[test]
fn short_windows_have_a_large_alpha() {
    // 1 − 0.0001^(1/6) ≈ 0.7846 for the default 6s panic window.
    let a = smoothing_coefficient(6);
    assert!((a - 0.7846).abs() < 1e-4, "{a}");
    let mut w = window(6);
    w.record(10, 10.0);
    assert!(close(w.weighted_average(10), a * 10.0));
}

#[test]
fn shrinking_keeps_the_newest_seconds() {
    let mut w = window(6);
    for s in 1..=6 {
        w.record(s, s as f64);
    }
    w.resize(Duration::from_secs(3), 6);
    assert_eq!(w.len(), 3);
    assert_eq!(w.linear_average(6), 5.0);
    w.record(7, 8.0);
    assert_eq!(
        w.linear_average(7),
        6.333333,
        "(5 + 6 + 8) / 3, rounded down"
    );
}

#[test]
fn growing_does_not_dilute_with_seconds_never_seen() {
    let mut w = window(3);
    for s in 1..=6 {
        w.record(s, s as f64);
    }
    w.resize(Duration::from_secs(6), 6);
    // Only 4, 5, 6 survived; the average is over them, not over six seconds.
    assert_eq!(w.linear_average(6), 5.0);
    w.record(7, 7.0);
    assert_eq!(w.linear_average(7), 5.5);
}

#[test]
fn resizing_an_idle_window_empties_it() {
    let mut w = window(6);
    w.record(1, 5.0);
    w.resize(Duration::from_secs(10), 20);
    assert!(w.is_empty_at(20));
    assert_eq!(w.linear_average(20), 0.0);
    w.record(21, 2.0);
    assert_eq!(w.linear_average(21), 2.0);
}
