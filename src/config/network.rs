//! The settings the Route reconciler programs the ingress with, from three of Knative's
//! ConfigMaps, each parsed and validated on its own (so an invalid edit of one leaves the last
//! good value of that one in force):
//!
//! - `config-domain` ([`DomainConfig`]): Knative's format, one key per domain, its value a
//!   label selector (`selector:` then `label: value` lines) or empty (the default domain). A
//!   route gets the domain whose selector matches its labels, the most specific (most labels)
//!   first, ties to the alphabetically first domain. With no default domain given,
//!   `example.com` is the default (Knative's older default, what its samples use). A route
//!   whose domain is `svc.cluster.local` is cluster-local (no external gateway), as in
//!   Knative.
//! - `config-network` ([`TemplateConfig`]): `domain-template` (`{{.Name}}.{{.Namespace}}.{{.Domain}}`)
//!   and `tag-template` (`{{.Tag}}-{{.Name}}`). Go templates in Knative; thaw renders the
//!   placeholders Knative documents for them (`.Name`, `.Namespace`, `.Domain`; `.Tag`,
//!   `.Name`) and rejects any other action, naming the key.
//! - `config-network`'s `ingress-class` ([`IngressClass`]): which writer turns a route's ingress
//!   description into objects: `istio.ingress.networking.knative.dev` (the default, Istio
//!   VirtualServices) or `gateway-api.ingress.networking.knative.dev` (Gateway API
//!   HTTPRoutes). Any other class is rejected, naming the key.
//! - `config-istio` ([`IstioConfig`]): net-istio's current keys `external-gateways` and
//!   `local-gateways`, each a YAML list of `{name, namespace, service}` (the `service` is the
//!   gateway's Kubernetes Service host, where the route's placeholder Service points). The
//!   older `gateway.<ns>.<name>` / `local-gateway.<ns>.<name>` keys are read as net-istio
//!   reads them, when neither current key is given ([`istio_legacy`] has the rule). Defaults: `knative-serving/knative-ingress-gateway` (service
//!   `istio-ingressgateway.istio-system.svc.cluster.local`) and
//!   `knative-serving/knative-local-gateway` (service
//!   `knative-local-gateway.istio-system.svc.cluster.local`). thaw's own keys: `max-tls-hosts-per-namespace`
//!   (default 8, 1 to 64: the TLS hosts, and so Certificates and Secret copies, one namespace
//!   may have on the shared gateway; the Istio class's bound) and `secret-copy-refresh-period`
//!   (default 60 s, 1 s to 60 s: how often the origin of each certificate Secret copy is read
//!   again, jittered, so a rotated certificate reaches the gateway within it).
//!
//! - `config-gateway` ([`GatewayConfig`]): net-gateway-api's keys `external-gateways` and
//!   `local-gateways`, each a YAML list of `{class, gateway, service, supported-features,
//!   http-listener-name}` (`gateway` and `service` as `namespace/name`). Defaults
//!   net-gateway-api's: `istio-system/knative-gateway` (service
//!   `istio-system/istio-ingressgateway`) and `istio-system/knative-local-gateway` (service
//!   `istio-system/knative-local-gateway`), both class `istio` with the
//!   `HTTPRouteRequestTimeout` feature. thaw's own key `max-tls-hosts-per-namespace` (default 8,
//!   1 to 64: the TLS listeners, and so Certificates, one namespace may have on each shared
//!   external Gateway; a Gateway holds at most 64 listeners). Read only by the Gateway API class.
//!
//! [`NetworkConfig`] holds the four; the controller's settings snapshot carries one.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::keys::{ConfigMap, Key, Parsed, Shown};
use super::parse::{Problem, Problems};

/// The domain of cluster-local routes (`{route}.{namespace}.svc.cluster.local`).
pub const CLUSTER_LOCAL_DOMAIN: &str = "svc.cluster.local";
/// The domain routes get when config-domain names no default domain.
pub const DEFAULT_DOMAIN: &str = "example.com";

/// Everything the Route reconciler reads from the network ConfigMaps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetworkConfig {
    /// `config-domain`.
    pub domain: DomainConfig,
    /// `config-network` (the templates).
    pub templates: TemplateConfig,
    /// `config-istio` (the gateways).
    pub istio: IstioConfig,
    /// `config-gateway` (the Gateway API class's gateways).
    pub gateway: GatewayConfig,
    /// `config-certmanager` (the certificates' issuer).
    pub certmanager: CertManagerConfig,
}

