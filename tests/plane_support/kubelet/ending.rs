//! How a pod's task reacts and ends: container exits and probe verdicts, termination
//! (preStop, SIGTERM, SIGKILL), the status write, the kill when the pod vanished, and the
//! Pod's final deletion.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::time::Instant;

use super::container::Event;
use super::pod::PodRun;
use super::process;
use super::status::{self, Facts};
use super::{api_retry, not_found, probe};

impl PodRun {
    /// Applies a process's exit or a probe's verdict (killing a container its liveness or
    /// startup probe failed), or notes that termination's stops are done.
    pub(super) fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Exited {
                ctr,
                seq,
                code,
                finished_at,
            } => {
                let terminating = self.terminating.is_some();
                let pod_ref = format!("{}_{}({})", self.name, self.ns, self.uid);
                if let Some(c) = self.ctrs.get_mut(ctr) {
                    c.exited(seq, code, finished_at, &self.policy, terminating, &pod_ref);
                }
            }
            Event::Probe { ctr, seq, news } => {
                let Some(c) = self.ctrs.get_mut(ctr) else {
                    return;
                };
                let Some(why) = c.probed(seq, news) else {
                    return;
                };
                let Some(run) = c.run.as_ref() else { return };
                // Killed as the kubelet kills an unhealthy container: with the probe's grace
                // period, else the pod's; restarted (or not) by its restartPolicy on exit.
                let grace = [&c.spec.liveness_probe, &c.spec.startup_probe]
                    .into_iter()
                    .flatten()
                    .find_map(|p| p.termination_grace_period_seconds)
                    .or(self
                        .pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds))
                    .unwrap_or(30);
                self.k.say(format_args!(
                    "pod {}/{}: container {}: {why}",
                    self.ns, self.name, c.spec.name
                ));
                let (pid, exited) = (run.pid, run.exited.clone());
                tokio::spawn(process::stop(
                    pid,
                    exited,
                    Duration::from_secs(grace.max(0) as u64),
                ));
            }
            Event::Stopped => {
                if self.terminating.is_some() {
                    self.terminating = Some(true);
                }
            }
        }
    }

    /// Stops every running container in parallel: its preStop hook within the grace period,
    /// then SIGTERM, then SIGKILL at the period's end (at least 2 s after a hook, as the
    /// kubelet gives). Restarts are off from now on. Sends [`Event::Stopped`] when done.
    pub(super) fn begin_termination(&mut self, grace: Duration) {
        let deadline = Instant::now() + grace;
        let mut stops = Vec::new();
        for c in &mut self.ctrs {
            c.due = None;
            if let Some(r) = c.run.as_mut()
                && !r.stopping
            {
                r.stopping = true;
                stops.push((c.spec.clone(), r.pid, r.exited.clone()));
            }
        }
        let (ip, tx, k) = (self.pod_ip, self.tx.clone(), self.k.clone());
        let who = format!("pod {}/{}", self.ns, self.name);
        tokio::spawn(async move {
            futures::future::join_all(stops.into_iter().map(|(spec, pid, exited)| {
                let (k, who) = (k.clone(), who.clone());
                async move {
                    let mut at_least = Instant::now();
                    if let (Some(h), Some(ip)) = (
                        spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()),
                        ip,
                    ) {
                        let line = tokio::time::timeout_at(
                            deadline,
                            probe::pre_stop(h, ip, &spec, deadline),
                        )
                        .await
                        .unwrap_or_else(|_| "preStop hook ran out of the grace period".into());
                        k.say(format_args!("{who}: container {}: {line}", spec.name));
                        at_least = Instant::now() + Duration::from_secs(2);
                    }
                    let grace = deadline
                        .max(at_least)
                        .saturating_duration_since(Instant::now());
                    process::stop(pid, exited, grace).await;
                }
            }))
            .await;
            let _ = tx.send(Event::Stopped).await;
        });
        self.terminating = Some(false);
    }

    /// The pod vanished from the API: every process killed at once, the sandbox gone.
    pub(super) fn kill_now(&mut self) {
        for r in self.ctrs.iter().filter_map(|c| c.run.as_ref()) {
            if !r.exited.is_cancelled() {
                let _ = kill(Pid::from_raw(r.pid), Signal::SIGKILL);
            }
        }
        self.sandbox = None;
    }

    /// Writes the status through `pods/status` (strategic merge: PodScheduled and other
    /// owners' conditions stay) when it differs from the last one written; errors are
    /// logged and retried with a short back-off.
    pub(super) async fn write_status(&mut self) {
        if self.foreign || Instant::now() < self.write_due {
            return;
        }
        let facts = Facts {
            pod: &self.pod,
            host_ip: self.k.cfg.node_ip,
            pod_ip: self.pod_ip,
            sandbox_ready: self.sandbox.is_some(),
            start_time: &self.start_time,
            terminal: self.over,
            setup_error: self.setup_error.as_deref(),
            policy: &self.policy,
        };
        let status = status::build(&facts, &self.ctrs, &mut self.times);
        if self.written.as_ref() == Some(&status) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.k.cfg.node_client.clone(), &self.ns);
        let patch = Patch::Strategic(json!({"status": status}));
        let pp = PatchParams::default();
        let call = api.patch_status(&self.name, &pp, &patch);
        match tokio::time::timeout(Duration::from_secs(15), call).await {
            Ok(Ok(_)) => {
                self.written = Some(status);
                self.write_failures = 0;
            }
            // Gone: nothing to report to (the watch tells the manager).
            Ok(Err(e)) if not_found(&e) => self.written = Some(status),
            failed => {
                self.write_failures += 1;
                let e = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".into(),
                };
                self.say(format_args!("writing status: {e}"));
                self.write_due = Instant::now() + api_retry(self.write_failures);
            }
        }
    }

    /// Deletes the Pod with grace 0 and its UID as precondition, as the kubelet does once
    /// its containers are stopped. Done on success, 404 or 409 (another pod of that name);
    /// other errors are retried with a short back-off.
    pub(super) async fn delete(&mut self) {
        let api: Api<Pod> = Api::namespaced(self.k.cfg.node_client.clone(), &self.ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match tokio::time::timeout(Duration::from_secs(15), api.delete(&self.name, &dp)).await {
            Ok(Ok(_)) => self.finished = true,
            Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => self.finished = true,
            failed => {
                self.delete_failures += 1;
                let e = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".into(),
                };
                self.say(format_args!("deleting: {e}"));
                self.delete_due = Instant::now() + api_retry(self.delete_failures);
            }
        }
    }
}
