//! [`MemoryPlatform`]: an in-memory [`Platform`] for tests and `thaw simulate`.
//!
//! It records every scale call and publishes endpoint snapshots like a real platform. Two
//! modes:
//!
//! - [`MemoryPlatform::new`]: scale calls are only recorded; the test publishes endpoints
//!   itself ([`MemoryPlatform::set_ready`], [`MemoryPlatform::set_endpoints`]).
//! - [`MemoryPlatform::with_startup`]: a scale-up starts pods that become ready after a fixed
//!   delay on tokio's clock (so a paused-clock test controls it); a scale-down removes starting
//!   pods first, then ready ones, which move to `terminating` until
//!   [`EndpointSource::drained`] is called for them.
//!
//! Tests can make a revision fail ([`MemoryPlatform::set_failing`]) or make scale calls
//! return errors ([`MemoryPlatform::fail_scale`]). Endpoint addresses are synthetic
//! (`127.0.0.1:<port>`, nothing listens). The call log keeps the last [`MAX_CALLS`] calls.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{
    BoxFuture, EndpointSnapshot, EndpointSource, EndpointStatus, Found, Platform, PlatformError,
};
use crate::revision::RevisionKey;

/// Scale calls remembered (oldest dropped first).
pub const MAX_CALLS: usize = 10_000;

/// One recorded [`Platform::scale`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleCall {
    /// The revision scaled.
    pub revision: RevisionKey,
    /// The replicas asked for.
    pub replicas: u32,
    /// On tokio's clock.
    pub at: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Pod {
    addr: SocketAddr,
    ready: bool,
}

#[derive(Debug)]
struct Rev {
    tx: watch::Sender<Arc<EndpointSnapshot>>,
    /// The last accepted scale call; `None` before any.
    replicas: Option<u32>,
    pods: Vec<Pod>,
    terminating: Vec<SocketAddr>,
    failing: Option<Arc<str>>,
    scale_error: Option<String>,
}

impl Rev {
    fn new() -> Self {
        Self {
            tx: watch::channel(Arc::new(EndpointSnapshot::default())).0,
            replicas: None,
            pods: Vec::new(),
            terminating: Vec::new(),
            failing: None,
            scale_error: None,
        }
    }

    fn publish(&self) {
        let snap = EndpointSnapshot {
            limit: None,
            ready: self
                .pods
                .iter()
                .filter(|p| p.ready)
                .map(|p| p.addr)
                .collect(),
            terminating: self.terminating.clone(),
            starting: self
                .pods
                .iter()
                .filter(|p| !p.ready)
                .map(|p| p.addr)
                .collect(),
            status: match &self.failing {
                Some(reason) => EndpointStatus::Failing {
                    reason: reason.clone(),
                },
                None => EndpointStatus::Ok,
            },
            reach_pending: false,
            queue_proxy: false,
        };
        self.tx.send_if_modified(|cur| {
            if **cur == snap {
                false
            } else {
                *cur = Arc::new(snap);
                true
            }
        });
    }
}

#[derive(Debug, Default)]
struct Inner {
    revisions: HashMap<RevisionKey, Rev>,
    /// What a scaler finds of a revision (as an earlier leader left it).
    found: HashMap<RevisionKey, Found>,
    calls: VecDeque<ScaleCall>,
    next_port: u16,
}

impl Inner {
    fn rev(&mut self, key: &RevisionKey) -> &mut Rev {
        self.revisions.entry(key.clone()).or_insert_with(Rev::new)
    }

    fn addr(&mut self) -> SocketAddr {
        // Synthetic ports 20000..=59999, wrapping.
        let port = 20_000 + self.next_port;
        self.next_port = (self.next_port + 1) % 40_000;
        SocketAddr::from((Ipv4Addr::LOCALHOST, port))
    }
}

/// An in-memory platform. Cheap to share (`Arc`); all methods are non-blocking.
#[derive(Debug, Default)]
pub struct MemoryPlatform {
    inner: Arc<Mutex<Inner>>,
    /// `Some(delay)`: scale calls start pods that become ready after `delay`.
    startup: Option<Duration>,
}

