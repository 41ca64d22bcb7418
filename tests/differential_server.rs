//! Differential tests of the data port's HTTP/1 request side: thaw's fast lane against hyper's
//! server.
//!
//! Generated and mutated request heads (valid ones, and the classic desync ingredients:
//! Content-Length / Transfer-Encoding combinations, duplicated framing and Host fields,
//! obs-fold, odd whitespace, bare CR and LF, control bytes, huge and signed numbers in lengths
//! and chunk sizes, absolute / asterisk / authority-form targets, pipelined pairs, small bodies)
//! go as raw bytes over TCP to two real activators in this process: one with config-activator
//! `fast-lane: true` (the lane serves bodiless requests, hyper the rest) and one with
//! `fast-lane: false` (hyper's server reads every request). Each input ends with a sentinel
//! request carrying `Connection: close`, so where a request ends is visible: a path that frames
//! a body differently forwards a different sentinel (or none).
//!
//! Both must agree on:
//! - **the answer to the client**: every response, in order (status line, header fields, body),
//!   and whether the connection was closed or left waiting for more bytes;
//! - **the requests at the upstream** (a raw TCP server recording exactly what it received):
//!   the request line, the header fields as lowercased names with their values, the body bytes
//!   (de-chunked) and the trailer section.
//!
//! Header fields (of requests and responses) are compared after a stable sort by name: hyper's
//! `HeaderMap` groups repeated names together while the lane keeps wire order, so only the
//! relative order of one name's values counts. What differs by design is normalised:
//! - an `X-Request-Id` the client did not send is compared as `<generated>` (every generated
//!   request sends `X-Request-Id: diff-...`; another value was made by the activator, at random);
//! - a `Host` that is the upstream's own address (sent upstream when the client sent none; each
//!   side has its own upstream) is compared as `<endpoint>`;
//! - in responses: the HTTP version of the status line and the `Connection` / `Keep-Alive`
//!   fields (the lane answers an HTTP/1.0 client with HTTP/1.1 and `Connection: close`, hyper
//!   with HTTP/1.0; both valid, and whether the connection closes is compared anyway), the
//!   `Date` field, and in error bodies request ids and the upstream's address;
//! - a request whose body failed on the client side is left out at the upstream: whether its
//!   head reached the upstream before the failure depends on timing.
//!
//! The inputs come from a fixed seed: `cargo test --test differential_server` runs the same
//! [`DEFAULT_CASES`] cases every time (a few seconds). A long run with other inputs:
//!
//! ```text
//! THAW_PROPTEST_CASES=20000 THAW_PROPTEST_SEED=7 cargo test --test differential_server
//! ```
//!
//! With `THAW_DIFF_SURVEY=1` (and `-- --nocapture`) the property prints every disagreeing input
//! and goes on, instead of stopping at the first: a survey for new input classes.
//!
//! Disagreements found are named regression tests at the end of this file; those still open are
//! `#[ignore]`d with the reason, and the property skips their input class (`known_disagreement`).

mod differential_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use differential_support::framing::{self, ChunkForm};
use differential_support::*;

/// How long a connection may stay silent before it counts as waiting for more bytes.
const QUIET: Duration = Duration::from_millis(300);
/// Ends every input: answered, then the connection closes.
const SENTINEL: &[u8] =
    b"GET /sentinel HTTP/1.1\r\nHost: r.example\r\nX-Request-Id: diff-sentinel\r\nConnection: close\r\n\r\n";
/// The upstream's answer to every request.
const UPSTREAM_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

// ---------------------------------------------------------------------------------------------
// The recording upstream

/// One request as the upstream received it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// The request line as it came (without its line ending).
    line: B,
    /// Lowercased names and raw values, stably sorted by name (see the module doc).
    fields: Vec<(String, B)>,
    /// The body (de-chunked), as far as it came.
    body: B,
    /// The trailer section's raw lines (chunked bodies).
    trailers: B,
    /// Whether the body was complete; or what was wrong with the request.
    state: &'static str,
}

