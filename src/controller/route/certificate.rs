//! TLS through cert-manager (Knative's `external-domain-tls` with net-certmanager's
//! `Certificate`s, written directly: there is no Knative Certificate in between).
//!
//! - **One Certificate per external host** (Knative's `MakeCertificates`, its default: no
//!   namespace wildcard certificates): a route's Certificate is `route-{uid}` for its default
//!   host and `route-{uid}-{adler32(tag)}` for a tag's; a DomainMapping's is its domain. Each
//!   lives in its owner's namespace, owned by it, names the one host in `dnsNames`, its Secret
//!   after itself (`secretName`), and config-certmanager's `issuerRef`.
//! - **State** ([`state`]): cert-manager's `Ready=True` (for the spec written) is ready;
//!   `Issuing=False` with reason `Failed` is a failed issuance; anything else is not ready yet.
//! - **Status** ([`TlsOutcome::condition`]): `CertificateProvisioned` as Knative's Route marks
//!   it: True once every Certificate is ready; False `CertificateProvisionFailed` when one
//!   failed (or cert-manager's CRD is not served), `CertificateNotOwned` when a Certificate of
//!   that name is not the owner's; then False [`TLS_HOST_LIMIT_EXCEEDED`] when a host got no
//!   Certificate for the namespace's bound on TLS hosts ([`super::tls_limit`]), naming the
//!   bound; otherwise `CertificateNotReady` (Unknown), or, when `http-protocol` is `Enabled`,
//!   True `HTTPDowngrade` (the host is served over http meanwhile). A host is `https://` in
//!   the URLs once its Certificate is ready; until then, and when the bound leaves it without
//!   one, it is served, and reported, over http (with any `http-protocol`).
//!
//! The CRD generated from [`Certificate`] (tests/crds/certificates.cert-manager.io.yaml) is for
//! the tests' API server and the schema check of deploy/examples/ only: on a cluster
//! cert-manager's own CRD is installed.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::network::{HttpProtocol, IssuerRef, NetworkConfig};
use crate::knative::duck::{Condition, ConditionStatus};

/// The CRD of cert-manager's Certificate.
pub const CERTIFICATE_CRD: &str = "certificates.cert-manager.io";
/// Knative's condition type.
pub const CERTIFICATE_PROVISIONED: &str = "CertificateProvisioned";
/// `CertificateProvisioned=False`'s reason when the namespace's bound on TLS hosts left a
/// host without a certificate (config-istio's or config-gateway's
/// `max-tls-hosts-per-namespace`).
pub const TLS_HOST_LIMIT_EXCEEDED: &str = "TLSHostLimitExceeded";

/// cert-manager's `CertificateSpec` (the subset thaw writes).
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "Certificate",
    plural = "certificates",
    namespaced,
    status = "CertificateStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "cert",
    doc = "A cert-manager Certificate (the subset thaw writes and reads)."
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    /// The host names the certificate is for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    /// The Secret (in the Certificate's namespace) cert-manager writes the key pair to.
    pub secret_name: String,
    /// The issuer.
    pub issuer_ref: CertIssuerRef,
}

/// cert-manager's `ObjectReference` to an issuer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct CertIssuerRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl From<&IssuerRef> for CertIssuerRef {
    fn from(r: &IssuerRef) -> Self {
        Self {
            name: r.name.clone(),
            kind: Some(r.kind.clone()),
            group: r.group.clone(),
        }
    }
}

/// cert-manager's `CertificateStatus` (the conditions).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct CertificateStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<CertificateCondition>,
}

/// cert-manager's `CertificateCondition`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CRD of this subset, for an API server without cert-manager (the tests').
pub fn crd() -> CustomResourceDefinition {
    Certificate::crd()
}

/// A route's Certificate name for its group `tag` (Knative's `names.Certificate` and
/// `MakeCertificates`): `route-{uid}`, `route-{uid}-{adler32(tag)}` for a tag.
pub fn route_certificate_name(uid: &str, tag: Option<&str>) -> String {
    let base = format!("route-{uid}");
    match tag {
        None => base,
        Some(t) => format!("{base}-{}", adler2::adler32_slice(t.as_bytes())),
    }
}

