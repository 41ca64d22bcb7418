//! `thaw local`: the embedded default. The activator, the autoscaler and a local process
//! platform in one process, serving the services of `local.yaml`.

pub mod config;
pub mod controller;
pub mod model;
pub mod run;
pub mod schema;
