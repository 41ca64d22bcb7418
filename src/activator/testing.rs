//! Test doubles for the activator's seams, public so integration tests, benches and examples can
//! feed endpoint snapshots directly without a platform.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use tokio::sync::watch;

use crate::platform::{EndpointSnapshot, EndpointSource, EndpointStatus};
use crate::revision::RevisionKey;

/// An [`EndpointSource`] whose snapshots are set by hand: a map of watch senders, plus a log of
/// the `drained` notifications received.
#[derive(Debug, Default)]
pub struct StaticEndpoints {
    revisions: DashMap<RevisionKey, watch::Sender<Arc<EndpointSnapshot>>>,
    drained: Mutex<Vec<(RevisionKey, SocketAddr)>>,
}

impl StaticEndpoints {
    /// An empty source: every revision starts with no endpoints, status Ok.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn sender(&self, revision: &RevisionKey) -> watch::Sender<Arc<EndpointSnapshot>> {
        self.revisions
            .entry(revision.clone())
            .or_insert_with(|| watch::channel(Arc::new(EndpointSnapshot::default())).0)
            .clone()
    }

    /// Publishes a full snapshot for `revision`.
    pub fn set(&self, revision: &RevisionKey, snapshot: EndpointSnapshot) {
        self.sender(revision).send_replace(Arc::new(snapshot));
    }

    /// Publishes `ready` endpoints, nothing terminating, status Ok.
    pub fn set_ready(&self, revision: &RevisionKey, ready: Vec<SocketAddr>) {
        self.set(
            revision,
            EndpointSnapshot {
                ready,
                ..Default::default()
            },
        );
    }

    /// Publishes status Failing with `reason` and no endpoints.
    pub fn set_failing(&self, revision: &RevisionKey, reason: &str) {
        self.set(
            revision,
            EndpointSnapshot {
                status: EndpointStatus::Failing {
                    reason: reason.into(),
                },
                ..Default::default()
            },
        );
    }

    /// Every `drained` call so far, in order.
    pub fn drained_calls(&self) -> Vec<(RevisionKey, SocketAddr)> {
        self.drained
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl EndpointSource for StaticEndpoints {
    fn endpoints(&self, revision: &RevisionKey) -> watch::Receiver<Arc<EndpointSnapshot>> {
        self.sender(revision).subscribe()
    }

    fn drained(&self, revision: &RevisionKey, addr: SocketAddr) {
        self.drained
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((revision.clone(), addr));
    }
}
