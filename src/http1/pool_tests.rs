//! The pool against a real hyper upstream that counts the connections it accepted and the ones
//! still open.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::*;

struct Counting {
    addr: SocketAddr,
    accepted: Arc<AtomicU32>,
    open: Arc<AtomicU32>,
    kill: Arc<Mutex<CancellationToken>>,
}

impl Counting {
    /// Closes every connection open now.
    fn close_all(&self) {
        let mut kill = self.kill.lock().unwrap();
        kill.cancel();
        *kill = CancellationToken::new();
    }
}

struct Open(Arc<AtomicU32>);
impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// An upstream answering "ok"; `/close` answers with `Connection: close`.
async fn counting_upstream() -> Counting {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicU32::new(0));
    let open = Arc::new(AtomicU32::new(0));
    let kill = Arc::new(Mutex::new(CancellationToken::new()));
    let (a, o, k) = (accepted.clone(), open.clone(), kill.clone());
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            a.fetch_add(1, SeqCst);
            o.fetch_add(1, SeqCst);
            let guard = Open(o.clone());
            let killed = k.lock().unwrap().clone();
            tokio::spawn(async move {
                let _guard = guard;
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
                    if req.uri().path() == "/close" {
                        resp.headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, Infallible>(resp)
                });
                let builder = auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(s), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = killed.cancelled() => {}
                }
            });
        }
    });
    Counting {
        addr,
        accepted,
        open,
        kill,
    }
}

fn request(addr: SocketAddr, path: &str, protocol: Protocol) -> Request<ReqBody> {
    let mut req = Request::new(ReqBody::Empty);
    let host = addr.to_string();
    *req.uri_mut() = match protocol {
        Protocol::Http1 => path.parse().unwrap(),
        Protocol::H2c => format!("http://{host}{path}").parse().unwrap(),
    };
    if protocol == Protocol::Http1 {
        req.headers_mut()
            .insert(header::HOST, HeaderValue::from_str(&host).unwrap());
    } else {
        *req.version_mut() = http::Version::HTTP_2;
    }
    req
}

