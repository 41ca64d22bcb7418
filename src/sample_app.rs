//! `thaw sample-app`: a tiny HTTP/1.1 + h2c server that thaw runs as a replica in the default
//! `local.yaml` and in tests, so nothing else has to be installed.
//!
//! - `GET /` answers `Hello from <name>!\n`, after `--response-delay`. The name is `--message`,
//!   else `$TARGET` (as Knative's helloworld), else `$K_REVISION`, else `thaw`.
//! - `GET /stream?chunks=N&delay=D` streams N lines (at most 10 000), D apart (default 5 and
//!   100ms), for streaming tests.
//! - `GET /healthz` answers `ok` at once.
//! - `GET /inflight` answers `{"inFlight":N,"peak":M}`: requests to `/` and `/stream` being
//!   handled now, and the most ever at once (tests check a concurrency limit in front of it).
//! - Listens on `127.0.0.1:$PORT` (or `--port`; `--host` for another address, such as a pod's
//!   own loopback address when several pods share one host) after `--startup-delay` (a slow
//!   cold start).
//! - `--crash` writes one line to stderr and exits 1 at once (a crashing revision).
//! - SIGTERM or SIGINT: stops accepting, finishes in-flight requests (at most 30 s), exits 0.
//!   `--ignore-sigterm` ignores SIGTERM (an app that must be SIGKILLed).
//! - Exits when its parent process dies (`getppid()` checked every second), so it cannot
//!   linger after a SIGKILLed thaw: replicas run in their own process groups.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::time::Sleep;

/// Arguments of `thaw sample-app`.
#[derive(Debug, Clone, clap::Args)]
pub struct SampleAppArgs {
    /// Port to listen on, on `--host`.
    #[arg(long, env = "PORT")]
    pub port: Option<u16>,
    /// Address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub host: IpAddr,
    /// Who says hello: `Hello from <message>!`.
    #[arg(long, env = "TARGET")]
    pub message: Option<String>,
    /// Wait this long before listening (Go-style duration: 250ms, 2s).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub startup_delay: Duration,
    /// Wait this long before answering each request to `/` or `/stream`.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub response_delay: Duration,
    /// Print a line to stderr and exit 1 at once.
    #[arg(long)]
    pub crash: bool,
    /// Ignore SIGTERM (so a stopping platform has to SIGKILL it).
    #[arg(long)]
    pub ignore_sigterm: bool,
    /// Threads serving requests: 1 runs everything on the main thread; more use a
    /// multi-threaded runtime with that many workers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
}

/// A non-negative Go-style duration (`250ms`, `2s`, `1m30s`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let nanos = crate::config::parse::parse_go_duration_nanos(s)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| format!("{s:?} is negative"))
}

/// Runs the app to completion (on the main thread, or `--threads` workers); exit 0 after a
/// graceful stop.
pub fn run(args: &SampleAppArgs) -> ExitCode {
    if args.crash {
        eprintln!("sample-app: crashing on purpose (--crash)");
        return ExitCode::FAILURE;
    }
    let Some(port) = args.port else {
        eprintln!("sample-app: no port: set PORT or --port");
        return ExitCode::FAILURE;
    };
    let parent = nix::unistd::getppid();
    let built = if args.threads > 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(args.threads))
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let rt = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sample-app: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        // Handlers first: a SIGTERM right after the port opens must not find the default
        // action (terminate) still in place.
        let stop = stop_signal(StopSignals::install(), parent, args.ignore_sigterm);
        tokio::pin!(stop);
        // A stop during the start-up delay ends the app at once, as a real app's would.
        tokio::select! {
            () = tokio::time::sleep(args.startup_delay) => {}
            () = &mut stop => {
                println!("sample-app: stopped before listening");
                return ExitCode::SUCCESS;
            }
        }
        let addr = std::net::SocketAddr::new(args.host, port);
        let listener = match TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sample-app: cannot listen on {addr}: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("sample-app: listening on {addr}");
        serve(listener, Arc::new(Settings::from_args(args)), stop).await;
        println!("sample-app: stopped");
        ExitCode::SUCCESS
    })
}

/// What the handlers need.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Answered by `/`: `Hello from <name>!`.
    pub name: String,
    /// Sleep before answering `/` and `/stream` (models a slow handler).
    pub response_delay: Duration,
    /// Requests to `/` and `/stream` in their handler now, and the most at once (`/inflight`).
    pub counts: Arc<InFlight>,
}

