//! `thaw queue` as a child process for the sidecar's tests: the binary on ephemeral ports in
//! front of a user container, and a plain HTTP client of its ports.
#![allow(dead_code)] // each test binary uses its part

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use nix::sys::signal::Signal;
use tokio::time::Instant;

/// Generous: the suite shares 2 cores with other test binaries.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A child process, SIGKILLed on drop if still running, its stderr kept.
pub struct Proc {
    pub child: Child,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start thaw");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Proc { child, logs }
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Waits for the process to exit; its exit code.
    pub async fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + DEADLINE * 2;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "did not exit:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now (bound and released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `thaw sample-app` on `port` with extra arguments; returns once it accepts connections.
pub async fn app(port: u16, args: &[&str]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_thaw"));
    cmd.args(["sample-app", "--port", &port.to_string()])
        .args(args);
    let p = Proc::spawn(cmd);
    let deadline = Instant::now() + DEADLINE;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the app did not listen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    p
}

/// A running `thaw queue` on ephemeral ports.
pub struct Queue {
    pub proc: Proc,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    pub client: Client<HttpConnector, Full<Bytes>>,
}

impl Queue {
    /// Starts the sidecar in front of 127.0.0.1:`user_port` with `env` added to a base revision
    /// (drain delay 0 unless set).
    pub fn start(user_port: u16, env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_thaw"));
        cmd.args([
            "queue",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env_clear()
        .env("SERVING_NAMESPACE", "default")
        .env("SERVING_REVISION", "hello-00001")
        .env("SERVING_CONFIGURATION", "hello")
        .env("SERVING_POD", "hello-00001-pod")
        .env("USER_PORT", user_port.to_string())
        .env("THAW_DRAIN_DELAY", "0s");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let proc = Proc::spawn(cmd);
        let deadline = Instant::now() + DEADLINE;
        let (data, admin) = loop {
            if let Some(line) = proc
                .logs
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains("thaw queue listening"))
            {
                let field = |name: &str| -> SocketAddr {
                    let rest = &line[line.find(&format!(" {name}=")).unwrap() + name.len() + 2..];
                    rest.split_whitespace().next().unwrap().parse().unwrap()
                };
                break (field("data"), field("admin"));
            }
            assert!(
                Instant::now() < deadline,
                "thaw queue did not listen:\n{}",
                proc.logs()
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let client = Client::builder(TokioExecutor::new()).build_http();
        Queue {
            proc,
            data,
            admin,
            client,
        }
    }

    /// A request on the data port: (status, headers as a map, body).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, HashMap<String, String>, String) {
        send(&self.client, self.data, method, path, headers, body).await
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let (s, _, b) = self.send("GET", path, headers, "").await;
        (s, b)
    }

    pub async fn admin(&self, path: &str) -> (u16, String) {
        let (s, _, b) = send(&self.client, self.admin, "GET", path, &[], "").await;
        (s, b)
    }

    /// Polls `path` on the admin port until it answers `status`.
    pub async fn admin_until(&self, path: &str, status: u16) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if self.admin(path).await.0 == status {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{path} never answered {status}:\n{}",
                self.proc.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A metric's value from /metrics (the first series whose line starts with `name{` or
    /// `name `).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.admin("/metrics").await;
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
    }
}

pub async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, HashMap<String, String>, String) {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = tokio::time::timeout(DEADLINE * 2, client.request(req))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string()))
        .collect();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}