/// One request through the pool, its body read to the end, the connection given back.
async fn roundtrip(pool: &Upstream, addr: SocketAddr, path: &str, protocol: Protocol) {
    let conn = pool.connect(addr, protocol).await.unwrap();
    let (resp, reusable) = conn
        .send(request(addr, path, protocol), far())
        .await
        .unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    if let Some(r) = reusable {
        r.give_back();
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn sequential_requests_reuse_one_connection() {
    let up = counting_upstream().await;
    let pool = Upstream::new(Duration::from_secs(1));
    for _ in 0..20 {
        roundtrip(&pool, up.addr, "/", Protocol::Http1).await;
        // The connection task marks the connection ready once it has seen the response end;
        // wait for that so each checkout meets an idle, ready connection.
        eventually("the connection to be ready again", || {
            let map = pool.shared.lock();
            map.get(&up.addr)
                .is_some_and(|c| c.h1.iter().all(|i| i.tx.is_ready()))
        })
        .await;
    }
    assert_eq!(up.accepted.load(SeqCst), 1);
    assert_eq!(pool.pooled(up.addr), (1, false));
}

#[tokio::test]
async fn a_closed_connection_is_not_reused() {
    let up = counting_upstream().await;
    let pool = Upstream::new(Duration::from_secs(1));
    // `Connection: close`: the connection never becomes ready again, then closes.
    roundtrip(&pool, up.addr, "/close", Protocol::Http1).await;
    roundtrip(&pool, up.addr, "/", Protocol::Http1).await;
    assert_eq!(
        up.accepted.load(SeqCst),
        2,
        "the closing connection was not used"
    );
    // Closed by the upstream while idle: dropped once its task has seen the close.
    up.close_all();
    eventually("the pool to drop closed connections", || {
        pool.shared.sweep(Instant::now());
        pool.pooled(up.addr) == (0, false)
    })
    .await;
    roundtrip(&pool, up.addr, "/", Protocol::Http1).await;
    assert_eq!(up.accepted.load(SeqCst), 3);
}

#[tokio::test]
async fn idle_connections_are_capped_per_endpoint() {
    let up = counting_upstream().await;
    let pool = Upstream::new(Duration::from_secs(1));
    let n = MAX_IDLE_PER_HOST + 3;
    // n requests in flight at once: n connections.
    let mut in_flight = Vec::new();
    for _ in 0..n {
        let conn = pool.connect(up.addr, Protocol::Http1).await.unwrap();
        in_flight.push(
            conn.send(request(up.addr, "/", Protocol::Http1), far())
                .await
                .unwrap(),
        );
    }
    assert_eq!(up.accepted.load(SeqCst) as usize, n);
    for (resp, reusable) in in_flight {
        resp.into_body().collect().await.unwrap();
        reusable.expect("http/1.1").give_back();
    }
    assert_eq!(pool.pooled(up.addr), (MAX_IDLE_PER_HOST, false));
    eventually("the connections above the cap to close", || {
        up.open.load(SeqCst) as usize == MAX_IDLE_PER_HOST
    })
    .await;
}

#[tokio::test]
async fn idle_connections_are_closed_by_the_sweep() {
    let up = counting_upstream().await;
    let pool = Upstream::new(Duration::from_secs(1));
    roundtrip(&pool, up.addr, "/", Protocol::Http1).await;
    roundtrip(&pool, up.addr, "/", Protocol::H2c).await;
    assert_eq!(pool.pooled(up.addr), (1, true));
    let t0 = Instant::now();
    // Not yet idle for long enough: kept.
    pool.shared.sweep(t0 + POOL_IDLE_TIMEOUT / 2);
    assert_eq!(pool.pooled(up.addr), (1, true));
    // Used again after that sweep: the HTTP/1.1 connection's idle time starts over.
    roundtrip(&pool, up.addr, "/", Protocol::Http1).await;
    assert_eq!(pool.pooled(up.addr), (1, true));
    // Idle time counts from the sweep after the last use, so never less than the timeout.
    pool.shared.sweep(t0 + POOL_IDLE_TIMEOUT);
    assert_eq!(
        pool.pooled(up.addr),
        (1, true),
        "not closed before the timeout"
    );
    pool.shared.sweep(t0 + POOL_IDLE_TIMEOUT + SWEEP_EVERY);
    assert_eq!(
        pool.pooled(up.addr),
        (1, false),
        "the h2c connection unused since t0"
    );
    pool.shared
        .sweep(t0 + POOL_IDLE_TIMEOUT / 2 + POOL_IDLE_TIMEOUT + SWEEP_EVERY);
    assert_eq!(pool.pooled(up.addr), (0, false));
    assert!(pool.shared.lock().is_empty(), "the endpoint is forgotten");
    eventually("both connections to close", || up.open.load(SeqCst) == 0).await;
}

#[tokio::test]
async fn h2c_requests_share_one_connection_and_a_closed_one_is_replaced() {
    let up = counting_upstream().await;
    let pool = Upstream::new(Duration::from_secs(1));
    let mut conns = Vec::new();
    for _ in 0..5 {
        conns.push(pool.connect(up.addr, Protocol::H2c).await.unwrap());
    }
    let sends = conns
        .into_iter()
        .map(|c| c.send(request(up.addr, "/", Protocol::H2c), far()));
    for sent in sends {
        let (resp, reusable) = sent.await.unwrap();
        assert!(reusable.is_none(), "h2c connections stay in the pool");
        resp.into_body().collect().await.unwrap();
    }
    assert_eq!(up.accepted.load(SeqCst), 1);
    up.close_all();
    eventually("the pool to see the h2c connection closed", || {
        let map = pool.shared.lock();
        map.get(&up.addr)
            .and_then(|c| c.h2.as_ref())
            .is_some_and(|(tx, _)| tx.is_closed())
    })
    .await;
    roundtrip(&pool, up.addr, "/", Protocol::H2c).await;
    assert_eq!(
        up.accepted.load(SeqCst),
        2,
        "a new connection replaced the closed one"
    );
    assert_eq!(pool.pooled(up.addr), (0, true));
}

#[tokio::test]
async fn connect_failures_are_connect_errors() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let pool = Upstream::new(Duration::from_secs(1));
    let err = pool.connect(addr, Protocol::Http1).await.unwrap_err();
    assert!(matches!(err, ConnectError::Io(_)), "{err}");
}

#[test]
fn addr_hasher_spreads_ports_and_ips() {
    use std::hash::BuildHasher;
    let b = BuildHasherDefault::<AddrHasher>::default();
    let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let c: SocketAddr = "127.0.0.1:8081".parse().unwrap();
    let d: SocketAddr = "127.0.0.2:8080".parse().unwrap();
    let (ha, hc, hd) = (b.hash_one(a), b.hash_one(c), b.hash_one(d));
    assert!(ha != hc && ha != hd && hc != hd);
    assert_eq!(ha, b.hash_one(a));
}

/// A response-start deadline no test reaches.
fn far() -> tokio::time::Instant {
    tokio::time::Instant::now() + std::time::Duration::from_secs(60)
}

#[test]
fn dials_back_off_from_50_ms_and_spend_exactly_the_budget() {
    let ms = |v: &[Duration]| v.iter().map(|d| d.as_millis()).collect::<Vec<_>>();
    let one_second: Vec<Duration> = dial_attempts(Duration::from_secs(1)).collect();
    assert_eq!(ms(&one_second), [50, 70, 98, 137, 192, 452]);
    assert_eq!(one_second.iter().sum::<Duration>(), Duration::from_secs(1));
    for budget in [1, 49, 50, 99, 100, 170, 5_000, 60_000] {
        let budget = Duration::from_millis(budget);
        let all: Vec<Duration> = dial_attempts(budget).collect();
        assert_eq!(all.iter().sum::<Duration>(), budget, "{budget:?}");
        // Each dial waits at least as long as the one before.
        assert!(all.windows(2).all(|w| w[1] >= w[0]), "{budget:?}: {all:?}");
    }
    assert_eq!(dial_attempts(Duration::ZERO).count(), 0);
}

/// A listener whose accept queue is full drops SYNs; the kernel would send the SYN again only
/// after a second. A dial that timed out is made again at once, so the connection is had soon
/// after the queue drains, well before that second.
#[tokio::test]
async fn a_dropped_syn_is_dialled_again_without_waiting_for_the_kernel() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    // Fill the accept queue (backlog 1 holds two) with connections nobody accepts yet.
    let mut fillers = Vec::new();
    while let Ok(Ok(c)) =
        tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
    {
        fillers.push(c);
        assert!(fillers.len() < 16, "the accept queue never filled");
    }
    let up = Upstream::new(Duration::from_secs(5));
    let started = Instant::now();
    let dial = tokio::spawn(async move { up.open_direct(addr).await.map(|_| ()) });
    // The queue drains 200 ms later.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut accepted = Vec::new();
    let drained = async {
        loop {
            accepted.push(listener.accept().await.unwrap());
        }
    };
    let result = tokio::select! {
        r = dial => r.unwrap(),
        _ = drained => unreachable!(),
    };
    result.expect("connected once the queue drained");
    // The kernel's own SYN resend comes 1 s after the first; a fresh dial comes much sooner.
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "connected after {:?}: the dial waited for the kernel's resend",
        started.elapsed()
    );
}
