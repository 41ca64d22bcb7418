//! Knative Serving's own conformance suite against thaw on the real control plane:
//! knative.dev/serving v0.42.2's `test/conformance/api/v1` and `test/conformance/runtime`,
//! compiled from their Go module with `go test -c -tags=e2e` by `tests/cluster/build.sh`
//! and `test/conformance/api/v1beta1` (tests/cluster/conformance pins the module; go.sum
//! committed), and the test images they deploy built from the same module's
//! `test/test_images`, each mapped by the kubelet stand-in to image
//! `thaw.test/conformance/<name>` (`install::images`; the suite's `--dockerrepo`).
//!
//! Each case runs one compiled package as a child of this process, inside the plane's
//! namespaces, against the plane's API server (the admin kubeconfig), in the case's own
//! namespace (`--test-namespace`), with `-test.run` selecting the tests of [`Suite::run`]
//! and `-test.skip` leaving out the subtests of [`Suite::skip`], and fails unless every
//! selected test reports `--- PASS`. Every other test of the package is in
//! [`Suite::out_of_reach`] with why the plane cannot run it; a test in none of the three lists
//! (a newer suite) fails the case. Afterwards, whatever the suite deleted must be gone within
//! a minute (its teardown deletes with `propagationPolicy: Foreground`).
//!
//! As Knative's own test setup does first (`test/config/test-resources.yaml`), the case puts
//! the ConfigMap and Secret that TestConfigsViaEnv and TestSecretsViaEnv read in the test
//! namespace. Flags: `--enable-beta` (TestServiceCreateWithMultipleContainers; Knative's CI
//! sets it too), `--disable-logstream` (the stand-in serves no pod logs).
//!
//! How the suite's requests reach thaw: its spoofing client (knative.dev/pkg/test/spoof) sends
//! every request for `http://<route host>/` to `--ingressendpoint` with the route's `Host`, at
//! the port its `ingress.GetIngressEndpoint` maps 80 to: the nodePort of port 80 of the
//! Service `$GATEWAY_NAMESPACE_OVERRIDE/$GATEWAY_OVERRIDE` (default
//! `istio-system/istio-ingressgateway`), or 80 itself when it has no port 80. The plane has no
//! node ports (no kube-proxy), so the case points the suite at a Service of its own namespace
//! without port 80 and listens on `127.0.0.N:80` itself, passing every connection on to the
//! ingress gateway pod (port 8080): the requests reach the gateway the other cases use, with
//! the Host headers Knative's tests send. `--resolvabledomain=false` (no DNS).
//!
//! `THAW_CONFORMANCE_RUN=<regex>` (and `THAW_CONFORMANCE_SKIP=<regex>`) runs the tests it
//! matches instead of the selection, e.g. to look at one out of reach (the images only such
//! tests deploy, autoscale, hellovolume and volumes, are not built); the case then fails only
//! when a test fails. Each package's `go test -v` output is
//! `conformance-<package>.log` in the plane's directory (`REAL_PLANE_KEEP=1` keeps it).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::plane_support::harness::{Case, SYSTEM_CONFIG, apply};
use crate::plane_support::{Plane, bin_dir, checks, install};

/// This module's cases.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!(knative_conformance_api_v1),
        crate::case!(knative_conformance_runtime),
        crate::exclusive_case!(knative_conformance_container_error_msg),
        crate::exclusive_case!(knative_conformance_domain_mapping),
    ]
}

/// One compiled package of the suite and what of it runs here.
struct Suite {
    /// The package's last element: OUT/conformance/bin/<package>.test.
    package: &'static str,
    /// The top-level tests run (`-test.run`).
    run: &'static [&'static str],
    /// Subtests of those left out (`-test.skip`), each with why.
    skip: &'static [(&'static str, &'static str)],
    /// The package's other top-level tests, each with why the plane cannot run it.
    out_of_reach: &'static [(&'static str, &'static str)],
    /// Whether `run` and `out_of_reach` name every top-level test of the package (checked
    /// with `-test.list`).
    whole: bool,
}

/// Why a test that reads a mounted volume cannot run: the kubelet stand-in mounts nothing.
const NO_VOLUMES: &str = "reads a volume mounted in the container (the kubelet stand-in \
    mounts no volumes: every container sees the node's own filesystem); its Service is \
    admitted and Ready, then answers 500 \"open /hello/world: no such file or directory\"";
