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
//! | `clusterroles` / `roles` referenced by binding children | bind | creating a binding to a role the operator does not hold |
//! | events (core, `events.k8s.io`) | create, patch | Events on parents |
//! | `coordination.k8s.io` leases | get, create, update | leader election |
//! | `apiextensions.k8s.io` CRDs | get, list, watch | noticing parent CRDs being installed |
//! | `authorization.k8s.io` selfsubjectaccessreviews | create | the startup preflight |

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

/// Builds the ClusterRole for `set`: see the module documentation for what
/// is granted and why.
pub fn cluster_role(set: &RuleSet, name: &str) -> Value {
    let mut grants = Grants::default();
    operator_grants(&mut grants);
    for rule in &set.rules {
        rule_grants(rule, &mut grants);
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "trellis"},
            "annotations": {"trellis.dev/generated-by": "trellis rbac"},
        },
        "rules": grants.into_rules(),
    })
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

/// Every permission one rule needs (the rule's share of [`cluster_role`]).
pub fn rule_permissions(rule: &CompiledRule) -> Vec<Permission> {
    let mut grants = Grants::default();
    rule_grants(rule, &mut grants);
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
    // Leader election with a Lease.
    grants.allow("coordination.k8s.io", "leases", &[Get, Create, Update]);
    // A rule whose parent CRD is not installed yet starts once it appears.
    grants.allow("apiextensions.k8s.io", "customresourcedefinitions", READ);
    // The startup preflight asks the API server what the operator may do.
    grants.allow(
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        &[Create],
    );
}

fn rule_grants(rule: &CompiledRule, grants: &mut Grants) {
    let parent = &rule.rule.spec.parent;
    let group = rule.parent.group.as_str();
    let resource = parent
        .plural
        .clone()
        .unwrap_or_else(|| kinds::plural(&rule.parent));
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
    for child in &rule.children {
        let resource = child
            .spec
            .plural
            .clone()
            .unwrap_or_else(|| kinds::plural(&child.gvk));
        grants.allow(&child.gvk.group, &resource, &child_verbs(child.spec.policy));
        if let Some(binding) = BindingKind::of(&child.gvk) {
            let text = rule
                .templates
                .get(&child.spec.id)
                .map(String::as_str)
                .unwrap_or_default();
            bind_grants(binding, &role_refs(text), grants);
        }
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
/// - `deletion:` is set;
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
    if spec.deletion.is_some() {
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
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::rules::load_dir;

    fn load(dir: &Path) -> RuleSet {
        load_dir(dir).unwrap_or_else(|diags| {
            panic!(
                "rule set rejected:\n{}",
                diags
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
    }

    /// The ClusterRole for one rule file's text.
    fn role_for(rule: &str) -> Value {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("rule.yaml"), rule).unwrap();
        cluster_role(&load(dir.path()), "trellis")
    }

    fn fixture(case: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/rbac")
            .join(case)
    }

    /// Verbs granted on every object of (group, resource); empty when none.
    fn verbs(role: &Value, group: &str, resource: &str) -> Vec<String> {
        let rules: Vec<&Value> = unrestricted(role)
            .filter(|r| r["apiGroups"] == json!([group]) && r["resources"] == json!([resource]))
            .collect();
        assert!(
            rules.len() <= 1,
            "{group}/{resource} is granted by several rules: {rules:?}"
        );
        rules
            .first()
            .map(|r| serde_json::from_value(r["verbs"].clone()).unwrap())
            .unwrap_or_default()
    }

    fn unrestricted(role: &Value) -> impl Iterator<Item = &Value> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.get("resourceNames").is_none())
    }

    /// `resourceNames` of the rules granting only `verb` on (group, resource).
    fn named(role: &Value, group: &str, resource: &str, verb: &str) -> Vec<Vec<String>> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["apiGroups"] == json!([group])
                    && r["resources"] == json!([resource])
                    && r["verbs"] == json!([verb])
            })
            .filter_map(|r| r.get("resourceNames"))
            .map(|n| serde_json::from_value(n.clone()).unwrap())
            .collect()
    }

    const WEBAPP: &str = r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {name: webapp}
