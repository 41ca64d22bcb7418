//! What the differential tests share: the property runner (fixed seed, case count from
//! `THAW_PROPTEST_CASES`), bounded socket reads, a byte-string wrapper that prints escaped, and
//! the body framing both suites generate ([`framing`]).

#![allow(dead_code)] // each test crate uses its own part

pub mod framing;

use std::fmt;
use std::time::Duration;

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use thaw::activator::testing::StaticEndpoints;
use thaw::activator::{Activator, ActivatorDeps, NextHop};
use thaw::config::ActivatorConfig;
use thaw::revision::{CatalogSnapshot, RevisionCatalog, RevisionSpec};
use thaw::stats::stat_channel;
use thaw::telemetry::Telemetry;

/// The host routed to the one revision of [`start_activator`].
pub const HOST: &str = "r.example";

/// An activator on an ephemeral loopback port with one revision (`default/r`, routed by
/// `Host: r.example`) whose one ready endpoint is `upstream`, forwarding to it as to a container
/// (the client's `Host` goes as it came). Serves until the returned sender is dropped.
pub async fn start_activator(
    upstream: SocketAddr,
    fast_lane: bool,
) -> (SocketAddr, oneshot::Sender<()>) {
    let mut spec = RevisionSpec::test("default", "r");
    spec.hosts = vec![HOST.to_string()];
    let key = spec.key.clone();
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(vec![spec], [])));
    let endpoints = StaticEndpoints::new();
    endpoints.set_ready(&key, vec![upstream]);
    let (sink, mut stats) = stat_channel(1024);
    tokio::spawn(async move { while stats.recv().await.is_some() {} });
    let config = ActivatorConfig {
        fast_lane,
        ..ActivatorConfig::default()
    };
    let activator = Activator::new(ActivatorDeps {
        catalog,
        endpoints,
        stats: Arc::new(sink),
        scale_states: None,
        config: Arc::new(ArcSwap::from_pointee(config)),
        telemetry: Arc::new(Telemetry::new()),
        source_name: "differential".into(),
        next_hop: NextHop::Container,
    });
    let data = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = data.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(activator.serve(data, admin, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// Cases per property when `THAW_PROPTEST_CASES` is not set: a few seconds in `cargo test`.
pub const DEFAULT_CASES: u32 = 512;

/// The cases to run: `THAW_PROPTEST_CASES` if set (a long run), else `default`.
pub fn cases(default: u32) -> u32 {
    match std::env::var("THAW_PROPTEST_CASES") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("THAW_PROPTEST_CASES: not a number: {v:?}")),
        Err(_) => default,
    }
}

/// The seed: `THAW_PROPTEST_SEED` (0-255) if set, else `default` (each property has its own).
pub fn seed(default: u8) -> u8 {
    match std::env::var("THAW_PROPTEST_SEED") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("THAW_PROPTEST_SEED: not a number from 0 to 255: {v:?}")),
        Err(_) => default,
    }
}

/// Runs `test` on `cases` values of `strategy` drawn from a fixed seed (the same inputs on
/// every run, so a failure in CI is reproduced by running the test again), shrinking a failure
/// a bounded number of steps. No failure file is written: a disagreement found becomes a named
/// regression test instead.
pub fn run_property<S: Strategy>(
    seed: u8,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), proptest::test_runner::TestCaseError>,
) where
    S::Value: fmt::Debug,
{
    let config = Config {
        cases,
        max_shrink_iters: 256,
        max_global_rejects: cases.saturating_mul(4).max(1024),
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    match runner.run(&strategy, test) {
        Ok(()) => {}
        Err(TestError::Fail(why, input)) => {
            panic!("property failed: {why}\nminimal input: {input:#?}")
        }
        Err(TestError::Abort(why)) => panic!("property aborted: {why}"),
    }
}

/// Bytes that print as an escaped byte string (`b"GET / HTTP/1.1\r\n..."`), so a failing
/// input or a recorded request reads as what went over the wire.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct B(pub Vec<u8>);

impl fmt::Debug for B {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

impl From<&[u8]> for B {
    fn from(b: &[u8]) -> Self {
        Self(b.to_vec())
    }
}

/// Every socket operation in these tests is bounded by this.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Writes all of `bytes` within [`IO_TIMEOUT`]; an error or timeout is returned, not panicked
/// (the peer may close first, which is itself an outcome).
pub async fn write_all_bounded<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
) -> Result<(), String> {
    match tokio::time::timeout(IO_TIMEOUT, w.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("write: {e}")),
        Err(_) => Err("write timed out".into()),
    }
}

