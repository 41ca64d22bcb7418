//! thaw: a scale-to-zero serving data plane.
//!
//! The crate is one library behind one binary. Modules follow docs/architecture.md:
//! [`config`] (Knative-compatible settings), [`revision`] (the catalog every part reads),
//! [`http1`] (the HTTP/1 engine), [`activator`] (the proxy that holds cold requests, a handler
//! of the engine), [`autoscaler`] (Knative's KPA), [`stats`] (what reporters send it),
//! [`limiter`] (concurrency limits with a bounded queue), [`percore`] (the per-core runtime),
//! [`platform`] (where replicas run: local processes or Kubernetes Deployments), [`knative`]
//! (the `serving.knative.dev/v1` types, their CRDs, child names and labels), [`leader`] (Lease
//! leader election), [`remote`] (the stats push and decision feed between roles), [`roles`]
//! (the `thaw activator` and `thaw autoscaler` processes), [`queue`] (the per-pod sidecar) and
//! [`telemetry`] (tracing and the one metrics registry).
#![forbid(unsafe_code)]

pub mod activator;
pub mod autoscaler;
pub mod cli;
pub mod clock;
pub mod config;
pub mod controller;
pub mod http1;
pub mod knative;
pub mod leader;
pub mod limiter;
pub mod local;
pub mod percore;
pub mod platform;
pub mod queue;
pub mod remote;
pub mod revision;
pub mod roles;
pub mod sample_app;
pub mod stats;
pub mod telemetry;
pub mod webhook;
