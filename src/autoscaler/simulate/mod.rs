//! `thaw simulate`: a traffic trace replayed through the real collector, decider and scaler on
//! a virtual clock, so an operator sees what a settings change does before applying it.
//!
//! The model (also in `--help`): one activator, always in the request path, reports the
//! offered concurrency every second (zeros included), and pokes when load arrives while no pod
//! is ready; the scaler ticks every 2 s; a pod is ready `--pod-startup` seconds after it is
//! asked for and goes at once when scaled down (starting pods first). Unless `--fresh`, the
//! revision was deployed long before the trace and has settled (scaled to zero, or to its
//! min-scale) when the trace starts.

mod plot;
mod spec;
pub mod trace;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::autoscaler::scaler::{ActivatorPath, ScaleStates, Scaler, ScalerOptions, Trigger};
use crate::clock;
use crate::config::AutoscalingSpec;
use crate::platform::memory::MemoryPlatform;
use crate::revision::{CatalogSnapshot, RevisionCatalog, RevisionKey, RevisionSpec};
use crate::stats::{Stat, StatMessage};
use crate::telemetry::Telemetry;

pub use spec::load_spec;

const MODEL: &str = "\
Model:
  - One activator, always in the request path (as in `thaw local`), reports the offered
    concurrency every second, zeros included, and pokes the autoscaler when load arrives
    while no pod is ready.
  - The scaler ticks every 2 s and decides with Knative's KPA arithmetic (the real decider,
    collector and scale-to-zero rules).
  - A pod is ready --pod-startup seconds after it is asked for, and goes at once when scaled
    down (starting pods first).
  - `waiting` is the offered concurrency while no pod is ready, else what exceeds
    containerConcurrency x ready when containerConcurrency > 0.
  - Unless --fresh, the revision was deployed long before the trace and has settled (at
    zero, or at its min-scale) when the trace starts; decisions fall on even seconds.

Output CSV columns: second, desired (pods asked for), ready, panic (0/1),
excess_burst_capacity, activator_in_path (0/1), waiting.

Summary: pod-seconds (pods existing, starting or ready, summed over seconds), scale-from-zero
events (desired going from 0 to more), seconds with requests waiting, peak pods.";

/// Arguments of `thaw simulate`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    about = "Replay a traffic trace through the autoscaler on a virtual clock",
    after_long_help = MODEL
)]
pub struct SimulateArgs {
    /// A config-autoscaler ConfigMap manifest, e.g. config/config-autoscaler.yaml (Knative's
    /// defaults when omitted).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The trace: CSV with header `second,concurrency`, the offered concurrency each second.
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// A revision annotation, e.g. autoscaling.knative.dev/window=30s (repeatable; a key
    /// without a `/` gets the autoscaling.knative.dev/ prefix).
    #[arg(long = "annotation", value_name = "KEY=VALUE")]
    pub annotations: Vec<String>,
    /// Seconds from asking for a pod to the pod being ready.
    #[arg(long, value_name = "SECONDS", default_value_t = 2)]
    pub pod_startup: u64,
    /// The revision's containerConcurrency (0 = unlimited).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub container_concurrency: u32,
    /// Start with the revision just deployed (initial-scale pods) instead of settled.
    #[arg(long)]
    pub fresh: bool,
    /// Write the per-second CSV here.
    #[arg(long, value_name = "FILE.csv")]
    pub out: Option<PathBuf>,
    /// Draw offered load, requests waiting and pods over time as SVG here, with the settings
    /// and the summary under the plot.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// A second config-autoscaler manifest to replay the same trace with (same annotations and
    /// flags): both summaries are printed and the plot overlays both.
    #[arg(long, value_name = "OTHER.yaml")]
    pub compare: Option<PathBuf>,
}

/// How the simulated world behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Model {
    /// Seconds from asking for a pod to it being ready.
    pub pod_startup: u64,
    /// The revision's containerConcurrency (0 = unlimited), for `waiting`.
    pub container_concurrency: u32,
    /// Start at the revision's deployment instead of settled.
    pub fresh: bool,
}

/// One simulated second.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Seconds from the trace's start.
    pub second: u64,
    /// The trace's offered concurrency this second.
    pub offered: f64,
    /// Pods asked of the platform after this second's decisions.
    pub desired: u32,
    /// Pods ready during this second.
    pub ready: u32,
    /// Whether the decider was in panic mode.
    pub panic: bool,
    /// The decider's latest excess burst capacity.
    pub excess_burst_capacity: i64,
    /// Whether the activator had to stay in the request path.
    pub activator_in_path: bool,
    /// Concurrency that could not be served this second (see the model).
    pub waiting: f64,
}

/// The figures an operator compares between settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Seconds simulated (the trace's length).
    pub seconds: u64,
    /// Σ over seconds of pods existing (starting or ready).
    pub pod_seconds: u64,
    /// Times the desired pods went from 0 to more.
    pub scale_from_zero: u64,
    /// Seconds with `waiting` > 0.
    pub waiting_seconds: u64,
    /// The most pods asked for at once.
    pub peak_pods: u32,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seconds: {}", self.seconds)?;
        writeln!(f, "pod-seconds: {}", self.pod_seconds)?;
        writeln!(f, "scale-from-zero events: {}", self.scale_from_zero)?;
        writeln!(f, "seconds with requests waiting: {}", self.waiting_seconds)?;
        write!(f, "peak pods: {}", self.peak_pods)
    }
}

