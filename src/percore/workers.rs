//! Data-plane workers: one single-threaded tokio runtime per core, nginx-style.
//!
//! The accept loop hands each new connection to the next worker; the connection's socket, its
//! requests, and the pooled upstream connections they use (see
//! `Upstream::for_this_thread` in the activator) then all live on that worker's thread. A request
//! never hops between threads, so the per-request futex wake-ups and context switches of a
//! work-stealing runtime disappear. What is shared — the throttler, balancer counters, metrics,
//! the catalog — is already atomics and `ArcSwap`, so holding and balancing are unchanged: a
//! request held on one worker is woken by an endpoint update from any thread.
//!
//! Without workers (tests, or `Activator::serve` on its own) connections run on the runtime
//! that calls `serve`, as before.

use std::cell::Cell;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::watch;

thread_local! {
    /// The index of the worker running on this thread (`None` off the workers).
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index (0..n) of the data worker the calling thread is, or `None` on any other thread.
/// Per-worker shards of shared state (the concurrency window) are picked with it.
pub fn current_worker() -> Option<usize> {
    WORKER.with(Cell::get)
}

/// Running worker runtimes. [`Workers::stop`] stops them and waits for their threads; dropping
/// the last handle only tells them to stop. Stop them after `serve` has returned, so no
/// connection is cut.
#[derive(Debug)]
pub struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    stop: watch::Sender<bool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    /// Starts `n` (at least 1) worker threads named `thaw-data-{i}`, each running a
    /// current-thread runtime until stopped.
    pub fn start(n: usize) -> io::Result<Self> {
        let (stop, stopped) = watch::channel(false);
        let mut handles = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let mut stopped = stopped.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("thaw-data-{i}"))
                    .spawn(move || {
                        WORKER.with(|w| w.set(Some(i)));
                        rt.block_on(async move {
                            let _ = stopped.wait_for(|s| *s).await;
                        });
                    })?,
            );
        }
        Ok(Self {
            handles,
            next: AtomicUsize::new(0),
            stop,
            threads: Mutex::new(threads),
        })
    }

    /// The worker for the next connection (round-robin).
    pub fn next(&self) -> &Handle {
        &self.handles[self.next.fetch_add(1, Relaxed) % self.handles.len()]
    }

    /// How many workers run.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Always false: there is at least one worker.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Stops every worker and waits for its thread (call it from outside the workers). Tasks
    /// still running on them are dropped. Later calls return at once.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Workers {
    /// Signals the workers to stop without waiting (the drop may run on a worker thread).
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
