//! The Kubernetes roles as processes: `thaw activator` and `thaw autoscaler`. Each wires the
//! parts the roles share with `thaw local` (the activator, the scaler, the catalog) to the
//! Kubernetes platform, the Lease, the live ConfigMaps and the transport between roles.
//!
//! Room: composition only. May use every other room; none uses it.

pub mod activator;
pub mod admin;
pub mod autoscaler;
pub mod pull;
pub mod serving;
pub mod share;
