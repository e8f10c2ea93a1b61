//! The questions a preflight asks the API server: each permission a rule
//! needs, on the resource discovery resolved, in each namespace it is used
//! in. Shared by the operator's own preflight (SelfSubjectAccessReview, in
//! [`crate::operator::controller`]) and the account preflight of a rule with
//! `serviceAccountName` (SubjectAccessReview, in [`crate::operator::identity`]), so
//! both ask about the same resources in the same places.

use k8s_openapi::api::authorization::v1::ResourceAttributes;

use crate::kinds::Gvk;
use crate::rbac::Permission;
use crate::rules::CompiledRule;

use crate::operator::watches::discovery::{Resolved, RuleKinds};

/// One question: may `perm` be used in `namespace` (`None`: cluster-wide, or
/// every namespace)?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub perm: Permission,
    pub namespace: Option<String>,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} in namespace {ns}", self.perm),
            None => write!(f, "{}", self.perm),
        }
    }
}

/// Where the rule uses each permission. Resource names and scopes come from
/// discovery where the rule's kinds are concerned, so a CRD's real plural is
/// asked about, and cluster-scoped resources are asked about cluster-wide.
/// Reads of a kind watched beyond the parent's namespaces are asked where
/// it is watched: a related kind an entry may read in another namespace in
/// every namespace the operator watches (see [`crate::related_watches`]), a child kind a
/// child may place in another namespace everywhere. `serviceaccounts` (the
/// rule's account) are asked about in `home`, the operator's namespace.
pub fn checks(
    perms: Vec<Permission>,
    rule: &CompiledRule,
    kinds: &RuleKinds,
    namespaces: &[String],
    operator_namespaces: &[String],
    home: &str,
) -> Vec<Check> {
    let scopes_of = |namespaces: &[String]| -> Vec<Option<String>> {
        if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.iter().cloned().map(Some).collect()
        }
    };
    let namespaced_scopes = scopes_of(namespaces);
    let related_scopes = scopes_of(operator_namespaces);
    let wide_related: Vec<Gvk> = crate::related_watches::watch_specs(rule)
        .into_iter()
        .filter(|w| w.anywhere || !kinds.parent.namespaced)
        .map(|w| w.gvk)
        .collect();
    let anywhere_children: Vec<&Gvk> = rule
        .children
        .iter()
        .filter(|c| c.spec.allow_cross_namespace)
        .map(|c| &c.gvk)
        .collect();
    let resolved: Vec<&Resolved> = std::iter::once(&kinds.parent)
        .chain(kinds.children.iter())
        .chain(kinds.related.iter())
        .collect();
    let mut out = Vec::new();
    for mut perm in perms {
        let known = resolved.iter().find(|r| {
            r.resource.group == perm.group
                && (r.resource.plural == perm.resource
                    || crate::kinds::plural(&r.gvk) == perm.resource)
        });
        let cluster_scoped = match known {
            Some(r) => {
                perm.resource = r.resource.plural.clone();
                !r.namespaced
            }
            None => crate::kinds::is_cluster_scoped_resource(&perm.group, &perm.resource),
        };
        let read = matches!(perm.verb, "get" | "list" | "watch");
        let gvk = known.map(|r| &r.gvk);
        let scopes: Vec<Option<String>> = if cluster_scoped {
            vec![None]
        } else if perm.group.is_empty() && perm.resource == "serviceaccounts" {
            vec![Some(home.to_owned())]
        } else if read && gvk.is_some_and(|g| anywhere_children.contains(&g)) {
            vec![None]
        } else if read && gvk.is_some_and(|g| wide_related.contains(g)) {
            related_scopes.clone()
        } else {
            namespaced_scopes.clone()
        };
        for namespace in scopes {
            out.push(Check {
                perm: perm.clone(),
                namespace,
            });
        }
    }
    out
}

/// Every question the operator's own preflight asks for `rule`: its share
/// of the rule's permissions where the rule uses them ([`checks`]), and,
/// for a rule with `rollout:`, the revision ConfigMaps in `home`, the
/// operator's namespace. Those are listed, watched and written with the
/// operator's own client (`Shared::client` in `rollout`, `versions` and
/// `revision_watch`), never a rule's account, so the account preflight
/// ([`crate::operator::identity`]) does not ask about them.
pub fn operator_checks(
    rule: &CompiledRule,
    kinds: &RuleKinds,
    namespaces: &[String],
    operator_namespaces: &[String],
    home: &str,
) -> Vec<Check> {
    let mut out = checks(
        crate::rbac::rule_permissions(rule),
        rule,
        kinds,
        namespaces,
        operator_namespaces,
        home,
    );
    out.extend(
        crate::rbac::revision_permissions(rule)
            .into_iter()
            .map(|perm| Check {
                perm,
                namespace: Some(home.to_owned()),
            }),
    );
    out
}

