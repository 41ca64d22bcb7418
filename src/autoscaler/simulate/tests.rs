//! A small trace computed by hand (target 10, 6s stable window, 3s panic window, pods ready
//! 2s after they are asked for, the revision settled at zero when the trace starts).

use std::time::Duration;

use super::*;

fn spec() -> AutoscalingSpec {
    AutoscalingSpec {
        total_value: 10.0,
        target_utilization: 1.0,
        target_value: 10.0,
        stable_window: Duration::from_secs(6),
        panic_window: Duration::from_secs(3),
        ..AutoscalingSpec::default()
    }
}

/// 5 in flight for seconds 1..=3, a burst of 40 at 12 and 13, nothing else; 24 seconds.
pub(crate) fn hand_trace() -> Vec<f64> {
    let mut t = vec![0.0; 24];
    t[1..=3].fill(5.0);
    t[12..=13].fill(40.0);
    t
}

#[tokio::test]
async fn a_hand_computed_trace() {
    let model = Model {
        pod_startup: 2,
        container_concurrency: 0,
        fresh: false,
    };
    let sim = simulate(spec(), &hand_trace(), model).await;
    let desired: Vec<u32> = sim.rows.iter().map(|r| r.desired).collect();
    // 1: a poke wakes it (stable 5/6 → 1 pod). 10: the 6s window is empty and it was active
    // 6s (since 4, its pod ready at 3): the pod goes. 12: the burst pokes: panic (ceil(40/3/10)
    // = 2 over 1) → 2 pods. 14: still panicking, ceil(80/3/10) = 3 pods. 20: the panic ends
    // (12 + 6 < 20), down to floor(3/2) = 1. 22: empty window, active 8s ≥ 6s: 0.
    let want = [
        0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 2, 2, 3, 3, 3, 3, 3, 3, 1, 1, 0, 0,
    ];
    assert_eq!(desired, want);
    let ready: Vec<u32> = sim.rows.iter().map(|r| r.ready).collect();
    let want_ready = [
        0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 3, 3, 3, 1, 1, 0, 0,
    ];
    assert_eq!(ready, want_ready);
    let panic: Vec<usize> = (0..24).filter(|&i| sim.rows[i].panic).collect();
    assert_eq!(panic, (12..20).collect::<Vec<_>>());
    let waiting: Vec<f64> = sim.rows.iter().map(|r| r.waiting).collect();
    assert_eq!(&waiting[..4], [0.0, 5.0, 5.0, 0.0]);
    assert_eq!(&waiting[12..15], [40.0, 40.0, 0.0]);
    // floor(0 × 100 − 211 − 5/3) with the default TBC and total 10 → floor(−212.67).
    assert_eq!(sim.rows[1].excess_burst_capacity, -213);
    assert!(sim.rows.iter().all(|r| r.activator_in_path));
    assert_eq!(
        sim.summary,
        Summary {
            seconds: 24,
            pod_seconds: 9 + 2 * 2 + 3 * 6 + 2,
            scale_from_zero: 2,
            waiting_seconds: 4,
            peak_pods: 3,
        }
    );
}

#[tokio::test]
async fn a_fresh_revision_starts_with_its_initial_scale() {
    let model = Model {
        pod_startup: 1,
        container_concurrency: 0,
        fresh: true,
    };
    let sim = simulate(spec(), &[0.0; 40], model).await;
    assert_eq!(sim.rows[0].desired, 1);
    assert_eq!(sim.rows[1].ready, 1);
    // Default grace period: the activator has fronted the revision since second 0, so the
    // pod (inactive from 8: active from 2 + 6s) goes at 30.
    assert_eq!(sim.rows[29].desired, 1);
    assert_eq!(sim.rows[30].desired, 0);
    assert_eq!(sim.summary.scale_from_zero, 0);
}

