//! Early hold (`thaw::activator::early`): a new connection's first request for a cold revision
//! waits in the throttler before hyper reads it, its bytes left in the socket.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use thaw::activator::early::{self, Early};
use thaw::config::ActivatorConfig;
use thaw::revision::RevisionKey;

use crate::harness::*;

fn head(rev: &str, extra: &str) -> Vec<u8> {
    format!(
        "GET /x HTTP/1.1\r\nHost: x\r\nKnative-Serving-Namespace: default\r\n\
         Knative-Serving-Revision: {rev}\r\n{extra}\r\n"
    )
    .into_bytes()
}

/// A connected pair: (client side, server side), the client's bytes already sent.
async fn pair(bytes: &[u8]) -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    client.write_all(bytes).await.unwrap();
    server.readable().await.unwrap();
    // Let a multi-segment write land whole.
    tokio::time::sleep(Duration::from_millis(20)).await;
    (client, server)
}

#[tokio::test]
async fn a_cold_first_request_is_held_unread_and_admitted_when_ready() {
    let up = Upstream::start().await;
    let rev = RevisionKey::new("default", "cold");
    let h = Harness::start(vec![spec("cold", 0)], ActivatorConfig::default()).await;
    let sent = head("cold", "");
    let (_client, mut server) = pair(&sent).await;
    let act = h.activator.clone();
    let held = tokio::spawn(async move {
        let early = early::first_request(&act, &server).await;
        (early, {
            let mut got = vec![0u8; sent.len()];
            server.read_exact(&mut got).await.unwrap();
            got == sent
        })
    });
    h.wait_held(&rev, 1).await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    let (early, intact) = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("admitted in time")
        .unwrap();
    match early {
        Early::Held(hold) => {
            assert_eq!(hold.state.key, rev);
            assert!(hold.cold, "held for a cold start");
            assert!(hold.outcome.expect("admitted").held_for.is_some());
        }
        other => panic!("expected an early hold, got {other:?}"),
    }
    assert!(
        intact,
        "the request's bytes are still in the socket for hyper"
    );
}

#[tokio::test]
async fn ordinary_cases_are_left_to_the_pipeline() {
    let up = Upstream::start().await;
    let h = Harness::start(
        vec![spec("warm", 0), spec("cold", 0)],
        ActivatorConfig::default(),
    )
    .await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "warm"), vec![up.addr]);
    let cases: [(&str, Vec<u8>); 5] = [
        ("warm revision", head("warm", "")),
        ("probe", head("cold", "K-Network-Probe: activator\r\n")),
        (
            "upgrade",
            head("cold", "Connection: upgrade\r\nUpgrade: websocket\r\n"),
        ),
        ("partial head", head("cold", "")[..30].to_vec()),
        ("unknown revision", head("nope", "")),
    ];
    for (what, bytes) in cases {
        let (_client, server) = pair(&bytes).await;
        let early = early::first_request(&h.activator, &server).await;
        assert!(matches!(early, Early::Pass), "{what}: {early:?}");
    }
}

#[tokio::test]
async fn a_client_that_leaves_while_held_frees_its_place() {
    let rev = RevisionKey::new("default", "cold");
    let h = Harness::start(vec![spec("cold", 0)], ActivatorConfig::default()).await;
    let (client, server) = pair(&head("cold", "")).await;
    let act = h.activator.clone();
    let held = tokio::spawn(async move { early::first_request(&act, &server).await });
    h.wait_held(&rev, 1).await;
    drop(client);
    let early = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("noticed in time")
        .unwrap();
    assert!(matches!(early, Early::ClientGone), "{early:?}");
    h.wait_held(&rev, 0).await;
    assert_eq!(h.activator.held_requests(), 0);
}

/// Through the whole server: the early-held request is answered by the upstream, with the
/// cold-start `Server-Timing`, and the connection then serves a second request normally.
#[tokio::test]
async fn an_early_held_request_is_proxied_and_the_connection_kept() {
    let up = Upstream::start().await;
    let rev = RevisionKey::new("default", "cold");
    let mut h = Harness::start(vec![spec("cold", 0)], ActivatorConfig::default()).await;
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(&head("cold", "")).await.unwrap();
    h.wait_held(&rev, 1).await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    let first = read_response_head(&mut tcp).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        first
            .to_ascii_lowercase()
            .contains("server-timing: cold-start;dur="),
        "{first}"
    );
    tcp.write_all(&head("cold", "")).await.unwrap();
    let second = read_response_head(&mut tcp).await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(
        !second.to_ascii_lowercase().contains("server-timing"),
        "{second}"
    );
    h.shutdown();
}

/// Reads one response head and its (Content-Length) body.
async fn read_response_head(tcp: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return text[..end].to_string();
            }
        }
        let n = tokio::time::timeout_at(deadline, tcp.read(&mut buf))
            .await
            .expect("response in time")
            .unwrap();
        assert!(n > 0, "closed early: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}
