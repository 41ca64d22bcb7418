//! The one place that knows the in-process API server (`engenho-apiserver`, pinned): tests get
//! a real Kubernetes REST/watch endpoint on `127.0.0.1:0` and a [`kube::Client`] to it over
//! plain HTTP. Replace this module, not the tests, if the server is swapped for another double.
//!
//! The server serves every built-in kind (Deployments with `/scale`, Pods, EndpointSlices,
//! Leases, ConfigMaps, ...), the four `serving.knative.dev/v1` kinds from the generated CRDs
//! (schema enforced, `/status` served), Istio's `networking.istio.io/v1` VirtualService and the
//! Gateway API's `gateway.networking.k8s.io/v1` HTTPRoute (with `/status`, which the tests write
//! playing the gateway's implementation). No controllers run: tests play kubelet and the
//! endpoints controller. It enforces no RBAC, no CEL and no pruning.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the support module"
)]

pub mod gateway;
pub mod relay;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use engenho_apiserver::{ApiServer, ResourceHandler, StoreBackedHandler, handlers_from_catalog};
use engenho_store::{InProcessRouter, StoreMesh, default_config};
use engenho_types::generated_v1_34::Subresource;

/// A running API server; stopped when dropped (its task is aborted with the runtime).
pub struct TestApi {
    server: Option<ApiServer>,
    _store: Arc<StoreMesh>,
    addr: SocketAddr,
}

impl TestApi {
    /// Starts a fresh, empty server with the Knative CRDs served.
    pub async fn start() -> Self {
        let router = InProcessRouter::new();
        let cfg = default_config("thaw-test").expect("store config");
        let store = Arc::new(
            StoreMesh::start(1, "in-process://1".into(), router, cfg)
                .await
                .expect("store starts"),
        );
        store.initialize_singleton().await.expect("store init");
        assert!(store.wait_for_leadership(Duration::from_secs(10)).await);
        let mut handlers = handlers_from_catalog(store.clone());
        for crd in thaw::knative::crds() {
            handlers.push(crd_handler(store.clone(), &crd));
        }
        // Istio's VirtualService (the subset the Route reconciler writes), as Istio's CRD
        // would serve it on a cluster.
        handlers.push(crd_handler(
            store.clone(),
            &thaw::controller::route::virtual_service::crd(),
        ));
        // The Gateway API's HTTPRoute (the subset the Gateway API ingress class writes and
        // reads), as the Gateway API's CRD would serve it.
        handlers.push(crd_handler(
            store.clone(),
            &thaw::controller::route::http_route::crd(),
        ));
        // Istio's Gateway (the Istio class's TLS Gateways) and cert-manager's Certificate (the
        // subsets thaw writes), as their CRDs would serve them.
        handlers.push(crd_handler(
            store.clone(),
            &thaw::controller::route::virtual_service::gateway_crd(),
        ));
        handlers.push(crd_handler(
            store.clone(),
            &thaw::controller::route::certificate::crd(),
        ));
        // The Gateway API's Gateway and ReferenceGrant (the Gateway API class's TLS).
        handlers.push(crd_handler(
            store.clone(),
            &thaw::controller::route::http_route::gateway_crd(),
        ));
        handlers.push(crd_handler(
            store.clone(),
            &thaw::controller::route::http_route::reference_grant_crd(),
        ));
        // Knative Serving's internal kinds (what a cluster where Knative ran holds: the
        // objects thaw adopts from, `--adopt-knative`), served without a schema.
        for (group, kind, plural) in [
            (
                "autoscaling.internal.knative.dev",
                "PodAutoscaler",
                "podautoscalers",
            ),
            (
                "networking.internal.knative.dev",
                "ServerlessService",
                "serverlessservices",
            ),
            ("networking.internal.knative.dev", "Ingress", "ingresses"),
            (
                "networking.internal.knative.dev",
                "Certificate",
                "certificates",
            ),
        ] {
            handlers.push(Arc::new(StoreBackedHandler::new(
                store.clone(),
                group,
                "v1alpha1",
                kind,
                plural,
                true,
            )));
        }
        // `events.k8s.io/v1` Events (what kube's recorder writes); the server's catalog has
        // only `core/v1` ones.
        handlers.push(Arc::new(StoreBackedHandler::new(
            store.clone(),
            "events.k8s.io",
            "v1",
            "Event",
            "events",
            true,
        )));
        let server = ApiServer::start("127.0.0.1:0".parse().unwrap(), handlers, None)
            .await
            .expect("api server starts");
        let addr = server.local_addr();
        Self {
            server: Some(server),
            _store: store,
            addr,
        }
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client of this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        client_at(self.addr)
    }

