//! The whole stack on the real control plane: the disruptions cases (tests/real_stack/disruptions.rs), on a
//! plane of their own (`plane_support::harness`).

#[path = "real_stack/disruptions.rs"]
mod disruptions;
#[allow(dead_code, reason = "the plane's gateway pod uses part of it")]
#[path = "kube_support/gateway.rs"]
mod gateway;
mod plane_support;

fn main() -> std::process::ExitCode {
    plane_support::harness::main(disruptions::cases())
}
