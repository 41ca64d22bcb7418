//! One replica process: picking its port, spawning it in its own process group with its output
//! piped into the log, and stopping it (SIGTERM to the group, SIGKILL after a grace).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::LocalRevision;
use super::logs::{self, LastLine, LogLimits, LogSink, PumpTarget, Stream};

/// Whether `port` can be bound on the loopback interface right now (a declared containerPort
/// is given to a replica only then).
pub(crate) fn port_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Picks a free loopback port by binding `127.0.0.1:0` and releasing it. Another process may
/// take the port before the replica binds it; the platform detects that and retries.
pub fn pick_free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Whether another socket holds `addr` (binding it fails with `AddrInUse`).
pub(crate) fn port_in_use(addr: SocketAddr) -> bool {
    matches!(TcpListener::bind(addr), Err(e) if e.kind() == io::ErrorKind::AddrInUse)
}

/// A running replica process and the pumps carrying its output.
pub(crate) struct Spawned {
    pub child: Child,
    /// Also the process group id (the child leads its own group).
    pub pid: u32,
    pub addr: SocketAddr,
    pub started_at: Instant,
    stdout_last: LastLine,
    stderr_last: LastLine,
    pumps: Vec<JoinHandle<()>>,
}

/// Who the replica is, for its environment and its log lines.
pub(crate) struct SpawnContext<'a> {
    pub def: &'a LocalRevision,
    pub thaw_exe: &'a Path,
    pub replica: u32,
    pub sink: &'a Arc<dyn LogSink>,
    pub limits: LogLimits,
}

/// Spawns the revision's command on `port`: `PORT` and `K_REVISION` set, stdin closed,
/// stdout/stderr piped to the log sink, its own process group, SIGKILLed if dropped.
/// A first word `thaw` runs `thaw_exe`.
pub(crate) fn spawn(cx: &SpawnContext<'_>, port: u16) -> io::Result<Spawned> {
    let (first, args) = cx
        .def
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let program: &Path = if first == "thaw" {
        cx.thaw_exe
    } else {
        Path::new(first)
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(cx.def.env.iter().map(|(k, v)| (k, v)))
        .env("PORT", port.to_string())
        .env("K_REVISION", &*cx.def.key.name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group: a terminal's Ctrl-C (SIGINT to the foreground group) reaches
        // thaw only, and thaw can signal the replica together with anything it forked.
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &cx.def.working_dir {
        cmd.current_dir(dir);
    }
    let started_at = Instant::now();
    let mut child = cmd.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("child exited before its pid was read"))?;
    let stdout_last = LastLine::default();
    let stderr_last = LastLine::default();
    let mut pumps = Vec::with_capacity(2);
    let target = |stream, last_line: &LastLine| PumpTarget {
        sink: cx.sink.clone(),
        revision: cx.def.key.clone(),
        replica: cx.replica,
        stream,
        limits: cx.limits,
        last_line: last_line.clone(),
    };
    if let Some(out) = child.stdout.take() {
        pumps.push(tokio::spawn(logs::pump(
            out,
            target(Stream::Stdout, &stdout_last),
        )));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(tokio::spawn(logs::pump(
            err,
            target(Stream::Stderr, &stderr_last),
        )));
    }
    Ok(Spawned {
        child,
        pid,
        addr: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
        started_at,
        stdout_last,
        stderr_last,
        pumps,
    })
}

impl Spawned {
    /// Waits (at most [`logs::OUTPUT_FLUSH_WAIT`]) for the output of the exited process to be
    /// read to its end, then returns its last line: stderr's if it wrote any, else stdout's.
    pub(crate) async fn last_output(&mut self) -> Option<String> {
        let pumps = std::mem::take(&mut self.pumps);
        let _ = tokio::time::timeout(logs::OUTPUT_FLUSH_WAIT, async {
            for p in pumps {
                let _ = p.await;
            }
        })
        .await;
        let read = |l: &LastLine| l.lock().ok().and_then(|g| g.clone());
        read(&self.stderr_last).or_else(|| read(&self.stdout_last))
    }

    /// Stops the process group: SIGTERM, then SIGKILL if the leader has not exited after
    /// `grace`. Returns the leader's exit status, or `None` if even SIGKILL did not reap it
    /// within another `grace` (logged; `kill_on_drop` tries again when `self` drops).
    /// Group members left behind by an exited leader are SIGKILLed too.
    pub(crate) async fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        let pgid = Pid::from_raw(self.pid as i32);
        signal_group(pgid, Signal::SIGTERM);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                tracing::warn!(
                    pid = self.pid,
                    ?grace,
                    "replica ignored SIGTERM; sending SIGKILL"
                );
                signal_group(pgid, Signal::SIGKILL);
                match tokio::time::timeout(grace, self.child.wait()).await {
                    Ok(status) => status.ok(),
                    Err(_) => {
                        tracing::error!(pid = self.pid, "replica survived SIGKILL");
                        None
                    }
                }
            }
        };
        // The leader is reaped; sweep anything it forked into its group. The pgid cannot have
        // been reused while members remain, and ESRCH (none left) is the common case.
        signal_group(pgid, Signal::SIGKILL);
        status
    }
}

fn signal_group(pgid: Pid, sig: Signal) {
    match killpg(pgid, sig) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => {
            tracing::warn!(pgid = pgid.as_raw(), ?sig, error = %e, "signalling replica group failed")
        }
    }
}

/// `exit status 1`, `killed by signal 9 (SIGKILL)`.
pub(crate) fn exit_status_text(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        format!("exit status {code}")
    } else if let Some(sig) = status.signal() {
        match Signal::try_from(sig) {
            Ok(s) => format!("killed by signal {sig} ({})", s.as_str()),
            Err(_) => format!("killed by signal {sig}"),
        }
    } else {
        status.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_read_like_a_shell() {
        assert_eq!(
            exit_status_text(ExitStatus::from_raw(1 << 8)),
            "exit status 1"
        );
        assert_eq!(
            exit_status_text(ExitStatus::from_raw(9)),
            "killed by signal 9 (SIGKILL)"
        );
    }

    #[test]
    fn a_bound_port_is_in_use_and_a_released_one_is_not() {
        let held = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = held.local_addr().unwrap();
        assert!(port_in_use(addr));
        drop(held);
        assert!(!port_in_use(addr));
        assert_ne!(pick_free_port().unwrap(), 0);
    }
}
