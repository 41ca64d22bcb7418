use serde_json::{Value, json};

use super::*;
use crate::config::ConfigMap;
use crate::knative::validate::{self, render};

/// One masked field: how to set it, where it shows, and the key that opens it (`None`: none).
struct Case {
    /// Merged into the pod spec.
    pod: Value,
    /// Merged into the first container.
    container: Value,
    /// The field's path under the pod spec.
    path: &'static str,
    key: Option<&'static str>,
}

fn pod(p: Value) -> Case {
    Case {
        pod: p,
        container: json!({}),
        path: "",
        key: None,
    }
}

fn ctr(c: Value) -> Case {
    Case {
        pod: json!({}),
        container: c,
        path: "",
        key: None,
    }
}

impl Case {
    fn at(mut self, path: &'static str, key: Option<&'static str>) -> Self {
        self.path = path;
        self.key = key;
        self
    }

    fn spec(&self) -> PodSpec {
        let mut container =
            json!({"image": "registry.example/app", "ports": [{"containerPort": 8080}]});
        merge(&mut container, &self.container);
        let mut p = json!({"containers": [container]});
        merge(&mut p, &self.pod);
        serde_json::from_value(p).unwrap()
    }
}

fn merge(into: &mut Value, from: &Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        for (k, v) in b {
            a.insert(k.clone(), v.clone());
        }
    }
}