/// What the upstream received, per case (`epoch`): a late request of an earlier case lands in
/// that case's list, never in the current one's.
#[derive(Default)]
struct Recorder {
    epoch: AtomicU64,
    seen: Mutex<HashMap<u64, Vec<Seen>>>,
}

impl Recorder {
    fn push(&self, s: Seen) -> (u64, usize) {
        let epoch = self.epoch.load(SeqCst);
        let mut map = self.seen.lock().unwrap();
        let list = map.entry(epoch).or_default();
        list.push(s);
        (epoch, list.len() - 1)
    }

    fn update(&self, at: (u64, usize), f: impl FnOnce(&mut Seen)) {
        if let Some(s) = self
            .seen
            .lock()
            .unwrap()
            .get_mut(&at.0)
            .and_then(|l| l.get_mut(at.1))
        {
            f(s);
        }
    }

    fn take(&self, epoch: u64) -> Vec<Seen> {
        self.seen.lock().unwrap().remove(&epoch).unwrap_or_default()
    }
}

async fn start_upstream(rec: Arc<Recorder>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(upstream_conn(s, rec.clone()));
        }
    });
    addr
}

/// Reads more into `buf`; false at end of stream, on error, or after a minute of silence (an
/// idle pooled connection).
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 8192];
    match tokio::time::timeout(Duration::from_secs(60), s.read(&mut chunk)).await {
        Ok(Ok(n)) if n > 0 => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
        _ => false,
    }
}