impl NetworkConfig {
    /// The per-namespace bound on TLS hosts of the ingress class in force (config-istio's or
    /// config-gateway's `max-tls-hosts-per-namespace`).
    pub fn tls_host_limit(&self) -> TlsHostLimit {
        match self.templates.ingress_class {
            IngressClass::Istio => TlsHostLimit {
                per_namespace: self.istio.max_tls_hosts_per_namespace,
                config_map: ISTIO_NAME,
            },
            IngressClass::GatewayApi => TlsHostLimit {
                per_namespace: self.gateway.max_tls_hosts_per_namespace,
                config_map: GATEWAY_NAME,
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// config-domain

/// Name of the domain ConfigMap.
pub const DOMAIN_NAME: &str = "config-domain";

/// `config-domain`: each domain with the label selector routes must match to get it (empty:
/// every route).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainConfig {
    /// Domain → selector (label → value). Never empty: a default domain is always present.
    pub domains: BTreeMap<String, BTreeMap<String, String>>,
}

impl Default for DomainConfig {
    fn default() -> Self {
        Self {
            domains: BTreeMap::from([(DEFAULT_DOMAIN.to_string(), BTreeMap::new())]),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DomainValue {
    #[serde(default)]
    selector: BTreeMap<String, String>,
}

impl DomainConfig {
    /// The domain for a route with `labels` (Knative's `LookupDomainForLabels`): the matching
    /// domain with the most specific selector, ties to the alphabetically first.
    pub fn domain_for(&self, labels: &BTreeMap<String, String>) -> &str {
        let mut best: Option<(&str, usize)> = None;
        for (domain, selector) in &self.domains {
            if !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                continue;
            }
            // BTreeMap order: on a tie the first (alphabetically) stays.
            if best.is_none_or(|(_, n)| selector.len() > n) {
                best = Some((domain, selector.len()));
            }
        }
        best.map_or(DEFAULT_DOMAIN, |(d, _)| d)
    }

    fn parse_value(domain: &str, value: &str) -> Result<BTreeMap<String, String>, String> {
        if !is_dns_name(domain) {
            return Err("the key must be a DNS domain name".into());
        }
        if value.trim().is_empty() {
            return Ok(BTreeMap::new());
        }
        let v: DomainValue = serde_saphyr::from_str(value)
            .map_err(|e| format!("must be empty or `selector:` with label: value lines ({e})"))?;
        Ok(v.selector)
    }
}

impl ConfigMap for DomainConfig {
    const NAME: &'static str = DOMAIN_NAME;

    /// The keys are the domains themselves: there is no fixed table.
    fn keys() -> &'static [Key<Self>] {
        &[]
    }

    fn validate(&self, _data: &BTreeMap<String, String>) -> Vec<Problem> {
        Vec::new()
    }

    fn parse(data: &BTreeMap<String, String>) -> Result<Parsed<Self>, Problems> {
        let mut domains = BTreeMap::new();
        let mut problems = Vec::new();
        for (k, v) in data {
            if k == "_example" {
                continue;
            }
            match Self::parse_value(k, v) {
                Ok(sel) => {
                    domains.insert(k.clone(), sel);
                }
                Err(reason) => problems.push(Problem::new(k, v, reason)),
            }
        }
        if !problems.is_empty() {
            return Err(Problems(problems));
        }
        if !domains.values().any(BTreeMap::is_empty) {
            domains.insert(DEFAULT_DOMAIN.into(), BTreeMap::new());
        }
        Ok(Parsed {
            given: domains
                .keys()
                .filter(|k| data.contains_key(*k))
                .cloned()
                .collect(),
            config: Self { domains },
            warnings: Vec::new(),
        })
    }

    fn warnings(_data: &BTreeMap<String, String>) -> Vec<String> {
        Vec::new()
    }

    /// The keys are the domains, so they are shown as one entry, `domains`: each domain with
    /// its selector (`example.com; internal.example.com (app=internal)`); JSON: domain to
    /// selector.
    fn show(&self) -> Vec<Shown> {
        let text = self
            .domains
            .iter()
            .map(|(d, sel)| {
                if sel.is_empty() {
                    d.clone()
                } else {
                    let sel: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    format!("{d} ({})", sel.join(","))
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        let json = Value::Object(
            self.domains
                .iter()
                .map(|(d, sel)| (d.clone(), serde_json::json!(sel)))
                .collect(),
        );
        vec![Shown {
            key: "domains",
            text,
            json,
            unit: "route domain (selector)",
            is_default: *self == Self::default(),
        }]
    }
}

/// A DNS name: dot-separated labels of letters, digits and `-`, each 1..=63 characters, not
/// starting or ending with `-`; 253 characters at most.
fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

// ---------------------------------------------------------------------------------------------
// config-network: the templates

/// Name of the network ConfigMap.
pub const NETWORK_NAME: &str = "config-network";

/// A parsed name template: literal text and the placeholders Knative documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    text: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Name,
    Namespace,
    Domain,
    Tag,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Field),
}

/// The values a template is rendered with (a template only reads the fields it may use).
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateValues<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub domain: &'a str,
    pub tag: &'a str,
}

impl Template {
    /// Parses `text`, allowing only the `allowed` fields (`{{.Name}}`, `{{ .Tag }}`, ...).
    fn parse(text: &str, allowed: &[Field]) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                parts.push(Part::Text(rest[..start].to_string()));
            }
            let after = &rest[start + 2..];
            let end = after
                .find("}}")
                .ok_or_else(|| "an action `{{` is not closed with `}}`".to_string())?;
            let action = after[..end].trim();
            let field = match action {
                ".Name" => Field::Name,
                ".Namespace" => Field::Namespace,
                ".Domain" => Field::Domain,
                ".Tag" => Field::Tag,
                other => return Err(format!("unsupported template action `{{{{{other}}}}}`")),
            };
            if !allowed.contains(&field) {
                return Err(format!(
                    "`{{{{{action}}}}}` is not available in this template"
                ));
            }
            parts.push(Part::Field(field));
            rest = &after[end + 2..];
        }
        if rest.contains("}}") {
            return Err("a `}}` without its `{{`".into());
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Self {
            text: text.to_string(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn uses(&self, f: Field) -> bool {
        self.parts.contains(&Part::Field(f))
    }

    /// Renders the template with `v`.
    pub fn render(&self, v: &TemplateValues<'_>) -> String {
        let mut out = String::with_capacity(self.text.len() + 32);
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field(Field::Name) => out.push_str(v.name),
                Part::Field(Field::Namespace) => out.push_str(v.namespace),
                Part::Field(Field::Domain) => out.push_str(v.domain),
                Part::Field(Field::Tag) => out.push_str(v.tag),
            }
        }
        out
    }
}

/// Knative's default `domain-template`.
pub const DEFAULT_DOMAIN_TEMPLATE: &str = "{{.Name}}.{{.Namespace}}.{{.Domain}}";
/// Knative's default `tag-template`.
pub const DEFAULT_TAG_TEMPLATE: &str = "{{.Tag}}-{{.Name}}";

/// Knative's ingress class for Istio (`ingress-class`'s default).
pub const ISTIO_INGRESS_CLASS: &str = "istio.ingress.networking.knative.dev";
/// Knative's ingress class for the Gateway API (net-gateway-api's).
pub const GATEWAY_API_INGRESS_CLASS: &str = "gateway-api.ingress.networking.knative.dev";

/// `config-network`'s `ingress-class`: the writer of the routes' ingress objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IngressClass {
    /// Istio VirtualServices (net-istio's objects).
    #[default]
    Istio,
    /// Gateway API HTTPRoutes (net-gateway-api's objects).
    GatewayApi,
}

impl IngressClass {
    /// Knative's name of the class.
    pub fn as_str(self) -> &'static str {
        match self {
            IngressClass::Istio => ISTIO_INGRESS_CLASS,
            IngressClass::GatewayApi => GATEWAY_API_INGRESS_CLASS,
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            ISTIO_INGRESS_CLASS => Ok(IngressClass::Istio),
            GATEWAY_API_INGRESS_CLASS => Ok(IngressClass::GatewayApi),
            _ => Err(format!(
                "thaw writes the ingress for {ISTIO_INGRESS_CLASS} or \
                 {GATEWAY_API_INGRESS_CLASS} only"
            )),
        }
    }
}

/// The `config-network` keys the Route reconciler uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateConfig {
    /// `ingress-class`: which objects the routes' ingress is written as.
    pub ingress_class: IngressClass,
    /// `autocreate-cluster-domain-claims`: a DomainMapping whose domain nobody claims creates
    /// the ClusterDomainClaim for its namespace (Knative's default: false, an operator
    /// creates the claims).
    pub autocreate_cluster_domain_claims: bool,
    /// `domain-template`: a route's external host from its name, namespace and domain.
    pub domain_template: Template,
    /// `tag-template`: the name part of a tagged target's host, from the tag and route name.
    pub tag_template: Template,
    /// `mesh-compatibility-mode`: how the activator and the autoscaler reach a revision's pods
    /// (read by them once, at start).
    pub mesh_compatibility_mode: MeshMode,
    /// `external-domain-tls` (or its older spelling `auto-tls`): the routes' external hosts
    /// get cert-manager Certificates and are served over https (Knative's default: Disabled).
    pub external_domain_tls: bool,
    /// `http-protocol`: what plain http does on hosts served over https.
    pub http_protocol: HttpProtocol,
}

