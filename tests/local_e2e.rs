//! End-to-end tests of `thaw local`: the real binary, the real sample app as replicas, real
//! sockets, the real clock with shortened windows; every wait polls with a deadline.

mod local_e2e_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use local_e2e_support::*;
use nix::sys::signal::Signal;

const HOST: &str = "hello.default.example.com";

fn revision<'a>(v: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    v["revisions"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_request_wakes_from_zero_and_idle_revision_returns_to_zero_processes() {
    let local = local_yaml(&[service("hello", &[], "one", "")]);
    let thaw = Thaw::start(&local, FAST_AUTOSCALER, FAST_ACTIVATOR);
    assert!(
        thaw.replicas().is_empty(),
        "initial-scale 0: nothing runs before a request"
    );

    let (status, headers, body) = thaw.get(HOST, "/").await;
    assert_eq!(status, 200, "{headers}{body}\n{}", thaw.dump_logs());
    assert_eq!(body, "Hello from one!\n");
    assert!(
        headers.contains("server-timing: cold-start;dur="),
        "{headers}"
    );
    assert_eq!(thaw.replicas().len(), 1);
    let metrics = thaw.get_admin_text("/metrics").await;
    for phase in [
        "poke_to_decision",
        "decision_to_ready",
        "ready_to_first_byte",
    ] {
        assert!(
            metrics.contains(phase),
            "cold-start phase {phase} missing from /metrics"
        );
    }
    assert!(
        metrics.contains("thaw_activator_stats_dropped_total 0"),
        "stats drops are exported"
    );

    // Stable window 6s, grace 1s: the revision goes back to zero processes on its own.
    until(&thaw, "scale to zero processes", || async {
        thaw.replicas().is_empty()
    })
    .await;
    let v = thaw.admin_json("/revisions").await;
    let r = revision(&v, "hello-00001").unwrap();
    assert_eq!(r["desired"], 0);
    assert_eq!(r["ready"]["count"], 0);
    assert!(
        thaw.log_contains("scale hello-00001 1 -> 0"),
        "{}",
        thaw.dump_logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_requests_at_zero_all_answer_200() {
    // A replica that takes 300 ms to start, so every request is held.
    let local = local_yaml(&[service("hello", &["--startup-delay", "300ms"], "burst", "")]);
    let thaw = Arc::new(Thaw::start(&local, FAST_AUTOSCALER, FAST_ACTIVATOR));
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let thaw = thaw.clone();
        tasks.push(tokio::spawn(async move { thaw.get(HOST, "/").await }));
    }
    let mut ok = 0;
    for t in tasks {
        let (status, _, body) = t.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "Hello from burst!\n"));
        ok += 1;
    }
    assert_eq!(ok, 200, "none lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_command_answers_503_with_the_reason() {
    let local = local_yaml(&[service("hello", &["--crash"], "x", "")]);
    let thaw = Thaw::start(&local, FAST_AUTOSCALER, FAST_ACTIVATOR);
    let (status, headers, body) = thaw.get(HOST, "/").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("is unavailable"), "{body}");
    assert!(
        !body.contains("crashing on purpose") && !body.contains("keep crashing"),
        "the replica's output and the platform's reason stay out of the client's body: {body}"
    );
    let revisions = thaw.admin_json("/revisions").await;
    let reason = revisions["revisions"][0]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(reason.contains("replicas keep crashing"), "{revisions}");
    assert!(
        !reason.contains("crashing on purpose"),
        "raw output stays out of /revisions by default: {reason}"
    );
    assert!(headers.contains("retry-after: "), "{headers}");
    let v = thaw.admin_json("/revisions").await;
    assert_eq!(revision(&v, "hello-00001").unwrap()["status"], "failing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_edit_of_the_autoscaler_file_changes_the_stable_window() {
    let local = local_yaml(&[service("hello", &[], "x", "")]);
    let thaw = Thaw::start(&local, FAST_AUTOSCALER, FAST_ACTIVATOR);
    let window = |v: serde_json::Value| {
        revision(&v, "hello-00001").unwrap()["autoscaling"]["stable-window"].clone()
    };
    assert_eq!(window(thaw.admin_json("/revisions").await), "6s");

    // An invalid edit is rejected and the last good configuration stays.
    thaw.edit(
        "config-autoscaler.yaml",
        &FAST_AUTOSCALER.replace("\"6s\"", "\"6\""),
    );
    until(&thaw, "the rejection in the log", || async {
        thaw.log_contains("configuration update rejected")
    })
    .await;
    assert!(
        thaw.log_contains("stable-window"),
        "the rejected key is named"
    );
    assert_eq!(window(thaw.admin_json("/revisions").await), "6s");

    thaw.edit(
        "config-autoscaler.yaml",
        &FAST_AUTOSCALER.replace("\"6s\"", "\"20s\""),
    );
    until(&thaw, "stable-window 20s in force", || async {
        window(thaw.admin_json("/revisions").await) == "20s"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_edit_rolls_to_the_next_revision_with_no_request_lost() {
    let thaw = Arc::new(Thaw::start(
        &local_yaml(&[service("hello", &[], "one", "")]),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
    ));
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from one!\n");

    // Four clients send requests back to back through the whole roll-out.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (thaw, stop) = (thaw.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                seen.push(thaw.get(HOST, "/").await);
            }
            seen
        }));
    }
    thaw.edit(
        "local.yaml",
        &local_yaml(&[service("hello", &[], "two", "")]),
    );
    until(&thaw, "traffic on hello-00002", || async {
        thaw.get(HOST, "/").await.2 == "Hello from two!\n"
    })
    .await;
    // A bad edit afterwards is rejected; hello-00002 keeps serving.
    thaw.edit("local.yaml", "services:\n  - metadata: {name: Bad_Name}\n");
    until(&thaw, "the rejected local.yaml", || async {
        thaw.log_contains("configuration update rejected")
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for c in clients {
        for (status, _, body) in c.await.unwrap() {
            assert_eq!(
                status, 200,
                "a request was lost during the roll-out: {body}"
            );
            assert!(
                body == "Hello from one!\n" || body == "Hello from two!\n",
                "{body}"
            );
            total += 1;
        }
    }
    assert!(total > 0);
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from two!\n");
    let v = thaw.admin_json("/revisions").await;
    assert!(revision(&v, "hello-00002").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_held_requests_finishes_them_and_stops_every_replica() {
    let local = local_yaml(&[service("hello", &["--startup-delay", "1s"], "late", "")]);
    let mut thaw = Thaw::start(&local, FAST_AUTOSCALER, FAST_ACTIVATOR);
    let client = thaw.client();
    let (data, mut tasks) = (thaw.data, Vec::new());
    for _ in 0..20 {
        let client = client.clone();
        tasks.push(tokio::spawn(
            async move { get(&client, data, HOST, "/").await },
        ));
    }
    until(&thaw, "20 held requests", || async {
        thaw.admin_json("/revisions").await["held"] == 20
    })
    .await;
    thaw.signal(Signal::SIGTERM);
    for t in tasks {
        let (status, _, body) = t.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "Hello from late!\n"));
    }
    assert_eq!(thaw.wait_exit().await, 0, "{}", thaw.dump_logs());
    assert!(
        thaw.log_contains("every replica stopped"),
        "{}",
        thaw.dump_logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_service_answers_its_held_requests_503_with_the_reason() {
    let slow = service("slow", &["--startup-delay", "20s"], "slow", "");
    let keep = service("hello", &[], "kept", "");
    let thaw = Thaw::start(
        &local_yaml(&[slow, keep.clone()]),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
    );
    let (client, data) = (thaw.client(), thaw.data);
    let held =
        tokio::spawn(async move { get(&client, data, "slow.default.example.com", "/").await });
    until(&thaw, "a held request", || async {
        thaw.admin_json("/revisions").await["held"] == 1
    })
    .await;
    thaw.edit("local.yaml", &local_yaml(&[keep]));
    let (status, headers, body) = held.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("is unavailable"), "{body}");
    assert!(headers.contains("retry-after: "), "{headers}");
    assert_eq!(
        thaw.get(HOST, "/").await.0,
        200,
        "the other service still serves"
    );
}

#[test]
fn invalid_local_yaml_is_refused_at_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("local.yaml");
    std::fs::write(
        &path,
        "services:\n  - metadata: {name: hello}\n    spec:\n      template:\n        spec:\n          \
         containers: [{command: [thaw, sample-app], ports: [{name: grpc}]}]\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args([
            "local",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("services[0].spec.template.spec.containers[0].ports[0].name: grpc: must be"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_local_yaml_the_built_in_copy_serves_hello() {
    let thaw = Thaw::start_builtin();
    // Said at WARN, naming the files looked for.
    assert!(
        thaw.logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(" WARN ")
                && l.contains("serving the built-in demo")
                && l.contains("looked_for=local.yaml, config/local.yaml")),
        "{}",
        thaw.dump_logs()
    );
    // The demo's domain is `localhost`: a browser or curl reaches
    // http://hello.default.localhost:PORT/ (which resolves to loopback) with that Host, port
    // included.
    let host = format!("hello.default.localhost:{}", thaw.data.port());
    let (status, _, body) = thaw.get(&host, "/").await;
    assert_eq!((status, body.as_str()), (200, "Hello from thaw!\n"));
    assert!(
        thaw.log_contains(&format!("try: curl http://{host}/")),
        "{}",
        thaw.dump_logs()
    );
}

/// config-autoscaler with a 10 s stable window (so a 1 s panic window) and Knative's other
/// defaults: the first revision starts warm (initial scale 1).
const SHORT_WINDOW: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-autoscaler\ndata:\n  stable-window: \"10s\"\n";

/// The value of the revision's series `name` in an admin /metrics scrape.
fn series(metrics: &str, name: &str, revision: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| {
            l.starts_with(&format!("{name}{{")) && l.contains(&format!("revision=\"{revision}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Whether the revision's decider panics on a panic-window concurrency of at least `at_least`.
fn panicking(metrics: &str, revision: &str, at_least: f64) -> bool {
    series(metrics, "thaw_autoscaler_panic_mode", revision) == Some(1.0)
        && series(metrics, "thaw_autoscaler_observed_panic", revision)
            .is_some_and(|p| p >= at_least)
}

/// A one-second panic window (10 s stable window) under 5x overload: the live autoscaler
/// panics, as `thaw simulate` does on the same load (the live one reads the windows up to the
/// last second its reporters have closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_panic_window_panics_under_overload_live_and_in_simulate() {
    let local = local_yaml(&[service(
        "hello",
        &["--response-delay", "200ms"],
        "x",
        "autoscaling.knative.dev/target: \"1\"",
    )]);
    let thaw = Arc::new(Thaw::start(&local, SHORT_WINDOW, FAST_ACTIVATOR));
    let (status, _, _) = thaw.get(HOST, "/").await;
    assert_eq!(status, 200);
    // The cold start's pokes are over: from here on only the reporters' stats count.
    until(&thaw, "one ready replica", || async {
        revision(&thaw.admin_json("/revisions").await, "hello-00001")
            .is_some_and(|r| r["ready"]["count"] == 1)
    })
    .await;
    // Five requests in flight at all times against a target of 1 per pod.
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for _ in 0..5 {
        let (thaw, stop) = (thaw.clone(), stop.clone());
        loops.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = thaw.get(HOST, "/").await;
            }
        }));
    }
    // In panic on the load it sees in the one-second window (twice the target per pod).
    until(
        &thaw,
        "the decider panicking on the panic window's load",
        || async { panicking(&thaw.get_admin_text("/metrics").await, "hello-00001", 2.0) },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        let _ = l.await;
    }

    // The same load through `thaw simulate`: it panics too.
    let dir = tempfile::tempdir().unwrap();
    let (config, trace, out) = (
        dir.path().join("c.yaml"),
        dir.path().join("t.csv"),
        dir.path().join("o.csv"),
    );
    std::fs::write(&config, SHORT_WINDOW).unwrap();
    std::fs::write(&trace, "second,concurrency\n0,1\n1,5\n12,5\n").unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args(["simulate", "--config"])
        .arg(&config)
        .arg("--trace")
        .arg(&trace)
        .args(["--annotation", "autoscaling.knative.dev/target=1", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let csv = std::fs::read_to_string(&out).unwrap();
    assert!(
        csv.lines()
            .skip(1)
            .any(|l| l.split(',').nth(3) == Some("1")),
        "simulate never panics:\n{csv}"
    );
}