/// How reading a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The peer closed (a clean end of stream or a reset).
    Closed,
    /// Nothing more arrived within the quiet period: the peer waits for more.
    Open,
}

/// Reads until the peer closes, or until nothing arrives for `quiet` (the peer is waiting),
/// or until [`IO_TIMEOUT`] in all.
pub async fn read_to_end_or_quiet<R: AsyncRead + Unpin>(
    r: &mut R,
    quiet: Duration,
) -> (Vec<u8>, End) {
    let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let wait = quiet.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(wait, r.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, End::Closed),
            Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
            Err(_) => return (out, End::Open),
        }
    }
}

/// A decoded chunked body: the data, the trailer section's lines, and how many bytes it took.
pub type Dechunked = (Vec<u8>, Vec<u8>, usize);

/// A chunked body decoded off the front of `buf` (RFC 9112 §7.1, strictly); `Err` if
/// malformed, `Ok(None)` if incomplete.
pub fn dechunk(buf: &[u8]) -> Result<Option<Dechunked>, String> {
    let mut at = 0;
    let mut data = Vec::new();
    loop {
        let Some(eol) = find(&buf[at..], b"\r\n") else {
            return Ok(None);
        };
        let line = &buf[at..at + eol];
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 || digits > 16 {
            return Err(format!("bad chunk size line {:?}", B(line.to_vec())));
        }
        let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).unwrap(), 16)
            .map_err(|e| e.to_string())?;
        at += eol + 2;
        if size == 0 {
            // Trailer section: lines up to an empty one.
            let start = at;
            loop {
                let Some(eol) = find(&buf[at..], b"\r\n") else {
                    return Ok(None);
                };
                at += eol + 2;
                if eol == 0 {
                    return Ok(Some((data, buf[start..at - 2].to_vec(), at)));
                }
            }
        }
        let size = size as usize;
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        data.extend_from_slice(&buf[at..at + size]);
        at += size;
        if &buf[at..at + 2] != b"\r\n" {
            return Err("no CRLF after chunk data".into());
        }
        at += 2;
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Leaves out what differs by design between the two paths or two runs: the status line but
/// for its code, the `Connection`/`Keep-Alive` fields, the body's framing fields (see below),
/// the `Date` field, a
/// generated request id (in `X-Request-Id` and in error bodies), and the upstream's address in
/// error bodies (each side has its own upstream).
pub fn normalise(r: &mut Reply, endpoint: &str) {
    r.fields
        .retain(|(name, _)| !matches!(name.as_str(), "date" | "connection" | "keep-alive"));
    // The status line: only the code (`status`) counts. The lane answers HTTP/1.1 (with
    // `Connection: close` to an HTTP/1.0 client) where hyper echoes HTTP/1.0, both valid (RFC
    // 9110 §6.2), and writes the code's own reason phrase where hyper's server passes on the
    // upstream's (a reason phrase carries no meaning, RFC 9112 §4). Whether the connection
    // stays open is compared apart.
    r.line = B::default();
    // A `Content-Length` as its number: the lane writes the value it parsed (`026` as `26`, a
    // list of equal values `26, 26` as `26`, as RFC 9110 §8.6 allows), hyper's server passes on
    // the upstream's.
    for (name, value) in &mut r.fields {
        if name != "content-length" {
            continue;
        }
        let numbers: Option<Vec<u64>> = std::str::from_utf8(&value.0)
            .ok()
            .and_then(|v| v.split(',').map(|p| p.trim().parse().ok()).collect());
        if let Some(numbers) = numbers
            && !numbers.is_empty()
            && numbers.iter().all(|&n| n == numbers[0])
        {
            *value = B(numbers[0].to_string().into_bytes());
        }
    }
    // How a body is framed to the client is each writer's choice (the lane sends a body of
    // unknown length chunked where hyper's server may close instead; either may use a length):
    // the body is compared de-chunked. A 304's or 204's fields are kept, as there they say
    // something about the representation, not the framing.
    if !matches!(r.status, 100..=199 | 204 | 304) {
        r.fields.retain(|(name, value)| {
            name != "content-length"
                && !(name == "transfer-encoding" && value.0.eq_ignore_ascii_case(b"chunked"))
        });
    }
    for (name, value) in &mut r.fields {
        if name == "x-request-id" && !value.0.starts_with(b"diff-") {
            *value = B(b"<generated>".to_vec());
        }
    }
    let mut body = String::from_utf8_lossy(&r.body.0).replace(endpoint, "<endpoint>");
    // UUID-shaped ids (8-4-4-4-12 hex digits).
    let is_uuid = |w: &[u8]| {
        w.len() == 36
            && w.iter().enumerate().all(|(i, b)| match i {
                8 | 13 | 18 | 23 => *b == b'-',
                _ => b.is_ascii_hexdigit(),
            })
    };
    let mut i = 0;
    while i + 36 <= body.len() {
        if body.is_char_boundary(i)
            && body.is_char_boundary(i + 36)
            && is_uuid(&body.as_bytes()[i..i + 36])
        {
            body.replace_range(i..i + 36, "<uuid>");
        }
        i += 1;
    }
    let changed = body.as_bytes() != r.body.0.as_slice();
    if changed {
        // The length fields follow the body.
        r.fields.retain(|(name, _)| name != "content-length");
        r.body = B(body.into_bytes());
    }
}