/// Knative's `http-protocol`: what plain http does on a host that has a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpProtocol {
    /// Served over http as well as https (Knative's default).
    #[default]
    Enabled,
    /// Answered with a redirect to https.
    Redirected,
    /// Not served over http.
    Disabled,
}

impl HttpProtocol {
    /// The key's value, as Knative writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enabled => "Enabled",
            Self::Redirected => "Redirected",
            Self::Disabled => "Disabled",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "enabled" => Ok(Self::Enabled),
            "redirected" => Ok(Self::Redirected),
            "disabled" => Ok(Self::Disabled),
            _ => Err("must be one of Enabled, Redirected, Disabled".into()),
        }
    }
}

/// Knative's `external-domain-tls` (and `auto-tls`) values, any case.
fn parse_enabled(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "enabled" => Ok(true),
        "disabled" => Ok(false),
        _ => Err("must be Enabled or Disabled".into()),
    }
}

fn show_enabled(on: bool) -> (String, Value) {
    show_text(if on { "Enabled" } else { "Disabled" })
}

/// Knative's `mesh-compatibility-mode`: whether the activator and the autoscaler reach a
/// revision's pods at their own addresses or through the revision's private Service (its
/// cluster IP), which a service mesh enforcing mutual TLS (Istio's STRICT mode) requires of
/// callers that do not speak it to each pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MeshMode {
    /// Pods directly, unless probing a revision's pods fails as a mesh refuses plain text
    /// while its private Service answers: then that revision through the Service.
    #[default]
    Auto,
    /// Always through the private Service.
    Enabled,
    /// Always the pods directly.
    Disabled,
}

impl MeshMode {
    /// The key's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Enabled => "enabled",
            Self::Disabled => "disabled",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "enabled" => Ok(Self::Enabled),
            "disabled" => Ok(Self::Disabled),
            _ => Err("must be one of auto, enabled, disabled".into()),
        }
    }
}

