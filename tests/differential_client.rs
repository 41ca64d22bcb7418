//! Differential tests of the data port's HTTP/1 upstream side: thaw's direct client
//! (`thaw::http1::direct`) against hyper's client (`hyper::client::conn::http1`, as the
//! activator's pool builds it).
//!
//! Generated upstream responses — framing combinations (`Content-Length`, chunked, both,
//! neither: close-delimited), interim 1xx answers before the final one, 204/304 with bodies,
//! trailers (framing fields among them), chunk extensions and malformed chunk sizes, invalid and
//! signed lengths, `Connection: close`, HTTP/1.0, mutated header lines, truncation mid-response —
//! are served by a raw TCP server to a `GET /`, read once by each client. Both must agree on:
//! - **the response**: its status (or that no response head was accepted), the body bytes (or
//!   that reading the body failed) and the trailers;
//! - **the reuse decision**: whether the connection carries a second request. For the direct
//!   client: the connection went back to its pool at the body's end, is still usable
//!   (`Upstream::idle_direct`, which checks `DirectConn::is_usable`) and answers a second
//!   exchange; for hyper: `SendRequest::ready` succeeds and a second request on the same
//!   connection gets the server's second answer.
//!
//! The server keeps the connection open after its answer (and answers a second request)
//! unless the answer is framed by the close, cut short, says `Connection: close`, is HTTP/1.0
//! without keep-alive, or the case says to close anyway; so no client waits on a body that never
//! ends, and every read is also bounded by a timeout.
//!
//! Response headers are not compared (the direct client keeps them as raw fields and drops the
//! hop-by-hop ones; hyper keeps all of them in its map).
//!
//! The inputs come from a fixed seed: `cargo test --test differential_client` runs the same
//! cases every time (a few seconds). A long run with other inputs:
//!
//! ```text
//! THAW_PROPTEST_CASES=20000 THAW_PROPTEST_SEED=7 cargo test --test differential_client
//! ```
//!
//! With `THAW_DIFF_SURVEY=1` (and `-- --nocapture`) the property prints every disagreeing input
//! and goes on, instead of stopping at the first: a survey for new input classes.
//!
//! A second property runs the same generated answers through one activator: to a bodiless
//! `GET` (the direct client reads the answer, the lane writes it to the client) and to a `POST`
//! with a one-byte body (hyper's client reads it, hyper's server writes it). The client must get
//! the same responses (status, header fields, body, trailers; normalised as in
//! `differential_server.rs`: the writer's own choices of version, reason phrase, framing and
//! `Connection` are left out, and so is the text of the activator's own error answers) and the
//! same end of connection; a response cut short counts as failed whichever way it was cut.
//!
//! Disagreements found are named regression tests at the end of this file; those still open are
//! `#[ignore]`d with the reason, and the properties skip their input classes
//! (`known_disagreement`, `known_activator_disagreement`). The client-level ones are also checked
//! as the activator's client sees them (`client_paths_agree`). The data-port review's stale-length finding (a stale
//! `Content-Length` beside `Transfer-Encoding`) and point 8 (framing fields as trailers) show
//! only there: both clients read such answers alike, the activator forwards them differently.

mod differential_support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use proptest::sample::select;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use thaw::http1::direct::{ExchangeError, encode_head};
use thaw::http1::fields::ClientHeaders;
use thaw::http1::pool::Upstream;

use differential_support::framing::{self, ChunkForm};
use differential_support::*;

/// The server's answer to a second request on the same connection.
const SECOND: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond";
/// How long a body may take before the read counts as hanging.
const BODY_TIMEOUT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// The scripted upstream

/// Serves one connection: reads a request head, writes `answer`, then closes if `close`, else
/// answers one more request head with [`SECOND`] and waits for the client to close.
async fn serve_once(answer: Vec<u8>, close: bool) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let Ok(Ok((mut s, _))) = tokio::time::timeout(IO_TIMEOUT, l.accept()).await else {
            return;
        };
        drop(l);
        let mut buf = Vec::new();
        if !read_head(&mut s, &mut buf).await {
            return;
        }
        if write_all_bounded(&mut s, &answer).await.is_err() || close {
            return;
        }
        if read_head(&mut s, &mut buf).await {
            let _ = write_all_bounded(&mut s, SECOND).await;
            // Until the client closes.
            let _ = read_to_end_or_quiet(&mut s, IO_TIMEOUT).await;
        }
    });
    addr
}

