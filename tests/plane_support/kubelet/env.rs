//! A container's command line and environment, built as the kubelet builds them
//! (`makeEnvironmentVariables`, `ExpandContainerCommandAndArgs`) and as the runtime merges
//! them with the image's.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::ResourceExt;
use kube::api::Api;

use super::ImageRun;

/// Why a container could not be created: the waiting reason and message its status shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure {
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl Failure {
    pub(super) fn config(message: impl Into<String>) -> Self {
        Self {
            reason: "CreateContainerConfigError",
            message: message.into(),
        }
    }
}

/// The image reference without `@digest` and without `:tag` (a registry's `:port` stays).
pub(super) fn repository(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rfind('/').map_or(0, |i| i + 1);
    match name[last..].find(':') {
        Some(i) => &name[..last + i],
        None => name,
    }
}

/// The image's ID as containerd reports it: the repository at the image's digest, or at the
/// SHA-256 of the reference when it names none (nothing is pulled, so there is no other).
pub(super) fn image_id(image: &str) -> String {
    let digest = image
        .split_once('@')
        .map(|(_, d)| d.to_string())
        .filter(|d| d.starts_with("sha256:"))
        .unwrap_or_else(|| format!("sha256:{}", super::sha256_hex(image.as_bytes())));
    format!("{}@{digest}", repository(image))
}

/// The program and arguments of container `c` of an image that runs `run`, `$(VAR)`
/// expanded from `env` (the kubelet's environment of the container). `command` replaces the
/// entrypoint only when it names the image's program (by file name): anything else is not in
/// the "image" (RunContainerError). `args` follow the entrypoint (the image has no default
/// arguments of its own).
pub(super) fn argv(
    run: &ImageRun,
    c: &Container,
    env: &[(String, String)],
) -> Result<Vec<String>, Failure> {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let command: Vec<String> = c
        .command
        .iter()
        .flatten()
        .map(|s| expand(s, lookup))
        .collect();
    let mut out = Vec::new();
    match command.split_first() {
        None => out.extend(run.args.iter().cloned()),
        Some((first, rest)) => {
            if Path::new(first).file_name() != run.program.file_name() {
                return Err(Failure {
                    reason: "RunContainerError",
                    message: format!(
                        "exec: {first:?}: executable file not found in $PATH (the image runs {})",
                        run.program.display()
                    ),
                });
            }
            out.extend(rest.iter().cloned());
        }
    }
    out.extend(c.args.iter().flatten().map(|s| expand(s, lookup)));
    Ok(out)
}

