//! thaw installed on the plane as the README says: Istio's two CRDs the controller writes and
//! the ingress gateway pod (`tests/cluster/ingress-gateway.yaml`, in istio-system, where
//! deploy/ puts the controller's gateway Role) first, as Istio is installed before thaw; then
//! `kubectl apply --server-side -k` of deploy/ (through `tests/cluster/overlay`, which only
//! renames the image for the kubelet stand-in), `kubectl wait` for every Deployment, then
//! Knative's `knative-serving` namespace with the external Gateway.
//!
//! The images the stand-in can run ([`images`]): thaw's (every role and the queue sidecar) is
//! the `thaw` binary this test target was built with; Knative's helloworld-go is `thaw
//! sample-app` on `0.0.0.0:$PORT`, as the real image listens; the ingress gateway is this test
//! binary again, told by [`POD_ROLE_ENV`] to play it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Plane;
use super::kubelet::ImageRun;

/// thaw's image as the overlay names it.
pub const THAW_IMAGE: &str = "thaw.test/thaw";
/// Knative's helloworld-go (any tag or digest).
pub const HELLOWORLD_IMAGE: &str = "ghcr.io/knative/helloworld-go";
/// A shell (`/bin/sh`): the kubelet stand-in's own case runs scripts with it.
pub const SHELL_IMAGE: &str = "thaw.test/shell";
/// The ingress gateway pod's image (tests/cluster/ingress-gateway.yaml).
pub const GATEWAY_IMAGE: &str = "thaw.test/ingress-gateway";
/// Set in the ingress gateway pod's environment: this test binary plays the gateway.
pub const POD_ROLE_ENV: &str = "THAW_REAL_PLANE_POD";
/// How long `kubectl wait` gives thaw's Deployments and the gateway.
pub const WAIT: &str = "180s";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// What each image runs.
pub fn images() -> BTreeMap<String, ImageRun> {
    let thaw = PathBuf::from(env!("CARGO_BIN_EXE_thaw"));
    BTreeMap::from([
        (
            THAW_IMAGE.to_string(),
            ImageRun {
                program: thaw.clone(),
                args: vec![],
                env: vec![],
            },
        ),
        (
            HELLOWORLD_IMAGE.to_string(),
            ImageRun {
                program: thaw,
                args: vec!["sample-app".into(), "--host".into(), "0.0.0.0".into()],
                env: vec![],
            },
        ),
        (
            SHELL_IMAGE.to_string(),
            ImageRun {
                program: "/bin/sh".into(),
                args: vec![],
                env: vec![],
            },
        ),
        (
            GATEWAY_IMAGE.to_string(),
            ImageRun {
                program: std::env::current_exe().unwrap(),
                args: vec![],
                env: vec![
                    (POD_ROLE_ENV.into(), "ingress-gateway".into()),
                    // Already inside the plane's namespaces: no second re-execution.
                    (super::netns::INSIDE_ENV.into(), "1".into()),
                ],
            },
        ),
        // Knative's conformance test images (tests/real_stack/conformance.rs).
        conformance_image("failing"),
        conformance_image("helloworld"),
        conformance_image("pizzaplanetv1"),
        conformance_image("pizzaplanetv2"),
        conformance_image("readiness"),
        conformance_image("runtime"),
        conformance_image("servingcontainer"),
        conformance_image("sidecarcontainer"),
        conformance_image("singlethreaded"),
        conformance_image("timeout"),
    ])
    .into_iter()
    // Knative Serving's own components (tests/plane_support/knative.rs).
    .chain(super::knative::images())
    .collect()
}

/// Where Knative's conformance test images are mapped: image `thaw.test/conformance/<name>`
/// (the suite's `--dockerrepo`, any tag).
pub const CONFORMANCE_REPO: &str = "thaw.test/conformance";

/// Knative's conformance test image `name`: its program built from knative.dev/serving's
/// `test/test_images` by `tests/cluster/build.sh` (tests/cluster/conformance).
fn conformance_image(name: &str) -> (String, ImageRun) {
    (
        format!("{CONFORMANCE_REPO}/{name}"),
        ImageRun {
            program: super::bin_dir().join("conformance/images").join(name),
            args: vec![],
            env: vec![],
        },
    )
}

/// The overlay of deploy/ the tests install: the image renamed for the kubelet stand-in.
pub const OVERLAY: &str = "tests/cluster/overlay";
/// [`OVERLAY`] with the controller adopting what Knative Serving left
/// (`THAW_ADOPT_KNATIVE=true`, docs/migrating-from-knative.md's step 6).
pub const OVERLAY_ADOPTING: &str = "tests/cluster/overlay-adopt";