/// Reads one request head off the front of `buf` (more from `s` as needed); false if the
/// stream ended or went quiet first.
async fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            buf.drain(..i + 4);
            return true;
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(IO_TIMEOUT, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return false,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The two clients

/// What a client made of the response.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// No response head was accepted.
    NoResponse,
    Response {
        status: u16,
        /// The body, or that reading it failed (`None`).
        body: Option<B>,
        /// The trailers, as lowercased names and values in order.
        trailers: Option<Vec<(String, B)>>,
        /// Whether the connection carried a second request.
        reused: bool,
    },
    /// The body neither ended nor failed within [`BODY_TIMEOUT`].
    Hung,
}

fn trailer_list(map: Option<&HeaderMap>) -> Option<Vec<(String, B)>> {
    map.map(|m| {
        m.iter()
            .map(|(k, v)| (k.as_str().to_string(), B(v.as_bytes().to_vec())))
            .collect()
    })
}

fn head_for(path: &str) -> Vec<u8> {
    encode_head(
        &Method::GET,
        path,
        Some(&HeaderValue::from_static("upstream.test")),
        &ClientHeaders::Map(HeaderMap::new()),
        &[],
    )
}

/// `GET /` over a new direct connection to `addr`.
async fn direct(addr: SocketAddr) -> Outcome {
    let up = Upstream::new(Duration::from_secs(2));
    let conn = up.open_direct(addr).await.expect("connect");
    let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
    let resp = match conn
        .exchange(head_for("/"), false, up.home(addr), deadline)
        .await
    {
        Ok(resp) => resp,
        Err(ExchangeError::Unsent(_, e) | ExchangeError::Failed(e)) => {
            let _ = e;
            return Outcome::NoResponse;
        }
    };
    let status = resp.status().as_u16();
    let collected = match tokio::time::timeout(BODY_TIMEOUT, resp.into_body().collect()).await {
        Err(_) => return Outcome::Hung,
        Ok(Err(_)) => {
            return Outcome::Response {
                status,
                body: None,
                trailers: None,
                reused: false,
            };
        }
        Ok(Ok(c)) => c,
    };
    let trailers = trailer_list(collected.trailers());
    let body = Some(B(collected.to_bytes().to_vec()));
    // Reused: the connection went home, is usable, and carries a second exchange.
    let reused = match up.idle_direct(addr) {
        None => false,
        Some(conn) => {
            let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
            match conn
                .exchange(head_for("/second"), false, up.home(addr), deadline)
                .await
            {
                Ok(resp) => matches!(
                    tokio::time::timeout(BODY_TIMEOUT, resp.into_body().collect())
                        .await
                        .map(|r| r.map(|c| c.to_bytes())),
                    Ok(Ok(b)) if b == "second"
                ),
                Err(_) => false,
            }
        }
    };
    Outcome::Response {
        status,
        body,
        trailers,
        reused,
    }
}

fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::get(path)
        .header("host", "upstream.test")
        .body(Empty::new())
        .unwrap()
}

