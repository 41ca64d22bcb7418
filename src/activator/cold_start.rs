//! Cold-start phases of one revision: poke -> scaler decision -> first ready endpoint -> first
//! response forwarded. Each phase is observed into
//! `thaw_activator_cold_start_phase_seconds{namespace,revision,phase}` and the whole cold start
//! is logged at info.
//!
//! The request path touches this only through two atomics ([`ColdStart::is_cold_pending`] and
//! [`ColdStart::awaiting_first_byte`]); the mutex is taken once per phase transition.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use tokio::time::{Duration, Instant};

use crate::revision::RevisionKey;
use crate::telemetry::activator::{ActivatorMetrics, ColdStartPhase};

/// How often a still-cold revision is poked again while requests keep arriving.
const REPOKE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Episode {
    poked_at: Instant,
    last_poke: Instant,
    decided_at: Option<Instant>,
    ready_at: Option<Instant>,
}

/// One revision's cold-start tracker.
#[derive(Debug, Default)]
pub struct ColdStart {
    episode: Mutex<Option<Episode>>,
    /// An episode is open and no endpoint is ready yet.
    cold: AtomicBool,
    /// Endpoints became ready; the first forwarded response closes the episode.
    first_byte_pending: AtomicBool,
}

/// What a request arriving at a revision without ready endpoints must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PokeAction {
    /// A new cold start: poke the scaler and count it.
    Begin,
    /// Still cold a second after the last poke: poke again (not a new cold start).
    Repoke,
    /// Poked recently; nothing to do.
    None,
}

impl ColdStart {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Episode>> {
        self.episode.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request found no ready endpoint at `now`.
    pub fn on_cold_request(&self, now: Instant) -> PokeAction {
        let mut ep = self.lock();
        match ep.as_mut() {
            None => {
                *ep = Some(Episode {
                    poked_at: now,
                    last_poke: now,
                    decided_at: None,
                    ready_at: None,
                });
                self.cold.store(true, SeqCst);
                self.first_byte_pending.store(false, SeqCst);
                PokeAction::Begin
            }
            Some(e) if e.ready_at.is_none() && now >= e.last_poke + REPOKE_EVERY => {
                e.last_poke = now;
                PokeAction::Repoke
            }
            Some(_) => PokeAction::None,
        }
    }

    /// Whether an episode is open without a ready endpoint yet.
    pub fn is_cold_pending(&self) -> bool {
        self.cold.load(SeqCst)
    }

    /// The endpoint snapshot at `now` has `ready` ready endpoints. `decided_at` is the scaler's
    /// latest decision time, if known.
    pub fn on_endpoints(
        &self,
        now: Instant,
        ready: usize,
        decided_at: Option<Instant>,
        metrics: &ActivatorMetrics,
        key: &RevisionKey,
    ) {
        let mut ep = self.lock();
        let Some(e) = ep.as_mut() else { return };
        if ready == 0 {
            if e.ready_at.is_some() {
                // Ready came and went without a forwarded response: close the episode.
                *ep = None;
                self.first_byte_pending.store(false, SeqCst);
            }
            return;
        }
        if e.ready_at.is_some() {
            return;
        }
        e.ready_at = Some(now);
        e.decided_at = decided_at.filter(|d| *d >= e.poked_at && *d <= now);
        let since = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
        match e.decided_at {
            Some(d) => {
                metrics.observe_phase(key, ColdStartPhase::PokeToDecision, since(e.poked_at, d));
                metrics.observe_phase(key, ColdStartPhase::DecisionToReady, since(d, now));
            }
            None => tracing::debug!(revision = %key, "cold start without a recorded decision"),
        }
        metrics.observe_phase(key, ColdStartPhase::PokeToReady, since(e.poked_at, now));
        self.cold.store(false, SeqCst);
        self.first_byte_pending.store(true, SeqCst);
    }

    /// Whether the next forwarded response closes an episode.
    #[inline]
    pub fn awaiting_first_byte(&self) -> bool {
        self.first_byte_pending.load(SeqCst)
    }

    /// A response head was forwarded at `now`: closes the episode (once) and logs its phases.
    pub fn on_first_byte(&self, now: Instant, metrics: &ActivatorMetrics, key: &RevisionKey) {
        let mut ep = self.lock();
        let Some(e) = *ep else { return };
        let Some(ready_at) = e.ready_at else { return };
        *ep = None;
        self.first_byte_pending.store(false, SeqCst);
        drop(ep);
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_millis() as u64;
        metrics.observe_phase(
            key,
            ColdStartPhase::ReadyToFirstByte,
            now.saturating_duration_since(ready_at).as_secs_f64(),
        );
        tracing::info!(
            revision = %key,
            total_ms = ms(e.poked_at, now),
            poke_to_decision_ms = e.decided_at.map(|d| ms(e.poked_at, d)),
            decision_to_ready_ms = e.decided_at.map(|d| ms(d, ready_at)),
            poke_to_ready_ms = ms(e.poked_at, ready_at),
            ready_to_first_byte_ms = ms(ready_at, now),
            "cold start"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Telemetry;

    #[test]
    fn phases_are_observed_once_per_cold_start() {
        let tel = Telemetry::new();
        let m = &tel.activator;
        let key = RevisionKey::new("ns", "r");
        let c = ColdStart::default();
        let t0 = Instant::now();
        assert_eq!(c.on_cold_request(t0), PokeAction::Begin);
        assert!(c.is_cold_pending());
        assert_eq!(
            c.on_cold_request(t0 + Duration::from_millis(10)),
            PokeAction::None
        );
        assert_eq!(
            c.on_cold_request(t0 + Duration::from_secs(1)),
            PokeAction::Repoke
        );
        let decided = t0 + Duration::from_millis(100);
        c.on_endpoints(t0 + Duration::from_millis(900), 1, Some(decided), m, &key);
        assert!(!c.is_cold_pending() && c.awaiting_first_byte());
        c.on_first_byte(t0 + Duration::from_millis(950), m, &key);
        assert!(!c.awaiting_first_byte());
        let text = tel.encode();
        for phase in [
            "poke_to_decision",
            "decision_to_ready",
            "poke_to_ready",
            "ready_to_first_byte",
        ] {
            let line = format!(
                "thaw_activator_cold_start_phase_seconds_count{{namespace=\"{}\",revision=\"{}\",phase=\"{phase}\"}} 1",
                key.namespace, key.name
            );
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        // A new cold start can begin afterwards.
        assert_eq!(
            c.on_cold_request(t0 + Duration::from_secs(5)),
            PokeAction::Begin
        );
    }
}
