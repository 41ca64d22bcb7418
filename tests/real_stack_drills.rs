//! The whole stack on the real control plane: the drills (tests/real_stack/drills.rs), a slow
//! API server behind a latency proxy, on a plane of their own (`plane_support::harness`).

#[path = "real_stack/drills.rs"]
mod drills;
#[allow(dead_code, reason = "the plane's gateway pod uses part of it")]
#[path = "kube_support/gateway.rs"]
mod gateway;
mod plane_support;

fn main() -> std::process::ExitCode {
    plane_support::harness::main(drills::cases())
}
