//! The operator's Role in its own namespace: what it keeps there (Leases,
//! revision ConfigMaps, the webhook's Secret) and nowhere else.

use serde_json::{Value, json};

use super::Verb::*;
use super::{Grants, Permission, permissions, role_object, versions};
use crate::rules::{CompiledRule, RuleSet};

/// The operator's Role in its own namespace (`namespace`): what it keeps
/// there and nowhere else, so that no cluster-wide grant is needed for it.
///
/// | resource | verbs | because |
/// |---|---|---|
/// | `coordination.k8s.io` leases | get, list, watch, create, update, patch, delete | leader election (taken, renewed and released by patch or update, watched so a release is seen at once) and shard membership (member Leases created, renewed, watched by label, dead ones deleted by the leader) |
/// | `configmaps` (when a rule has `rollout:`) | list, watch, create, patch, delete | the revision ConfigMaps: listed and watched by label, written by server-side apply (a create when new), old ones pruned |
/// | `secrets` (when a rule has a `cluster:` child) | list, watch | the Secrets registering spokes |
/// | `configmaps` (when a rule has a `cluster:` child) | get, create, patch | the record of spoke cleanups under way (`trellis-spoke-cleanup-<--cluster-name>`), so that a restart resumes them |
/// | `secrets` (when a rule has `versions:`) | get, create, update | the conversion webhook's certificates (`trellis-webhook-tls`): read by every replica, made and renewed by the leader |
pub fn namespaced_role(set: &RuleSet, name: &str, namespace: &str) -> Value {
    namespaced_role_of(&versions(set), name, namespace)
}

/// [`namespaced_role`] for any rule versions.
pub fn namespaced_role_of(rules: &[&CompiledRule], name: &str, namespace: &str) -> Value {
    let mut grants = Grants::default();
    grants.allow(
        "coordination.k8s.io",
        "leases",
        &[Get, List, Watch, Create, Update, Patch, Delete],
    );
    for rule in rules {
        revision_grants(rule, &mut grants);
    }
    if rules
        .iter()
        .any(|r| r.children.iter().any(|c| c.cluster.is_some()))
    {
        // The Secrets registering spokes (`trellis.dev/cluster`), watched.
        grants.allow("", "secrets", &[List, Watch]);
        // The record of spoke cleanups under way
        // (`trellis-spoke-cleanup-<hub>`): read at start, one key merged
        // in or out at a time.
        grants.allow("", "configmaps", &[Get, Create, Patch]);
    }
    if rules.iter().any(|r| !r.versions.is_empty()) {
        // The webhook's Secret: GET and UPDATE could name it, CREATE cannot
        // (the name is in the body); it holds nothing but its certificates.
        grants.allow("", "secrets", &[Get, Create, Update]);
    }
    let mut role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
    });
    let cluster = role_object(name, grants, None);
    for key in ["labels", "annotations"] {
        role["metadata"][key] = cluster["metadata"][key].clone();
    }
    role["rules"] = cluster["rules"].clone();
    role
}

/// What the operator needs in its own namespace for `rule`'s revision
/// ConfigMaps, when the rule has `rollout:`. The one source of both the
/// Role's grant ([`namespaced_role_of`]) and the preflight's questions
/// ([`revision_permissions`]), so the two cannot drift.
fn revision_grants(rule: &CompiledRule, grants: &mut Grants) {
    if rule.rollout.is_some() {
        // The operator never GETs a revision ConfigMap: it lists them by
        // label at a rule's start, watches them while the rule runs (every
        // replica), applies them and deletes old ones.
        grants.allow("", "configmaps", &[List, Watch, Create, Patch, Delete]);
    }
}

/// What the operator must be allowed in its own namespace for `rule`: the
/// revision ConfigMaps of a rule with `rollout:` (see [`namespaced_role`]);
/// empty for a rule without. They are read and written with the operator's
/// own client, never a rule's account, so only the operator is asked.
pub fn revision_permissions(rule: &CompiledRule) -> Vec<Permission> {
    let mut grants = Grants::default();
    revision_grants(rule, &mut grants);
    permissions(grants)
}
