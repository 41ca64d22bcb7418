//! thaw on a real Kubernetes control plane: etcd, kube-apiserver and kube-controller-manager
//! built from their Go modules (`tests/cluster/build.sh`, run here on first use), one node
//! played by the kubelet stand-in, thaw installed from deploy/ as the README says and running
//! with its own ServiceAccounts. Started once for the whole target; each case works in its own
//! namespace; cases that change thaw-system's ConfigMaps take [`SYSTEM_CONFIG`].
//!
//! `cargo test --test real_plane` builds the Go side the first time (about 4 minutes on 2
//! cores; `.ci/run` builds it before cargo does), re-executes itself in its own namespaces
//! (`plane_support::netns`) and starts the plane (about a minute). A failing run prints every
//! component's and container's log and keeps the plane's directory under target/tmp
//! (`REAL_PLANE_KEEP=1` keeps it after a passing run too; `REAL_PLANE_LOGS=1` prints the logs).
//! `REAL_PLANE_SHOW=1` prints what the cases read back (e.g. the Revision as the server has
//! it).

#[allow(dead_code, reason = "the plane's gateway pod uses part of it")]
#[path = "kube_support/gateway.rs"]
mod gateway;
mod knative_cel_live;
mod plane_support;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use libtest_mimic::{Arguments, Failed, Trial};
use plane_support::{Plane, install, netns};

type CaseFn = fn(Arc<Plane>, String) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Held by a case while it changes thaw-system's ConfigMaps: such cases run one at a time.
pub static SYSTEM_CONFIG: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

macro_rules! case {
    ($f:ident) => {
        (stringify!($f), (|p, ns| Box::pin($f(p, ns))) as CaseFn)
    };
}

fn cases() -> Vec<(&'static str, CaseFn)> {
    vec![
        case!(helloworld_go_reaches_ready_and_answers),
        case!(an_invalid_service_is_refused_by_the_webhook),
        case!(the_crds_cel_rules_refuse_what_they_forbid),
        case!(owner_references_need_the_finalizers_rule),
    ]
}