spec:
  parent: {apiVersion: demo.trellis.dev/v1, kind: WebApp}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
"#;

    fn rule_with_children(parent: &str, children: &str) -> String {
        format!(
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata: {{name: r}}\nspec:\n  parent: {parent}\n  children:\n{children}"
        )
    }

    /// One RoleBinding child of a cluster-scoped CRD parent, with `role_ref`
    /// (already indented for the template) as its roleRef part.
    fn binding_rule(kind: &str, role_ref: &str) -> String {
        let template: String = format!(
            "metadata:\n  name: b\n  namespace: {{{{ spec.ns }}}}\n{role_ref}subjects: {{{{ spec.subjects }}}}\n"
        )
        .lines()
        .map(|l| format!("        {l}\n"))
        .collect();
        rule_with_children(
            "{apiVersion: demo.trellis.dev/v1, kind: Team, scope: Cluster}",
            &format!(
                "    - id: b\n      apiVersion: rbac.authorization.k8s.io/v1\n      kind: {kind}\n      template: |\n{template}"
            ),
        )
    }

    #[test]
    fn grants_status_patch_only_for_crd_parents() {
        let crd = role_for(WEBAPP);
        assert_eq!(
            verbs(&crd, "demo.trellis.dev", "webapps"),
            ["get", "list", "watch"]
        );
        assert_eq!(verbs(&crd, "demo.trellis.dev", "webapps/status"), ["patch"]);

        let decorator = role_for(&rule_with_children(
            "{apiVersion: apps/v1, kind: Deployment}",
            "    - id: svc\n      apiVersion: v1\n      kind: Service\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n",
        ));
        assert_eq!(
            verbs(&decorator, "apps", "deployments"),
            ["get", "list", "watch"]
        );
        assert!(verbs(&decorator, "apps", "deployments/status").is_empty());
        assert!(
            !serde_json::to_string(&decorator)
                .unwrap()
                .contains("/status"),
            "a built-in parent gets no status writes"
        );
    }

    #[test]
    fn uses_plural_overrides_for_parent_and_children() {
        let role = role_for(&rule_with_children(
            "{apiVersion: demo.trellis.dev/v1, kind: Octopus, plural: octopodes}",
            "    - id: c\n      apiVersion: demo.trellis.dev/v1\n      kind: Cactus\n      plural: cacti\n      template: |\n        metadata:\n          name: x\n",
        ));
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "octopodes"),
            ["get", "list", "watch"]
        );
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "octopodes/status"),
            ["patch"]
        );
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "cacti"),
            ["get", "list", "watch", "create", "patch", "delete"]
        );
        assert!(verbs(&role, "demo.trellis.dev", "octopuses").is_empty());
    }

    #[test]
    fn grants_child_verbs_per_policy() {
        let child = |id: &str, kind: &str, policy: &str| {
            format!(
                "    - id: {id}\n      apiVersion: v1\n      kind: {kind}\n      policy: {policy}\n      template: |\n        metadata:\n          name: {id}\n"
            )
        };
        let role = role_for(&rule_with_children(
            "{apiVersion: demo.trellis.dev/v1, kind: App}",
            &[
                child("a", "ConfigMap", "apply"),
                child("b", "Secret", "createOnly"),
                child("c", "Service", "recreate"),
            ]
            .concat(),
        ));
        assert_eq!(
            verbs(&role, "", "configmaps"),
            ["get", "list", "watch", "create", "patch", "delete"]
        );
        assert_eq!(
            verbs(&role, "", "secrets"),
            ["get", "list", "watch", "create", "delete"]
        );
        assert_eq!(
            verbs(&role, "", "services"),
            ["get", "list", "watch", "create", "patch", "delete"]
        );
    }

    #[test]
    fn merges_verbs_of_every_rule_on_one_resource() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.yaml"), WEBAPP).unwrap();
        // A second rule makes the same kind createOnly and lists an event kind
        // the operator already needs: one PolicyRule each, verbs unioned.
        fs::write(
            dir.path().join("b.yaml"),
            rule_with_children(
                "{apiVersion: demo.trellis.dev/v1, kind: Other}",
                "    - id: c\n      apiVersion: v1\n      kind: ConfigMap\n      policy: createOnly\n      template: |\n        metadata:\n          name: c\n    - id: e\n      apiVersion: v1\n      kind: Event\n      template: |\n        metadata:\n          name: e\n",
            ),
        )
        .unwrap();
        let role = cluster_role(&load(dir.path()), "trellis");
        assert_eq!(
            verbs(&role, "", "configmaps"),
            ["get", "list", "watch", "create", "patch", "delete"]
        );
        assert_eq!(
            verbs(&role, "", "events"),
            ["get", "list", "watch", "create", "patch", "delete"]
        );
        let mut seen = BTreeSet::new();
        for rule in unrestricted(&role) {
            let key = (rule["apiGroups"].to_string(), rule["resources"].to_string());
            assert!(seen.insert(key.clone()), "{key:?} appears twice");
        }
    }

    #[test]
    fn grants_what_the_operator_itself_needs() {
        let role = role_for(WEBAPP);
        assert_eq!(verbs(&role, "", "events"), ["create", "patch"]);
        assert_eq!(verbs(&role, "events.k8s.io", "events"), ["create", "patch"]);
        assert_eq!(
            verbs(&role, "coordination.k8s.io", "leases"),
            ["get", "create", "update"]
        );
        assert_eq!(
            verbs(&role, "apiextensions.k8s.io", "customresourcedefinitions"),
            ["get", "list", "watch"]
        );
        assert_eq!(
            verbs(&role, "authorization.k8s.io", "selfsubjectaccessreviews"),
            ["create"]
        );

        let empty = cluster_role(&RuleSet::default(), "x");
        assert_eq!(empty["rules"].as_array().unwrap().len(), 5);
    }

    #[test]
    fn labels_and_annotates_the_cluster_role() {
        let role = role_for(WEBAPP);
        assert_eq!(role["apiVersion"], "rbac.authorization.k8s.io/v1");
        assert_eq!(role["kind"], "ClusterRole");
        assert_eq!(role["metadata"]["name"], "trellis");
        assert_eq!(
            role["metadata"]["labels"],
            json!({"app.kubernetes.io/name": "trellis"})
        );
        assert_eq!(
            role["metadata"]["annotations"],
            json!({"trellis.dev/generated-by": "trellis rbac"})
        );
    }

    #[test]
    fn no_finalizer_verbs_when_every_child_is_owned() {
        let role = role_for(WEBAPP);
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "webapps"),
            ["get", "list", "watch"]
        );
    }

    #[test]
    fn grants_finalizer_verbs_on_parent_when_deletion_is_ordered() {
        let role = role_for(&format!("{WEBAPP}  deletion: {{order: reverse}}\n"));
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "webapps"),
            ["get", "list", "watch", "update", "patch"]
        );
    }

    #[test]
    fn grants_finalizer_verbs_for_cluster_scoped_child_of_namespaced_parent() {
        let role = role_for(&rule_with_children(
            "{apiVersion: demo.trellis.dev/v1, kind: Project}",
            "    - id: ns\n      apiVersion: v1\n      kind: Namespace\n      allowCrossNamespace: true\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n",
        ));
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "projects"),
            ["get", "list", "watch", "update", "patch"]
        );
        assert_eq!(
            verbs(&role, "", "namespaces"),
            ["get", "list", "watch", "create", "patch", "delete"]
        );
    }

    #[test]
    fn finalizer_verbs_follow_child_scope_override_without_cross_namespace() {
        // Without allowCrossNamespace the planner rejects this child, but the
        // role stays conservative: a cluster-scoped child (here by override)
        // of a parent of unknown scope may be unowned.
        let role = role_for(&rule_with_children(
            "{apiVersion: demo.trellis.dev/v1, kind: Project}",
            "    - id: g\n      apiVersion: demo.trellis.dev/v1\n      kind: Global\n      scope: Cluster\n      template: |\n        metadata:\n          name: g\n",
        ));
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "projects"),
            ["get", "list", "watch", "update", "patch"]
        );
    }

    #[test]
    fn no_finalizer_verbs_for_cluster_scoped_child_of_cluster_scoped_parent() {
        let role = role_for(&rule_with_children(
            "{apiVersion: demo.trellis.dev/v1, kind: Tenant, scope: Cluster}",
            "    - id: ns\n      apiVersion: v1\n      kind: Namespace\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n",
        ));
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "tenants"),
            ["get", "list", "watch"]
        );
    }

    #[test]
    fn grants_finalizer_verbs_for_cross_namespace_child_whatever_the_parent_scope() {
        for scope in ["", ", scope: Cluster"] {
            let role = role_for(&rule_with_children(
                &format!("{{apiVersion: demo.trellis.dev/v1, kind: Tenant{scope}}}"),
                "    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      allowCrossNamespace: true\n      template: |\n        metadata:\n          name: x\n          namespace: shared\n",
            ));
            assert_eq!(
                verbs(&role, "demo.trellis.dev", "tenants"),
                ["get", "list", "watch", "update", "patch"],
                "parent{scope}"
            );
        }
    }

    #[test]
    fn static_cluster_role_ref_grants_bind_with_resource_names() {
        let role = cluster_role(&load(&fixture("tenant")), "trellis");
        assert_eq!(
            named(&role, RBAC_GROUP, "clusterroles", "bind"),
            [["admin"]]
        );
        assert!(verbs(&role, RBAC_GROUP, "clusterroles").is_empty());
        assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
        assert!(named(&role, RBAC_GROUP, "roles", "bind").is_empty());
    }

    #[test]
    fn static_role_ref_to_a_role_grants_bind_on_roles_by_name() {
        let role = role_for(&binding_rule(
            "RoleBinding",
            "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: \"Role\"  # local\n  name: 'deployer'\n",
        ));
        assert_eq!(named(&role, RBAC_GROUP, "roles", "bind"), [["deployer"]]);
        assert!(named(&role, RBAC_GROUP, "clusterroles", "bind").is_empty());
        assert!(verbs(&role, RBAC_GROUP, "clusterroles").is_empty());
    }

    #[test]
    fn templated_role_ref_name_grants_bind_without_resource_names() {
        let role = role_for(&binding_rule(
            "RoleBinding",
            "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {{ spec.role }}\n",
        ));
        assert_eq!(verbs(&role, RBAC_GROUP, "clusterroles"), ["bind"]);
        assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
        assert!(named(&role, RBAC_GROUP, "clusterroles", "bind").is_empty());
    }

    #[test]
    fn templated_role_ref_kind_grants_bind_on_both_role_kinds_by_name() {
        let role = role_for(&binding_rule(
            "RoleBinding",
            "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: {{ spec.kind }}\n  name: view\n",
        ));
        assert_eq!(named(&role, RBAC_GROUP, "clusterroles", "bind"), [["view"]]);
        assert_eq!(named(&role, RBAC_GROUP, "roles", "bind"), [["view"]]);
    }

    #[test]
    fn unreadable_role_ref_grants_bind_on_every_role_the_binding_can_reference() {
        for role_ref in [
            "roleRef: {{ spec.roleRef }}\n",
            "roleRef:\n{% if spec.admin %}\n  kind: ClusterRole\n  name: admin\n{% endif %}\n",
            "roleRef:\n  kind: ClusterRole\n  {% if spec.admin %}name: admin{% else %}name: view{% endif %}\n",
        ] {
            let role = role_for(&binding_rule("RoleBinding", role_ref));
            assert_eq!(
                verbs(&role, RBAC_GROUP, "clusterroles"),
                ["bind"],
                "{role_ref}"
            );
            assert_eq!(verbs(&role, RBAC_GROUP, "roles"), ["bind"], "{role_ref}");
        }
        // A ClusterRoleBinding can only reference a ClusterRole.
        let role = role_for(&binding_rule(
            "ClusterRoleBinding",
            "roleRef: {{ spec.roleRef }}\n",
        ));
        assert_eq!(verbs(&role, RBAC_GROUP, "clusterroles"), ["bind"]);
        assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
    }

    #[test]
    fn reads_flow_style_role_refs() {
        let role = role_for(&binding_rule(
            "ClusterRoleBinding",
            "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: \"view\"}\n",
        ));
        assert_eq!(named(&role, RBAC_GROUP, "clusterroles", "bind"), [["view"]]);
        assert!(verbs(&role, RBAC_GROUP, "clusterroles").is_empty());

        let role = role_for(&binding_rule(
            "RoleBinding",
            "roleRef: {kind: ClusterRole,\n  name: {{ spec.prefix ~ \"-, x\" }}}\n",
        ));
        assert_eq!(verbs(&role, RBAC_GROUP, "clusterroles"), ["bind"]);
        assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
    }

    #[test]
    fn role_refs_in_alternative_branches_are_all_bound_by_name() {
        let role = role_for(&binding_rule(
            "RoleBinding",
            "{% if spec.admin %}\nroleRef:\n  kind: ClusterRole\n  name: admin\n{% else %}\nroleRef:\n  kind: ClusterRole\n  name: view\n{% endif %}\n",
        ));
        assert_eq!(
            named(&role, RBAC_GROUP, "clusterroles", "bind"),
            [["admin", "view"]]
        );
        assert!(verbs(&role, RBAC_GROUP, "clusterroles").is_empty());
        assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
    }

    #[test]
    fn unrestricted_bind_supersedes_bind_by_name() {
        let mut grants = Grants::default();
        bind_grants(
            BindingKind::RoleBinding,
            &[
                RoleRef {
                    kind: Some("ClusterRole".into()),
                    name: Some("view".into()),
                },
                RoleRef {
                    kind: Some("ClusterRole".into()),
                    name: None,
                },
            ],
            &mut grants,
        );
        assert_eq!(
            grants.into_rules(),
            [json!({"apiGroups": [RBAC_GROUP], "resources": ["clusterroles"], "verbs": ["bind"]})]
        );
    }

    #[test]
    fn never_grants_wildcards() {
        for case in ["tenant", "webapp"] {
            let role = cluster_role(&load(&fixture(case)), "trellis");
            for rule in role["rules"].as_array().unwrap() {
                for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                    for value in rule
                        .get(field)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        assert!(
                            !value.as_str().unwrap().contains('*'),
                            "{case}: wildcard in {rule}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn output_is_sorted_and_stable() {
        let role = cluster_role(&load(&fixture("webapp")), "trellis");
        let keys: Vec<(String, String, bool)> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["apiGroups"][0].as_str().unwrap().to_owned(),
                    r["resources"][0].as_str().unwrap().to_owned(),
                    r.get("resourceNames").is_some(),
                )
            })
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        for rule in role["rules"].as_array().unwrap() {
            let verbs: Vec<&str> = rule["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            let order = [
                "get", "list", "watch", "create", "update", "patch", "delete", "bind",
            ];
            let positions: Vec<usize> = verbs
                .iter()
                .map(|v| order.iter().position(|o| o == v).unwrap())
                .collect();
            assert!(
                positions.windows(2).all(|w| w[0] < w[1]),
                "verbs out of order: {rule}"
            );
        }
        assert_eq!(role, cluster_role(&load(&fixture("webapp")), "trellis"));
    }

    /// Compares with `tests/fixtures/rbac/<case>/expected.json`; run with
    /// `TRELLIS_BLESS=1` to rewrite the golden files after a deliberate change.
    #[test]
    fn matches_golden_files() {
        for case in ["tenant", "webapp"] {
            let role = cluster_role(&load(&fixture(case)), "trellis");
            let path = fixture(case).join("expected.json");
            let actual = serde_json::to_string_pretty(&role).unwrap() + "\n";
            if std::env::var_os("TRELLIS_BLESS").is_some() {
                fs::write(&path, &actual).unwrap();
            }
            let expected = fs::read_to_string(&path).unwrap_or_default();
            assert!(
                expected == actual,
                "{case}: ClusterRole differs from {}:\n{actual}",
                path.display()
            );
        }
    }
}
