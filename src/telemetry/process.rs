//! The standard `process_*` metrics (the names of Prometheus's client libraries, so existing
//! dashboards and alerts work) and `thaw_build_info`.
//!
//! Read from `/proc/self` at each scrape (Linux only; on other systems a value that cannot be
//! read is left out, never exported as 0): `process_cpu_seconds_total` (user + system),
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds` and `process_start_time_seconds` (Unix time). Reading them is a handful
//! of small file reads per scrape, nothing on the request path.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The process's own resource use, read at each scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of `/proc/self`; `None` where a value could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads every value it can.
    pub fn read() -> Self {
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)
            .map(|t| t as f64);
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .filter(|p| *p > 0)
            .map(|p| p as u64);
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        // Fields after the command name (which may hold spaces) start after the last ')':
        // state is field 3, utime 14, stime 15, starttime 22, vsize 23, rss 24 (proc(5)).
        let fields: Vec<&str> = stat
            .as_deref()
            .and_then(|s| s.rsplit_once(')'))
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        Self {
            cpu_seconds: ticks
                .zip(field(14).zip(field(15)))
                .map(|(t, (u, s))| (u + s) as f64 / t),
            resident_bytes: field(24).zip(page).map(|(r, p)| r * p),
            virtual_bytes: field(23),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .ok()
                .map(|(soft, _)| soft),
            start_time_seconds: ticks
                .zip(field(22).zip(boot_time))
                .map(|(t, (start, boot))| boot as f64 + start as f64 / t),
        }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = ProcessStats::read();
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        let gauges: [(&str, &str, Option<f64>); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                s.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v);
                m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
            }
        }
        Ok(())
    }
}

/// The build this process runs: `thaw_build_info{version, commit} 1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub commit: String,
}

/// The git commit thaw was built from (`build.rs`; `THAW_GIT_COMMIT` at build time overrides
/// it), `unknown` outside a git checkout.
pub const GIT_COMMIT: &str = env!("THAW_GIT_COMMIT");

/// Registers the process collector (unprefixed, as every Prometheus client names them) on
/// `root` and the build-info metric on `thaw` (the `thaw_` sub-registry).
pub fn register(root: &mut Registry) {
    root.register_collector(Box::new(ProcessCollector));
}

/// Registers `thaw_build_info` on the `thaw_` registry.
pub fn register_build_info(thaw: &mut Registry) {
    thaw.register(
        "build",
        "The thaw build: version and git commit (always 1)",
        Info::new(BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: GIT_COMMIT.to_string(),
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let s = ProcessStats::read();
        assert!(s.cpu_seconds.is_some_and(|c| c >= 0.0), "{s:?}");
        assert!(s.resident_bytes.is_some_and(|r| r > 1024 * 1024), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert!(s.max_fds.is_some_and(|n| n >= s.open_fds.unwrap()), "{s:?}");
        // Started within the last day, not in the future (clock and boot time agree).
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = s.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
    }
}
