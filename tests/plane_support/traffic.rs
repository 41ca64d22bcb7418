//! A steady client through the plane's ingress gateway pod (istio-system/istio-ingressgateway
//! at its pod's address, as the EndpointSlice controller lists it): for one host, two loops at
//! once, one on kept-alive connections and one opening a fresh connection per request, each
//! sending its next GET [`SteadyLoop::start`]'s `pace` after the previous one ended. Every
//! request's outcome is counted: 200 is ok; any other status, a transport error, or no
//! complete answer within [`REQUEST_TIMEOUT`] is a failure, the first [`KEPT_FAILURES`] of
//! each flavour kept with when and what. [`Report::since`] gives one phase's counts (a
//! rollout's).

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Failures whose details are kept, per flavour.
pub const KEPT_FAILURES: usize = 5;
/// The longest a request may take, head and body, before it counts as failed (a cold start
/// through the activator takes a few seconds on the plane).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`SteadyLoop::stop`] lets a request in flight finish; one still running then is
/// counted as a failure.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One flavour's counts.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub requests: u64,
    pub ok: u64,
    pub failures: u64,
    /// The first [`KEPT_FAILURES`]: when (from the loop's start) and what.
    pub first_failures: Vec<(Duration, String)>,
}

impl Counts {
    fn since(&self, earlier: &Counts, from: Duration) -> Counts {
        Counts {
            requests: self.requests - earlier.requests,
            ok: self.ok - earlier.ok,
            failures: self.failures - earlier.failures,
            first_failures: self
                .first_failures
                .iter()
                .filter(|(at, _)| *at >= from)
                .cloned()
                .collect(),
        }
    }
}

/// Both flavours' counts over a span.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub host: String,
    pub keepalive: Counts,
    pub fresh: Counts,
    /// From the loop's start to the end of the span.
    pub ran: Duration,
    /// The span's start, from the loop's start (0 for the whole run).
    pub from: Duration,
}

impl Report {
    pub fn failures(&self) -> u64 {
        self.keepalive.failures + self.fresh.failures
    }

    pub fn requests(&self) -> u64 {
        self.keepalive.requests + self.fresh.requests
    }

    /// The counts of the span from `earlier` (a report of the same loop) to this one; the
    /// failures kept are those of the span.
    pub fn since(&self, earlier: &Report) -> Report {
        Report {
            host: self.host.clone(),
            keepalive: self.keepalive.since(&earlier.keepalive, earlier.ran),
            fresh: self.fresh.since(&earlier.fresh, earlier.ran),
            ran: self.ran,
            from: earlier.ran,
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} requests, {} failed over {:.1}s (keep-alive {}/{} failed, fresh {}/{} failed)",
            self.host,
            self.requests(),
            self.failures(),
            (self.ran - self.from).as_secs_f64(),
            self.keepalive.failures,
            self.keepalive.requests,
            self.fresh.failures,
            self.fresh.requests,
        )?;
        for (name, c) in [("keep-alive", &self.keepalive), ("fresh", &self.fresh)] {
            for (at, what) in &c.first_failures {
                write!(f, "\n    {name} at +{:.3}s: {what}", at.as_secs_f64())?;
            }
        }
        Ok(())
    }
}

/// The running loops of one host; aborted when dropped.
pub struct SteadyLoop {
    host: String,
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
    /// Starts GETs of `path` with `Host: host` to the gateway pod at `gateway`, one at a time
    /// per flavour, `pace` apart.
    pub fn start(gateway: SocketAddr, host: &str, path: &str, pace: Duration) -> Self {
        let stop = CancellationToken::new();
        let started = Instant::now();
        let counts: [Arc<Mutex<Counts>>; 2] = [Arc::default(), Arc::default()];
        let keepalive: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let fresh: HttpClient = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http();
        let tasks = [keepalive, fresh]
            .into_iter()
            .zip(&counts)
            .map(|(client, counts)| {
                tokio::spawn(run(Loop {
                    client,
                    url: format!("http://{gateway}{path}"),
                    host: host.to_string(),
                    pace,
                    stop: stop.clone(),
                    started,
                    counts: counts.clone(),
                }))
            })
            .collect();
        Self {
            host: host.to_string(),
            stop,
            started,
            counts,
            tasks,
        }
    }

    /// The counts so far.
    pub fn report(&self) -> Report {
        Report {
            host: self.host.clone(),
            keepalive: self.counts[0].lock().unwrap().clone(),
            fresh: self.counts[1].lock().unwrap().clone(),
            ran: self.started.elapsed(),
            from: Duration::ZERO,
        }
    }

    /// Stops both loops (a request in flight may finish within [`STOP_GRACE`]) and returns
    /// the counts of the whole run.
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

/// One flavour's loop.
struct Loop {
    client: HttpClient,
    url: String,
    host: String,
    pace: Duration,
    stop: CancellationToken,
    started: Instant,
    counts: Arc<Mutex<Counts>>,
}

async fn run(l: Loop) {
    while !l.stop.is_cancelled() {
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, get(&l.client, &l.url, &l.host))
            .await
            .unwrap_or_else(|_| Err(format!("no complete answer in {REQUEST_TIMEOUT:?}")));
        {
            let mut c = l.counts.lock().unwrap();
            c.requests += 1;
            match outcome {
                Ok((200, _)) => c.ok += 1,
                Ok((status, body)) => record(
                    &mut c,
                    l.started.elapsed(),
                    format!("{status}: {}", body.trim()),
                ),
                Err(e) => record(&mut c, l.started.elapsed(), e),
            }
        }
        tokio::select! {
            () = l.stop.cancelled() => return,
            () = tokio::time::sleep(l.pace) => {}
        }
    }
}

async fn get(client: &HttpClient, url: &str, host: &str) -> Result<(u16, String), String> {
    let req = http::Request::get(url)
        .header(http::header::HOST, host)
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.map_err(|e| {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(inner) = src {
            s.push_str(&format!(": {inner}"));
            src = inner.source();
        }
        s
    })?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("the body broke: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
