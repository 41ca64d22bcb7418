//! Shared fixtures of the `platform_local*` integration tests: a platform running the real
//! `thaw sample-app`, a capturing log sink, deadline-bounded waits and a tiny HTTP client.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use thaw::platform::EndpointSnapshot;
use thaw::platform::local::{
    LocalOptions, LocalPlatform, LocalRevision, LogSink, RestartPolicy, Stream,
};
use thaw::revision::RevisionKey;
use thaw::telemetry::platform::PlatformMetrics;
use tokio::sync::watch;

/// Generous: the suite may share 2 cores with other test binaries.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Every line the platform forwarded, as `replica/stream: line`.
#[derive(Debug, Default)]
pub struct Capture(pub Mutex<Vec<String>>);

impl LogSink for Capture {
    fn line(&self, _: &RevisionKey, replica: u32, stream: Stream, line: &str) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{replica}/{}: {line}", stream.as_str()));
    }
    fn suppressed(&self, _: &RevisionKey, replica: u32, stream: Stream, count: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{replica}/{}: suppressed {count}", stream.as_str()));
    }
}

impl Capture {
    pub fn contains(&self, needle: &str) -> bool {
        self.0.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

pub struct Fixture {
    pub platform: LocalPlatform,
    pub logs: Arc<Capture>,
    pub metrics: PlatformMetrics,
    pub registry: Registry,
}

impl Fixture {
    /// The OpenMetrics text of the platform's families.
    pub fn exposition(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).unwrap();
        out
    }
}

/// Options for tests: the real thaw binary for `thaw`, short backoff and grace.
pub fn test_options() -> LocalOptions {
    LocalOptions {
        thaw_exe: env!("CARGO_BIN_EXE_thaw").into(),
        drain_timeout: Duration::from_secs(30),
        kill_grace: Duration::from_secs(5),
        startup_timeout: Duration::from_secs(15),
        restart: RestartPolicy {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            crash_limit: 3,
            // These tests read the replica's output in the reason (the option on).
            reason_quotes_output: true,
        },
        ..LocalOptions::default()
    }
}

pub fn fixture(tweak: impl FnOnce(&mut LocalOptions)) -> Fixture {
    let logs = Arc::new(Capture::default());
    let mut opts = test_options();
    opts.log_sink = logs.clone();
    tweak(&mut opts);
    let mut registry = Registry::with_prefix("thaw");
    let metrics = PlatformMetrics::register(&mut registry);
    Fixture {
        platform: LocalPlatform::new(opts, metrics.clone()),
        logs,
        metrics,
        registry,
    }
}

pub fn key(name: &str) -> RevisionKey {
    RevisionKey::new("default", name)
}

/// `thaw sample-app <args>` as revision `name`.
pub fn sample(name: &str, args: &[&str]) -> LocalRevision {
    let mut cmd = vec!["thaw", "sample-app"];
    cmd.extend_from_slice(args);
    LocalRevision::new(key(name), cmd)
}

/// Waits (at most [`DEADLINE`]) for a snapshot matching `pred`; panics with the last one.
pub async fn wait_snapshot(
    rx: &mut watch::Receiver<Arc<EndpointSnapshot>>,
    what: &str,
    pred: impl Fn(&EndpointSnapshot) -> bool,
) -> Arc<EndpointSnapshot> {
    let r = tokio::time::timeout(DEADLINE, rx.wait_for(|s| pred(s)))
        .await
        .ok()
        .and_then(|r| r.ok().map(|s| s.clone()));
    match r {
        Some(s) => s,
        None => panic!(
            "timed out waiting for {what}; last snapshot: {:?}",
            *rx.borrow()
        ),
    }
}

/// Polls `cond` every 10 ms until it holds, at most [`DEADLINE`].
pub async fn poll_until(what: &str, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `pid` is a live process (a zombie awaiting its reaper counts as gone).
pub fn alive(pid: u32) -> bool {
    if kill(Pid::from_raw(pid as i32), None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3, after the parenthesised command name, is the state.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => false,
    }
}

/// `GET path` over HTTP/1.1; status and body.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The pids of every replica of `key` that has a process.
pub fn pids(platform: &LocalPlatform, key: &RevisionKey) -> Vec<u32> {
    platform
        .status(key)
        .map(|s| s.replicas.iter().filter_map(|r| r.pid).collect())
        .unwrap_or_default()
}
