//! The pure decisions of the process platform: restart backoff, when a revision counts as
//! failing, and whether an early exit was a port race. No I/O, no clock.

use std::time::Duration;

/// How replicas that exit on their own are replaced, and when a revision is declared failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Delay before the first replacement after an exit.
    pub initial_backoff: Duration,
    /// The delay doubles per consecutive exit of the same replica up to this cap. A replica
    /// that stayed ready for at least this long starts again from `initial_backoff`.
    pub max_backoff: Duration,
    /// Consecutive exits without any replica of the revision becoming ready after which the
    /// revision's status goes `Failing`. At least 1.
    pub crash_limit: u32,
    /// Whether the `Failing` reason quotes the replica's last output line. Off by default: the
    /// reason reaches the admin port's `/revisions`, and output can carry secrets. The line is
    /// logged either way.
    pub reason_quotes_output: bool,
}

impl Default for RestartPolicy {
    /// 100 ms doubling to 10 s; failing after 3 crashes in a row.
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            crash_limit: 3,
            reason_quotes_output: false,
        }
    }
}

impl RestartPolicy {
    /// The delay before restart number `attempt` (1-based) of one replica:
    /// `initial * 2^(attempt-1)`, capped at `max_backoff`. `attempt` 0 is treated as 1.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        self.initial_backoff
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max_backoff)
    }

    /// Whether `consecutive_crashes` (exits with no ready replica in between) make the revision
    /// `Failing`.
    pub fn is_failing(&self, consecutive_crashes: u32) -> bool {
        consecutive_crashes >= self.crash_limit.max(1)
    }
}

/// What to do about a replica that exited before it became ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyExit {
    /// Its port was taken by someone else between picking and binding: start it again on a
    /// new port at once, without counting a crash.
    RetryNewPort,
    /// A real crash: count it and restart with backoff.
    Crash,
}

/// Decides about an exit before ready. `port_in_use` is whether the replica's port is bound
/// by another socket after the replica is gone; `retries_used` port retries were already made
/// for this start, at most `max_retries` are allowed.
pub fn early_exit(port_in_use: bool, retries_used: u32, max_retries: u32) -> EarlyExit {
    if port_in_use && retries_used < max_retries {
        EarlyExit::RetryNewPort
    } else {
        EarlyExit::Crash
    }
}

/// The `Failing` reason of a revision whose replicas keep crashing, from the description of the
/// last exit (see [`describe_exit`]); its quoted output only with `quote_output`.
pub fn crash_reason(last_exit: &str, quote_output: bool) -> String {
    let exit = if quote_output {
        last_exit
    } else {
        last_exit.split(OUTPUT_OPEN).next().unwrap_or(last_exit)
    };
    format!("replicas keep crashing: {exit}")
}

/// Where [`describe_exit`]'s quoted output starts.
const OUTPUT_OPEN: &str = " (last output: '";

/// Describes an exit for logs and failure reasons: `what`, then the last output line if any,
/// e.g. `exit status 1 (last output: 'boom')`. The quoted line is cut to 200 characters.
pub fn describe_exit(what: &str, last_line: Option<&str>) -> String {
    match last_line.map(str::trim).filter(|l| !l.is_empty()) {
        Some(line) => {
            let cut: String = line.chars().take(200).collect();
            let ellipsis = if cut.len() < line.len() { "..." } else { "" };
            format!("{what}{OUTPUT_OPEN}{cut}{ellipsis}')")
        }
        None => what.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_initial_and_caps() {
        let p = RestartPolicy::default();
        assert_eq!(p.backoff(0), Duration::from_millis(100));
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(4), Duration::from_millis(800));
        assert_eq!(p.backoff(8), Duration::from_millis(10_000));
        assert_eq!(p.backoff(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn failing_after_crash_limit_in_a_row() {
        let p = RestartPolicy::default();
        assert!(!p.is_failing(0));
        assert!(!p.is_failing(2));
        assert!(p.is_failing(3));
        let zero = RestartPolicy {
            crash_limit: 0,
            ..p
        };
        assert!(!zero.is_failing(0), "a limit of 0 acts as 1");
        assert!(zero.is_failing(1));
    }

    #[test]
    fn early_exit_retries_only_a_taken_port_and_only_boundedly() {
        assert_eq!(early_exit(true, 0, 3), EarlyExit::RetryNewPort);
        assert_eq!(early_exit(true, 2, 3), EarlyExit::RetryNewPort);
        assert_eq!(early_exit(true, 3, 3), EarlyExit::Crash);
        assert_eq!(early_exit(false, 0, 3), EarlyExit::Crash);
    }

    #[test]
    fn exit_descriptions_quote_the_last_line() {
        assert_eq!(
            crash_reason(&describe_exit("exit status 1", Some("boom\n")), true),
            "replicas keep crashing: exit status 1 (last output: 'boom')"
        );
        // By default the reason (shown on /revisions) leaves the output out.
        assert_eq!(
            crash_reason(&describe_exit("exit status 1", Some("password=x")), false),
            "replicas keep crashing: exit status 1"
        );
        assert_eq!(describe_exit("exit status 2", Some("  ")), "exit status 2");
        let long = "x".repeat(300);
        assert!(describe_exit("e", Some(&long)).ends_with("...')"));
    }
}