impl Default for TemplateConfig {
    fn default() -> Self {
        Self {
            ingress_class: IngressClass::default(),
            autocreate_cluster_domain_claims: false,
            domain_template: parse_domain_template(DEFAULT_DOMAIN_TEMPLATE)
                .expect("the default domain template is valid"),
            tag_template: parse_tag_template(DEFAULT_TAG_TEMPLATE)
                .expect("the default tag template is valid"),
            mesh_compatibility_mode: MeshMode::Auto,
            external_domain_tls: false,
            http_protocol: HttpProtocol::Enabled,
        }
    }
}

/// Knative's checks of `domain-template`: it parses, uses `.Name` (else every route would
/// share one host) and renders a sample to a host name without a path.
fn parse_domain_template(s: &str) -> Result<Template, String> {
    let t = Template::parse(s, &[Field::Name, Field::Namespace, Field::Domain])?;
    if !t.uses(Field::Name) {
        return Err("must use {{.Name}}".into());
    }
    let sample = t.render(&TemplateValues {
        name: "foo",
        namespace: "bar",
        domain: "baz.com",
        tag: "",
    });
    if !is_dns_name(&sample) {
        return Err(format!(
            "renders a sample route to \"{sample}\", which is not a host name"
        ));
    }
    Ok(t)
}

/// Knative's checks of `tag-template`: it parses, uses `.Tag` and `.Name`, and renders a
/// sample to one DNS label.
fn parse_tag_template(s: &str) -> Result<Template, String> {
    let t = Template::parse(s, &[Field::Name, Field::Tag])?;
    if !t.uses(Field::Name) || !t.uses(Field::Tag) {
        return Err("must use both {{.Tag}} and {{.Name}}".into());
    }
    let sample = t.render(&TemplateValues {
        name: "foo",
        tag: "v2",
        ..TemplateValues::default()
    });
    if sample.contains('.') || !is_dns_name(&sample) {
        return Err(format!(
            "renders a sample tag to \"{sample}\", which is not one DNS label"
        ));
    }
    Ok(t)
}

fn show_text(s: &str) -> (String, Value) {
    (s.to_string(), Value::from(s))
}

/// The `config-network` keys thaw reads.
pub static NETWORK_KEYS: &[Key<TemplateConfig>] = &[
    Key {
        name: "ingress-class",
        unit: "class",
        help: "The routes' ingress objects: istio.ingress.networking.knative.dev (Istio \
               VirtualServices) or gateway-api.ingress.networking.knative.dev (HTTPRoutes).",
        parse: |c, s| {
            c.ingress_class = IngressClass::parse(s)?;
            Ok(())
        },
        show: |c| show_text(c.ingress_class.as_str()),
    },
    Key {
        name: "ingress.class",
        unit: "class",
        help: "The older spelling of ingress-class (ingress-class wins when both are given).",
        parse: |c, s| {
            c.ingress_class = IngressClass::parse(s)?;
            Ok(())
        },
        show: |c| show_text(c.ingress_class.as_str()),
    },
    Key {
        name: "external-domain-tls",
        unit: "Enabled or Disabled",
        help: "The routes' and DomainMappings' external hosts get cert-manager Certificates \
               (issuer from config-certmanager) and https URLs once they are ready.",
        parse: |c, s| {
            c.external_domain_tls = parse_enabled(s)?;
            Ok(())
        },
        show: |c| show_enabled(c.external_domain_tls),
    },
    Key {
        name: "auto-tls",
        unit: "Enabled or Disabled",
        help: "The older spelling of external-domain-tls (external-domain-tls wins when both \
               are given).",
        parse: |c, s| {
            c.external_domain_tls = parse_enabled(s)?;
            Ok(())
        },
        show: |c| show_enabled(c.external_domain_tls),
    },
    Key {
        name: "http-protocol",
        unit: "Enabled, Redirected or Disabled",
        help: "Plain http on a host served over https: served (Enabled), redirected to https \
               (Redirected) or not served (Disabled).",
        parse: |c, s| {
            c.http_protocol = HttpProtocol::parse(s)?;
            Ok(())
        },
        show: |c| show_text(c.http_protocol.as_str()),
    },
    Key {
        name: "autocreate-cluster-domain-claims",
        unit: "bool",
        help: "A DomainMapping of an unclaimed domain creates the ClusterDomainClaim for its \
               namespace; else an operator creates the claims.",
        parse: |c, s| {
            c.autocreate_cluster_domain_claims = super::parse::parse_bool(s)?;
            Ok(())
        },
        show: |c| {
            let v = c.autocreate_cluster_domain_claims;
            (v.to_string(), Value::from(v))
        },
    },
    Key {
        name: "domain-template",
        unit: "template",
        help: "A route's external host: {{.Name}}, {{.Namespace}} and {{.Domain}}.",
        parse: |c, s| {
            c.domain_template = parse_domain_template(s)?;
            Ok(())
        },
        show: |c| show_text(c.domain_template.as_str()),
    },
    Key {
        name: "tag-template",
        unit: "template",
        help: "A tagged target's host name part: {{.Tag}} and {{.Name}}.",
        parse: |c, s| {
            c.tag_template = parse_tag_template(s)?;
            Ok(())
        },
        show: |c| show_text(c.tag_template.as_str()),
    },
    Key {
        name: "mesh-compatibility-mode",
        unit: "auto, enabled or disabled",
        help: "How the activator and the autoscaler reach pods: through the private Service \
               (enabled), directly (disabled), or directly unless a mesh refuses it (auto). \
               Read at their start: a change takes effect when they restart.",
        parse: |c, s| {
            c.mesh_compatibility_mode = MeshMode::parse(s)?;
            Ok(())
        },
        show: |c| show_text(c.mesh_compatibility_mode.as_str()),
    },
];

