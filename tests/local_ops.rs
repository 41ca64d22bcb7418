//! End-to-end tests of what operators see in `thaw local`: Knative's rules where thaw used to
//! differ (revision garbage collection), logs, signals and the local platform's reports. The
//! real binary and sample app, real sockets, the real clock; every wait polls with a deadline.

mod local_e2e_support;

use local_e2e_support::*;

const HOST: &str = "hello.default.example.com";

fn names(v: &serde_json::Value) -> Vec<String> {
    let mut n: Vec<String> = v["revisions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    n.sort();
    n
}

/// config-gc with only a count rule: no non-active revision is kept.
const GC_KEEP_NONE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-gc\ndata:\n  retain-since-create-time: disabled\n  retain-since-last-active-time: disabled\n  min-non-active-revisions: \"0\"\n  max-non-active-revisions: \"0\"\n";

fn with_gc(local: String) -> String {
    local.replace("configMaps:\n", "configMaps:\n  gc: config-gc.yaml\n")
}

/// Every edit of a revision template makes a revision; config-gc's rules collect the old ones
/// once the route has moved on, from the platform and from /revisions. The routed revision is
/// never collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_revisions_are_collected_by_config_gc_and_the_routed_one_never() {
    let thaw = Thaw::start_with(
        &with_gc(local_yaml(&[service("hello", &[], "one", "")])),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
        &[("config-gc.yaml", GC_KEEP_NONE)],
    );
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from one!\n");
    for (n, target) in [(2, "two"), (3, "three")] {
        thaw.edit(
            "local.yaml",
            &with_gc(local_yaml(&[service("hello", &[], target, "")])),
        );
        let want = format!("Hello from {target}!\n");
        until(&thaw, &format!("traffic on hello-0000{n}"), || async {
            thaw.get(HOST, "/").await.2 == want
        })
        .await;
    }
    until(&thaw, "hello-00001 and hello-00002 collected", || async {
        names(&thaw.admin_json("/revisions").await) == ["hello-00003"]
    })
    .await;
    assert!(
        thaw.log_contains("revision collected (config-gc)"),
        "{}",
        thaw.dump_logs()
    );
    // The routed revision still serves, and keeps serving after more GC rounds.
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from three!\n");
}

/// A clean stop (SIGINT, nothing left in flight) logs no WARN and exits 0; `--listen` and
/// `--admin-listen` accept `localhost:PORT` and a bare `PORT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_forms_and_a_clean_stop_without_warnings() {
    let mut thaw = Thaw::start_on(
        &local_yaml(&[service("hello", &[], "one", "")]),
        "localhost:0",
        "0",
    );
    assert!(thaw.data.ip().is_loopback() && thaw.admin.ip().is_loopback());
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from one!\n");
    thaw.signal(nix::sys::signal::Signal::SIGINT);
    assert_eq!(thaw.wait_exit().await, 0, "{}", thaw.dump_logs());
    let logs = thaw.dump_logs();
    assert!(logs.contains("thaw local stopped"), "{logs}");
    let warns: Vec<&str> = logs.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(
        warns.is_empty(),
        "a clean stop logged warnings:\n{}",
        warns.join("\n")
    );
}

/// During a drain thaw says every few seconds how many requests it waits for; a second Ctrl-C
/// stops at once (exit 130), saying what was cut short, and kills the replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ctrl_c_stops_at_once_and_says_what_was_cut_short() {
    let mut thaw = Thaw::start(
        &local_yaml(&[service("hello", &["--response-delay", "60s"], "slow", "")]),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
    );
    let client = thaw.client();
    let data = thaw.data;
    let slow = tokio::spawn(async move {
        let req = hyper::Request::get(format!("http://{data}/"))
            .header("host", HOST)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        client.request(req).await.map(|r| r.status().as_u16())
    });
    until(&thaw, "the slow request forwarded", || async {
        thaw.admin_json("/revisions").await["revisions"][0]["inFlight"] == 1
    })
    .await;
    let replicas = thaw.replicas();
    assert_eq!(replicas.len(), 1);
    thaw.signal(nix::sys::signal::Signal::SIGINT);
    until(&thaw, "a drain progress line", || async {
        thaw.log_contains("draining: 1 requests still in flight")
    })
    .await;
    thaw.signal(nix::sys::signal::Signal::SIGINT);
    assert_eq!(thaw.wait_exit().await, 130, "{}", thaw.dump_logs());
    assert!(
        thaw.log_contains(
            "second Ctrl-C: stopping at once; 1 requests in flight and 0 held are cut short"
        ),
        "{}",
        thaw.dump_logs()
    );
    // The replica was killed: its process is gone or a zombie awaiting its new parent.
    until(&thaw, "the replica gone", || async {
        replicas.iter().all(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        })
    })
    .await;
    assert!(
        slow.await.unwrap().is_err(),
        "the cut request got no answer"
    );
}