/// Serves one upstream connection: records each request and answers [`UPSTREAM_ANSWER`].
async fn upstream_conn(mut s: TcpStream, rec: Arc<Recorder>) {
    let mut buf = Vec::new();
    loop {
        // The head.
        let (len, line, mut fields) = loop {
            let mut slots = [httparse::EMPTY_HEADER; 128];
            let mut req = httparse::Request::new(&mut slots);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let end = buf.iter().position(|&b| b == b'\n').unwrap_or(0);
                    let line = buf[..end]
                        .strip_suffix(b"\r")
                        .unwrap_or(&buf[..end])
                        .to_vec();
                    let fields: Vec<(String, B)> = req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_ascii_lowercase(), B(h.value.to_vec())))
                        .collect();
                    break (n, line, fields);
                }
                Ok(httparse::Status::Partial) => {
                    if !fill(&mut s, &mut buf).await {
                        return;
                    }
                }
                Err(e) => {
                    rec.push(Seen {
                        line: B(buf.clone()),
                        fields: vec![],
                        body: B::default(),
                        trailers: B::default(),
                        state: if e == httparse::Error::Version {
                            "unparseable head (version)"
                        } else {
                            "unparseable head"
                        },
                    });
                    return;
                }
            }
        };
        buf.drain(..len);
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        let te: Vec<&B> = fields
            .iter()
            .filter(|f| f.0 == "transfer-encoding")
            .map(|f| &f.1)
            .collect();
        let cl: Vec<&B> = fields
            .iter()
            .filter(|f| f.0 == "content-length")
            .map(|f| &f.1)
            .collect();
        enum Framing {
            Chunked,
            Length(usize),
            Close,
            Bad(&'static str),
        }
        let framing = if let Some(last) = te.last() {
            if last
                .0
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
            {
                Framing::Chunked
            } else {
                Framing::Close
            }
        } else if cl.is_empty() {
            Framing::Length(0)
        } else if cl.len() == 1
            && !cl[0].0.is_empty()
            && cl[0].0.iter().all(u8::is_ascii_digit)
            && cl[0].0.len() < 10
        {
            Framing::Length(std::str::from_utf8(&cl[0].0).unwrap().parse().unwrap())
        } else {
            Framing::Bad("unframeable Content-Length")
        };
        let at = rec.push(Seen {
            line: B(line),
            fields,
            body: B::default(),
            trailers: B::default(),
            state: "body incomplete",
        });
        match framing {
            Framing::Bad(why) => {
                rec.update(at, |s| s.state = why);
                return;
            }
            Framing::Length(n) => {
                while buf.len() < n {
                    let had = buf.len();
                    if !fill(&mut s, &mut buf).await {
                        rec.update(at, |s| s.body = B(buf[..had].to_vec()));
                        return;
                    }
                }
                let body: Vec<u8> = buf.drain(..n).collect();
                rec.update(at, |s| {
                    s.body = B(body);
                    s.state = "complete";
                });
            }
            Framing::Chunked => loop {
                match dechunk(&buf) {
                    Ok(Some((data, trailers, used))) => {
                        buf.drain(..used);
                        rec.update(at, |s| {
                            s.body = B(data);
                            s.trailers = B(trailers);
                            s.state = "complete";
                        });
                        break;
                    }
                    Ok(None) => {
                        if !fill(&mut s, &mut buf).await {
                            return;
                        }
                    }
                    Err(_) => {
                        rec.update(at, |s| s.state = "malformed chunked body");
                        return;
                    }
                }
            },
            Framing::Close => {
                while fill(&mut s, &mut buf).await {}
                rec.update(at, |s| {
                    s.body = B(std::mem::take(&mut buf));
                    s.state = "complete (until close)";
                });
                return;
            }
        }
        if write_all_bounded(&mut s, UPSTREAM_ANSWER).await.is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The two activators

/// An activator in front of its own recording upstream.
struct Side {
    data: SocketAddr,
    upstream: SocketAddr,
    rec: Arc<Recorder>,
    _stop: oneshot::Sender<()>,
}

async fn start_side(fast_lane: bool) -> Side {
    let rec = Arc::new(Recorder::default());
    let upstream = start_upstream(rec.clone()).await;
    let (data, stop) = start_activator(upstream, fast_lane).await;
    Side {
        data,
        upstream,
        rec,
        _stop: stop,
    }
}

/// What one path made of an input.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    /// The status codes the client got, in order.
    statuses: Vec<u16>,
    /// The responses (normalised: see [`normalise`]).
    responses: Vec<Reply>,
    /// Bytes after the last response that do not parse as one.
    garbage: Option<B>,
    /// Whether the activator closed the connection or waits for more.
    end: End,
    /// What the upstream received.
    upstream: Vec<Seen>,
}

/// Sends `input` to `side` on a new connection and collects what the client got and what the
/// upstream received.
async fn run(side: &Side, epoch: u64, input: &[u8]) -> Outcome {
    side.rec.epoch.store(epoch, SeqCst);
    let mut tcp = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(side.data))
        .await
        .expect("connect within the timeout")
        .expect("connect");
    // A refused write is an outcome too (the activator closed first): what it answered counts.
    let _ = write_all_bounded(&mut tcp, input).await;
    let (bytes, end) = read_to_end_or_quiet(&mut tcp, QUIET).await;
    drop(tcp);
    let (statuses, garbage) = statuses(&bytes);
    let mut responses = responses(&bytes).0;
    for r in &mut responses {
        normalise(r, &side.upstream.to_string());
    }
    let mut upstream = side.rec.take(epoch);
    // A request whose body failed on the client side may or may not have reached the upstream
    // before the failure (hyper's client writes the head as soon as it can): not compared.
    upstream.retain(|s| s.state != "body incomplete");
    let endpoint = side.upstream.to_string().into_bytes();
    for s in &mut upstream {
        for (name, value) in &mut s.fields {
            if name == "x-request-id" && !value.0.starts_with(b"diff-") {
                *value = B(b"<generated>".to_vec());
            }
            // Without a Host, the endpoint's address is sent: each side has its own upstream.
            if name == "host" && value.0 == endpoint {
                *value = B(b"<endpoint>".to_vec());
            }
        }
    }
    Outcome {
        statuses,
        responses,
        garbage,
        end,
        upstream,
    }
}

