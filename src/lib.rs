//! thaw: a scale-to-zero serving data plane.
//!
//! The crate is one library behind one binary. Modules follow `ARCHITECTURE.md`:
//! [`config`] (Knative-compatible settings), [`revision`] (the catalog every part reads),
//! [`activator`] (the proxy that holds cold requests), [`autoscaler`] (Knative's KPA),
//! [`platform`] (where replicas run: local processes or Kubernetes Deployments), [`knative`]
//! (the `serving.knative.dev/v1` types, their CRDs, child names and labels), [`leader`] (Lease
//! leader election) and [`telemetry`] (tracing and the one metrics registry).
#![forbid(unsafe_code)]

pub mod activator;
pub mod autoscaler;
pub mod clock;
pub mod config;
pub mod knative;
pub mod leader;
pub mod local;
pub mod platform;
pub mod revision;
pub mod sample_app;
pub mod telemetry;
