//! Wrapper mode, `thaw queue -- COMMAND`: the sidecar starts the user container as its own
//! child, as a pod would run the two side by side. How `thaw local` runs a replica behind a
//! sidecar: the platform starts, probes and stops one process per replica as ever.
//!
//! - Ports: the data port defaults to 127.0.0.1:`$PORT` (the port the platform gave the
//!   replica), the admin port to 127.0.0.1 on a free port, the user container's to `USER_PORT`
//!   or a free port; the child gets it as `PORT`. A first word `thaw` is this executable.
//! - The data port opens only once the child answers its probe, so a TCP probe of the replica
//!   means "ready through the sidecar".
//! - The child's exit ends the sidecar (after a drain; exit 1). After a drain for a signal, the
//!   child is stopped: SIGTERM, SIGKILL after [`STOP_GRACE`].

use std::net::SocketAddr;

use tokio::process::Child;
use tokio::signal::unix::Signal;
use tokio::time::{Duration, Instant};

use super::probe;
use super::settings::{self, Settings};

/// How long the child has to stop after SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The wrapper's defaults, where the flags and the environment leave them open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// The data listener (127.0.0.1:`$PORT`).
    pub listen: Option<SocketAddr>,
    /// The admin listener (127.0.0.1 on a free port).
    pub admin_listen: Option<SocketAddr>,
    /// A free port for the user container, when `USER_PORT` is unset.
    pub user_port: Option<u16>,
}

/// [`Defaults`] from the flags and the environment (`env`), or why not.
pub fn defaults(
    listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Defaults, String> {
    let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let mut listen = listen;
    if listen.is_none() && env(settings::QUEUE_SERVING_PORT).is_none() {
        match env("PORT").map(|p| p.parse::<u16>()) {
            Some(Ok(p)) => listen = Some(loopback(p)),
            Some(Err(_)) => return Err("thaw queue: PORT is not a port number".into()),
            None => {}
        }
    }
    let user_port = match env(settings::USER_PORT) {
        Some(_) => None,
        None => Some(
            std::net::TcpListener::bind(loopback(0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| format!("thaw queue: no free port for the user container: {e}"))?,
        ),
    };
    Ok(Defaults {
        listen,
        admin_listen: admin_listen.or(Some(loopback(0))),
        user_port,
    })
}

/// Starts `command` and waits until it answers its probe (backoff as [`probe::run`]). `None`:
/// SIGTERM came first (the child is killed on drop). An error: it could not start, or exited.
pub async fn start_until_ready(
    command: &[String],
    settings: &Settings,
    term: &mut Signal,
) -> Result<Option<Child>, String> {
    let Some((program, args)) = command.split_first() else {
        return Err("thaw queue: no command after --".into());
    };
    let program = match program.as_str() {
        "thaw" => std::env::current_exe()
            .map_err(|e| format!("thaw queue: cannot find its own executable: {e}"))?,
        other => other.into(),
    };
    let mut child = tokio::process::Command::new(&program)
        .args(args)
        .env("PORT", settings.user.port().to_string())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("thaw queue: cannot start {program:?}: {e}"))?;
    tracing::info!(
        pid = child.id(),
        port = settings.user.port(),
        "user container started"
    );
    let mut delay = Duration::from_micros(250);
    let began = Instant::now();
    loop {
        tokio::select! {
            ok = probe::probe_once(&settings.probe) => if ok { return Ok(Some(child)) },
            status = child.wait() => {
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                return Err(format!(
                    "thaw queue: the user container exited before it was ready ({status})"
                ));
            }
            _ = term.recv() => {
                tracing::info!("SIGTERM before the user container was ready");
                return Ok(None);
            }
        }
        delay = probe::next_delay(delay, began.elapsed());
        tokio::time::sleep(delay).await;
    }
}

/// Stops the child after a drain: SIGTERM, SIGKILL after [`STOP_GRACE`].
pub async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        tracing::warn!("the user container did not stop within {STOP_GRACE:?} of SIGTERM: SIGKILL");
        let _ = child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_replicas_port_is_the_data_port_and_the_rest_is_free() {
        let d = defaults(None, None, env(&[("PORT", "18123")])).unwrap();
        assert_eq!(d.listen, Some("127.0.0.1:18123".parse().unwrap()));
        assert_eq!(d.admin_listen, Some("127.0.0.1:0".parse().unwrap()));
        assert!(d.user_port.is_some_and(|p| p != 0));
        // What is set stays.
        let flag: SocketAddr = "127.0.0.1:7".parse().unwrap();
        let d = defaults(
            Some(flag),
            Some(flag),
            env(&[("PORT", "18123"), ("USER_PORT", "8080")]),
        )
        .unwrap();
        assert_eq!(
            (d.listen, d.admin_listen, d.user_port),
            (Some(flag), Some(flag), None)
        );
        let d = defaults(
            None,
            None,
            env(&[("PORT", "1"), ("QUEUE_SERVING_PORT", "8012")]),
        )
        .unwrap();
        assert_eq!(d.listen, None, "QUEUE_SERVING_PORT wins over PORT");
        let e = defaults(None, None, env(&[("PORT", "x")])).unwrap_err();
        assert!(e.contains("PORT is not a port number"), "{e}");
    }
}
