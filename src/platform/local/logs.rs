//! Replica output into thaw's log: line splitting with a length bound, a per-stream token
//! bucket, and a "suppressed K lines" summary when the bucket ran dry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::time::Instant;
use tracing::Instrument;

use crate::revision::RevisionKey;

/// Which output stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The replica's standard output (logged at INFO).
    Stdout,
    /// The replica's standard error (logged at WARN; its last line goes into exit reasons).
    Stderr,
}

impl Stream {
    /// `stdout` or `stderr`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Where replica output goes. Called from the output pumps (one task per stream per replica);
/// implementations must not block.
pub trait LogSink: Send + Sync + 'static {
    /// One line (without its newline; cut to the length bound, ending in `...` if cut).
    fn line(&self, revision: &RevisionKey, replica: u32, stream: Stream, line: &str);
    /// `count` lines were dropped by the rate bound since the last line passed.
    fn suppressed(&self, revision: &RevisionKey, replica: u32, stream: Stream, count: u64);
}

/// The default sink: tracing events with target `thaw::replica` at INFO (stderr lines carry
/// `stream=stderr`), the line prefixed with the revision and the replica index, which together
/// name the replica:
/// `default/hello-00001[0] sample-app: listening on 127.0.0.1:41234`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLogSink;

impl LogSink for TracingLogSink {
    fn line(&self, revision: &RevisionKey, replica: u32, stream: Stream, line: &str) {
        match stream {
            Stream::Stdout => {
                tracing::info!(target: "thaw::replica", "{revision}[{replica}] {line}")
            }
            // Many apps log every request on stderr: that is output, not a problem of thaw's.
            Stream::Stderr => {
                tracing::info!(target: "thaw::replica", stream = "stderr", "{revision}[{replica}] {line}")
            }
        }
    }

    fn suppressed(&self, revision: &RevisionKey, replica: u32, stream: Stream, count: u64) {
        tracing::warn!(
            target: "thaw::replica",
            "{revision}[{replica}] suppressed {count} lines of {} (over the rate limit)",
            stream.as_str()
        );
    }
}

/// Bounds on replica output, per stream of each replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Sustained lines per second passed to the sink.
    pub lines_per_second: u32,
    /// Lines that may pass in a burst above the sustained rate.
    pub burst: u32,
    /// Longer lines are cut to this many bytes (the rest of the line is read and dropped).
    pub max_line_bytes: usize,
}

impl Default for LogLimits {
    /// 50 lines/s, bursts of 200, lines of at most 4 KiB.
    fn default() -> Self {
        Self {
            lines_per_second: 50,
            burst: 200,
            max_line_bytes: 4096,
        }
    }
}

/// A token bucket on tokio's clock. Pure apart from the `now` it is given.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(limits: &LogLimits, now: Instant) -> Self {
        let burst = f64::from(limits.burst.max(1));
        Self {
            rate: f64::from(limits.lines_per_second),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes one token if there is one.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The last non-empty line of a stream, kept for exit reasons.
pub(crate) type LastLine = Arc<Mutex<Option<String>>>;

/// Where a pump reports: the sink, and who it speaks for.
pub(crate) struct PumpTarget {
    pub sink: Arc<dyn LogSink>,
    pub revision: RevisionKey,
    pub replica: u32,
    pub stream: Stream,
    pub limits: LogLimits,
    pub last_line: LastLine,
}

/// Reads `reader` to its end, passing each line to the sink within the rate and length bounds
/// and remembering the last one. Memory is bounded by `max_line_bytes` plus the reader's buffer.
pub(crate) async fn pump(reader: impl AsyncRead + Unpin, t: PumpTarget) {
    let span = tracing::debug_span!("replica_output", revision = %t.revision, replica = t.replica, stream = t.stream.as_str());
    async move {
        let mut reader = BufReader::with_capacity(8 * 1024, reader);
        let mut bucket = TokenBucket::new(&t.limits, Instant::now());
        let mut suppressed: u64 = 0;
        let mut line: Vec<u8> = Vec::with_capacity(256);
        let mut cut = false;
        loop {
            let buf = match reader.fill_buf().await {
                Ok(buf) => buf,
                Err(e) => {
                    tracing::debug!(error = %e, "reading replica output failed");
                    break;
                }
            };
            if buf.is_empty() {
                break;
            }
            let (chunk, complete) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], true),
                None => (buf, false),
            };
            let used = chunk.len() + usize::from(complete);
            // A CRLF line's CR is not content (a lone CR split across reads is kept).
            let chunk = if complete {
                chunk.strip_suffix(b"\r").unwrap_or(chunk)
            } else {
                chunk
            };
            let room = t.limits.max_line_bytes.saturating_sub(line.len());
            if chunk.len() > room {
                cut = true;
            }
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            reader.consume(used);
            if complete {
                emit(&t, &mut bucket, &mut suppressed, &line, cut);
                line.clear();
                cut = false;
            }
        }
        if !line.is_empty() {
            emit(&t, &mut bucket, &mut suppressed, &line, cut);
        }
        if suppressed > 0 {
            t.sink
                .suppressed(&t.revision, t.replica, t.stream, suppressed);
        }
    }
    .instrument(span)
    .await
}

