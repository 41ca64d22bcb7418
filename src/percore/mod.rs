//! The per-core runtime: what lets the data plane run nginx-style, one thread per core, with no
//! cache line written by two cores per request. The activator uses all three pieces; the queue
//! sidecar, with one small runtime, needs none of them. They use nothing of the rest of thaw.
//!
//! What each costs and buys (measured on the 2-vCPU Intel VM; docs/benchmarks.md has the figures):
//! - [`workers`] — one single-threaded tokio runtime per core; the accept loop hands each
//!   connection to the next worker, and a request, its upstream connection and its timers stay
//!   on that thread. Buys: thaw went from 0.48-0.69x to 0.70-0.84x nginx's req/s and from
//!   56-65 to 36-39 µs of CPU per request (the work-stealing runtime's cross-thread wake-ups).
//!   Costs: a thread per core and a per-thread upstream pool (idle connections per worker).
//! - [`handles`] — `PerCoreArc`/`LocalArc`: one extra `Arc` per worker for the revision state,
//!   the throttler and each endpoint, so a request moves only its own core's reference count.
//!   Buys: admit + release on one throttler from two workers 505 -> 266 ns (criterion
//!   `throttler_two_workers`), CPU per warm request 9.3 -> 9.0 µs, thaw's share of its own CPU
//!   samples 21.4 -> 20.1 %. Costs: a 256-byte allocation per value per worker that touches it,
//!   and ~1 ns uncontended (the thread-local worker index).
//! - [`spread`] — a counter or gauge kept as per-thread cells, summed at scrape time, for the
//!   two metric families every request moves (in-flight, requests). Buys: no shared atomic per
//!   request (a shared `fetch_add` measured ~40 ns above a private one under two-worker
//!   ping-pong). Costs: 1 KiB per series instead of 8 bytes, so only those two families use it.
//!
//! All three stay: each removed a cost that a criterion case or a CPU profile shows beyond the
//! warm run's noise; none is on a path that the sidecar or the autoscaler must take.

pub mod handles;
pub mod spread;
pub mod workers;

pub use handles::{LocalArc, PerCoreArc};
pub use workers::{Workers, current_worker};
