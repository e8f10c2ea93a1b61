//! The least-privilege ClusterRole and Role a rule set needs (`trellis rbac`).
//!
//! Everything is derived offline from the compiled rules: parent and child
//! kinds are static in a rule, so the resources the operator touches are known
//! without a cluster. Resource names come from the rule's `plural` overrides or
//! [`kinds::plural`], scopes from the `scope` overrides or [`kinds::scope`].
//! The result never contains a wildcard; one PolicyRule per (apiGroup,
//! resource) carries the union of the verbs every rule needs, in a fixed
//! order, so the output is stable and diffs well when a rule changes.
//!
//! What is granted, and why:
//!
//! | resource | verbs | because |
//! |---|---|---|
//! | each parent kind | get, list, watch | the operator watches parents |
//! | `<parent>/status` (CRD parents) | patch | status is written through the subresource |
//! | each parent kind, when it may carry the finalizer | patch, update | adding and removing `trellis.dev/cleanup` |
//! | each parent kind, with `--shards` | patch | `trellis run --shards`: the `trellis.dev/bucket` label, written once per parent |
//! | each child kind | get, list, watch + per policy | children are cached; see [`child_verbs`] |
//! | each related kind | get, list, watch | related objects are read from watch-backed caches |
//! | each patch target kind | get, list, watch, patch | targets are cached, contributed to by server-side apply; never created or deleted |
//! | `clusterroles` / `roles` referenced by binding children | bind | creating a binding to a role the operator does not hold |
//! | events (core, `events.k8s.io`) | create, patch | Events on parents |
//! | `apiextensions.k8s.io` CRDs | get, list, watch | noticing parent CRDs being installed |
//! | the same, by name (`--manage-crds`) | create, patch | applying the CRDs generated from rules |
//! | `authorization.k8s.io` selfsubjectaccessreviews | create | the startup preflight |
//!
//! What the operator keeps in its own namespace is granted there only, by a
//! Role of the same name (see [`namespaced_role`]):
//!
//! | resource | verbs | because |
//! |---|---|---|
//! | `coordination.k8s.io` leases | get, list, watch, create, update, patch, delete | leader election and shard membership |
//! | `configmaps` (when a rule has `rollout:`) | list, watch, create, patch, delete | the revision ConfigMaps of staged rollouts |
//! | `secrets`, `configmaps` (when a rule has a `cluster:` child) | list, watch; get, create, patch | the Secrets registering spokes; the record of spoke cleanups under way |
//!
//! A rollout in progress may still run an older version of a rule, which
//! may need kinds the version on disk dropped: the `_of` functions take any
//! list of rule versions, and `trellis rbac --from-cluster` passes the live
//! ones read back from the revision ConfigMaps beside those on disk.
//!
//! A rule with `serviceAccountName:` splits this (see [`cluster_roles`]): the
//! rule's writes and reads go to its own ClusterRole `<name>-rule-<rule>`,
//! bound to its account; the operator keeps only what it does itself for
//! that rule — read the parent, child and related kinds for its caches,
//! write the parent's status and finalizer — plus, for every such account:
//!
//! | resource | verbs | because |
//! |---|---|---|
//! | `serviceaccounts`, by name | impersonate | child writes are sent as the rule's account |
//! | `serviceaccounts`, by name | get | an account that does not exist makes its rule Inactive, by name |
//! | `authorization.k8s.io` subjectaccessreviews | create | the account's read preflight |
//!
//! A rule without an account keeps everything in the operator's role,
//! exactly as before.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::kinds;
use crate::rules::model::{Policy, Scope};
use crate::rules::{CompiledChild, CompiledRule, RuleSet};

mod namespaced;
mod role_refs;
mod spoke;
mod viewer;
pub use namespaced::{namespaced_role, namespaced_role_of, revision_permissions};
#[cfg(test)]
use role_refs::RoleRef;
use role_refs::{BindingKind, bind_grants, role_refs};
pub use spoke::{spoke_role, spoke_roles};
pub use viewer::{viewer_role, viewer_role_name};

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Verbs in their canonical output order (the derive order is the sort order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    Bind,
    Impersonate,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::Bind => "bind",
            Verb::Impersonate => "impersonate",
        }
    }
}

use Verb::*;

