//! Per-core copies of shared state, so the data workers do not write one cache line per request.
//!
//! Every `Arc` clone and drop writes the `Arc`'s count. When both data workers clone the same
//! `Arc` for every request (a revision's state, looked up per request), that count's cache line
//! moves between the cores each time: a transfer the workers otherwise avoid, since a request
//! never changes threads (see [`super::workers`]). [`PerCoreArc`] keeps one extra `Arc` per
//! shard (a data worker, or shard 0 for any other thread), each in its own padded allocation;
//! [`PerCoreArc::local`] clones the calling thread's, so the count it writes is its core's own.

use std::ops::Deref;
use std::sync::{Arc, OnceLock};

/// Pads its content to its own cache line pair (adjacent-line prefetch included), so values
/// written by different cores do not share one.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// How many shards per-core state has: one per core, plus shard 0 for threads that are not
/// data workers (the control runtime, tests' multi-thread runtimes).
pub(crate) fn shard_count() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(64)
            + 1
    })
}

/// The calling thread's shard among `n`: its data worker's (1 + index, wrapping), or 0 off
/// the workers and when there is only one shard.
pub(crate) fn local_shard(n: usize) -> usize {
    match super::workers::current_worker() {
        Some(w) if n > 1 => 1 + w % (n - 1),
        _ => 0,
    }
}

/// An `Arc<T>` with one handle per shard; see the module doc. A shard's copy is made the first
/// time a thread of that shard asks for it, so a value costs one 256-byte allocation per worker
/// that actually uses it (not per core of the machine). Cloning a `PerCoreArc` shares the same
/// copies.
#[derive(Debug)]
pub struct PerCoreArc<T> {
    shared: Arc<T>,
    /// Read-only once set: a handle's clone and drop write the copy's own allocation.
    copies: Arc<[OnceLock<ShardCopy<T>>]>,
}

/// One shard's copy: an extra `Arc<T>` in an allocation of its own, its count on its own line
/// pair.
type ShardCopy<T> = Arc<Padded<Arc<T>>>;

impl<T> Clone for PerCoreArc<T> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            copies: self.copies.clone(),
        }
    }
}

impl<T> PerCoreArc<T> {
    /// A slot for every shard of this machine (copies are made on first use).
    pub fn new(shared: Arc<T>) -> Self {
        Self::with_shards(shared, shard_count())
    }

    /// Slots for `n` (at least 1) shards (copies are made on first use).
    pub fn with_shards(shared: Arc<T>, n: usize) -> Self {
        let copies = (0..n.max(1)).map(|_| OnceLock::new()).collect();
        Self { shared, copies }
    }

    /// A handle whose clone and drop write the calling thread's shard's count only.
    pub fn local(&self) -> LocalArc<T> {
        LocalArc(self.copy(local_shard(self.copies.len())).clone())
    }

    /// Shard `i`'s copy, made now if it was not yet.
    fn copy(&self, i: usize) -> &ShardCopy<T> {
        self.copies[i].get_or_init(|| Arc::new(Padded(self.shared.clone())))
    }

    /// The value's own `Arc` (off the request path: cloning it writes the shared count).
    pub fn shared(&self) -> &Arc<T> {
        &self.shared
    }
}

impl<T> Deref for PerCoreArc<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.shared
    }
}

/// A clone of one shard's copy of an `Arc<T>` (from [`PerCoreArc::local`]). Dereferences to the
/// `Arc<T>` itself; cloning a `LocalArc` writes that shard's count, cloning the `Arc<T>` it
/// derefs to writes the shared one.
#[derive(Debug)]
pub struct LocalArc<T>(Arc<Padded<Arc<T>>>);

impl<T> LocalArc<T> {
    /// A handle of its own for a value reached through its shared `Arc` only (off the request
    /// path: it allocates).
    pub fn from_shared(shared: Arc<T>) -> Self {
        Self(Arc::new(Padded(shared)))
    }
}

impl<T> Clone for LocalArc<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Deref for LocalArc<T> {
    type Target = Arc<T>;

    fn deref(&self) -> &Arc<T> {
        &self.0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_handles_count_on_their_shard_and_keep_the_value_alive() {
        let value = Arc::new(String::from("rev"));
        let per_core = PerCoreArc::with_shards(value.clone(), 3);
        // Off the workers: shard 0.
        assert_eq!(
            Arc::strong_count(&value),
            2,
            "no copy before it is asked for"
        );
        let a = per_core.local();
        let b = a.clone();
        assert_eq!(count(&per_core, 0), Some(3));
        assert_eq!(count(&per_core, 1), None, "shard 1 never asked");
        // The shared count moved once for the one copy made, not per handle.
        assert_eq!(Arc::strong_count(&value), 1 + 1 + 1);
        assert_eq!(a.as_str(), "rev");
        assert!(Arc::ptr_eq(&b, &value));
        // A handle outlives the table entry it came from.
        drop(per_core);
        assert_eq!(Arc::strong_count(&value), 2);
        drop(a);
        assert_eq!(b.as_str(), "rev");
        drop(b);
        assert_eq!(Arc::strong_count(&value), 1);
    }

    /// Shard `i`'s copy's count, if the copy was made.
    fn count<T>(p: &PerCoreArc<T>, i: usize) -> Option<usize> {
        p.copies[i].get().map(Arc::strong_count)
    }

    #[test]
    fn copies_sit_on_separate_cache_line_pairs() {
        let per_core = PerCoreArc::with_shards(Arc::new(0u8), 4);
        let addrs: Vec<usize> = (0..per_core.copies.len())
            .map(|i| Arc::as_ptr(per_core.copy(i)) as usize)
            .collect();
        for a in &addrs {
            assert_eq!(a % 128, 0, "copy not 128-byte aligned");
        }
        for w in addrs.windows(2) {
            assert!(w[0].abs_diff(w[1]) >= 128);
        }
    }

    #[test]
    fn each_worker_clones_its_own_copy() {
        let per_core = Arc::new(PerCoreArc::with_shards(Arc::new(7u32), 3));
        let workers = crate::percore::Workers::start(2).unwrap();
        // Connections go round-robin, so two `next()` calls reach worker 0, then worker 1.
        let mut held = Vec::new();
        for _ in 0..2 {
            let (tx, rx) = std::sync::mpsc::channel();
            let p = per_core.clone();
            workers.next().spawn(async move {
                tx.send((local_shard(3), p.local())).unwrap();
            });
            held.push(rx.recv().unwrap());
        }
        workers.stop();
        assert_eq!(held[0].0, 1, "worker 0 uses shard 1");
        assert_eq!(held[1].0, 2, "worker 1 uses shard 2");
        // Each handle counts on its worker's copy; shard 0 (off the workers) was never made.
        assert_eq!(count(&per_core, 0), None);
        assert_eq!(count(&per_core, 1), Some(2));
        assert_eq!(count(&per_core, 2), Some(2));
        assert_eq!(**held[1].1, 7);
        assert_eq!(local_shard(3), 0, "this thread is not a worker");
        assert_eq!(local_shard(1), 0, "one shard: everyone shares it");
    }
}