/// Kubernetes' `$(VAR)` expansion: a known `VAR` is replaced, an unknown one is left as
/// written, `$$` is `$`, and any other `$` stays.
pub(super) fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            out.push('$');
            rest = escaped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match lookup(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// An ordered environment where a later value replaces an earlier one in place (the
/// kubelet's map, in declaration order).
#[derive(Default)]
pub(super) struct Env(pub(super) Vec<(String, String)>);

impl Env {
    pub(super) fn set(&mut self, name: &str, value: String) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 = value,
            None => self.0.push((name.to_string(), value)),
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The environment the kubelet gives container `c` of `pod` (at `pod_ip`, on a node at
/// `host_ip`): `envFrom` then `env`, ConfigMaps and Secrets read with the node's `client`.
/// `Err` is CreateContainerConfigError with the API's message (a missing object, or the Node
/// authorizer refusing one no pod on this node references).
///
/// No service links and no `KUBERNETES_SERVICE_HOST`/`PORT`: there is no kube-proxy, so no
/// ClusterIP would answer; pods reach the API server through their kubeconfig.
pub(super) async fn kubelet_env(
    client: &kube::Client,
    pod: &Pod,
    c: &Container,
    pod_ip: Ipv4Addr,
    host_ip: Ipv4Addr,
) -> Result<Env, Failure> {
    let ns = pod.namespace().unwrap_or_default();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    // name -> data (None: optional and missing), read once per container.
    let mut cm_cache: BTreeMap<String, Option<BTreeMap<String, String>>> = BTreeMap::new();
    let mut secret_cache: BTreeMap<String, Option<BTreeMap<String, String>>> = BTreeMap::new();
    let mut env = Env::default();
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(r) = &from.config_map_ref {
            read_cm(&cms, &mut cm_cache, &r.name, r.optional.unwrap_or(false)).await?
        } else if let Some(r) = &from.secret_ref {
            read_secret(
                &secrets,
                &mut secret_cache,
                &r.name,
                r.optional.unwrap_or(false),
            )
            .await?
        } else {
            None
        };
        for (k, v) in data.into_iter().flatten() {
            env.set(&format!("{prefix}{k}"), v);
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) if !v.is_empty() => expand(v, |n| env.get(n)),
            (_, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field_ref(pod, pod_ip, host_ip, &f.field_path)?
                } else if let Some(r) = &from.resource_field_ref {
                    super::resources::resource_ref(pod, c, r)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    match read_cm(&cms, &mut cm_cache, &r.name, optional).await? {
                        None => continue,
                        Some(data) => match data.get(&r.key) {
                            Some(v) => v.clone(),
                            None if optional => continue,
                            None => {
                                return Err(Failure::config(format!(
                                    "couldn't find key {} in ConfigMap {ns}/{}",
                                    r.key, r.name
                                )));
                            }
                        },
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    match read_secret(&secrets, &mut secret_cache, &r.name, optional).await? {
                        None => continue,
                        Some(data) => match data.get(&r.key) {
                            Some(v) => v.clone(),
                            None if optional => continue,
                            None => {
                                return Err(Failure::config(format!(
                                    "couldn't find key {} in Secret {ns}/{}",
                                    r.key, r.name
                                )));
                            }
                        },
                    }
                } else {
                    String::new()
                }
            }
            _ => String::new(),
        };
        env.set(&e.name, value);
    }
    Ok(env)
}

/// A ConfigMap's data, cached; `None` when optional and missing.
async fn read_cm(
    api: &Api<ConfigMap>,
    cache: &mut BTreeMap<String, Option<BTreeMap<String, String>>>,
    name: &str,
    optional: bool,
) -> Result<Option<BTreeMap<String, String>>, Failure> {
    if let Some(d) = cache.get(name) {
        return Ok(d.clone());
    }
    let data = match api.get(name).await {
        Ok(cm) => Some(cm.data.unwrap_or_default()),
        Err(e) if super::not_found(&e) && optional => None,
        Err(e) => return Err(Failure::config(api_message(&e))),
    };
    cache.insert(name.to_string(), data.clone());
    Ok(data)
}

/// A Secret's data (as text), cached; `None` when optional and missing.
async fn read_secret(
    api: &Api<Secret>,
    cache: &mut BTreeMap<String, Option<BTreeMap<String, String>>>,
    name: &str,
    optional: bool,
) -> Result<Option<BTreeMap<String, String>>, Failure> {
    if let Some(d) = cache.get(name) {
        return Ok(d.clone());
    }
    let data = match api.get(name).await {
        Ok(s) => Some(
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect(),
        ),
        Err(e) if super::not_found(&e) && optional => None,
        Err(e) => return Err(Failure::config(api_message(&e))),
    };
    cache.insert(name.to_string(), data.clone());
    Ok(data)
}

/// The API's own message for an API error, else the error.
pub(super) fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        e => e.to_string(),
    }
}

/// A `fieldRef`'s value, as the kubelet resolves it.
fn field_ref(
    pod: &Pod,
    pod_ip: Ipv4Addr,
    host_ip: Ipv4Addr,
    path: &str,
) -> Result<String, Failure> {
    let spec = pod.spec.as_ref();
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
    };
    Ok(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "metadata.labels" => format_map(pod.labels()),
        "metadata.annotations" => format_map(pod.annotations()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        _ => {
            if let Some(k) = subscript("metadata.labels") {
                pod.labels().get(k).cloned().unwrap_or_default()
            } else if let Some(k) = subscript("metadata.annotations") {
                pod.annotations().get(k).cloned().unwrap_or_default()
            } else {
                return Err(Failure::config(format!("unsupported fieldPath: {path}")));
            }
        }
    })
}

/// Labels or annotations as the downward API writes a whole map: `k="v"` lines, sorted.
fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}