const READ: &[Verb] = &[Get, List, Watch];

/// (apiGroup, resource)
type Resource = (String, String);

/// The permissions collected so far, merged per resource.
#[derive(Debug, Default)]
struct Grants {
    /// Verbs on every object of a resource.
    any: BTreeMap<Resource, BTreeSet<Verb>>,
    /// Verbs limited to named objects (`resourceNames`).
    named: BTreeMap<(Resource, Verb), BTreeSet<String>>,
}

impl Grants {
    fn allow(&mut self, group: &str, resource: &str, verbs: &[Verb]) {
        self.any
            .entry((group.to_owned(), resource.to_owned()))
            .or_default()
            .extend(verbs.iter().copied());
    }

    fn allow_named(&mut self, group: &str, resource: &str, verb: Verb, name: &str) {
        self.named
            .entry(((group.to_owned(), resource.to_owned()), verb))
            .or_default()
            .insert(name.to_owned());
    }

    /// PolicyRules sorted by apiGroup, then resource; for one resource the
    /// unrestricted rule comes first, then one rule per verb limited by
    /// `resourceNames`. A named grant that an unrestricted one already covers
    /// is dropped.
    fn into_rules(self) -> Vec<Value> {
        let resources: BTreeSet<&Resource> = self
            .any
            .keys()
            .chain(self.named.keys().map(|(r, _)| r))
            .collect();
        let mut rules = Vec::new();
        for resource in resources {
            let (group, name) = resource;
            let unrestricted = self.any.get(resource);
            if let Some(verbs) = unrestricted {
                rules.push(json!({
                    "apiGroups": [group],
                    "resources": [name],
                    "verbs": verbs.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
                }));
            }
            for ((_, verb), names) in self.named.iter().filter(|((r, _), _)| r == resource) {
                if unrestricted.is_some_and(|v| v.contains(verb)) {
                    continue;
                }
                rules.push(json!({
                    "apiGroups": [group],
                    "resources": [name],
                    "resourceNames": names,
                    "verbs": [verb.as_str()],
                }));
            }
        }
        rules
    }
}

/// Builds the operator's ClusterRole for `set`: see the module
/// documentation for what is granted and why.
pub fn cluster_role(set: &RuleSet, name: &str) -> Value {
    cluster_role_with(set, name, false)
}

/// Every rule version of `set`, in rule order.
fn versions(set: &RuleSet) -> Vec<&CompiledRule> {
    set.rules.iter().map(|r| r.as_ref()).collect()
}

/// Every ClusterRole `set` needs (`trellis rbac`): the operator's own,
/// named `name`, first; then, for each rule with `serviceAccountName`, in
/// rule order, the role to bind to its account, named `<name>-rule-<rule>`.
/// A set without accounts needs only the operator's role.
pub fn cluster_roles(set: &RuleSet, name: &str, manage_crds: bool) -> Vec<Value> {
    cluster_roles_of(&versions(set), name, manage_crds)
}

/// [`cluster_roles`] for any rule versions, several of one rule included
/// (`trellis rbac --from-cluster` adds the versions a rollout still runs):
/// each grant is the union over the versions, one account role per rule
/// name.
pub fn cluster_roles_of(rules: &[&CompiledRule], name: &str, manage_crds: bool) -> Vec<Value> {
    cluster_roles_with(rules, name, manage_crds, false)
}

/// [`cluster_roles_of`]; with `shards` (`trellis rbac --shards`) the
/// operator's role may also patch every parent kind, for its bucket label.
fn cluster_roles_with(
    rules: &[&CompiledRule],
    name: &str,
    manage_crds: bool,
    shards: bool,
) -> Vec<Value> {
    let mut roles = vec![cluster_role_of(rules, name, manage_crds, shards)];
    let mut names: Vec<&str> = Vec::new();
    for rule in rules {
        if rule.rule.spec.service_account_name.is_some() && !names.contains(&rule.name.as_str()) {
            names.push(&rule.name);
        }
    }
    for rule_name in names {
        let mut grants = Grants::default();
        for version in rules.iter().filter(|r| r.name == rule_name) {
            if version.rule.spec.service_account_name.is_some() {
                account_grants(version, &mut grants);
            }
        }
        roles.push(role_object(
            &account_role_name(name, rule_name),
            grants,
            Some(rule_name),
        ));
    }
    roles
}

