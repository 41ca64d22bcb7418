//! Listener limits from `config-activator`: header-read timeout, keep-alive idle timeout and
//! max connections, on raw TCP so the test sees exactly what the server does.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use thaw::config::ActivatorConfig;
use thaw::revision::RevisionKey;

use crate::harness::*;

pub const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\nKnative-Serving-Namespace: default\r\n\
Knative-Serving-Revision: r\r\n\r\n";

/// Reads until the connection closes (Ok(bytes)) or `limit` passes (Err).
pub async fn read_to_close(tcp: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, ()> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .map_err(|_| ())?;
    Ok(all)
}

/// Reads one response head (until the blank line).
pub async fn read_head(tcp: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before a response");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn slow_client_headers_time_out() {
    let cfg = ActivatorConfig {
        header_read_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let mut h = Harness::start(vec![spec("r", 0)], cfg).await;
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap(); // never finishes
    read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("the server closed the slow connection");
    h.shutdown();
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let up = Upstream::start().await;
    let cfg = ActivatorConfig {
        keep_alive_timeout: Duration::from_millis(100),
        ..Default::default()
    };
    let mut h = Harness::start(vec![spec("r", 0)], cfg).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(REQUEST).await.unwrap();
    assert!(read_head(&mut tcp).await.starts_with("HTTP/1.1 200"));
    read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("idle connection closed");
    h.shutdown();
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_for_a_free_slot() {
    beyond_the_limit(1, None).await;
}

/// On data workers (connections handed out round-robin from the accept loop) the limit counts
/// every worker's connections.
#[tokio::test]
async fn the_connection_limit_counts_connections_on_every_worker() {
    beyond_the_limit(2, Some(3)).await;
}

/// With `max` connections open and served, one more sits in the backlog (no answer) until one
/// of them closes, then is served.
async fn beyond_the_limit(max: u32, workers: Option<usize>) {
    let up = Upstream::start().await;
    let cfg = ActivatorConfig {
        max_connections: max,
        ..Default::default()
    };
    let mut h = match workers {
        Some(n) => Harness::start_on_workers(vec![spec("r", 0)], cfg, n).await,
        None => Harness::start(vec![spec("r", 0)], cfg).await,
    };
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut open = Vec::new();
    for _ in 0..max {
        let mut tcp = TcpStream::connect(h.data).await.unwrap();
        tcp.write_all(REQUEST).await.unwrap();
        assert!(read_head(&mut tcp).await.starts_with("HTTP/1.1 200"));
        open.push(tcp);
    }
    let mut next = TcpStream::connect(h.data).await.unwrap();
    next.write_all(REQUEST).await.unwrap();
    let mut buf = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(300), next.read(&mut buf)).await;
    assert!(early.is_err(), "served beyond max-connections");
    drop(open.pop());
    let head = tokio::time::timeout(Duration::from_secs(10), read_head(&mut next)).await;
    assert!(
        head.expect("served once a slot freed")
            .starts_with("HTTP/1.1 200")
    );
    h.shutdown();
}

/// IPv4 TCP connections from /proc/net/tcp: (local port, remote port, timer), the timer column
/// (`tr`) being 2 while a keep-alive timer is pending and 0 when no timer is. Connections in
/// TIME_WAIT (state 06) are left out: closed ones, possibly of an earlier test whose upstream
/// had the same port.
fn tcp_table() -> Vec<(u16, u16, u8)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |field: &str| u16::from_str_radix(field.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| line.split_whitespace().nth(3) != Some("06"))
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let timer = u8::from_str_radix(f[5].split(':').next().unwrap(), 16).unwrap();
            (port(f[1]), port(f[2]), timer)
        })
        .collect()
}

/// The timer of the connection from port `local` to port `remote`.
fn tcp_timer(local: u16, remote: u16) -> Option<u8> {
    tcp_table()
        .into_iter()
        .find(|&(l, r, _)| l == local && r == remote)
        .map(|(_, _, timer)| timer)
}

/// Both of the activator's sockets carry TCP keep-alive probes — the accepted client
/// connection and the upstream dial — so a peer that vanished without a FIN is noticed: while
/// idle, each shows a keep-alive timer in /proc/net/tcp.
#[tokio::test]
async fn client_and_upstream_sockets_carry_tcp_keepalive() {
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("r", 0)], ActivatorConfig::default()).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(REQUEST).await.unwrap();
    assert!(read_head(&mut tcp).await.starts_with("HTTP/1.1 200"));
    let client = tcp.local_addr().unwrap().port();
    // Until the peer's (possibly delayed) ACK arrives, the retransmit timer shows instead.
    let settled = |local: u16, remote: u16| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let timer = tcp_timer(local, remote);
            if timer == Some(2) || tokio::time::Instant::now() > deadline {
                return timer;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    assert_eq!(
        settled(h.data.port(), client).await,
        Some(2),
        "accepted client connection"
    );
    let dialed: Vec<u16> = tcp_table()
        .into_iter()
        .filter(|&(_, remote, _)| remote == up.addr.port())
        .map(|(local, _, _)| local)
        .collect();
    assert!(
        !dialed.is_empty(),
        "no upstream connection in /proc/net/tcp"
    );
    for local in dialed {
        assert_eq!(
            settled(local, up.addr.port()).await,
            Some(2),
            "upstream connection"
        );
    }
    h.shutdown();
}

