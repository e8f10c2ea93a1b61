//! The least-privilege ClusterRole a rule set needs (`trellis rbac`).
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
//! | each child kind | get, list, watch + per policy | children are cached; see [`child_verbs`] |
//! | each related kind | get, list, watch | related objects are read from watch-backed caches |
//! | each patch target kind | get, list, watch, patch | targets are cached, contributed to by server-side apply; never created or deleted |
//! | `clusterroles` / `roles` referenced by binding children | bind | creating a binding to a role the operator does not hold |
//! | events (core, `events.k8s.io`) | create, patch | Events on parents |
//! | `coordination.k8s.io` leases | get, list, watch, create, update, patch | leader election (the Lease is patched, and watched so a release is seen at once) |
//! | `apiextensions.k8s.io` CRDs | get, list, watch | noticing parent CRDs being installed |
//! | the same, by name (`--manage-crds`) | create, patch | applying the CRDs generated from rules |
//! | `authorization.k8s.io` selfsubjectaccessreviews | create | the startup preflight |
//! | `configmaps` (when a rule has `rollout:`) | get, list, create, patch, delete | the revision ConfigMaps of staged rollouts, in the operator's namespace (a Role there is enough) |
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

use crate::kinds::{self, Gvk};
use crate::rules::model::{Policy, Scope};
use crate::rules::{CompiledChild, CompiledRule, RuleSet};

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

/// Every ClusterRole `set` needs (`trellis rbac`): the operator's own,
/// named `name`, first; then, for each rule with `serviceAccountName`, in
/// rule order, the role to bind to its account, named `<name>-rule-<rule>`.
/// A set without accounts needs only the operator's role.
pub fn cluster_roles(set: &RuleSet, name: &str, manage_crds: bool) -> Vec<Value> {
    let mut roles = vec![cluster_role_with(set, name, manage_crds)];
    for rule in &set.rules {
        if rule.rule.spec.service_account_name.is_some() {
            let mut grants = Grants::default();
            account_grants(rule, &mut grants);
            roles.push(role_object(
                &account_role_name(name, &rule.name),
                grants,
                Some(&rule.name),
            ));
        }
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
    let mut grants = Grants::default();
    operator_grants(&mut grants);
    for rule in &set.rules {
        operator_rule_grants(rule, &mut grants);
        if rule.rollout.is_some() {
            // Revision ConfigMaps (`rollout:`): read back, applied, pruned.
            grants.allow("", "configmaps", &[Get, List, Create, Patch, Delete]);
        }
        if manage_crds && rule.crd.is_some() {
            let crd = crate::crd::name(&rule.rule);
            for verb in [Get, Create, Patch] {
                grants.allow_named(
                    "apiextensions.k8s.io",
                    "customresourcedefinitions",
                    verb,
                    &crd,
                );
            }
        }
    }
    role_object(name, grants, None)
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
    // Leader election with a Lease: patched to take, renew and release it,
    // watched so that a standby sees a release at once.
    grants.allow(
        "coordination.k8s.io",
        "leases",
        &[Get, List, Watch, Create, Update, Patch],
    );
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
    if spec.deletion.is_some() || !rule.patches.is_empty() || rule.retains_children() {
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

/// A child kind that binds a role, which the API server allows only to
/// holders of every permission in the role or of `bind` on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BindingKind {
    RoleBinding,
    ClusterRoleBinding,
}

impl BindingKind {
    fn of(gvk: &Gvk) -> Option<BindingKind> {
        match (gvk.group.as_str(), gvk.kind.as_str()) {
            (RBAC_GROUP, "RoleBinding") => Some(BindingKind::RoleBinding),
            (RBAC_GROUP, "ClusterRoleBinding") => Some(BindingKind::ClusterRoleBinding),
            _ => None,
        }
    }
}

/// A `roleRef` found in a template; `None` where the value is templated or
/// cannot be read statically.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RoleRef {
    kind: Option<String>,
    name: Option<String>,
}

impl RoleRef {
    const UNKNOWN: RoleRef = RoleRef {
        kind: None,
        name: None,
    };
}

/// `bind` on the roles a binding child may reference: limited by
/// `resourceNames` when the name is static, on every role of the kind
/// otherwise. A ClusterRoleBinding can only reference a ClusterRole; a static
/// kind that is neither Role nor ClusterRole gets nothing (the API server
/// rejects such a binding anyway).
fn bind_grants(binding: BindingKind, refs: &[RoleRef], grants: &mut Grants) {
    for role_ref in refs {
        let resources: &[&str] = match role_ref.kind.as_deref() {
            Some("ClusterRole") => &["clusterroles"],
            Some("Role") if binding == BindingKind::RoleBinding => &["roles"],
            Some(_) => &[],
            None if binding == BindingKind::RoleBinding => &["clusterroles", "roles"],
            None => &["clusterroles"],
        };
        for resource in resources {
            match &role_ref.name {
                Some(name) => grants.allow_named(RBAC_GROUP, resource, Bind, name),
                None => grants.allow(RBAC_GROUP, resource, &[Bind]),
            }
        }
    }
}

/// Every `roleRef` a binding template may render, read from its text.
///
/// A `roleRef:` line starts a block of more-indented lines whose `kind:` and
/// `name:` are static when they hold no `{{`/`{%` and the block holds no
/// `{%`; a flow mapping `roleRef: {kind: ClusterRole, name: view}` is read the
/// same way. Every occurrence counts, so `{% if %}` branches around whole
/// `roleRef:` blocks each contribute their role. When the text mentions
/// `roleRef` in a way not read here (inside an expression, say), or not at
/// all, an unknown reference is added so the role stays sufficient.
fn role_refs(template: &str) -> Vec<RoleRef> {
    let lines: Vec<&str> = template.lines().collect();
    let mut refs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let Some(rest) = trimmed.strip_prefix("roleRef:") else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        let rest = strip_comment(rest).trim();
        refs.push(if rest.is_empty() {
            block_role_ref(&lines[i + 1..], indent)
        } else if rest.starts_with('{') && !rest.starts_with("{{") && !rest.starts_with("{%") {
            flow_role_ref(&lines[i..], rest)
        } else {
            RoleRef::UNKNOWN
        });
    }
    if template.matches("roleRef").count() > refs.len() {
        refs.push(RoleRef::UNKNOWN);
    }
    refs
}

