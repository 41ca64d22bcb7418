//! From `local.yaml` (and the ConfigMaps it names) to what `thaw local` serves: the configs,
//! and per service the revision it would create for a given generation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::{self as local_config, LocalFile, RevisionTemplateSpec, TrafficTarget};
use crate::config::keys::ConfigMap;
use crate::config::load::parsed_from_manifest;
use crate::config::parse::{Problem, Problems};
use crate::config::revision::{RevisionInput, resolve_revision};
use crate::config::{ConfigSet, annotations};
use crate::revision::{RevisionKey, RevisionSpec};

/// Where a local.yaml came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file; ConfigMap paths are relative to its folder.
    File(PathBuf),
    /// The built-in default (no ConfigMap files: every key at its default).
    Builtin,
}

/// A validated local.yaml with its ConfigMaps loaded.
#[derive(Debug, Clone)]
pub struct LocalModel {
    pub domain: String,
    /// Every replica behind a `thaw queue` sidecar (local.yaml's `sidecar`).
    pub sidecar: bool,
    pub configs: ConfigSet,
    /// The ConfigMap files in use, as (ConfigMap name, absolute path), for live reload.
    pub config_files: Vec<(&'static str, PathBuf)>,
    pub services: Vec<ServiceModel>,
    /// Warnings (unknown annotations, global-only keys as annotations, ConfigMap keys with no
    /// effect in thaw).
    pub warnings: Vec<String>,
    /// Per ConfigMap file in use, its keys with no effect in thaw (for
    /// `thaw_config_ineffective_keys`).
    pub ineffective_keys: Vec<(&'static str, usize)>,
}

/// One service of local.yaml.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceModel {
    pub namespace: String,
    pub name: String,
    /// The revision template; a different template means a new revision.
    pub template: RevisionTemplateSpec,
    /// The route's traffic split (empty: 100 % to the latest ready revision).
    pub traffic: Vec<TrafficTarget>,
}

/// The hosts of a route: the external `{name}.{namespace}.{domain}` and the cluster-local
/// names a client inside a cluster would use (`{name}.{namespace}`, `.svc`,
/// `.svc.cluster.local`), so the same URLs work against `thaw local`.
pub fn route_hosts(name: &str, namespace: &str, domain: &str) -> Vec<String> {
    vec![
        format!("{name}.{namespace}.{domain}"),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.cluster.local"),
    ]
}

/// Knative's revision name: `{service}-{generation:05}`.
pub fn revision_name(service: &str, generation: u64) -> String {
    format!("{service}-{generation:05}")
}

/// The name of the revision `template` makes at `generation`: the template's own
/// `metadata.name` when it gives one (Knative's "bring your own revision name"), else
/// [`revision_name`].
pub fn revision_name_of(service: &str, generation: u64, template: &RevisionTemplateSpec) -> String {
    template
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| revision_name(service, generation))
}

impl ServiceModel {
    pub fn key(&self, generation: u64) -> RevisionKey {
        RevisionKey::new(
            &self.namespace,
            revision_name_of(&self.name, generation, &self.template),
        )
    }

    /// The route host `{service}.{namespace}.{domain}`.
    pub fn route_host(&self, domain: &str) -> String {
        format!("{}.{}.{}", self.name, self.namespace, domain)
    }

    /// The revision this template makes at `generation`, as Knative's Revision spec says it.
    pub fn revision_input(&self, generation: u64, domain: &str) -> RevisionInput {
        let rev = revision_name_of(&self.name, generation, &self.template);
        let spec = &self.template.spec;
        // Validated as [0, u32::MAX] by the parser.
        let secs = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
        RevisionInput {
            namespace: self.namespace.clone(),
            name: rev.clone(),
            service: Some(self.name.clone()),
            container_concurrency: spec
                .container_concurrency
                .and_then(|v| u32::try_from(v).ok()),
            timeout_seconds: secs(spec.timeout_seconds),
            response_start_timeout_seconds: secs(spec.response_start_timeout_seconds),
            idle_timeout_seconds: secs(spec.idle_timeout_seconds),
            port_name: local_config::container_of(&self.template)
                .and_then(local_config::port_name_of),
            annotations: local_config::annotations_of(&self.template),
            hosts: route_hosts(&rev, &self.namespace, domain),
            // Local mode routes every revision it keeps.
            unreachable: false,
            uid: None,
        }
    }

    /// The effective revision spec at `generation` under `configs`.
    pub fn revision_spec(
        &self,
        generation: u64,
        domain: &str,
        configs: &ConfigSet,
    ) -> Result<RevisionSpec, Problems> {
        resolve_revision(&self.revision_input(generation, domain), configs)
    }
}

/// Loads local.yaml and its ConfigMaps and validates every service's revision against them.
/// Every problem of every file is reported; problem keys of a service are prefixed with its
/// path in local.yaml (`services[0].spec.template...`).
pub fn load(source: &Source) -> Result<LocalModel, Problems> {
    let (file, base) = match source {
        Source::File(path) => {
            let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
            (super::config::read(path)?, Some(base))
        }
        Source::Builtin => (
            super::config::parse(super::config::BUILTIN, "built-in local.yaml")?,
            None,
        ),
    };
    from_file(file, base.as_deref())
}

