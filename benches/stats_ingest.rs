//! The autoscaler ingesting 10 activators x 1,000 revisions each second (each activator
//! reports every revision once a second), with its scaler deciding all 1,000 revisions every
//! 2 s: the CPU the receiving thread uses, as a share of one core, and the process RSS.
//!
//! Two transports side by side, the same JSON batches, the same scaler behind them:
//! - `post`: thaw's stats port (`remote::server`), one POST per activator per second over a
//!   kept-alive connection;
//! - `stream`: one long-lived streaming request per activator, one newline-terminated batch a
//!   second (a minimal receiver written here for the comparison).
//!
//! `cargo bench --bench stats_ingest` (about 50 s) prints both (docs/benchmarks.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use thaw::autoscaler::scaler::{ScaleStates, Scaler, ScalerOptions};
use thaw::platform::Platform;
use thaw::platform::memory::MemoryPlatform;
use thaw::remote::wire::{StatsBatch, WireStat};
use thaw::remote::{server, token::Token};
use thaw::revision::{CatalogSnapshot, RevisionCatalog, RevisionSpec};
use thaw::stats::StatMessage;
use thaw::telemetry::Telemetry;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

const ACTIVATORS: usize = 10;
const REVISIONS: usize = 1000;
const SECONDS: u64 = 20;

fn thread_cpu() -> Duration {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD).unwrap();
    let t = |tv: nix::sys::time::TimeVal| {
        Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
    };
    t(u.user_time()) + t(u.system_time())
}

fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn batch(source: usize) -> Bytes {
    let b = StatsBatch {
        source: format!("activator-{source}"),
        stats: (0..REVISIONS)
            .map(|r| WireStat {
                namespace: "default".into(),
                name: format!("rev-{r:04}"),
                concurrency: (r % 7) as f64 * 0.5,
                requests: (r % 5) as u64,
                poke: false,
            })
            .collect(),
    };
    Bytes::from(serde_json::to_vec(&b).unwrap())
}

/// Runs the receiving side on its own thread; returns its address and a handle that yields
/// the thread's CPU time over the measured seconds.
fn receiver(stream: bool) -> (SocketAddr, std::thread::JoinHandle<Duration>) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let specs: Vec<RevisionSpec> = (0..REVISIONS)
                .map(|r| RevisionSpec::test("default", &format!("rev-{r:04}")))
                .collect();
            let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(specs, [])));
            let telemetry = Telemetry::new();
            let states = ScaleStates::new();
            let (tx, rx) = mpsc::channel::<StatMessage>(64 * 1024);
            let platform = MemoryPlatform::new();
            let scaler = Scaler::new(
                catalog,
                platform as Arc<dyn Platform>,
                states.clone(),
                &telemetry,
                ScalerOptions::default(),
            );
            tokio::spawn(scaler.run(rx, std::future::pending()));
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            if stream {
                tokio::spawn(stream_server(l, tx));
            } else {
                let (_lead, leading) = watch::channel(true);
                let port = Arc::new(server::StatsPort {
                    token: Token::new(b"bench-token-0123456789").unwrap().into(),
                    leading,
                    stats: tx,
                    states,
                    metrics: telemetry.remote.clone(),
                    dropped: Default::default(),
                });
                tokio::spawn(server::serve(port, l, Default::default()));
                std::mem::forget(_lead);
            }
            // Warm-up, then the measured seconds.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let start = thread_cpu();
            tokio::time::sleep(Duration::from_secs(SECONDS)).await;
            thread_cpu() - start
        })
    });
    (addr_rx.recv().unwrap(), h)
}

/// The comparison's streaming receiver: newline-terminated batches on a long-lived request.
async fn stream_server(l: TcpListener, tx: mpsc::Sender<StatMessage>) {
    loop {
        let (s, _) = l.accept().await.unwrap();
        let tx = tx.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let mut body = req.into_body();
                        let mut buf = Vec::new();
                        while let Some(Ok(f)) = body.frame().await {
                            let Ok(d) = f.into_data() else { continue };
                            buf.extend_from_slice(&d);
                            while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                                let line: Vec<u8> = buf.drain(..=i).collect();
                                let b: StatsBatch = serde_json::from_slice(&line[..i]).unwrap();
                                let src: Arc<str> = b.source.as_str().into();
                                let at = thaw::clock::now_second();
                                for s in &b.stats {
                                    let _ = tx.try_send(StatMessage::Record(s.to_stat(&src, at)));
                                }
                            }
                        }
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::new(),
                        )))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
        });
    }
}

async fn senders(addr: SocketAddr, stream: bool) {
    let batches: Vec<Bytes> = (0..ACTIVATORS).map(batch).collect();
    let token = Token::new(b"bench-token-0123456789").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(SECONDS + 4);
    let mut tasks = Vec::new();
    for b in batches {
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            if stream {
                let (ftx, frx) = mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
                let body = StreamBody::new(futures::StreamExt::boxed(futures::stream::unfold(
                    frx,
                    |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
                )));
                type Frames = futures::stream::BoxStream<
                    'static,
                    Result<Frame<Bytes>, std::convert::Infallible>,
                >;
                let c: Client<_, StreamBody<Frames>> =
                    Client::builder(TokioExecutor::new()).build_http();
                let req = hyper::Request::post(format!("http://{addr}/stream"))
                    .body(body)
                    .unwrap();
                let resp = tokio::spawn(async move { c.request(req).await });
                while tokio::time::Instant::now() < deadline {
                    tick.tick().await;
                    let mut line = b.to_vec();
                    line.push(b'\n');
                    if ftx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                        break;
                    }
                }
                drop(ftx);
                let _ = resp.await;
            } else {
                let c: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
                while tokio::time::Instant::now() < deadline {
                    tick.tick().await;
                    let req = hyper::Request::post(format!("http://{addr}/stats"))
                        .header("authorization", token.header())
                        .body(Full::new(b.clone()))
                        .unwrap();
                    // The receiver stops after its measured seconds: then sending ends.
                    let Ok(r) = c.request(req).await else { break };
                    assert_eq!(r.status(), 202);
                    let _ = r.into_body().collect().await;
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let senders_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for (name, stream) in [("post", false), ("stream", true)] {
        let (addr, h) = receiver(stream);
        let sending = senders_rt.spawn(senders(addr, stream));
        let cpu = h.join().unwrap();
        senders_rt.block_on(async {
            let _ = sending.await;
        });
        println!(
            "{name}: {ACTIVATORS} activators x {REVISIONS} revisions/s for {SECONDS} s: receiving thread \
             {:.2} % of a core ({:.1} ms CPU per second), process RSS {:.1} MiB (both sides, \
             after every run so far)",
            cpu.as_secs_f64() / SECONDS as f64 * 100.0,
            cpu.as_secs_f64() / SECONDS as f64 * 1e3,
            rss_mib()
        );
    }
}
