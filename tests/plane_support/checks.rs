//! What the cases on the plane read and send: a Service's ready endpoint (the real
//! EndpointSlice controller's), a request to it, the RBAC refusals in thaw's logs, and the
//! owner-reference admission check.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::Plane;

/// A ready endpoint of Service `ns/name` (its first port), from its EndpointSlices.
pub async fn service_endpoint(plane: &Plane, ns: &str, name: &str) -> Result<SocketAddr, String> {
    let host = format!("{name}.{ns}.svc.cluster.local");
    let svc: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(plane.admin.clone(), ns);
    let port = svc
        .get(name)
        .await
        .map_err(|e| e.to_string())?
        .spec
        .and_then(|s| s.ports)
        .and_then(|p| p.first().map(|p| p.port))
        .ok_or("no port")?;
    thaw::controller::route::prober::service_pods(&plane.admin, &host, port)
        .await?
        .first()
        .copied()
        .ok_or_else(|| format!("{ns}/{name} has no ready endpoint"))
}

/// GET `path` from `to` with `Host: host`; the status and the body.
pub async fn get(to: SocketAddr, host: &str, path: &str) -> Result<(u16, String), String> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = http::Request::get(format!("http://{to}{path}"))
        .header(http::header::HOST, host)
        .body(Empty::new())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(60), client.request(req))
        .await
        .map_err(|_| format!("GET http://{host}{path} via {to}: no answer in 60 s"))?
        .map_err(|e| format!("GET http://{host}{path} via {to}: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Every request of thaw's ServiceAccounts the API server refused for want of a permission,
/// from its audit log: `user verb resource name: message`. An RBAC refusal, or
/// OwnerReferencesPermissionEnforcement's for want of `*/finalizers`; not the latter's for a
/// kind its discovery cache does not map yet ("cannot find RESTMapping": the API server
/// refreshes that cache every 30 s, so a CRD installed just before is unknown to it for up to
/// that long, and the write is retried).
pub fn denials(plane: &Plane) -> Vec<String> {
    let text = std::fs::read_to_string(&plane.audit_log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["responseStatus"]["code"] == 403)
        .filter(|e| {
            !e["responseStatus"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("cannot find RESTMapping")
        })
        .map(|e| {
            let o = &e["objectRef"];
            format!(
                "{} {} {}/{} {}: {}",
                e["user"]["username"].as_str().unwrap_or_default(),
                e["verb"].as_str().unwrap_or_default(),
                o["apiGroup"].as_str().unwrap_or("core"),
                o["resource"].as_str().unwrap_or_default(),
                o["name"].as_str().unwrap_or_default(),
                e["responseStatus"]["message"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// A Deployment owned by a Revision, `blockOwnerDeletion` set, as the controller creates it.
fn owned_deployment(ns: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: owned-by-a-revision
  namespace: {ns}
  ownerReferences:
    - apiVersion: serving.knative.dev/v1
      kind: Revision
      name: some-revision
      uid: 6a1d3a5e-0000-4000-8000-000000000001
      controller: true
      blockOwnerDeletion: true
spec:
  selector:
    matchLabels: {{app: x}}
  template:
    metadata:
      labels: {{app: x}}
    spec:
      containers: [{{name: x, image: ghcr.io/knative/helloworld-go}}]
"#
    )
}

/// OwnerReferencesPermissionEnforcement on the controller's own ClusterRole: bound to a
/// ServiceAccount of the case's namespace without its `*/finalizers` rule, a child blocking
/// a Revision's deletion is refused; the shipped controller's identity is admitted. Both are
/// server-side dry runs (admission runs, nothing is stored).
pub async fn owner_references_case(plane: &Plane, ns: &str) {
    let role: serde_json::Value = serde_json::from_str(
        &plane
            .kubectl(&["get", "clusterrole", "thaw-controller", "-o", "json"])
            .await
            .unwrap(),
    )
    .unwrap();
    let rules = role["rules"].as_array().unwrap();
    let finalizers = |r: &serde_json::Value| {
        r["resources"].as_array().is_some_and(|rs| {
            rs.iter()
                .any(|x| x.as_str().is_some_and(|x| x.ends_with("/finalizers")))
        })
    };
    assert!(
        rules.iter().any(finalizers),
        "deploy/rbac/controller.yaml has no */finalizers rule"
    );
    let without: Vec<&serde_json::Value> = rules.iter().filter(|r| !finalizers(r)).collect();
    let name = format!("{ns}-no-finalizers");
    let objects = serde_json::json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": name}, "rules": without},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "no-finalizers", "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "no-finalizers", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": "no-finalizers", "namespace": ns}]}
        ]
    });
    let path = plane.dir.path().join(format!("{ns}-rbac.json"));
    std::fs::write(&path, objects.to_string()).unwrap();
    plane
        .kubectl(&["apply", "-f", &path.display().to_string()])
        .await
        .unwrap();
    let child = plane.dir.path().join(format!("{ns}-child.yaml"));
    std::fs::write(&child, owned_deployment(ns)).unwrap();
    let child = child.display().to_string();
    // OwnerReferencesPermissionEnforcement maps an owner's kind through a discovery cache the
    // API server refreshes on its own (about every 30 s): until it has seen the CRDs that
    // deploy/ installed a moment ago, it refuses every blockOwnerDeletion on a Revision with
    // "cannot find RESTMapping", whoever asks. That answer says nothing about RBAC: asked
    // again until the plugin knows the kind (bounded by two of its refreshes).
    let create_as = async |user: &str| {
        let user = format!("--as={user}");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(75);
        loop {
            let answer = plane
                .kubectl(&["create", "--dry-run=server", &user, "-f", &child])
                .await;
            match &answer {
                Err(e)
                    if e.contains("cannot find RESTMapping")
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                _ => return answer,
            }
        }
    };
    let refused = create_as(&format!("system:serviceaccount:{ns}:no-finalizers"))
        .await
        .expect_err("refused without the finalizers rule");
    assert!(
        refused.contains("cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on"),
        "{refused}"
    );
    create_as("system:serviceaccount:thaw-system:controller")
        .await
        .unwrap_or_else(|e| panic!("the shipped controller role: {e}"));
    let _ = plane.kubectl(&["delete", "clusterrole", &name]).await;
}

/// Records every change of the conditions of `kind` objects (Service, Configuration, Route,
/// Revision) in `ns`, as `+1.23s Route/hello IngressReady=Unknown Uninitialized: ...`, until
/// dropped; [`Transitions::lines`] reads them. What a slow case prints to say where it waited.
pub struct Transitions {
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Transitions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Transitions {
    pub fn start(plane: &Plane, ns: &str) -> Self {
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (client, ns, out) = (plane.admin.clone(), ns.to_string(), lines.clone());
        let task = tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let mut seen = std::collections::BTreeMap::<String, String>::new();
            loop {
                for kind in ["services", "configurations", "routes", "revisions"] {
                    let ar = kube::api::ApiResource {
                        group: "serving.knative.dev".into(),
                        version: "v1".into(),
                        api_version: "serving.knative.dev/v1".into(),
                        kind: kind.into(),
                        plural: kind.into(),
                    };
                    let api: kube::Api<kube::api::DynamicObject> =
                        kube::Api::namespaced_with(client.clone(), &ns, &ar);
                    let list = match api.list(&Default::default()).await {
                        Ok(list) => list,
                        Err(e) => {
                            let err = format!("list {kind}: {e}");
                            if seen.get("error") != Some(&err) {
                                out.lock().unwrap().push(err.clone());
                                seen.insert("error".into(), err);
                            }
                            continue;
                        }
                    };
                    for o in list.items {
                        let name = o.metadata.name.clone().unwrap_or_default();
                        let conds = o.data["status"]["conditions"].as_array().cloned();
                        for c in conds.into_iter().flatten() {
                            let key = format!("{kind}/{name} {}", c["type"].as_str().unwrap_or(""));
                            let now = format!(
                                "{} {}: {}",
                                c["status"].as_str().unwrap_or(""),
                                c["reason"].as_str().unwrap_or(""),
                                c["message"].as_str().unwrap_or("")
                            );
                            if seen.get(&key) != Some(&now) {
                                out.lock().unwrap().push(format!(
                                    "+{:.2}s {key}={now}",
                                    start.elapsed().as_secs_f64()
                                ));
                                seen.insert(key, now);
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Transitions { lines, task }
    }

    pub fn lines(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

/// The condition `type_` of an object's status, as JSON (any Knative or Kubernetes kind).
pub fn condition<'a>(obj: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}
