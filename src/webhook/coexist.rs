//! Knative Serving in the same cluster. thaw serves the same `serving.knative.dev` CRDs, so the
//! two cannot both reconcile them: a role refuses to start when Knative Serving's controller
//! runs (the Deployment `knative-serving/controller`) or its webhook is registered (a webhook
//! configuration calling the Service `knative-serving/webhook`), and warns when Knative's
//! ConfigMaps are in `knative-serving` (thaw reads its own namespace's, not those). A check
//! the role may not make (403) is logged and skipped: it cannot tell.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ServiceReference, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};

/// Knative Serving's namespace.
pub const KNATIVE_NAMESPACE: &str = "knative-serving";
/// Its controller's Deployment and its webhook's Service.
pub const KNATIVE_CONTROLLER: &str = "controller";
pub const KNATIVE_WEBHOOK_SERVICE: &str = "webhook";

/// The ConfigMaps thaw reads in its own namespace, by Knative's names.
pub const CONFIG_MAPS: &[&str] = &[
    "config-autoscaler",
    "config-defaults",
    "config-features",
    "config-deployment",
    "config-domain",
    "config-network",
    "config-gc",
];

fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// Whether a webhook's service reference is Knative's webhook.
fn knative_service(ns: Option<&str>, name: Option<&str>) -> bool {
    ns == Some(KNATIVE_NAMESPACE) && name == Some(KNATIVE_WEBHOOK_SERVICE)
}

/// The webhook configurations `api` lists whose webhooks (their service references, from
/// `services`) call Knative's webhook Service, as `Kind name`.
async fn calling_knative<K>(
    api: &Api<K>,
    services: fn(&K) -> Vec<Option<ServiceReference>>,
) -> Result<Vec<String>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|c| {
            services(c)
                .iter()
                .flatten()
                .any(|s| knative_service(Some(s.namespace.as_str()), Some(s.name.as_str())))
        })
        .map(|c| {
            format!(
                "{} {}",
                K::kind(&()),
                c.meta().name.clone().unwrap_or_default()
            )
        })
        .collect())
}

/// `Err` (the message to log and exit with) when Knative Serving runs in the cluster; `Ok`
/// with the warnings to log otherwise. `role` names the role in the messages.
pub async fn check(client: &kube::Client, role: &str) -> Result<Vec<String>, String> {
    let refuse = |what: String| {
        format!(
            "thaw {role}: Knative Serving is installed ({what}); thaw serves the same \
             serving.knative.dev resources and cannot run beside it. Stop Knative Serving's \
             controller and remove its webhook configurations first; docs/migrating-from-knative.md \
             moves a running Knative onto thaw without losing its objects"
        )
    };
    let mut warnings = Vec::new();
    let deps: Api<Deployment> = Api::namespaced(client.clone(), KNATIVE_NAMESPACE);
    match deps.get_opt(KNATIVE_CONTROLLER).await {
        Ok(Some(_)) => {
            return Err(refuse(format!(
                "Deployment {KNATIVE_NAMESPACE}/{KNATIVE_CONTROLLER}"
            )));
        }
        Ok(None) => {}
        Err(e) if forbidden(&e) => {
            warnings.push(format!("cannot check for Knative's controller: {e}"))
        }
        Err(e) => {
            return Err(format!(
                "thaw {role}: cannot check for Knative Serving: {e}"
            ));
        }
    }
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let listed = [
        calling_knative(&vwcs, |c| {
            c.webhooks
                .iter()
                .flatten()
                .map(|w| w.client_config.service.clone())
                .collect()
        })
        .await,
        calling_knative(&mwcs, |c| {
            c.webhooks
                .iter()
                .flatten()
                .map(|w| w.client_config.service.clone())
                .collect()
        })
        .await,
    ];
    let mut found: Vec<String> = Vec::new();
    for l in listed {
        match l {
            Ok(names) => found.extend(names),
            Err(e) if forbidden(&e) => {
                warnings.push(format!("cannot list webhook configurations: {e}"))
            }
            Err(e) => {
                return Err(format!(
                    "thaw {role}: cannot check for Knative Serving: {e}"
                ));
            }
        }
    }
    if let Some(first) = found.first() {
        return Err(refuse(format!(
            "{first} calls {KNATIVE_NAMESPACE}/{KNATIVE_WEBHOOK_SERVICE}"
        )));
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), KNATIVE_NAMESPACE);
    let mut present = Vec::new();
    for name in CONFIG_MAPS {
        match cms.get_opt(name).await {
            Ok(Some(_)) => present.push(*name),
            Ok(None) => {}
            Err(e) if forbidden(&e) => {
                warnings.push(format!("cannot check for Knative's ConfigMaps: {e}"));
                break;
            }
            Err(e) => {
                return Err(format!(
                    "thaw {role}: cannot check for Knative Serving: {e}"
                ));
            }
        }
    }
    if !present.is_empty() {
        warnings.push(format!(
            "Knative's ConfigMaps are in {KNATIVE_NAMESPACE} ({}); thaw does not read them: it \
             reads its own namespace's. `thaw migrate config --from-cluster` writes them there",
            present.join(", ")
        ));
    }
    Ok(warnings)
}
