//! A steady client through the [`Ingress`]: two loops at once, one on kept-alive connections
//! and one opening a fresh connection per request, each sending its next request
//! [`SteadyLoop::start`]'s `pace` after the previous one ended. Counts requests and failures
//! (a status other than 200, or a transport error) and keeps the first failures' details.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ingress::{HttpClient, Ingress, fresh_client, keepalive_client};

/// Failures whose details are kept, per flavour.
pub const KEPT_FAILURES: usize = 5;
/// How long [`SteadyLoop::stop`] lets a request in flight finish; one still running then is
/// counted as a failure.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// One flavour's counts.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub requests: u64,
    pub ok: u64,
    pub failures: u64,
    /// The first [`KEPT_FAILURES`]: when (from the loop's start) and what.
    pub first_failures: Vec<(Duration, String)>,
}

/// Both flavours' counts.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub keepalive: Counts,
    pub fresh: Counts,
    pub ran: Duration,
}

impl Report {
    pub fn failures(&self) -> u64 {
        self.keepalive.failures + self.fresh.failures
    }

    pub fn requests(&self) -> u64 {
        self.keepalive.requests + self.fresh.requests
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "steady traffic for {:.1}s:", self.ran.as_secs_f64())?;
        for (name, c) in [("keep-alive", &self.keepalive), ("fresh", &self.fresh)] {
            writeln!(
                f,
                "  {name:<10} {} requests, {} ok, {} failed",
                c.requests, c.ok, c.failures
            )?;
            for (at, what) in &c.first_failures {
                writeln!(f, "    at {:.3}s: {what}", at.as_secs_f64())?;
            }
        }
        Ok(())
    }
}

/// The running loops.
pub struct SteadyLoop {
    stop: CancellationToken,
    started: Instant,
    counts: [Arc<Mutex<Counts>>; 2],
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for SteadyLoop {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl SteadyLoop {
    /// Starts GETs of `path` on `host` through `ingress`, one at a time per flavour, `pace`
    /// apart.
    pub fn start(ingress: Arc<Ingress>, host: &str, path: &str, pace: Duration) -> Self {
        let stop = CancellationToken::new();
        let started = Instant::now();
        let counts: [Arc<Mutex<Counts>>; 2] = [Arc::default(), Arc::default()];
        let mut tasks = Vec::new();
        for (i, client) in [keepalive_client(), fresh_client()].into_iter().enumerate() {
            tasks.push(tokio::spawn(run(
                ingress.clone(),
                client,
                host.to_string(),
                path.to_string(),
                pace,
                stop.clone(),
                started,
                counts[i].clone(),
            )));
        }
        Self {
            stop,
            started,
            counts,
            tasks,
        }
    }

    /// The counts so far.
    pub fn report(&self) -> Report {
        Report {
            keepalive: self.counts[0].lock().unwrap().clone(),
            fresh: self.counts[1].lock().unwrap().clone(),
            ran: self.started.elapsed(),
        }
    }

    /// Stops both loops (a request in flight may finish within [`STOP_GRACE`]) and returns
    /// the counts.
    pub async fn stop(mut self) -> Report {
        self.stop.cancel();
        let deadline = Instant::now() + STOP_GRACE;
        for (i, t) in std::mem::take(&mut self.tasks).into_iter().enumerate() {
            if tokio::time::timeout_at(deadline, t).await.is_err() {
                let mut c = self.counts[i].lock().unwrap();
                c.requests += 1;
                record(
                    &mut c,
                    self.started.elapsed(),
                    format!("still in flight {STOP_GRACE:?} after stop"),
                );
            }
        }
        self.report()
    }
}

fn record(c: &mut Counts, at: Duration, what: String) {
    c.failures += 1;
    if c.first_failures.len() < KEPT_FAILURES {
        c.first_failures.push((at, what));
    }
}

#[allow(clippy::too_many_arguments, reason = "one loop's whole configuration")]
async fn run(
    ingress: Arc<Ingress>,
    client: HttpClient,
    host: String,
    path: String,
    pace: Duration,
    stop: CancellationToken,
    started: Instant,
    counts: Arc<Mutex<Counts>>,
) {
    while !stop.is_cancelled() {
        let result = ingress.get(&client, &host, &path).await;
        {
            let mut c = counts.lock().unwrap();
            c.requests += 1;
            match result {
                Ok(r) if r.status == 200 => c.ok += 1,
                Ok(r) => record(
                    &mut c,
                    started.elapsed(),
                    format!("{} from {}: {}", r.status, r.endpoint, r.body.trim()),
                ),
                Err(e) => record(&mut c, started.elapsed(), e),
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pace) => {}
        }
    }
}

/// Stops every loop, prints its report, and checks that each ran both flavours and that no
/// request failed.
pub async fn stop_all_and_check(loops: Vec<(&str, SteadyLoop)>) {
    for (name, l) in loops {
        let report = l.stop().await;
        println!("{name}: {report}");
        assert!(
            report.keepalive.requests > 0 && report.fresh.requests > 0,
            "{report}"
        );
        assert_eq!(report.failures(), 0, "{name}: {report}");
    }
}