/// Every field Knative masks, closed by default (emptyDir aside: it is open by default).
fn cases() -> Vec<Case> {
    use key::*;
    vec![
        pod(json!({"hostNetwork": true})).at("hostNetwork", Some(HOST_NETWORK)),
        pod(json!({"hostPID": true})).at("hostPID", Some(HOST_PID)),
        pod(json!({"hostIPC": true})).at("hostIPC", Some(HOST_IPC)),
        pod(json!({"shareProcessNamespace": true}))
            .at("shareProcessNamespace", Some(SHARE_PROCESS_NAMESPACE)),
        pod(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]}}}}))
            .at("affinity", Some(AFFINITY)),
        pod(json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule"}]}))
            .at("topologySpreadConstraints", Some(TOPOLOGY_SPREAD_CONSTRAINTS)),
        pod(json!({"hostAliases": [{"ip": "10.0.0.1", "hostnames": ["db"]}]}))
            .at("hostAliases", Some(HOST_ALIASES)),
        pod(json!({"nodeSelector": {"disk": "ssd"}})).at("nodeSelector", Some(NODE_SELECTOR)),
        pod(json!({"runtimeClassName": "gvisor"})).at("runtimeClassName", Some(RUNTIME_CLASS_NAME)),
        pod(json!({"tolerations": [{"key": "k", "operator": "Exists"}]}))
            .at("tolerations", Some(TOLERATIONS)),
        pod(json!({"priorityClassName": "high"})).at("priorityClassName", Some(PRIORITY_CLASS_NAME)),
        pod(json!({"schedulerName": "custom"})).at("schedulerName", Some(SCHEDULER_NAME)),
        pod(json!({"initContainers": [{"name": "init", "image": "busybox"}]}))
            .at("initContainers", Some(INIT_CONTAINERS)),
        pod(json!({"dnsPolicy": "None"})).at("dnsPolicy", Some(DNS_POLICY)),
        pod(json!({"dnsConfig": {"nameservers": ["1.1.1.1"]}})).at("dnsConfig", Some(DNS_CONFIG)),
        pod(json!({"securityContext": {"runAsUser": 1000}}))
            .at("securityContext.runAsUser", Some(SECURITY_CONTEXT)),
        pod(json!({"securityContext": {"fsGroup": 2000}}))
            .at("securityContext.fsGroup", Some(SECURITY_CONTEXT)),
        ctr(json!({"env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}))
            .at("containers[0].env[0].valueFrom.fieldRef", Some(FIELD_REF)),
        ctr(json!({"env": [{"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]}))
            .at("containers[0].env[0].valueFrom.resourceFieldRef", Some(FIELD_REF)),
        pod(json!({"volumes": [{"name": "node", "hostPath": {"path": "/"}}]}))
            .at("volumes[0].hostPath", Some(VOLUMES_HOSTPATH)),
        pod(json!({"volumes": [{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}]}))
            .at("volumes[0].csi", Some(VOLUMES_CSI)),
        pod(json!({"volumes": [{"name": "i", "image": {"reference": "registry.example/data"}}]}))
            .at("volumes[0].image", Some(VOLUMES_IMAGE)),
        pod(json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}))
            .at("volumes[0].persistentVolumeClaim", Some(PERSISTENT_VOLUME_CLAIM)),
        ctr(json!({"volumeMounts": [{"name": "v", "mountPath": "/v",
            "mountPropagation": "Bidirectional"}]}))
            .at("containers[0].volumeMounts[0].mountPropagation", Some(VOLUMES_MOUNT_PROPAGATION)),
        ctr(json!({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}))
            .at("containers[0].securityContext.capabilities.add", Some(ADD_CAPABILITIES)),
        // Never open.
        ctr(json!({"securityContext": {"privileged": true}}))
            .at("containers[0].securityContext.privileged", None),
        ctr(json!({"securityContext": {"privileged": false}}))
            .at("containers[0].securityContext.privileged", None),
        ctr(json!({"securityContext": {"procMount": "Unmasked"}}))
            .at("containers[0].securityContext.procMount", None),
        ctr(json!({"securityContext": {"seLinuxOptions": {"level": "s0"}}}))
            .at("containers[0].securityContext.seLinuxOptions", None),
        pod(json!({"securityContext": {"seLinuxOptions": {"level": "s0"}}}))
            .at("securityContext.seLinuxOptions", None),
        pod(json!({"securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "0"}]}}))
            .at("securityContext.sysctls", None),
        ctr(json!({"ports": [{"containerPort": 8080, "hostPort": 80}]}))
            .at("containers[0].ports[0].hostPort", None),
        ctr(json!({"ports": [{"containerPort": 8080, "hostIP": "0.0.0.0"}]}))
            .at("containers[0].ports[0].hostIP", None),
        ctr(json!({"volumeDevices": [{"name": "raw", "devicePath": "/dev/xvda"}]}))
            .at("containers[0].volumeDevices", None),
        ctr(json!({"lifecycle": {"postStart": {"exec": {"command": ["true"]}}}}))
            .at("containers[0].lifecycle", None),
        ctr(json!({"stdin": true})).at("containers[0].stdin", None),
        ctr(json!({"tty": true})).at("containers[0].tty", None),
        pod(json!({"nodeName": "node-1"})).at("nodeName", None),
        pod(json!({"hostname": "h"})).at("hostname", None),
        pod(json!({"terminationGracePeriodSeconds": 5})).at("terminationGracePeriodSeconds", None),
        pod(json!({"activeDeadlineSeconds": 5})).at("activeDeadlineSeconds", None),
        pod(json!({"restartPolicy": "Never"})).at("restartPolicy", None),
        pod(json!({"volumes": [{"name": "n", "nfs": {"server": "nfs", "path": "/"}}]}))
            .at("volumes[0].nfs", None),
        pod(json!({"automountServiceAccountToken": true})).at("automountServiceAccountToken", None),
        ctr(json!({"livenessProbe": {"tcpSocket": {"port": 8080}, "terminationGracePeriodSeconds": 1}}))
            .at("containers[0].livenessProbe.terminationGracePeriodSeconds", None),
    ]
}

/// The value at `path` (`a.b[0].c`) of `v`.
fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for part in path.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((n, i)) => (n, Some(i.trim_end_matches(']').parse::<usize>().unwrap())),
            None => (part, None),
        };
        cur = cur.get(name)?;
        if let Some(i) = index {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

fn features(pairs: &[(&str, &str)]) -> FeaturesConfig {
    let data = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    FeaturesConfig::parse(&data).unwrap().config
}

#[test]
fn every_closed_field_is_refused_naming_it_and_the_key_that_opens_it() {
    let closed = FeaturesConfig::default();
    for c in cases() {
        let ps = c.spec();
        let errors = check(&ps, &closed, "spec.template.spec");
        let want = format!("spec.template.spec.{}", c.path);
        let e = errors
            .iter()
            .find(|e| e.path == want)
            .unwrap_or_else(|| panic!("{want} not refused: {errors:?}"));
        assert_eq!(e.message, "must not set the field(s)");
        let details = e.details.as_deref().unwrap_or("");
        match c.key {
            Some(k) => assert!(details.contains(&format!("\"{k}: enabled\"")), "{details}"),
            None if c.path.ends_with("automountServiceAccountToken") => {
                assert!(details.contains("only be set to false"), "{details}")
            }
            None => assert!(
                details.contains("no config-features key opens it"),
                "{details}"
            ),
        }
        // The masked pod spec has none of it.
        let masked = serde_json::to_value(mask(&ps, &closed)).unwrap();
        assert_eq!(
            lookup(&masked, c.path),
            None,
            "{} survived the mask",
            c.path
        );
        assert_eq!(
            masked["containers"][0]["image"], "registry.example/app",
            "what is open stays"
        );
    }
}

#[test]
fn every_key_opens_its_field() {
    for c in cases() {
        let ps = c.spec();
        let Some(k) = c.key else {
            // No key opens it: not even all of them together.
            let all: Vec<(&str, &str)> = crate::config::features::KEYS
                .iter()
                .filter(|k| k.name != key::SECURE_POD_DEFAULTS)
                .map(|k| (k.name, "enabled"))
                .collect();
            let errors = check(&ps, &features(&all), "spec");
            assert!(
                errors.iter().any(|e| e.path == format!("spec.{}", c.path)),
                "{} opened by some key",
                c.path
            );
            continue;
        };
        for value in ["enabled", "allowed"] {
            let open = features(&[(k, value)]);
            let errors = check(&ps, &open, "spec");
            assert!(errors.is_empty(), "{k}: {value} leaves {errors:?}");
            let masked = serde_json::to_value(mask(&ps, &open)).unwrap();
            assert!(
                lookup(&masked, c.path).is_some(),
                "{} masked with {k} open",
                c.path
            );
        }
    }
}

#[test]
fn emptydir_is_open_by_default_and_closed_by_its_key() {
    let ps: PodSpec = serde_json::from_value(json!({
        "containers": [{"image": "a", "volumeMounts": [{"name": "t", "mountPath": "/tmp"}]}],
        "volumes": [{"name": "t", "emptyDir": {}}],
    }))
    .unwrap();
    assert_eq!(check(&ps, &FeaturesConfig::default(), "spec"), []);
    let closed = features(&[(key::VOLUMES_EMPTYDIR, "disabled")]);
    let errors = check(&ps, &closed, "spec");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.volumes[0].emptyDir");
}

#[test]
fn what_knative_always_allows_passes_untouched() {
    let ps: PodSpec = serde_json::from_value(json!({
        "serviceAccountName": "app",
        "imagePullSecrets": [{"name": "regcred"}],
        "enableServiceLinks": false,
        "automountServiceAccountToken": false,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "app", "image": "a", "args": ["x"], "command": ["/app"], "workingDir": "/",
            "imagePullPolicy": "Always",
            "env": [{"name": "A", "value": "1"},
                    {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            "envFrom": [{"prefix": "P_", "configMapRef": {"name": "c"}}],
            "ports": [{"containerPort": 8080, "name": "http1", "protocol": "TCP"}],
            "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "64Mi"}},
            "readinessProbe": {"httpGet": {"path": "/", "port": 8080,
                "httpHeaders": [{"name": "X", "value": "y"}]}, "periodSeconds": 1},
            "livenessProbe": {"grpc": {"port": 8080, "service": "health"}},
            "startupProbe": {"exec": {"command": ["true"]}, "failureThreshold": 3},
            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                "runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                "seccompProfile": {"type": "RuntimeDefault"}},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [{"name": "s", "mountPath": "/s", "readOnly": true, "subPath": "x"},
                             {"name": "p", "mountPath": "/p", "readOnly": true}],
        }],
        "volumes": [
            {"name": "s", "secret": {"secretName": "s"}},
            {"name": "p", "projected": {"sources": [
                {"serviceAccountToken": {"audience": "vault", "path": "token"}},
                {"configMap": {"name": "c", "items": [{"key": "a", "path": "a"}]}},
                {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            ]}},
        ],
    }))
    .unwrap();
    let f = FeaturesConfig::default();
    assert_eq!(check(&ps, &f, "spec"), []);
    assert_eq!(mask(&ps, &f), ps, "nothing closed, nothing dropped");
}

#[test]
fn zero_values_outside_security_contexts_are_unset_as_in_go() {
    let ps: PodSpec = serde_json::from_value(json!({
        "hostNetwork": false, "hostPID": false, "nodeName": "",
        "containers": [{"image": "a", "stdin": false, "tty": false,
            "ports": [{"containerPort": 8080, "hostPort": 0}]}],
    }))
    .unwrap();
    assert_eq!(check(&ps, &FeaturesConfig::default(), "spec"), []);
}

#[test]
fn the_validation_renders_the_refusal_with_the_key() {
    let ps = pod(json!({"hostNetwork": true, "hostPID": true})).spec();
    let rev: crate::knative::Revision = serde_json::from_value(json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
        "metadata": {"name": "r", "namespace": "default"},
        "spec": serde_json::to_value(&ps).unwrap(),
    }))
    .unwrap();
    let errors = validate::revision(
        &rev,
        &Default::default(),
        &Default::default(),
        &FeaturesConfig::default(),
    );
    let text = render(&errors);
    assert!(
        text.contains(
            "must not set the field(s): spec.hostNetwork\nclosed by config-features; \
             \"kubernetes.podspec-hostnetwork: enabled\" in config-features opens it"
        ),
        "{text}"
    );
    assert!(text.contains("kubernetes.podspec-hostpid"), "{text}");
}
