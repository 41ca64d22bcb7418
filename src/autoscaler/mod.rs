//! The autoscaler: Knative's KPA. Stats in, per-revision replica counts out.
//!
//! - [`window`]: one-second buckets and the two window averages;
//! - [`decider`]: the pure KPA decision (with [`delay`], the scale-down-delay window);
//! - [`collector`]: stats from activators and queue sidecars into per-revision windows;
//! - [`lifecycle`]: bounds and Knative's scale-to-zero rules per revision;
//! - [`scaler`]: the loop that ties them to the catalog and the [`crate::platform::Platform`];
//! - [`simulate`]: `thaw simulate`, a trace replayed through the real scaler on a virtual clock.
//!
//! Room: the KPA and its loop. May use: `stats` (what reporters send), `revision`, `platform`
//! (to scale), `config`, `telemetry`, `clock`. Never the activator: the two meet only through
//! `stats` and the `ScaleState` feed this module publishes.

pub mod collector;
pub mod decider;
pub mod delay;
pub mod lifecycle;
mod options;
pub mod scaler;
pub mod simulate;
mod state;
pub mod window;