fn emit(t: &PumpTarget, bucket: &mut TokenBucket, suppressed: &mut u64, raw: &[u8], cut: bool) {
    let mut text = String::from_utf8_lossy(raw).into_owned();
    if cut {
        text.push_str("...");
    }
    if !text.trim().is_empty()
        && let Ok(mut last) = t.last_line.lock()
    {
        *last = Some(text.clone());
    }
    if bucket.take(Instant::now()) {
        if *suppressed > 0 {
            t.sink
                .suppressed(&t.revision, t.replica, t.stream, *suppressed);
            *suppressed = 0;
        }
        t.sink.line(&t.revision, t.replica, t.stream, &text);
    } else {
        *suppressed += 1;
    }
}

/// How long the exit path waits for the pumps to reach the end of a dead replica's output
/// (grandchildren may hold the pipes open; the pumps then go on, the wait does not).
pub(crate) const OUTPUT_FLUSH_WAIT: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Capture(Mutex<Vec<String>>);

    impl LogSink for Capture {
        fn line(&self, _: &RevisionKey, replica: u32, stream: Stream, line: &str) {
            let mut v = self.0.lock().unwrap();
            v.push(format!("{replica}/{}: {line}", stream.as_str()));
        }
        fn suppressed(&self, _: &RevisionKey, _: u32, _: Stream, count: u64) {
            self.0.lock().unwrap().push(format!("suppressed {count}"));
        }
    }

    fn target(sink: Arc<Capture>, limits: LogLimits) -> PumpTarget {
        PumpTarget {
            sink,
            revision: RevisionKey::new("ns", "rev"),
            replica: 7,
            stream: Stream::Stderr,
            limits,
            last_line: LastLine::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_refills_at_the_rate_up_to_the_burst() {
        let limits = LogLimits {
            lines_per_second: 10,
            burst: 2,
            max_line_bytes: 10,
        };
        let t0 = Instant::now();
        let mut b = TokenBucket::new(&limits, t0);
        assert!(b.take(t0));
        assert!(b.take(t0));
        assert!(!b.take(t0));
        assert!(b.take(t0 + Duration::from_millis(100)));
        assert!(!b.take(t0 + Duration::from_millis(150)));
        // A long pause refills only up to the burst.
        let later = t0 + Duration::from_secs(60);
        assert!(b.take(later));
        assert!(b.take(later));
        assert!(!b.take(later));
    }

    #[tokio::test(start_paused = true)]
    async fn lines_are_cut_rate_bounded_and_summarised() {
        let sink = Arc::new(Capture::default());
        let limits = LogLimits {
            lines_per_second: 1,
            burst: 2,
            max_line_bytes: 5,
        };
        let t = target(sink.clone(), limits);
        let last = t.last_line.clone();
        let input: &[u8] = b"short\r\nmuch too long\nthird\nfourth\nlast no newline";
        pump(input, t).await;
        let got = sink.0.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![
                "7/stderr: short".to_string(),
                "7/stderr: much ...".to_string(),
                "suppressed 3".to_string(),
            ]
        );
        assert_eq!(last.lock().unwrap().as_deref(), Some("last ..."));
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_tracing_sink_prefixes_lines_with_revision_and_replica() {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let rev = RevisionKey::new("default", "hello-00001");
        tracing::subscriber::with_default(subscriber, || {
            TracingLogSink.line(&rev, 2, Stream::Stdout, "listening");
            TracingLogSink.line(&rev, 2, Stream::Stderr, "oops");
            TracingLogSink.suppressed(&rev, 2, Stream::Stderr, 9);
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].contains("INFO") && lines[0].contains("thaw::replica"));
        assert!(
            lines[0].ends_with("thaw::replica: default/hello-00001[2] listening"),
            "{out}"
        );
        assert!(
            lines[1].contains("INFO") && lines[1].contains("default/hello-00001[2] oops"),
            "{out}"
        );
        assert!(lines[1].contains("stream=\"stderr\""), "{out}");
        assert!(lines[2].contains("default/hello-00001[2] suppressed 9 lines of stderr"));
    }
}
