//! Moving a running Knative Serving onto thaw, on the real control plane: the cases of
//! tests/real_stack/migrate.rs, on a plane of their own with only the ingress installed
//! (`plane_support::harness::Setup::IngressOnly`): the cases install Knative itself
//! (`plane_support::knative`), and thaw after it.

#[allow(dead_code, reason = "the plane's gateway pod uses part of it")]
#[path = "kube_support/gateway.rs"]
mod gateway;
#[path = "real_stack/migrate.rs"]
mod migrate;
mod plane_support;

fn main() -> std::process::ExitCode {
    plane_support::harness::main_with(migrate::cases(), plane_support::harness::Setup::IngressOnly)
}
