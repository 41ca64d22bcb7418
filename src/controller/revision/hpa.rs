//! The HorizontalPodAutoscaler of an HPA-class revision (`autoscaling.knative.dev/class:
//! hpa.autoscaling.knative.dev`), as Knative's `hpa/resources.MakeHPA` writes it:
//! `autoscaling/v2`, named after the revision, scaling its Deployment between min-scale (when
//! > 0) and max-scale (unbounded: 2147483647).
//!
//! - `autoscaling.knative.dev/metric`: `cpu` (the default for the class) or `memory`; any
//!   other name is a custom per-pod metric.
//! - `autoscaling.knative.dev/target`, when given: for `cpu` the average utilisation in percent
//!   (rounded up); for `memory` an average value in MiB (`100` → `100Mi`, the fraction cut as
//!   Knative does); for a custom metric an average value. Without a target the HPA has no
//!   metric and Kubernetes' default applies (80 % CPU).
//! - `autoscaling.knative.dev/window`, when given: the scale-down stabilisation window.
//!
//! thaw's KPA leaves such revisions alone: its scaler only scales revisions of the KPA class
//! (`crate::autoscaler::scaler`), so the HPA and the KPA never both write `/scale`.

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec,
    MetricTarget, PodsMetricSource, ResourceMetricSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::deployment::deployment_name;
use super::meta::{child_annotations, child_labels, owner_ref};
use super::resolve::Resolved;
use crate::config::annotations::{HPA_CLASS, PREFIX};
use crate::knative::Revision;
use crate::knative::names::child_name;

/// Whether the revision is scaled by a Kubernetes HPA rather than thaw's KPA.
pub fn is_hpa_class(r: &Resolved) -> bool {
    r.autoscaling.class == HPA_CLASS
}

/// The HPA's name: the revision's.
pub fn hpa_name(revision: &str) -> String {
    child_name(revision, "")
}

fn annotation<'a>(rev: &'a Revision, name: &str) -> Option<&'a str> {
    rev.annotations()
        .get(&format!("{PREFIX}{name}"))
        .map(|v| v.trim())
}

/// The metric the HPA scales on, from the `metric` and `target` annotations.
fn metric(rev: &Revision) -> Option<MetricSpec> {
    let target: f64 = annotation(rev, "target")?.parse().ok()?;
    let metric = annotation(rev, "metric").unwrap_or("cpu");
    Some(match metric {
        "cpu" => MetricSpec {
            type_: "Resource".into(),
            resource: Some(ResourceMetricSource {
                name: "cpu".into(),
                target: MetricTarget {
                    type_: "Utilization".into(),
                    average_utilization: Some(target.ceil() as i32),
                    ..MetricTarget::default()
                },
            }),
            ..MetricSpec::default()
        },
        "memory" => MetricSpec {
            type_: "Resource".into(),
            resource: Some(ResourceMetricSource {
                name: "memory".into(),
                target: MetricTarget {
                    type_: "AverageValue".into(),
                    average_value: Some(Quantity(format!("{}Mi", target.trunc() as i64))),
                    ..MetricTarget::default()
                },
            }),
            ..MetricSpec::default()
        },
        custom => MetricSpec {
            type_: "Pods".into(),
            pods: Some(PodsMetricSource {
                metric: MetricIdentifier {
                    name: custom.into(),
                    selector: None,
                },
                target: MetricTarget {
                    type_: "AverageValue".into(),
                    average_value: Some(Quantity(format!("{target}"))),
                    ..MetricTarget::default()
                },
            }),
            ..MetricSpec::default()
        },
    })
}

