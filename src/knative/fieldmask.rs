//! Knative's field masks (`serving:pkg/apis/serving/fieldmask.go`): the pod-spec fields a
//! Service author may set, each one either always open, opened by a `config-features` key
//! ([`crate::config::features`]), or never open. Everything not listed is closed, so a field
//! Kubernetes adds later stays out until it is listed here.
//!
//! One table serves both uses, so there is no path around it:
//! - [`check`] (validation, and through it the controller and any admission webhook) names
//!   every closed field that is set, with Knative's message `must not set the field(s)` and,
//!   when a key opens it, that key;
//! - [`mask`] (the controller, where it builds the revision's Deployment) drops every closed
//!   field from the pod spec before thaw adds its own.
//!
//! A field counts as set as Go sees it: `false`, `0`, `""` and an empty list are unset, except
//! inside security contexts and capabilities, whose fields are pointers in Kubernetes' Go types
//! (so `privileged: false` is refused, as Knative refuses it); an object, even `{}`, is set.
//!
//! Beside the plain masks, two rules of Knative's are values rather than fields:
//! `automountServiceAccountToken` may only be `false`, and `capabilities.add` may only hold
//! `NET_BIND_SERVICE` unless `kubernetes.containerspec-addcapabilities` is open.
//!
//! Never open, whatever the keys: `privileged`, `procMount`, `seLinuxOptions`,
//! `windowsOptions`, `appArmorProfile`, `sysctls`, `volumeDevices`, `lifecycle`, `stdin`,
//! `tty`, `hostPort`/`hostIP`, `nodeName`, `hostname`, `restartPolicy`,
//! `terminationGracePeriodSeconds`, `activeDeadlineSeconds`, `readinessGates`, and volumes
//! other than secret, configMap, projected, emptyDir, persistentVolumeClaim, hostPath, csi and
//! image.

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{Map, Value};

use super::validate::{FieldError, closed_by};
use crate::config::features::{FeaturesConfig, key};