impl ConfigMap for TemplateConfig {
    const NAME: &'static str = NETWORK_NAME;
    /// Knative's other config-network keys: no other certificate class than cert-manager's,
    /// no cluster-local or system-internal TLS (nor its older spelling `internal-encryption`), no namespace wildcard certificates, no mesh
    /// pod addressability (passthrough load balancing) or gradual rollout.
    const INERT: &'static [&'static str] = &[
        "certificate-class",
        "certificate.class",
        "enable-mesh-pod-addressability",
        "system-internal-tls",
        "rollout-duration",
        "cluster-local-domain-tls",
        "namespace-wildcard-cert-selector",
        "default-external-scheme",
        "activator-ca",
        "activator-san",
        "internal-encryption",
    ];

    fn keys() -> &'static [Key<Self>] {
        NETWORK_KEYS
    }

    /// As [`super::keys::parse_data`], then the newer spelling of a key wins over the older
    /// one when both are given (`ingress-class` over `ingress.class`, `external-domain-tls`
    /// over `auto-tls`), as Knative reads them.
    fn parse(data: &BTreeMap<String, String>) -> Result<Parsed<Self>, Problems> {
        let mut parsed = super::keys::parse_data(Self::keys(), Self::INERT, data, Self::validate)?;
        for newer in ["ingress-class", "external-domain-tls"] {
            if let (Some(v), Some(key)) = (
                data.get(newer),
                NETWORK_KEYS.iter().find(|k| k.name == newer),
            ) {
                // It parsed above.
                let _ = (key.parse)(&mut parsed.config, v.trim());
            }
        }
        Ok(parsed)
    }

    fn validate(&self, _data: &BTreeMap<String, String>) -> Vec<Problem> {
        Vec::new()
    }
}

// ---------------------------------------------------------------------------------------------
// config-istio: the gateways

/// Name of net-istio's ConfigMap.
pub const ISTIO_NAME: &str = "config-istio";

/// One Istio Gateway a route is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gateway {
    /// The Gateway's name.
    pub name: String,
    /// The Gateway's namespace.
    pub namespace: String,
    /// The host of the Kubernetes Service in front of the gateway's pods.
    pub service: String,
    /// net-istio's optional label selector (for per-route gateway choice); accepted, unused.
    #[serde(default, rename = "labelSelector")]
    pub label_selector: Option<serde_json::Value>,
}

impl Gateway {
    fn new(namespace: &str, name: &str, service: &str) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            service: service.into(),
            label_selector: None,
        }
    }

    /// `namespace/name`, as a VirtualService names a gateway.
    pub fn reference(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// `config-istio`: the gateways routes are attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IstioConfig {
    /// `external-gateways`: serve the routes' external hosts. Never empty.
    pub external_gateways: Vec<Gateway>,
    /// `local-gateways`: serve the cluster-local hosts. Never empty.
    pub local_gateways: Vec<Gateway>,
    /// `max-tls-hosts-per-namespace`: the TLS hosts (Certificates, Secret copies in the gateway
    /// Service's namespace) one namespace may have; beyond it a host is served over http.
    pub max_tls_hosts_per_namespace: u32,
    /// `secret-copy-refresh-period`: how often the origin of each Secret copy is read again
    /// (each owner with copies is re-queued after a jittered 3/4 to all of it).
    pub secret_copy_refresh: std::time::Duration,
}

/// The key bounding each namespace's TLS hosts on the shared gateway (config-istio and
/// config-gateway).
pub const TLS_HOSTS_KEY: &str = "max-tls-hosts-per-namespace";
/// Its default: a namespace's TLS hosts, and so the Certificates it sends the issuer.
pub const DEFAULT_TLS_HOSTS_PER_NAMESPACE: u32 = 8;
/// The most listeners a Gateway API Gateway holds (the CRD's `maxItems`), and so the largest
/// per-namespace bound.
pub const MAX_LISTENERS_PER_GATEWAY: u32 = 64;
/// `secret-copy-refresh-period`'s default and largest value.
pub const MAX_SECRET_COPY_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// The per-namespace bound on TLS hosts in force, and the ConfigMap that set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsHostLimit {
    /// Hosts per namespace.
    pub per_namespace: u32,
    /// `config-istio` or `config-gateway`: the ingress class's ConfigMap.
    pub config_map: &'static str,
}

fn parse_tls_hosts(s: &str) -> Result<u32, String> {
    let v = super::parse::parse_i64(s)?;
    let max = i64::from(MAX_LISTENERS_PER_GATEWAY);
    if !(1..=max).contains(&v) {
        return Err(format!(
            "must be in [1, {max}] (a Gateway holds at most {max} listeners)"
        ));
    }
    Ok(v as u32)
}

impl Default for IstioConfig {
    fn default() -> Self {
        Self {
            external_gateways: vec![Gateway::new(
                "knative-serving",
                "knative-ingress-gateway",
                "istio-ingressgateway.istio-system.svc.cluster.local",
            )],
            local_gateways: vec![Gateway::new(
                "knative-serving",
                "knative-local-gateway",
                "knative-local-gateway.istio-system.svc.cluster.local",
            )],
            max_tls_hosts_per_namespace: DEFAULT_TLS_HOSTS_PER_NAMESPACE,
            secret_copy_refresh: MAX_SECRET_COPY_REFRESH,
        }
    }
}

