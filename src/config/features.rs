//! `config-features`: Knative's feature flags that open pod-spec fields to Service authors
//! (`serving:pkg/apis/config/features.go`), keys, defaults and validation.
//!
//! Each `kubernetes.*` key opens one field (or one kind of volume) of the revision's pod spec
//! that Knative's field masks ([`crate::knative::fieldmask`]) keep closed by default: `enabled`
//! or `allowed` opens it, `disabled` (the default of every key but
//! `kubernetes.podspec-volumes-emptydir` and `multi-container`) keeps it closed. A revision that
//! uses a closed field is refused, naming the field and the key that would open it.
//!
//! - `secure-pod-defaults` (`disabled`, `allow-root-bounded`, `enabled`): the security
//!   context thaw writes into each user container of the revision's Deployment when the author
//!   left it out (see [`SecurePodDefaults`]).
//! - `kubernetes.podspec-dryrun` (`allowed` by default, as Knative had it): `enabled` dry-runs a
//!   Pod of every revision against the API server before its Deployment is written, so a
//!   namespace's Pod Security or a quota refusing it shows on the revision; `allowed` does it
//!   for templates annotated `features.knative.dev/podspec-dryrun: enabled`.
//! - `multi-container` (`enabled`): `disabled` refuses pod specs with more than one container.
//!
//! Values are matched without regard to case, as Knative does. A value that is none of them
//! keeps the key's default, as Knative's `asFlag` does, and is named as a key with no effect
//! (a warning, [`super::keys`]'s rule): it never rejects the ConfigMap.
//!
//! No key opens `privileged`, `procMount`, `seLinuxOptions` (pod or container) or
//! `windowsOptions`, `sysctls`, `volumeDevices`, `lifecycle`, `hostPort`: as in Knative.

use std::collections::BTreeMap;

use serde_json::Value;

use super::keys::{ConfigMap, Key, Parsed};
use super::parse::{Problem, Problems};

/// Name of the ConfigMap.
pub const NAME: &str = "config-features";

/// A feature flag's value (Knative's `Flag`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    Enabled,
    Allowed,
    Disabled,
}

impl Flag {
    /// Whether a field behind this flag may be set (`enabled` or `allowed`).
    pub fn open(self) -> bool {
        self != Flag::Disabled
    }

    fn text(self) -> &'static str {
        match self {
            Flag::Enabled => "enabled",
            Flag::Allowed => "allowed",
            Flag::Disabled => "disabled",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        [Flag::Enabled, Flag::Allowed, Flag::Disabled]
            .into_iter()
            .find(|f| s.eq_ignore_ascii_case(f.text()))
            .ok_or_else(|| "expected enabled, allowed or disabled".into())
    }
}

/// `secure-pod-defaults`: what thaw fills into a user container's security context that the
/// author left unset (Knative's defaulting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurePodDefaults {
    /// Nothing is added.
    Disabled,
    /// `allowPrivilegeEscalation: false`, `capabilities: {drop: [ALL]}` (plus
    /// `add: [NET_BIND_SERVICE]` for a port below 1024), and `seccompProfile: RuntimeDefault`
    /// unless the pod sets one: Pod Security `restricted` except for running as root.
    AllowRootBounded,
    /// All of the above and `runAsNonRoot: true` unless the pod sets it: Pod Security
    /// `restricted`.
    Enabled,
}

impl SecurePodDefaults {
    fn text(self) -> &'static str {
        match self {
            SecurePodDefaults::Disabled => "disabled",
            SecurePodDefaults::AllowRootBounded => "allow-root-bounded",
            SecurePodDefaults::Enabled => "enabled",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        // Knative spells the middle value `AllowRootBounded`; the hyphenated form is accepted too.
        let norm: String = s.chars().filter(|c| *c != '-').collect();
        [
            SecurePodDefaults::Disabled,
            SecurePodDefaults::AllowRootBounded,
            SecurePodDefaults::Enabled,
        ]
        .into_iter()
        .find(|f| {
            let t: String = f.text().chars().filter(|c| *c != '-').collect();
            norm.eq_ignore_ascii_case(&t)
        })
        .ok_or_else(|| "expected enabled, allow-root-bounded or disabled".into())
    }
}

