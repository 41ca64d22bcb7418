//! RAII accounting of one request: its concurrency count (arrival to response end, held time
//! included), its endpoint slot, and its client connection's activity. Dropping the ticket —
//! answered, failed or cancelled — undoes all three, so nothing leaks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use tokio::time::{Duration, Instant};

use crate::percore::LocalArc;
use super::rev_state::RevisionState;
use super::throttler::InFlight;

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

/// One routed request's accounting.
#[derive(Debug)]
pub struct Ticket {
    state: LocalArc<RevisionState>,
    slot: Option<InFlight>,
    /// The concurrency-window shard the request arrived on (and departs from).
    shard: usize,
    _conn: Option<ConnActive>,
}

impl Ticket {
    /// Counts the request as present in its revision from `now` on (the caller's reading of the
    /// clock as the request arrived: one read serves its arrival, deadlines and logs).
    pub fn arrive(state: LocalArc<RevisionState>, conn: Option<ConnActive>, now: Instant) -> Self {
        let shard = state.window().arrive(now);
        Self {
            state,
            slot: None,
            shard,
            _conn: conn,
        }
    }

    /// Ties a ticket that arrived before its connection had a request (an early hold) to that
    /// request's connection guard.
    pub fn attach_conn(&mut self, conn: ConnActive) {
        self._conn = Some(conn);
    }

    /// The revision this request was routed to.
    pub fn state(&self) -> &Arc<RevisionState> {
        &self.state
    }

    /// The endpoint slot, once admitted.
    pub fn slot(&self) -> Option<&InFlight> {
        self.slot.as_ref()
    }

    /// Attaches the endpoint slot the request was admitted to.
    pub fn set_slot(&mut self, slot: InFlight) {
        if self.slot.replace(slot).is_none() {
            self.state.metrics.in_flight.inc();
        }
    }

    /// Gives the endpoint slot back early (before a retry on another endpoint).
    pub fn release_slot(&mut self) {
        if self.slot.take().is_some() {
            self.state.metrics.in_flight.dec();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.release_slot();
        self.state.window().depart(self.shard, Instant::now());
    }
}

/// Resolves once `progress()` has not changed across a whole `period` and `busy()` is false at
/// its end (checked every `period`, so after one to two periods of quiet). Never resolves when
/// `period` is zero (zero disables the timeout rather than spinning). The keep-alive timeout of
/// a client connection and the idle timeout of a websocket tunnel both wait on it.
pub(crate) async fn quiet_for(
    period: Duration,
    progress: impl Fn() -> u64,
    busy: impl Fn() -> bool,
) {
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
