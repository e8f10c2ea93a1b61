//! What trellis knows about kinds without asking a cluster: resource (plural)
//! names, scope, and whether a kind is built into Kubernetes.
//!
//! Offline commands (`render`, `rbac`, `check`) use this table; the running
//! operator asks API discovery instead and only falls back to nothing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Namespaced or cluster-scoped. Discovery decides on a live cluster; this
/// field only informs offline commands about kinds they cannot look up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// A group/version/kind as written in a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvk {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl Gvk {
    pub fn new(api_version: &str, kind: &str) -> Gvk {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), api_version.to_owned()),
        };
        Gvk {
            group,
            version,
            kind: kind.to_owned(),
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Kinds served by Kubernetes itself (core and `*.k8s.io` groups, and the
    /// dot-less legacy groups like `apps`), as opposed to CRDs.
    pub fn is_builtin(&self) -> bool {
        !self.group.contains('.') || self.group.ends_with(".k8s.io")
    }
}

impl std::fmt::Display for Gvk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.api_version(), self.kind)
    }
}

/// (group, kind, plural, scope) of built-in kinds whose plural or scope a
/// simple rule would get wrong, or which are cluster-scoped.
const KNOWN: &[(&str, &str, &str, Scope)] = &[
    ("", "Namespace", "namespaces", Scope::Cluster),
    ("", "Node", "nodes", Scope::Cluster),
    ("", "PersistentVolume", "persistentvolumes", Scope::Cluster),
    ("", "Endpoints", "endpoints", Scope::Namespaced),
    ("", "ComponentStatus", "componentstatuses", Scope::Cluster),
    (
        "rbac.authorization.k8s.io",
        "ClusterRole",
        "clusterroles",
        Scope::Cluster,
    ),
    (
        "rbac.authorization.k8s.io",
        "ClusterRoleBinding",
        "clusterrolebindings",
        Scope::Cluster,
    ),
    (
        "storage.k8s.io",
        "StorageClass",
        "storageclasses",
        Scope::Cluster,
    ),
    ("storage.k8s.io", "CSIDriver", "csidrivers", Scope::Cluster),
    ("storage.k8s.io", "CSINode", "csinodes", Scope::Cluster),
    (
        "storage.k8s.io",
        "VolumeAttachment",
        "volumeattachments",
        Scope::Cluster,
    ),
    (
        "networking.k8s.io",
        "IngressClass",
        "ingressclasses",
        Scope::Cluster,
    ),
    (
        "scheduling.k8s.io",
        "PriorityClass",
        "priorityclasses",
        Scope::Cluster,
    ),
    (
        "node.k8s.io",
        "RuntimeClass",
        "runtimeclasses",
        Scope::Cluster,
    ),
    (
        "apiextensions.k8s.io",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        Scope::Cluster,
    ),
    (
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        Scope::Cluster,
    ),
    (
        "admissionregistration.k8s.io",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        Scope::Cluster,
    ),
    (
        "apiregistration.k8s.io",
        "APIService",
        "apiservices",
        Scope::Cluster,
    ),
    (
        "certificates.k8s.io",
        "CertificateSigningRequest",
        "certificatesigningrequests",
        Scope::Cluster,
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "FlowSchema",
        "flowschemas",
        Scope::Cluster,
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
        Scope::Cluster,
    ),
];

/// Resource name of a kind: the built-in table first, then kubectl-style
/// pluralisation of the lowercased kind.
pub fn plural(gvk: &Gvk) -> String {
    if let Some((_, _, plural, _)) = KNOWN
        .iter()
        .find(|(g, k, _, _)| *g == gvk.group && *k == gvk.kind)
    {
        return (*plural).to_owned();
    }
    pluralize(&gvk.kind.to_lowercase())
}

/// Scope of a kind as far as the table knows: cluster-scoped built-ins are
/// listed, everything else is assumed namespaced.
pub fn scope(gvk: &Gvk) -> Scope {
    KNOWN
        .iter()
        .find(|(g, k, _, _)| *g == gvk.group && *k == gvk.kind)
        .map(|(_, _, _, s)| *s)
        .unwrap_or(Scope::Namespaced)
}

/// Whether a built-in resource (by group and plural) is cluster-scoped.
pub fn is_cluster_scoped_resource(group: &str, plural: &str) -> bool {
    KNOWN
        .iter()
        .any(|(g, _, p, s)| *g == group && *p == plural && *s == Scope::Cluster)
}

fn pluralize(singular: &str) -> String {
    let ends = |s: &str| singular.ends_with(s);
    if ends("s") || ends("x") || ends("z") || ends("ch") || ends("sh") {
        return format!("{singular}es");
    }
    if let Some(stem) = singular.strip_suffix('y') {
        let before = stem.chars().last();
        if before.is_some_and(|c| !"aeiou".contains(c)) {
            return format!("{stem}ies");
        }
    }
    format!("{singular}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pluralizes_like_kubectl() {
        assert_eq!(plural(&Gvk::new("v1", "ConfigMap")), "configmaps");
        assert_eq!(
            plural(&Gvk::new("networking.k8s.io/v1", "Ingress")),
            "ingresses"
        );
        assert_eq!(plural(&Gvk::new("v1", "ResourceQuota")), "resourcequotas");
        assert_eq!(plural(&Gvk::new("a.io/v1", "Policy")), "policies");
        assert_eq!(plural(&Gvk::new("a.io/v1", "Gateway")), "gateways");
        assert_eq!(plural(&Gvk::new("v1", "Endpoints")), "endpoints");
        assert_eq!(
            plural(&Gvk::new("storage.k8s.io/v1", "StorageClass")),
            "storageclasses"
        );
    }

    #[test]
    fn knows_cluster_scoped_builtins() {
        assert_eq!(scope(&Gvk::new("v1", "Namespace")), Scope::Cluster);
        assert_eq!(scope(&Gvk::new("v1", "ConfigMap")), Scope::Namespaced);
        assert_eq!(
            scope(&Gvk::new(
                "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding"
            )),
            Scope::Cluster
        );
    }

    #[test]
    fn tells_builtin_groups_from_crds() {
        assert!(Gvk::new("v1", "Pod").is_builtin());
        assert!(Gvk::new("apps/v1", "Deployment").is_builtin());
        assert!(Gvk::new("networking.k8s.io/v1", "Ingress").is_builtin());
        assert!(!Gvk::new("demo.trellis.dev/v1", "WebApp").is_builtin());
    }
}