/// A burst of connections on workers: every one is accepted and served.
#[tokio::test]
async fn a_burst_of_connections_is_served_on_workers() {
    let up = Upstream::start().await;
    let mut h = Harness::start_on_workers(vec![spec("r", 0)], ActivatorConfig::default(), 2).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let addr = h.data;
        tasks.spawn(async move {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(REQUEST).await.unwrap();
            read_head(&mut tcp).await
        });
    }
    let mut ok = 0;
    while let Some(head) = tasks.join_next().await {
        assert!(head.unwrap().starts_with("HTTP/1.1 200"));
        ok += 1;
    }
    assert_eq!(ok, 200);
    h.shutdown();
}

/// The header-read timeout protects against slow clients; it must not close an idle keep-alive
/// connection (hyper's own timer would, after the header-read timeout instead of the
/// keep-alive timeout, racing load balancers' idle timeouts).
#[tokio::test]
async fn idle_keep_alive_outlives_the_header_read_timeout() {
    let up = Upstream::start().await;
    let cfg = ActivatorConfig {
        header_read_timeout: Duration::from_millis(100),
        keep_alive_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let mut h = Harness::start(vec![spec("r", 0)], cfg).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(REQUEST).await.unwrap();
    assert!(read_head(&mut tcp).await.starts_with("HTTP/1.1 200"));
    // Idle for many header-read timeouts, well within the keep-alive timeout.
    tokio::time::sleep(Duration::from_millis(600)).await;
    tcp.write_all(REQUEST).await.unwrap();
    assert!(read_head(&mut tcp).await.starts_with("HTTP/1.1 200"));
    // A second head that never completes is still cut by the header-read timeout.
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("the server closed the slow head");
    h.shutdown();
}

/// The protocol is told from the first bytes without consuming them: a first segment that could
/// still be the HTTP/2 preface ("P") waits for more, and the bytes then reach HTTP/1 intact.
#[tokio::test]
async fn a_first_segment_that_looks_like_the_h2_preface_is_still_http1() {
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("r", 0)], ActivatorConfig::default()).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let post = b"POST / HTTP/1.1\r\nHost: x\r\nKnative-Serving-Namespace: default\r\n\
Knative-Serving-Revision: r\r\nContent-Length: 2\r\n\r\nhi";
    tcp.write_all(&post[..1]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp.write_all(&post[1..]).await.unwrap();
    let head = read_head(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    h.shutdown();
}

/// An h2c client whose preface arrives in two segments is served as HTTP/2: the server's first
/// frame is its SETTINGS.
#[tokio::test]
async fn an_h2c_preface_split_in_two_segments_is_http2() {
    let mut h = Harness::start(vec![spec("r", 0)], ActivatorConfig::default()).await;
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    tcp.write_all(&preface[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp.write_all(&preface[10..]).await.unwrap();
    // An empty client SETTINGS frame: length 0, type 4, flags 0, stream 0.
    tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut frame = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut frame))
        .await
        .expect("the server answered in time")
        .unwrap();
    assert_eq!(frame[3], 4, "first frame is SETTINGS: {frame:?}");
    h.shutdown();
}

/// A connection closed before its first byte ends quietly and frees its slot.
#[tokio::test]
async fn a_connection_closed_before_any_byte_frees_its_slot() {
    let up = Upstream::start().await;
    let cfg = ActivatorConfig {
        max_connections: 1,
        ..Default::default()
    };
    let mut h = Harness::start(vec![spec("r", 0)], cfg).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    drop(TcpStream::connect(h.data).await.unwrap());
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(REQUEST).await.unwrap();
    let head = tokio::time::timeout(Duration::from_secs(10), read_head(&mut tcp))
        .await
        .expect("the second connection got a slot");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    h.shutdown();
}

/// A client that starts what could be the HTTP/2 preface and stops is cut by the header-read
/// timeout, like any slow head.
#[tokio::test]
async fn a_stalled_partial_preface_is_cut_by_the_header_read_timeout() {
    let cfg = ActivatorConfig {
        header_read_timeout: Duration::from_millis(200),
        keep_alive_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let mut h = Harness::start(vec![spec("r", 0)], cfg).await;
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(b"PRI * HT").await.unwrap();
    read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("the server closed the stalled connection");
    h.shutdown();
}