/// Validates a parsed local.yaml; `base` is its folder (`None` for the built-in copy, which
/// uses default ConfigMaps).
pub fn from_file(file: LocalFile, base: Option<&Path>) -> Result<LocalModel, Problems> {
    let mut problems = Vec::new();
    let mut configs = ConfigSet::default();
    let mut config_files = Vec::new();
    let mut config_warnings = Vec::new();
    let mut ineffective_keys = Vec::new();
    if let Some(base) = base {
        let abs = |p: &Path| {
            let p = file.resolve_path(base, p);
            if p.is_absolute() {
                p
            } else {
                std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
            }
        };
        load_into(
            &mut configs.autoscaler,
            &file.config_maps.autoscaler,
            &abs,
            &mut problems,
            &mut config_warnings,
            &mut ineffective_keys,
            &mut config_files,
        );
        load_into(
            &mut configs.defaults,
            &file.config_maps.defaults,
            &abs,
            &mut problems,
            &mut config_warnings,
            &mut ineffective_keys,
            &mut config_files,
        );
        load_into(
            &mut configs.activator,
            &file.config_maps.activator,
            &abs,
            &mut problems,
            &mut config_warnings,
            &mut ineffective_keys,
            &mut config_files,
        );
        load_into(
            &mut configs.gc,
            &file.config_maps.gc,
            &abs,
            &mut problems,
            &mut config_warnings,
            &mut ineffective_keys,
            &mut config_files,
        );
    }
    let mut warnings = local_config::warnings(&file);
    warnings.append(&mut config_warnings);
    let services: Vec<ServiceModel> = file
        .services
        .iter()
        .map(|s| ServiceModel {
            namespace: local_config::namespace_of(s).to_string(),
            name: local_config::name_of(s).to_string(),
            template: s.spec.configuration.template.clone(),
            traffic: s.spec.route.traffic.clone(),
        })
        .collect();
    if problems.is_empty() {
        for (i, s) in services.iter().enumerate() {
            warnings.extend(
                annotations::warnings(
                    &configs.autoscaler,
                    &local_config::annotations_of(&s.template),
                )
                .into_iter()
                .map(|w| format!("services[{i}]: {w}")),
            );
            match s.revision_spec(1, &file.domain, &configs) {
                Ok(spec) => problems.extend(local_class_problem(i, s, &spec)),
                Err(e) => problems.extend(e.0.into_iter().map(|p| Problem {
                    key: format!("services[{i}].{}", field_path(&p.key)),
                    ..p
                })),
            }
        }
    }
    if !problems.is_empty() {
        return Err(Problems(problems));
    }
    Ok(LocalModel {
        domain: file.domain,
        sidecar: file.sidecar,
        configs,
        config_files,
        services,
        warnings,
        ineffective_keys,
    })
}