/// The Certificate `name` for `host`, with the metadata `meta` gives (owner and labels).
pub fn certificate(meta: ObjectMeta, host: &str, net: &NetworkConfig) -> Certificate {
    let name = meta.name.clone().unwrap_or_default();
    Certificate {
        metadata: meta,
        spec: CertificateSpec {
            dns_names: vec![host.to_string()],
            secret_name: name,
            issuer_ref: (&net.certmanager.issuer_ref).into(),
        },
        status: None,
    }
}

/// What cert-manager says of a Certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertState {
    /// `Ready=True` for the spec written: its Secret holds the key pair.
    Ready,
    /// Not yet: cert-manager's reason when it gave one.
    NotReady(Option<String>),
    /// The issuance failed: cert-manager's message.
    Failed(Option<String>),
    /// No Certificate was written: the namespace's bound on TLS hosts (why, naming it).
    Limited(String),
}

/// The state of `desired` as `current` (the watch's copy) shows it.
pub fn state(desired: &Certificate, current: Option<&Certificate>) -> CertState {
    let Some(have) = current.filter(|c| c.spec == desired.spec) else {
        return CertState::NotReady(None);
    };
    let conds = have.status.iter().flat_map(|s| s.conditions.iter());
    let fresh = |c: &&CertificateCondition| {
        !matches!((c.observed_generation, have.metadata.generation),
            (Some(seen), Some(now)) if seen < now)
    };
    let find = |t: &str| conds.clone().filter(fresh).find(|c| c.type_ == t);
    if find("Ready").is_some_and(|c| c.status == "True") {
        return CertState::Ready;
    }
    if let Some(c) = find("Issuing").filter(|c| c.status == "False")
        && c.reason.as_deref() == Some("Failed")
    {
        return CertState::Failed(c.message.clone().or_else(|| c.reason.clone()));
    }
    CertState::NotReady(find("Ready").and_then(|c| c.reason.clone()))
}

/// One Certificate of an owner, as this reconcile found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertReport {
    pub name: String,
    /// Its host.
    pub host: String,
    /// Its Secret (in the owner's namespace).
    pub secret: String,
    pub state: CertState,
}

/// The owner's TLS, as this reconcile found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsOutcome {
    /// `external-domain-tls` is off (`true`: the owner is cluster-local).
    NotEnabled { cluster_local: bool },
    /// The API server does not serve cert-manager's Certificate.
    NotServed,
    /// A Certificate of that name exists and is not the owner's.
    NotOwned(String),
    /// The owner's Certificates.
    Certificates(Vec<CertReport>),
}