/// A finished simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// One row per trace second.
    pub rows: Vec<Row>,
    /// The totals over the rows.
    pub summary: Summary,
}

/// The settings a simulation ran with, as one line (shown in the plot).
pub fn settings_text(spec: &AutoscalingSpec, model: &Model) -> String {
    use crate::config::parse::format_duration as d;
    let max = if spec.max_scale == 0 {
        "unbounded".to_string()
    } else {
        spec.max_scale.to_string()
    };
    format!(
        "target {} per pod ({} {}, utilization {}%), containerConcurrency {}, stable-window {}, \
         panic-window {}, panic-threshold {}%, scale-to-zero-grace-period {}, \
         scale-to-zero-pod-retention-period {}, scale-down-delay {}, min-scale {}, max-scale {}, \
         initial-scale {}, activation-scale {}, target-burst-capacity {}, enable-scale-to-zero {}, \
         pod start-up {}s{}",
        trace::number(spec.target_value),
        match spec.metric {
            crate::config::Metric::Concurrency => "concurrency",
            crate::config::Metric::Rps => "rps",
        },
        trace::number(spec.total_value),
        trace::number(spec.target_utilization * 100.0),
        model.container_concurrency,
        d(spec.stable_window),
        d(spec.panic_window),
        trace::number(spec.panic_threshold * 100.0),
        d(spec.scale_to_zero_grace_period),
        d(spec.scale_to_zero_pod_retention_period),
        d(spec.scale_down_delay),
        spec.min_scale,
        max,
        spec.initial_scale,
        spec.activation_scale,
        trace::number(spec.target_burst_capacity),
        spec.enable_scale_to_zero,
        model.pod_startup,
        if model.fresh {
            ", fresh deployment"
        } else {
            ""
        },
    )
}

