//! One `thaw` role process: its address, its relay to the API server, its arguments (kept, so
//! a drill restarts it exactly as it was started) and its log (one file across restarts).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::cluster::AdoptedPod;
use super::{
    ACTIVATOR_PORT, ADMIN_PORT, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, STATS_PORT, SYSTEM,
};
use crate::kube_support::TestApi;
use crate::kube_support::relay::Relay;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleKind {
    Controller,
    Autoscaler,
    Activator,
}

impl RoleKind {
    fn word(self) -> &'static str {
        match self {
            RoleKind::Controller => "controller",
            RoleKind::Autoscaler => "autoscaler",
            RoleKind::Activator => "activator",
        }
    }
}

/// A role process; killed when dropped.
pub struct Role {
    pub kind: RoleKind,
    /// `activator-1`: also its `POD_NAME` (its name in stats and the Lease).
    pub name: String,
    pub ip: Ipv4Addr,
    /// Between this process and the API server: cut it to partition the role.
    pub relay: Relay,
    pub log: PathBuf,
    kubeconfig: PathBuf,
    args: Vec<String>,
    child: Mutex<Option<Child>>,
}

impl Drop for Role {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl Role {
    /// Starts role `kind` number `n` on `ip`, as deploy/ runs it (its ports on its own address).
    pub async fn start(api: &TestApi, dir: &Path, kind: RoleKind, n: usize, ip: Ipv4Addr) -> Self {
        let name = format!("{}-{n}", kind.word());
        let relay = Relay::start(api.addr()).await;
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        crate::kube_support::write_kubeconfig(&kubeconfig, relay.addr(), SYSTEM);
        let lease = [
            format!("--lease-duration={LEASE_DURATION}"),
            format!("--renew-deadline={RENEW_DEADLINE}"),
            format!("--retry-period={RETRY_PERIOD}"),
        ];
        let mut args = vec![
            kind.word().to_string(),
            format!("--system-namespace={SYSTEM}"),
            format!("--admin-listen={ip}:{ADMIN_PORT}"),
        ];
        match kind {
            RoleKind::Controller => args.extend(lease),
            RoleKind::Autoscaler => {
                args.push(format!("--stats-listen={ip}:{STATS_PORT}"));
                args.push(format!("--stats-advertise={ip}:{STATS_PORT}"));
                args.extend(lease);
            }
            RoleKind::Activator => args.push(format!("--listen={ip}:{ACTIVATOR_PORT}")),
        }
        let role = Self {
            kind,
            log: dir.join(format!("{name}.log")),
            name,
            ip,
            relay,
            kubeconfig,
            args,
            child: Mutex::new(None),
        };
        role.spawn();
        role
    }

    fn spawn(&self) {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let _ = writeln!(file, "----- thaw {} -----", self.args.join(" "));
        let child = Command::new(env!("CARGO_BIN_EXE_thaw"))
            .args(&self.args)
            .env_clear()
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .env("POD_NAME", &self.name)
            .env("POD_IP", self.ip.to_string())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        *self.child.lock().unwrap() = Some(child);
    }

    /// The admin port (/readyz, /metrics, /revisions, /leader).
    pub fn admin(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip), ADMIN_PORT)
    }

    /// An activator's data address (activator-service lists it).
    pub fn data(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip), ACTIVATOR_PORT)
    }

    /// An autoscaler's stats address (the Lease names the leader's).
    pub fn stats(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip), STATS_PORT)
    }

    /// The role's pod as the kubelet reports it (activators: activator-service's endpoints).
    pub fn pod(&self) -> AdoptedPod {
        AdoptedPod {
            namespace: SYSTEM.into(),
            name: self.name.clone(),
            ip: self.ip,
            labels: [(
                "app.kubernetes.io/name".to_string(),
                self.kind.word().into(),
            )]
            .into(),
            ports: vec![
                ("http".into(), ACTIVATOR_PORT),
                ("admin".into(), ADMIN_PORT),
            ],
            readiness: ("admin".into(), "/readyz".into()),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(Child::id)
    }

    /// Whether the process runs (reaps it if it exited).
    pub fn running(&self) -> bool {
        let mut c = self.child.lock().unwrap();
        match c.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                *c = None;
                false
            }
            None => false,
        }
    }

    pub fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
        }
    }

    /// kill -9, and reaps it.
    pub fn kill9(&self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM (the role drains and exits on its own; see [`Role::wait_exit`]).
    pub fn sigterm(&self) {
        self.signal(Signal::SIGTERM);
    }

    /// Waits up to `within` for the process to exit; its status, `None` if it still runs.
    pub async fn wait_exit(&self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            {
                let mut c = self.child.lock().unwrap();
                match c.as_mut().map(Child::try_wait) {
                    Some(Ok(Some(st))) => {
                        *c = None;
                        return Some(st);
                    }
                    None => return None,
                    _ => {}
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the process again with the same arguments (kills it first if it still runs).
    pub fn restart(&self) {
        self.kill9();
        self.spawn();
    }

    /// Cuts the role off the API server (open connections closed, new ones refused).
    pub fn cut(&self) {
        self.relay.cut();
    }

    pub fn restore(&self) {
        self.relay.restore();
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