/// `GET /` over a new hyper client connection to `addr` (built as the activator's pool builds
/// it).
async fn hyper_client(addr: SocketAddr) -> Outcome {
    let tcp = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(addr))
        .await
        .expect("connect within the timeout")
        .expect("connect");
    let (mut tx, conn) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Empty<Bytes>>(TokioIo::new(tcp))
        .await
        .expect("handshake");
    let task = tokio::spawn(conn);
    let resp = match tokio::time::timeout(IO_TIMEOUT, tx.send_request(get("/"))).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(_)) => return Outcome::NoResponse,
        Err(_) => {
            task.abort();
            return Outcome::NoResponse;
        }
    };
    let status = resp.status().as_u16();
    let collected = match tokio::time::timeout(BODY_TIMEOUT, resp.into_body().collect()).await {
        Err(_) => {
            task.abort();
            return Outcome::Hung;
        }
        Ok(Err(_)) => {
            task.abort();
            return Outcome::Response {
                status,
                body: None,
                trailers: None,
                reused: false,
            };
        }
        Ok(Ok(c)) => c,
    };
    let trailers = trailer_list(collected.trailers());
    let body = Some(B(collected.to_bytes().to_vec()));
    let reused = match tokio::time::timeout(IO_TIMEOUT, tx.ready()).await {
        Ok(Ok(())) => match tokio::time::timeout(IO_TIMEOUT, tx.send_request(get("/second"))).await
        {
            Ok(Ok(resp)) => matches!(
                tokio::time::timeout(BODY_TIMEOUT, resp.into_body().collect())
                        .await
                        .map(|r| r.map(|c| c.to_bytes())),
                Ok(Ok(b)) if b == "second"
            ),
            _ => false,
        },
        _ => false,
    };
    task.abort();
    Outcome::Response {
        status,
        body,
        trailers,
        reused,
    }
}

// ---------------------------------------------------------------------------------------------
// The inputs

const BODIES: &[&[u8]] = &[
    b"",
    b"hello",
    b"hello world, a longer body",
    b"0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
];

const STATUSES: &[u16] = &[200, 200, 200, 200, 201, 204, 304, 404, 500, 101, 199, 999];

const INTERIM: &[&str] = &[
    "HTTP/1.1 100 Continue\r\n\r\n",
    "HTTP/1.1 102 Processing\r\n\r\n",
    "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n",
    "HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n",
];

const CONNECTION: &[&[&str]] = &[
    &[],
    &[],
    &[],
    &["Connection: close"],
    &["Connection: keep-alive"],
    &["Connection: Keep-Alive, X-A", "X-A: 1"],
    &["Connection: upgrade", "Upgrade: websocket"],
];

const TE_VALUES: &[&[&str]] = &[
    &["chunked"],
    &["chunked"],
    &["chunked"],
    &["Chunked"],
    &["gzip, chunked"],
    &["chunked, gzip"],
    &["identity"],
    &["chunked", "chunked"],
    &["gzip", "chunked"],
    &[" chunked "],
    &["xchunked"],
];

/// A `Content-Length` field set for a body of `n` bytes, in form `form`.
fn cl_value(form: u8, n: usize) -> Vec<String> {
    match form % 16 {
        0..=4 => vec![n.to_string()],
        5 => vec![format!("+{n}")],
        6 => vec!["-1".into()],
        7 => vec![format!("0{n}")],
        8 => vec!["18446744073709551616".into()],
        9 => vec![format!("{n}, {n}")],
        10 => vec![format!("{n}, {}", n + 1)],
        11 => vec![n.to_string(), n.to_string()],
        12 => vec![n.to_string(), (n + 1).to_string()],
        13 => vec![(n + 3).to_string()],
        14 => vec![n.saturating_sub(2).to_string()],
        _ => vec![format!("{n} ")],
    }
}

fn chunk_forms() -> impl Strategy<Value = Vec<ChunkForm>> {
    // Lower, Upper, LeadingZeros, Extension, SpaceThenExtension, Prefix0x, Negative,
    // TooManyDigits, OneMore, BareLf.
    framing::chunk_forms([8, 1, 1, 1, 1, 1, 1, 1, 1, 1], 1..4)
}

const LAST_CHUNKS: &[&[u8]] = &[
    b"0\r\n\r\n",
    b"0\r\n\r\n",
    b"0\r\n\r\n",
    b"0\r\nX-T: t\r\n\r\n",
    b"0\r\nX-T: 1\r\nX-U: 2\r\nX-T: 3\r\n\r\n",
    b"0\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"0;ext=1\r\n\r\n",
    b"000\r\n\r\n",
    b"0\n\n",
    b"0\r\nX-T : t\r\n\r\n",
    b"0\r\nX-T: t\r\n folded\r\n\r\n",
    b"0\r\n",
];

/// How the response frames its body; the last chunk is an index into [`LAST_CHUNKS`].
type Framing = framing::Framing<usize>;