/// The name of the ClusterRole for `rule`'s account (`<name>-rule-<rule>`).
pub fn account_role_name(name: &str, rule: &str) -> String {
    format!("{name}-rule-{rule}")
}

/// The operator's ClusterRole; with `manage_crds` (`trellis run
/// --manage-crds`) also create and patch on the generated CRDs, by name.
/// For a rule with an account it holds only the operator's share (see
/// [`cluster_roles`]).
pub fn cluster_role_with(set: &RuleSet, name: &str, manage_crds: bool) -> Value {
    cluster_role_of(&versions(set), name, manage_crds, false)
}

fn cluster_role_of(rules: &[&CompiledRule], name: &str, manage_crds: bool, shards: bool) -> Value {
    let mut grants = Grants::default();
    operator_grants(&mut grants);
    for rule in rules {
        operator_rule_grants(rule, &mut grants);
        if shards {
            let label = shard_label_permission(rule);
            grants.allow(&label.group, &label.resource, &[Patch]);
        }
        if manage_crds && rule.crd.is_some() {
            let crd = crate::rules::crd::name(&rule.rule);
            for verb in [Get, Create, Patch] {
                grants.allow_named(
                    "apiextensions.k8s.io",
                    "customresourcedefinitions",
                    verb,
                    &crd,
                );
            }
            if !rule.versions.is_empty() {
                // After a storage migration: status.storedVersions trimmed.
                grants.allow_named(
                    "apiextensions.k8s.io",
                    "customresourcedefinitions/status",
                    Patch,
                    &crd,
                );
            }
        }
    }
    role_object(name, grants, None)
}

/// Everything `trellis rbac` prints, in order: [`cluster_roles_of`], then
/// [`namespaced_role_of`] in `namespace`.
pub fn all_roles(
    rules: &[&CompiledRule],
    name: &str,
    namespace: &str,
    manage_crds: bool,
) -> Vec<Value> {
    all_roles_with(rules, name, namespace, manage_crds, false)
}

/// [`all_roles`]; with `shards`, for `trellis run --shards` (see
/// [`shard_label_permission`]).
pub fn all_roles_with(
    rules: &[&CompiledRule],
    name: &str,
    namespace: &str,
    manage_crds: bool,
    shards: bool,
) -> Vec<Value> {
    let mut roles = cluster_roles_with(rules, name, manage_crds, shards);
    roles.push(namespaced_role_of(rules, name, namespace));
    roles
}

fn role_object(name: &str, grants: Grants, rule: Option<&str>) -> Value {
    let mut role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "trellis"},
            "annotations": {"trellis.dev/generated-by": "trellis rbac"},
        },
        "rules": grants.into_rules(),
    });
    if let Some(rule) = rule {
        role["metadata"]["annotations"]["trellis.dev/rule"] = json!(rule);
    }
    role
}

/// One permission a rule needs, as the operator's preflight asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub verb: &'static str,
    /// Limited to one object (`resourceNames`).
    pub name: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(sub) = &self.subresource {
            write!(f, "/{sub}")?;
        }
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(name) = &self.name {
            write!(f, " named {name}")?;
        }
        Ok(())
    }
}

/// Every permission the operator itself needs for one rule (the rule's
/// share of [`cluster_role`]): everything for a rule without an account;
/// for one with an account, reads and the parent's status and finalizer.
pub fn rule_permissions(rule: &CompiledRule) -> Vec<Permission> {
    let mut grants = Grants::default();
    operator_rule_grants(rule, &mut grants);
    permissions(grants)
}

/// Under `trellis run --shards`: patching the rule's parents, for the
/// `trellis.dev/bucket` label each replica selects its own parents by
/// (`trellis rbac --shards`; asked by the preflight only with `--shards`).
pub fn shard_label_permission(rule: &CompiledRule) -> Permission {
    Permission {
        group: rule.parent.group.clone(),
        resource: parent_resource(rule),
        subresource: None,
        verb: Patch.as_str(),
        name: None,
    }
}

