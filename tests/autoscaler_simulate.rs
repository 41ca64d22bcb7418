//! `thaw simulate` as an operator runs it: the real binary, a manifest, a trace, the outputs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn thaw() -> Command {
    Command::new(env!("CARGO_BIN_EXE_thaw"))
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The trace of `autoscaler::simulate::tests::a_hand_computed_trace`: 5 in flight for
/// seconds 1..=3, 40 at 12 and 13, 24 seconds in all.
const HAND_TRACE: &str = "second,concurrency\n0,0\n1,5\n2,5\n3,5\n12,40\n13,40\n23,0\n";

/// Target 10 (100% of 10), 6s stable window, 3s panic window.
const HAND_CONFIG: &str = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: config-autoscaler
data:
  container-concurrency-target-default: \"10\"
  container-concurrency-target-percentage: \"100\"
  stable-window: 6s
";

#[test]
fn the_summary_of_a_trace_computed_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let (config, trace) = (dir.path().join("c.yaml"), dir.path().join("t.csv"));
    let (out, plot) = (dir.path().join("o.csv"), dir.path().join("p.svg"));
    std::fs::write(&config, HAND_CONFIG).unwrap();
    std::fs::write(&trace, HAND_TRACE).unwrap();
    let run = thaw()
        .args(["simulate", "--pod-startup", "2", "--config"])
        .arg(&config)
        .arg("--trace")
        .arg(&trace)
        .args([
            "--annotation",
            "autoscaling.knative.dev/panic-window-percentage=50",
        ])
        .arg("--out")
        .arg(&out)
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // Pods: 1 for seconds 1..=9, 2 at 12-13, 3 at 14-19, 1 at 20-21: 9 + 4 + 18 + 2 = 33.
    // Woken from zero at 1 and 12; requests wait while no pod is ready at 1, 2, 12, 13.
    assert_eq!(
        String::from_utf8(run.stdout).unwrap(),
        "seconds: 24\npod-seconds: 33\nscale-from-zero events: 2\n\
         seconds with requests waiting: 4\npeak pods: 3\n"
    );
    let csv = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 25);
    assert_eq!(
        lines[0],
        "second,desired,ready,panic,excess_burst_capacity,activator_in_path,waiting"
    );
    // EBC floor(0 × 10 − 211 − panic): panic 5/3 at 1, 40/3 at 12.
    assert_eq!(lines[2], "1,1,0,0,-213,1,5");
    assert_eq!(lines[13], "12,2,0,1,-225,1,40");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg "));
    assert_eq!(svg.matches("<polyline").count(), 3);
}

#[test]
fn the_checked_in_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (out, plot) = (dir.path().join("o.csv"), dir.path().join("p.svg"));
    let run = thaw()
        .args(["simulate", "--container-concurrency", "10", "--config"])
        .arg(repo("config/config-autoscaler.yaml"))
        .arg("--trace")
        .arg(repo("loadtests/traces/bursty.csv"))
        .arg("--out")
        .arg(&out)
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary = String::from_utf8(run.stdout).unwrap();
    assert!(
        summary.starts_with("seconds: 1200\npod-seconds: "),
        "{summary}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 1201);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
}

#[test]
fn bad_input_is_reported_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, "second,concurrency\n0,1\n0,2\n").unwrap();
    let run = thaw()
        .arg("simulate")
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1), "invalid input");
    assert!(String::from_utf8_lossy(&run.stderr).contains("line 3"));
    let run = thaw()
        .arg("simulate")
        .arg("--trace")
        .arg(repo("loadtests/traces/bursty.csv"))
        .args(["--annotation", "autoscaling.knative.dev/window=5s"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1), "invalid input");
    assert!(String::from_utf8_lossy(&run.stderr).contains("autoscaling.knative.dev/window: 5s"));
}

/// `--compare OTHER.yaml` replays the same trace with a second config-autoscaler: both
/// summaries are printed and the plot overlays both, settings and summaries included.
#[test]
fn compare_overlays_a_second_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("short.yaml");
    std::fs::write(
        &other,
        "kind: ConfigMap\nmetadata: {name: config-autoscaler}\ndata:\n  stable-window: 6s\n  \
         scale-to-zero-grace-period: 1s\n",
    )
    .unwrap();
    let plot = dir.path().join("p.svg");
    let run = thaw()
        .args(["simulate", "--config"])
        .arg(repo("config/config-autoscaler.yaml"))
        .arg("--compare")
        .arg(&other)
        .arg("--trace")
        .arg(repo("loadtests/traces/bursty.csv"))
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let out = String::from_utf8(run.stdout).unwrap();
    let sections: Vec<&str> = out.split("\n# ").collect();
    assert_eq!(sections.len(), 2, "{out}");
    assert!(sections[0].starts_with("# ") && sections[0].contains("config-autoscaler.yaml"));
    assert!(sections[1].contains("short.yaml") && sections[1].contains("pod-seconds: "));
    let pod_seconds = |s: &str| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix("pod-seconds: "))
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(
        pod_seconds(sections[1]) < pod_seconds(sections[0]),
        "a 6s window releases pods sooner than 60s: {out}"
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.contains(r#"class="desired-1""#) && svg.contains(r#"class="waiting-1""#));
    assert!(svg.contains("short.yaml settings:") && svg.contains("stable-window 6s"));
    assert!(svg.contains("stable-window 60s"));
}