/// The response side's framing tables.
const TABLES: framing::Tables<usize> = framing::Tables {
    te_values: TE_VALUES,
    cl_value,
    last_chunk: |last| LAST_CHUNKS[last % LAST_CHUNKS.len()],
};

fn framing() -> impl Strategy<Value = Framing> {
    framing::framing(TE_VALUES.len(), [2, 5, 5, 1], chunk_forms)
}

/// A change to one header line of the final head.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    ObsFold,
    SpaceBeforeColon,
    TabAfterColon,
    LeadingSpaceLine,
    BareLfEol,
    BareCrInValue,
    CtlInValue,
    ObsTextInValue,
    EmptyName,
    NoColon,
    TrailingSpace,
    AllBareLf,
    NoReason,
    LowercaseVersion,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    use Mutation::*;
    select(vec![
        ObsFold,
        SpaceBeforeColon,
        TabAfterColon,
        LeadingSpaceLine,
        BareLfEol,
        BareCrInValue,
        CtlInValue,
        ObsTextInValue,
        EmptyName,
        NoColon,
        TrailingSpace,
        AllBareLf,
        NoReason,
        LowercaseVersion,
    ])
}

/// One generated upstream answer.
#[derive(Debug, Clone)]
struct Answer {
    interim: Vec<usize>,
    http10: bool,
    status: u16,
    connection: usize,
    framing: Framing,
    body: &'static [u8],
    mutation: Option<(Mutation, usize)>,
    /// Cut the answer at this fraction (of 256) of its length, then close.
    truncate: Option<u8>,
    /// Close after the answer even if it says keep-alive.
    close_anyway: bool,
}

impl Answer {
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for &i in &self.interim {
            out.extend_from_slice(INTERIM[i].as_bytes());
        }
        let mut lines: Vec<(Vec<u8>, &[u8])> = Vec::new();
        let mut fields: Vec<String> = vec!["X-Served: 1".into()];
        fields.extend(CONNECTION[self.connection].iter().map(|s| s.to_string()));
        let (framing, body) = self.framing.render(self.body, self.body, &TABLES);
        fields.extend(framing);
        for f in fields {
            lines.push((f.into_bytes(), b"\r\n"));
        }
        let version = if self.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let mut status_line = format!("{version} {} Reason", self.status).into_bytes();
        let mut all_bare_lf = false;
        if let Some((m, at)) = self.mutation {
            let i = at % lines.len();
            let line = &mut lines[i].0;
            let colon = line.iter().position(|&b| b == b':').unwrap_or(line.len());
            use Mutation::*;
            match m {
                ObsFold => line.extend_from_slice(b"\r\n folded"),
                SpaceBeforeColon => line.insert(colon, b' '),
                TabAfterColon => line.insert(colon + 1, b'\t'),
                LeadingSpaceLine => line.insert(0, b' '),
                BareLfEol => lines[i].1 = b"\n",
                BareCrInValue => line.extend_from_slice(b"\rx"),
                CtlInValue => line.extend_from_slice(b"\x01x"),
                ObsTextInValue => line.extend_from_slice(b"\xffx"),
                EmptyName => {
                    line.drain(..colon);
                }
                NoColon => {
                    if colon < line.len() {
                        line.remove(colon);
                    }
                }
                TrailingSpace => line.extend_from_slice(b"  "),
                AllBareLf => all_bare_lf = true,
                NoReason => status_line.truncate(12),
                LowercaseVersion => status_line[..4].make_ascii_lowercase(),
            }
        }
        let mut head = status_line;
        head.extend_from_slice(b"\r\n");
        for (line, eol) in &lines {
            head.extend_from_slice(line);
            head.extend_from_slice(eol);
        }
        head.extend_from_slice(b"\r\n");
        if all_bare_lf {
            head = String::from_utf8_lossy(&head)
                .replace("\r\n", "\n")
                .into_bytes();
        }
        out.extend_from_slice(&head);
        out.extend_from_slice(&body);
        if let Some(t) = self.truncate {
            out.truncate(out.len() * usize::from(t) / 256);
        }
        out
    }

    /// Whether the server closes after the answer: it is cut short, framed by the close (or
    /// possibly so, when its framing is malformed), says `Connection: close`, is HTTP/1.0
    /// without keep-alive, or the case says so. Otherwise it answers a second request.
    fn server_closes(&self) -> bool {
        let keep_alive = CONNECTION[self.connection]
            .iter()
            .any(|f| f.to_ascii_lowercase().contains("keep-alive"));
        let says_close = CONNECTION[self.connection]
            .iter()
            .any(|f| f.to_ascii_lowercase().contains("close"));
        let exact = match &self.framing {
            Framing::None => false,
            // Complete as far as a client that accepts the value can tell (14: shorter than the
            // body, which leaves bytes past the response).
            Framing::Length(f) => matches!(f % 16, 0..=5 | 7 | 9 | 11 | 14 | 15),
            Framing::Chunked(..) | Framing::Both(..) => false,
        };
        self.truncate.is_some()
            || self.close_anyway
            || self.status < 200
            || says_close
            || (self.http10 && !keep_alive)
            || (!exact && !matches!(&self.framing, Framing::Chunked(..) | Framing::Both(..)))
            || matches!(&self.framing, Framing::Chunked(..) | Framing::Both(..))
                && !self.well_formed_chunks()
    }

    /// Whether the chunked body (if any) is complete and valid, so a keep-alive server may
    /// leave the connection open without a client waiting on it.
    fn well_formed_chunks(&self) -> bool {
        let (te, forms, last) = match &self.framing {
            Framing::Chunked(te, f, l) | Framing::Both(te, _, f, l) => (*te, f, *l),
            _ => return true,
        };
        let te = TE_VALUES[te as usize % TE_VALUES.len()];
        let chunked_last = te
            .last()
            .and_then(|v| v.rsplit(',').next())
            .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
        chunked_last
            && forms.iter().all(|f| {
                matches!(
                    f,
                    ChunkForm::Lower
                        | ChunkForm::Upper
                        | ChunkForm::LeadingZeros
                        | ChunkForm::Extension
                )
            })
            && (last % LAST_CHUNKS.len()) < 8
    }
}