/// What a rule's account must be allowed to read: get, list and watch on
/// every kind the rule reads (the parent, each child and related kind),
/// since the operator's shared caches serve those reads. Empty for a rule
/// without an account.
pub fn account_read_permissions(rule: &CompiledRule) -> Vec<Permission> {
    if rule.rule.spec.service_account_name.is_none() {
        return Vec::new();
    }
    let mut grants = Grants::default();
    read_grants(rule, &mut grants);
    permissions(grants)
}

fn permissions(grants: Grants) -> Vec<Permission> {
    let split = |resource: &str| match resource.split_once('/') {
        Some((r, sub)) => (r.to_owned(), Some(sub.to_owned())),
        None => (resource.to_owned(), None),
    };
    let mut out = Vec::new();
    for ((group, resource), verbs) in &grants.any {
        let (resource, subresource) = split(resource);
        for verb in verbs {
            out.push(Permission {
                group: group.clone(),
                resource: resource.clone(),
                subresource: subresource.clone(),
                verb: verb.as_str(),
                name: None,
            });
        }
    }
    for (((group, resource), verb), names) in &grants.named {
        let (resource, subresource) = split(resource);
        for name in names {
            out.push(Permission {
                group: group.clone(),
                resource: resource.clone(),
                subresource: subresource.clone(),
                verb: verb.as_str(),
                name: Some(name.clone()),
            });
        }
    }
    out
}

/// What the operator needs whatever the rules say.
fn operator_grants(grants: &mut Grants) {
    // Events about parents; the recorder patches an Event to bump its count.
    grants.allow("", "events", &[Create, Patch]);
    grants.allow("events.k8s.io", "events", &[Create, Patch]);
    // Leases live in the operator's namespace: `namespaced_role`.
    // A rule whose parent CRD is not installed yet starts once it appears.
    grants.allow("apiextensions.k8s.io", "customresourcedefinitions", READ);
    // The startup preflight asks the API server what the operator may do.
    grants.allow(
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        &[Create],
    );
}

/// The operator's grants for one rule: all of them without an account;
/// with one, its caches' reads and the parent's status and finalizer, plus
/// impersonating (and looking up) the account and reviewing its access.
fn operator_rule_grants(rule: &CompiledRule, grants: &mut Grants) {
    parent_grants(rule, grants);
    match &rule.rule.spec.service_account_name {
        None => account_grants(rule, grants),
        Some(account) => {
            read_grants(rule, grants);
            grants.allow_named("", "serviceaccounts", Impersonate, account);
            grants.allow_named("", "serviceaccounts", Get, account);
            grants.allow("authorization.k8s.io", "subjectaccessreviews", &[Create]);
        }
    }
}

fn parent_resource(rule: &CompiledRule) -> String {
    rule.rule
        .spec
        .parent
        .plural
        .clone()
        .unwrap_or_else(|| kinds::plural(&rule.parent))
}

/// What the operator writes to a parent itself, whoever writes its
/// children: status and the finalizer (and reading it).
fn parent_grants(rule: &CompiledRule, grants: &mut Grants) {
    let group = rule.parent.group.as_str();
    let resource = parent_resource(rule);
    grants.allow(group, &resource, READ);
    if rule.writes_status() {
        grants.allow(group, &format!("{resource}/status"), &[Patch]);
    }
    if may_need_finalizer(rule) {
        // Adding and removing the finalizer writes metadata.finalizers: a
        // patch, or an update guarded by resourceVersion where a patch could
        // race with other finalizers; both are granted.
        grants.allow(group, &resource, &[Patch, Update]);
    }
    if !rule.versions.is_empty() {
        // A storage migration rewrites every parent once (an update that
        // changes nothing but the stored version).
        grants.allow(group, &resource, &[Update]);
    }
}

/// Reads of every kind the rule reads: the parent, its children, its
/// related objects (the caches, and an account's read preflight).
fn read_grants(rule: &CompiledRule, grants: &mut Grants) {
    grants.allow(rule.parent.group.as_str(), &parent_resource(rule), READ);
    for child in &rule.children {
        grants.allow(&child.gvk.group, &child_resource(child), READ);
    }
    for related in &rule.related {
        let resource = related
            .spec
            .plural
            .clone()
            .unwrap_or_else(|| kinds::plural(&related.gvk));
        grants.allow(&related.gvk.group, &resource, READ);
    }
    for patch in &rule.patches {
        grants.allow(&patch.gvk.group, &child_resource(patch), READ);
    }
}