// ---------------------------------------------------------------------------------------------
// The inputs

const HOSTS: &[&[&str]] = &[
    &[],
    &[HOST],
    &["R.EXAMPLE:8080"],
    &[HOST, HOST],
    &[HOST, "other.example"],
    &["other.example", HOST],
    &["r.example, other.example"],
    &[""],
    &["r.example:"],
    &["r.example:abc"],
    &["user@r.example"],
];

const TARGETS: &[&str] = &[
    "/",
    "/p?q=1",
    "/a%2Fb",
    "//x",
    "/x/../y",
    "/?a=b&c",
    "/#frag",
    "*",
    "http://r.example/abs",
    "http://other.example/abs",
    "http://r.example",
    "HTTP://R.EXAMPLE:80/abs",
    "r.example:80",
];

const METHODS: &[&str] = &[
    "GET", "GET", "GET", "GET", "POST", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT",
    "get", "PROPFIND",
];

const VERSIONS: &[&str] = &[
    "HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "HTTP/2.0", "http/1.1",
];

/// Header fields added to a request (each entry one or more fields).
const EXTRAS: &[&[&str]] = &[
    &["X-A: 1"],
    &["Connection: close"],
    &["Connection: keep-alive"],
    &["Expect: 100-continue"],
    &["Upgrade: websocket", "Connection: Upgrade"],
    &[
        "Upgrade: h2c",
        "Connection: Upgrade, HTTP2-Settings",
        "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
    ],
    &["TE: trailers"],
    &["X-Forwarded-For: 10.0.0.1"],
    &["Cookie: a=b"],
    &["Accept: */*"],
    &["X-Dup: 1", "X-Dup: 2"],
    &["Keep-Alive: timeout=5", "Proxy-Connection: keep-alive"],
    &["Connection: X-A", "X-A: hop"],
    &["Forwarded: for=10.0.0.2"],
    &["X-Request-Id: diff-second"],
    &["Content-Type: text/plain"],
    &["Trailer: X-T"],
    &["Max-Forwards: 0"],
    &["HOST: r.example"],
    &["content-LENGTH: 0"],
    &["Transfer-encoding: chunked"],
    &["User-Agent: kube-probe/1.30"],
    &["K-Network-Probe: probe", "K-Network-Hash: h"],
    &[
        "Knative-Serving-Namespace: default",
        "Knative-Serving-Revision: r",
    ],
    &["Knative-Serving-Revision: other"],
    &["Upgrade: websocket"],
    &["Connection: upgrade"],
    &["Expect: 100-Continue"],
    &["X-Empty:"],
    &["Te: chunked"],
];

const BODIES: &[&[u8]] = &[
    b"",
    b"ok",
    b"hello",
    b"0\r\n\r\n",
    b"GET /smuggled HTTP/1.1\r\nHost: r.example\r\n\r\n",
];

/// How a request frames its body (with no framing field no body is sent); the last chunk is
/// one of [`last_chunk`]'s forms.
type Framing = framing::Framing<u8>;

/// The request side's framing tables.
const TABLES: framing::Tables<u8> = framing::Tables {
    te_values: TE_VALUES,
    cl_value,
    last_chunk,
};

const TE_VALUES: &[&[&str]] = &[
    &["chunked"],
    &["chunked"],
    &["chunked"],
    &["Chunked"],
    &["gzip, chunked"],
    &["chunked, gzip"],
    &["identity"],
    &["chunked, chunked"],
    &["chunked", "chunked"],
    &["gzip", "chunked"],
    &[" chunked "],
    &["chunked;q=1"],
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
        9 => vec!["99999999999999999999999999".into()],
        10 => vec![format!("{n}, {n}")],
        11 => vec![format!("{n}, {}", n + 1)],
        12 => vec![format!("0x{n:x}")],
        13 => vec![n.to_string(), n.to_string()],
        14 => vec![n.to_string(), (n + 1).to_string()],
        _ => vec![format!("{n}.0")],
    }
}