fn answer() -> impl Strategy<Value = Answer> {
    (
        prop::collection::vec(0..INTERIM.len(), 0..3).prop_map(|mut v| {
            // Most answers have no interim response.
            v.truncate(v.len().saturating_sub(1));
            v
        }),
        prop::bool::weighted(0.1),
        select(STATUSES),
        0..CONNECTION.len(),
        framing(),
        select(BODIES),
        prop::option::weighted(0.3, (mutation(), any::<usize>())),
        prop::option::weighted(0.1, any::<u8>()),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(
                interim,
                http10,
                status,
                connection,
                framing,
                body,
                mutation,
                truncate,
                close_anyway,
            )| Answer {
                interim,
                http10,
                status,
                connection,
                framing,
                body,
                mutation,
                truncate,
                close_anyway,
            },
        )
}

/// Answer classes where the two clients disagree today (each a named, ignored regression test
/// below); the property skips them until the fix lands.
fn known_disagreement(answer: &Answer) -> Option<&'static str> {
    // `a_101_without_an_upgrade_is_refused_alike`.
    if answer.status == 101 {
        return Some("a 101 to a request without Upgrade");
    }
    None
}

// ---------------------------------------------------------------------------------------------
// The property

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `answer` read by each client, on a server of its own: (direct, hyper).
async fn both(answer: &[u8], close: bool) -> (Outcome, Outcome) {
    let a = direct(serve_once(answer.to_vec(), close).await).await;
    let b = hyper_client(serve_once(answer.to_vec(), close).await).await;
    (a, b)
}

#[test]
fn direct_and_hyper_client_agree_on_generated_responses() {
    let rt = runtime();
    let seed = seed(21);
    run_property(seed, cases(DEFAULT_CASES), answer(), |answer| {
        if let Some(why) = known_disagreement(&answer) {
            return Err(TestCaseError::reject(why));
        }
        let bytes = answer.bytes();
        let close = answer.server_closes();
        let (a, b) = rt.block_on(both(&bytes, close));
        if std::env::var("THAW_DIFF_SURVEY").is_ok() && a != b {
            eprintln!(
                "DISAGREE close={close} {:?}\n  direct: {:?}\n  hyper:  {:?}\n",
                B(bytes),
                a,
                b
            );
            return Ok(());
        }
        prop_assert_eq!(a, b, "answer: {:?} (server closes: {})", B(bytes), close);
        Ok(())
    });
}

