//! What every subcommand shares: exit codes, writing to a terminal that may have gone away, and
//! the listen-address syntax.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

/// Exit codes, the same for every subcommand (also in `thaw --help`).
pub const EXIT_CODES: &str = "\
Exit codes (every subcommand):
  0  ok (for `thaw local`: stopped cleanly after SIGINT or SIGTERM)
  1  invalid input (a file or value that does not validate), or the work failed
     (a port that cannot be bound, a file that cannot be written)
  2  usage: an unknown subcommand or flag, a missing or malformed argument
  3  `thaw migrate hand-back`: some objects wait for Knative's controller; run it again
  130  `thaw local` stopped at once by a second Ctrl-C";

/// Exit code 1: invalid input, or the work failed.
pub fn invalid() -> ExitCode {
    ExitCode::from(1)
}

/// Exit code 130: stopped at once by a second Ctrl-C (128 + SIGINT, as shells report it).
pub fn interrupted() -> ExitCode {
    ExitCode::from(130)
}

/// Writes `msg` and a newline to stderr, ignoring a closed or full stderr (`thaw ... 2>&1 |
/// head`): unlike `eprintln!`, never panics.
pub fn say(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "{msg}");
}

/// Writes `text` to stdout, ignoring a closed pipe (never panics, unlike `print!`).
pub fn out(text: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes());
    let _ = o.flush();
}

/// A listen address as operators write it: `127.0.0.1:8080`, `[::1]:8080`, `localhost:8080`
/// (the name's first address), `:8080` (every interface, as Go and `ss` write it) or `8080`
/// (that port on the loopback interface).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("{p:?} is not a port number (0-65535)"))
    };
    if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port(s)?));
    }
    if let Some(p) = s.strip_prefix(':') {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port(p)?));
    }
    let Some((host, p)) = s.rsplit_once(':') else {
        return Err(format!(
            "{s:?}: expected HOST:PORT, :PORT or PORT (e.g. 127.0.0.1:8080, localhost:8080, :8080)"
        ));
    };
    let p = port(p)?;
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p));
    }
    (host, p)
        .to_socket_addrs()
        .map_err(|e| format!("{s:?}: cannot resolve {host:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{s:?}: {host:?} has no address"))
}

/// A duration as operators write it: `15s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a number with a unit (500ms, 15s, 2m, 1h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_as_operators_write_them() {
        use std::time::Duration;
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("s").is_err());
    }

    use super::*;

    #[test]
    fn listen_addresses_as_operators_write_them() {
        let ok = [
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("[::1]:9090", "[::1]:9090"),
            ("localhost:8080", "127.0.0.1:8080"),
            ("LOCALHOST:0", "127.0.0.1:0"),
            (":8080", "0.0.0.0:8080"),
            ("8080", "127.0.0.1:8080"),
            (" 8081 ", "127.0.0.1:8081"),
        ];
        for (input, want) in ok {
            assert_eq!(parse_listen(input).unwrap().to_string(), want, "{input}");
        }
        for bad in ["", "http://x:1", ":99999", "localhost", "80a"] {
            assert!(parse_listen(bad).is_err(), "{bad:?} accepted");
        }
        assert!(
            parse_listen(":x")
                .unwrap_err()
                .contains("not a port number")
        );
    }
}
