//! The local process platform when things go wrong: crashing commands, recovery, unexpected
//! exits, a taken port, removal, shutdown, and a SIGKILLed parent.

#[path = "platform_local_support/mod.rs"]
mod support;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use thaw::platform::local::{LocalRevision, pick_free_port};
use thaw::platform::{EndpointSource, EndpointStatus, Platform, PlatformError};
use thaw::telemetry::platform::{ExitLabels, ExitReason, RevisionLabels};

use support::*;

fn failing_reason(s: &thaw::platform::EndpointSnapshot) -> Option<String> {
    match &s.status {
        EndpointStatus::Failing { reason } => Some(reason.to_string()),
        EndpointStatus::Ok => None,
    }
}

fn exits(f: &Fixture, rev: &str, reason: ExitReason) -> u64 {
    f.metrics
        .exits
        .get_or_create(&ExitLabels {
            namespace: "default".into(),
            revision: rev.into(),
            reason,
        })
        .get()
}

#[tokio::test]
async fn a_crashing_command_makes_the_revision_fail_with_the_reason() {
    let f = fixture(|_| {});
    let k = key("crash-00001");
    f.platform.upsert(sample("crash-00001", &["--crash"]));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 1).await.unwrap();
    let snap = wait_snapshot(&mut rx, "Failing", |s| failing_reason(s).is_some()).await;
    assert_eq!(
        failing_reason(&snap).unwrap(),
        "replicas keep crashing: exit status 1 (last output: 'sample-app: crashing on purpose (--crash)')"
    );
    assert!(snap.ready.is_empty());
    assert!(exits(&f, "crash-00001", ExitReason::Crashed) >= 3);
    poll_until("the crash line in the log", || {
        f.logs.contains("0/stderr: sample-app: crashing on purpose")
    })
    .await;
    assert!(f.platform.status(&k).unwrap().consecutive_crashes >= 3);

    // Scaling to zero resets the revision to Ok (and stops the restart loop).
    f.platform.scale(&k, 0).await.unwrap();
    let snap = wait_snapshot(&mut rx, "Ok after scale to 0", |s| {
        s.status == EndpointStatus::Ok
    })
    .await;
    assert!(snap.ready.is_empty());
    poll_until("the slot gone", || {
        f.platform.status(&k).unwrap().replicas.is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_failing_revision_recovers_when_a_later_replica_becomes_ready() {
    let f = fixture(|_| {});
    let k = key("flaky-00001");
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("broken");
    std::fs::write(&flag, "").unwrap();
    // Crashes while the flag file exists, then runs the sample app.
    let script =
        r#"if [ -e "$FLAG" ]; then echo "still broken" >&2; exit 3; fi; exec "$THAW" sample-app"#;
    f.platform.upsert(
        LocalRevision::new(k.clone(), ["/bin/sh", "-c", script])
            .env("FLAG", flag.to_str().unwrap())
            .env("THAW", env!("CARGO_BIN_EXE_thaw")),
    );
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 1).await.unwrap();
    let snap = wait_snapshot(&mut rx, "Failing", |s| failing_reason(s).is_some()).await;
    assert_eq!(
        failing_reason(&snap).unwrap(),
        "replicas keep crashing: exit status 3 (last output: 'still broken')"
    );

    std::fs::remove_file(&flag).unwrap();
    let snap = wait_snapshot(&mut rx, "recovered", |s| {
        s.status == EndpointStatus::Ok && s.ready.len() == 1
    })
    .await;
    assert_eq!(get(snap.ready[0], "/").await.0, 200);
    let st = f.platform.status(&k).unwrap();
    assert_eq!(st.consecutive_crashes, 0);
    assert!(st.restarts >= 3, "{st:?}");
    let restarts = f
        .metrics
        .restarts
        .get_or_create(&RevisionLabels {
            namespace: "default".into(),
            revision: "flaky-00001".into(),
        })
        .get();
    assert_eq!(restarts, st.restarts);
    f.platform.shutdown().await;
}

#[tokio::test]
async fn a_replica_that_exits_on_its_own_is_replaced() {
    let f = fixture(|_| {});
    let k = key("victim-00001");
    f.platform.upsert(sample("victim-00001", &[]));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 1).await.unwrap();
    wait_snapshot(&mut rx, "ready", |s| s.ready.len() == 1).await;
    let pid = pids(&f.platform, &k)[0];

    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    // Snapshots coalesce, so wait on the replacement's pid rather than the empty snapshot.
    poll_until("a ready replacement process", || {
        f.platform.status(&k).unwrap().replicas.iter().any(|r| {
            r.state == thaw::platform::local::ReplicaState::Ready && r.pid.is_some_and(|p| p != pid)
        })
    })
    .await;
    let second = rx.borrow_and_update().clone();
    assert_eq!(second.ready.len(), 1);
    assert_eq!(
        second.status,
        EndpointStatus::Ok,
        "one exit after ready is no crash loop"
    );
    assert!(!alive(pid));
    assert_eq!(get(second.ready[0], "/").await.0, 200);
    assert_eq!(exits(&f, "victim-00001", ExitReason::Exited), 1);
    let st = f.platform.status(&k).unwrap();
    assert_eq!((st.restarts, st.replicas[0].restarts), (1, 1));
    f.platform.shutdown().await;
}

