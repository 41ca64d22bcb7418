//! One revision as the Kubernetes platform tracks it: its private EndpointSlices, its failing
//! pods, and the failures the scaler found. Every change goes through a short critical section
//! (no await under the lock) that ends by publishing the snapshot.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::watch;

use super::children::Ignored;
use super::pods::PodFailure;
use super::slices::{self, Ownership, SliceEndpoints, Tally};
use crate::platform::{EndpointSnapshot, EndpointStatus};
use crate::revision::{Protocol, RevisionKey};

/// What the platform knows of one revision.
#[derive(Debug)]
pub(crate) struct RevEntry {
    pub key: RevisionKey,
    /// The snapshots subscribers see.
    tx: watch::Sender<Arc<EndpointSnapshot>>,
    /// The latest replica count asked for; the revision's scaler task applies it.
    pub desired: watch::Sender<Option<u32>>,
    /// Whether the scaler task runs (started on the first `scale`).
    pub scaler_started: std::sync::atomic::AtomicBool,
    /// The term (`Inner::term_id`) in which `/scale` was last written; 0: never.
    pub wrote_in_term: std::sync::atomic::AtomicU64,
    state: Mutex<RevState>,
}

#[derive(Debug, Default)]
pub(crate) struct RevState {
    pub protocol: Protocol,
    /// Scale-up from zero to a ready pod, past which the revision is failing (`TimedOut`).
    pub activation_timeout: Option<Duration>,
    /// The revision's private slices by name, reduced for the current protocol.
    pub slices: BTreeMap<String, (EndpointSlice, SliceEndpoints)>,
    /// Failing pods by name.
    pub failing_pods: BTreeMap<String, PodFailure>,
    /// No ready pod within the activation timeout after a scale-up from zero.
    pub timed_out: bool,
    /// The Deployment was still missing after the grace period.
    pub deployment_missing: bool,
    /// The revision was removed ([`super::KubePlatform::remove`]): failing for good.
    pub removed: bool,
}

/// The client-facing reason of a failing revision: a Kubernetes reason word, nothing else
/// (pod names, images and messages go to the logs).
pub(crate) fn failing_reason(word: &str) -> Arc<str> {
    format!("revision unavailable ({word})").into()
}

impl RevEntry {
    pub fn new(key: RevisionKey) -> Self {
        Self {
            key,
            tx: watch::channel(Arc::new(EndpointSnapshot::default())).0,
            desired: watch::channel(None).0,
            scaler_started: std::sync::atomic::AtomicBool::new(false),
            wrote_in_term: std::sync::atomic::AtomicU64::new(0),
            state: Mutex::new(RevState::default()),
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<EndpointSnapshot>> {
        self.tx.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, RevState> {
        // A panic under the lock leaves plain data behind: keep going with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the state, then publishes the snapshot if it changed.
    pub fn update<R>(&self, f: impl FnOnce(&mut RevState) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st);
        let snap = st.snapshot();
        drop(st);
        self.tx.send_if_modified(|cur| {
            if **cur == snap {
                false
            } else {
                *cur = Arc::new(snap);
                true
            }
        });
        r
    }

    /// Reads the state.
    pub fn read<R>(&self, f: impl FnOnce(&RevState) -> R) -> R {
        f(&self.lock())
    }
}

/// What judging a revision's slices found newly not the revision's: the caller counts and logs
/// it (once: a slice received again, or judged again, with the same content is no news).
#[derive(Debug, Default)]
pub(crate) struct News {
    /// Endpoints newly found foreign, by reason.
    pub foreign: Tally,
    /// Slices newly found not the revision's private Service's: (name, why).
    pub slices: Vec<(String, Ignored)>,
}

impl News {
    fn add(&mut self, name: &str, before: Option<&SliceEndpoints>, now: &SliceEndpoints) {
        let none = Tally::default();
        self.foreign
            .merge(&now.foreign.more_than(before.map_or(&none, |b| &b.foreign)));
        if let Some(why) = now.ignored
            && before.and_then(|b| b.ignored) != Some(why)
        {
            self.slices.push((name.to_string(), why));
        }
    }

    /// Whether there is anything to count.
    pub fn is_empty(&self) -> bool {
        self.foreign.total() == 0 && self.slices.is_empty()
    }
}

impl RevState {
    /// Stores (or replaces) one slice, keeping what `owner` finds the revision's.
    pub fn put_slice(&mut self, slice: EndpointSlice, owner: &dyn Ownership) -> News {
        let mut news = News::default();
        let name = slice.metadata.name.clone().unwrap_or_default();
        let eps = slices::owned_endpoints(&slice, self.protocol, owner);
        news.add(&name, self.slices.get(&name).map(|(_, e)| e), &eps);
        self.slices.insert(name, (slice, eps));
        news
    }

    /// Replaces every slice with a fresh list (news only against what was known before).
    pub fn replace_slices(&mut self, listed: Vec<EndpointSlice>, owner: &dyn Ownership) -> News {
        let mut news = News::default();
        let before = std::mem::take(&mut self.slices);
        for slice in listed {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let eps = slices::owned_endpoints(&slice, self.protocol, owner);
            news.add(&name, before.get(&name).map(|(_, e)| e), &eps);
            self.slices.insert(name, (slice, eps));
        }
        news
    }

    /// Changes the protocol, re-reducing every slice for the new port.
    pub fn set_protocol(&mut self, protocol: Protocol, owner: &dyn Ownership) -> News {
        if self.protocol == protocol {
            return News::default();
        }
        self.protocol = protocol;
        self.refilter(owner)
    }

    /// Re-reduces every slice (ownership became known or changed).
    pub fn refilter(&mut self, owner: &dyn Ownership) -> News {
        let protocol = self.protocol;
        let mut news = News::default();
        for (name, (slice, eps)) in self.slices.iter_mut() {
            let now = slices::owned_endpoints(slice, protocol, owner);
            news.add(name, Some(eps), &now);
            *eps = now;
        }
        news
    }

    /// Whether any slice lists a ready endpoint.
    pub fn has_ready(&self) -> bool {
        self.slices.values().any(|(_, e)| !e.ready.is_empty())
    }

    fn snapshot(&self) -> EndpointSnapshot {
        let slices::Merged {
            ready,
            terminating,
            starting,
            queue_proxy,
        } = slices::merge(self.slices.values().map(|(_, e)| e));
        let status = if self.removed {
            EndpointStatus::Failing {
                reason: failing_reason("Removed"),
            }
        } else if self.deployment_missing {
            EndpointStatus::Failing {
                reason: failing_reason("DeploymentMissing"),
            }
        } else if !ready.is_empty() {
            EndpointStatus::Ok
        } else if let Some(f) = self.failing_pods.values().next() {
            EndpointStatus::Failing {
                reason: failing_reason(&f.reason),
            }
        } else if self.timed_out {
            EndpointStatus::Failing {
                reason: failing_reason("TimedOut"),
            }
        } else {
            EndpointStatus::Ok
        };
        EndpointSnapshot {
            limit: None,
            ready,
            terminating,
            starting,
            status,
            reach_pending: false,
            queue_proxy,
        }
    }
}
