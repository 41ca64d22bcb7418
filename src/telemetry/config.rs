//! Metrics of configuration loading and live reload.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels: which ConfigMap (`config-autoscaler`, `config-defaults`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ConfigLabels {
    pub config: String,
}

/// Labels of the per-ConfigMap gauges: the ConfigMap's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ConfigMapLabels {
    pub config_map: String,
}

#[derive(Debug, Clone, Default)]
pub struct ConfigMetrics {
    /// `thaw_config_reloads_total{config}`: updates applied.
    pub reloads: Family<ConfigLabels, Counter>,
    /// `thaw_config_reload_rejected_total{config}`: updates rejected (the last good config
    /// kept serving).
    pub rejected: Family<ConfigLabels, Counter>,
    /// `thaw_config_ineffective_keys{config_map}`: keys of the ConfigMap as last read that
    /// have no effect in thaw (unknown keys, Knative keys thaw does not implement, values it
    /// does not understand and so keeps the key's default for). Accepted, never a refusal
    /// ([`crate::config::keys`]'s rule); each is also named in a WARN line.
    pub ineffective: Family<ConfigMapLabels, Gauge>,
}

impl ConfigMetrics {
    /// Sets `thaw_config_ineffective_keys{config_map}` to `count`.
    pub fn set_ineffective(&self, config_map: &str, count: usize) {
        self.ineffective
            .get_or_create(&ConfigMapLabels {
                config_map: config_map.to_string(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub fn register(reg: &mut Registry) -> Self {
        let m = Self::default();
        reg.register(
            "config_reloads",
            "Configuration updates applied",
            super::Listed(m.reloads.clone()),
        );
        reg.register(
            "config_reload_rejected",
            "Configuration updates rejected as invalid; the last good configuration kept serving",
            super::Listed(m.rejected.clone()),
        );
        reg.register(
            "config_ineffective_keys",
            "Keys of the ConfigMap as last read that have no effect in thaw (accepted and named \
             in a WARN line)",
            super::Listed(m.ineffective.clone()),
        );
        m
    }
}