fn chunk_forms() -> impl Strategy<Value = Vec<ChunkForm>> {
    // Lower, Upper, LeadingZeros, Extension, SpaceThenExtension, Prefix0x, Negative,
    // TooManyDigits, OneMore, BareLf.
    framing::chunk_forms([6, 1, 1, 1, 1, 1, 1, 1, 1, 0], 1..3)
}

/// The last chunk (and trailer section) in form `end`.
fn last_chunk(end: u8) -> &'static [u8] {
    match end % 6 {
        0..=2 => b"0\r\n\r\n",
        3 => b"0\r\nX-T: t\r\n\r\n",
        4 => b"0\r\nContent-Length: 5\r\n\r\n",
        _ => b"0\n\n",
    }
}

/// A change to one field line or to the head.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    ObsFold,
    SpaceBeforeColon,
    TabBeforeColon,
    TabAfterColon,
    TabInValue,
    LeadingSpaceLine,
    BareCrInValue,
    BareLfEol,
    BareCrEol,
    CtlInValue,
    NulInValue,
    DelInValue,
    ObsTextInValue,
    EmptyName,
    BadNameChar,
    NoColon,
    TrailingSpace,
    AllBareLf,
    LeadingEmptyLine,
    DoubleSpaceInRequestLine,
    SpaceInTarget,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    use Mutation::*;
    select(vec![
        ObsFold,
        SpaceBeforeColon,
        TabBeforeColon,
        TabAfterColon,
        TabInValue,
        LeadingSpaceLine,
        BareCrInValue,
        BareLfEol,
        BareCrEol,
        CtlInValue,
        NulInValue,
        DelInValue,
        ObsTextInValue,
        EmptyName,
        BadNameChar,
        NoColon,
        TrailingSpace,
        AllBareLf,
        LeadingEmptyLine,
        DoubleSpaceInRequestLine,
        SpaceInTarget,
    ])
}

/// One generated request.
#[derive(Debug, Clone)]
struct Req {
    method: &'static str,
    target: &'static str,
    version: &'static str,
    host: usize,
    extras: Vec<usize>,
    framing: Framing,
    body: &'static [u8],
    /// A mutation and the field line it applies to (modulo the field count).
    mutation: Option<(Mutation, usize)>,
    /// Framing fields go before the others.
    framing_first: bool,
    /// Filler fields (`X-Fill-N: v`) around the header-count limits (100 slots).
    fill: Option<u8>,
    /// One large value (`X-Big`) around the header-bytes limit (64 KiB).
    big: Option<u8>,
}