/// Whether a field may be set.
#[derive(Clone, Copy)]
enum Gate {
    /// Always.
    Open,
    /// When the `config-features` key is `enabled` or `allowed`.
    Key(&'static str),
    /// Only as `false` (`automountServiceAccountToken`).
    OnlyFalse,
    /// Only `NET_BIND_SERVICE`, unless the add-capabilities key is open.
    AddCapabilities,
}

/// What a field holds.
#[derive(Clone, Copy)]
enum Shape {
    /// Anything: not looked into.
    Any,
    /// An object checked against its own table.
    Obj(&'static Obj),
    /// A list of objects, each checked against the table.
    List(&'static Obj),
}

struct Field {
    name: &'static str,
    gate: Gate,
    shape: Shape,
}

/// One Kubernetes type: its open fields; every other field is closed.
struct Obj {
    fields: &'static [Field],
    /// The fields are pointers in Go: present means set, even `false` or `0`.
    pointers: bool,
}

const fn open(name: &'static str) -> Field {
    Field {
        name,
        gate: Gate::Open,
        shape: Shape::Any,
    }
}

const fn keyed(name: &'static str, key: &'static str) -> Field {
    Field {
        name,
        gate: Gate::Key(key),
        shape: Shape::Any,
    }
}

const fn obj(name: &'static str, o: &'static Obj) -> Field {
    Field {
        name,
        gate: Gate::Open,
        shape: Shape::Obj(o),
    }
}

const fn list(name: &'static str, o: &'static Obj) -> Field {
    Field {
        name,
        gate: Gate::Open,
        shape: Shape::List(o),
    }
}

const fn values(fields: &'static [Field]) -> Obj {
    Obj {
        fields,
        pointers: false,
    }
}

static POD_SPEC: Obj = values(&[
    open("serviceAccountName"),
    list("containers", &CONTAINER),
    list("volumes", &VOLUME),
    open("imagePullSecrets"),
    open("enableServiceLinks"),
    Field {
        name: "automountServiceAccountToken",
        gate: Gate::OnlyFalse,
        shape: Shape::Any,
    },
    keyed("affinity", key::AFFINITY),
    keyed(
        "topologySpreadConstraints",
        key::TOPOLOGY_SPREAD_CONSTRAINTS,
    ),
    keyed("hostAliases", key::HOST_ALIASES),
    keyed("nodeSelector", key::NODE_SELECTOR),
    keyed("runtimeClassName", key::RUNTIME_CLASS_NAME),
    keyed("tolerations", key::TOLERATIONS),
    obj("securityContext", &POD_SECURITY_CONTEXT),
    keyed("priorityClassName", key::PRIORITY_CLASS_NAME),
    keyed("schedulerName", key::SCHEDULER_NAME),
    Field {
        name: "initContainers",
        gate: Gate::Key(key::INIT_CONTAINERS),
        shape: Shape::List(&CONTAINER),
    },
    keyed("dnsPolicy", key::DNS_POLICY),
    keyed("dnsConfig", key::DNS_CONFIG),
    keyed("hostIPC", key::HOST_IPC),
    keyed("hostPID", key::HOST_PID),
    keyed("hostNetwork", key::HOST_NETWORK),
    keyed("shareProcessNamespace", key::SHARE_PROCESS_NAMESPACE),
]);

static POD_SECURITY_CONTEXT: Obj = Obj {
    fields: &[
        keyed("runAsUser", key::SECURITY_CONTEXT),
        keyed("runAsGroup", key::SECURITY_CONTEXT),
        keyed("runAsNonRoot", key::SECURITY_CONTEXT),
        keyed("fsGroup", key::SECURITY_CONTEXT),
        keyed("supplementalGroups", key::SECURITY_CONTEXT),
        // Knative lets every Service set the seccomp profile (Pod Security `restricted`).
        open("seccompProfile"),
    ],
    pointers: true,
};

static CONTAINER: Obj = values(&[
    open("name"),
    open("args"),
    open("command"),
    list("env", &ENV_VAR),
    open("workingDir"),
    list("envFrom", &ENV_FROM),
    open("image"),
    open("imagePullPolicy"),
    obj("livenessProbe", &PROBE),
    list("ports", &CONTAINER_PORT),
    obj("readinessProbe", &PROBE),
    obj("startupProbe", &PROBE),
    obj("resources", &RESOURCES),
    obj("securityContext", &SECURITY_CONTEXT),
    open("terminationMessagePath"),
    open("terminationMessagePolicy"),
    list("volumeMounts", &VOLUME_MOUNT),
]);

static SECURITY_CONTEXT: Obj = Obj {
    fields: &[
        open("allowPrivilegeEscalation"),
        obj("capabilities", &CAPABILITIES),
        open("readOnlyRootFilesystem"),
        open("runAsGroup"),
        open("runAsNonRoot"),
        open("runAsUser"),
        open("seccompProfile"),
    ],
    pointers: true,
};

static CAPABILITIES: Obj = Obj {
    fields: &[
        open("drop"),
        Field {
            name: "add",
            gate: Gate::AddCapabilities,
            shape: Shape::Any,
        },
    ],
    pointers: true,
};

static ENV_VAR: Obj = values(&[
    open("name"),
    open("value"),
    obj("valueFrom", &ENV_VAR_SOURCE),
]);

static ENV_VAR_SOURCE: Obj = values(&[
    obj("configMapKeyRef", &KEY_SELECTOR),
    obj("secretKeyRef", &KEY_SELECTOR),
    keyed("fieldRef", key::FIELD_REF),
    keyed("resourceFieldRef", key::FIELD_REF),
]);

static KEY_SELECTOR: Obj = values(&[open("name"), open("key"), open("optional")]);

static ENV_FROM: Obj = values(&[
    open("prefix"),
    obj("configMapRef", &ENV_SOURCE),
    obj("secretRef", &ENV_SOURCE),
]);

static ENV_SOURCE: Obj = values(&[open("name"), open("optional")]);

static CONTAINER_PORT: Obj = values(&[open("containerPort"), open("name"), open("protocol")]);

static RESOURCES: Obj = values(&[open("limits"), open("requests")]);

static PROBE: Obj = values(&[
    obj("exec", &EXEC),
    obj("httpGet", &HTTP_GET),
    obj("tcpSocket", &TCP_SOCKET),
    obj("grpc", &GRPC),
    open("initialDelaySeconds"),
    open("timeoutSeconds"),
    open("periodSeconds"),
    open("successThreshold"),
    open("failureThreshold"),
]);

static EXEC: Obj = values(&[open("command")]);
static HTTP_GET: Obj = values(&[
    open("host"),
    open("path"),
    open("scheme"),
    open("httpHeaders"),
    open("port"),
]);
static TCP_SOCKET: Obj = values(&[open("host"), open("port")]);
static GRPC: Obj = values(&[open("port"), open("service")]);

static VOLUME_MOUNT: Obj = values(&[
    open("name"),
    open("readOnly"),
    open("mountPath"),
    open("subPath"),
    keyed("mountPropagation", key::VOLUMES_MOUNT_PROPAGATION),
]);

static VOLUME: Obj = values(&[
    open("name"),
    open("secret"),
    open("configMap"),
    obj("projected", &PROJECTED),
    keyed("emptyDir", key::VOLUMES_EMPTYDIR),
    keyed("persistentVolumeClaim", key::PERSISTENT_VOLUME_CLAIM),
    keyed("hostPath", key::VOLUMES_HOSTPATH),
    keyed("csi", key::VOLUMES_CSI),
    keyed("image", key::VOLUMES_IMAGE),
]);

static PROJECTED: Obj = values(&[list("sources", &PROJECTION), open("defaultMode")]);

static PROJECTION: Obj = values(&[
    obj("secret", &KEYS_PROJECTION),
    obj("configMap", &KEYS_PROJECTION),
    obj("serviceAccountToken", &TOKEN_PROJECTION),
    open("downwardAPI"),
]);

static KEYS_PROJECTION: Obj =
    values(&[open("name"), list("items", &KEY_TO_PATH), open("optional")]);

static KEY_TO_PATH: Obj = values(&[open("key"), open("path"), open("mode")]);

static TOKEN_PROJECTION: Obj = values(&[open("audience"), open("expirationSeconds"), open("path")]);

/// The one capability a container may add without `kubernetes.containerspec-addcapabilities`.
pub const NET_BIND_SERVICE: &str = "NET_BIND_SERVICE";

/// Go's zero value: not set. An object is always set: struct fields are pointers in
/// Kubernetes' Go types (`emptyDir: {}` is an emptyDir volume).
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(_) => false,
    }
}

/// Why a set field is closed: `None` when it is open.
enum Closed {
    /// Opened by this key.
    Key(&'static str),
    /// Not in the table: no key opens it.
    Never,
    OnlyFalse,
    AddCapabilities,
}

fn gate(field: Option<&Field>, value: &Value, f: &FeaturesConfig) -> Option<Closed> {
    let Some(field) = field else {
        return Some(Closed::Never);
    };
    match field.gate {
        Gate::Open => None,
        Gate::Key(k) => (!f.flag(k).is_some_and(|fl| fl.open())).then_some(Closed::Key(k)),
        Gate::OnlyFalse => (value != &Value::Bool(false)).then_some(Closed::OnlyFalse),
        Gate::AddCapabilities => {
            let only_bind = value
                .as_array()
                .is_some_and(|a| a.iter().all(|c| c.as_str() == Some(NET_BIND_SERVICE)));
            (!only_bind && !f.containerspec_add_capabilities.open())
                .then_some(Closed::AddCapabilities)
        }
    }
}

fn error(path: String, why: Closed) -> FieldError {
    let e = FieldError::new(path, "must not set the field(s)");
    match why {
        Closed::Key(k) => e.details(closed_by(k)),
        Closed::Never => {
            e.details("not allowed in a Knative Service; no config-features key opens it")
        }
        Closed::OnlyFalse => e.details("automountServiceAccountToken may only be set to false"),
        Closed::AddCapabilities => e.details(format!(
            "{} ({NET_BIND_SERVICE} alone needs no key)",
            closed_by(key::ADD_CAPABILITIES)
        )),
    }
}

/// Walks `map` against `table`: reports (into `errors`) or removes (when `prune`) every set
/// field that is closed, then descends into the open ones.
fn walk(
    map: &mut Map<String, Value>,
    table: &Obj,
    at: &str,
    f: &FeaturesConfig,
    errors: &mut Vec<FieldError>,
    prune: bool,
) {
    let mut closed = Vec::new();
    for (name, value) in map.iter_mut() {
        if !table.pointers && is_zero(value) || value.is_null() {
            continue;
        }
        let field = table.fields.iter().find(|fl| fl.name == name);
        let path = format!("{at}.{name}");
        if let Some(why) = gate(field, value, f) {
            closed.push(name.clone());
            if !prune {
                errors.push(error(path, why));
            }
            continue;
        }
        match (field.map(|fl| fl.shape), value) {
            (Some(Shape::Obj(o)), Value::Object(m)) => walk(m, o, &path, f, errors, prune),
            (Some(Shape::List(o)), Value::Array(items)) => {
                for (i, item) in items.iter_mut().enumerate() {
                    if let Value::Object(m) = item {
                        walk(m, o, &format!("{path}[{i}]"), f, errors, prune);
                    }
                }
            }
            _ => {}
        }
    }
    if prune {
        for name in closed {
            map.remove(&name);
        }
    }
}

fn as_map(ps: &PodSpec) -> Map<String, Value> {
    match serde_json::to_value(ps) {
        Ok(Value::Object(m)) => m,
        // A PodSpec always serializes to an object.
        _ => Map::new(),
    }
}

/// Every closed field set in `ps` (at `at`, e.g. `spec.template.spec`), in the order found.
pub fn check(ps: &PodSpec, f: &FeaturesConfig, at: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    walk(&mut as_map(ps), &POD_SPEC, at, f, &mut errors, false);
    errors
}

/// `ps` with every closed field dropped: what may reach a Deployment.
pub fn mask(ps: &PodSpec, f: &FeaturesConfig) -> PodSpec {
    let mut m = as_map(ps);
    walk(&mut m, &POD_SPEC, "", f, &mut Vec::new(), true);
    // Dropping fields from a valid PodSpec leaves a valid PodSpec (`containers` is open).
    serde_json::from_value(Value::Object(m)).unwrap_or_default()
}

#[cfg(test)]
mod tests;