fn child_resource(child: &CompiledChild) -> String {
    child
        .spec
        .plural
        .clone()
        .unwrap_or_else(|| kinds::plural(&child.gvk))
}

/// What the rule's own writes and reads need: the role of its account, or
/// (without one) part of the operator's. Everything the rule reads, plus
/// the children's verbs under their policies and `bind` for binding
/// children.
fn account_grants(rule: &CompiledRule, grants: &mut Grants) {
    read_grants(rule, grants);
    for child in &rule.children {
        let resource = child_resource(child);
        grants.allow(&child.gvk.group, &resource, &child_verbs(child.spec.policy));
        if child.spec.deletion_policy == crate::rules::model::DeletionPolicy::Retain {
            // Releasing a retained child is one patch of its metadata.
            grants.allow(&child.gvk.group, &resource, &[Patch]);
        }
        if let Some(binding) = BindingKind::of(&child.gvk) {
            let text = rule
                .templates
                .get(&child.spec.id)
                .map(String::as_str)
                .unwrap_or_default();
            bind_grants(binding, &role_refs(text), grants);
        }
    }
    // Patch targets are written with server-side apply carrying their
    // uid: never created, never deleted (read: `read_grants`).
    for patch in &rule.patches {
        grants.allow(&patch.gvk.group, &child_resource(patch), &[Patch]);
    }
}

/// Whether a parent of this rule may ever carry the `trellis.dev/cleanup`
/// finalizer, decided offline and erring towards "yes".
///
/// The planner sets the finalizer when the rule has `deletion:`, or when a
/// child cannot carry an ownerReference to the parent, so that garbage
/// collection would not remove it. Kubernetes allows an owner that is
/// cluster-scoped or in the child's own namespace; so an unowned child exists
/// only under a namespaced parent, for a cluster-scoped child or a child in
/// another namespace — and the planner renders either only with
/// `allowCrossNamespace: true`. Hence the conditions:
///
/// - `deletion:` is set, the rule has `patches:` (released behind the
///   finalizer) or a child has `deletionPolicy: retain` (released likewise);
/// - any child has `allowCrossNamespace: true`, whatever the parent's scope:
///   the parent's scope is only a hint offline (`spec.parent.scope` or the
///   built-in table) and discovery decides when running, so a wrong hint must
///   not leave the operator unable to add its finalizer;
/// - any child is cluster-scoped while the parent is namespaced or of unknown
///   scope (CRDs default to namespaced). The planner rejects such a child
///   without `allowCrossNamespace`, but `check` validates only statically, and
///   granting here keeps the role correct should that rule ever be relaxed.
fn may_need_finalizer(rule: &CompiledRule) -> bool {
    let spec = &rule.rule.spec;
    let in_spokes = rule.children.iter().any(|c| c.cluster.is_some());
    if spec.deletion.is_some() || !rule.patches.is_empty() || rule.retains_children() || in_spokes {
        return true;
    }
    let parent_scope = spec
        .parent
        .scope
        .unwrap_or_else(|| kinds::scope(&rule.parent));
    rule.children.iter().any(|child| {
        child.spec.allow_cross_namespace
            || (parent_scope == Scope::Namespaced && child_scope(child) == Scope::Cluster)
    })
}

fn child_scope(child: &CompiledChild) -> Scope {
    child.spec.scope.unwrap_or_else(|| kinds::scope(&child.gvk))
}

/// Verbs a child kind needs under its policy. Every policy reads (the
/// operator caches children to compute readiness, status and prunes) and
/// deletes (pruning, `onRuleRemoved: delete`, `recreate`).
///
/// - `apply`: server-side apply is a PATCH, which also creates a missing
///   object but is authorized as `create` then.
/// - `createOnly`: creates once and never updates.
/// - `recreate`: applies like `apply`; deletes and creates again when the
///   rendered form changes.
fn child_verbs(policy: Policy) -> Vec<Verb> {
    let mut verbs = READ.to_vec();
    verbs.extend_from_slice(match policy {
        Policy::Apply | Policy::Recreate => &[Create, Patch, Delete],
        Policy::CreateOnly => &[Create, Delete],
    });
    verbs
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_accounts;