impl Req {
    /// The request's bytes; `id` goes in its `X-Request-Id`.
    fn render(&self, id: &str) -> Vec<u8> {
        let mut fields: Vec<String> = Vec::new();
        for h in HOSTS[self.host] {
            fields.push(format!("Host: {h}"));
        }
        fields.push(format!("X-Request-Id: diff-{id}"));
        for &e in &self.extras {
            fields.extend(EXTRAS[e].iter().map(|f| f.to_string()));
        }
        if let Some(n) = self.fill {
            let n = 90 + usize::from(n % 16);
            fields.extend((0..n).map(|i| format!("X-Fill-{i}: v")));
        }
        if let Some(n) = self.big {
            let len = 64 * 1024 - 160 + usize::from(n);
            fields.push(format!("X-Big: {}", "b".repeat(len)));
        }
        let (mut framing, body) = self.framing.render(self.body, b"", &TABLES);
        if self.framing_first {
            framing.append(&mut fields);
            fields = framing;
        } else {
            fields.append(&mut framing);
        }
        let mut lines: Vec<(Vec<u8>, &[u8])> = fields
            .into_iter()
            .map(|f| (f.into_bytes(), &b"\r\n"[..]))
            .collect();
        let mut request_line =
            format!("{} {} {}", self.method, self.target, self.version).into_bytes();
        let mut prefix: &[u8] = b"";
        let mut all_bare_lf = false;
        if let Some((m, at)) = self.mutation {
            let i = at % lines.len();
            let line = &mut lines[i].0;
            let colon = line.iter().position(|&b| b == b':').unwrap_or(line.len());
            use Mutation::*;
            match m {
                ObsFold => line.extend_from_slice(b"\r\n folded"),
                SpaceBeforeColon => line.insert(colon, b' '),
                TabBeforeColon => line.insert(colon, b'\t'),
                TabAfterColon => line.insert(colon + 1, b'\t'),
                TabInValue => line.extend_from_slice(b"\tx"),
                LeadingSpaceLine => line.insert(0, b' '),
                BareCrInValue => line.extend_from_slice(b"\rx"),
                BareLfEol => lines[i].1 = b"\n",
                BareCrEol => lines[i].1 = b"\r",
                CtlInValue => line.extend_from_slice(b"\x01x"),
                NulInValue => line.extend_from_slice(b"\x00x"),
                DelInValue => line.extend_from_slice(b"\x7fx"),
                ObsTextInValue => line.extend_from_slice(b"\xffx"),
                EmptyName => {
                    line.drain(..colon);
                }
                BadNameChar => line.insert(colon.min(1), b'('),
                NoColon => {
                    if colon < line.len() {
                        line.remove(colon);
                    }
                }
                TrailingSpace => line.extend_from_slice(b"  "),
                AllBareLf => all_bare_lf = true,
                LeadingEmptyLine => prefix = b"\r\n",
                DoubleSpaceInRequestLine => {
                    let sp = request_line.iter().position(|&b| b == b' ').unwrap();
                    request_line.insert(sp, b' ');
                }
                SpaceInTarget => {
                    let sp = request_line.iter().position(|&b| b == b' ').unwrap();
                    request_line.splice(sp + 2..sp + 2, *b" x");
                }
            }
        }
        let mut out = prefix.to_vec();
        out.extend_from_slice(&request_line);
        out.extend_from_slice(b"\r\n");
        for (line, eol) in &lines {
            out.extend_from_slice(line);
            out.extend_from_slice(eol);
        }
        out.extend_from_slice(b"\r\n");
        if all_bare_lf {
            out = String::from_utf8_lossy(&out)
                .replace("\r\n", "\n")
                .into_bytes();
        }
        out.extend_from_slice(&body);
        out
    }
}

fn framing() -> impl Strategy<Value = Framing> {
    framing::framing(TE_VALUES.len(), [8, 4, 4, 1], chunk_forms)
}

fn request() -> impl Strategy<Value = Req> {
    let host = prop_oneof![6 => Just(1usize), 1 => 0..HOSTS.len()];
    let target = prop_oneof![6 => select(&TARGETS[..3]), 1 => select(TARGETS)];
    (
        select(METHODS),
        target,
        select(VERSIONS),
        host,
        prop::collection::vec(0..EXTRAS.len(), 0..3),
        framing(),
        select(BODIES),
        prop::option::weighted(0.4, (mutation(), any::<usize>())),
        any::<bool>(),
        prop::option::weighted(0.05, any::<u8>()),
        prop::option::weighted(0.03, any::<u8>()),
    )
        .prop_map(
            |(
                method,
                target,
                version,
                host,
                extras,
                framing,
                body,
                mutation,
                framing_first,
                fill,
                big,
            )| Req {
                method,
                target,
                version,
                host,
                extras,
                framing,
                body,
                mutation,
                framing_first,
                fill,
                big,
            },
        )
}

/// One input: one or two pipelined requests, then the sentinel.
#[derive(Clone)]
struct Input(Vec<Req>);