fn parse_gateways(s: &str) -> Result<Vec<Gateway>, String> {
    let gws: Vec<Gateway> = serde_saphyr::from_str(s)
        .map_err(|e| format!("must be a YAML list of {{name, namespace, service}} ({e})"))?;
    if gws.is_empty() {
        return Err("must name at least one gateway".into());
    }
    for g in &gws {
        if !is_dns_name(&g.name) || g.name.contains('.') {
            return Err(format!("gateway name \"{}\" is not a DNS label", g.name));
        }
        if !is_dns_name(&g.namespace) || g.namespace.contains('.') {
            return Err(format!(
                "gateway namespace \"{}\" is not a DNS label",
                g.namespace
            ));
        }
        if !is_dns_name(&g.service) {
            return Err(format!(
                "gateway service \"{}\" is not a host name",
                g.service
            ));
        }
    }
    Ok(gws)
}

fn show_gateways(g: &[Gateway]) -> (String, Value) {
    let refs: Vec<String> = g.iter().map(Gateway::reference).collect();
    (refs.join(","), Value::from(refs))
}

/// The `config-istio` keys thaw reads.
pub static ISTIO_KEYS: &[Key<IstioConfig>] = &[
    Key {
        name: "external-gateways",
        unit: "gateways",
        help: "Gateways serving the routes' external hosts (YAML list of name, namespace, service).",
        parse: |c, s| {
            c.external_gateways = parse_gateways(s)?;
            Ok(())
        },
        show: |c| show_gateways(&c.external_gateways),
    },
    Key {
        name: "local-gateways",
        unit: "gateways",
        help: "Gateways serving the cluster-local hosts (YAML list of name, namespace, service).",
        parse: |c, s| {
            c.local_gateways = parse_gateways(s)?;
            Ok(())
        },
        show: |c| show_gateways(&c.local_gateways),
    },
    Key {
        name: TLS_HOSTS_KEY,
        unit: "TLS hosts per namespace",
        help: "The TLS hosts one namespace may have on the external gateways (each a \
               Certificate and a Secret copy in the gateway's namespace); a host beyond it is \
               served over http, CertificateProvisioned=False (1 to 64).",
        parse: |c, s| {
            c.max_tls_hosts_per_namespace = parse_tls_hosts(s)?;
            Ok(())
        },
        show: |c| super::keys::show_u32(c.max_tls_hosts_per_namespace),
    },
    Key {
        name: "secret-copy-refresh-period",
        unit: "duration",
        help: "How often the origin of each certificate Secret copy is read again (jittered \
               between 3/4 and all of it): a rotated certificate reaches the gateway within it \
               (1s to 60s).",
        parse: |c, s| {
            c.secret_copy_refresh = super::autoscaler::duration_in(
                s,
                std::time::Duration::from_secs(1),
                Some(MAX_SECRET_COPY_REFRESH),
                false,
            )?;
            Ok(())
        },
        show: |c| super::keys::show_duration(c.secret_copy_refresh),
    },
];