/// `thaw simulate`: loads the settings and the trace, simulates, writes the outputs.
pub fn run(args: &SimulateArgs) -> ExitCode {
    match run_inner(args) {
        Ok(summaries) => {
            let text = match summaries.as_slice() {
                [(_, one)] => format!("{one}\n"),
                many => many
                    .iter()
                    .map(|(label, s)| format!("# {label}\n{s}\n"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            };
            crate::cli::out(&text);
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::cli::say(format_args!("thaw simulate: {e}"));
            crate::cli::invalid()
        }
    }
}

/// Runs the simulation (twice with `--compare`); each run's label and summary.
fn run_inner(args: &SimulateArgs) -> Result<Vec<(String, Summary)>, String> {
    let mut annotations = BTreeMap::new();
    for a in &args.annotations {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| format!("--annotation {a}: expected KEY=VALUE"))?;
        annotations.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    let label = |p: Option<&std::path::Path>| {
        p.map_or("Knative's defaults".to_string(), |p| {
            p.display().to_string()
        })
    };
    let mut configs = vec![(label(args.config.as_deref()), args.config.clone())];
    if let Some(other) = &args.compare {
        configs.push((label(Some(other)), Some(other.clone())));
    }
    let mut specs = Vec::new();
    for (label, path) in &configs {
        let (spec, warnings) = load_spec(path.as_deref(), &annotations, args.container_concurrency)
            .map_err(|e| match path {
                Some(p) => format!("{}: {e}", p.display()),
                None => e,
            })?;
        for w in warnings {
            crate::cli::say(format_args!("thaw simulate: warning: {w}"));
        }
        specs.push((label.clone(), spec));
    }
    let text = std::fs::read_to_string(&args.trace)
        .map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let offered = trace::parse(&text).map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let model = Model {
        pod_startup: args.pod_startup,
        container_concurrency: args.container_concurrency,
        fresh: args.fresh,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let sims: Vec<(String, String, Simulation)> = specs
        .into_iter()
        .map(|(label, spec)| {
            let settings = settings_text(&spec, &model);
            (
                label,
                settings,
                runtime.block_on(simulate(spec, &offered, model)),
            )
        })
        .collect();
    if let Some(path) = &args.out {
        // The first configuration's rows (`--compare` adds its summary, not a second CSV).
        std::fs::write(path, trace::to_csv(&sims[0].2.rows))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let title = format!("thaw simulate: {}", args.trace.display());
        let runs: Vec<plot::Run<'_>> = sims
            .iter()
            .map(|(label, settings, sim)| plot::Run {
                label,
                settings,
                rows: &sim.rows,
                summary: &sim.summary,
            })
            .collect();
        std::fs::write(path, plot::svg(&title, &offered, &runs))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(sims
        .into_iter()
        .map(|(label, _, sim)| (label, sim.summary))
        .collect())
}

/// The simulated platform: pods with the second they become ready.
struct World {
    platform: Arc<MemoryPlatform>,
    key: RevisionKey,
    /// Ready-at second of each pod, in creation order.
    pods: Vec<u64>,
    startup: u64,
}

impl World {
    fn ready(&self, s: u64) -> usize {
        self.pods.iter().filter(|&&t| t <= s).count()
    }

    /// Starts or stops pods to match what the scaler last asked for.
    fn follow(&mut self, s: u64) {
        let want = self.platform.replicas(&self.key).unwrap_or(0) as usize;
        while self.pods.len() < want {
            self.pods.push(s + self.startup);
        }
        while self.pods.len() > want {
            // Starting pods go first, newest first.
            let victim = self
                .pods
                .iter()
                .rposition(|&t| t > s)
                .unwrap_or(self.pods.len() - 1);
            self.pods.remove(victim);
        }
    }
}

/// Simulates `offered` (one value per second) against a revision with `spec`.
///
/// Runs on any tokio runtime with time enabled; the virtual clock is independent of it (a
/// trace of a day takes milliseconds).
pub async fn simulate(spec: AutoscalingSpec, offered: &[f64], model: Model) -> Simulation {
    let key = RevisionKey::new("default", "simulated");
    let mut rev = RevisionSpec::test(&key.namespace, &key.name);
    rev.container_concurrency = model.container_concurrency;
    let settle = spec.stable_window
        + spec
            .scale_to_zero_grace_period
            .max(spec.scale_to_zero_pod_retention_period)
        + Duration::from_secs(model.pod_startup + 4);
    rev.autoscaling = Arc::new(spec);
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new([rev], [])));
    let platform = MemoryPlatform::new();
    let telemetry = Telemetry::new();
    let options = ScalerOptions {
        activator_path: ActivatorPath::Always {
            since: clock::instant_of(0),
        },
        ..ScalerOptions::default()
    };
    let mut scaler = Scaler::new(
        catalog,
        platform.clone(),
        ScaleStates::new(),
        &telemetry,
        options,
    );
    let mut world = World {
        platform,
        key: key.clone(),
        pods: Vec::new(),
        startup: model.pod_startup,
    };
    scaler.sync_catalog(clock::instant_of(0)).await;
    world.follow(0);

    let mut s = 0;
    if !model.fresh {
        // Let the freshly deployed revision settle: replicas unchanged for `settle`.
        let settle = settle.as_secs();
        let cap = 4 * 3600 + settle;
        let mut unchanged = 0;
        let mut last = world.pods.len();
        while unchanged < settle && s < cap {
            step(&mut scaler, &mut world, s, 0.0).await;
            unchanged = if world.pods.len() == last {
                unchanged + 1
            } else {
                0
            };
            last = world.pods.len();
            s += 1;
        }
        // Start the trace on a tick, so decisions fall on even trace seconds.
        if !s.is_multiple_of(2) {
            step(&mut scaler, &mut world, s, 0.0).await;
            s += 1;
        }
    }

    let start = s;
    let mut rows = Vec::with_capacity(offered.len());
    let mut summary = Summary::default();
    let mut previous = scaler.status(&key).map_or(-1, |st| st.desired);
    for (i, &load) in offered.iter().enumerate() {
        let s = start + i as u64;
        step(&mut scaler, &mut world, s, load).await;
        let st = scaler
            .status(&key)
            .expect("the simulated revision is tracked");
        let desired = u32::try_from(st.desired).unwrap_or(0);
        let ready = u32::try_from(world.ready(s)).unwrap_or(u32::MAX);
        let waiting = if ready == 0 {
            load
        } else if model.container_concurrency > 0 {
            (load - f64::from(model.container_concurrency) * f64::from(ready)).max(0.0)
        } else {
            0.0
        };
        summary.pod_seconds += world.pods.len() as u64;
        summary.scale_from_zero += u64::from(previous == 0 && st.desired > 0);
        summary.waiting_seconds += u64::from(waiting > 0.0);
        summary.peak_pods = summary.peak_pods.max(desired);
        previous = st.desired;
        rows.push(Row {
            second: i as u64,
            offered: load,
            desired,
            ready,
            panic: st.panicking,
            excess_burst_capacity: st.excess_burst_capacity,
            activator_in_path: st.activator_in_path,
            waiting,
        });
    }
    summary.seconds = rows.len() as u64;
    Simulation { rows, summary }
}

/// One virtual second: readiness, the activator's report (a poke when cold), the decisions.
async fn step(scaler: &mut Scaler, world: &mut World, s: u64, load: f64) {
    let now = clock::instant_of(s);
    let ready = world.ready(s);
    world.platform.set_ready(&world.key, ready);
    let stat = Stat {
        revision: world.key.clone(),
        source: Arc::from("activator"),
        at: s,
        average_concurrency: load,
        requests: load.round() as u64,
        proxied_concurrency: 0.0,
        proxied_requests: 0,
    };
    let msg = if load > 0.0 && ready == 0 {
        StatMessage::Poke(stat)
    } else {
        StatMessage::Record(stat)
    };
    if let Some(key) = scaler.ingest(msg, now) {
        scaler.decide(&key, Trigger::Poke, now).await;
    }
    if s.is_multiple_of(2) {
        scaler.tick(now).await;
    }
    world.follow(s);
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
