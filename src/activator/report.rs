//! The activator's 1 s reporter ([`run`]): each revision's concurrency window closed and sent
//! as a [`Stat`] through the [`crate::stats::StatSink`] (the types live in [`crate::stats`]).

use std::sync::Arc;

use crate::stats::Stat;

/// The activator's reporter: at each whole second (on [`crate::clock`]) closes every revision's
/// concurrency window and records a [`Stat`] for the second that ended, for each revision that
/// had requests, holds or in-flight requests, or ready endpoints (zeros included, so the
/// autoscaler's windows decay). Never blocks: the sink is non-blocking. Runs until aborted.
pub(crate) async fn run(act: Arc<super::core::Activator>) {
    use tokio::time::{Duration, Instant, MissedTickBehavior, interval_at};
    let first = crate::clock::instant_of(crate::clock::now_second() + 1);
    let mut tick = interval_at(first, Duration::from_secs(1));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let at = crate::clock::second_of(now).saturating_sub(1);
        let _span = tracing::trace_span!("report", at).entered();
        for state in act.states() {
            let r = state.window().take(now);
            let has_endpoints = state.throttler.ready_count() > 0;
            if r.average > 0.0 || r.requests > 0 || r.current > 0 || has_endpoints {
                act.deps.stats.record(Stat {
                    revision: state.key.clone(),
                    source: act.deps.source_name.clone(),
                    at,
                    average_concurrency: r.average,
                    requests: r.requests,
                    proxied_concurrency: 0.0,
                    proxied_requests: 0,
                });
            }
        }
    }
}