fn main() -> ExitCode {
    if std::env::var(install::POD_ROLE_ENV).as_deref() == Ok("ingress-gateway") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(install::run_ingress_gateway());
        return ExitCode::SUCCESS;
    }
    let args = Arguments::from_args();
    let listed = || {
        cases()
            .into_iter()
            .map(|(name, _)| Trial::test(name, || Ok(())))
            .collect::<Vec<_>>()
    };
    let runs = listed()
        .iter()
        .any(|t| !args.is_filtered_out(t) && !args.is_ignored(t));
    if args.list || !runs {
        // Nothing to run here (a filter for other targets' tests): no plane.
        let trials = listed()
            .into_iter()
            .map(|t| {
                let name = t.name().to_string();
                Trial::test(name, || Ok(()))
            })
            .collect();
        return libtest_mimic::run(&args, trials).exit_code();
    }
    if !netns::inside() {
        if let Err(e) = plane_support::build() {
            eprintln!("real_plane: {e}");
            return ExitCode::FAILURE;
        }
        return netns::reexec().unwrap_or_else(|e| {
            eprintln!("real_plane: {e}");
            ExitCode::FAILURE
        });
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    let bins = plane_support::bin_dir().join("bin");
    let started = tokio::time::Instant::now();
    let plane = Arc::new(rt.block_on(Plane::start(&bins)));
    eprintln!(
        "real_plane: Kubernetes {} up in {:.1?}",
        plane_support::KUBE_VERSION,
        started.elapsed()
    );
    if let Err(e) = rt.block_on(install::install(&plane)) {
        eprintln!("real_plane: installing thaw failed: {e}\n{}", plane.dump());
        return ExitCode::FAILURE;
    }
    eprintln!("real_plane: thaw installed in {:.1?}", started.elapsed());

    let trials = cases()
        .into_iter()
        .map(|(name, run)| {
            let plane = plane.clone();
            let handle = rt.handle().clone();
            Trial::test(name, move || {
                let ns = format!("case-{}", name.replace('_', "-"))
                    .chars()
                    .take(50)
                    .collect::<String>()
                    .trim_end_matches('-')
                    .to_string();
                handle.block_on(async {
                    create_namespace(&plane, &ns).await;
                    let outcome = tokio::spawn(run(plane.clone(), ns.clone())).await;
                    match outcome {
                        Ok(()) => {
                            delete_namespace(&plane, &ns).await;
                            Ok(())
                        }
                        Err(e) => Err(Failed::from(panic_message(e))),
                    }
                })
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if conclusion.has_failed() || std::env::var_os("REAL_PLANE_LOGS").is_some() {
        eprintln!("{}", plane.dump());
    }
    if (conclusion.has_failed() || std::env::var_os("REAL_PLANE_KEEP").is_some())
        && let Ok(plane) = Arc::try_unwrap(plane)
    {
        eprintln!(
            "real_plane: the plane's files are kept in {}",
            plane.keep().display()
        );
    }
    conclusion.exit_code()
}

fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into()),
        Err(e) => e.to_string(),
    }
}

async fn create_namespace(plane: &Plane, ns: &str) {
    let api: Api<Namespace> = Api::all(plane.admin.clone());
    let obj: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": ns}
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    // Pods need the namespace's default ServiceAccount, made by the controller-manager.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(plane.admin.clone(), ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sas.get_opt("default").await.unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ns}: no default ServiceAccount"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes a passed case's namespace; the namespace controller and the garbage collector
/// clean up behind it.
async fn delete_namespace(plane: &Plane, ns: &str) {
    let api: Api<Namespace> = Api::all(plane.admin.clone());
    let _ = api.delete(ns, &DeleteParams::default()).await;
}

fn show(what: &str, text: &str) {
    if std::env::var_os("REAL_PLANE_SHOW").is_some() {
        println!("----- {what} -----\n{text}");
    }
}

/// Writes `yaml` to a file in the plane's directory and applies it with kubectl in `ns`.
async fn apply(plane: &Plane, ns: &str, name: &str, yaml: &str) -> Result<String, String> {
    let path = plane.dir.path().join(format!("{ns}-{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    plane
        .kubectl(&["-n", ns, "apply", "-f", &path.display().to_string()])
        .await
}

// === the cases ===

/// Knative's helloworld-go, as Knative's documentation writes it, goes Ready (its Revision,
/// Configuration and Route; the Route's IngressReady through the ingress gateway's probe) and
/// answers through the ingress gateway. No role was denied anything by RBAC on the way.
async fn helloworld_go_reaches_ready_and_answers(plane: Arc<Plane>, ns: String) {
    let yaml = r#"
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: helloworld-go
spec:
  template:
    spec:
      containers:
        - image: ghcr.io/knative/helloworld-go:latest
          ports:
            - containerPort: 8080
          env:
            - name: TARGET
              value: "World"
"#;
    let transitions = plane_support::checks::Transitions::start(&plane, &ns);
    apply(&plane, &ns, "helloworld", yaml).await.unwrap();
    let waited = plane
        .kubectl(&[
            "-n",
            &ns,
            "wait",
            "ksvc/helloworld-go",
            "--for=condition=Ready",
            "--timeout=180s",
        ])
        .await;
    let revision = plane
        .kubectl(&["-n", &ns, "get", "revision", "-o", "yaml"])
        .await
        .unwrap();
    show("kubectl get revision -o yaml", &revision);
    let ksvc = plane
        .kubectl(&["-n", &ns, "get", "ksvc", "helloworld-go", "-o", "yaml"])
        .await
        .unwrap();
    show("the conditions as they changed", &transitions.lines());
    waited.unwrap_or_else(|e| panic!("{e}\n{ksvc}\n{revision}\n{}", transitions.lines()));

    let host = format!("helloworld-go.{ns}.example.com");
    let gateway =
        plane_support::checks::service_endpoint(&plane, "istio-system", "istio-ingressgateway")
            .await
            .expect("the ingress gateway's endpoint");
    let (status, body) = plane_support::checks::get(gateway, &host, "/")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    // `thaw sample-app` plays the image: "Hello from $TARGET!".
    assert_eq!(body.trim(), "Hello from World!");

    let denied = plane_support::checks::denials(&plane);
    assert!(
        denied.is_empty(),
        "RBAC denied thaw's roles:\n{}",
        denied.join("\n")
    );
}

/// A Service the CRD's schema accepts but Knative's rules refuse (a reserved environment
/// variable) is refused by the API server calling `thaw webhook`, with Knative's message.
async fn an_invalid_service_is_refused_by_the_webhook(plane: Arc<Plane>, ns: String) {
    let yaml = r#"
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: reserved-env
spec:
  template:
    spec:
      containers:
        - image: ghcr.io/knative/helloworld-go
          env:
            - name: K_SERVICE
              value: mine
"#;
    let err = apply(&plane, &ns, "reserved-env", yaml)
        .await
        .expect_err("refused at admission");
    show("kubectl apply of an invalid Service", &err);
    assert!(
        err.contains(
            r#"admission webhook "validation.webhook.serving.knative.dev" denied the request"#
        ),
        "{err}"
    );
    assert!(
        err.contains(r#""K_SERVICE" is a reserved environment variable: spec.template.spec.containers[0].env[0].name"#),
        "{err}"
    );
    let services: Api<thaw::knative::Service> = Api::namespaced(plane.admin.clone(), &ns);
    assert!(services.get_opt("reserved-env").await.unwrap().is_none());
}

/// The shipped CRDs' CEL rules, compiled by the real API server, refuse what they forbid with
/// their messages (the live test of tests/knative_cel.rs).
async fn the_crds_cel_rules_refuse_what_they_forbid(plane: Arc<Plane>, ns: String) {
    knative_cel_live::refuses_what_the_rules_forbid(&plane.admin, &ns).await;
}

/// `OwnerReferencesPermissionEnforcement`: a child whose owner reference blocks its owner's
/// deletion is created only by a user who may update the owner's `finalizers`. The
/// controller's ClusterRole without its `*/finalizers` rule is refused; as shipped, admitted.
async fn owner_references_need_the_finalizers_rule(plane: Arc<Plane>, ns: String) {
    plane_support::checks::owner_references_case(&plane, &ns).await;
}