impl Input {
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, r) in self.0.iter().enumerate() {
            out.extend(r.render(&i.to_string()));
        }
        out.extend_from_slice(SENTINEL);
        out
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("requests", &self.0)
            .field("bytes", &B(self.bytes()))
            .finish()
    }
}

fn input() -> impl Strategy<Value = Input> {
    prop::collection::vec(request(), 1..3).prop_map(Input)
}

/// Input classes where the two paths disagree today (each a named, ignored regression test
/// below); the property skips them until the fix lands.
fn known_disagreement(_input: &Input) -> Option<&'static str> {
    // None left: the duplicated `Content-Length: 0` was fixed in src (the lane hands it on).
    None
}

// ---------------------------------------------------------------------------------------------
// The property

/// Both activators, on one runtime for the whole test.
fn sides() -> (tokio::runtime::Runtime, Side, Side) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (lane, hyper) = rt.block_on(async { (start_side(true).await, start_side(false).await) });
    (rt, lane, hyper)
}

/// Sends `bytes` to both paths (case `epoch`) and returns (lane, hyper).
fn both(
    rt: &tokio::runtime::Runtime,
    lane: &Side,
    hyper: &Side,
    epoch: u64,
    bytes: &[u8],
) -> (Outcome, Outcome) {
    rt.block_on(async {
        (
            run(lane, epoch, bytes).await,
            run(hyper, epoch, bytes).await,
        )
    })
}

#[test]
fn lane_and_hyper_server_agree_on_generated_request_heads() {
    let (rt, lane, hyper) = sides();
    let epoch = AtomicU64::new(1);
    let seed = seed(20);
    run_property(seed, cases(DEFAULT_CASES), input(), |input| {
        if let Some(why) = known_disagreement(&input) {
            return Err(TestCaseError::reject(why));
        }
        let bytes = input.bytes();
        let (mut a, mut b) = both(&rt, &lane, &hyper, epoch.fetch_add(1, SeqCst), &bytes);
        if a != b && (a.end == End::Open || b.end == End::Open) {
            // A stall longer than `QUIET` on a loaded machine reads as "waiting for more": the
            // case runs once more, and a real disagreement repeats.
            (a, b) = both(&rt, &lane, &hyper, epoch.fetch_add(1, SeqCst), &bytes);
        }
        if std::env::var("THAW_DIFF_SURVEY").is_ok() && a != b {
            eprintln!(
                "DISAGREE {:?}\n  lane:  {:?}\n  hyper: {:?}\n",
                B(bytes),
                a,
                b
            );
            return Ok(());
        }
        prop_assert_eq!(a, b, "input: {:?}", B(bytes));
        Ok(())
    });
}

/// Asserts that both paths agree on `input` (then the sentinel), and returns the outcome.
fn agree(input: &[u8]) -> Outcome {
    let (rt, lane, hyper) = sides();
    let mut bytes = input.to_vec();
    bytes.extend_from_slice(SENTINEL);
    let (a, b) = both(&rt, &lane, &hyper, 1, &bytes);
    assert_eq!(
        a,
        b,
        "lane (left) and hyper (right) disagree on {:?}",
        B(bytes)
    );
    a
}

// ---------------------------------------------------------------------------------------------
// Named inputs: the property's classes, one by one

#[test]
fn a_plain_get_is_forwarded_alike() {
    let out =
        agree(b"GET /p?q=1 HTTP/1.1\r\nHost: r.example\r\nX-Request-Id: diff-0\r\nX-A: 1\r\n\r\n");
    assert_eq!(out.statuses, [200, 200]);
    assert_eq!(out.upstream.len(), 2);
    assert_eq!(out.upstream[0].line, B(b"GET /p?q=1 HTTP/1.1".to_vec()));
}

