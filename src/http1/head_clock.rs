//! The header-read timeout, measured from when a request head starts arriving.
//!
//! hyper's own HTTP/1 `header_read_timeout` starts whenever the connection waits for the next
//! request, so an idle keep-alive connection would be closed after the header-read timeout
//! (10 s) instead of the keep-alive timeout (75 s) — below common load balancer idle timeouts,
//! which then race the close and answer 502. thaw turns hyper's timer off and keeps its own:
//!
//! - a new connection must send a complete request head within the timeout (slow-client
//!   protection from the first byte on);
//! - afterwards the clock starts at the first byte that arrives while no request is in
//!   progress, and stops when hyper hands over the parsed head; such a head is cut between one
//!   and two timeouts after its first byte (see [`HeadClock::expired`]);
//! - idle time between requests is governed by the keep-alive timeout alone;
//! - an HTTP/2 connection (prior-knowledge preface, as the listener sniffed it) must complete
//!   its first request's headers within the timeout from accept; after that it has no head
//!   clock (its streams are bounded by the keep-alive PINGs and the idle close instead).
//!
//! The protocol is the listener's verdict ([`HeadClock::speaks_h2`]), never taken from later
//! bytes: a request body that happens to start with the HTTP/2 preface must not switch the
//! clock off.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Duration, Instant};

use super::activity::ConnActivity;

/// One connection's head clock.
#[derive(Debug)]
pub struct HeadClock {
    base: Instant,
    /// Milliseconds since `base` + 1 when the current head started arriving; 0 = no head
    /// pending.
    since: AtomicU64,
    /// Set when the listener found the connection speaks HTTP/2: once its first request's
    /// headers are complete, no later bytes start a head.
    h2: AtomicBool,
}

impl HeadClock {
    /// A clock for a connection accepted now: the first head is pending from the start.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            since: AtomicU64::new(1),
            h2: AtomicBool::new(false),
        })
    }

    /// When the connection was accepted (the clock was made).
    pub fn accepted(&self) -> Instant {
        self.base
    }

    /// hyper parsed a request head: nothing is pending any more.
    pub fn head_received(&self) {
        self.since.store(0, SeqCst);
    }

    /// The listener found the connection speaks HTTP/2 (prior knowledge). Its first request's
    /// headers are still due within the timeout from accept.
    pub fn speaks_h2(&self) {
        self.h2.store(true, SeqCst);
    }

    fn bytes_arrived(&self, request_in_progress: bool) {
        if request_in_progress || self.h2.load(SeqCst) || self.since.load(SeqCst) != 0 {
            return;
        }
        let ms = self.base.elapsed().as_millis() as u64 + 1;
        let _ = self.since.compare_exchange(0, ms, SeqCst, SeqCst);
    }

    /// A head is arriving from now on (the first request of a connection, held before hyper
    /// read it: its clock starts when hyper can read it).
    pub fn head_started_now(&self) {
        self.since
            .store(self.base.elapsed().as_millis() as u64 + 1, SeqCst);
    }

    /// Resolves when a request head has been pending for `timeout`. Never resolves for a zero
    /// timeout, nor for an HTTP/2 connection once its first request arrived.
    ///
    /// Nothing wakes it when a head starts: while no head is pending it looks again every
    /// `timeout`, so a head is cut between one and two timeouts after its first byte. That keeps
    /// the per-request path free of wake-ups (the connection task polls this on every wake).
    pub async fn expired(&self, timeout: Duration) {
        if timeout.is_zero() {
            return std::future::pending().await;
        }
        loop {
            let since = self.since.load(SeqCst);
            if since == 0 {
                tokio::time::sleep(timeout).await;
                continue;
            }
            let deadline = self.base + Duration::from_millis(since - 1) + timeout;
            tokio::time::sleep_until(deadline).await;
            if self.since.load(SeqCst) == since {
                return;
            }
        }
    }
}

/// The client socket as hyper reads it, reporting arriving bytes to the connection's
/// [`HeadClock`]. Bytes the fast lane read but did not use (`super::lane`, a connection handed
/// to hyper) come first; then reads and writes pass straight through (vectored writes
/// included).
#[derive(Debug)]
pub struct HeadIo<T> {
    prefix: bytes::Bytes,
    inner: T,
    clock: Arc<HeadClock>,
    activity: Arc<ConnActivity>,
}

impl<T> HeadIo<T> {
    /// `prefix` is read before `inner` (empty for a connection hyper serves from the start).
    pub fn new(
        prefix: bytes::Bytes,
        inner: T,
        clock: Arc<HeadClock>,
        activity: Arc<ConnActivity>,
    ) -> Self {
        Self {
            prefix,
            inner,
            clock,
            activity,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for HeadIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            // Already seen by the lane, which started the head clock when it handed over.
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let in_progress = this.activity.load().0 > 0;
            this.clock.bytes_arrived(in_progress);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for HeadIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, b)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn first_head_times_out_from_accept_then_only_from_first_byte() {
        let clock = HeadClock::new();
        let t = Duration::from_secs(10);
        // A new connection: pending from the start.
        assert!(
            tokio::time::timeout(t + Duration::from_millis(1), clock.expired(t))
                .await
                .is_ok()
        );
        // Head received, then idle for much longer than the timeout: nothing expires.
        clock.head_received();
        assert!(tokio::time::timeout(t * 5, clock.expired(t)).await.is_err());
        // The next head starts arriving: it is cut between one and two timeouts later.
        let waiting = tokio::spawn({
            let clock = clock.clone();
            async move { clock.expired(t).await }
        });
        tokio::time::sleep(t / 3).await;
        clock.bytes_arrived(false);
        let start = Instant::now();
        waiting.await.unwrap();
        let took = Instant::now() - start;
        assert!(took >= t && took <= t * 2, "{took:?}");
    }

    #[tokio::test]
    async fn a_handed_over_connection_reads_the_prefix_first() {
        use tokio::io::AsyncReadExt;
        let (a, mut b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut b, b" world")
            .await
            .unwrap();
        drop(b);
        let prefix = bytes::Bytes::from_static(b"hello");
        let mut io = HeadIo::new(prefix, a, HeadClock::new(), Arc::default());
        let mut got = String::new();
        io.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "hello world");
    }

    #[tokio::test(start_paused = true)]
    async fn body_bytes_and_http2_do_not_start_the_clock() {
        let clock = HeadClock::new();
        clock.head_received();
        clock.bytes_arrived(true);
        let t = Duration::from_secs(1);
        assert!(tokio::time::timeout(t * 3, clock.expired(t)).await.is_err());

        let h2 = HeadClock::new();
        h2.speaks_h2();
        h2.head_received();
        h2.bytes_arrived(false);
        h2.bytes_arrived(false);
        assert!(tokio::time::timeout(t * 3, h2.expired(t)).await.is_err());
    }

    /// An h2c connection's first request is due within the timeout from accept, as on HTTP/1.
    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_without_a_first_request_times_out() {
        let h2 = HeadClock::new();
        h2.speaks_h2();
        h2.bytes_arrived(false);
        let t = Duration::from_secs(1);
        assert!(tokio::time::timeout(t * 2, h2.expired(t)).await.is_ok());
    }
}
