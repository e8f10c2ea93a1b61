//! The rule format `trellis.dev/v1alpha1`, as serde types.
//!
//! These types are the single source of truth: the loader deserializes into
//! them and `trellis schema` derives the format's JSON Schema from them, so the
//! two cannot drift. Semantic checks (names, cycles, expressions) live in
//! `compile`; this module only says what shape a rule has.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A kind's scope is a fact about kinds; the format names it where a rule
/// may state it (`scope:` hints, `crd.scope`).
pub use crate::kinds::Scope;

mod crd;
mod rollout;
mod sharing;
mod versions;

pub use crd::{CelValidation, ColumnType, CrdSpec, PrinterColumn};
pub use rollout::{MaxFailedSpec, OnFailure, RolloutHealth, RolloutSpec, RolloutStep};
pub use sharing::{ForEach, NamedLists, Propagate, ScaleSpec};
pub use versions::VersionSpec;

pub const API_VERSION: &str = "trellis.dev/v1alpha1";
pub const KIND: &str = "Rule";

/// A rule teaches trellis one parent kind: which children to keep for every
/// parent object, and what to write back into the parent's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "trellis Rule (trellis.dev/v1alpha1)")]
pub struct Rule {
    /// Always `trellis.dev/v1alpha1`.
    pub api_version: String,
    /// Always `Rule`.
    pub kind: String,
    pub metadata: RuleMetadata,
    pub spec: RuleSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleMetadata {
    /// DNS-1123 label, unique across the rule set; names the field manager
    /// (`trellis/<name>`) and the `trellis.dev/rule` label.
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleSpec {
    pub parent: ParentSpec,
    /// JSON Schema (2020-12) for the parent's `.spec`, checked after defaults
    /// are applied. Remote `$ref`s are never fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Object deep-merged under the parent's `.spec` before use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<Value>,
    /// When set, trellis generates the parent kind's CustomResourceDefinition
    /// from this rule (`trellis crd`, `trellis run --manage-crds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd: Option<CrdSpec>,
    /// Objects the rule reads but never writes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<RelatedSpec>,
    /// Values computed once per pass, in declaration order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vars: Vec<VarSpec>,
    /// Children, rendered in dependency order.
    #[serde(default)]
    pub children: Vec<ChildSpec>,
    /// Keys of the parent's labels and annotations copied onto every child
    /// (a key the template sets itself wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propagate: Option<Propagate>,
    /// Fields contributed to objects the rule does not own (planned after
    /// the children, never created, released when no longer rendered).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<PatchSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<DeletionSpec>,
    #[serde(default)]
    pub on_rule_removed: OnRuleRemoved,
    /// Periodic re-reconcile of every parent, e.g. `10m`, `1h30m`, `45s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<String>,
    /// A ServiceAccount in the operator's namespace (DNS-1123 subdomain):
    /// every write to the rule's children is sent impersonating it, and the
    /// rule runs only while it may read every kind the rule reads. Applies
    /// to every parent at once (not staged by `rollout:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Staged rollout of a change to this rule: parents move to a new
    /// version in steps, watched for health, rolled back on failure.
    /// Without it a new version reaches every parent at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
    /// Every other served API version of the parent kind (its CRD is
    /// generated: `crd:`), oldest first; the hub is `parent.apiVersion`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<VersionSpec>,
    /// The version parents are stored in (default: the hub's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ParentSpec {
    /// `group/version` (or `v1`) of the watched kind.
    pub api_version: String,
    pub kind: String,
    /// Only parents in these namespaces; default: every namespace the operator watches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Resource (plural) name, when kubectl-style pluralisation of `kind` is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plural: Option<String>,
    /// Scope for offline commands; discovery is authoritative when running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

impl LabelSelector {
    /// The selector as the API server's label selector string
    /// (`tier=web,env in (a,b),!legacy`): for watches, and for messages.
    pub fn query(&self) -> String {
        let mut parts: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for req in &self.match_expressions {
            let values = req.values.join(",");
            parts.push(match req.operator {
                SelectorOperator::In => format!("{} in ({values})", req.key),
                SelectorOperator::NotIn => format!("{} notin ({values})", req.key),
                SelectorOperator::Exists => req.key.clone(),
                SelectorOperator::DoesNotExist => format!("!{}", req.key),
            });
        }
        parts.join(",")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ChildSpec {
    /// `[a-z][a-z0-9-]*`, unique in the rule; the `trellis.dev/child` label.
    pub id: String,
    /// Static `group/version` of the child; a template cannot change it.
    pub api_version: String,
    /// Static kind of the child; a template cannot change it.
    pub kind: String,
    /// minijinja template rendering the object (YAML). Exactly one of
    /// `template` and `templateFile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Template path relative to the rule file; may not leave the rules directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_file: Option<String>,
    /// Child or related ids that must be ready before this child is applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Expression; the child is ready when true (`self` is the observed child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_when: Option<String>,
    #[serde(default)]
    pub policy: Policy,
    /// Expression; when false the child is not rendered and is pruned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_when: Option<String>,
    /// Expression yielding a list: one child per item (`item`, `index`); or
    /// a mapping of names to such expressions: one child per combination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<ForEach>,
    /// Allows a namespace other than the parent's, or a cluster-scoped child
    /// of a namespaced parent. Only rule authors can grant this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_cross_namespace: bool,
    /// Take over an existing object of the rendered name that has no
    /// controller owner. Without it, an object trellis did not create for
    /// this parent is never written. Only rule authors can grant this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopt: bool,
    /// Resource (plural) name, when kubectl-style pluralisation of `kind` is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plural: Option<String>,
    /// Scope for offline commands; discovery is authoritative when running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// `retain`: when the parent goes or the child is no longer rendered,
    /// trellis releases the child (ownerReference, labels and field
    /// ownership removed) instead of deleting it.
    #[serde(default, skip_serializing_if = "DeletionPolicy::is_delete")]
    pub deletion_policy: DeletionPolicy,
    /// Fields (`spec.replicas`, `metadata.annotations["a/b"]`) trellis sets
    /// when it makes the object and stops sending once another field
    /// manager has changed them (an HPA, `kubectl scale`): it never fights
    /// for them, and drift detection ignores them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hand_off: Vec<String>,
    /// Expression naming the cluster the child lives in: a spoke registered
    /// by a Secret labelled `trellis.dev/cluster: <name>`; absent, or
    /// `local`, is the cluster of the parent (the hub).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// What becomes of a child when its parent goes or it is no longer rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DeletionPolicy {
    /// Deleted (default).
    #[default]
    Delete,
    /// Released: kept, with nothing of trellis left on it.
    Retain,
}

impl DeletionPolicy {
    fn is_delete(&self) -> bool {
        *self == DeletionPolicy::Delete
    }
}

/// Fields contributed to an object the rule does not own: sent as
/// server-side apply with the field manager `trellis/<rule>/<parent uid>`,
/// carrying the observed target's uid, so a missing target is never created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PatchSpec {
    /// Same rules as a child id; unique across children, related entries and patches.
    pub id: String,
    /// Static `group/version` of the target.
    pub api_version: String,
    /// Static kind of the target.
    pub kind: String,
    /// minijinja template naming the target and holding only the
    /// contributed fields. Exactly one of `template` and `templateFile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_file: Option<String>,
    /// Child, related or patch ids that must be ready first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Expression; `self` is the observed target. Default: the target
    /// holds the contributed fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_when: Option<String>,
    /// Expression; when false nothing is contributed (and what was, is released).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_when: Option<String>,
    /// Expression yielding a list: one contribution per item (`item`,
    /// `index`); or a mapping of names to such expressions (combinations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<ForEach>,
    /// Allows a target outside a namespaced parent's namespace, or a
    /// cluster-scoped target. Only rule authors can grant this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_cross_namespace: bool,
    /// Take fields another manager owns (a forced apply). Only rule authors
    /// can grant this; without it such a field fails the patch (`PatchConflict`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// Resource (plural) name, when kubectl-style pluralisation of `kind` is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plural: Option<String>,
    /// Scope for offline commands; discovery is authoritative when running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

impl PatchSpec {
    /// The patch as a child spec, so that one compiler and one planner
    /// handle what the two share (templates, includeWhen, forEach,
    /// dependsOn, readyWhen, namespaces).
    pub fn as_child(&self) -> ChildSpec {
        ChildSpec {
            id: self.id.clone(),
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            template: self.template.clone(),
            template_file: self.template_file.clone(),
            depends_on: self.depends_on.clone(),
            ready_when: self.ready_when.clone(),
            policy: Policy::Apply,
            include_when: self.include_when.clone(),
            for_each: self.for_each.clone(),
            allow_cross_namespace: self.allow_cross_namespace,
            adopt: false,
            plural: self.plural.clone(),
            scope: self.scope,
            deletion_policy: DeletionPolicy::Delete,
            hand_off: Vec::new(),
            cluster: None,
        }
    }
}

/// An object (by `name`) or a list of objects (by `selector`) the rule reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelatedSpec {
    /// Same rules as a child id; unique across children and related entries.
    pub id: String,
    /// Static `group/version` of the read kind.
    pub api_version: String,
    pub kind: String,
    /// Template yielding one object name; `related.<id>` is that object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Label selector (values may be templates); `related.<id>` is a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<RelatedSelector>,
    /// Template; default: the parent's namespace. Cluster-scoped kinds take none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A missing object is absent instead of holding back its readers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// Expression; `self` is the related object (the list, for a selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_when: Option<String>,
    /// Allows a namespace other than a namespaced parent's. Only rule authors can grant this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_cross_namespace: bool,
    /// A `selector:` entry reads every namespace.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_namespaces: bool,
    /// Expression naming the cluster read from (as a child's `cluster:`);
    /// absent, or `local`, is the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Resource (plural) name, when kubectl-style pluralisation of `kind` is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plural: Option<String>,
    /// Scope for offline commands; discovery is authoritative when running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

/// A label selector whose parts may be templates.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelatedSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<TemplatedLabels>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<TemplatedExpressions>,
}

/// `matchLabels`: a map whose values are templates, or one template
/// yielding the whole map (e.g. taken from the parent's spec).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum TemplatedLabels {
    Map(BTreeMap<String, String>),
    Template(String),
}

/// `matchExpressions`: requirements whose values are templates, or one
/// template yielding the whole list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum TemplatedExpressions {
    List(Vec<LabelSelectorRequirement>),
    Template(String),
}

/// A value computed once per pass: `value` (an expression) or `template` (YAML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VarSpec {
    /// `[a-zA-Z_][a-zA-Z0-9_]*`, unique; read as `vars.<name>`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// minijinja template rendering YAML (loops allowed); yields the parsed value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Policy {
    /// Server-side apply on every change (default).
    #[default]
    Apply,
    /// Create once; never update.
    CreateOnly,
    /// Delete and recreate when the rendered form changes (immutable fields).
    Recreate,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StatusSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<StatusField>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ConditionSpec>,
    /// Writes `status.children`: one entry per child object, in declaration
    /// order, at most 100 (then `status.childrenTruncated`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inventory: bool,
}

/// One value under the parent's `.status`: either `from` + `jsonPath`, or `value`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StatusField {
    /// Dotted path under `.status`, e.g. `replicas.ready`.
    pub path: String,
    /// Child id the JSONPath reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// RFC 9535 JSONPath on the observed child (a list of items for `forEach` children).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_path: Option<String>,
    /// Expression; alternative to `from` + `jsonPath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Used when a singular JSONPath yields nothing (e.g. the child does not
    /// exist or has no status yet); any other query always yields a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConditionSpec {
    /// Condition type, e.g. `Serving`. `Ready` and `Synced` are trellis's own.
    /// With `forEach`, a template evaluated per item (`{{ item.name }}Ready`).
    #[serde(rename = "type")]
    pub type_: String,
    /// One condition per item (or combination), as a child's `forEach`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<ForEach>,
    /// Expression; the condition is True when it is true.
    pub when: String,
    /// CamelCase reason when True; `Not<reason>` when False.
    pub reason: String,
    /// Plain-text template for the condition's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeletionSpec {
    pub order: DeletionOrder,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DeletionOrder {
    /// Delete children in reverse dependency order behind a finalizer.
    Reverse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnRuleRemoved {
    /// Leave children in place and release trellis's finalizers (default).
    #[default]
    Orphan,
    /// Delete the children trellis created.
    Delete,
}

/// JSON Schema of the rule format, generated from the types above.
pub fn json_schema() -> Value {
    let schema = schemars::schema_for!(Rule);
    serde_json::to_value(schema).unwrap_or(Value::Null)
}