/// `test/conformance/api/v1`: Service, Configuration, Revision and Route.
const API_V1: Suite = Suite {
    package: "v1",
    run: &[
        "TestConfigurationGetAndList",
        "TestUpdateConfigurationMetadata",
        "TestContainerExitingMsg",
        "TestServiceGenerateName",
        "TestRouteAndConfigGenerateName",
        "TestRevisionGetAndList",
        "TestRevisionTimeout",
        "TestRouteGetAndList",
        "TestRouteCreation",
        "TestServiceAccountValidation",
        "TestServiceCreateListAndDelete",
        "TestServiceCreateAndUpdate",
        "TestServiceBYOName",
        "TestAnnotationPropagation",
        "TestServiceCreateWithMultipleContainers",
        "TestSingleConcurrency",
        "TestBlueGreenRoute",
        "TestServiceWithTrafficSplit",
    ],
    skip: &[],
    out_of_reach: &[
        (
            "TestContainerErrorMsg",
            "run by knative_conformance_container_error_msg, alone, with a short \
             progress-deadline",
        ),
        (
            "TestCustomResourcesLimits",
            "needs the 300 MB memory limit enforced (the kubelet stand-in runs no cgroups: \
             the 500 MB request is answered)",
        ),
        (
            "TestServiceCreateWithEmptyDir",
            "the volumes image writes to its emptyDir mount /data (the kubelet stand-in \
             mounts nothing there: it panics, the revision never becomes ready)",
        ),
        ("TestConfigMapVolume", NO_VOLUMES),
        ("TestProjectedConfigMapVolume", NO_VOLUMES),
        ("TestSecretVolume", NO_VOLUMES),
        ("TestProjectedSecretVolume", NO_VOLUMES),
        ("TestProjectedComplex", NO_VOLUMES),
        ("TestProjectedServiceAccountToken", NO_VOLUMES),
    ],
    whole: true,
};

/// `test/conformance/runtime`: what a revision's container sees.
const RUNTIME: Suite = Suite {
    package: "runtime",
    run: &[
        "TestShouldHaveCgroupReadOnly",
        "TestMustNotContainerConstraints",
        "TestShouldNotContainerConstraints",
        "TestSecretsViaEnv",
        "TestConfigsViaEnv",
        "TestShouldEnvVars",
        "TestMustEnvVars",
        "TestShouldHaveStdinEOF",
        "TestMustHaveFiles",
        "TestMustHaveHeadersSet",
        "TestShouldHaveHeadersSet",
        "TestLivenessWithFail",
        "TestProtocols",
        "TestProbeRuntime",
        "TestProbeRuntimeAfterStartup",
        "TestShouldHaveSysctlReadOnly",
        "TestWorkingDirService",
    ],
    skip: &[(
        "TestProbeRuntime/exec",
        "exec readiness probes (the kubelet stand-in runs no exec probes: the pod never \
         becomes ready)",
    )],
    out_of_reach: &[
        (
            "TestMustHaveCgroupConfigured",
            "reads the container's cgroup limits (the kubelet stand-in runs no cgroups)",
        ),
        (
            "TestCmdArgs",
            "wants argv[0] to be the image's /ko-app/runtime (the stand-in runs the program \
             at its path on the node; the arguments themselves arrive)",
        ),
        (
            "TestShouldHaveFiles",
            "checks the container's root filesystem (/dev/console, ...; the stand-in's \
             containers see the node's)",
        ),
        (
            "TestMustRunAsUser",
            "checks the securityContext's user (the stand-in runs every container as the \
             test's own user)",
        ),
        (
            "TestShouldRunAsUserContainerDefault",
            "checks the image's default user 65532 (the stand-in runs every container as the \
             test's own user)",
        ),
    ],
    whole: true,
};

/// `test/conformance/api/v1beta1`: DomainMapping.
const V1BETA1: Suite = Suite {
    package: "v1beta1",
    run: &["TestDomainMapping"],
    skip: &[],
    out_of_reach: &[],
    whole: true,
};

/// The longest a package may run (the suite's own polls give up after 10 minutes).
const SUITE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Services, Configurations, Routes and Revisions; Knative's own tests throughout.
async fn knative_conformance_api_v1(plane: Arc<Plane>, ns: String) {
    run_suite(&plane, &ns, &API_V1, &["-enable-beta".into()]).await;
}

/// The runtime contract: environment, files, headers, probes, protocols.
async fn knative_conformance_runtime(plane: Arc<Plane>, ns: String) {
    run_suite(&plane, &ns, &RUNTIME, &[]).await;
}

