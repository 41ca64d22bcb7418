//! RAII accounting of one request: its concurrency count (arrival to response end, held time
//! included), its endpoint slot, and its client connection's activity (`http1::activity`). Dropping the ticket —
//! answered, failed or cancelled — undoes all three, so nothing leaks.

use std::sync::Arc;

use tokio::time::Instant;

use super::rev_state::RevisionState;
use super::throttler::InFlight;
use crate::http1::activity::ConnActive;
use crate::percore::LocalArc;

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