/// Installs thaw and the ingress; returns once every Deployment is Available.
pub async fn install(plane: &Plane) -> Result<(), String> {
    apply(plane, OVERLAY).await?;
    for ns in ["thaw-system", "istio-system"] {
        wait_available(plane, ns).await?;
    }
    Ok(())
}

/// Applies the ingress, then `overlay` (a kustomization of deploy/ under the repository,
/// [`OVERLAY`] or [`OVERLAY_ADOPTING`]) and Knative's external Gateway; does not wait.
pub async fn apply(plane: &Plane, overlay: &str) -> Result<(), String> {
    apply_ingress(plane).await?;
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "-k",
            &repo(overlay).display().to_string(),
        ])
        .await?;
    // Made unless Knative is installed already (a target that moves a running Knative onto
    // thaw installs thaw after it).
    if plane
        .kubectl(&["get", "namespace", "knative-serving"])
        .await
        .is_err()
    {
        plane
            .kubectl(&["create", "namespace", "knative-serving"])
            .await?;
    }
    plane
        .kubectl(&[
            "apply",
            "-f",
            &repo("deploy/examples/knative/gateway.yaml")
                .display()
                .to_string(),
        ])
        .await?;
    Ok(())
}

/// Installs only the ingress (Istio's two CRDs and the gateway pod), as a cluster has it
/// before any Knative goes on it; returns once the gateway is Available.
pub async fn install_ingress(plane: &Plane) -> Result<(), String> {
    apply_ingress(plane).await?;
    wait_available(plane, "istio-system").await
}

/// Istio's CRDs, then the ingress gateway pod: first, as Istio is installed before thaw
/// (README): deploy/ has the controller's Role in the gateway namespace, istio-system.
async fn apply_ingress(plane: &Plane) -> Result<(), String> {
    let crds = [
        repo("tests/crds/virtualservices.networking.istio.io.yaml"),
        repo("tests/crds/gateways.networking.istio.io.yaml"),
    ];
    for crd in &crds {
        plane
            .kubectl(&["apply", "--server-side", "-f", &crd.display().to_string()])
            .await?;
    }
    plane
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/virtualservices.networking.istio.io",
            "crd/gateways.networking.istio.io",
            "--timeout=60s",
        ])
        .await?;
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &repo("tests/cluster/ingress-gateway.yaml")
                .display()
                .to_string(),
        ])
        .await?;
    Ok(())
}

/// `kubectl wait` (up to [`WAIT`]) for every Deployment of `ns` to be Available.
pub async fn wait_available(plane: &Plane, ns: &str) -> Result<(), String> {
    plane
        .kubectl(&[
            "-n",
            ns,
            "wait",
            "deployment",
            "--all",
            "--for=condition=Available",
            &format!("--timeout={WAIT}"),
        ])
        .await
        .map(drop)
}

/// The ingress gateway pod's process: config-istio's default gateways, the external one on
/// `0.0.0.0:8080` and the local one on `0.0.0.0:8081`, until SIGTERM. Its client is the
/// pod's own (the kubeconfig the kubelet stand-in wrote for its ServiceAccount).
pub async fn run_ingress_gateway() {
    use crate::gateway::{Backend, TestGateway};
    let client = kube::Client::try_default()
        .await
        .expect("the pod's kubeconfig");
    let istio = thaw::config::network::IstioConfig::default();
    let external: Vec<String> = istio
        .external_gateways
        .iter()
        .map(|g| g.reference())
        .collect();
    let local: Vec<String> = istio.local_gateways.iter().map(|g| g.reference()).collect();
    let refs = |v: &[String]| v.iter().map(String::clone).collect::<Vec<_>>();
    let (external, local) = (refs(&external), refs(&local));
    let external: Vec<&str> = external.iter().map(String::as_str).collect();
    let local: Vec<&str> = local.iter().map(String::as_str).collect();
    let _ext = TestGateway::start_on(
        client.clone(),
        &external,
        Backend::Destinations,
        ([0, 0, 0, 0], 8080).into(),
    )
    .await;
    let _local = TestGateway::start_on(
        client,
        &local,
        Backend::Destinations,
        ([0, 0, 0, 0], 8081).into(),
    )
    .await;
    eprintln!("ingress gateway: serving {external:?} on :8080, {local:?} on :8081");
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    term.recv().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}