/// Loads the ConfigMap `T` from `path` (made absolute by `abs`) into `slot`, recording the file
/// for live reload, any problem, and each key with no effect in thaw (a warning naming the
/// file, [`crate::config::keys`]'s rule).
fn load_into<T: ConfigMap>(
    slot: &mut Arc<T>,
    path: &Option<PathBuf>,
    abs: &dyn Fn(&Path) -> PathBuf,
    problems: &mut Vec<Problem>,
    warnings: &mut Vec<String>,
    ineffective: &mut Vec<(&'static str, usize)>,
    files: &mut Vec<(&'static str, PathBuf)>,
) {
    let Some(path) = path else { return };
    let path = abs(path);
    match parsed_from_manifest::<T>(&path) {
        Ok(parsed) => {
            let file = path.display().to_string();
            warnings.extend(parsed.warnings.iter().map(|w| format!("{file}: {w}")));
            ineffective.push((T::NAME, parsed.warnings.len()));
            *slot = Arc::new(parsed.config)
        }
        Err(e) => {
            let file = path.display().to_string();
            problems.extend(e.0.into_iter().map(|p| p.in_file(&file)));
        }
    }
    files.push((T::NAME, path));
}

/// `thaw local` has only the KPA: a revision of another class (Knative's HPA) would never be
/// scaled, so it is refused, naming where the class came from.
fn local_class_problem(i: usize, s: &ServiceModel, spec: &RevisionSpec) -> Option<Problem> {
    let class = &spec.autoscaling.class;
    if class == annotations::KPA_CLASS {
        return None;
    }
    let annotation = format!("{}class", annotations::PREFIX);
    let key = if local_config::annotations_of(&s.template).contains_key(&annotation) {
        format!("services[{i}].spec.template.metadata.annotations[{annotation}]")
    } else {
        format!(
            "services[{i}]: {} pod-autoscaler-class",
            crate::config::autoscaler::NAME
        )
    };
    Some(Problem::new(
        key,
        class,
        format!(
            "thaw local has no HPA (no CPU or memory metrics to scale on): only {} revisions \
             can run locally",
            annotations::KPA_CLASS
        ),
    ))
}

/// Where a revision-level key lives in a Service manifest.
fn field_path(key: &str) -> String {
    match key.strip_prefix("spec.") {
        Some(field) => format!("spec.template.spec.{field}"),
        None => format!("spec.template.metadata.annotations[{key}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_model_routes_hello() {
        let m = load(&Source::Builtin).unwrap();
        let s = &m.services[0];
        assert_eq!(s.route_host(&m.domain), "hello.default.localhost");
        let spec = s.revision_spec(1, &m.domain, &m.configs).unwrap();
        assert_eq!(&*spec.key.name, "hello-00001");
        assert_eq!(
            spec.autoscaling.stable_window,
            std::time::Duration::from_secs(10)
        );
        assert!(
            spec.hosts
                .contains(&"hello-00001.default.localhost".to_string())
        );
        assert_eq!(revision_name("hello", 12), "hello-00012");
    }

    /// Every ConfigMap local.yaml names is read from its folder and followed by absolute path.
    /// (A folder of its own: tests never read config/local.yaml, which users edit.)
    #[test]
    fn local_yaml_loads_its_configmaps_from_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let cm = |name: &str, data: &str| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata: {{{data}}}\n"
            )
        };
        for (file, text) in [
            ("as.yaml", cm("config-autoscaler", "stable-window: 20s")),
            ("d.yaml", cm("config-defaults", "")),
            ("a.yaml", cm("config-activator", "")),
            ("gc.yaml", cm("config-gc", "min-non-active-revisions: '3'")),
            (
                "local.yaml",
                "configMaps: {autoscaler: as.yaml, defaults: d.yaml, activator: a.yaml, gc: gc.yaml}\nservices: []\n".into(),
            ),
        ] {
            std::fs::write(dir.path().join(file), text).unwrap();
        }
        let m = load(&Source::File(dir.path().join("local.yaml"))).unwrap();
        assert_eq!(m.config_files.len(), 4);
        assert!(
            m.config_files
                .iter()
                .all(|(_, p)| p.is_absolute() && p.exists())
        );
        assert_eq!(m.configs.gc.min_non_active_revisions, 3);
        assert_eq!(
            m.configs.autoscaler.stable_window,
            std::time::Duration::from_secs(20)
        );
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        assert!(m.ineffective_keys.iter().all(|(_, n)| *n == 0));
    }

    /// A ConfigMap key with no effect in thaw is accepted and named, with its file, and counted
    /// per ConfigMap (config::keys' rule); the key beside it applies.
    #[test]
    fn configmap_keys_without_effect_are_named_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("as.yaml"),
            "kind: ConfigMap\nmetadata: {name: config-autoscaler}\ndata: {stable-window: 20s, made-up: x}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("local.yaml"),
            "configMaps: {autoscaler: as.yaml}\nservices: []\n",
        )
        .unwrap();
        let m = load(&Source::File(dir.path().join("local.yaml"))).unwrap();
        assert_eq!(
            m.configs.autoscaler.stable_window,
            std::time::Duration::from_secs(20)
        );
        assert_eq!(m.ineffective_keys, [("config-autoscaler", 1)]);
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(
            m.warnings[0].ends_with("as.yaml: made-up: unknown key, ignored"),
            "{:?}",
            m.warnings
        );
    }

    /// There is no HPA in `thaw local`: a revision of that class is refused, naming where the
    /// class came from.
    #[test]
    fn hpa_class_is_refused_locally() {
        let f = super::super::config::parse(
            "services:\n  - metadata: {name: a}\n    spec:\n      template:\n        metadata:\n          annotations: {autoscaling.knative.dev/class: hpa.autoscaling.knative.dev}\n        spec:\n          containers: [{command: [x]}]\n",
            "f",
        )
        .unwrap();
        let e = from_file(f, None).unwrap_err();
        assert_eq!(
            e.0[0].key,
            "services[0].spec.template.metadata.annotations[autoscaling.knative.dev/class]"
        );
        assert_eq!(e.0[0].value, "hpa.autoscaling.knative.dev");
        assert!(e.0[0].reason.contains("no HPA"), "{e}");
    }

    #[test]
    fn bad_annotation_names_service_and_field() {
        let f = super::super::config::parse(
            "services:\n  - metadata: {name: a}\n    spec:\n      template:\n        metadata:\n          annotations: {autoscaling.knative.dev/window: 1s}\n        spec:\n          containerConcurrency: 5000\n          containers: [{command: [x]}]\n",
            "f",
        )
        .unwrap();
        let e = from_file(f, None).unwrap_err();
        let keys: Vec<_> = e.0.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "services[0].spec.template.spec.containerConcurrency",
                "services[0].spec.template.metadata.annotations[autoscaling.knative.dev/window]",
            ]
        );
    }
}