/// The revision's HPA.
pub fn hpa(rev: &Revision, r: &Resolved) -> HorizontalPodAutoscaler {
    let a = &r.autoscaling;
    let window = annotation(rev, "window").map(|_| a.stable_window.as_secs() as i32);
    let annotations = child_annotations(rev);
    HorizontalPodAutoscaler {
        metadata: ObjectMeta {
            name: Some(hpa_name(&r.name)),
            namespace: Some(r.namespace.clone()),
            labels: Some(child_labels(rev)),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner_ref(rev)]),
            ..ObjectMeta::default()
        },
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name: deployment_name(&r.name),
            },
            min_replicas: (a.min_scale > 0).then(|| i32::try_from(a.min_scale).unwrap_or(i32::MAX)),
            max_replicas: if a.max_scale == 0 {
                i32::MAX
            } else {
                i32::try_from(a.max_scale).unwrap_or(i32::MAX)
            },
            metrics: metric(rev).map(|m| vec![m]),
            behavior: window.map(|w| HorizontalPodAutoscalerBehavior {
                scale_down: Some(HPAScalingRules {
                    stabilization_window_seconds: Some(w),
                    ..HPAScalingRules::default()
                }),
                scale_up: None,
            }),
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AutoscalerConfig, DefaultsConfig, DeploymentConfig};
    use crate::controller::revision::fixtures::RevisionFixture;
    use crate::controller::revision::resolve::resolve;

    fn build(f: RevisionFixture) -> (Resolved, HorizontalPodAutoscaler) {
        let rev = f
            .annotation("autoscaling.knative.dev/class", HPA_CLASS)
            .build();
        let r = resolve(
            &rev,
            &DefaultsConfig::default(),
            &AutoscalerConfig::default(),
            &DeploymentConfig::default(),
        )
        .unwrap();
        let h = hpa(&rev, &r);
        (r, h)
    }

    #[test]
    fn cpu_utilisation_with_bounds() {
        let (r, h) = build(
            RevisionFixture::new("cpu-00001")
                .annotation("autoscaling.knative.dev/metric", "cpu")
                .annotation("autoscaling.knative.dev/target", "70.5")
                .annotation("autoscaling.knative.dev/min-scale", "2")
                .annotation("autoscaling.knative.dev/max-scale", "10"),
        );
        assert!(is_hpa_class(&r));
        assert_eq!(h.metadata.name.as_deref(), Some("cpu-00001"));
        let s = h.spec.unwrap();
        assert_eq!(s.scale_target_ref.name, "cpu-00001-deployment");
        assert_eq!(s.scale_target_ref.kind, "Deployment");
        assert_eq!(s.min_replicas, Some(2));
        assert_eq!(s.max_replicas, 10);
        let m = &s.metrics.unwrap()[0];
        assert_eq!(m.type_, "Resource");
        let res = m.resource.as_ref().unwrap();
        assert_eq!(res.name, "cpu");
        assert_eq!(res.target.type_, "Utilization");
        assert_eq!(res.target.average_utilization, Some(71));
        assert_eq!(s.behavior, None);
    }

    #[test]
    fn memory_in_mebibytes_unbounded() {
        let (_, h) = build(
            RevisionFixture::new("mem-00001")
                .annotation("autoscaling.knative.dev/metric", "memory")
                .annotation("autoscaling.knative.dev/target", "150")
                .annotation("autoscaling.knative.dev/window", "2m"),
        );
        let s = h.spec.unwrap();
        assert_eq!(s.min_replicas, None);
        assert_eq!(s.max_replicas, i32::MAX);
        let res = s.metrics.unwrap()[0].resource.clone().unwrap();
        assert_eq!(res.name, "memory");
        assert_eq!(res.target.type_, "AverageValue");
        assert_eq!(res.target.average_value, Some(Quantity("150Mi".into())));
        assert_eq!(
            s.behavior
                .unwrap()
                .scale_down
                .unwrap()
                .stabilization_window_seconds,
            Some(120)
        );
    }

    #[test]
    fn no_target_no_metric_and_custom_metrics() {
        let (_, h) = build(RevisionFixture::new("plain-00001"));
        assert_eq!(h.spec.unwrap().metrics, None);
        let (_, h) = build(
            RevisionFixture::new("custom-00001")
                .annotation("autoscaling.knative.dev/metric", "queue_depth")
                .annotation("autoscaling.knative.dev/target", "5"),
        );
        let m = h.spec.unwrap().metrics.unwrap()[0].clone();
        assert_eq!(m.type_, "Pods");
        let p = m.pods.unwrap();
        assert_eq!(p.metric.name, "queue_depth");
        assert_eq!(p.target.average_value, Some(Quantity("5".into())));
    }

    #[test]
    fn kpa_is_the_default_class() {
        let rev = RevisionFixture::new("kpa-00001").build();
        let r = resolve(
            &rev,
            &DefaultsConfig::default(),
            &AutoscalerConfig::default(),
            &DeploymentConfig::default(),
        )
        .unwrap();
        assert!(!is_hpa_class(&r));
    }
}
