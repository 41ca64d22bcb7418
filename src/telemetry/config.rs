//! Metrics of configuration loading and live reload.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels: which ConfigMap (`config-autoscaler`, `config-defaults`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ConfigLabels {
    pub config: String,
}

#[derive(Debug, Clone, Default)]
pub struct ConfigMetrics {
    /// `thaw_config_reloads_total{config}`: updates applied.
    pub reloads: Family<ConfigLabels, Counter>,
    /// `thaw_config_reload_rejected_total{config}`: updates rejected (the last good config
    /// kept serving).
    pub rejected: Family<ConfigLabels, Counter>,
}

impl ConfigMetrics {
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
        m
    }
}