impl MemoryPlatform {
    /// A platform whose endpoints change only when the test says so.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Makes `found` what a scaler finds of `revision` when it starts following it (an
    /// earlier leader's replicas, initialization and serving mode); its replicas are also
    /// the platform's current count.
    pub fn set_found(&self, revision: &RevisionKey, found: Found) {
        let mut inner = self.lock();
        if let Some(n) = found.replicas {
            inner.rev(revision).replicas = Some(n);
        }
        inner.found.insert(revision.clone(), found);
    }

    /// A platform whose pods become ready `delay` after they are asked for.
    pub fn with_startup(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::default(),
            startup: Some(delay),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panicking test thread must not hide the state from the others.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every recorded scale call, oldest first.
    pub fn scale_calls(&self) -> Vec<ScaleCall> {
        self.lock().calls.iter().cloned().collect()
    }

    /// The replicas last asked for `revision` (`None` if never scaled).
    pub fn replicas(&self, revision: &RevisionKey) -> Option<u32> {
        self.lock().revisions.get(revision).and_then(|r| r.replicas)
    }

    /// Ready endpoints of `revision` now.
    pub fn ready(&self, revision: &RevisionKey) -> usize {
        self.lock()
            .revisions
            .get(revision)
            .map_or(0, |r| r.pods.iter().filter(|p| p.ready).count())
    }

    /// Publishes exactly `n` ready endpoints for `revision` (keeping existing addresses).
    pub fn set_ready(&self, revision: &RevisionKey, n: usize) {
        let mut inner = self.lock();
        let mut pods = std::mem::take(&mut inner.rev(revision).pods);
        pods.truncate(n);
        while pods.len() < n {
            let addr = inner.addr();
            pods.push(Pod { addr, ready: true });
        }
        for p in &mut pods {
            p.ready = true;
        }
        let rev = inner.rev(revision);
        rev.pods = pods;
        rev.publish();
    }

    /// Publishes `snapshot` as is (ready endpoints become this platform's pods).
    pub fn set_endpoints(&self, revision: &RevisionKey, snapshot: EndpointSnapshot) {
        let mut inner = self.lock();
        let rev = inner.rev(revision);
        rev.pods = snapshot
            .ready
            .iter()
            .map(|&addr| Pod { addr, ready: true })
            .collect();
        rev.terminating = snapshot.terminating;
        rev.failing = match snapshot.status {
            EndpointStatus::Ok => None,
            EndpointStatus::Failing { reason } => Some(reason),
        };
        rev.publish();
    }

    /// Marks `revision` failing with `reason`, or healthy again with `None`.
    pub fn set_failing(&self, revision: &RevisionKey, reason: Option<&str>) {
        let mut inner = self.lock();
        let rev = inner.rev(revision);
        rev.failing = reason.map(Arc::from);
        rev.publish();
    }

    /// Makes scale calls for `revision` fail with `error` (or succeed again with `None`).
    /// Failed calls are still recorded.
    pub fn fail_scale(&self, revision: &RevisionKey, error: Option<&str>) {
        self.lock().rev(revision).scale_error = error.map(str::to_owned);
    }

    fn apply_scale(&self, revision: &RevisionKey, replicas: u32) -> Result<(), PlatformError> {
        let mut inner = self.lock();
        inner.calls.push_back(ScaleCall {
            revision: revision.clone(),
            replicas,
            at: Instant::now(),
        });
        if inner.calls.len() > MAX_CALLS {
            inner.calls.pop_front();
        }
        if let Some(reason) = inner.rev(revision).scale_error.clone() {
            return Err(PlatformError::Scale {
                revision: revision.clone(),
                reason,
            });
        }
        inner.rev(revision).replicas = Some(replicas);
        let Some(delay) = self.startup else {
            return Ok(());
        };
        let want = replicas as usize;
        let mut started = Vec::new();
        while inner.rev(revision).pods.len() < want {
            let addr = inner.addr();
            let ready = delay.is_zero();
            inner.rev(revision).pods.push(Pod { addr, ready });
            if !ready {
                started.push(addr);
            }
        }
        let rev = inner.rev(revision);
        // Scale down: starting pods go first, newest first; ready ones start terminating.
        while rev.pods.len() > want {
            let victim = rev
                .pods
                .iter()
                .rposition(|p| !p.ready)
                .unwrap_or(rev.pods.len() - 1);
            let pod = rev.pods.remove(victim);
            if pod.ready {
                rev.terminating.push(pod.addr);
            }
        }
        rev.publish();
        drop(inner);
        for addr in started {
            let inner = self.inner.clone();
            let revision = revision.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let mut inner = inner.lock().unwrap_or_else(|e| e.into_inner());
                let rev = inner.rev(&revision);
                if let Some(pod) = rev.pods.iter_mut().find(|p| p.addr == addr) {
                    pod.ready = true;
                    rev.publish();
                }
            });
        }
        Ok(())
    }
}

