//! A client connection's activity: how many of its requests are in progress and how many ever
//! started (for the keep-alive idle timeout), and its place under the caller's connection limit,
//! held as long as the connection or anything it turned into (a websocket tunnel) lives.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use tokio::time::Duration;

/// One client connection's activity, for the keep-alive idle timeout. It also owns the
/// connection's place under `max-connections` (`slot`), released when the last holder drops: the
/// connection task, and any websocket tunnel that outlives it (a tunnel is a connection too).
#[derive(Default)]
pub struct ConnActivity {
    _slot: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Requests on this connection whose response has not finished.
    active: AtomicU32,
    /// Bumped by every request start; an unchanged value means no new request.
    started: AtomicU64,
}

impl std::fmt::Debug for ConnActivity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnActivity")
            .field("active", &self.active)
            .field("started", &self.started)
            .finish()
    }
}

impl ConnActivity {
    /// Activity of a connection whose `slot` (any guard) is released when this is dropped.
    pub fn holding(slot: impl Send + Sync + 'static) -> Self {
        Self {
            _slot: Some(Box::new(slot)),
            ..Default::default()
        }
    }

    /// Marks a request as started on this connection until the guard drops.
    pub fn begin(self: &Arc<Self>) -> ConnActive {
        self.active.fetch_add(1, SeqCst);
        self.started.fetch_add(1, SeqCst);
        ConnActive(self.clone())
    }

    /// (requests active now, requests ever started).
    pub fn load(&self) -> (u32, u64) {
        (self.active.load(SeqCst), self.started.load(SeqCst))
    }
}

/// A request in progress on a connection.
#[derive(Debug)]
pub struct ConnActive(Arc<ConnActivity>);

impl Drop for ConnActive {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, SeqCst);
    }
}

/// Resolves once `progress()` has not changed across a whole `period` and `busy()` is false at
/// its end (checked every `period`, so after one to two periods of quiet). Never resolves when
/// `period` is zero (zero disables the timeout rather than spinning). The keep-alive timeout of
/// a client connection and the idle timeout of a websocket tunnel both wait on it.
pub async fn quiet_for(period: Duration, progress: impl Fn() -> u64, busy: impl Fn() -> bool) {
    if period.is_zero() {
        return std::future::pending().await;
    }
    loop {
        let before = progress();
        tokio::time::sleep(period).await;
        if !busy() && progress() == before {
            return;
        }
    }
}