impl ConfigMap for IstioConfig {
    const NAME: &'static str = ISTIO_NAME;
    const INERT: &'static [&'static str] = &["enable-virtualservice-status"];

    fn keys() -> &'static [Key<Self>] {
        ISTIO_KEYS
    }

    fn validate(&self, _data: &BTreeMap<String, String>) -> Vec<Problem> {
        Vec::new()
    }

    /// The current keys as every ConfigMap's; then net-istio's older per-gateway keys, read
    /// when no current gateway key is given ([`istio_legacy`]).
    fn parse(data: &BTreeMap<String, String>) -> Result<Parsed<Self>, Problems> {
        let legacy = istio_legacy::Legacy::read(data);
        let current: BTreeMap<String, String> = data
            .iter()
            .filter(|(k, _)| !istio_legacy::is_legacy(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut problems = legacy.problems.clone();
        if legacy.any()
            && let Some(newer) = ["external-gateways", "local-gateways"]
                .into_iter()
                .find(|k| current.contains_key(*k))
        {
            let first = legacy
                .read
                .first()
                .cloned()
                .or_else(|| legacy.problems.first().map(|p| p.key.clone()))
                .unwrap_or_default();
            problems.push(Problem::new(
                &first,
                data.get(&first).cloned().unwrap_or_default(),
                format!(
                    "net-istio's older gateway keys cannot be given with {newer} (net-istio \
                     refuses such a config-istio): keep one form"
                ),
            ));
        }
        match super::keys::parse_data(ISTIO_KEYS, Self::INERT, &current, Self::validate) {
            Ok(mut parsed) if problems.is_empty() => {
                if !legacy.external.is_empty() {
                    parsed.config.external_gateways = legacy.external;
                }
                if !legacy.local.is_empty() {
                    parsed.config.local_gateways = legacy.local;
                }
                parsed.given.extend(legacy.read);
                parsed.warnings.extend(legacy.warnings);
                Ok(parsed)
            }
            Ok(_) => Err(Problems(problems)),
            Err(Problems(mut p)) => {
                p.extend(problems);
                Err(Problems(p))
            }
        }
    }

    fn warnings(data: &BTreeMap<String, String>) -> Vec<String> {
        let current: BTreeMap<String, String> = data
            .iter()
            .filter(|(k, _)| !istio_legacy::is_legacy(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut w = super::keys::warnings(ISTIO_KEYS, Self::INERT, &current);
        w.extend(istio_legacy::Legacy::read(data).warnings);
        w
    }
}

// ---------------------------------------------------------------------------------------------
// config-gateway: the Gateway API class's gateways

/// Name of net-gateway-api's ConfigMap.
pub const GATEWAY_NAME: &str = "config-gateway";

/// The Gateway API feature that lets an HTTPRoute rule carry a request timeout.
pub const REQUEST_TIMEOUT_FEATURE: &str = "HTTPRouteRequestTimeout";

/// `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}

impl NamespacedName {
    fn parse(s: &str, what: &str) -> Result<Self, String> {
        let label = |l: &str| is_dns_name(l) && !l.contains('.');
        match s.split_once('/') {
            Some((ns, name)) if label(ns) && label(name) => Ok(Self {
                namespace: ns.into(),
                name: name.into(),
            }),
            _ => Err(format!("{what} \"{s}\" is not namespace/name")),
        }
    }
}

impl std::fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct GatewayApiValue {
    #[serde(default)]
    class: String,
    gateway: String,
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    supported_features: Vec<String>,
    #[serde(default)]
    http_listener_name: Option<String>,
}

/// One Gateway API Gateway routes are attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayApiGateway {
    /// The GatewayClass's name (informational, as in net-gateway-api).
    pub class: String,
    /// The Gateway (an HTTPRoute's parentRef).
    pub gateway: NamespacedName,
    /// The Kubernetes Service in front of the gateway's pods: where the routes' placeholder
    /// Services point.
    pub service: Option<NamespacedName>,
    /// Gateway API features the implementation supports (`HTTPRouteRequestTimeout` lets the
    /// HTTPRoutes carry the route's timeout).
    pub supported_features: Vec<String>,
    /// The listener to attach to (the parentRef's `sectionName`), else every listener.
    pub http_listener_name: Option<String>,
}

impl GatewayApiGateway {
    fn new(gateway: (&str, &str), service: (&str, &str)) -> Self {
        let nn = |(namespace, name): (&str, &str)| NamespacedName {
            namespace: namespace.into(),
            name: name.into(),
        };
        Self {
            class: "istio".into(),
            gateway: nn(gateway),
            service: Some(nn(service)),
            supported_features: vec![REQUEST_TIMEOUT_FEATURE.into()],
            http_listener_name: None,
        }
    }

    /// The gateway Service's host, `{name}.{namespace}.svc.cluster.local`.
    pub fn service_host(&self) -> Option<String> {
        self.service
            .as_ref()
            .map(|s| format!("{}.{}.{CLUSTER_LOCAL_DOMAIN}", s.name, s.namespace))
    }

    /// Whether the implementation supports the Gateway API feature `f`.
    pub fn supports(&self, f: &str) -> bool {
        self.supported_features.iter().any(|s| s == f)
    }
}

/// `config-gateway`: the Gateways the Gateway API class attaches routes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// `external-gateways`: serve the routes' external hosts. Never empty.
    pub external_gateways: Vec<GatewayApiGateway>,
    /// `local-gateways`: serve the cluster-local hosts. Never empty.
    pub local_gateways: Vec<GatewayApiGateway>,
    /// `max-tls-hosts-per-namespace`: the TLS listeners (and so Certificates) one namespace
    /// may have on each external Gateway; beyond it a host is served over http.
    pub max_tls_hosts_per_namespace: u32,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            external_gateways: vec![GatewayApiGateway::new(
                ("istio-system", "knative-gateway"),
                ("istio-system", "istio-ingressgateway"),
            )],
            local_gateways: vec![GatewayApiGateway::new(
                ("istio-system", "knative-local-gateway"),
                ("istio-system", "knative-local-gateway"),
            )],
            max_tls_hosts_per_namespace: DEFAULT_TLS_HOSTS_PER_NAMESPACE,
        }
    }
}

fn parse_gateway_api_gateways(s: &str) -> Result<Vec<GatewayApiGateway>, String> {
    let values: Vec<GatewayApiValue> = serde_saphyr::from_str(s).map_err(|e| {
        format!(
            "must be a YAML list of {{class, gateway, service, supported-features, \
             http-listener-name}} ({e})"
        )
    })?;
    if values.is_empty() {
        return Err("must name at least one gateway".into());
    }
    values
        .into_iter()
        .map(|v| {
            if let Some(l) = &v.http_listener_name
                && (!is_dns_name(l) || l.contains('.'))
            {
                return Err(format!("http-listener-name \"{l}\" is not a DNS label"));
            }
            Ok(GatewayApiGateway {
                class: v.class,
                gateway: NamespacedName::parse(&v.gateway, "gateway")?,
                service: v
                    .service
                    .map(|s| NamespacedName::parse(&s, "service"))
                    .transpose()?,
                supported_features: v.supported_features,
                http_listener_name: v.http_listener_name,
            })
        })
        .collect()
}

fn show_gateway_api_gateways(g: &[GatewayApiGateway]) -> (String, Value) {
    let refs: Vec<String> = g.iter().map(|g| g.gateway.to_string()).collect();
    (refs.join(","), Value::from(refs))
}

