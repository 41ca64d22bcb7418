//! thaw on a real Kubernetes control plane: etcd, kube-apiserver and kube-controller-manager
//! built from their Go modules (`tests/cluster/build.sh`, run here on first use), one node
//! played by the kubelet stand-in, thaw installed from deploy/ as the README says and running
//! with its own ServiceAccounts. Started once for the whole target; each case works in its own
//! namespace (`plane_support::harness`).
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

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use plane_support::Plane;
use plane_support::harness::{Case, apply, show};

fn cases() -> Vec<Case> {
    vec![
        case!(helloworld_go_reaches_ready_and_answers),
        case!(an_invalid_service_is_refused_by_the_webhook),
        case!(the_crds_cel_rules_refuse_what_they_forbid),
        case!(owner_references_need_the_finalizers_rule),
        case!(the_controller_writes_secrets_in_the_gateway_namespace_only),
        case!(the_kubelet_stand_in_runs_pods_as_a_kubelet_does),
    ]
}

fn main() -> ExitCode {
    plane_support::harness::main(cases())
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

/// The controller's Secrets, as the real API server authorizes its ServiceAccount (RBAC from
/// deploy/): `get` in any namespace (a certificate's Secret is in its owner's), `list`,
/// `create`, `patch` and `delete` only in the gateway namespace (`istio-system`, the Role
/// `thaw-controller-gateway`), where it also reads and updates the Gateway API Gateways.
async fn the_controller_writes_secrets_in_the_gateway_namespace_only(
    plane: Arc<Plane>,
    ns: String,
) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    // The API server's own answer for the controller's ServiceAccount (a
    // SubjectAccessReview: no discovery of the kind needed).
    let can =
        |verb: &'static str, group: &'static str, resource: &'static str, namespace: String| {
            let plane = plane.clone();
            async move {
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: Some("system:serviceaccount:thaw-system:controller".into()),
                        groups: Some(vec![
                            "system:serviceaccounts".into(),
                            "system:serviceaccounts:thaw-system".into(),
                            "system:authenticated".into(),
                        ]),
                        resource_attributes: Some(ResourceAttributes {
                            namespace: Some(namespace),
                            verb: Some(verb.into()),
                            group: Some(group.into()),
                            resource: Some(resource.into()),
                            ..ResourceAttributes::default()
                        }),
                        ..SubjectAccessReviewSpec::default()
                    },
                    ..SubjectAccessReview::default()
                };
                Api::<SubjectAccessReview>::all(plane.admin.clone())
                    .create(&Default::default(), &review)
                    .await
                    .unwrap()
                    .status
                    .is_some_and(|s| s.allowed)
            }
        };
    let gw = "istio-system".to_string();
    assert!(can("get", "", "secrets", ns.clone()).await);
    for verb in ["list", "watch", "create", "patch", "update", "delete"] {
        assert!(
            !can(verb, "", "secrets", ns.clone()).await,
            "{verb} secrets in {ns}"
        );
        assert!(
            !can(verb, "", "secrets", "thaw-system".into()).await || verb == "create",
            "{verb} secrets in thaw-system"
        );
    }
    for verb in ["list", "create", "patch", "delete"] {
        assert!(
            can(verb, "", "secrets", gw.clone()).await,
            "{verb} secrets in {gw}"
        );
    }
    for verb in ["watch", "update"] {
        assert!(
            !can(verb, "", "secrets", gw.clone()).await,
            "{verb} secrets in {gw}"
        );
    }
    let group = "gateway.networking.k8s.io";
    for verb in ["get", "update"] {
        assert!(
            can(verb, group, "gateways", gw.clone()).await,
            "{verb} gateways in {gw}"
        );
        assert!(
            !can(verb, group, "gateways", ns.clone()).await,
            "{verb} gateways in {ns}"
        );
    }
}

/// The node thaw runs on, checked against what a kubelet does: the Node Ready with its Lease
/// renewed; a Deployment's pod bound, its init container run first, its containers in the
/// pod's own network namespace with the downward API, a ConfigMap key and a ServiceAccount
/// kubeconfig in their environment, Ready by its readiness probe and listed by the real
/// EndpointSlice controller; scaled to zero, its preStop hook run before SIGTERM, then the
/// pod deleted.
async fn the_kubelet_stand_in_runs_pods_as_a_kubelet_does(plane: Arc<Plane>, ns: String) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, Pod};
    let yaml = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  greeting: hello
