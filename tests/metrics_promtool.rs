//! `/metrics` as a Prometheus server reads it: `promtool check metrics` (Debian's `prometheus`
//! package; `.ci/run` installs it) passes with no lint on scrapes of `thaw local`, in the
//! classic text format, and OpenMetrics is served to a scraper that asks for it. Each role
//! served on its own admin port later adds its scrape here.

mod local_e2e_support;

use std::io::Write;
use std::process::{Command, Stdio};

use local_e2e_support::*;

const HOST: &str = "hello.default.example.com";

/// GET /metrics with `accept` (none if `None`): (content type, body).
async fn scrape(thaw: &Thaw, accept: Option<&str>) -> (String, String) {
    use http_body_util::BodyExt;
    let mut req = hyper::Request::get(format!("http://{}/metrics", thaw.admin));
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let resp = thaw
        .client()
        .request(req.body(http_body_util::Empty::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (ct, String::from_utf8(body.to_vec()).unwrap())
}

/// `promtool check metrics` on `text`: its exit code and everything it printed.
fn promtool(text: &str) -> (i32, String) {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!(
            "cannot run promtool ({e}): install Debian's `prometheus` package \
             (apt-get install prometheus; .ci/run does)"
        ),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thaw_local_scrapes_pass_promtool_with_no_lint() {
    let thaw = Thaw::start(
        &local_yaml(&[service("hello", &[], "one", "")]),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
    );
    // Before any traffic, after a cold start, and with a request no revision matches.
    let (_, idle) = scrape(&thaw, None).await;
    assert_eq!(thaw.get(HOST, "/").await.0, 200);
    assert_eq!(thaw.get("nobody.default.example.com", "/").await.0, 404);
    let (ct, busy) = scrape(&thaw, Some("text/plain;version=0.0.4")).await;
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    for (what, text) in [("idle", &idle), ("after traffic", &busy)] {
        let (code, said) = promtool(text);
        assert_eq!(code, 0, "{what}: promtool failed:\n{said}\n{text}");
        assert!(said.trim().is_empty(), "{what}: promtool lint:\n{said}");
    }
    for family in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
        "thaw_build_info{version=\"",
    ] {
        assert!(busy.contains(family), "{family} missing:\n{busy}");
    }
    assert!(!busy.contains("# EOF"));
    // Only families thaw local can move: no leader, no Kubernetes watches, no remote stats.
    for cluster_only in [
        "thaw_controller_",
        "thaw_autoscaler_leader_changes",
        "thaw_autoscaler_takeover",
        "thaw_autoscaler_api_writes",
        "thaw_autoscaler_pod_stats",
        "thaw_autoscaler_stats_requests",
        "thaw_activator_stats_push",
        "thaw_activator_decision_feed",
        "thaw_platform_watch_",
        "thaw_platform_scale_patches",
    ] {
        assert!(!busy.contains(cluster_only), "{cluster_only}:\n{busy}");
    }
    // The request counter and the latency histogram carry the same labels.
    let labels_of = |prefix: &str| -> String {
        let line = busy
            .lines()
            .find(|l| l.starts_with(prefix) && l.contains("revision=\"hello-00001\""))
            .unwrap_or_else(|| panic!("{prefix} missing:\n{busy}"));
        line[prefix.len()..line.find('}').unwrap() + 1].to_string()
    };
    let counter = labels_of("thaw_activator_requests_total{");
    assert_eq!(
        counter,
        labels_of("thaw_activator_request_latencies_seconds_count{"),
        "{busy}"
    );
    assert_eq!(
        counter,
        "namespace=\"default\",service=\"hello\",configuration=\"hello\",\
         revision=\"hello-00001\",code=\"200\",response_code_class=\"2xx\"}"
    );

    // What Prometheus itself sends: OpenMetrics.
    let (ct, om) = scrape(
        &thaw,
        Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
             version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        ),
    )
    .await;
    assert!(
        ct.starts_with("application/openmetrics-text; version=1.0.0"),
        "{ct}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE thaw_build info"), "{om}");
}

/// The queue sidecar's admin port, before and after traffic (a request its missing user
/// container cannot answer counts too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thaw_queue_scrapes_pass_promtool_with_no_lint() {
    use http_body_util::BodyExt;
    use std::io::{BufRead, BufReader};
    let user_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args([
            "queue",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("SERVING_NAMESPACE", "default")
        .env("SERVING_REVISION", "hello-00001")
        .env("USER_PORT", user_port.to_string())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("thaw queue listening"))
        .expect("thaw queue did not listen");
    std::thread::spawn(move || lines.for_each(drop));
    let addr = |name: &str| -> std::net::SocketAddr {
        let rest = &line[line.find(&format!(" {name}=")).unwrap() + name.len() + 2..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (data, admin) = (addr("data"), addr("admin"));
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let get = |url: String| {
        let client = client.clone();
        async move {
            let resp = client
                .request(hyper::Request::get(url).body(Default::default()).unwrap())
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let (_, idle) = get(format!("http://{admin}/metrics")).await;
    assert_eq!(get(format!("http://{data}/")).await.0, 502);
    let (_, busy) = get(format!("http://{admin}/metrics")).await;
    let _ = child.kill();
    let _ = child.wait();
    for (what, text) in [("idle", &idle), ("after traffic", &busy)] {
        let (code, said) = promtool(text);
        assert_eq!(code, 0, "{what}: promtool failed:\n{said}\n{text}");
        assert!(said.trim().is_empty(), "{what}: promtool lint:\n{said}");
    }
    assert!(busy.contains("revision_request_count_total{"), "{busy}");
    assert!(busy.contains("process_resident_memory_bytes "), "{busy}");
}
