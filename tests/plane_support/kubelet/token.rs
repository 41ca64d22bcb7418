//! A pod's ServiceAccount token, requested as the kubelet requests the one of its
//! `kube-api-access-*` projected volume (TokenRequest bound to the pod, with the node's
//! identity, so NodeRestriction checks the pod is on this node), and handed to the pod as a
//! kubeconfig file instead of a mount (there are no mount namespaces).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::Shared;
use super::env::api_message;

/// The token's lifetime asked for (the API server's audiences, an hour).
const EXPIRATION_SECONDS: i64 = 3600;

/// The ServiceAccount whose token the pod gets, if any. The ServiceAccount admission plugin
/// turns `automountServiceAccountToken` (the pod's, else its ServiceAccount's) into a
/// projected volume with a `serviceAccountToken` source for the API server's audiences: a pod
/// gets a kubeconfig exactly when it has one (NodeRestriction refuses a node's token request
/// for an audience no volume of the pod names).
pub(super) fn wanted(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if spec.automount_service_account_token == Some(false) {
        return None;
    }
    let has_volume = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .any(|t| t.audience.as_deref().unwrap_or("").is_empty());
    has_volume.then(|| {
        spec.service_account_name
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into())
    })
}

/// Requests a token for `sa` bound to `pod` and (re)writes, under `dir`, `token`, `ca.crt`,
/// `namespace` (the projected volume's files) and `kubeconfig` (server, CA, token, the pod's
/// namespace), each replaced atomically. Returns the kubeconfig's path and when to renew
/// (at 80% of the token's lifetime). `Err`: the API's refusal or a write error; bounded by
/// a 15 s timeout.
pub(super) async fn refresh(
    k: &Shared,
    pod: &Pod,
    dir: &Path,
    sa: &str,
) -> Result<(PathBuf, Duration), String> {
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<ServiceAccount> = Api::namespaced(k.cfg.node_client.clone(), &ns);
    let body = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            // Empty: the API server's own audiences (what the projected volume asks for).
            "audiences": [],
            "expirationSeconds": EXPIRATION_SECONDS,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(),
                "uid": pod.uid().unwrap_or_default()},
        },
    });
    let pp = PostParams::default();
    let call = api.create_subresource::<_, TokenRequest>("token", sa, &pp, &body);
    let tr = tokio::time::timeout(Duration::from_secs(15), call)
        .await
        .map_err(|_| format!("requesting a token for serviceaccount {ns}/{sa}: timed out"))?
        .map_err(|e| {
            format!(
                "requesting a token for serviceaccount {ns}/{sa}: {}",
                api_message(&e)
            )
        })?;
    let status = tr
        .status
        .ok_or("the TokenRequest came back without a status")?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let lifetime = (status.expiration_timestamp.0.as_second() - now).clamp(60, EXPIRATION_SECONDS);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca_data = serde_json::to_value(ByteString(k.cfg.ca_pem.as_bytes().to_vec()))
        .map_err(|e| e.to_string())?;
    let server = k.server_for(&ns);
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "plane", "cluster": {"server": server,
            "certificate-authority-data": ca_data}}],
        "users": [{"name": "pod", "user": {"token": status.token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "plane", "user": "pod",
            "namespace": ns}}],
        "current-context": "pod",
    });
    write(dir, "token", status.token.as_bytes())?;
    write(dir, "ca.crt", k.cfg.ca_pem.as_bytes())?;
    write(dir, "namespace", ns.as_bytes())?;
    // JSON is YAML: every kubeconfig loader reads it.
    let text = serde_json::to_vec_pretty(&kubeconfig).map_err(|e| e.to_string())?;
    let path = write(dir, "kubeconfig", &text)?;
    Ok((path, Duration::from_secs(lifetime as u64).mul_f64(0.8)))
}

/// Writes `dir/name` through a temporary file and a rename, so a reader never sees half.
fn write(dir: &Path, name: &str, data: &[u8]) -> Result<PathBuf, String> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, data)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}