/// Asserts that both clients agree on `answer`, and returns the outcome.
fn agree(answer: &[u8], close: bool) -> Outcome {
    let (a, b) = runtime().block_on(both(answer, close));
    assert_eq!(
        a,
        b,
        "direct (left) and hyper (right) disagree on {:?}",
        B(answer.to_vec())
    );
    a
}

#[test]
fn a_plain_answer_is_read_alike_and_reused() {
    let out = agree(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false);
    assert_eq!(
        out,
        Outcome::Response {
            status: 200,
            body: Some(B(b"hello".to_vec())),
            trailers: None,
            reused: true
        }
    );
}

/// The response-side classes the data-port review names (a stale `Content-Length` beside
/// `Transfer-Encoding`, framing fields in trailers) and the classic desync shapes: one answer
/// each, both clients must agree on body, trailers and reuse.
#[test]
fn the_named_response_classes_are_read_alike() {
    let answers: &[(&[u8], bool)] = &[
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\n",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nX-T: t\r\n\r\n",
            false,
        ),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
              HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            false,
        ),
        (
            b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
            false,
        ),
        (
            b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond",
            false,
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", true),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\nx",
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            true,
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello", true),
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", true),
    ];
    for (answer, close) in answers {
        agree(answer, *close);
    }
}

/// Found by the property: a `101` to a request that asked for no upgrade. The direct client
/// refuses it (no response: the activator answers 502); hyper's client hands it on as a
/// response with an empty body (the activator would forward a 101 nobody asked for).
#[test]
#[ignore = "by design: the direct client refuses an unsolicited 101 that hyper's client returns; the activator answers 502 on both paths (a_101_without_an_upgrade_gives_the_same_answer_on_both_client_paths)"]
fn a_101_without_an_upgrade_is_refused_alike() {
    agree(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        true,
    );
}

/// Found by the property: an HTTP/1.0 answer with `Transfer-Encoding: chunked`. hyper's client
/// refuses it (RFC 9112 §6.1: such framing is faulty); the direct client decodes the chunks and
/// answers with the body.
#[test]
fn an_http10_answer_with_transfer_encoding_is_read_alike() {
    agree(
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        true,
    );
}

/// What a client of the activator got: the status and the body (decoded by its framing; empty
/// for the activator's own error answers, whose text names the request and upstream).
async fn through_activator(answer: &[u8], with_body: bool) -> (u16, B) {
    let upstream = serve_once(answer.to_vec(), true).await;
    let (data, _stop) = start_activator(upstream, true).await;
    let mut tcp = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(data))
        .await
        .expect("connect within the timeout")
        .expect("connect");
    let request: &[u8] = if with_body {
        b"POST / HTTP/1.1\r\nHost: r.example\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
    } else {
        b"GET / HTTP/1.1\r\nHost: r.example\r\nConnection: close\r\n\r\n"
    };
    write_all_bounded(&mut tcp, request).await.expect("write");
    let (bytes, _) = read_to_end_or_quiet(&mut tcp, Duration::from_secs(1)).await;
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut slots);
    let Ok(httparse::Status::Complete(n)) = r.parse(&bytes) else {
        panic!("no response head in {:?}", B(bytes));
    };
    let header = |name: &str| {
        r.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.to_vec())
    };
    let rest = &bytes[n..];
    let body = if header("transfer-encoding").is_some() {
        dechunk(rest).ok().flatten().map_or(rest.to_vec(), |d| d.0)
    } else if let Some(len) =
        header("content-length").and_then(|v| String::from_utf8(v).ok()?.parse::<usize>().ok())
    {
        rest[..len.min(rest.len())].to_vec()
    } else {
        rest.to_vec()
    };
    let status = r.code.unwrap_or(0);
    (status, B(if status >= 400 { Vec::new() } else { body }))
}