    /// Stops the server; open watches are severed.
    pub async fn stop(mut self) {
        if let Some(s) = self.server.take() {
            let _ = s.shutdown().await;
        }
    }
}

/// Writes a kubeconfig at `path` for a role reaching the server (or a relay) at `server` over
/// plain HTTP, with `namespace` as its default namespace (how the tests start `thaw` roles).
pub fn write_kubeconfig(path: &std::path::Path, server: SocketAddr, namespace: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://{server}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: {namespace}\n\
             current-context: test\nusers:\n- name: test\n  user: {{}}\n"
        ),
    )
    .unwrap();
}

/// A client of a server (or relay) at `addr`, over plain HTTP.
pub fn client_at(addr: SocketAddr) -> kube::Client {
    let url: http::Uri = format!("http://{addr}").parse().unwrap();
    let mut config = kube::Config::new(url);
    config.default_namespace = "default".into();
    config.read_timeout = None;
    kube::Client::try_from(config).expect("kube client")
}

/// Serves one CRD the way the server's CRD controller would: its schema enforced, `/status`
/// served when the CRD declares it, its printer columns.
fn crd_handler(
    store: Arc<StoreMesh>,
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Arc<dyn ResourceHandler> {
    const STATUS: &[Subresource] = &[Subresource::Status];
    let v = &crd.spec.versions[0];
    let schema = serde_json::to_value(
        v.schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("generated CRDs carry a schema"),
    )
    .unwrap();
    let columns: Vec<serde_json::Value> = v
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
    let has_status = v.subresources.as_ref().is_some_and(|s| s.status.is_some());
    Arc::new(
        StoreBackedHandler::new(
            store,
            crd.spec.group.clone(),
            v.name.clone(),
            crd.spec.names.kind.clone(),
            crd.spec.names.plural.clone(),
            crd.spec.scope == "Namespaced",
        )
        .with_subresources(if has_status { STATUS } else { &[] })
        .with_crd_schema(schema)
        .with_printer_columns(&columns),
    )
}

/// Plays the Deployment controller's ownership chain for a pod of Deployment `deployment` in
/// `ns`: its ReplicaSet [`replica_set_name`] (created once: controlled by the Deployment by UID,
/// labelled and selected as the Deployment's template) and the `ownerReferences` a pod of it
/// carries (controlled by that ReplicaSet by UID). Kubernetes' endpoints by ownership
/// (`src/platform/kubernetes/owners.rs`) count only pods owned this way.
pub async fn pod_owner_refs(
    client: &kube::Client,
    ns: &str,
    deployment: &str,
) -> serde_json::Value {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    use kube::api::{Api, PostParams};
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let d = deps
        .get(deployment)
        .await
        .expect("the pod's Deployment exists");
    let uid = d.metadata.uid.clone().expect("Deployment uid");
    let rs_name = replica_set_name(deployment);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let mut found = rss.get_opt(&rs_name).await.expect("get ReplicaSet");
    // One left by an earlier Deployment of the name: the garbage collector's part.
    if let Some(old) = found.as_ref()
        && old
            .metadata
            .owner_references
            .iter()
            .flatten()
            .all(|r| r.uid != uid)
    {
        let _ = rss.delete(&rs_name, &Default::default()).await;
        found = None;
    }
    let rs = match found {
        Some(rs) => rs,
        None => {
            let spec = d.spec.as_ref().expect("Deployment spec");
            let template_labels = spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": rs_name,
                    "labels": template_labels,
                    "ownerReferences": [{
                        "apiVersion": "apps/v1", "kind": "Deployment",
                        "name": deployment, "uid": uid,
                        "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "spec": {"selector": spec.selector, "template": spec.template},
            }))
            .unwrap();
            match rss.create(&PostParams::default(), &rs).await {
                Ok(rs) => rs,
                // Another pod of the Deployment made it meanwhile.
                Err(kube::Error::Api(e)) if e.code == 409 => rss.get(&rs_name).await.unwrap(),
                Err(e) => panic!("create ReplicaSet {rs_name}: {e}"),
            }
        }
    };
    serde_json::json!([{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs_name,
        "uid": rs.metadata.uid.expect("ReplicaSet uid"),
        "controller": true, "blockOwnerDeletion": true,
    }])
}

