//! Service names and cluster IPs, once a test names a namespace whose pods dial Services
//! ([`super::Kubelet::resolve_services`]; Knative's activator dials
//! `autoscaler.knative-serving.svc.cluster.local:8080`, its autoscaler probes a revision's
//! public Service at port 80). The plane has no cluster DNS and no kube-proxy; this plays the
//! smallest part of each:
//!
//! - names: such a pod's sandbox gets a mount namespace of its own with a hosts file of its
//!   own bind-mounted on `/etc/hosts` (the kubelet manages a pod's `/etc/hosts` the same way),
//!   holding the kubelet's lines (localhost, the pod's address and name) and a line per
//!   Service as cluster DNS answers it: `{service}.{namespace}.svc.cluster.local`,
//!   `{service}.{namespace}.svc` and `{service}.{namespace}` (the last two reached through a
//!   pod's search domains) name its cluster IP; a headless Service's name, its ready
//!   endpoints; an `ExternalName` Service naming a Service of the cluster, what that name leads
//!   to. The file is rewritten in place (the bind mount keeps its inode) within a second of a
//!   change; resolvers read it again when it changed (Go's every 5 s). Other pods keep the
//!   node's `/etc/hosts`.
//! - cluster IPs: kube-proxy's userspace mode, in the node's network namespace (where pods'
//!   default route leads): each cluster IP is an address of the node's loopback device, each
//!   Service port a listener there that hands every TCP connection to a ready endpoint of that
//!   port (from the EndpointSlices, one drawn at random), or closes it when there is none.
//!   Once on, it serves every client of the node, as kube-proxy does; TCP only.
//!
//! Both follow the Services and EndpointSlices read every second with kube-proxy's identity
//! ([`super::KubeletConfig::proxy_client`]), and only while some namespace resolves names:
//! other targets' planes are unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::Api;
use tokio::task::JoinHandle;

use super::Shared;

/// How often the Services and EndpointSlices are read again.
const EVERY: Duration = Duration::from_secs(1);
/// How long a proxied connection's dial of an endpoint may take.
const DIAL: Duration = Duration::from_secs(5);

/// A pod's hosts file as the kubelet tracks it.
pub(super) struct Entry {
    path: PathBuf,
    /// The kubelet's own lines for this pod (localhost, its address and name).
    head: String,
    /// What was last written, so unchanged files are not rewritten.
    written: String,
}

/// The file of pod `uid` in the set the loop rewrites; leaves it when dropped.
pub(super) struct Registration {
    k: Arc<Shared>,
    uid: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.k.hosts.lock().unwrap().remove(&self.uid);
    }
}

