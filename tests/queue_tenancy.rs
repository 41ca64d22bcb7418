//! The queue sidecar's part of the tenancy rules (SECURITY.md, "Proxied requests"): a tagged
//! `K-Original-Host` becomes the application's `Host` only when it is one field holding one
//! authority. `thaw queue` as a child process in front of an in-process user container.

mod queue_support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use queue_support::*;

/// The revision's tag as the controller would put it in `THAW_PROXY_TAG` (any 64 lowercase hex
/// digits do for the sidecar).
const TAG: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// A user container answering with the `Host` it got and how many `Host` fields came.
async fn host_echo() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let host = req
                            .headers()
                            .get("host")
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        let hosts = req.headers().get_all("host").iter().count();
                        let _ = req.into_body().collect().await;
                        let text = format!("host={host}\nhosts={hosts}\n");
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from(text),
                        )))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (port, task)
}

/// Writes `request` on a new connection and reads until the sidecar closes it.
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut out))
        .await
        .expect("the sidecar answered and closed")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Issue 47: a tagged `K-Original-Host` that is a list, carries userinfo, a path or a bad
/// port, or comes twice, is answered 400 and never reaches the application; one authority
/// replaces `Host` as before; an untagged one is ignored as before. Both engine paths: the
/// lane (bodiless) and hyper's server (a body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tagged_k_original_host_must_be_one_authority() {
    let (port, server) = host_echo().await;
    let q = Queue::start(port, &[("THAW_PROXY_TAG", TAG)]);
    q.admin_until("/readyz", 200).await;
    let tagged = |host: &'static str| [("k-proxy-request", TAG), ("k-original-host", host)];
    for (method, body) in [("GET", ""), ("POST", "a body")] {
        // One authority, with a port: the application's Host.
        let (status, _, text) = q
            .send(method, "/", &tagged("orig.example.com:8080"), body)
            .await;
        assert_eq!(status, 200, "{method}: {text}");
        assert!(
            text.contains("host=orig.example.com:8080\nhosts=1\n"),
            "{text}"
        );
        for bad in [
            "a.example.com, b.example.com",
            "a.example.com,b.example.com",
            "user@a.example.com",
            "a.example.com/x",
            "a.example.com:http",
        ] {
            let (status, _, text) = q.send(method, "/", &tagged(bad), body).await;
            assert_eq!(status, 400, "{method} {bad:?}: {text}");
            assert!(!text.contains("host="), "{bad:?} reached the app: {text}");
        }
        // Untagged, it is not believed at all: the client's own Host stays.
        let (status, _, text) = q
            .send(
                method,
                "/",
                &[("host", "client.example.com"), ("k-original-host", "a, b")],
                body,
            )
            .await;
        assert_eq!(status, 200, "{method}: {text}");
        assert!(text.contains("host=client.example.com\n"), "{text}");
    }
    // Two fields, each one authority: which one would the application get? 400.
    for body in ["", "Content-Length: 2\r\n\r\nhi"] {
        let method = if body.is_empty() { "GET" } else { "POST" };
        let head = format!(
            "{method} / HTTP/1.1\r\nHost: 10.0.0.7:8012\r\nK-Proxy-Request: {TAG}\r\n\
             K-Original-Host: a.example.com\r\nK-Original-Host: b.example.com\r\n\
             Connection: close\r\n"
        );
        let req = if body.is_empty() {
            format!("{head}\r\n")
        } else {
            format!("{head}{body}")
        };
        let got = raw_exchange(q.data, req.as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 400 "), "{method}: {got}");
        assert!(!got.contains("host="), "{method} reached the app: {got}");
    }
    server.abort();
}
