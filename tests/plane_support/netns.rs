//! The plane's own network: the test process re-executes itself inside new user, network, PID
//! and mount namespaces (`unshare`), where it is root, the only network is its own and every
//! process it starts dies with it (it is PID 1 there; `--kill-child` ends it when `unshare`
//! is killed). Inside, a bridge carries the node's address and each pod gets its own network
//! namespace on the bridge (the kubelet stand-in), so pods bind their ports as in a real
//! cluster and a real API server accepts their addresses (it refuses loopback ones in
//! Endpoints and EndpointSlices).
//!
//! Addresses: [`NODE_IP`] (the API server, etcd's clients, the node) on [`BRIDGE`], pods from
//! [`FIRST_POD_IP`] in 10.244.0.0/16, Services' cluster IPs from [`SERVICE_CIDR`] (disjoint;
//! nothing routes them: there is no kube-proxy).

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::process::{Command, ExitCode, Stdio};

/// Set in the re-executed process: it is inside the namespaces.
pub const INSIDE_ENV: &str = "THAW_REAL_PLANE_INSIDE";
pub const BRIDGE: &str = "thaw0";
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
pub const FIRST_POD_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);
pub const LAST_POD_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 255, 254);
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// Whether this process runs inside the plane's namespaces.
pub fn inside() -> bool {
    std::env::var_os(INSIDE_ENV).is_some()
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn works(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs this test binary again, with the same arguments, inside new namespaces, and returns
/// its exit code. As root `unshare` needs nothing more; otherwise it maps the user to root in
/// a user namespace, or, where user namespaces are off, runs through `sudo -n`. When none of
/// these can, the error says what to enable.
pub fn reexec() -> Result<ExitCode, String> {
    const NS: [&str; 7] = [
        "--net",
        "--pid",
        "--fork",
        "--mount",
        "--mount-proc",
        "--kill-child",
        "--",
    ];
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this test binary: {e}"))?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut cmd = if is_root() {
        let mut c = Command::new("unshare");
        c.args(NS);
        c
    } else if works(Command::new("unshare").args(["--user", "--map-root-user", "--net", "true"])) {
        let mut c = Command::new("unshare");
        c.args(["--user", "--map-root-user"]).args(NS);
        c
    } else if works(Command::new("sudo").args(["-n", "unshare", "--net", "true"])) {
        let mut c = Command::new("sudo");
        c.args(["-n", "--preserve-env", "unshare"]).args(NS);
        c
    } else {
        return Err(
            "the real control plane needs its own network namespace: run as root, \
             enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
             or user.max_user_namespaces > 0), or allow `sudo -n unshare`"
                .into(),
        );
    };
    cmd.arg(exe).args(args).env(INSIDE_ENV, "1");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run unshare (util-linux): {e}"))?;
    Ok(ExitCode::from(
        status.code().unwrap_or(101).clamp(0, 255) as u8
    ))
}

/// Runs `ip` with these arguments; the error names the command and what it printed.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Inside the namespaces: loopback up and the bridge with the node's address.
pub fn network() -> Result<(), String> {
    ip(&["link", "set", "lo", "up"])?;
    ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{NODE_IP}/16"), "dev", BRIDGE])?;
    ip(&["link", "set", BRIDGE, "up"])?;
    Ok(())
}
