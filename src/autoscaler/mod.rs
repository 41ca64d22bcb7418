//! The autoscaler: Knative's KPA. Stats in, per-revision replica counts out.

pub mod scaler;
