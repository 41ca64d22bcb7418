//! Child names (Knative's `kmeta.ChildName`) and the labels every watch selects by.
//!
//! The revision's pods, Deployment, private Service and its EndpointSlices carry
//! [`labels::REVISION`], and each data-plane watch selects by label (one watch per kind for
//! every revision). Labels prove nothing, so the data plane then keeps only the Deployment and
//! private Service named for the revision by [`child_name`] and controlled by its Revision's
//! UID (`platform::kubernetes`'s `children`).

use md5::{Digest, Md5};

/// The longest name Kubernetes accepts for the objects named here (a DNS-1035 label).
pub const MAX_NAME_LEN: usize = 63;
/// An MD5 digest in lower-case hex.
const HASH_LEN: usize = 32;
/// What is kept of the parent when a hash has to go in.
const HEAD: usize = MAX_NAME_LEN - HASH_LEN;

/// `parent + suffix`, shortened with a hash when longer than 63 characters: exactly Knative's
/// `kmeta.ChildName`, so names match those a Knative controller would give.
///
/// - fits: `parent + suffix` (`hello` + `-deployment` → `hello-deployment`);
/// - too long, suffix under 31 characters: the first `31 - len(suffix)` characters of the
///   parent, the MD5 of the whole parent in hex, then the suffix (63 characters in all);
/// - suffix of 31 characters or more: the first 31 characters of the parent, the MD5 of
///   `parent + suffix`, then as much of the suffix as fits, with trailing non-alphanumeric
///   characters removed.
///
/// Names are ASCII (Kubernetes names are), so byte and character lengths agree; a non-ASCII
/// input is cut at a character boundary at or before the byte Knative would cut at.
pub fn child_name(parent: &str, suffix: &str) -> String {
    if parent.len() <= MAX_NAME_LEN.saturating_sub(suffix.len()) {
        return format!("{parent}{suffix}");
    }
    if HEAD <= suffix.len() {
        let hash = md5_hex(&[parent.as_bytes(), suffix.as_bytes()]);
        let mut ret = format!("{}{hash}", prefix(parent, HEAD));
        let room = MAX_NAME_LEN.saturating_sub(ret.len());
        ret.push_str(prefix(suffix, room));
        while ret.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
            ret.pop();
        }
        return ret;
    }
    let hash = md5_hex(&[parent.as_bytes()]);
    format!("{}{hash}{suffix}", prefix(parent, HEAD - suffix.len()))
}

