//! Shared fixtures of the autoscaler integration tests: a scaler over the in-memory platform,
//! and a second-by-second driver on a virtual clock.
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;

use thaw::autoscaler::scaler::{ActivatorPath, ScaleStates, Scaler, ScalerOptions, Trigger};
use thaw::clock;
use thaw::config::AutoscalingSpec;
use thaw::platform::memory::MemoryPlatform;
use thaw::revision::{CatalogSnapshot, RevisionCatalog, RevisionKey, RevisionSpec};
use thaw::stats::{Stat, StatMessage};
use thaw::telemetry::Telemetry;

pub fn key(name: &str) -> RevisionKey {
    RevisionKey::new("ns", name)
}

pub fn revision(name: &str, tune: impl FnOnce(&mut AutoscalingSpec)) -> RevisionSpec {
    let mut rev = RevisionSpec::test("ns", name);
    let mut spec = AutoscalingSpec::default();
    tune(&mut spec);
    rev.autoscaling = Arc::new(spec);
    rev
}

pub fn stat(name: &str, at: u64, concurrency: f64) -> Stat {
    Stat {
        revision: key(name),
        source: "activator".into(),
        at,
        average_concurrency: concurrency,
        requests: concurrency.ceil() as u64,
        proxied_concurrency: 0.0,
        proxied_requests: 0,
    }
}

pub struct Harness {
    pub catalog: Arc<RevisionCatalog>,
    pub platform: Arc<MemoryPlatform>,
    pub states: Arc<ScaleStates>,
    pub telemetry: Telemetry,
    pub scaler: Scaler,
}

pub fn harness(
    revisions: Vec<RevisionSpec>,
    platform: Arc<MemoryPlatform>,
    path: ActivatorPath,
) -> Harness {
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(revisions, [])));
    let states = ScaleStates::new();
    let telemetry = Telemetry::new();
    let options = ScalerOptions {
        activator_path: path,
        ..ScalerOptions::default()
    };
    let scaler = Scaler::new(
        catalog.clone(),
        platform.clone(),
        states.clone(),
        &telemetry,
        options,
    );
    Harness {
        catalog,
        platform,
        states,
        telemetry,
        scaler,
    }
}

/// Local mode with the activator in the path since second 0; the timelines start at 1000.
pub fn local() -> ActivatorPath {
    ActivatorPath::Always {
        since: clock::instant_of(0),
    }
}

impl Harness {
    /// One virtual second: pods asked for are ready at once, the activator reports `load`,
    /// a poke decides at once, and every even second is a tick.
    pub async fn second(&mut self, name: &str, s: u64, load: f64) {
        let now = clock::instant_of(s);
        let k = key(name);
        let replicas = self.platform.replicas(&k).unwrap_or(0);
        self.platform.set_ready(&k, replicas as usize);
        if let Some(poked) = self
            .scaler
            .ingest(StatMessage::Record(stat(name, s, load)), now)
        {
            self.scaler.decide(&poked, Trigger::Poke, now).await;
        }
        if s.is_multiple_of(2) {
            self.scaler.tick(now).await;
        }
    }

    /// Runs seconds `from..to` and returns the replicas after each.
    pub async fn run(
        &mut self,
        name: &str,
        from: u64,
        to: u64,
        load: impl Fn(u64) -> f64,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        for s in from..to {
            self.second(name, s, load(s)).await;
            out.push(self.platform.replicas(&key(name)).unwrap_or(0));
        }
        out
    }
}

/// The first second (offset from `from`) at which `replicas` becomes `value` and stays.
pub fn settles_at(replicas: &[u32], from: u64, value: u32) -> Option<u64> {
    let last_other = replicas.iter().rposition(|&r| r != value);
    match last_other {
        None => Some(from),
        Some(i) if i + 1 < replicas.len() => Some(from + i as u64 + 1),
        Some(_) => None,
    }
}