/// The review's question for `check`.
pub fn attributes(check: &Check) -> ResourceAttributes {
    ResourceAttributes {
        group: Some(check.perm.group.clone()),
        resource: Some(check.perm.resource.clone()),
        subresource: check.perm.subresource.clone(),
        verb: Some(check.perm.verb.to_owned()),
        name: check.perm.name.clone(),
        namespace: check.namespace.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::discovery::ApiResource;

    fn resolved(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
    ) -> Resolved {
        let gvk = Gvk::new(
            &if group.is_empty() {
                version.to_owned()
            } else {
                format!("{group}/{version}")
            },
            kind,
        );
        let gvk_kube = kube::api::GroupVersionKind::gvk(group, version, kind);
        Resolved {
            gvk,
            resource: ApiResource::from_gvk_with_plural(&gvk_kube, plural).into(),
            namespaced,
            status_subresource: true,
        }
    }

    const RULE: &str = r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {name: web}
spec:
  serviceAccountName: web-writer
  parent: {apiVersion: demo.trellis.dev/v1, kind: Octopus, plural: octopodes}
  related:
    - id: creds
      apiVersion: v1
      kind: Secret
      name: "{{ spec.secret }}"
    - id: shared
      apiVersion: v1
      kind: ConfigMap
      name: shared
      namespace: platform
      allowCrossNamespace: true
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
    - id: quota
      apiVersion: v1
      kind: ResourceQuota
      allowCrossNamespace: true
      template: |
        metadata:
          name: {{ parent.metadata.name }}
          namespace: elsewhere
    - id: ns
      apiVersion: v1
      kind: Namespace
      allowCrossNamespace: true
      template: |
        metadata:
          name: {{ parent.metadata.name }}
"#;

    fn setup() -> (std::sync::Arc<CompiledRule>, RuleKinds) {
        let set = crate::rules::testing::load_texts(&[("r.yaml", RULE)]);
        let rule = set.rules[0].clone();
        let kinds = RuleKinds {
            parent: resolved("demo.trellis.dev", "v1", "Octopus", "octopodes", true),
            children: vec![
                resolved("", "v1", "ConfigMap", "configmaps", true),
                resolved("", "v1", "ResourceQuota", "resourcequotas", true),
                resolved("", "v1", "Namespace", "namespaces", false),
            ],
            related: vec![
                resolved("", "v1", "Secret", "secrets", true),
                resolved("", "v1", "ConfigMap", "configmaps", true),
            ],
            unserved_related: vec![],
        };
        (rule, kinds)
    }

    /// The checks for a rule with the operator in `trellis-system`.
    fn asked_of(
        permissions: Vec<crate::rbac::Permission>,
        rule: &CompiledRule,
        kinds: &RuleKinds,
        namespaces: &[String],
        operator: &[String],
    ) -> Vec<Check> {
        checks(
            permissions,
            rule,
            kinds,
            namespaces,
            operator,
            "trellis-system",
        )
    }

    fn asked(checks: &[Check], verb: &str) -> Vec<String> {
        checks
            .iter()
            .filter(|c| c.perm.verb == verb)
            .map(|c| c.to_string())
            .collect()
    }

    #[test]
    fn the_account_is_asked_to_read_every_kind_where_the_rule_reads_it() {
        let (rule, kinds) = setup();
        let namespaces = ["a".to_owned(), "b".to_owned()];
        let operator = ["a".to_owned(), "b".to_owned(), "platform".to_owned()];
        let checks = asked_of(
            crate::rbac::account_read_permissions(&rule),
            &rule,
            &kinds,
            &namespaces,
            &operator,
        );
        assert_eq!(
            asked(&checks, "list"),
            [
                // ConfigMaps are both a child (the parent's namespaces) and
                // read across namespaces by a related entry: the wider wins.
                "list configmaps in namespace a",
                "list configmaps in namespace b",
                "list configmaps in namespace platform",
                "list namespaces",
                "list resourcequotas",
                "list secrets in namespace a",
                "list secrets in namespace b",
                "list octopodes.demo.trellis.dev in namespace a",
                "list octopodes.demo.trellis.dev in namespace b",
            ]
        );
        assert_eq!(asked(&checks, "get").len(), 9);
        assert_eq!(asked(&checks, "watch").len(), 9);
        assert!(asked(&checks, "create").is_empty(), "reads only");
    }

    #[test]
    fn the_operator_asks_about_impersonating_its_account_in_its_own_namespace() {
        let (rule, kinds) = setup();
        let checks = asked_of(
            crate::rbac::rule_permissions(&rule),
            &rule,
            &kinds,
            &["a".to_owned()],
            &["a".to_owned()],
        );
        assert_eq!(
            asked(&checks, "impersonate"),
            ["impersonate serviceaccounts named web-writer in namespace trellis-system"]
        );
        assert!(
            asked(&checks, "create")
                .iter()
                .all(|c| c.starts_with("create subjectaccessreviews")),
            "the operator asks for no child write: {:?}",
            asked(&checks, "create")
        );
    }

    /// [`RULE`] with a staged rollout.
    fn with_rollout() -> std::sync::Arc<CompiledRule> {
        let text = format!("{RULE}  rollout:\n    steps:\n      - percent: 50\n");
        let set = crate::rules::testing::load_texts(&[("r.yaml", &text)]);
        assert!(set.rules[0].rollout.is_some(), "the rule has rollout:");
        set.rules[0].clone()
    }

    /// The checks in `namespace` on core ConfigMaps, as "verb namespace".
    fn configmaps_in(checks: &[Check], namespace: &str) -> Vec<String> {
        checks
            .iter()
            .filter(|c| c.perm.group.is_empty() && c.perm.resource == "configmaps")
            .filter(|c| c.namespace.as_deref() == Some(namespace))
            .map(|c| c.to_string())
            .collect()
    }

    #[test]
    fn a_rule_with_rollout_asks_for_its_revision_configmaps_in_the_operator_namespace() {
        let (_, kinds) = setup();
        let rule = with_rollout();
        let namespaces = ["a".to_owned()];
        let all = operator_checks(&rule, &kinds, &namespaces, &namespaces, "trellis-system");
        assert_eq!(
            configmaps_in(&all, "trellis-system"),
            [
                "list configmaps in namespace trellis-system",
                "watch configmaps in namespace trellis-system",
                "create configmaps in namespace trellis-system",
                "patch configmaps in namespace trellis-system",
                "delete configmaps in namespace trellis-system",
            ]
        );
        // Exactly what the Role `trellis rbac` prints grants there.
        let role = crate::rbac::namespaced_role_of(&[&rule], "trellis", "trellis-system");
        let granted: Vec<&serde_json::Value> = role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r["resources"] == serde_json::json!(["configmaps"]))
            .collect();
        assert_eq!(
            granted[0]["verbs"],
            serde_json::json!(["list", "watch", "create", "patch", "delete"])
        );
        // The rest is what the rule asked before.
        let before = asked_of(
            crate::rbac::rule_permissions(&rule),
            &rule,
            &kinds,
            &namespaces,
            &namespaces,
        );
        assert_eq!(all[..before.len()], before[..]);
        assert_eq!(all.len(), before.len() + 5);
    }

    #[test]
    fn a_rule_without_rollout_asks_nothing_in_the_operator_namespace() {
        let (rule, kinds) = setup();
        let namespaces = ["a".to_owned()];
        let all = operator_checks(&rule, &kinds, &namespaces, &namespaces, "trellis-system");
        assert_eq!(configmaps_in(&all, "trellis-system"), Vec::<String>::new());
        let before = asked_of(
            crate::rbac::rule_permissions(&rule),
            &rule,
            &kinds,
            &namespaces,
            &namespaces,
        );
        assert_eq!(all, before);
    }

    #[test]
    fn the_account_is_not_asked_about_revision_configmaps() {
        let (_, kinds) = setup();
        let rule = with_rollout();
        let checks = asked_of(
            crate::rbac::account_read_permissions(&rule),
            &rule,
            &kinds,
            &["a".to_owned()],
            &["a".to_owned()],
        );
        assert_eq!(
            configmaps_in(&checks, "trellis-system"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_namespace_when_the_rule_watches_all() {
        let (rule, kinds) = setup();
        let checks = asked_of(
            crate::rbac::account_read_permissions(&rule),
            &rule,
            &kinds,
            &[],
            &[],
        );
        assert!(checks.iter().all(|c| c.namespace.is_none()), "{checks:?}");
    }
}
