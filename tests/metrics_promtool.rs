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