/// The stale-length finding, as the activator's client sees it: the same upstream answer (a stale
/// `Content-Length` beside `Transfer-Encoding: chunked`) to a bodiless request (read by the
/// direct client) and to a request with a body (read by hyper's client) must reach the client
/// as the same status and body.
#[test]
fn a_stale_content_length_beside_chunked_gives_the_same_body_on_both_client_paths() {
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
                   5\r\nhello\r\n0\r\n\r\n";
    let rt = runtime();
    let direct = rt.block_on(through_activator(answer, false));
    let hyper = rt.block_on(through_activator(answer, true));
    assert_eq!(direct, (200, B(b"hello".to_vec())));
    assert_eq!(
        direct, hyper,
        "direct path (left), hyper's client path (right)"
    );
}

/// The same comparison on answers both client paths read alike today.
#[test]
fn plain_answers_give_the_same_body_on_both_client_paths() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ] {
        client_paths_agree(answer);
    }
}

/// Both client paths of the activator, one upstream answer: the same status and body.
fn client_paths_agree(answer: &[u8]) {
    let rt = runtime();
    let direct = rt.block_on(through_activator(answer, false));
    let hyper = rt.block_on(through_activator(answer, true));
    assert_eq!(
        direct,
        hyper,
        "answer {:?}: direct path (left), hyper's client path (right)",
        B(answer.to_vec())
    );
}

/// `a_101_without_an_upgrade_is_refused_alike` as the activator's client sees it: 502 when the
/// direct client read the answer, the 101 itself when hyper's did.
#[test]
fn a_101_without_an_upgrade_gives_the_same_answer_on_both_client_paths() {
    client_paths_agree(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    );
}

/// `an_http10_answer_with_transfer_encoding_is_read_alike` as the activator's client sees it.
#[test]
fn an_http10_chunked_answer_gives_the_same_answer_on_both_client_paths() {
    client_paths_agree(
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
}

// ---------------------------------------------------------------------------------------------
// Both client paths of one activator

/// An upstream answering every request with the current answer, then closing (so every
/// request gets a fresh connection and reuse plays no part: the property above covers it).
struct Scripted {
    addr: SocketAddr,
    answer: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

async fn scripted_upstream() -> Scripted {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let answer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let current = answer.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let current = current.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let Some(end) = read_head_keep(&mut s, &mut buf).await else {
                    return;
                };
                // The request's body (`Content-Length` only: the requests here send one byte).
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                while buf.len() < end + len {
                    let mut chunk = [0u8; 1024];
                    match tokio::time::timeout(IO_TIMEOUT, s.read(&mut chunk)).await {
                        Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
                let answer = current.lock().unwrap().clone();
                let _ = write_all_bounded(&mut s, &answer).await;
            });
        }
    });
    Scripted { addr, answer }
}

