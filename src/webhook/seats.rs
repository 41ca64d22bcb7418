//! The admission port's connection seats: at most `capacity` connections are open at once, and
//! no client can fill them against the API server.
//!
//! A new connection takes a free seat; when none is free it takes the seat of the *oldest*
//! connection that has no request in flight, and that connection is told to close
//! ([`Seat::evicted`]). Only when every open connection has a request in flight is the new one
//! refused ([`Busy`]): that lasts at most the request timeout, since each request is bounded.
//! So a client holding idle connections (however many, from however many addresses) only
//! ever costs its own oldest ones their place, and a caller sending a request is never
//! cut: a seat whose connection has begun a request cannot be taken, and a request cannot
//! begin on a seat that was taken.
//!
//! Pure bookkeeping (no socket, no clock): the listener in [`super::server`] owns the I/O.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

/// Set in a seat's state once it has been taken from its connection: no request may begin on
/// it any more. The other bits count the requests in flight on it.
const EVICTED: usize = 1 << (usize::BITS - 1);

/// The seats of one listener.
#[derive(Debug)]
pub struct Seats {
    /// Most connections holding a seat at once (at least 1).
    capacity: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// The next connection's number: numbers grow with acceptance, so the map's order is age.
    next: u64,
    /// The seats held, oldest connection first.
    by_age: BTreeMap<u64, Arc<Shared>>,
}

/// What a seat's connection and the listener share.
#[derive(Debug, Default)]
struct Shared {
    /// Requests in flight, or [`EVICTED`] once the seat was taken (only ever from 0).
    state: AtomicUsize,
    /// Cancelled when the seat is taken: the connection closes.
    evicted: CancellationToken,
}

/// Every open connection has a request in flight: the new one is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

/// A connection's place; dropping it frees the place (when it was not taken already).
#[derive(Debug)]
pub struct Seat {
    seats: Arc<Seats>,
    id: u64,
    shared: Arc<Shared>,
}

/// A request in flight on a seat: while it lives the seat cannot be taken. Dropping it (the
/// request answered, failed or cancelled) ends the request's claim.
#[derive(Debug)]
pub struct InFlight {
    shared: Arc<Shared>,
}

/// What taking a seat cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A free seat.
    Free,
    /// The seat of the oldest connection with no request in flight, which now closes.
    Evicted,
}

impl Seats {
    /// `capacity` seats (at least one).
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity: capacity.max(1),
            held: Mutex::new(Held::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A seat for a new connection: a free one, else the seat of the oldest connection with no
    /// request in flight (that connection's [`Seat::evicted`] resolves), else [`Busy`].
    pub fn take(self: &Arc<Self>) -> Result<(Seat, Taken), Busy> {
        let mut held = self.lock();
        let mut taken = Taken::Free;
        if held.by_age.len() >= self.capacity {
            // Only a seat with nothing in flight can be taken, and once taken no request can
            // begin on it: the exchange from 0 decides both at once.
            let victim = held
                .by_age
                .iter()
                .find(|(_, s)| {
                    s.state
                        .compare_exchange(0, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
                .map(|(id, _)| *id)
                .ok_or(Busy)?;
            if let Some(s) = held.by_age.remove(&victim) {
                s.evicted.cancel();
            }
            taken = Taken::Evicted;
        }
        let id = held.next;
        held.next += 1;
        let shared = Arc::new(Shared::default());
        held.by_age.insert(id, shared.clone());
        Ok((
            Seat {
                seats: self.clone(),
                id,
                shared,
            },
            taken,
        ))
    }

    /// Seats held now.
    pub fn held(&self) -> usize {
        self.lock().by_age.len()
    }
}

impl Seat {
    /// Marks a request in flight, or `None` when the seat was taken (the connection is
    /// closing; the request must not begin).
    pub fn begin(&self) -> Option<InFlight> {
        self.shared
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & EVICTED == 0).then_some(s + 1)
            })
            .ok()
            .map(|_| InFlight {
                shared: self.shared.clone(),
            })
    }

    /// Resolves once the seat was taken by a newer connection: close the connection.
    pub async fn evicted(&self) {
        self.shared.evicted.cancelled().await
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        // A taken seat left the map already (and its number is never reused).
        self.seats.lock().by_age.remove(&self.id);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.state.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn is_evicted(s: &Seat) -> bool {
        s.evicted().now_or_never().is_some()
    }

    #[test]
    fn a_full_room_gives_the_oldest_idle_seat_away() {
        let seats = Seats::new(3);
        let (a, t) = seats.take().unwrap();
        assert_eq!(t, Taken::Free);
        let (b, _) = seats.take().unwrap();
        let (c, _) = seats.take().unwrap();
        // a has a request in flight: b, the oldest idle one, goes.
        let req = a.begin().unwrap();
        let (d, t) = seats.take().unwrap();
        assert_eq!(t, Taken::Evicted);
        assert!(is_evicted(&b) && !is_evicted(&a) && !is_evicted(&c));
        assert_eq!(seats.held(), 3);
        // No request begins on a taken seat.
        assert!(b.begin().is_none());
        drop(b);
        assert_eq!(seats.held(), 3, "a taken seat's drop frees nothing");
        // a's request over, a is the oldest idle one again.
        drop(req);
        let (_e, t) = seats.take().unwrap();
        assert_eq!(t, Taken::Evicted);
        assert!(is_evicted(&a) && !is_evicted(&c) && !is_evicted(&d));
    }

    #[test]
    fn every_seat_busy_refuses_and_a_finished_request_frees_one() {
        let seats = Seats::new(2);
        let (a, _) = seats.take().unwrap();
        let (b, _) = seats.take().unwrap();
        let ra = a.begin().unwrap();
        let rb = b.begin().unwrap();
        assert_eq!(seats.take().map(|(_, t)| t).unwrap_err(), Busy);
        assert_eq!(seats.held(), 2);
        drop(rb);
        let (_c, t) = seats.take().unwrap();
        assert_eq!(t, Taken::Evicted);
        assert!(is_evicted(&b) && !is_evicted(&a));
        drop(ra);
    }

    #[test]
    fn a_closed_connection_frees_its_seat() {
        let seats = Seats::new(1);
        let (a, _) = seats.take().unwrap();
        drop(a);
        assert_eq!(seats.held(), 0);
        let (b, t) = seats.take().unwrap();
        assert_eq!(t, Taken::Free);
        assert!(!is_evicted(&b));
    }

    #[test]
    fn many_idle_connections_from_one_client_never_keep_a_new_one_out() {
        let seats = Seats::new(8);
        let mut idle: Vec<Seat> = (0..300).map(|_| seats.take().unwrap().0).collect();
        assert_eq!(seats.held(), 8);
        // Only the 8 newest still hold their seats.
        assert!(idle[..292].iter().all(is_evicted));
        assert!(idle[292..].iter().all(|s| !is_evicted(s)));
        let (fresh, t) = seats.take().unwrap();
        assert_eq!(t, Taken::Evicted);
        assert!(fresh.begin().is_some());
        idle.clear();
        assert_eq!(seats.held(), 1);
    }
}
