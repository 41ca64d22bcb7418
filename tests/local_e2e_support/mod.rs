//! Harness for end-to-end tests of the real `thaw local` binary: a temporary config folder,
//! ephemeral ports read from the log, log capture, an HTTP client, and the replica processes
//! counted from /proc. Real clock; every wait polls with a deadline.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Generous: the suite shares 2 cores with other test binaries.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A config-autoscaler with the shortest windows Knative allows, so idle revisions go to zero
/// within seconds, and initial scale 0 so revisions start cold.
pub const FAST_AUTOSCALER: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-autoscaler\ndata:\n  stable-window: \"6s\"\n  scale-to-zero-grace-period: \"1s\"\n  allow-zero-initial-scale: \"true\"\n  initial-scale: \"0\"\n";

/// A config-activator without the drain delay (no load balancer to wait for in a test).
pub const FAST_ACTIVATOR: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-activator\ndata:\n  drain-delay: \"0s\"\n  drain-timeout: \"60s\"\n";

/// One service, `hello` unless named otherwise, running `thaw sample-app` with `args`.
pub fn service(name: &str, args: &[&str], env_target: &str, extra_annotations: &str) -> String {
    let args = args
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "  - metadata: {{name: {name}, namespace: default}}\n    spec:\n      template:\n        metadata:\n          annotations: {{{extra_annotations}}}\n        spec:\n          containers:\n            - command: [thaw, sample-app]\n              args: [{args}]\n              env: [{{name: TARGET, value: \"{env_target}\"}}]\n"
    )
}

pub fn local_yaml(services: &[String]) -> String {
    format!(
        "domain: example.com\nconfigMaps:\n  autoscaler: config-autoscaler.yaml\n  activator: config-activator.yaml\nservices:\n{}",
        services.concat()
    )
}

/// A running `thaw local`, killed (SIGKILL) on drop if still running.
pub struct Thaw {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Thaw {
    /// Writes the config folder and starts `thaw local` on ephemeral ports.
    pub fn start(local: &str, autoscaler: &str, activator: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "local.yaml", local);
        write(dir.path(), "config-autoscaler.yaml", autoscaler);
        write(dir.path(), "config-activator.yaml", activator);
        let config = dir.path().join("local.yaml");
        Self::spawn(dir, Some(config))
    }

    /// As [`Thaw::start`], with more files (name, text) written beside local.yaml first.
    pub fn start_with(
        local: &str,
        autoscaler: &str,
        activator: &str,
        more: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "local.yaml", local);
        write(dir.path(), "config-autoscaler.yaml", autoscaler);
        write(dir.path(), "config-activator.yaml", activator);
        for (name, text) in more {
            write(dir.path(), name, text);
        }
        let config = dir.path().join("local.yaml");
        Self::spawn(dir, Some(config))
    }

    /// Starts `thaw local` without `--config` in a folder holding `./local.yaml` (and the fast
    /// ConfigMaps beside it).
    pub fn start_without_flag(local: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "local.yaml", local);
        write(dir.path(), "config-autoscaler.yaml", FAST_AUTOSCALER);
        write(dir.path(), "config-activator.yaml", FAST_ACTIVATOR);
        Self::spawn(dir, None)
    }

    /// Starts `thaw local` without `--config` in an empty folder: the built-in local.yaml.
    pub fn start_builtin() -> Self {
        Self::spawn(tempfile::tempdir().unwrap(), None)
    }

    fn spawn(dir: tempfile::TempDir, config: Option<PathBuf>) -> Self {
        Self::spawn_on(dir, config, "127.0.0.1:0", "127.0.0.1:0")
    }

    /// As [`Thaw::start`], listening on `listen` and `admin` as written on the command line.
    pub fn start_on(local: &str, listen: &str, admin: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "local.yaml", local);
        write(dir.path(), "config-autoscaler.yaml", FAST_AUTOSCALER);
        write(dir.path(), "config-activator.yaml", FAST_ACTIVATOR);
        let config = dir.path().join("local.yaml");
        Self::spawn_on(dir, Some(config), listen, admin)
    }

    fn spawn_on(
        dir: tempfile::TempDir,
        config: Option<PathBuf>,
        listen: &str,
        admin: &str,
    ) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_thaw"));
        cmd.args(["local", "--listen", listen, "--admin-listen", admin]);
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        let mut child = cmd
            .current_dir(dir.path())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start thaw local");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let (data, admin) = wait_ports(&logs, &mut child);
        let client = Client::builder(TokioExecutor::new()).build_http();
        Thaw {
            child,
            dir,
            data,
            admin,
            logs,
            client,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Rewrites a config file in place (as an editor that writes by rename would).
    pub fn edit(&self, name: &str, text: &str) {
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.path(name)).unwrap();
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    pub fn dump_logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// GET `path` with `Host: {host}`: (status, headers as lower-case "name: value" lines, body).
    pub async fn get(&self, host: &str, path: &str) -> (u16, String, String) {
        get(&self.client, self.data, host, path).await
    }

    /// A client of its own (for requests made from other tasks).
    pub fn client(&self) -> Client<HttpConnector, Empty<Bytes>> {
        self.client.clone()
    }

    /// GET on the admin port, as text.
    pub async fn get_admin_text(&self, path: &str) -> String {
        let (status, _, body) = get(&self.client, self.admin, "admin", path).await;
        assert_eq!(status, 200, "{path}: {body}");
        body
    }

    /// GET on the admin port, parsed as JSON.
    pub async fn admin_json(&self, path: &str) -> serde_json::Value {
        let (status, _, body) = get(&self.client, self.admin, "admin", path).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// Replica processes: thaw's live children (zombies excluded).
    pub fn replicas(&self) -> Vec<u32> {
        children_of(self.child.id())
    }

    /// Sends `signal` to thaw.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits for thaw to exit; its exit code.
    pub async fn wait_exit(&mut self) -> i32 {
        let deadline = tokio::time::Instant::now() + DEADLINE * 2;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "thaw did not exit:\n{}",
                self.dump_logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn get(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> (u16, String, String) {
    let req = hyper::Request::get(format!("http://{addr}{path}"))
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = tokio::time::timeout(DEADLINE, client.request(req))
        .await
        .unwrap_or_else(|_| panic!("GET {host}{path}: no answer within {DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("GET {host}{path}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| format!("{}: {}\n", k.as_str(), v.to_str().unwrap_or("?")))
        .collect();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// Reads the bound addresses from thaw's start-up log line.
fn wait_ports(logs: &Mutex<Vec<String>>, child: &mut Child) -> (SocketAddr, SocketAddr) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        {
            let logs = logs.lock().unwrap();
            if let Some(line) = logs.iter().find(|l| l.contains("thaw local listening")) {
                let field = |name: &str| -> SocketAddr {
                    let rest = &line[line.find(&format!("{name}=")).unwrap() + name.len() + 1..];
                    rest.split_whitespace().next().unwrap().parse().unwrap()
                };
                return (field("data"), field("admin"));
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "thaw exited ({status}) before listening:\n{}",
                logs.lock().unwrap().join("\n")
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "thaw did not start listening"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Live (non-zombie) child processes of `pid`, from /proc.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // Fields after the command (which may hold spaces) start after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let state = f.next();
        let ppid = f.next().and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) && state != Some("Z") {
            out.push(child);
        }
    }
    out
}

/// Polls `f` every 20 ms until it returns true; panics with `what` and the logs at the deadline.
pub async fn until<F, Fut>(thaw: &Thaw, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; logs:\n{}",
            thaw.dump_logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