/// Knative's `Features`, the flags thaw applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeaturesConfig {
    pub multi_container: Flag,
    pub podspec_affinity: Flag,
    pub podspec_topology_spread_constraints: Flag,
    pub podspec_dryrun: Flag,
    pub podspec_host_aliases: Flag,
    pub podspec_field_ref: Flag,
    pub podspec_node_selector: Flag,
    pub podspec_runtime_class_name: Flag,
    pub podspec_security_context: Flag,
    pub podspec_priority_class_name: Flag,
    pub podspec_scheduler_name: Flag,
    pub podspec_tolerations: Flag,
    pub podspec_volumes_emptydir: Flag,
    pub podspec_volumes_hostpath: Flag,
    pub podspec_volumes_csi: Flag,
    pub podspec_volumes_image: Flag,
    pub podspec_volumes_mount_propagation: Flag,
    pub podspec_persistent_volume_claim: Flag,
    pub podspec_persistent_volume_write: Flag,
    pub podspec_init_containers: Flag,
    pub podspec_dns_policy: Flag,
    pub podspec_dns_config: Flag,
    pub podspec_host_ipc: Flag,
    pub podspec_host_pid: Flag,
    pub podspec_host_network: Flag,
    pub podspec_share_process_namespace: Flag,
    pub containerspec_add_capabilities: Flag,
    pub secure_pod_defaults: SecurePodDefaults,
}

impl Default for FeaturesConfig {
    fn default() -> Self {
        use Flag::{Allowed, Disabled, Enabled};
        Self {
            multi_container: Enabled,
            podspec_affinity: Disabled,
            podspec_topology_spread_constraints: Disabled,
            podspec_dryrun: Allowed,
            podspec_host_aliases: Disabled,
            podspec_field_ref: Disabled,
            podspec_node_selector: Disabled,
            podspec_runtime_class_name: Disabled,
            podspec_security_context: Disabled,
            podspec_priority_class_name: Disabled,
            podspec_scheduler_name: Disabled,
            podspec_tolerations: Disabled,
            podspec_volumes_emptydir: Enabled,
            podspec_volumes_hostpath: Disabled,
            podspec_volumes_csi: Disabled,
            podspec_volumes_image: Disabled,
            podspec_volumes_mount_propagation: Disabled,
            podspec_persistent_volume_claim: Disabled,
            podspec_persistent_volume_write: Disabled,
            podspec_init_containers: Disabled,
            podspec_dns_policy: Disabled,
            podspec_dns_config: Disabled,
            podspec_host_ipc: Disabled,
            podspec_host_pid: Disabled,
            podspec_host_network: Disabled,
            podspec_share_process_namespace: Disabled,
            containerspec_add_capabilities: Disabled,
            secure_pod_defaults: SecurePodDefaults::Disabled,
        }
    }
}

/// Key names, for the refusal messages that name the key opening a field.
pub mod key {
    pub const MULTI_CONTAINER: &str = "multi-container";
    pub const AFFINITY: &str = "kubernetes.podspec-affinity";
    pub const TOPOLOGY_SPREAD_CONSTRAINTS: &str = "kubernetes.podspec-topologyspreadconstraints";
    pub const DRYRUN: &str = "kubernetes.podspec-dryrun";
    pub const HOST_ALIASES: &str = "kubernetes.podspec-hostaliases";
    pub const FIELD_REF: &str = "kubernetes.podspec-fieldref";
    pub const NODE_SELECTOR: &str = "kubernetes.podspec-nodeselector";
    pub const RUNTIME_CLASS_NAME: &str = "kubernetes.podspec-runtimeclassname";
    pub const SECURITY_CONTEXT: &str = "kubernetes.podspec-securitycontext";
    pub const PRIORITY_CLASS_NAME: &str = "kubernetes.podspec-priorityclassname";
    pub const SCHEDULER_NAME: &str = "kubernetes.podspec-schedulername";
    pub const TOLERATIONS: &str = "kubernetes.podspec-tolerations";
    pub const VOLUMES_EMPTYDIR: &str = "kubernetes.podspec-volumes-emptydir";
    pub const VOLUMES_HOSTPATH: &str = "kubernetes.podspec-volumes-hostpath";
    pub const VOLUMES_CSI: &str = "kubernetes.podspec-volumes-csi";
    pub const VOLUMES_IMAGE: &str = "kubernetes.podspec-volumes-image";
    pub const VOLUMES_MOUNT_PROPAGATION: &str = "kubernetes.podspec-volumes-mount-propagation";
    pub const PERSISTENT_VOLUME_CLAIM: &str = "kubernetes.podspec-persistent-volume-claim";
    pub const PERSISTENT_VOLUME_WRITE: &str = "kubernetes.podspec-persistent-volume-write";
    pub const INIT_CONTAINERS: &str = "kubernetes.podspec-init-containers";
    pub const DNS_POLICY: &str = "kubernetes.podspec-dnspolicy";
    pub const DNS_CONFIG: &str = "kubernetes.podspec-dnsconfig";
    pub const HOST_IPC: &str = "kubernetes.podspec-hostipc";
    pub const HOST_PID: &str = "kubernetes.podspec-hostpid";
    pub const HOST_NETWORK: &str = "kubernetes.podspec-hostnetwork";
    pub const SHARE_PROCESS_NAMESPACE: &str = "kubernetes.podspec-shareprocessnamespace";
    pub const ADD_CAPABILITIES: &str = "kubernetes.containerspec-addcapabilities";
    pub const SECURE_POD_DEFAULTS: &str = "secure-pod-defaults";
}