#[tokio::test]
async fn a_port_taken_meanwhile_is_retried_on_a_new_port() {
    // A socket bound without SO_REUSEADDR and not listening: the replica's bind fails, and a
    // probe to it is refused (as if another process had grabbed the port first).
    let blocker = tokio::net::TcpSocket::new_v4().unwrap();
    blocker
        .bind(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)))
        .unwrap();
    let taken = blocker.local_addr().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let calls2 = calls.clone();
    let f = fixture(move |o| {
        o.port_picker = Arc::new(move || {
            if calls2.fetch_add(1, Ordering::SeqCst) == 0 {
                Ok(taken.port())
            } else {
                pick_free_port()
            }
        })
    });
    let k = key("race-00001");
    f.platform.upsert(sample("race-00001", &[]));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 1).await.unwrap();
    let snap = wait_snapshot(&mut rx, "ready", |s| s.ready.len() == 1).await;
    assert_ne!(snap.ready[0], taken);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(exits(&f, "race-00001", ExitReason::PortTaken), 1);
    assert_eq!(exits(&f, "race-00001", ExitReason::Crashed), 0);
    let st = f.platform.status(&k).unwrap();
    assert_eq!((st.consecutive_crashes, st.restarts), (0, 0));
    poll_until("the failed bind in the log", || {
        f.logs.contains("cannot listen on")
    })
    .await;
    drop(blocker);
    f.platform.shutdown().await;
}

#[tokio::test]
async fn a_program_that_cannot_start_fails_the_revision() {
    let f = fixture(|_| {});
    let k = key("missing-00001");
    f.platform.upsert(LocalRevision::new(
        k.clone(),
        ["/nonexistent/thaw-test-binary"],
    ));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 1).await.unwrap();
    let snap = wait_snapshot(&mut rx, "Failing", |s| failing_reason(s).is_some()).await;
    let reason = failing_reason(&snap).unwrap();
    assert!(
        reason.starts_with("replicas keep crashing: could not start"),
        "{reason}"
    );
    assert!(exits(&f, "missing-00001", ExitReason::SpawnFailed) >= 3);
    f.platform.shutdown().await;
}

