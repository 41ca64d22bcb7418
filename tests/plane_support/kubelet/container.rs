//! One container of a pod as the kubelet tracks it: its current process ([`Run`]), its
//! probes' verdicts, its restarts and back-off, and what its status reports.

use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use tokio::time::Instant;

use super::process::{self, Run, StartCtx};
use super::{backoff, now_time};

/// What a pod's task hears from the processes and probes of its containers. `seq` names the
/// run (one process) it is about: news of an earlier run is ignored.
pub(super) enum Event {
    Exited {
        ctr: usize,
        seq: u64,
        code: i32,
        finished_at: String,
    },
    Probe {
        ctr: usize,
        seq: u64,
        news: Probed,
    },
    /// The termination task is done: every process it stopped has exited.
    Stopped,
}

/// A probe's verdict, sent when it changes.
#[derive(Debug)]
pub(super) enum Probed {
    /// The startup probe passed: readiness and liveness probes begin.
    Started,
    Ready(bool),
    /// The startup or liveness probe failed `failureThreshold` times: the container is killed.
    Unhealthy(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// An init container: runs to completion before the next.
    Init,
    /// An init container with `restartPolicy: Always`: started in order, then kept running.
    Sidecar,
    Main,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub(super) struct Term {
    pub(super) exit_code: i32,
    pub(super) reason: String,
    pub(super) message: Option<String>,
    pub(super) started_at: String,
    pub(super) finished_at: String,
    pub(super) container_id: String,
}

pub(super) struct Ctr {
    pub(super) spec: Container,
    pub(super) kind: Kind,
    pub(super) run: Option<Run>,
    pub(super) restarts: i32,
    /// Exits in a row (the crash back-off), reset by a run of 10 minutes.
    streak: u32,
    /// Failed starts for want of an image (the image back-off).
    pull_failures: u32,
    /// When to start it next; `None`: not to be started again.
    pub(super) due: Option<Instant>,
    /// Why it is not running, while it waits to be started.
    pub(super) waiting: Option<(String, String)>,
    /// The previous run's end (`lastState`).
    pub(super) last: Option<Term>,
    /// The last run's end when no restart follows (`state.terminated`).
    pub(super) term: Option<Term>,
    /// An init container that exited 0.
    pub(super) done: bool,
    /// Its startup probe passed once (a sidecar lets the next init container start then).
    pub(super) ever_started: bool,
    /// It ran at least once: a start after that is a restart.
    ran: bool,
}

impl Ctr {
    pub(super) fn new(spec: Container, kind: Kind) -> Self {
        Self {
            spec,
            kind,
            run: None,
            restarts: 0,
            streak: 0,
            pull_failures: 0,
            due: Some(Instant::now()),
            waiting: None,
            last: None,
            term: None,
            done: false,
            ever_started: false,
            ran: false,
        }
    }

    /// Whether it should be started now.
    pub(super) fn is_due(&self, now: Instant) -> bool {
        self.run.is_none() && self.due.is_some_and(|d| d <= now)
    }

    /// Starts it; on failure records the waiting reason and when to try again (image:
    /// ErrImagePull then ImagePullBackOff with the image back-off; configuration: 2 s, as
    /// the Node authorizer may not have seen the binding yet; a command the image cannot
    /// run: the crash back-off).
    pub(super) async fn start(&mut self, idx: usize, cx: &StartCtx<'_>) {
        self.due = None;
        let attempt = self.restarts + i32::from(self.ran);
        match process::spawn(&self.spec, self.kind, attempt, idx, cx).await {
            Ok(run) => {
                if self.ran {
                    self.restarts += 1;
                }
                self.ran = true;
                self.ever_started |= run.started;
                self.waiting = None;
                self.term = None;
                self.pull_failures = 0;
                self.run = Some(run);
            }
            Err(f) => {
                let (reason, delay) = match f.reason {
                    "ErrImagePull" => {
                        self.pull_failures += 1;
                        let r = if self.pull_failures == 1 {
                            "ErrImagePull"
                        } else {
                            "ImagePullBackOff"
                        };
                        (r, backoff(self.pull_failures + 1))
                    }
                    "CreateContainerConfigError" => (f.reason, Duration::from_secs(2)),
                    _ => {
                        self.streak += 1;
                        (f.reason, backoff(self.streak).max(Duration::from_secs(1)))
                    }
                };
                self.waiting = Some((reason.to_string(), f.message));
                self.due = Some(Instant::now() + delay);
            }
        }
    }

    /// Applies a probe's verdict to the current run (if it is run `seq`); `Some` is a reason
    /// to kill it (startup or liveness failure).
    pub(super) fn probed(&mut self, seq: u64, news: Probed) -> Option<String> {
        let run = self.run.as_mut().filter(|r| r.seq == seq)?;
        match news {
            Probed::Started => {
                run.started = true;
                run.ready = self.spec.readiness_probe.is_none();
                self.ever_started = true;
                None
            }
            Probed::Ready(r) => {
                run.ready = r && run.started;
                None
            }
            Probed::Unhealthy(why) if !run.stopping => {
                run.stopping = true;
                run.ready = false;
                run.kill_reason = Some(why.clone());
                Some(why)
            }
            Probed::Unhealthy(_) => None,
        }
    }

    /// Records run `seq`'s exit and decides what follows: done (an init container's exit 0),
    /// terminated (no restart under the pod's `policy`, or the pod is `terminating`), or a
    /// restart after the back-off (CrashLoopBackOff while it waits). `pod_ref` is
    /// "name_namespace(uid)" for the message.
    pub(super) fn exited(
        &mut self,
        seq: u64,
        code: i32,
        finished_at: String,
        policy: &str,
        terminating: bool,
        pod_ref: &str,
    ) {
        let Some(run) = self.run.take_if(|r| r.seq == seq) else {
            return;
        };
        let term = Term {
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: run.kill_reason.clone(),
            started_at: run.started_at.clone(),
            finished_at,
            container_id: run.container_id.clone(),
        };
        let ran_long = run.since.elapsed() >= Duration::from_secs(600);
        drop(run);
        let restart = !terminating
            && match self.kind {
                Kind::Init if code == 0 => {
                    self.done = true;
                    false
                }
                Kind::Init => policy != "Never",
                Kind::Sidecar => true,
                Kind::Main => match policy {
                    "Never" => false,
                    "OnFailure" => code != 0,
                    _ => true,
                },
            };
        if !restart {
            self.term = Some(term);
            self.due = None;
            return;
        }
        if ran_long {
            self.streak = 0;
        }
        self.streak += 1;
        let delay = backoff(self.streak);
        self.last = Some(term);
        self.due = Some(Instant::now() + delay);
        self.waiting = (!delay.is_zero()).then(|| {
            (
                "CrashLoopBackOff".to_string(),
                format!(
                    "back-off {}s restarting failed container={} pod={pod_ref}",
                    delay.as_secs(),
                    self.spec.name
                ),
            )
        });
    }

    /// At the end of the pod: a container that is not terminated reports its last exit, or
    /// (never started) the kubelet's ContainerStatusUnknown.
    pub(super) fn settle(&mut self) {
        self.due = None;
        if self.term.is_some() || self.done || self.run.is_some() {
            return;
        }
        self.waiting = None;
        self.term = Some(self.last.take().unwrap_or_else(|| Term {
            exit_code: 137,
            reason: "ContainerStatusUnknown".into(),
            message: Some("The container could not be located when the pod was terminated".into()),
            started_at: String::new(),
            finished_at: now_time(),
            container_id: String::new(),
        }));
    }
}