impl EndpointSource for MemoryPlatform {
    fn endpoints(&self, revision: &RevisionKey) -> watch::Receiver<Arc<EndpointSnapshot>> {
        self.lock().rev(revision).tx.subscribe()
    }

    fn drained(&self, revision: &RevisionKey, addr: SocketAddr) {
        let mut inner = self.lock();
        let rev = inner.rev(revision);
        let before = rev.terminating.len();
        rev.terminating.retain(|a| *a != addr);
        if rev.terminating.len() != before {
            rev.publish();
        }
    }
}

impl Platform for MemoryPlatform {
    /// Records the call; with a startup delay, starts or stops pods. Completes at once.
    fn scale(
        &self,
        revision: &RevisionKey,
        replicas: u32,
    ) -> BoxFuture<'_, Result<(), PlatformError>> {
        let result = self.apply_scale(revision, replicas);
        Box::pin(std::future::ready(result))
    }

    fn found(&self, revision: &RevisionKey) -> Found {
        self.lock().found.get(revision).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RevisionKey {
        RevisionKey::new("ns", "rev")
    }

    #[tokio::test(start_paused = true)]
    async fn pods_become_ready_after_the_startup_delay() {
        let p = MemoryPlatform::with_startup(Duration::from_secs(3));
        let mut rx = p.endpoints(&key());
        p.scale(&key(), 2).await.unwrap();
        assert_eq!(p.replicas(&key()), Some(2));
        assert!(rx.borrow_and_update().ready.is_empty());
        tokio::time::advance(Duration::from_millis(2_999)).await;
        assert_eq!(p.ready(&key()), 0);
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().ready.len(), 2);
        assert_eq!(p.scale_calls().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn scale_down_removes_starting_pods_first_and_drains_ready_ones() {
        let p = MemoryPlatform::with_startup(Duration::from_secs(1));
        let rx = p.endpoints(&key());
        p.scale(&key(), 1).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        p.scale(&key(), 2).await.unwrap();
        p.scale(&key(), 1).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            p.ready(&key()),
            1,
            "the starting pod went, the ready one stayed"
        );
        p.scale(&key(), 0).await.unwrap();
        let snap = rx.borrow().clone();
        assert!(snap.ready.is_empty());
        assert_eq!(snap.terminating.len(), 1);
        p.drained(&key(), snap.terminating[0]);
        assert!(rx.borrow().terminating.is_empty());
    }

    #[tokio::test]
    async fn manual_mode_failures_and_errors() {
        let p = MemoryPlatform::new();
        let rx = p.endpoints(&key());
        p.scale(&key(), 3).await.unwrap();
        assert_eq!(p.ready(&key()), 0, "manual mode starts nothing");
        p.set_ready(&key(), 2);
        assert_eq!(rx.borrow().ready.len(), 2);
        p.set_failing(&key(), Some("crash loop"));
        assert_eq!(
            rx.borrow().status,
            EndpointStatus::Failing {
                reason: "crash loop".into()
            }
        );
        p.fail_scale(&key(), Some("quota"));
        assert!(matches!(
            p.scale(&key(), 1).await,
            Err(PlatformError::Scale { .. })
        ));
        assert_eq!(p.replicas(&key()), Some(3));
        assert_eq!(p.scale_calls().len(), 2);
    }
}