/// The request-side classes the data-port review names (duplicate and missing Host, absolute-form,
/// CONNECT, `Upgrade: h2c`, bare-LF heads) and the classic smuggling shapes: one input each,
/// both paths must agree (whatever the fix makes the answer, it must be the same on both).
#[test]
fn the_named_desync_classes_get_the_same_answer_on_both_paths() {
    const ID: &str = "X-Request-Id: diff-0\r\n";
    let inputs: Vec<String> = vec![
        format!("GET / HTTP/1.1\r\nHost: r.example\r\nHost: other.example\r\n{ID}\r\n"),
        format!("GET / HTTP/1.1\r\nHost: other.example\r\nHost: r.example\r\n{ID}\r\n"),
        format!("GET / HTTP/1.1\r\n{ID}\r\n"),
        format!("GET http://r.example/abs HTTP/1.1\r\nHost: other.example\r\n{ID}\r\n"),
        format!("GET http://other.example/abs HTTP/1.1\r\nHost: r.example\r\n{ID}\r\n"),
        format!("CONNECT r.example:80 HTTP/1.1\r\nHost: r.example\r\n{ID}\r\n"),
        format!("OPTIONS * HTTP/1.1\r\nHost: r.example\r\n{ID}\r\n"),
        format!(
            "GET / HTTP/1.1\r\nHost: r.example\r\n{ID}Upgrade: h2c\r\n\
             Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n"
        ),
        "GET / HTTP/1.1\nHost: r.example\nX-Request-Id: diff-0\n\n".to_string(),
        format!("GET / HTTP/1.1\r\nHost: r.example\r\n{ID}X-A: 1\r\n folded\r\n\r\n"),
        format!("GET / HTTP/1.1\r\nHost: r.example\r\n{ID}X-A : 1\r\n\r\n"),
        format!("GET / HTTP/1.1\r\nHost: r.example\r\n{ID}X-A: 1\rX-B: 2\r\n\r\n"),
        format!(
            "POST / HTTP/1.1\r\nHost: r.example\r\n{ID}Content-Length: 4\r\n\
             Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ),
        format!(
            "POST / HTTP/1.1\r\nHost: r.example\r\n{ID}Transfer-Encoding: chunked\r\n\
             Transfer-Encoding: identity\r\n\r\n0\r\n\r\n"
        ),
        format!("POST / HTTP/1.1\r\nHost: r.example\r\n{ID}Content-Length: -1\r\n\r\n"),
        format!(
            "POST / HTTP/1.1\r\nHost: r.example\r\n{ID}Content-Length: 18446744073709551616\r\n\r\n"
        ),
        format!(
            "POST / HTTP/1.1\r\nHost: r.example\r\n{ID}Transfer-Encoding: chunked\r\n\r\n\
             ffffffffffffffffff\r\nx\r\n0\r\n\r\n"
        ),
        format!(
            "GET / HTTP/1.1\r\nHost: r.example\r\n{ID}Content-Length: 43\r\n\r\n\
             GET /smuggled HTTP/1.1\r\nHost: r.example\r\n\r\n"
        ),
    ];
    let (rt, lane, hyper) = sides();
    for (i, input) in inputs.iter().enumerate() {
        let mut bytes = input.as_bytes().to_vec();
        bytes.extend_from_slice(SENTINEL);
        let (a, b) = both(&rt, &lane, &hyper, 100 + i as u64, &bytes);
        assert_eq!(
            a,
            b,
            "lane (left) and hyper (right) disagree on {:?}",
            B(bytes)
        );
    }
}

/// Found by the property: two `Content-Length: 0` fields on a bodiless request. The lane serves
/// it and forwards both fields; hyper's server forwards one `content-length: 0`. An upstream
/// that refuses repeated `Content-Length` fields (as this test's does, and as RFC 9112 §6.3
/// allows) fails the lane's request (502) and serves hyper's (200).
#[test]
fn duplicate_content_length_zero_is_forwarded_once() {
    let out = agree(
        b"GET / HTTP/1.1\r\nHost: r.example\r\nX-Request-Id: diff-0\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(out.statuses, [200, 200]);
}
