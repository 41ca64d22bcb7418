//! A pod's status as the kubelet writes it (`generateAPIPodStatus`): phase, conditions with
//! their transition times, addresses, QoS class and every container's state. Pure: the pod's
//! task decides when to write it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::container::{Ctr, Kind, Term};
use super::{env, resources};

/// What the status is built from, besides the containers.
pub(super) struct Facts<'a> {
    pub(super) pod: &'a Pod,
    pub(super) host_ip: Ipv4Addr,
    /// The pod's address once its sandbox is up (it stays reported after the sandbox goes).
    pub(super) pod_ip: Option<Ipv4Addr>,
    pub(super) sandbox_ready: bool,
    pub(super) start_time: &'a str,
    /// The pod is over: its containers were stopped for good (deleted, or all done).
    pub(super) terminal: bool,
    /// Why containers not yet created wait (a sandbox or token failure), if any.
    pub(super) setup_error: Option<&'a str>,
    /// The pod's `restartPolicy` (default Always).
    pub(super) policy: &'a str,
}

/// Condition type -> (status, lastTransitionTime): a condition's time changes only when
/// its status does.
#[derive(Default)]
pub(super) struct Transitions(BTreeMap<String, (bool, String)>);

impl Transitions {
    /// Seeds the times from the pod's current conditions.
    pub(super) fn from_pod(pod: &Pod) -> Self {
        let mut t = Self::default();
        for c in pod
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
        {
            let since = c
                .last_transition_time
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            t.0.insert(c.type_.clone(), (c.status == "True", since));
        }
        t
    }

    fn condition(&mut self, kind: &str, ok: bool, why: Option<(&str, String)>) -> Value {
        let entry = self
            .0
            .entry(kind.to_string())
            .or_insert_with(|| (ok, super::now_time()));
        if entry.0 != ok || entry.1.is_empty() {
            *entry = (ok, super::now_time());
        }
        // Strategic merge keeps fields a patch leaves out: absent ones are sent as null.
        let (reason, message) = match why {
            Some((r, m)) => (json!(r), if m.is_empty() { Value::Null } else { json!(m) }),
            None => (Value::Null, Value::Null),
        };
        json!({"type": kind, "status": if ok { "True" } else { "False" }, "reason": reason,
            "message": message, "lastProbeTime": null, "lastTransitionTime": entry.1,
            "observedGeneration": null})
    }
}

/// The container states getPhase reads.
enum St {
    Running { started: bool },
    Terminated(i32),
    Waiting { last_exit: Option<i32> },
}

fn st(c: &Ctr) -> St {
    if c.done {
        St::Terminated(0)
    } else if let Some(r) = &c.run {
        St::Running { started: r.started }
    } else if let Some(t) = &c.term {
        St::Terminated(t.exit_code)
    } else {
        St::Waiting {
            last_exit: c.last.as_ref().map(|t| t.exit_code),
        }
    }
}