---
apiVersion: v1
kind: Service
metadata:
  name: shell
spec:
  selector: {app: shell}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: shell
spec:
  replicas: 1
  selector:
    matchLabels: {app: shell}
  template:
    metadata:
      labels: {app: shell}
    spec:
      terminationGracePeriodSeconds: 20
      initContainers:
        - name: init
          image: thaw.test/shell
          command: [sh, -c, "echo init ran"]
      containers:
        - name: app
          image: ghcr.io/knative/helloworld-go
          env: [{name: PORT, value: "8080"}]
          ports: [{name: http, containerPort: 8080}]
          readinessProbe:
            httpGet: {path: /, port: http}
            periodSeconds: 1
        - name: shell
          image: thaw.test/shell
          command:
            - sh
            - -c
            - |
              env | sort
              trap 'echo "got TERM at $(date +%s.%N)"; exit 0' TERM
              while true; do sleep 0.2; done
          lifecycle:
            preStop:
              sleep: {seconds: 2}
          env:
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
            - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: GREETING, valueFrom: {configMapKeyRef: {name: settings, key: greeting}}}
            - {name: SAID, value: "$(GREETING) from $(POD_NAME)"}
"#;
    apply(&plane, &ns, "shell", yaml).await.unwrap();
    plane
        .kubectl(&[
            "-n",
            &ns,
            "wait",
            "deployment/shell",
            "--for=condition=Available",
            "--timeout=60s",
        ])
        .await
        .unwrap();

    let nodes: Api<Node> = Api::all(plane.admin.clone());
    let node = nodes.get(plane_support::NODE).await.unwrap();
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True", "{ready:?}");

    let pods: Api<Pod> = Api::namespaced(plane.admin.clone(), &ns);
    let pod = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let name = pod.metadata.name.clone().unwrap();
    let status = pod.status.clone().unwrap();
    let ip = status.pod_ip.clone().unwrap();
    assert!(ip.starts_with("10.244."), "{ip}");
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(plane_support::NODE)
    );
    let cs = status.container_statuses.unwrap();
    assert!(cs.iter().all(|c| c.ready), "{cs:?}");

    let log = |container: &str| {
        let suffix = format!("_{container}.log");
        plane
            .kubelet
            .logs()
            .into_iter()
            .filter(|(n, p)| {
                n.starts_with(&format!("{ns}/{name}/"))
                    && p.display().to_string().ends_with(&suffix)
            })
            .map(|(_, p)| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<String>()
    };
    assert!(log("init").contains("init ran"), "{}", log("init"));
    let env = log("shell");
    for want in [
        format!("POD_NAME={name}"),
        format!("POD_IP={ip}"),
        format!("NODE={}", plane_support::NODE),
        "GREETING=hello".to_string(),
        format!("SAID=hello from {name}"),
        format!("HOSTNAME={name}"),
        "KUBECONFIG=".to_string(),
    ] {
        assert!(env.contains(&want), "{want} not in the environment:\n{env}");
    }

    // The real EndpointSlice controller lists the Ready pod.
    let endpoint = plane_support::checks::service_endpoint(&plane, &ns, "shell")
        .await
        .unwrap();
    assert_eq!(endpoint.to_string(), format!("{ip}:8080"));

    // The node's Lease is renewed (every 10 s).
    let leases: Api<Lease> = Api::namespaced(plane.admin.clone(), "kube-node-lease");
    let renewed = |l: Lease| l.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let first = renewed(leases.get(plane_support::NODE).await.unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while renewed(leases.get(plane_support::NODE).await.unwrap()) == first {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node's Lease is not renewed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Scaled to zero: the preStop hook (2 s) first, then SIGTERM, then the pod is deleted,
    // well within its grace period.
    let scaled = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    plane
        .kubectl(&["-n", &ns, "scale", "deployment/shell", "--replicas=0"])
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while pods.get_opt(&name).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} is not deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shell = log("shell");
    let term: f64 = shell
        .lines()
        .find_map(|l| l.strip_prefix("got TERM at "))
        .unwrap_or_else(|| panic!("no SIGTERM seen:\n{shell}"))
        .trim()
        .parse()
        .unwrap();
    assert!(
        term - scaled >= 2.0,
        "SIGTERM {:.2} s after the scale-down, before preStop's 2 s",
        term - scaled
    );
}