/// The `config-gateway` keys thaw reads.
pub static GATEWAY_KEYS: &[Key<GatewayConfig>] = &[
    Key {
        name: "external-gateways",
        unit: "gateways",
        help: "Gateway API Gateways serving the routes' external hosts (YAML list of class, \
               gateway, service, supported-features, http-listener-name).",
        parse: |c, s| {
            c.external_gateways = parse_gateway_api_gateways(s)?;
            Ok(())
        },
        show: |c| show_gateway_api_gateways(&c.external_gateways),
    },
    Key {
        name: "local-gateways",
        unit: "gateways",
        help: "Gateway API Gateways serving the cluster-local hosts (YAML list of class, \
               gateway, service, supported-features, http-listener-name).",
        parse: |c, s| {
            c.local_gateways = parse_gateway_api_gateways(s)?;
            Ok(())
        },
        show: |c| show_gateway_api_gateways(&c.local_gateways),
    },
    Key {
        name: TLS_HOSTS_KEY,
        unit: "TLS listeners per namespace",
        help: "The TLS listeners (each a Certificate) one namespace may have on each external \
               Gateway; a host beyond it is served over http, CertificateProvisioned=False (1 \
               to 64, a Gateway's most listeners).",
        parse: |c, s| {
            c.max_tls_hosts_per_namespace = parse_tls_hosts(s)?;
            Ok(())
        },
        show: |c| super::keys::show_u32(c.max_tls_hosts_per_namespace),
    },
];

impl ConfigMap for GatewayConfig {
    const NAME: &'static str = GATEWAY_NAME;

    fn keys() -> &'static [Key<Self>] {
        GATEWAY_KEYS
    }

    /// The local gateways' Service is where the placeholder Services point: one is needed.
    fn validate(&self, data: &BTreeMap<String, String>) -> Vec<Problem> {
        match self.local_gateways.first() {
            Some(g) if g.service.is_none() => vec![Problem::new(
                "local-gateways",
                data.get("local-gateways").map_or("", String::as_str),
                "the first local gateway needs a service (the routes' cluster-local names \
                 point at it)",
            )],
            _ => Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// config-certmanager: the issuer of the external hosts' certificates

/// Name of net-certmanager's ConfigMap.
pub const CERTMANAGER_NAME: &str = "config-certmanager";

/// cert-manager's group (an `issuerRef` without a group is one of its issuers).
pub const CERT_MANAGER_GROUP: &str = "cert-manager.io";

/// A cert-manager issuer reference: what a Certificate's `spec.issuerRef` names.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerRef {
    /// `ClusterIssuer` (any namespace's Certificates) or `Issuer` (one in each route's
    /// namespace); another kind needs the `group` of the external issuer.
    pub kind: String,
    /// The issuer's name.
    pub name: String,
    /// The issuer's API group (cert-manager's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// `config-certmanager`: the issuer the Certificates of the routes' external hosts name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertManagerConfig {
    /// `issuerRef`. Default net-certmanager's: the ClusterIssuer `knative-selfsigned-issuer`.
    pub issuer_ref: IssuerRef,
}

impl Default for CertManagerConfig {
    fn default() -> Self {
        Self {
            issuer_ref: IssuerRef {
                kind: "ClusterIssuer".into(),
                name: "knative-selfsigned-issuer".into(),
                group: None,
            },
        }
    }
}

fn parse_issuer_ref(s: &str) -> Result<IssuerRef, String> {
    let r: IssuerRef = serde_saphyr::from_str(s)
        .map_err(|e| format!("must be YAML with kind and name (and optionally group) ({e})"))?;
    if !is_dns_name(&r.name) {
        return Err(format!("name \"{}\" is not a DNS subdomain", r.name));
    }
    match r.group.as_deref() {
        None | Some(CERT_MANAGER_GROUP)
            if !["Issuer", "ClusterIssuer"].contains(&r.kind.as_str()) =>
        {
            Err(format!(
                "kind \"{}\" is not Issuer or ClusterIssuer (an external issuer needs its group)",
                r.kind
            ))
        }
        Some(g) if !is_dns_name(g) => Err(format!("group \"{g}\" is not a DNS subdomain")),
        _ if r.kind.is_empty() => Err("kind is empty".into()),
        _ => Ok(r),
    }
}

/// The `config-certmanager` keys thaw reads.
pub static CERTMANAGER_KEYS: &[Key<CertManagerConfig>] = &[Key {
    name: "issuerRef",
    unit: "issuer",
    help: "The cert-manager issuer of the external hosts' Certificates (YAML: kind, name, \
           optionally group).",
    parse: |c, s| {
        c.issuer_ref = parse_issuer_ref(s)?;
        Ok(())
    },
    show: |c| {
        let r = &c.issuer_ref;
        (
            format!("{}/{}", r.kind, r.name),
            serde_json::to_value(r).unwrap_or(Value::Null),
        )
    },
}];

impl ConfigMap for CertManagerConfig {
    const NAME: &'static str = CERTMANAGER_NAME;
    /// Knative's issuers of cluster-local and system-internal certificates: thaw serves
    /// neither over TLS.
    const INERT: &'static [&'static str] = &["clusterLocalIssuerRef", "systemInternalIssuerRef"];

    fn keys() -> &'static [Key<Self>] {
        CERTMANAGER_KEYS
    }

    fn validate(&self, _data: &BTreeMap<String, String>) -> Vec<Problem> {
        Vec::new()
    }
}

pub mod istio_legacy;

#[cfg(test)]
mod tests;
