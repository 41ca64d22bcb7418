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