/// The template annotation that asks for a dry run when `kubernetes.podspec-dryrun` is
/// `allowed` (Knative's).
pub const DRYRUN_ANNOTATION: &str = "features.knative.dev/podspec-dryrun";

impl FeaturesConfig {
    /// The flag behind a `kubernetes.*` / `multi-container` key of [`key`].
    pub fn flag(&self, name: &str) -> Option<Flag> {
        KEYS.iter()
            .position(|k| k.name == name)
            .and_then(|i| FLAGS.get(i))
            .map(|get| get(self))
    }
}

macro_rules! flag_keys {
    ($( $name:expr => $field:ident, $help:expr; )*) => {
        /// Every key of `config-features`, in the order `thaw config check` prints them
        /// (`secure-pod-defaults` last).
        pub static KEYS: &[Key<FeaturesConfig>] = &[
            $( Key {
                name: $name,
                unit: "enabled, allowed or disabled",
                help: $help,
                parse: |c, s| { c.$field = Flag::parse(s)?; Ok(()) },
                show: |c| (c.$field.text().into(), Value::from(c.$field.text())),
            }, )*
            Key {
                name: key::SECURE_POD_DEFAULTS,
                unit: "enabled, allow-root-bounded or disabled",
                help: "Security context written into user containers that leave it unset.",
                parse: |c, s| { c.secure_pod_defaults = SecurePodDefaults::parse(s)?; Ok(()) },
                show: |c| (c.secure_pod_defaults.text().into(),
                           Value::from(c.secure_pod_defaults.text())),
            },
        ];
        /// The flag of each key of [`KEYS`] but the last, by position.
        static FLAGS: &[fn(&FeaturesConfig) -> Flag] = &[ $( |c| c.$field, )* ];
    };
}