/// Writes pod `uid`'s hosts file at `path` (its address `ip`, its name `hostname`) with the
/// Service names known now, and has the loop keep it current. `Err` when it cannot be written.
pub(super) fn register(
    k: &Arc<Shared>,
    uid: &str,
    path: &Path,
    ip: Ipv4Addr,
    hostname: &str,
) -> Result<Registration, String> {
    let head = format!(
        "# Kubernetes-managed hosts file (the plane's kubelet stand-in).\n\
         127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{ip}\t{hostname}\n"
    );
    let text = format!("{head}{}", k.service_lines.lock().unwrap());
    std::fs::write(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    k.hosts.lock().unwrap().insert(
        uid.to_string(),
        Entry {
            path: path.to_owned(),
            head,
            written: text,
        },
    );
    Ok(Registration {
        k: k.clone(),
        uid: uid.to_string(),
    })
}

/// What the Services and EndpointSlices say now.
#[derive(Default)]
struct Snapshot {
    /// The hosts-file lines of every Service name.
    lines: String,
    /// cluster IP and port -> the ready endpoints of that port.
    backends: BTreeMap<SocketAddr, Vec<SocketAddr>>,
}

/// The endpoints each proxied cluster IP and port hands connections to, shared with the
/// listeners.
type Backends = Arc<Mutex<BTreeMap<SocketAddr, Vec<SocketAddr>>>>;

/// Until shutdown: every [`EVERY`], while some namespace resolves names, reads the Services
/// and EndpointSlices, rewrites each hosts file that would change and keeps a listener on
/// every cluster IP and port. API errors keep what was read last.
pub(super) async fn run(k: Arc<Shared>) {
    let services: Api<Service> = Api::all(k.cfg.proxy_client.clone());
    let slices: Api<EndpointSlice> = Api::all(k.cfg.proxy_client.clone());
    let backends: Backends = Arc::default();
    let mut listeners: BTreeMap<SocketAddr, JoinHandle<()>> = BTreeMap::new();
    let mut addresses: BTreeSet<Ipv4Addr> = BTreeSet::new();
    loop {
        tokio::select! {
            () = k.stop.cancelled() => break,
            () = tokio::time::sleep(EVERY) => {}
        }
        if k.dns_namespaces.lock().unwrap().is_empty() {
            continue;
        }
        let read = async {
            let s = services.list(&Default::default()).await?.items;
            let e = slices.list(&Default::default()).await?.items;
            Ok::<_, kube::Error>((s, e))
        };
        let (svcs, eps) = match read.await {
            Ok(r) => r,
            Err(e) => {
                k.say(format_args!("service names: reading the API: {e}"));
                continue;
            }
        };
        let snap = snapshot(&svcs, &eps);
        *k.service_lines.lock().unwrap() = snap.lines.clone();
        for e in k.hosts.lock().unwrap().values_mut() {
            let text = format!("{}{}", e.head, snap.lines);
            if text != e.written {
                // In place: the bind mount on the pod's /etc/hosts holds this inode.
                match std::fs::write(&e.path, &text) {
                    Ok(()) => e.written = text,
                    Err(err) => k.say(format_args!("hosts file {}: {err}", e.path.display())),
                }
            }
        }
        let wanted_ips: BTreeSet<Ipv4Addr> = snap
            .backends
            .keys()
            .filter_map(|a| match a.ip() {
                std::net::IpAddr::V4(ip) => Some(ip),
                std::net::IpAddr::V6(_) => None,
            })
            .collect();
        for ip in wanted_ips.difference(&addresses.clone()) {
            match ip_cmd(&k, &["addr", "add", &format!("{ip}/32"), "dev", "lo"]).await {
                Ok(()) => {
                    addresses.insert(*ip);
                }
                Err(e) => k.say(format_args!("cluster IP {ip}: {e}")),
            }
        }
        listeners.retain(|at, task| {
            let keep = snap.backends.contains_key(at);
            if !keep {
                task.abort();
            }
            keep
        });
        for at in snap.backends.keys() {
            if !listeners.contains_key(at) && addresses.contains(&ip4(at)) {
                match tokio::net::TcpListener::bind(at).await {
                    Ok(l) => {
                        listeners.insert(*at, tokio::spawn(serve(l, *at, backends.clone())));
                    }
                    Err(e) => k.say(format_args!("cluster IP {at}: {e}")),
                }
            }
        }
        *backends.lock().unwrap() = snap.backends;
        for ip in addresses.clone().difference(&wanted_ips) {
            let _ = ip_cmd(&k, &["addr", "del", &format!("{ip}/32"), "dev", "lo"]).await;
            addresses.remove(ip);
        }
    }
    for t in listeners.values() {
        t.abort();
    }
}

fn ip4(a: &SocketAddr) -> Ipv4Addr {
    match a.ip() {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    }
}

/// `ip args` in the node's namespace.
async fn ip_cmd(k: &Shared, args: &[&str]) -> Result<(), String> {
    let out = tokio::process::Command::new(&k.tools.ip)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// One cluster IP and port: each connection goes to an endpoint drawn from `backends`.
async fn serve(listener: tokio::net::TcpListener, at: SocketAddr, backends: Backends) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            return;
        };
        let choices = backends
            .lock()
            .unwrap()
            .get(&at)
            .cloned()
            .unwrap_or_default();
        if choices.is_empty() {
            continue;
        }
        let to = choices[rand::random_range(0..choices.len())];
        tokio::spawn(async move {
            if let Ok(Ok(mut outbound)) =
                tokio::time::timeout(DIAL, tokio::net::TcpStream::connect(to)).await
            {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// The names and the proxied ports of `services`, their endpoints from `slices`.
fn snapshot(services: &[Service], slices: &[EndpointSlice]) -> Snapshot {
    // (namespace, service) -> port name -> ready endpoint addresses.
    let mut ready: BTreeMap<(String, String), BTreeMap<String, Vec<SocketAddr>>> = BTreeMap::new();
    for s in slices {
        let Some(svc) = s.labels().get("kubernetes.io/service-name").cloned() else {
            continue;
        };
        let ns = s.namespace().unwrap_or_default();
        for p in s.ports.iter().flatten() {
            let Some(port) = p.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            for e in &s.endpoints {
                if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for a in &e.addresses {
                    if let Ok(ip) = a.parse::<Ipv4Addr>() {
                        ready
                            .entry((ns.clone(), svc.clone()))
                            .or_default()
                            .entry(p.name.clone().unwrap_or_default())
                            .or_default()
                            .push(SocketAddr::from((ip, port)));
                    }
                }
            }
        }
    }
    let mut snap = Snapshot::default();
    // name -> the addresses it leads to.
    let mut names: BTreeMap<String, BTreeSet<Ipv4Addr>> = BTreeMap::new();
    let mut external: Vec<(String, String)> = Vec::new();
    for svc in services {
        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        let fqdn = format!("{name}.{ns}.svc.cluster.local");
        if spec.type_.as_deref() == Some("ExternalName") {
            if let Some(to) = &spec.external_name {
                external.push((fqdn, to.trim_end_matches('.').to_string()));
            }
            continue;
        }
        let eps = ready.get(&(ns.clone(), name.clone()));
        match spec.cluster_ip.as_deref().map(str::parse::<Ipv4Addr>) {
            Some(Ok(ip)) => {
                names.entry(fqdn).or_default().insert(ip);
                for p in spec.ports.iter().flatten() {
                    if p.protocol.as_deref().is_some_and(|p| p != "TCP") {
                        continue;
                    }
                    let Ok(port) = u16::try_from(p.port) else {
                        continue;
                    };
                    let to = eps
                        .and_then(|m| m.get(&p.name.clone().unwrap_or_default()))
                        .cloned()
                        .unwrap_or_default();
                    snap.backends.insert(SocketAddr::from((ip, port)), to);
                }
            }
            // Headless: the name leads to the ready endpoints themselves.
            _ => {
                let ips = eps
                    .into_iter()
                    .flat_map(|m| m.values().flatten())
                    .filter_map(|a| match a.ip() {
                        std::net::IpAddr::V4(ip) => Some(ip),
                        std::net::IpAddr::V6(_) => None,
                    });
                names.entry(fqdn).or_default().extend(ips);
            }
        }
    }
    for (from, to) in external {
        if let Some(ips) = names.get(&to).cloned() {
            names.entry(from).or_default().extend(ips);
        }
    }
    for (fqdn, ips) in names {
        let short = fqdn.trim_end_matches(".svc.cluster.local");
        for ip in ips {
            let _ = writeln!(snap.lines, "{ip}\t{fqdn} {short}.svc {short}");
        }
    }
    snap
}