/// The name of Deployment `deployment`'s one ReplicaSet in [`pod_owner_refs`].
pub fn replica_set_name(deployment: &str) -> String {
    format!("{deployment}-rs")
}

/// A pod `name` of Deployment `deployment` in `ns`, owned through its ReplicaSet
/// ([`pod_owner_refs`]), carrying `labels`; created unless a pod of the name exists.
pub async fn owned_pod(
    client: &kube::Client,
    ns: &str,
    deployment: &str,
    name: &str,
    labels: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    if let Some(pod) = pods.get_opt(name).await.unwrap() {
        return pod;
    }
    let owners = pod_owner_refs(client, ns, deployment).await;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
        "spec": {"containers": [{"name": "user-container", "image": "img"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create pod {name}: {e}"))
}

/// [`owned_pod`], then plays the kubelet: the pod `Running` at `ip` (`status.podIPs`), as
/// endpoints bound to pods require (`src/platform/kubernetes/owners.rs`).
pub async fn running_pod(
    client: &kube::Client,
    ns: &str,
    deployment: &str,
    name: &str,
    ip: &str,
    labels: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    owned_pod(client, ns, deployment, name, labels).await;
    pod_status(client, ns, name, "Running", &[ip]).await
}

/// Plays the kubelet: pod `ns/name`'s phase and `status.podIPs` (`podIP` the first).
pub async fn pod_status(
    client: &kube::Client,
    ns: &str,
    name: &str,
    phase: &str,
    ips: &[&str],
) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let ip_list: Vec<serde_json::Value> =
        ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "phase": phase, "podIP": ips.first(), "podIPs": ip_list}})),
    )
    .await
    .unwrap_or_else(|e| panic!("status of pod {name}: {e}"))
}

/// The `ownerReferences` the controller gives a revision's children: controlled by Revision
/// `revision` of UID `uid`.
pub fn revision_owner(revision: &str, uid: &str) -> serde_json::Value {
    serde_json::json!([{
        "apiVersion": "serving.knative.dev/v1", "kind": "Revision", "name": revision,
        "uid": uid, "controller": true, "blockOwnerDeletion": true,
    }])
}

/// Revision `revision`'s own Deployment `{revision}-deployment` (at zero, as
/// [`revision_deployment`]) and private Service `{revision}-private` (selecting its pods;
/// ports `http` 80 -> 8012, `http2` 81 -> 8013), both controlled by the Revision of UID `uid`,
/// as the controller makes them: the platform counts only these as the revision's.
pub async fn revision_children(client: &kube::Client, ns: &str, revision: &str, uid: &str) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, PostParams};
    let mut d = revision_deployment(&format!("{revision}-deployment"), revision);
    d.metadata.owner_references =
        Some(serde_json::from_value(revision_owner(revision, uid)).unwrap());
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deps.create(&PostParams::default(), &d)
        .await
        .unwrap_or_else(|e| panic!("create {revision}-deployment: {e}"));
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{revision}-private"), "labels": {
            "serving.knative.dev/revision": revision,
            "networking.internal.knative.dev/serviceType": "Private"},
            "ownerReferences": revision_owner(revision, uid)},
        "spec": {"selector": {"serving.knative.dev/revision": revision},
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8012, "protocol": "TCP"},
                {"name": "http2", "port": 81, "targetPort": 8013, "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c"}]},
    }))
    .unwrap();
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    svcs.create(&PostParams::default(), &svc)
        .await
        .unwrap_or_else(|e| panic!("create {revision}-private: {e}"));
}

/// The `targetRef` of an EndpointSlice endpoint for pod `name` in `ns`.
pub fn pod_target(ns: &str, name: &str) -> serde_json::Value {
    serde_json::json!({"kind": "Pod", "name": name, "namespace": ns})
}

/// A Deployment `name` of `revision` at zero replicas (its labels, selector and template's
/// labels carry the revision's label). Owned by nothing: the platform counts it as the
/// revision's only when it is named for it and controlled by it ([`revision_children`]).
pub fn revision_deployment(name: &str, revision: &str) -> k8s_openapi::api::apps::v1::Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"serving.knative.dev/revision": revision}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"serving.knative.dev/revision": revision}},
            "template": {
                "metadata": {"labels": {"serving.knative.dev/revision": revision}},
                "spec": {"containers": [{"name": "user-container", "image": "img"}]}
            }
        }
    }))
    .unwrap()
}
