//! Process limits the activator needs: many open sockets (one per client connection, one per
//! pooled upstream connection, plus held requests' connections).

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises the soft open-files limit (RLIMIT_NOFILE) to the hard limit and logs the result at
/// info. Returns `(soft, hard)` after the change. Call once at start-up, before listening.
pub fn raise_nofile_limit() -> nix::Result<(u64, u64)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(soft, hard, error = %e, "could not raise the open-files limit");
        return Err(e);
    }
    let (soft_now, hard_now) = getrlimit(Resource::RLIMIT_NOFILE)?;
    tracing::info!(
        before = soft,
        soft = soft_now,
        hard = hard_now,
        "open-files limit"
    );
    Ok((soft_now, hard_now))
}

#[cfg(test)]
mod tests {
    #[test]
    fn soft_limit_reaches_hard_limit() {
        let (soft, hard) = super::raise_nofile_limit().unwrap();
        assert_eq!(soft, hard);
    }
}