/// The kubelet's `getPhase` (without the ContainerRestartRules gate, off by default).
pub(super) fn phase(ctrs: &[Ctr], policy: &str, terminal: bool, initialized: bool) -> &'static str {
    let (mut pending_init, mut failed_init, mut pending_sidecars) = (0, 0, 0);
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in ctrs {
        match (c.kind, st(c)) {
            (Kind::Init, St::Terminated(code))
            | (
                Kind::Init,
                St::Waiting {
                    last_exit: Some(code),
                },
            ) => {
                failed_init += i32::from(code != 0);
            }
            (Kind::Init, _) => pending_init += 1,
            (Kind::Sidecar, St::Running { started }) => {
                pending_sidecars += i32::from(!started);
                running += 1;
            }
            (Kind::Sidecar, St::Waiting { last_exit: None }) => {
                pending_sidecars += 1;
                waiting += 1;
            }
            (Kind::Sidecar, _) => {}
            (Kind::Main, St::Running { .. }) => running += 1,
            (Kind::Main, St::Terminated(code)) => {
                stopped += 1;
                succeeded += i32::from(code == 0);
            }
            (Kind::Main, St::Waiting { last_exit: Some(_) }) => stopped += 1,
            (Kind::Main, St::Waiting { last_exit: None }) => waiting += 1,
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 || (pending_sidecars > 0 && !initialized) || waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped == 0 {
        return "Pending";
    }
    if terminal {
        return if stopped == succeeded {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    match policy {
        "Always" => "Running",
        _ if stopped == succeeded => "Succeeded",
        "Never" => "Failed",
        _ => "Running",
    }
}

/// Whether every init container completed and every sidecar has started.
pub(super) fn initialized(ctrs: &[Ctr]) -> bool {
    ctrs.iter().all(|c| match c.kind {
        Kind::Init => c.done,
        Kind::Sidecar => c.ever_started,
        Kind::Main => true,
    })
}

fn term_json(t: &Term) -> Value {
    let opt = |s: &str| if s.is_empty() { Value::Null } else { json!(s) };
    json!({"exitCode": t.exit_code, "reason": t.reason, "message": t.message,
        "startedAt": opt(&t.started_at), "finishedAt": opt(&t.finished_at),
        "containerID": if t.container_id.is_empty() { Value::Null } else { json!(format!("containerd://{}", t.container_id)) }})
}

/// One container's status.
fn container_json(c: &Ctr, default_waiting: &str, setup_error: Option<&str>) -> Value {
    let image = c.spec.image.clone().unwrap_or_default();
    let (state, ready, started, id) = if c.done {
        let t = c.term.as_ref();
        (
            json!({"terminated": t.map(term_json)}),
            true,
            false,
            t.map(|t| t.container_id.clone()),
        )
    } else if let Some(r) = &c.run {
        (
            json!({"running": {"startedAt": r.started_at}}),
            r.ready,
            r.started,
            Some(r.container_id.clone()),
        )
    } else if let Some((reason, message)) = &c.waiting {
        (
            json!({"waiting": {"reason": reason, "message": message}}),
            false,
            false,
            None,
        )
    } else if let Some(t) = &c.term {
        (
            json!({"terminated": term_json(t)}),
            false,
            false,
            Some(t.container_id.clone()),
        )
    } else {
        (
            json!({"waiting": {"reason": default_waiting, "message": setup_error}}),
            false,
            false,
            None,
        )
    };
    let id = id
        .filter(|i| !i.is_empty())
        .or_else(|| c.last.as_ref().map(|t| t.container_id.clone()));
    json!({
        "name": c.spec.name,
        "image": image,
        "imageID": if id.is_some() { json!(env::image_id(&image)) } else { json!("") },
        "containerID": id.map(|i| format!("containerd://{i}")),
        "ready": ready,
        "started": started,
        "restartCount": c.restarts,
        "state": state,
        "lastState": c.last.as_ref().map_or(json!({}), |t| json!({"terminated": term_json(t)})),
    })
}

/// The status to write (everything but PodScheduled, which the scheduler and the binding
/// own). The caller writes it by strategic merge when it differs from the last one written.
pub(super) fn build(f: &Facts<'_>, ctrs: &[Ctr], times: &mut Transitions) -> Value {
    let init_done = initialized(ctrs);
    let phase = phase(ctrs, f.policy, f.terminal, init_done);
    let completed = phase == "Succeeded";
    let names = |pred: &dyn Fn(&Ctr) -> bool, kinds: &[Kind]| -> Vec<String> {
        ctrs.iter()
            .filter(|c| kinds.contains(&c.kind) && pred(c))
            .map(|c| c.spec.name.clone())
            .collect()
    };
    let incomplete = names(
        &|c| !(c.done || (c.kind == Kind::Sidecar && c.ever_started)),
        &[Kind::Init, Kind::Sidecar],
    );
    let unready = names(
        &|c| !c.run.as_ref().is_some_and(|r| r.ready),
        &[Kind::Sidecar, Kind::Main],
    );
    let list = |v: &[String]| format!("[{}]", v.join(" "));
    let initialized = if completed {
        times.condition("Initialized", true, Some(("PodCompleted", String::new())))
    } else if incomplete.is_empty() {
        times.condition("Initialized", true, None)
    } else {
        let m = format!("containers with incomplete status: {}", list(&incomplete));
        times.condition("Initialized", false, Some(("ContainersNotInitialized", m)))
    };
    let containers_ready = unready.is_empty() && !completed;
    let why_unready = if completed {
        Some(("PodCompleted", String::new()))
    } else {
        (!unready.is_empty()).then(|| {
            (
                "ContainersNotReady",
                format!("containers with unready status: {}", list(&unready)),
            )
        })
    };
    // Readiness gates: each named condition must be True on the pod.
    let gate_problem = f
        .pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .find_map(|g| {
            let cond = f
                .pod
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .find(|c| c.type_ == g.condition_type);
            match cond {
                None => Some(format!(
                    "corresponding condition of pod readiness gate \"{}\" does not exist.",
                    g.condition_type
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate \"{}\" is not \"True\", but {}",
                    g.condition_type, c.status
                )),
                Some(_) => None,
            }
        });
    let ready_why = match (&why_unready, gate_problem) {
        (Some(w), _) => Some(w.clone()),
        (None, Some(m)) => Some(("ReadinessGatesNotReady", m)),
        (None, None) => None,
    };
    let conditions = vec![
        times.condition("PodReadyToStartContainers", f.sandbox_ready, None),
        initialized,
        times.condition("ContainersReady", containers_ready, why_unready),
        times.condition("Ready", ready_why.is_none(), ready_why),
    ];
    let default_waiting = if init_done {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let init: Vec<Value> = ctrs
        .iter()
        .filter(|c| c.kind != Kind::Main)
        .map(|c| container_json(c, "PodInitializing", f.setup_error))
        .collect();
    let mut main: Vec<(String, Value)> = ctrs
        .iter()
        .filter(|c| c.kind == Kind::Main)
        .map(|c| {
            (
                c.spec.name.clone(),
                container_json(c, default_waiting, f.setup_error),
            )
        })
        .collect();
    // The kubelet sorts containerStatuses by name (init containers stay in spec order).
    main.sort_by(|a, b| a.0.cmp(&b.0));
    let host = f.host_ip.to_string();
    let mut status = json!({
        "phase": phase,
        "conditions": conditions,
        "hostIP": host,
        "hostIPs": [{"ip": host}],
        "startTime": f.start_time,
        "qosClass": resources::qos(f.pod),
        "containerStatuses": main.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    });
    if !init.is_empty() {
        status["initContainerStatuses"] = json!(init);
    }
    if let Some(ip) = f.pod_ip {
        status["podIP"] = json!(ip.to_string());
        status["podIPs"] = json!([{"ip": ip.to_string()}]);
    }
    if let Some(g) = f.pod.metadata.generation {
        status["observedGeneration"] = json!(g);
    }
    status
}

/// Whether the pod's phase (as the API holds it) is terminal.
pub(super) fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}
