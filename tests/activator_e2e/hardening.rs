//! Issue 20's regressions, one test per finding of the data-port review: each failed on the code
//! before its fix. Raw TCP where the exact bytes matter.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use thaw::config::ActivatorConfig;
use thaw::revision::RevisionKey;

use crate::harness::*;
use crate::listener::{REQUEST, read_head, read_to_close};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty client SETTINGS frame: length 0, type 4, flags 0, stream 0.
const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

/// An h2 frame: 3-byte length, type, flags, stream id.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK block for `GET /` to revision `default/r` (static-table methods and literals).
fn get_block() -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x84]; // :method GET, :scheme http, :path /
    b.extend_from_slice(&[0x41, 1, b'x']); // :authority x
    for (n, v) in [
        (&b"knative-serving-namespace"[..], &b"default"[..]),
        (b"knative-serving-revision", b"r"),
    ] {
        b.push(0x00);
        b.push(n.len() as u8);
        b.extend_from_slice(n);
        b.push(v.len() as u8);
        b.extend_from_slice(v);
    }
    b
}

fn short_timeouts() -> ActivatorConfig {
    ActivatorConfig {
        header_read_timeout: Duration::from_millis(200),
        keep_alive_timeout: Duration::from_millis(300),
        ..Default::default()
    }
}

/// Finding 1: an h2c connection whose first header block never ends is closed (the first
/// request is due within the header-read timeout, as on HTTP/1).
#[tokio::test]
async fn an_h2c_header_block_that_never_ends_is_cut() {
    let mut h = Harness::start(vec![spec("r", 0)], short_timeouts()).await;
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&SETTINGS).await.unwrap();
    // HEADERS on stream 1 without END_HEADERS (flags 0), then nothing.
    tcp.write_all(&frame(1, 0, 1, &[0x82])).await.unwrap();
    read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("the server closed the connection");
    h.shutdown();
}

/// Finding 1, after a first request: an unfinished header block on a later stream is cut once
/// the connection is closing (idle past the keep-alive timeout, then the closing grace).
#[tokio::test]
async fn an_unfinished_later_h2c_header_block_is_cut_once_closing() {
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("r", 0)], short_timeouts()).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&SETTINGS).await.unwrap();
    // A complete request (END_HEADERS | END_STREAM), then a header block left open.
    tcp.write_all(&frame(1, 0x5, 1, &get_block()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp.write_all(&frame(1, 0, 3, &[0x82])).await.unwrap();
    read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("the server closed the connection");
    h.shutdown();
}

/// Finding 2: a request body that starts with the h2 preface does not switch the header-read
/// timeout off for the rest of the HTTP/1 connection.
#[tokio::test]
async fn a_body_that_looks_like_the_h2_preface_keeps_the_head_clock() {
    let up = Upstream::start().await;
    let cfg = ActivatorConfig {
        header_read_timeout: Duration::from_millis(200),
        keep_alive_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let mut h = Harness::start(vec![spec("r", 0)], cfg).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    let head = b"POST /echo HTTP/1.1\r\nHost: x\r\nKnative-Serving-Namespace: default\r\n\
Knative-Serving-Revision: r\r\nContent-Length: 24\r\n\r\n";
    tcp.set_nodelay(true).unwrap();
    tcp.write_all(head).await.unwrap();
    // The body in a segment of its own: the first bytes hyper reads from the socket itself.
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp.write_all(PREFACE).await.unwrap();
    let got = read_head(&mut tcp).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    // The next head trickles in, a byte every 100 ms, for far longer than the timeout.
    let trickle = async {
        for b in REQUEST.iter().take(20) {
            if tcp.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    trickle.await;
    read_to_close(&mut tcp, Duration::from_secs(5))
        .await
        .expect("the trickled head was cut by the header-read timeout");
    h.shutdown();
}