flag_keys! {
    key::MULTI_CONTAINER => multi_container,
        "More than one container in a revision's pod.";
    key::AFFINITY => podspec_affinity,
        "spec.affinity in the pod spec.";
    key::TOPOLOGY_SPREAD_CONSTRAINTS => podspec_topology_spread_constraints,
        "spec.topologySpreadConstraints in the pod spec.";
    key::DRYRUN => podspec_dryrun,
        "Dry-run a Pod of each revision before its Deployment (allowed: when annotated).";
    key::HOST_ALIASES => podspec_host_aliases,
        "spec.hostAliases in the pod spec.";
    key::FIELD_REF => podspec_field_ref,
        "env[].valueFrom.fieldRef and resourceFieldRef in containers.";
    key::NODE_SELECTOR => podspec_node_selector,
        "spec.nodeSelector in the pod spec.";
    key::RUNTIME_CLASS_NAME => podspec_runtime_class_name,
        "spec.runtimeClassName in the pod spec.";
    key::SECURITY_CONTEXT => podspec_security_context,
        "spec.securityContext's runAsUser, runAsGroup, runAsNonRoot, fsGroup, supplementalGroups.";
    key::PRIORITY_CLASS_NAME => podspec_priority_class_name,
        "spec.priorityClassName in the pod spec.";
    key::SCHEDULER_NAME => podspec_scheduler_name,
        "spec.schedulerName in the pod spec.";
    key::TOLERATIONS => podspec_tolerations,
        "spec.tolerations in the pod spec.";
    key::VOLUMES_EMPTYDIR => podspec_volumes_emptydir,
        "emptyDir volumes.";
    key::VOLUMES_HOSTPATH => podspec_volumes_hostpath,
        "hostPath volumes (a directory of the node).";
    key::VOLUMES_CSI => podspec_volumes_csi,
        "csi volumes.";
    key::VOLUMES_IMAGE => podspec_volumes_image,
        "image volumes.";
    key::VOLUMES_MOUNT_PROPAGATION => podspec_volumes_mount_propagation,
        "volumeMounts[].mountPropagation in containers.";
    key::PERSISTENT_VOLUME_CLAIM => podspec_persistent_volume_claim,
        "persistentVolumeClaim volumes (read-only unless persistent-volume-write).";
    key::PERSISTENT_VOLUME_WRITE => podspec_persistent_volume_write,
        "persistentVolumeClaim volumes and mounts that are not read-only.";
    key::INIT_CONTAINERS => podspec_init_containers,
        "spec.initContainers in the pod spec.";
    key::DNS_POLICY => podspec_dns_policy,
        "spec.dnsPolicy in the pod spec.";
    key::DNS_CONFIG => podspec_dns_config,
        "spec.dnsConfig in the pod spec.";
    key::HOST_IPC => podspec_host_ipc,
        "spec.hostIPC: the node's IPC namespace.";
    key::HOST_PID => podspec_host_pid,
        "spec.hostPID: the node's process namespace.";
    key::HOST_NETWORK => podspec_host_network,
        "spec.hostNetwork: the node's network namespace.";
    key::SHARE_PROCESS_NAMESPACE => podspec_share_process_namespace,
        "spec.shareProcessNamespace in the pod spec.";
    key::ADD_CAPABILITIES => containerspec_add_capabilities,
        "securityContext.capabilities.add beyond NET_BIND_SERVICE in containers.";
}

impl ConfigMap for FeaturesConfig {
    const NAME: &'static str = NAME;
    /// Knative keys with no effect in thaw: probing of every container, the sidecar's pod-info
    /// mount and resource defaults, tag header routing, HTTP/2 detection.
    const INERT: &'static [&'static str] = &[
        "multi-container-probing",
        "queueproxy.mount-podinfo",
        "queueproxy.resource-defaults",
        "tag-header-based-routing",
        "autodetect-http2",
    ];

    fn keys() -> &'static [Key<Self>] {
        KEYS
    }

    fn validate(&self, _data: &BTreeMap<String, String>) -> Vec<Problem> {
        Vec::new()
    }

    /// As every ConfigMap, except that a value no flag has keeps the key's default and is a
    /// warning, not a problem (Knative's `asFlag`).
    fn parse(data: &BTreeMap<String, String>) -> Result<Parsed<Self>, Problems> {
        let (known, mut unknown) = split_unknown_values(data);
        let mut parsed = super::keys::parse_data(KEYS, Self::INERT, &known, Self::validate)?;
        parsed.warnings.append(&mut unknown);
        Ok(parsed)
    }

    fn warnings(data: &BTreeMap<String, String>) -> Vec<String> {
        let (_, unknown) = split_unknown_values(data);
        let mut w = super::keys::warnings(KEYS, Self::INERT, data);
        w.extend(unknown);
        w
    }
}

