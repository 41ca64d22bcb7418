//! The whole stack on the real control plane: the conformance cases (tests/real_stack/conformance.rs), on a
//! plane of their own (`plane_support::harness`).

#[path = "real_stack/conformance.rs"]
mod conformance;
#[allow(dead_code, reason = "the plane's gateway pod uses part of it")]
#[path = "kube_support/gateway.rs"]
mod gateway;
mod plane_support;

fn main() -> std::process::ExitCode {
    plane_support::harness::main(conformance::cases())
}
