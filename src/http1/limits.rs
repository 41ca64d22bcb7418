//! Process and socket limits the activator needs: many open sockets (one per client
//! connection, one per pooled upstream connection, plus held requests' connections), and TCP
//! keep-alive probes on each so a peer that vanished without a FIN is noticed.

use std::os::fd::AsFd;
use std::time::Duration;

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::socket::{setsockopt, sockopt};

/// Idle time before the first TCP keep-alive probe, and the time between probes: Go's default
/// for `net/http` servers and dialers, so Knative's activator and queue-proxy use it too.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// Turns on TCP keep-alive probes on a data-plane socket (every accepted client connection and
/// every upstream dial): the first after [`TCP_KEEPALIVE`] of silence, then one every
/// [`TCP_KEEPALIVE`]; after the kernel's count of unanswered probes (`tcp_keepalive_probes`, 9
/// by default, so about 150 s) the connection is reset. Without them a connection whose peer
/// vanished without a FIN (a crashed node, a NAT that forgot it) stays open for as long as
/// nothing is sent: a websocket tunnel with no idle timeout, or a pooled upstream connection,
/// would hold its slot and file descriptor indefinitely.
pub fn set_tcp_keepalive(socket: &impl AsFd) -> nix::Result<()> {
    let secs = TCP_KEEPALIVE.as_secs() as u32;
    setsockopt(socket, sockopt::KeepAlive, &true)?;
    setsockopt(socket, sockopt::TcpKeepIdle, &secs)?;
    setsockopt(socket, sockopt::TcpKeepInterval, &secs)
}

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
    use nix::sys::socket::{getsockopt, sockopt};

    #[test]
    fn keepalive_probes_are_set_on_a_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(!getsockopt(&client, sockopt::KeepAlive).unwrap());
        super::set_tcp_keepalive(&client).unwrap();
        assert!(getsockopt(&client, sockopt::KeepAlive).unwrap());
        assert_eq!(getsockopt(&client, sockopt::TcpKeepIdle).unwrap(), 15);
        assert_eq!(getsockopt(&client, sockopt::TcpKeepInterval).unwrap(), 15);
    }

    #[test]
    fn soft_limit_reaches_hard_limit() {
        let (soft, hard) = super::raise_nofile_limit().unwrap();
        assert_eq!(soft, hard);
    }
}