/// `thaw local 2>&1 | head -2`: once the log's reader has gone, thaw keeps serving (no panic in
/// the logging library) and stops cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_log_output_does_not_stop_thaw() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("local.yaml"),
        local_yaml(&[service("hello", &[], "one", "")]),
    )
    .unwrap();
    std::fs::write(dir.path().join("config-autoscaler.yaml"), FAST_AUTOSCALER).unwrap();
    std::fs::write(dir.path().join("config-activator.yaml"), FAST_ACTIVATOR).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args([
            "local",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .current_dir(dir.path())
        .env("RUST_LOG", "debug")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("thaw local listening"))
        .expect("the listening line");
    let data: std::net::SocketAddr = listening
        .split("data=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    drop(lines); // `head` exits: the pipe's read end closes.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    for _ in 0..3 {
        let (status, _, body) = get(&client, data, HOST, "/").await;
        assert_eq!((status, body.as_str()), (200, "Hello from one!\n"));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        assert!(tokio::time::Instant::now() < deadline, "thaw did not stop");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(code, Some(0), "exit code 101 = a panic on the closed pipe");
}

/// Without `--config`, `./local.yaml` in the current folder is the services file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_yaml_in_the_current_folder_is_used() {
    let thaw = Thaw::start_without_flag(&local_yaml(&[service("hello", &[], "mine", "")]));
    assert!(
        thaw.log_contains("services file config=local.yaml"),
        "{}",
        thaw.dump_logs()
    );
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from mine!\n");
}

/// `containerPort` is the replica's `PORT` (as in Knative), and the route answers on the
/// cluster-local names too: `{service}.{namespace}`, `.svc`, `.svc.cluster.local`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_port_is_the_replicas_port_and_cluster_local_names_route() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let svc = service("hello", &[], "ported", "")
        + &format!("              ports: [{{name: http1, containerPort: {port}}}]\n");
    let thaw = Thaw::start(&local_yaml(&[svc]), FAST_AUTOSCALER, FAST_ACTIVATOR);
    for host in [
        HOST,
        "hello.default",
        "hello.default.svc",
        "hello.default.svc.cluster.local:80",
    ] {
        let (status, _, body) = thaw.get(host, "/").await;
        assert_eq!(
            (status, body.as_str()),
            (200, "Hello from ported!\n"),
            "{host}"
        );
    }
    let v = thaw.admin_json("/revisions").await;
    assert_eq!(
        v["revisions"][0]["ready"]["addresses"],
        serde_json::json!([format!("127.0.0.1:{port}")]),
        "{v}"
    );
}

/// A replica that is not ready yet is reported every few seconds with the address probed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_not_ready_yet_is_reported_with_the_probed_address() {
    let thaw = Thaw::start(
        &local_yaml(&[service("hello", &["--startup-delay", "20s"], "late", "")]),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
    );
    let client = thaw.client();
    let data = thaw.data;
    let _held = tokio::spawn(async move { get(&client, data, HOST, "/").await });
    until(&thaw, "a not-ready report", || async {
        thaw.log_contains("replica not ready yet: waiting for a TCP connect to 127.0.0.1:")
    })
    .await;
    assert!(
        thaw.log_contains("(the app must listen on $PORT = "),
        "{}",
        thaw.dump_logs()
    );
}

/// `traffic` works locally: a tag host `{tag}-{service}.{namespace}.{domain}` reaches its
/// revision while the route follows the latest one; a Knative manifest's fields that mean
/// nothing locally are accepted with one warning each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_tags_route_to_their_revision() {
    let with_traffic = |target: &str, traffic: &str| {
        service("hello", &[], target, "")
            .replace(
                "            - command:",
                "            - image: ghcr.io/knative/helloworld-go:latest\n              resources: {limits: {cpu: \"1\"}}\n              command:",
            )
            + traffic
    };
    let thaw = Thaw::start(
        &local_yaml(&[with_traffic("one", "")]),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
    );
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from one!\n");
    for warning in [
        "containers[0].image: ignored",
        "containers[0].resources: no effect",
    ] {
        let n = thaw
            .logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(warning))
            .count();
        assert_eq!(n, 1, "{warning}: {}", thaw.dump_logs());
    }
    thaw.edit(
        "local.yaml",
        &local_yaml(&[with_traffic(
            "two",
            "      traffic:\n        - {latestRevision: true, percent: 100}\n        - {revisionName: hello-00001, percent: 0, tag: old}\n",
        )]),
    );
    until(&thaw, "traffic on hello-00002", || async {
        thaw.get(HOST, "/").await.2 == "Hello from two!\n"
    })
    .await;
    for host in [
        "old-hello.default.example.com",
        "old-hello.default.svc.cluster.local",
    ] {
        let (status, _, body) = thaw.get(host, "/").await;
        assert_eq!(
            (status, body.as_str()),
            (200, "Hello from one!\n"),
            "{host}"
        );
    }
    // The edit did not repeat the warnings.
    let n = thaw
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("containers[0].image: ignored"))
        .count();
    assert_eq!(n, 1, "{}", thaw.dump_logs());
}

/// `/revisions` in one key style (Knative's camelCase for spec fields, ConfigMap names for
/// autoscaler settings), durations with their unit, and `desired: null` before any decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_use_one_key_style_and_durations_with_units() {
    let thaw = Thaw::start(
        &local_yaml(&[service("hello", &[], "one", "")]),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
    );
    let v = thaw.admin_json("/revisions").await;
    let r = &v["revisions"][0];
    for key in [
        "containerConcurrency",
        "inFlight",
        "desired",
        "ready",
        "held",
        "state",
    ] {
        assert!(r.get(key).is_some(), "{key} missing: {r}");
    }
    assert!(
        r.get("in_flight").is_none() && r.get("container_concurrency").is_none(),
        "{r}"
    );
    assert_eq!(r["autoscaling"]["stable-window"], "6s");
    assert_eq!(r["autoscaling"]["scale-to-zero-grace-period"], "1s");
    // Initial scale 0: nothing was decided yet.
    assert_eq!(r["desired"], serde_json::Value::Null, "{r}");
    assert_eq!(thaw.get(HOST, "/").await.0, 200);
    let v = thaw.admin_json("/revisions").await;
    assert_eq!(v["revisions"][0]["desired"], 1);
}
