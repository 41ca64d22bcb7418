//! A pod's network: its address (from [`IpPool`]) and its network namespace ([`Sandbox`]),
//! held by a pause process as a pod sandbox is, with a veth pair whose host end is on the
//! node's bridge and whose pod end is `eth0`.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Registered, Shared};

/// Pod addresses, handed out in order (round-robin over the range, as host-local IPAM does,
/// so a freed address is reused only once the others were), never the node's own.
pub(super) struct IpPool {
    first: u32,
    last: u32,
    /// Where the next search starts.
    next: u32,
    used: BTreeSet<u32>,
    node: u32,
}

impl IpPool {
    pub(super) fn new(range: &RangeInclusive<Ipv4Addr>, node: Ipv4Addr) -> Self {
        let (first, last) = (u32::from(*range.start()), u32::from(*range.end()));
        Self {
            first,
            last,
            next: first,
            used: BTreeSet::new(),
            node: u32::from(node),
        }
    }

    /// A free address; `None` when every one is taken.
    pub(super) fn take(&mut self) -> Option<Ipv4Addr> {
        if self.last < self.first {
            return None;
        }
        let size = u64::from(self.last - self.first) + 1;
        let mut at = self.next;
        for _ in 0..size {
            let candidate = at;
            at = if at >= self.last { self.first } else { at + 1 };
            if candidate != self.node && !self.used.contains(&candidate) {
                self.used.insert(candidate);
                self.next = at;
                return Some(Ipv4Addr::from(candidate));
            }
        }
        None
    }

    /// Gives `ip` back.
    pub(super) fn free(&mut self, ip: Ipv4Addr) {
        self.used.remove(&u32::from(ip));
    }
}

/// An address taken from the pool, given back when dropped.
struct IpLease {
    k: Arc<Shared>,
    ip: Ipv4Addr,
}

impl Drop for IpLease {
    fn drop(&mut self) {
        self.k.ips.lock().unwrap().free(self.ip);
    }
}

/// A pod's network namespace: the pause process holding it (`unshare --net sleep
/// infinity`), its address and the host end of its veth; for a pod that resolves Service
/// names, a mount namespace too, with its hosts file on `/etc/hosts` ([`super::hosts`]).
/// Dropping it kills the pause process (the namespaces, its `eth0` and the veth pair go with
/// it), removes the host end, then frees the address.
pub(super) struct Sandbox {
    k: Arc<Shared>,
    pub(super) ip: Ipv4Addr,
    pub(super) pid: i32,
    host_veth: String,
    /// Containers enter the pause process's mount namespace too (it has the pod's hosts file).
    pub(super) mount_ns: bool,
    child: tokio::process::Child,
    _registered: Registered,
    _hosts: Option<super::hosts::Registration>,
    // Last: the address is freed after the namespace is gone.
    _lease: IpLease,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::process::Command::new(&self.k.tools.ip)
            .args(["link", "del", &self.host_veth])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Sandbox {
    /// Takes an address and creates the namespace and wires it: `eth0` with the address/16,
    /// `lo` up, the default route via the node's address, the host end (`th<node><n>`,
    /// unique and 14 characters) on the bridge. With `hosts` (the pod's UID, its hosts file's
    /// path and its name), also a mount namespace with that file written and bind-mounted on
    /// `/etc/hosts`. `Err` says which step failed (everything made so far is undone; the
    /// caller retries); every step is bounded by a timeout.
    pub(super) async fn create(
        k: &Arc<Shared>,
        hosts: Option<(&str, &Path, &str)>,
    ) -> Result<Sandbox, String> {
        let ip = k
            .ips
            .lock()
            .unwrap()
            .take()
            .ok_or("no pod address left in the node's range")?;
        let lease = IpLease { k: k.clone(), ip };
        let node_tag = u16::from_str_radix(&super::sha256_hex(k.cfg.node_name.as_bytes())[..4], 16)
            .unwrap_or(0);
        let host_veth = format!("th{node_tag:04x}{:08x}", k.next() as u32);
        let mut child = tokio::process::Command::new(&k.tools.unshare)
            .arg("--net")
            .args(hosts.is_some().then_some("--mount"))
            .arg(&k.tools.sleep)
            .arg("infinity")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning unshare: {e}"))?;
        let pid = child.id().ok_or("unshare exited at once")? as i32;
        let registered = k.register(pid);
        // The namespace exists once the child's differs from ours (unshare has run).
        let ours = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use tokio::io::AsyncReadExt;
                    let _ = e.read_to_string(&mut err).await;
                }
                return Err(format!("unshare --net exited ({st}): {}", err.trim()));
            }
            match std::fs::read_link(format!("/proc/{pid}/ns/net")) {
                Ok(ns) if ns != ours => break,
                _ if Instant::now() >= deadline => {
                    return Err("the pause process has no network namespace after 5 s".into());
                }
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        let mut sandbox = Sandbox {
            k: k.clone(),
            ip,
            pid,
            host_veth: host_veth.clone(),
            mount_ns: hosts.is_some(),
            child,
            _registered: registered,
            _hosts: None,
            _lease: lease,
        };
        let pid_s = pid.to_string();
        let cidr = format!("{ip}/16");
        let gw = k.cfg.node_ip.to_string();
        let host: [&[&str]; 3] = [
            &[
                "link", "add", &host_veth, "type", "veth", "peer", "name", "eth0", "netns", &pid_s,
            ],
            &["link", "set", &host_veth, "master", &k.cfg.bridge],
            &["link", "set", &host_veth, "up"],
        ];
        for args in host {
            run(&k.tools.ip, args).await?;
        }
        let inside: [&[&str]; 4] = [
            &["link", "set", "lo", "up"],
            &["link", "set", "eth0", "up"],
            &["addr", "add", &cidr, "dev", "eth0"],
            &["route", "add", "default", "via", &gw],
        ];
        let ip_tool = k.tools.ip.to_string_lossy().into_owned();
        for args in inside {
            let mut full = vec!["--target", &pid_s, "--net", "--", &ip_tool];
            full.extend_from_slice(args);
            run(&k.tools.nsenter, &full).await?;
        }
        if let Some((uid, path, hostname)) = hosts {
            sandbox._hosts = Some(super::hosts::register(k, uid, path, ip, hostname)?);
            let (mount, file) = (
                k.tools.mount.to_string_lossy().into_owned(),
                path.to_string_lossy().into_owned(),
            );
            run(
                &k.tools.nsenter,
                &[
                    "--target",
                    &pid_s,
                    "--mount",
                    "--",
                    &mount,
                    "--bind",
                    &file,
                    "/etc/hosts",
                ],
            )
            .await?;
        }
        Ok(sandbox)
    }
}

/// Runs `program args` to completion within 10 s; `Err` carries its stderr.
async fn run(program: &Path, args: &[&str]) -> Result<(), String> {
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("{} {}: timed out", program.display(), args.join(" ")))?
    .map_err(|e| format!("{} {}: {e}", program.display(), args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {}: {}: {}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