/// A block-style `roleRef` body: the lines after `roleRef:` indented deeper
/// than `indent` (blank and comment lines do not end it).
fn block_role_ref(after: &[&str], indent: usize) -> RoleRef {
    let mut body = Vec::new();
    for line in after {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if line.len() - trimmed.len() <= indent {
            break;
        }
        body.push(*line);
    }
    if body.is_empty() || body.iter().any(|l| l.contains("{%")) {
        return RoleRef::UNKNOWN;
    }
    // Only the block's own keys, not those of anything nested deeper.
    let key_indent = body
        .iter()
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut role_ref = RoleRef::UNKNOWN;
    for line in body
        .iter()
        .filter(|l| l.len() - l.trim_start().len() == key_indent)
    {
        if let Some((key, value)) = line.trim().split_once(':') {
            match key.trim() {
                "kind" => role_ref.kind = static_scalar(value),
                "name" => role_ref.name = static_scalar(value),
                _ => {}
            }
        }
    }
    role_ref
}

/// A flow-style `roleRef: {kind: ..., name: ...}`, possibly spanning lines
/// (`from[0]` is the `roleRef:` line, `rest` what follows the key on it).
fn flow_role_ref(from: &[&str], rest: &str) -> RoleRef {
    let mut text = rest.to_owned();
    for line in &from[1..] {
        if balanced_end(&text).is_some() {
            break;
        }
        text.push(' ');
        text.push_str(strip_comment(line).trim());
    }
    let Some(end) = balanced_end(&text) else {
        return RoleRef::UNKNOWN;
    };
    let inner = &text[1..end];
    if inner.contains("{%") {
        return RoleRef::UNKNOWN;
    }
    let mut role_ref = RoleRef::UNKNOWN;
    for entry in split_top_level(inner) {
        if let Some((key, value)) = entry.split_once(':') {
            match unquote(key.trim()) {
                "kind" => role_ref.kind = static_scalar(value),
                "name" => role_ref.name = static_scalar(value),
                _ => {}
            }
        }
    }
    role_ref
}

/// Byte index of the brace closing the `{` that starts `text`, if any.
fn balanced_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote = None;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits a flow mapping's inside at commas outside nested braces, brackets
/// and quotes (so `{{ a ~ ", " ~ b }}` stays one value).
fn split_top_level(inner: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut quote, mut start) = (0usize, None, 0);
    for (i, c) in inner.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => depth = depth.saturating_sub(1),
            (None, ',') if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
}

/// A plain or quoted scalar with no template syntax in it; `None` otherwise.
fn static_scalar(value: &str) -> Option<String> {
    let value = unquote(strip_comment(value).trim());
    let templated = value.contains("{{") || value.contains("{%");
    let structured = value.starts_with(['{', '[', '&', '*', '|', '>']);
    (!value.is_empty() && !templated && !structured).then(|| value.to_owned())
}

fn unquote(s: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

/// Drops a YAML comment (` #` outside quotes) from the end of a line.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if prev.is_whitespace() => return &line[..i],
            _ => {}
        }
        prev = c;
    }
    line
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_accounts;