fn md5_hex(parts: &[&[u8]]) -> String {
    let mut h = Md5::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The longest prefix of `s` of at most `n` bytes that ends on a character boundary.
fn prefix(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The suffix of a revision's Deployment: `<revision>-deployment`.
pub const DEPLOYMENT_SUFFIX: &str = "-deployment";
/// The suffix of a revision's private Service: `<revision>-private`.
pub const PRIVATE_SERVICE_SUFFIX: &str = "-private";

/// Label keys and values, Knative's (`serving/pkg/apis/serving/register.go`,
/// `networking/pkg/apis/networking/register.go`).
pub mod labels {
    /// The revision an object belongs to (pods, Deployment, private and public Service, their
    /// EndpointSlices). Every data-plane watch selects by it.
    pub const REVISION: &str = "serving.knative.dev/revision";
    /// The revision's UID.
    pub const REVISION_UID: &str = "serving.knative.dev/revisionUID";
    /// The configuration a revision (and its children) came from.
    pub const CONFIGURATION: &str = "serving.knative.dev/configuration";
    /// The configuration's UID.
    pub const CONFIGURATION_UID: &str = "serving.knative.dev/configurationUID";
    /// The configuration's generation a revision was stamped from.
    pub const CONFIGURATION_GENERATION: &str = "serving.knative.dev/configurationGeneration";
    /// The Knative Service a configuration, route or revision belongs to.
    pub const SERVICE: &str = "serving.knative.dev/service";
    /// The Knative Service's UID.
    pub const SERVICE_UID: &str = "serving.knative.dev/serviceUID";
    /// The route a placeholder Service belongs to.
    pub const ROUTE: &str = "serving.knative.dev/route";
    /// `active`, `reserve` or `pending` (set on revisions by the route's labeler).
    pub const ROUTING_STATE: &str = "serving.knative.dev/routingState";
    /// Which of a revision's two Services this is: [`SERVICE_TYPE_PRIVATE`] or
    /// [`SERVICE_TYPE_PUBLIC`]. Also on their EndpointSlices (the endpoints controller copies
    /// a Service's labels onto its slices).
    pub const SERVICE_TYPE: &str = "networking.internal.knative.dev/serviceType";
    /// The private Service: selects the revision's pods; its slices list them.
    pub const SERVICE_TYPE_PRIVATE: &str = "Private";
    /// The public Service: no selector; its slices point at the activators or the pods.
    pub const SERVICE_TYPE_PUBLIC: &str = "Public";
    /// Set by Kubernetes on every EndpointSlice: the Service it belongs to.
    pub const ENDPOINTSLICE_SERVICE_NAME: &str = "kubernetes.io/service-name";
    /// Set on every EndpointSlice: who manages it.
    pub const ENDPOINTSLICE_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
    /// thaw's autoscaler as the manager of the public Service's slices.
    pub const MANAGED_BY_AUTOSCALER: &str = "autoscaler.thaw.dev";

    /// The label selector of every private EndpointSlice of every revision:
    /// `networking.internal.knative.dev/serviceType=Private,serving.knative.dev/revision`.
    pub fn private_endpoint_slices() -> String {
        format!("{SERVICE_TYPE}={SERVICE_TYPE_PRIVATE},{REVISION}")
    }

    /// A label value naming an object: the name itself when it fits Kubernetes' 63-character
    /// limit on label values, else `child_name(name, "")` (a prefix and the name's MD5, 63
    /// characters). Every label that names a configuration, service or route goes through
    /// this, and readers select by the same mapping.
    pub fn value(name: &str) -> String {
        super::child_name(name, "")
    }

    /// The label selector of one revision's objects: `serving.knative.dev/revision=<name>`.
    pub fn revision(name: &str) -> String {
        format!("{REVISION}={name}")
    }
}

/// Knative's default name of an unnamed user container (`config-defaults`'
/// `container-name-template` at its default).
pub const USER_CONTAINER_NAME: &str = "user-container";
/// Knative's default name of an unnamed init container.
pub const INIT_CONTAINER_NAME: &str = "init-container";

/// Knative's container-name defaulting: a lone unnamed container is `user-container`; with
/// several, the unnamed one at index `i` is `user-container-<i>`, or, when a container
/// already has that name, the first free `user-container-<k>` (so no two containers share a
/// name). Init containers the same, as `init-container…`, no name shared with a container.
pub fn default_container_names(spec: &mut k8s_openapi::api::core::v1::PodSpec) {
    let mut taken: std::collections::BTreeSet<String> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.name.clone())
        .collect();
    fn name_all(
        containers: &mut [k8s_openapi::api::core::v1::Container],
        base: &str,
        taken: &mut std::collections::BTreeSet<String>,
    ) {
        if let [only] = containers {
            if only.name.is_empty() {
                only.name = base.to_string();
            }
            return;
        }
        for (i, c) in containers.iter_mut().enumerate() {
            if !c.name.is_empty() {
                continue;
            }
            let named = |k: usize| child_name(base, &format!("-{k}"));
            let name = if taken.contains(&named(i)) {
                (0..)
                    .map(named)
                    .find(|n| !taken.contains(n))
                    .unwrap_or_default()
            } else {
                named(i)
            };
            taken.insert(name.clone());
            c.name = name;
        }
    }
    name_all(&mut spec.containers, USER_CONTAINER_NAME, &mut taken);
    if let Some(init) = spec.init_containers.as_mut() {
        name_all(init, INIT_CONTAINER_NAME, &mut taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_concatenated() {
        assert_eq!(
            child_name("hello-00001", DEPLOYMENT_SUFFIX),
            "hello-00001-deployment"
        );
        assert_eq!(child_name("hello", "-00003"), "hello-00003");
        let exactly = "a".repeat(63 - "-private".len());
        assert_eq!(child_name(&exactly, "-private").len(), 63);
        assert_eq!(
            child_name(&exactly, "-private"),
            format!("{exactly}-private")
        );
    }

    #[test]
    fn a_70_character_parent_is_hashed_to_63() {
        let parent = format!("{}-00001", "x".repeat(64));
        assert_eq!(parent.len(), 70);
        let name = child_name(&parent, DEPLOYMENT_SUFFIX);
        assert_eq!(name.len(), 63);
        // head of the parent, md5(parent) in hex, the suffix.
        let head = &parent[..31 - DEPLOYMENT_SUFFIX.len()];
        let hash = md5_hex(&[parent.as_bytes()]);
        assert_eq!(name, format!("{head}{hash}{DEPLOYMENT_SUFFIX}"));
        assert_eq!(
            name,
            "xxxxxxxxxxxxxxxxxxxx8ed60a4f2c6302891669084469dd6eff-deployment"
        );
        assert!(name.ends_with("-deployment"));
        // Deterministic, and different parents give different names.
        assert_eq!(name, child_name(&parent, DEPLOYMENT_SUFFIX));
        let other = format!("{}-00002", "x".repeat(64));
        assert_ne!(name, child_name(&other, DEPLOYMENT_SUFFIX));
    }

    #[test]
    fn matches_knative_for_a_known_input() {
        // md5("abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz")
        // = 2a9ad6c1ea87bc2a5be5b87e0dbd3d8d (checked with md5sum); 62 + 9 > 63.
        let parent = "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz";
        let name = child_name(parent, "-suffixes");
        assert_eq!(
            name,
            format!(
                "{}{}-suffixes",
                &parent[..22],
                md5_hex(&[parent.as_bytes()])
            )
        );
        assert_eq!(name.len(), 63);
    }

    #[test]
    fn a_suffix_of_31_or_more_hashes_the_whole() {
        let parent = "p".repeat(40);
        let suffix = format!("-{}", "s".repeat(40));
        let name = child_name(&parent, &suffix);
        let hash = md5_hex(&[parent.as_bytes(), suffix.as_bytes()]);
        assert_eq!(name, format!("{}{hash}", &parent[..31]));
        assert_eq!(name.len(), 63);
        // A short parent leaves room for the start of the suffix; a trailing '-' is dropped.
        let name = child_name("short", &format!("-{}", "s".repeat(60)));
        let hash = md5_hex(&[b"short", format!("-{}", "s".repeat(60)).as_bytes()]);
        assert_eq!(name, format!("short{hash}-{}", "s".repeat(63 - 5 - 32 - 1)));
        let name = child_name(
            "short",
            &format!("{}-----------------------------", "-".repeat(60)),
        );
        assert!(
            name.ends_with(|c: char| c.is_ascii_alphanumeric()),
            "{name}"
        );
        assert!(name.len() <= 63);
    }

    #[test]
    fn selectors() {
        assert_eq!(
            labels::private_endpoint_slices(),
            "networking.internal.knative.dev/serviceType=Private,serving.knative.dev/revision"
        );
        assert_eq!(labels::revision("r"), "serving.knative.dev/revision=r");
    }
}
