//! The scaler loop, and the [`ScaleState`] it publishes per revision.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::revision::RevisionKey;

/// The scaler's latest answer for one revision.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleState {
    /// Desired replicas; -1 until the first decision.
    pub desired: i32,
    /// When `desired` was last changed (the activator times cold-start phases from it).
    pub decided_at: Option<Instant>,
    /// Whether the activator must stay in the request path (cold, or short of burst capacity).
    pub activator_in_path: bool,
}

impl Default for ScaleState {
    fn default() -> Self {
        Self {
            desired: -1,
            decided_at: None,
            activator_in_path: true,
        }
    }
}

/// Every revision's [`ScaleState`] on a watch channel, shared by the scaler (writer) and the
/// activator and admin API (readers).
#[derive(Debug, Default)]
pub struct ScaleStates {
    map: DashMap<RevisionKey, watch::Sender<ScaleState>>,
}

impl ScaleStates {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A receiver for `revision`'s state (created at the default state if not yet decided).
    pub fn subscribe(&self, revision: &RevisionKey) -> watch::Receiver<ScaleState> {
        self.map
            .entry(revision.clone())
            .or_insert_with(|| watch::channel(ScaleState::default()).0)
            .subscribe()
    }

    /// Publishes a new state; receivers are woken only if it differs from the last one.
    pub fn publish(&self, revision: &RevisionKey, state: ScaleState) {
        let tx = self
            .map
            .entry(revision.clone())
            .or_insert_with(|| watch::channel(ScaleState::default()).0)
            .clone();
        tx.send_if_modified(|cur| {
            if *cur == state {
                false
            } else {
                *cur = state;
                true
            }
        });
    }

    /// The current state of `revision`, if it was ever published or subscribed.
    pub fn get(&self, revision: &RevisionKey) -> Option<ScaleState> {
        self.map.get(revision).map(|tx| tx.borrow().clone())
    }

    /// Forgets a removed revision; its receivers see the channel close.
    pub fn remove(&self, revision: &RevisionKey) {
        self.map.remove(revision);
    }
}