/// Reads until a complete request head is in `buf` (kept there); its length with the blank line.
async fn read_head_keep(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            return Some(i + 4);
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(IO_TIMEOUT, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// What the activator's client got for one request: the complete responses (normalised as in
/// the request-side tests), whether the connection closed without a complete answer (a
/// response cut short, or none at all: either way the client knows the exchange failed), and
/// how the connection ended.
async fn activator_answer(
    data: SocketAddr,
    upstream: SocketAddr,
    with_body: bool,
) -> (Vec<Reply>, bool, End) {
    let mut tcp = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(data))
        .await
        .expect("connect within the timeout")
        .expect("connect");
    let request: &[u8] = if with_body {
        b"POST / HTTP/1.1\r\nHost: r.example\r\nX-Request-Id: diff-0\r\nTE: trailers\r\n\
          Content-Length: 1\r\nConnection: close\r\n\r\nx"
    } else {
        b"GET / HTTP/1.1\r\nHost: r.example\r\nX-Request-Id: diff-0\r\nTE: trailers\r\n\
          Connection: close\r\n\r\n"
    };
    let _ = write_all_bounded(&mut tcp, request).await;
    let (bytes, end) = read_to_end_or_quiet(&mut tcp, Duration::from_millis(500)).await;
    let (mut replies, garbage) = responses(&bytes);
    for r in &mut replies {
        normalise(r, &upstream.to_string());
        // The activator's own error answers (no `X-Served` from the upstream): their text names
        // the parser's complaint, which differs between the two clients; the status counts.
        if !r.fields.iter().any(|(name, _)| name == "x-served") {
            r.body = B::default();
            r.fields.retain(|(name, _)| name != "content-length");
        }
    }
    let failed = garbage.is_some() || replies.is_empty();
    (replies, failed, end)
}

/// Generated upstream answers (the property's, less those cut short by design of the
/// server-closes rule: every answer here is followed by a close) to a bodiless `GET` (read by
/// the direct client) and to a `POST` with a one-byte body (read by hyper's client), through
/// one activator: the client must get the same responses and the same end of connection.
#[test]
fn both_client_paths_of_the_activator_give_the_same_answer() {
    let rt = runtime();
    let (up, data, _stop) = rt.block_on(async {
        let up = scripted_upstream().await;
        let (data, stop) = start_activator(up.addr, true).await;
        (up, data, stop)
    });
    let seed = seed(22);
    run_property(seed, cases(DEFAULT_CASES / 2), answer(), |answer| {
        if let Some(why) = known_activator_disagreement(&answer) {
            return Err(TestCaseError::reject(why));
        }
        let bytes = answer.bytes();
        *up.answer.lock().unwrap() = bytes.clone();
        let (a, b) = rt.block_on(async {
            (
                activator_answer(data, up.addr, false).await,
                activator_answer(data, up.addr, true).await,
            )
        });
        if std::env::var("THAW_DIFF_SURVEY").is_ok() && a != b {
            eprintln!(
                "DISAGREE {:?}\n  direct: {:?}\n  hyper:  {:?}\n",
                B(bytes),
                a,
                b
            );
            return Ok(());
        }
        prop_assert_eq!(a, b, "answer: {:?}", B(bytes));
        Ok(())
    });
}

/// Answer classes where the activator's two client paths disagree today (named, ignored tests
/// above); the activator-level property skips them.
fn known_activator_disagreement(_answer: &Answer) -> Option<&'static str> {
    // None left: the stale length, the 304's length and trailers were fixed in src.
    None
}

/// Found by the activator-level property: a 304 with `Content-Length`. The direct path passes
/// the field on, hyper's client path drops it (RFC 9110 §8.6 lets a 304 carry the length the
/// 200 would have had).
#[test]
fn a_304_with_content_length_gives_the_same_answer_on_both_client_paths() {
    let rt = runtime();
    let answer = b"HTTP/1.1 304 Not Modified\r\nX-Served: 1\r\nContent-Length: 5\r\n\r\n";
    let (direct, hyper) = rt.block_on(async {
        let up = scripted_upstream().await;
        *up.answer.lock().unwrap() = answer.to_vec();
        let (data, _stop) = start_activator(up.addr, true).await;
        (
            activator_answer(data, up.addr, false).await,
            activator_answer(data, up.addr, true).await,
        )
    });
    assert_eq!(
        direct, hyper,
        "direct path (left), hyper's client path (right)"
    );
}

/// Found by the activator-level property: an upstream trailer section, to a client that asked
/// for trailers (`TE: trailers`). The direct path (answered by the lane) passes the trailers
/// on, framing fields among them (the data-port review); hyper's client path (answered by hyper's
/// server) sends none.
#[test]
fn trailers_give_the_same_answer_on_both_client_paths() {
    let rt = runtime();
    let answer = b"HTTP/1.1 200 OK\r\nX-Served: 1\r\nTransfer-Encoding: chunked\r\n\r\n\
                   5\r\nhello\r\n0\r\nX-T: t\r\nContent-Length: 5\r\n\r\n";
    let (direct, hyper) = rt.block_on(async {
        let up = scripted_upstream().await;
        *up.answer.lock().unwrap() = answer.to_vec();
        let (data, _stop) = start_activator(up.addr, true).await;
        (
            activator_answer(data, up.addr, false).await,
            activator_answer(data, up.addr, true).await,
        )
    });
    assert_eq!(
        direct, hyper,
        "direct path (left), hyper's client path (right)"
    );
}