#[tokio::test]
async fn removing_a_revision_fails_it_with_the_reason_and_stops_its_replicas() {
    let f = fixture(|o| o.drain_timeout = Duration::from_millis(100));
    let k = key("gone-00001");
    f.platform.upsert(sample("gone-00001", &[]));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 2).await.unwrap();
    wait_snapshot(&mut rx, "ready", |s| s.ready.len() == 2).await;
    let before = pids(&f.platform, &k);

    f.platform.remove(&k, "service hello deleted");
    let snap = rx.borrow_and_update().clone();
    assert_eq!(
        failing_reason(&snap).as_deref(),
        Some("revision removed: service hello deleted")
    );
    assert!(snap.ready.is_empty());
    wait_snapshot(&mut rx, "all stopped", |s| s.terminating.is_empty()).await;
    assert!(before.iter().all(|&p| !alive(p)));
    assert!(matches!(
        f.platform.scale(&k, 1).await,
        Err(PlatformError::UnknownRevision(_))
    ));
    assert!(f.platform.scale(&k, 0).await.is_ok());

    // Defined again: scalable and Ok.
    f.platform.upsert(sample("gone-00001", &[]));
    f.platform.scale(&k, 1).await.unwrap();
    wait_snapshot(&mut rx, "ready again", |s| {
        s.ready.len() == 1 && s.status == EndpointStatus::Ok
    })
    .await;
    f.platform.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_every_replica_even_one_ignoring_sigterm() {
    let f = fixture(|o| o.kill_grace = Duration::from_millis(300));
    let a = key("a-00001");
    let b = key("b-00001");
    f.platform.upsert(sample("a-00001", &[]));
    f.platform.upsert(sample("b-00001", &["--ignore-sigterm"]));
    let (mut ra, mut rb) = (f.platform.endpoints(&a), f.platform.endpoints(&b));
    f.platform.scale(&a, 2).await.unwrap();
    f.platform.scale(&b, 1).await.unwrap();
    wait_snapshot(&mut ra, "a ready", |s| s.ready.len() == 2).await;
    wait_snapshot(&mut rb, "b ready", |s| s.ready.len() == 1).await;
    let mut all = pids(&f.platform, &a);
    all.extend(pids(&f.platform, &b));
    assert_eq!(all.len(), 3);

    tokio::time::timeout(DEADLINE, f.platform.shutdown())
        .await
        .expect("shutdown is bounded");
    for p in &all {
        assert!(!alive(*p), "pid {p} outlived shutdown");
    }
    assert!(f.platform.status(&a).unwrap().replicas.is_empty());
    assert!(matches!(
        f.platform.scale(&a, 1).await,
        Err(PlatformError::Scale { .. })
    ));
    // A second call returns at once.
    tokio::time::timeout(DEADLINE, f.platform.shutdown())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_sample_app_exits_when_its_parent_is_sigkilled() {
    // A shell stands in for thaw: it starts the app in the background and prints its pid.
    let port = pick_free_port().unwrap();
    let mut parent = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(r#""$THAW" sample-app --port "$P" >/dev/null 2>&1 & echo $!; exec sleep 60"#)
        .env("THAW", env!("CARGO_BIN_EXE_thaw"))
        .env("P", port.to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(parent.stdout.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
        .await
        .unwrap();
    let app: u32 = line.trim().parse().unwrap();
    poll_until("the app listening", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;

    parent.start_kill().unwrap(); // SIGKILL: no chance to clean up
    parent.wait().await.unwrap();
    poll_until("the orphaned app to exit", || !alive(app)).await;
}

/// A replica told to stop during its start-up delay stops at once, not after the kill grace.
#[test]
fn sample_app_stops_on_sigterm_during_its_startup_delay() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args(["sample-app", "--port", "0", "--startup-delay", "60s"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Give it time to install its handlers (it does so before the delay starts).
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still sleeping out its start-up delay"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `--threads 2` serves on a multi-threaded runtime (the load tests' `REPLICA_THREADS`) and
/// still stops cleanly on SIGTERM; `--threads 0` is refused.
#[test]
fn sample_app_serves_on_several_threads() {
    use std::io::{Read, Write};
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args(["sample-app", "--port", "1", "--threads", "0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--threads"));

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args(["sample-app", "--port", &port.to_string(), "--threads", "2"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut stream = loop {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            break s;
        }
        assert!(tokio::time::Instant::now() < deadline, "never listened");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let threads = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .count();
    assert!(threads >= 3, "main thread and two workers, found {threads}");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok\n"), "{answer}");

    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "did not stop on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