impl TlsOutcome {
    /// The hosts served over https: those whose Certificate is ready.
    pub fn https_hosts(&self) -> Vec<&str> {
        match self {
            TlsOutcome::Certificates(c) => c
                .iter()
                .filter(|c| c.state == CertState::Ready)
                .map(|c| c.host.as_str())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Whether the namespace's bound left a host without a Certificate.
    pub fn is_limited(&self) -> bool {
        matches!(self, TlsOutcome::Certificates(c)
            if c.iter().any(|c| matches!(c.state, CertState::Limited(_))))
    }

    /// The ingress description's TLS blocks: one per ready Certificate.
    pub fn ingress_tls(&self, namespace: &str) -> Vec<super::ingress::Tls> {
        match self {
            TlsOutcome::Certificates(c) => c
                .iter()
                .filter(|c| c.state == CertState::Ready)
                .map(|c| super::ingress::Tls {
                    hosts: vec![c.host.clone()],
                    secret_namespace: namespace.to_string(),
                    secret_name: c.secret.clone(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// `CertificateProvisioned` (the module doc): the first failure, else the first
    /// Certificate not ready yet, else True.
    pub fn condition(&self, http: HttpProtocol) -> Condition {
        let c = |status, reason: Option<&str>, message: Option<String>| Condition {
            reason: reason.map(Into::into),
            message,
            ..Condition::new(CERTIFICATE_PROVISIONED, status)
        };
        match self {
            TlsOutcome::NotEnabled { cluster_local } => c(
                ConditionStatus::True,
                Some("TLSNotEnabled"),
                Some(
                    if *cluster_local {
                        "TLS is not enabled for cluster-local"
                    } else {
                        "external-domain-tls is not enabled"
                    }
                    .into(),
                ),
            ),
            TlsOutcome::NotServed => c(
                ConditionStatus::False,
                Some("CertificateProvisionFailed"),
                Some(format!(
                    "external-domain-tls is enabled and the API server does not serve \
                     cert-manager's Certificates: install cert-manager (CRD {CERTIFICATE_CRD})."
                )),
            ),
            TlsOutcome::NotOwned(name) => c(
                ConditionStatus::False,
                Some("CertificateNotOwned"),
                Some(format!(
                    "There is an existing certificate {name} that we don't own."
                )),
            ),
            TlsOutcome::Certificates(certs) => {
                if let Some((name, why)) = certs.iter().find_map(|r| match &r.state {
                    CertState::Failed(why) => Some((&r.name, why)),
                    _ => None,
                }) {
                    return c(
                        ConditionStatus::False,
                        Some("CertificateProvisionFailed"),
                        Some(match why {
                            Some(w) => format!("Certificate {name} fails to be provisioned: {w}"),
                            None => format!("Certificate {name} fails to be provisioned."),
                        }),
                    );
                }
                let limited: Vec<(&str, &str)> = certs
                    .iter()
                    .filter_map(|r| match &r.state {
                        CertState::Limited(why) => Some((r.host.as_str(), why.as_str())),
                        _ => None,
                    })
                    .collect();
                if let Some((host, why)) = limited.first() {
                    let more = match limited.len() {
                        1 => String::new(),
                        n => format!(" (and {} more hosts)", n - 1),
                    };
                    return c(
                        ConditionStatus::False,
                        Some(TLS_HOST_LIMIT_EXCEEDED),
                        Some(format!(
                            "{host}{more} gets no certificate and is served over http: {why}."
                        )),
                    );
                }
                if let Some((name, why)) = certs.iter().find_map(|r| match &r.state {
                    CertState::NotReady(why) => Some((&r.name, why)),
                    _ => None,
                }) {
                    return if http == HttpProtocol::Enabled {
                        c(
                            ConditionStatus::True,
                            Some("HTTPDowngrade"),
                            Some(format!("Certificate {name} is not ready downgrade HTTP.")),
                        )
                    } else {
                        c(
                            ConditionStatus::Unknown,
                            Some("CertificateNotReady"),
                            Some(match why {
                                Some(w) => format!("Certificate {name} is not ready: {w}"),
                                None => format!("Certificate {name} is not ready."),
                            }),
                        )
                    };
                }
                c(ConditionStatus::True, None, None)
            }
        }
    }
}

/// `url` with its scheme `https` when its host is one of `https` (URLs are built `http://`).
pub fn with_scheme(url: String, https: &[&str]) -> String {
    match url.strip_prefix("http://") {
        Some(host) if https.contains(&host) => format!("https://{host}"),
        _ => url,
    }
}

/// Whether an owner's status (its URL and conditions) shows it had TLS: an https URL, or
/// `CertificateProvisioned` other than `TLSNotEnabled` (its TLS objects may need deleting).
pub fn had_tls(url: Option<&str>, status: &crate::knative::duck::Status) -> bool {
    url.is_some_and(|u| u.starts_with("https://"))
        || status
            .condition(CERTIFICATE_PROVISIONED)
            .is_some_and(|c| c.reason.as_deref() != Some("TLSNotEnabled"))
}

/// Whether two Certificates are the same as far as thaw writes them.
pub fn same(existing: &Certificate, desired: &Certificate) -> bool {
    existing.spec == desired.spec && super::same_labels(existing, desired)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_certificates_are_named_as_knative_names_them() {
        assert_eq!(route_certificate_name("u-1", None), "route-u-1");
        // adler32("candidate")
        assert_eq!(
            route_certificate_name("u-1", Some("candidate")),
            format!("route-u-1-{}", adler2::adler32_slice(b"candidate"))
        );
        assert_ne!(
            route_certificate_name("u-1", Some("a")),
            route_certificate_name("u-1", Some("b"))
        );
    }

    fn cert(conds: &[(&str, &str, Option<&str>)]) -> Certificate {
        let mut c = certificate(
            ObjectMeta {
                name: Some("route-u".into()),
                ..ObjectMeta::default()
            },
            "hello.default.example.com",
            &NetworkConfig::default(),
        );
        c.status = Some(CertificateStatus {
            conditions: conds
                .iter()
                .map(|(t, s, r)| CertificateCondition {
                    type_: t.to_string(),
                    status: s.to_string(),
                    reason: r.map(Into::into),
                    ..CertificateCondition::default()
                })
                .collect(),
        });
        c
    }

    #[test]
    fn state_reads_ready_and_a_failed_issuance() {
        let want = cert(&[]);
        assert_eq!(state(&want, None), CertState::NotReady(None));
        assert_eq!(
            state(&want, Some(&cert(&[("Ready", "True", None)]))),
            CertState::Ready
        );
        assert_eq!(
            state(
                &want,
                Some(&cert(&[("Ready", "False", Some("DoesNotExist"))]))
            ),
            CertState::NotReady(Some("DoesNotExist".into()))
        );
        assert_eq!(
            state(
                &want,
                Some(&cert(&[
                    ("Ready", "False", Some("DoesNotExist")),
                    ("Issuing", "False", Some("Failed"))
                ]))
            ),
            CertState::Failed(Some("Failed".into()))
        );
        // Another spec (the issuer changed) is not ready until cert-manager re-issues it.
        let mut other = cert(&[("Ready", "True", None)]);
        other.spec.issuer_ref.name = "old".into();
        assert_eq!(state(&want, Some(&other)), CertState::NotReady(None));
    }

    #[test]
    fn the_condition_follows_knatives_reasons() {
        let report = |state| {
            TlsOutcome::Certificates(vec![CertReport {
                name: "route-u".into(),
                host: "h".into(),
                secret: "route-u".into(),
                state,
            }])
        };
        let not_ready = report(CertState::NotReady(None));
        let c = not_ready.condition(HttpProtocol::Enabled);
        assert_eq!(
            (c.status, c.reason.as_deref()),
            (ConditionStatus::True, Some("HTTPDowngrade"))
        );
        let c = not_ready.condition(HttpProtocol::Redirected);
        assert_eq!(
            (c.status, c.reason.as_deref(), c.message.as_deref()),
            (
                ConditionStatus::Unknown,
                Some("CertificateNotReady"),
                Some("Certificate route-u is not ready.")
            )
        );
        let c = report(CertState::Failed(Some("no".into()))).condition(HttpProtocol::Enabled);
        assert_eq!(
            (c.status, c.reason.as_deref(), c.message.as_deref()),
            (
                ConditionStatus::False,
                Some("CertificateProvisionFailed"),
                Some("Certificate route-u fails to be provisioned: no")
            )
        );
        let c = TlsOutcome::Certificates(vec![
            CertReport {
                name: "route-u".into(),
                host: "h".into(),
                secret: "route-u".into(),
                state: CertState::NotReady(None),
            },
            CertReport {
                name: "route-u-1".into(),
                host: "t1".into(),
                secret: String::new(),
                state: CertState::Limited("namespace n has its 8 TLS hosts".into()),
            },
            CertReport {
                name: "route-u-2".into(),
                host: "t2".into(),
                secret: String::new(),
                state: CertState::Limited("namespace n has its 8 TLS hosts".into()),
            },
        ])
        .condition(HttpProtocol::Enabled);
        assert_eq!(
            (c.status, c.reason.as_deref(), c.message.as_deref()),
            (
                ConditionStatus::False,
                Some(TLS_HOST_LIMIT_EXCEEDED),
                Some(
                    "t1 (and 1 more hosts) gets no certificate and is served over http: \
                     namespace n has its 8 TLS hosts."
                )
            )
        );
        let ready = report(CertState::Ready);
        assert_eq!(
            ready.condition(HttpProtocol::Redirected).status,
            ConditionStatus::True
        );
        assert_eq!(ready.https_hosts(), vec!["h"]);
        assert_eq!(with_scheme("http://h".into(), &["h"]), "https://h");
        assert_eq!(with_scheme("http://g".into(), &["h"]), "http://g");
    }
}