/// The status codes of the responses in `buf`, and what is left that is not a response.
pub fn statuses(buf: &[u8]) -> (Vec<u16>, Option<B>) {
    let (responses, garbage) = responses(buf);
    (responses.iter().map(|r| r.status).collect(), garbage)
}

/// One response as the client received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// The status line.
    pub line: B,
    /// Lowercased names and raw values, stably sorted by name.
    pub fields: Vec<(String, B)>,
    /// The body (de-chunked).
    pub body: B,
    /// The trailer section's raw lines (chunked bodies).
    pub trailers: B,
}

/// The responses in `buf`, and what is left that is not a response.
pub fn responses(mut buf: &[u8]) -> (Vec<Reply>, Option<B>) {
    let mut out = Vec::new();
    while !buf.is_empty() {
        // An incomplete response is not one: its bytes are what is left.
        let start = buf;
        let mut slots = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut slots);
        let Ok(httparse::Status::Complete(n)) = r.parse(buf) else {
            return (out, Some(B(buf.to_vec())));
        };
        let code = r.code.unwrap_or(0);
        let end = buf.iter().position(|&b| b == b'\n').unwrap_or(0);
        let mut fields: Vec<(String, B)> = r
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), B(h.value.to_vec())))
            .collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        out.push(Reply {
            status: code,
            line: B(buf[..end]
                .strip_suffix(b"\r")
                .unwrap_or(&buf[..end])
                .to_vec()),
            fields,
            body: B::default(),
            trailers: B::default(),
        });
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value.to_vec())
        };
        let chunked =
            header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked"));
        // A list of equal values is that value (RFC 9110 §8.6).
        let length = header("content-length").and_then(|v| {
            let parts: Option<Vec<usize>> = std::str::from_utf8(&v)
                .ok()?
                .split(',')
                .map(|p| p.trim().parse().ok())
                .collect();
            let parts = parts?;
            parts.iter().all(|&n| n == parts[0]).then(|| parts[0])
        });
        buf = &buf[n..];
        if (100..200).contains(&code) || code == 204 || code == 304 {
            continue;
        }
        let last = out.len() - 1;
        if chunked {
            match dechunk(buf) {
                Ok(Some((data, trailers, used))) => {
                    out[last].body = B(data);
                    out[last].trailers = B(trailers);
                    buf = &buf[used..];
                }
                _ => {
                    out.pop();
                    return (out, Some(B(start.to_vec())));
                }
            }
        } else if let Some(n) = length {
            if buf.len() < n {
                out.pop();
                return (out, Some(B(start.to_vec())));
            }
            out[last].body = B(buf[..n].to_vec());
            buf = &buf[n..];
        } else {
            out[last].body = B(buf.to_vec());
            buf = &[];
        }
    }
    (out, None)
}