/// The app's own count of requests in progress (`GET /inflight`).
#[derive(Debug, Default)]
pub struct InFlight {
    now: std::sync::atomic::AtomicU32,
    peak: std::sync::atomic::AtomicU32,
}

/// Counts one request while it lives.
struct Counted(Arc<InFlight>);

impl InFlight {
    fn enter(self: &Arc<Self>) -> Counted {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(n, SeqCst);
        Counted(self.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Settings {
    /// `--message`, else `$TARGET` (read by clap into `message`), else `$K_REVISION`, else
    /// `thaw`.
    pub fn from_args(args: &SampleAppArgs) -> Self {
        let name = args
            .message
            .clone()
            .or_else(|| std::env::var("K_REVISION").ok())
            .unwrap_or_else(|| "thaw".to_string());
        Self {
            name,
            response_delay: args.response_delay,
            counts: Arc::default(),
        }
    }
}

/// Serves HTTP/1.1 and h2c on `listener` until `stop` resolves, then stops accepting and waits
/// (at most 30 s) for open connections to finish their requests.
pub async fn serve(listener: TcpListener, settings: Arc<Settings>, stop: impl Future<Output = ()>) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: back off briefly instead of spinning.
                    eprintln!("sample-app: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let settings = settings.clone();
        let svc = service_fn(move |req| handle(req, settings.clone()));
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!("sample-app: connections still open after 30s; exiting anyway");
    }
}

type ResBody = UnsyncBoxBody<Bytes, Infallible>;

async fn handle(req: Request<Incoming>, s: Arc<Settings>) -> Result<Response<ResBody>, Infallible> {
    let text = |code: StatusCode, body: String| {
        let mut res = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
        *res.status_mut() = code;
        res
    };
    let res = match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/inflight" => {
            use std::sync::atomic::Ordering::SeqCst;
            let (now, peak) = (s.counts.now.load(SeqCst), s.counts.peak.load(SeqCst));
            text(
                StatusCode::OK,
                format!("{{\"inFlight\":{now},\"peak\":{peak}}}\n"),
            )
        }
        "/" => {
            let _counted = s.counts.enter();
            delay(s.response_delay).await;
            text(StatusCode::OK, format!("Hello from {}!\n", s.name))
        }
        "/stream" => {
            let _counted = s.counts.enter();
            let (mut chunks, mut delay) = (5u32, Duration::from_millis(100));
            for (k, v) in req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .filter_map(|kv| kv.split_once('='))
            {
                match k {
                    "chunks" => chunks = v.parse().unwrap_or(chunks).min(10_000),
                    "delay" => delay = parse_duration(v).unwrap_or(delay),
                    _ => {}
                }
            }
            self::delay(s.response_delay).await;
            Response::new(Chunks::new(chunks, delay).boxed_unsync())
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    };
    Ok(res)
}

/// A body of `total` lines `chunk i\n`, `delay` apart.
struct Chunks {
    next: u32,
    total: u32,
    delay: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Chunks {
    fn new(total: u32, delay: Duration) -> Self {
        Self {
            next: 0,
            total,
            delay,
            sleep: None,
        }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.next >= this.total {
            return Poll::Ready(None);
        }
        if this.next > 0 && !this.delay.is_zero() {
            let delay = this.delay;
            let sleep = this
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
            ready!(sleep.as_mut().poll(cx));
            this.sleep = None;
        }
        let line = format!("chunk {}\n", this.next);
        this.next += 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(line)))))
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.total
    }
}

/// SIGTERM and SIGINT streams, installed before the port opens.
struct StopSignals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn install() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        Self {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }
}

/// Resolves on SIGTERM (unless ignored), SIGINT, or when the parent process changes.
/// Sleeps for `d`, or not at all when it is zero (a zero-length tokio sleep still waits for the
/// next millisecond tick, which would put a 1 ms floor under every response).
async fn delay(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

async fn stop_signal(signals: StopSignals, parent: nix::unistd::Pid, ignore_sigterm: bool) {
    let StopSignals { mut term, mut int } = signals;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            Some(()) = async { term.as_mut()?.recv().await } => {
                if ignore_sigterm {
                    println!("sample-app: ignoring SIGTERM (--ignore-sigterm)");
                    continue;
                }
                println!("sample-app: SIGTERM, draining");
                return;
            }
            Some(()) = async { int.as_mut()?.recv().await } => {
                println!("sample-app: SIGINT, draining");
                return;
            }
            _ = tick.tick() => {
                if nix::unistd::getppid() != parent {
                    eprintln!("sample-app: parent process {parent} is gone; exiting");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