/// TestContainerErrorMsg: a Service whose image cannot be pulled fails, its Configuration
/// and Revision with a reason and a message, its Route too. Knative fails such a revision at
/// once when it cannot resolve the image's digest; thaw resolves none (nor does Knative for
/// images it is told not to), so the revision fails, as in Knative, when its Deployment
/// passes the progress deadline with the pod waiting in `ErrImagePull`. At the default 600 s
/// that is past the test's 10-minute poll: `config-deployment`'s `progress-deadline` is 20 s
/// for the while, with no other case running (a revision slower to start would fail too).
async fn knative_conformance_container_error_msg(plane: Arc<Plane>, ns: String) {
    const ONLY: Suite = Suite {
        package: "v1",
        run: &["TestContainerErrorMsg"],
        skip: &[],
        out_of_reach: &[],
        whole: false,
    };
    let _config = SYSTEM_CONFIG.lock().await;
    let restore = set_system_config(&plane, "config-deployment", "progress-deadline", "20s").await;
    let outcome = tokio::spawn({
        let (plane, ns) = (plane.clone(), ns.clone());
        async move { run_suite(&plane, &ns, &ONLY, &[]).await }
    })
    .await;
    restore.run(&plane).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// TestDomainMapping: a DomainMapping served (through the Route's placeholder Service, an
/// ExternalName of the local gateway that the ingress gateway pod follows as Envoy's DNS
/// cluster would), a second one of the same domain in another namespace refused
/// `DomainClaimed=False`, then, the first deleted, claiming the domain and served. As in
/// Knative's test setup (`overlay-config-autocreate-clusterdomainclaims.yaml`),
/// `config-network`'s `autocreate-cluster-domain-claims` is true for the while, with no other
/// case running; the suite's alternative namespace is the case's namespace + `-alt`.
async fn knative_conformance_domain_mapping(plane: Arc<Plane>, ns: String) {
    let _config = SYSTEM_CONFIG.lock().await;
    let alt = format!("{ns}-alt");
    plane
        .kubectl(&["create", "namespace", &alt])
        .await
        .expect("the alternative namespace");
    let restore = set_system_config(
        &plane,
        "config-network",
        "autocreate-cluster-domain-claims",
        "true",
    )
    .await;
    let outcome = tokio::spawn({
        let (plane, ns) = (plane.clone(), ns.clone());
        let flags = [
            "-enable-beta".to_string(),
            format!("-alt-test-namespace={alt}"),
        ];
        async move { run_suite(&plane, &ns, &V1BETA1, &flags).await }
    })
    .await;
    restore.run(&plane).await;
    let _ = plane
        .kubectl(&["delete", "namespace", &alt, "--wait=false"])
        .await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A thaw-system ConfigMap key as it was, to put back.
struct Restore {
    configmap: &'static str,
    key: &'static str,
    before: Option<String>,
}

impl Restore {
    async fn run(self, plane: &Plane) {
        let value = match &self.before {
            Some(v) => serde_json::Value::String(v.clone()),
            None => serde_json::Value::Null,
        };
        let patch = serde_json::json!({"data": {self.key: value}}).to_string();
        plane
            .kubectl(&[
                "-n",
                "thaw-system",
                "patch",
                "configmap",
                self.configmap,
                "--type=merge",
                "-p",
                &patch,
            ])
            .await
            .unwrap_or_else(|e| panic!("restoring {}: {e}", self.configmap));
    }
}

/// Sets `key` of the thaw-system ConfigMap `configmap` to `value` (`kubectl patch`, as an
/// operator would); the caller holds [`SYSTEM_CONFIG`] and puts it back with the [`Restore`].
async fn set_system_config(
    plane: &Plane,
    configmap: &'static str,
    key: &'static str,
    value: &str,
) -> Restore {
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(plane.admin.clone(), "thaw-system");
    let before = cms
        .get(configmap)
        .await
        .unwrap()
        .data
        .and_then(|d| d.get(key).cloned());
    let patch = serde_json::json!({"data": {key: value}}).to_string();
    plane
        .kubectl(&[
            "-n",
            "thaw-system",
            "patch",
            "configmap",
            configmap,
            "--type=merge",
            "-p",
            &patch,
        ])
        .await
        .unwrap();
    // The roles read their ConfigMaps through a watch: give it a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Restore {
        configmap,
        key,
        before,
    }
}

/// What `go test -v` reported of one test (or subtest).
#[derive(Debug, Default)]
struct Outcome {
    /// "PASS", "FAIL" or "SKIP"; empty when it started and never ended.
    verdict: String,
    /// Its own output lines (from `=== RUN`/`=== CONT`/`=== NAME` on).
    lines: Vec<String>,
}

/// Reads `go test -v` output: each test's verdict and output lines.
fn parse(output: &str) -> BTreeMap<String, Outcome> {
    let mut tests: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in output.lines() {
        let trimmed = line.trim_start();
        if let Some(name) = ["=== RUN", "=== CONT", "=== NAME", "=== PAUSE"]
            .iter()
            .find_map(|p| trimmed.strip_prefix(p))
        {
            let name = name.trim().to_string();
            tests.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("--- ")
            && let Some((verdict, rest)) = rest.split_once(": ")
            && ["PASS", "FAIL", "SKIP"].contains(&verdict)
        {
            let name = rest.rsplit_once(" (").map_or(rest, |(n, _)| n).trim();
            tests.entry(name.to_string()).or_default().verdict = verdict.to_string();
            current = Some(name.to_string());
            continue;
        }
        if let Some(name) = &current {
            tests
                .entry(name.clone())
                .or_default()
                .lines
                .push(line.to_string());
        }
    }
    tests
}

/// Listens on `127.0.0.N:80` (the first N from 2 that is free) and passes every connection on
/// to `to`; the address, and the task to abort when done.
async fn forward_port_80(to: SocketAddr) -> (Ipv4Addr, tokio::task::JoinHandle<()>) {
    for n in 2..=254u8 {
        let ip = Ipv4Addr::new(127, 0, 0, n);
        let Ok(listener) = tokio::net::TcpListener::bind((ip, 80)).await else {
            continue;
        };
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        return (ip, task);
    }
    panic!("no 127.0.0.N:80 is free");
}

/// The package's compiled test binary.
fn binary(package: &str) -> PathBuf {
    let binary = bin_dir().join(format!("conformance/bin/{package}.test"));
    assert!(
        binary.is_file(),
        "{} is missing: tests/cluster/build.sh builds it",
        binary.display()
    );
    binary
}

/// The package's top-level tests (`-test.list`), each of which `suite` must place.
async fn unplaced(suite: &Suite) -> Vec<String> {
    let out = tokio::process::Command::new(binary(suite.package))
        .args(["-test.list", "."])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let placed: BTreeSet<&str> = suite
        .run
        .iter()
        .copied()
        .chain(suite.out_of_reach.iter().map(|(t, _)| *t))
        .collect();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|t| t.starts_with("Test") && !placed.contains(t))
        .map(str::to_string)
        .collect()
}

/// Runs the compiled package of `suite` with `flags` beside the plane's, and fails unless each
/// selected test passed (with `THAW_CONFORMANCE_RUN`: unless none failed).
async fn run_suite(plane: &Plane, ns: &str, suite: &Suite, flags: &[String]) {
    let package = suite.package;
    let binary = binary(package);
    let chosen = std::env::var("THAW_CONFORMANCE_RUN").ok();
    if chosen.is_none() && suite.whole {
        let unplaced = unplaced(suite).await;
        assert!(
            unplaced.is_empty(),
            "knative conformance {package}: tests neither run nor out of reach: {unplaced:?}"
        );
    }
    let (run, skip) = match &chosen {
        Some(regex) => (
            regex.clone(),
            std::env::var("THAW_CONFORMANCE_SKIP").unwrap_or_default(),
        ),
        None => (
            format!("^({})$", suite.run.join("|")),
            suite
                .skip
                .iter()
                .map(|(t, _)| *t)
                .collect::<Vec<_>>()
                .join("|"),
        ),
    };

    // What Knative's test setup applies to its test namespace before the suite
    // (knative.dev/serving test/config/test-resources.yaml).
    apply(
        plane,
        ns,
        "conformance-test-resources",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: conformance-test-configmap\n\
         data:\n  testKey: testValue\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  \
         name: conformance-test-secret\ntype: Opaque\ndata:\n  testKey: dGVzdFZhbHVl\n",
    )
    .await
    .unwrap();
    // The Service the suite reads the ingress's port mapping from: no port 80, so requests
    // for port 80 go to port 80 of --ingressendpoint (the forwarder below).
    let gateway_service = "conformance-ingress";
    apply(
        plane,
        ns,
        gateway_service,
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {gateway_service}\nspec:\n  \
             ports:\n    - name: http\n      port: 8080\n"
        ),
    )
    .await
    .unwrap();
    let gateway = checks::service_endpoint(plane, "istio-system", "istio-ingressgateway")
        .await
        .expect("the ingress gateway's endpoint");
    let (ingress_ip, forwarder) = forward_port_80(gateway).await;

    let log = plane.dir.path().join(format!("conformance-{package}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let mut args = vec![
        "-test.v".to_string(),
        format!("-test.run={run}"),
        format!("-test.skip={skip}"),
        format!("-test.timeout={}s", SUITE_TIMEOUT.as_secs()),
        "-test.parallel=4".to_string(),
        format!("-kubeconfig={}", plane.admin_kubeconfig.display()),
        format!("-test-namespace={ns}"),
        format!("-dockerrepo={}", install::CONFORMANCE_REPO),
        "-tag=latest".to_string(),
        format!("-ingressendpoint={ingress_ip}"),
        "-resolvabledomain=false".to_string(),
        "-disable-logstream".to_string(),
    ];
    args.extend(flags.iter().cloned());
    let mut child = tokio::process::Command::new(&binary)
        .args(&args)
        .env("GATEWAY_OVERRIDE", gateway_service)
        .env("GATEWAY_NAMESPACE_OVERRIDE", ns)
        .current_dir(plane.dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
    let status = tokio::time::timeout(SUITE_TIMEOUT + Duration::from_secs(60), child.wait())
        .await
        .unwrap_or_else(|_| panic!("{package}.test ran longer than {SUITE_TIMEOUT:?}"))
        .unwrap();
    forwarder.abort();

    let output = std::fs::read_to_string(&log).unwrap();
    let tests = parse(&output);
    report(
        suite,
        &log,
        status,
        &tests,
        chosen.is_none().then_some(suite.run),
    );
    if status.success() {
        let left = leftovers(plane, ns).await;
        assert!(
            left.is_empty(),
            "knative conformance {package}: what the suite deleted is still there a minute \
             later: {left:?}"
        );
    }
}

/// Prints what ran, how it ended and what did not run; panics when a test failed, a selected
/// test did not pass, or the binary failed.
fn report(
    suite: &Suite,
    log: &Path,
    status: std::process::ExitStatus,
    tests: &BTreeMap<String, Outcome>,
    selected: Option<&[&str]>,
) {
    let package = suite.package;
    let with = |v: &str| {
        tests
            .iter()
            .filter(|(_, o)| o.verdict == v)
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
    };
    let (passed, failed, skipped) = (with("PASS"), with("FAIL"), with("SKIP"));
    let mut text = format!(
        "knative conformance {package} (knative.dev/serving v0.42.2 test/conformance): \
         {} passed, {} failed, {} skipped (tests and subtests)\n  passed: {}\n",
        passed.len(),
        failed.len(),
        skipped.len(),
        passed.join(" "),
    );
    if !failed.is_empty() {
        text.push_str(&format!("  failed: {}\n", failed.join(" ")));
    }
    if !skipped.is_empty() {
        text.push_str(&format!("  skipped by the suite: {}\n", skipped.join(" ")));
    }
    if selected.is_some() {
        for (name, why) in suite.skip.iter().chain(suite.out_of_reach) {
            text.push_str(&format!("  not run here: {name}: {why}\n"));
        }
    }
    println!("{text}");
    let mut problems = Vec::new();
    for (name, outcome) in tests.iter().filter(|(_, o)| o.verdict == "FAIL") {
        let lines = &outcome.lines;
        let tail = &lines[lines.len().saturating_sub(40)..];
        problems.push(format!("--- FAIL: {name}\n{}", tail.join("\n")));
    }
    for name in selected.into_iter().flatten() {
        match tests.get(*name).map(|o| o.verdict.as_str()) {
            Some("PASS") | Some("FAIL") => {}
            Some("SKIP") => problems.push(format!("{name} was skipped")),
            _ => problems.push(format!("{name} did not run to its end")),
        }
    }
    if !status.success() && problems.is_empty() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        problems.push(format!(
            "{package}.test exited with {status}:\n{}",
            lines[lines.len().saturating_sub(40)..].join("\n")
        ));
    }
    assert!(
        problems.is_empty(),
        "knative conformance {package} ({}):\n{}",
        log.display(),
        problems.join("\n\n")
    );
}

/// The Knative objects left in `ns` a minute after the suite ended: none once the garbage
/// collector is done with what the suite's teardown deleted (`propagationPolicy:
/// Foreground`, as its ServingClients.Delete does, so each owner waits for its children).
async fn leftovers(plane: &Plane, ns: &str) -> Vec<String> {
    use kube::ResourceExt;
    use kube::api::{Api, ListParams};
    async fn names<K>(plane: &Plane, ns: &str, kind: &str) -> Vec<String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(plane.admin.clone(), ns);
        api.list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .map(|o| format!("{kind}/{}", o.name_any()))
            .collect()
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut left = names::<thaw::knative::Service>(plane, ns, "Service").await;
        left.extend(names::<thaw::knative::Configuration>(plane, ns, "Configuration").await);
        left.extend(names::<thaw::knative::Route>(plane, ns, "Route").await);
        left.extend(names::<thaw::knative::Revision>(plane, ns, "Revision").await);
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