#[tokio::test]
async fn container_concurrency_limits_what_each_pod_serves() {
    let model = Model {
        pod_startup: 0,
        container_concurrency: 2,
        fresh: false,
    };
    let mut spec = spec();
    spec.container_concurrency = 2;
    spec.total_value = 2.0;
    spec.target_value = 2.0;
    let sim = simulate(spec, &[0.0, 6.0, 6.0, 6.0, 6.0], model).await;
    // 1: the poke asks for ceil((6/6) / 2) = 1 pod, ready at once; it serves 2 of the 6, so
    // 4 wait. The ticks that follow add pods until none wait.
    assert_eq!(sim.rows[1].ready, 1);
    assert_eq!(sim.rows[1].waiting, 4.0);
    assert!(sim.rows[4].ready >= 3, "{:?}", sim.rows[4]);
    assert_eq!(sim.rows[4].waiting, 0.0);
}

#[test]
fn csv_and_svg_outputs() {
    let rows = vec![
        Row {
            second: 0,
            offered: 0.0,
            desired: 0,
            ready: 0,
            panic: false,
            excess_burst_capacity: -211,
            activator_in_path: true,
            waiting: 0.0,
        },
        Row {
            second: 1,
            offered: 2.5,
            desired: 1,
            ready: 0,
            panic: true,
            excess_burst_capacity: -214,
            activator_in_path: true,
            waiting: 2.5,
        },
    ];
    let csv = trace::to_csv(&rows);
    assert_eq!(
        csv,
        "second,desired,ready,panic,excess_burst_capacity,activator_in_path,waiting\n\
         0,0,0,0,-211,1,0\n1,1,0,1,-214,1,2.5\n"
    );
    let summary = Summary {
        seconds: 2,
        pod_seconds: 1,
        scale_from_zero: 1,
        waiting_seconds: 1,
        peak_pods: 1,
    };
    let run = plot::Run {
        label: "config-autoscaler.yaml",
        settings: "target 70 per pod, stable-window 60s",
        rows: &rows,
        summary: &summary,
    };
    let svg = plot::svg("a <trace>", &[0.0, 2.5], &[run]);
    assert!(svg.starts_with("<svg "));
    assert!(svg.trim_end().ends_with("</svg>"));
    // Offered, ready and desired lines; ready and waiting areas.
    assert_eq!(svg.matches("<polyline").count(), 3);
    assert_eq!(svg.matches("<polygon").count(), 2);
    assert!(svg.contains("a &lt;trace&gt;"));
    assert!(svg.contains(r#"class="panic""#));
    // The requests waiting while no pod is ready are drawn: second 1's 2.5 reaches the top.
    assert!(svg.contains(r#"class="waiting-0""#), "{svg}");
    assert!(svg.contains("requests waiting (no pod ready)"));
    // Desired and ready differ in colour, width and dash.
    assert!(svg.contains(r#"class="desired-0""#) && svg.contains(r#"stroke-dasharray="7 4""#));
    // The settings and the summary are in the picture.
    assert!(
        svg.contains("target 70 per pod, stable-window 60s"),
        "{svg}"
    );
    assert!(
        svg.contains(
            "summary: pod-seconds 1 · scale-from-zero events 1 · seconds with requests waiting 1"
        ),
        "{svg}"
    );
    // A second configuration is overlaid in its own series.
    let other = plot::Run {
        label: "other.yaml",
        ..run
    };
    let both = plot::svg("t", &[0.0, 2.5], &[run, other]);
    assert_eq!(both.matches("<polyline").count(), 5);
    assert!(both.contains(r#"class="desired-1""#) && both.contains("other.yaml settings:"));
}

#[test]
fn settings_text_names_what_an_operator_tunes() {
    let text = settings_text(
        &spec(),
        &Model {
            pod_startup: 2,
            container_concurrency: 0,
            fresh: false,
        },
    );
    for part in [
        "target 10 per pod",
        "stable-window 6s",
        "panic-window 3s",
        "scale-to-zero-grace-period 30s",
        "max-scale unbounded",
        "pod start-up 2s",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
}
