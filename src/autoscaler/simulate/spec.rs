//! The settings `thaw simulate` runs with: the real config parser
//! ([`crate::config::load::autoscaler_from_manifest`] and
//! [`crate::config::annotations::resolve`]), as `thaw local` reads them.

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::annotations::{self, PREFIX};
use crate::config::{AutoscalerConfig, AutoscalingSpec, load};

/// The effective settings of a revision with `container_concurrency`, from a
/// `config-autoscaler` manifest (Knative's defaults without one) and annotations. Annotation
/// keys without a `/` get the `autoscaling.knative.dev/` prefix. Every problem is reported in
/// the error, one `KEY: VALUE: REASON` per line; warnings (unknown annotations, which are
/// ignored) are returned beside the spec.
pub fn load_spec(
    config_path: Option<&Path>,
    annotations: &BTreeMap<String, String>,
    container_concurrency: u32,
) -> Result<(AutoscalingSpec, Vec<String>), String> {
    let config = match config_path {
        Some(path) => load::from_manifest::<AutoscalerConfig>(path).map_err(|e| e.to_string())?,
        None => AutoscalerConfig::default(),
    };
    let annotations: BTreeMap<String, String> = annotations
        .iter()
        .map(|(k, v)| {
            let key = if k.contains('/') {
                k.clone()
            } else {
                format!("{PREFIX}{k}")
            };
            (key, v.clone())
        })
        .collect();
    let warnings = annotations::warnings(&config, &annotations);
    let spec = annotations::resolve(&config, &annotations, container_concurrency)
        .map_err(|e| e.to_string())?;
    Ok((spec, warnings))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn manifest(data: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-autoscaler\ndata:\n{data}"
        );
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn defaults_match_knative() {
        let (spec, warnings) = load_spec(None, &BTreeMap::new(), 0).unwrap();
        assert_eq!(spec, AutoscalingSpec::default());
        assert!(warnings.is_empty());
    }

    #[test]
    fn manifest_and_annotations_combine() {
        let f = manifest(
            "  stable-window: \"30s\"\n  panic-window-percentage: \"20\"\n  container-concurrency-target-default: \"10\"\n  scale-to-zero-grace-period: 10s\n",
        );
        let mut ann = BTreeMap::new();
        ann.insert(
            format!("{PREFIX}target-utilization-percentage"),
            "50".into(),
        );
        ann.insert("min-scale".into(), "1".into());
        let (spec, _) = load_spec(Some(f.path()), &ann, 0).unwrap();
        assert_eq!(spec.stable_window, Duration::from_secs(30));
        assert_eq!(spec.panic_window, Duration::from_secs(6));
        assert_eq!((spec.total_value, spec.target_value), (10.0, 5.0));
        assert_eq!(spec.scale_to_zero_grace_period, Duration::from_secs(10));
        assert_eq!(spec.min_scale, 1, "a bare key is an autoscaling annotation");
    }

    #[test]
    fn problems_name_key_value_and_reason() {
        let f = manifest("  stable-window: \"5s\"\n");
        let err = load_spec(Some(f.path()), &BTreeMap::new(), 0).unwrap_err();
        assert!(err.contains("stable-window: 5s: "), "{err}");
        let mut ann = BTreeMap::new();
        ann.insert("windw".into(), "60s".into());
        let (_, warnings) = load_spec(None, &ann, 0).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }
}