/// `data` without the keys whose value is none of the key's values, and a warning for each of
/// those: the key keeps its default, as in Knative.
fn split_unknown_values(
    data: &BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let defaults = FeaturesConfig::default();
    let mut known = data.clone();
    let mut warnings = Vec::new();
    for key in KEYS {
        let Some(value) = data.get(key.name) else {
            continue;
        };
        if let Err(reason) = (key.parse)(&mut FeaturesConfig::default(), value.trim()) {
            known.remove(key.name);
            warnings.push(format!(
                "{}: {value:?} is not a value of the key ({reason}): its default, {}, stays in \
                 force, as in Knative",
                key.name,
                (key.show)(&defaults).0
            ));
        }
    }
    (known, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<FeaturesConfig, crate::config::Problems> {
        let data = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        FeaturesConfig::parse(&data).map(|p| p.config)
    }

    #[test]
    fn defaults_are_knatives() {
        let c = parse(&[]).unwrap();
        assert_eq!(c, FeaturesConfig::default());
        assert_eq!(c.flag(key::VOLUMES_EMPTYDIR), Some(Flag::Enabled));
        assert_eq!(c.flag(key::HOST_NETWORK), Some(Flag::Disabled));
        assert_eq!(c.flag(key::MULTI_CONTAINER), Some(Flag::Enabled));
        assert_eq!(c.flag(key::DRYRUN), Some(Flag::Allowed));
        assert_eq!(
            c.flag(key::SECURE_POD_DEFAULTS),
            None,
            "not an open/closed flag"
        );
        assert_eq!(c.secure_pod_defaults, SecurePodDefaults::Disabled);
    }

    #[test]
    fn every_key_is_read_without_regard_to_case() {
        let c = parse(&[
            (key::HOST_NETWORK, "Enabled"),
            (key::TOLERATIONS, "ALLOWED"),
            (key::VOLUMES_EMPTYDIR, "disabled"),
            (key::SECURE_POD_DEFAULTS, "AllowRootBounded"),
        ])
        .unwrap();
        assert_eq!(c.podspec_host_network, Flag::Enabled);
        assert_eq!(c.podspec_tolerations, Flag::Allowed);
        assert!(c.podspec_tolerations.open());
        assert_eq!(c.podspec_volumes_emptydir, Flag::Disabled);
        assert_eq!(c.secure_pod_defaults, SecurePodDefaults::AllowRootBounded);
        let c = parse(&[(key::SECURE_POD_DEFAULTS, "allow-root-bounded")]).unwrap();
        assert_eq!(c.secure_pod_defaults, SecurePodDefaults::AllowRootBounded);
        // Every flag key round-trips through its own name.
        for k in KEYS.iter().filter(|k| k.name != key::SECURE_POD_DEFAULTS) {
            let c = parse(&[(k.name, "enabled")]).unwrap();
            assert_eq!(c.flag(k.name), Some(Flag::Enabled), "{}", k.name);
        }
    }

    /// Knative's `asFlag` leaves the default in place for a value it does not know; thaw
    /// does the same, and names the key (with the value and the values it has) as a warning.
    #[test]
    fn a_value_that_is_no_flag_keeps_the_default_and_is_named() {
        let data: BTreeMap<String, String> = [
            (key::HOST_PID.to_string(), "yes".to_string()),
            (key::SECURE_POD_DEFAULTS.to_string(), "on".to_string()),
            (key::VOLUMES_EMPTYDIR.to_string(), "sometimes".to_string()),
            (key::TOLERATIONS.to_string(), "enabled".to_string()),
        ]
        .into();
        let parsed = FeaturesConfig::parse(&data).unwrap();
        let c = &parsed.config;
        assert_eq!(c.podspec_host_pid, Flag::Disabled);
        assert_eq!(c.secure_pod_defaults, SecurePodDefaults::Disabled);
        assert_eq!(c.podspec_volumes_emptydir, Flag::Enabled, "default kept");
        assert_eq!(c.podspec_tolerations, Flag::Enabled, "the good key applies");
        assert!(!parsed.given.contains(key::HOST_PID));
        let w = &parsed.warnings;
        assert_eq!(w.len(), 3, "{w:?}");
        let text = w.join("\n");
        assert!(
            text.contains("kubernetes.podspec-hostpid: \"yes\""),
            "{text}"
        );
        assert!(
            text.contains("expected enabled, allowed or disabled"),
            "{text}"
        );
        assert!(text.contains("secure-pod-defaults"), "{text}");
        assert!(text.contains("allow-root-bounded"), "{text}");
        assert!(text.contains("its default, enabled, stays"), "{text}");
        assert_eq!(FeaturesConfig::warnings(&data), *w);
        let keys: Vec<&str> = w
            .iter()
            .map(|w| crate::config::keys::warning_key(w))
            .collect();
        assert_eq!(
            keys,
            [
                key::VOLUMES_EMPTYDIR,
                key::HOST_PID,
                key::SECURE_POD_DEFAULTS
            ],
            "in the table's order"
        );
    }

    #[test]
    fn knative_keys_thaw_does_not_use_are_warned_about() {
        let data = [("autodetect-http2".to_string(), "enabled".to_string())].into();
        let w = FeaturesConfig::warnings(&data);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("no effect in thaw"), "{w:?}");
    }
}
