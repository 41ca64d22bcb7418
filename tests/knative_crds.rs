//! The CRDs in deploy/crds/ are the ones the types generate, and `thaw crds` prints them.
//! Regenerate after changing src/knative/: `cargo run -- crds --dir deploy/crds`.
//! tests/crds/ holds the CRDs of the other projects' kinds thaw writes, generated from thaw's
//! subsets of them (the tests' API server serves these; deploy/examples/ is checked against
//! them): regenerate with `THAW_BLESS_CRDS=1 cargo test --test knative_crds`.

use std::path::Path;
use std::process::Command;

/// The names of the files in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut present: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    present
}

#[test]
fn checked_in_crds_match_the_generated_ones() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds");
    let mut expected_files: Vec<String> = Vec::new();
    for crd in thaw::knative::crds() {
        let name = thaw::knative::crd_file_name(&crd);
        let path = dir.join(&name);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run `cargo run -- crds --dir deploy/crds`)",
                path.display()
            )
        });
        assert!(
            on_disk == thaw::knative::crd_yaml(&crd),
            "{} differs from the generated CRD: run `cargo run -- crds --dir deploy/crds`",
            path.display()
        );
        expected_files.push(name);
    }
    // No stale file of a kind that is gone.
    expected_files.sort();
    assert_eq!(files_in(&dir), expected_files);
}

#[test]
fn thaw_crds_prints_every_crd() {
    let out = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "services.serving.knative.dev",
            "configurations.serving.knative.dev",
            "revisions.serving.knative.dev",
            "routes.serving.knative.dev",
            "domainmappings.serving.knative.dev",
            "clusterdomainclaims.networking.internal.knative.dev"
        ]
    );
}

#[test]
fn the_other_projects_crds_for_the_tests_are_the_generated_ones() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crds");
    let crds = [
        (
            thaw::controller::route::virtual_service::crd(),
            "src/controller/route/virtual_service.rs (thaw's subset of Istio's VirtualService)",
        ),
        (
            thaw::controller::route::http_route::crd(),
            "src/controller/route/http_route.rs (thaw's subset of the Gateway API's HTTPRoute)",
        ),
        (
            thaw::controller::route::virtual_service::gateway_crd(),
            "src/controller/route/virtual_service.rs (thaw's subset of Istio's Gateway)",
        ),
        (
            thaw::controller::route::http_route::gateway_crd(),
            "src/controller/route/http_route.rs (thaw's subset of the Gateway API's Gateway)",
        ),
        (
            thaw::controller::route::http_route::reference_grant_crd(),
            "src/controller/route/http_route.rs (the Gateway API's ReferenceGrant)",
        ),
        (
            thaw::controller::route::certificate::crd(),
            "src/controller/route/certificate.rs (thaw's subset of cert-manager's Certificate)",
        ),
    ];
    let bless = std::env::var_os("THAW_BLESS_CRDS").is_some();
    let mut expected_files = Vec::new();
    for (crd, from) in crds {
        let path = dir.join(thaw::knative::crd_file_name(&crd));
        let generated = thaw::knative::crd_yaml(&crd).replacen(
            thaw::knative::CRD_HEADER,
            &format!("# Generated from {from}\n# by tests/knative_crds.rs, for the tests only; do not edit.\n"),
            1,
        );
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &generated).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "{} differs from the generated CRD: THAW_BLESS_CRDS=1 cargo test --test knative_crds",
            path.display()
        );
        expected_files.push(thaw::knative::crd_file_name(&crd));
    }
    expected_files.sort();
    assert_eq!(files_in(&dir), expected_files);
}
