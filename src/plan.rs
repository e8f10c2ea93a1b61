//! The pure core: (rule, parent, observed objects) → [`Plan`].
//!
//! ```text
//!  parent ──defaults──▶ effective spec ──schema──▶ (InvalidSpec: stop, touch nothing)
//!     │
//!     ▼ for each child in dependency order
//!  includeWhen? ── no ──▶ excluded (its observed objects are pruned; from
//!                         here on `children.<id>` reads as never created)
//!  deps ready?  ── no ──▶ pending (held back; existing objects kept)
//!  forEach items ─▶ render ─▶ YAML ─▶ enforce kind/name/namespace/labels/owner ─▶ apply
//!     │
//!     ▼
//!  readiness + status ─▶ prune set (only when the pass, status included,
//!                        had no error)
//! ```
//!
//! Nothing here performs I/O or reads the clock: the caller passes `now`, and
//! the operator and `trellis render` get the very same answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use minijinja::context;
use minijinja::value::ValueKind;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::kinds::Gvk;
use crate::render::{self, RenderError};
use crate::rules::model::{Policy, Scope, SelectorOperator};
use crate::rules::{CompiledChild, CompiledRule};
use crate::yaml;

pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_RULE: &str = "trellis.dev/rule";
pub const LABEL_CHILD: &str = "trellis.dev/child";
pub const LABEL_PARENT_UID: &str = "trellis.dev/parent-uid";
pub const MANAGED_BY: &str = "trellis";
/// On `recreate` children: the hash of the rendering the object came from.
pub const ANNOTATION_RENDER_HASH: &str = "trellis.dev/render-hash";
/// Used when an offline parent file has no `metadata.uid`.
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";
/// Most items one `forEach` may yield.
pub const MAX_FOR_EACH_ITEMS: usize = 1_000;

/// Identity of an object regardless of the API version it is read at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    /// Key of an object value; `None` without kind or name.
    pub fn of(obj: &Value) -> Option<ObjectKey> {
        let gvk = Gvk::new(obj.get("apiVersion")?.as_str()?, obj.get("kind")?.as_str()?);
        Some(ObjectKey {
            group: gvk.group,
            kind: gvk.kind,
            namespace: obj
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_owned),
            name: obj.pointer("/metadata/name")?.as_str()?.to_owned(),
        })
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " {ns}/{}", self.name),
            None => write!(f, " {}", self.name),
        }
    }
}

/// What the cluster holds that this parent's plan may read: every object
/// trellis manages for it (found through the `trellis.dev/*` labels), and
/// where `related:` entries are looked up.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub objects: BTreeMap<ObjectKey, Value>,
    /// Where related objects come from. `None` (offline): from `objects`,
    /// which then hold them next to the children.
    pub related: Option<Arc<dyn RelatedSource>>,
}

/// A store of related objects the planner asks per read, so that only what
/// a read names or selects is handed over, never a whole cache (the
/// operator's watch caches implement it).
pub trait RelatedSource: Send + Sync {
    /// The objects of `gvk` that `read` covers: the one it names (or none),
    /// or every one its selector matches, in any order; or why the source
    /// cannot tell (outside what it watches, an object it cannot decode).
    fn find(&self, gvk: &Gvk, read: &RelatedRead) -> Result<Vec<(ObjectKey, Value)>, Unreadable>;

    /// Whether `gvk` is served at all. Asked before anything else of an
    /// entry, since an unserved kind's scope is unknown.
    fn served(&self, _gvk: &Gvk) -> Result<(), Unreadable> {
        Ok(())
    }
}

impl std::fmt::Debug for dyn RelatedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelatedSource")
    }
}

impl Observed {
    pub fn from_objects(objects: impl IntoIterator<Item = Value>) -> Observed {
        Observed {
            objects: objects
                .into_iter()
                .filter_map(|o| ObjectKey::of(&o).map(|k| (k, o)))
                .collect(),
            related: None,
        }
    }

    /// The same children, with related objects read from `source`.
    pub fn with_related(mut self, source: Arc<dyn RelatedSource>) -> Observed {
        self.related = Some(source);
        self
    }

    /// Observed children of `rule` for the parent with `uid`, by child id.
    fn children_of(&self, rule: &str, uid: &str) -> BTreeMap<String, Vec<(&ObjectKey, &Value)>> {
        let mut by_id: BTreeMap<String, Vec<(&ObjectKey, &Value)>> = BTreeMap::new();
        for (key, obj) in &self.objects {
            let label = |name: &str| {
                obj.pointer("/metadata/labels")
                    .and_then(|l| l.get(name))
                    .and_then(Value::as_str)
            };
            if label(LABEL_RULE) == Some(rule)
                && label(LABEL_PARENT_UID).is_none_or(|u| u == uid)
                && let Some(id) = label(LABEL_CHILD)
            {
                by_id.entry(id.to_owned()).or_default().push((key, obj));
            }
        }
        by_id
    }
}

/// How the caller learns whether a kind is namespaced (discovery when running,
/// the built-in table offline).
pub type ScopeOf<'a> = &'a dyn Fn(&Gvk) -> Scope;

/// One child object to apply.
#[derive(Debug, Clone, Serialize)]
pub struct Apply {
    pub id: String,
    pub policy: Policy,
    pub key: ObjectKey,
    /// The object exactly as it will be sent (server-side apply body).
    pub object: Value,
    /// Whether it carries an ownerReference to the parent.
    pub owned: bool,
    /// SHA-256 of the rendered object (before the hash annotation is added):
    /// the operator skips unchanged applies and `recreate` compares it.
    pub hash: String,
}

/// An observed child to delete.
#[derive(Debug, Clone, Serialize)]
pub struct Delete {
    pub id: String,
    pub key: ObjectKey,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    pub api_version: String,
}

/// A child held back by a dependency (explicit or implicit).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Pending {
    pub id: String,
    /// Why: a sentence for a child dependency; `RelatedNotFound` /
    /// `RelatedNotReady` for a related entry, with `message` saying which.
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Pending {
    /// The reason and message as one line.
    pub fn describe(&self) -> String {
        match &self.message {
            Some(m) => format!("{}: {m}", self.reason),
            None => self.reason.clone(),
        }
    }
}

/// Everything one reconcile pass must do for one parent.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub apply: Vec<Apply>,
    pub delete: Vec<Delete>,
    pub pending: Vec<Pending>,
    /// The parent's new `.status` (only the fields trellis owns, plus foreign
    /// conditions kept); `None` for built-in parent kinds.
    pub status: Option<Value>,
    /// What failed in this pass; non-empty means nothing was pruned.
    pub errors: Vec<String>,
    /// `Synced` reason when the pass failed (`InvalidSpec`, `RenderError`, …).
    pub failure_reason: Option<&'static str>,
    /// Children without ownerReference, or `deletion.order: reverse`: the
    /// parent needs the cleanup finalizer.
    pub needs_finalizer: bool,
    /// What the rule's `related:` entries read in this pass.
    pub reads: Vec<RelatedRead>,
}

/// Inputs of [`plan`] besides the rule.
pub struct Input<'a> {
    pub parent: &'a Value,
    pub observed: &'a Observed,
    /// RFC 3339 timestamp used for new condition transitions.
    pub now: &'a str,
    /// Every kind's scope: discovery's on a live cluster; offline, the
    /// rule's `scope:` hints, then the built-in table (`cli::render`).
    pub scope_of: ScopeOf<'a>,
}

/// Whether `parent` falls under the rule's `namespaces` and `selector`.
pub fn parent_matches(rule: &CompiledRule, parent: &Value) -> bool {
    let spec = &rule.rule.spec.parent;
    let namespace = parent
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    if !spec.namespaces.is_empty()
        && !namespace.is_some_and(|ns| spec.namespaces.iter().any(|n| n == ns))
    {
        return false;
    }
    let Some(selector) = &spec.selector else {
        return true;
    };
    selector_matches(
        selector,
        parent
            .pointer("/metadata/labels")
            .and_then(Value::as_object),
    )
}

/// Deep-merges `over` onto `base`: objects merge key by key, anything else replaces.
pub fn deep_merge(base: &Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            let mut out = b.clone();
            for (k, v) in o {
                let merged = match out.get(k) {
                    Some(existing) => deep_merge(existing, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, over) => over.clone(),
    }
}

/// Where a schema error points, written the way a user reads it:
/// `spec.hosts[0]`, `spec.labels["app.kubernetes.io/name"]`.
fn spec_path(spec: &Value, at: &jsonschema::paths::Location) -> String {
    let mut out = String::from("spec");
    let mut here = Some(spec);
    for segment in at.iter() {
        let key = match segment {
            jsonschema::paths::LocationSegment::Index(i) => {
                if let Some(Value::Array(items)) = here {
                    out.push_str(&format!("[{i}]"));
                    here = items.get(i);
                    continue;
                }
                i.to_string()
            }
            jsonschema::paths::LocationSegment::Property(p) => p.into_owned(),
        };
        let plain = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if plain {
            out.push('.');
            out.push_str(&key);
        } else {
            out.push_str(&format!("[{}]", json!(key)));
        }
        here = here.and_then(|v| v.get(&key));
    }
    out
}

/// `namespace/name`, or `name` for a parent without a namespace.
fn parent_name(info: &ParentInfo) -> String {
    match &info.namespace {
        Some(ns) => format!("{ns}/{}", info.name),
        None => info.name.clone(),
    }
}

struct ParentInfo {
    name: String,
    namespace: Option<String>,
    uid: String,
    generation: Option<i64>,
    api_version: String,
    kind: String,
}

impl ParentInfo {
    fn of(parent: &Value) -> ParentInfo {
        let s = |p: &str| parent.pointer(p).and_then(Value::as_str).map(str::to_owned);
        ParentInfo {
            name: s("/metadata/name").unwrap_or_default(),
            namespace: s("/metadata/namespace"),
            uid: s("/metadata/uid").unwrap_or_else(|| PLACEHOLDER_UID.to_owned()),
            generation: parent
                .pointer("/metadata/generation")
                .and_then(Value::as_i64),
            api_version: s("/apiVersion").unwrap_or_default(),
            kind: s("/kind").unwrap_or_default(),
        }
    }
}

/// The pass for a parent the operator could not decode (`why`): no child is
/// rendered, applied or pruned; the status says why, with reason `Undecodable`.
pub fn undecodable(rule: &CompiledRule, input: &Input, why: &str) -> Plan {
    refused(rule, input, vec![why.to_owned()], "Undecodable")
}

/// The pass for a parent its CRD's schema refuses (`render --crds`): as for
/// a spec the rule's `schema` refuses, nothing is rendered or pruned and
/// the status says why, with reason `InvalidSpec`.
pub fn refused_by_crd(rule: &CompiledRule, input: &Input, errors: Vec<String>) -> Plan {
    refused(rule, input, errors, "InvalidSpec")
}

fn refused(rule: &CompiledRule, input: &Input, errors: Vec<String>, reason: &'static str) -> Plan {
    let info = ParentInfo::of(input.parent);
    let mut plan = Plan {
        errors,
        failure_reason: Some(reason),
        ..Plan::default()
    };
    plan.status = status_for_failure(rule, input, &info, &plan);
    plan
}

/// Decides one reconcile pass. Never fails: problems become `errors`, a
/// `Synced=False` condition and an empty prune set.
pub fn plan(rule: &CompiledRule, input: &Input) -> Plan {
    let info = ParentInfo::of(input.parent);
    let mut plan = Plan::default();

    // The API server only serves objects, but `render` reads any YAML and
    // the pass below writes `parent.spec` (found by the fuzzer: a parent
    // that is a list, with a cluster-scoped kind, panicked).
    if !input.parent.is_object() {
        plan.errors
            .push(format!("{}: the parent is not an object", rule.parent.kind));
        plan.failure_reason = Some("InvalidSpec");
        plan.status = status_for_failure(rule, input, &info, &plan);
        return plan;
    }

    // Children's namespaces and owner references follow from the parent's
    // scope: ask for it rather than guess it from the parent object.
    let kind = &rule.parent.kind;
    let scope_error = match ((input.scope_of)(&rule.parent), &info.namespace) {
        (Scope::Namespaced, None) => Some(format!(
            "the parent has no metadata.namespace ({kind} is namespaced; if it is not, \
             set spec.parent.scope: Cluster in the rule)"
        )),
        (Scope::Cluster, Some(_)) => {
            Some("cluster-scoped parent must not have metadata.namespace".to_owned())
        }
        _ => None,
    };
    if let Some(message) = scope_error {
        plan.errors
            .push(format!("{kind} {}: {message}", parent_name(&info)));
        plan.failure_reason = Some("RenderError");
        plan.status = status_for_failure(rule, input, &info, &plan);
        return plan;
    }

    let spec = match (&rule.rule.spec.defaults, input.parent.get("spec")) {
        (Some(d), Some(s)) => deep_merge(d, s),
        (Some(d), None) => d.clone(),
        (None, Some(s)) => s.clone(),
        (None, None) => json!({}),
    };
    if let Some(schema) = &rule.schema {
        let problems: Vec<String> = schema
            .iter_errors(&spec)
            .map(|e| format!("{}: {e}", spec_path(&spec, e.instance_path())))
            .collect();
        if !problems.is_empty() {
            plan.errors = problems;
            plan.failure_reason = Some("InvalidSpec");
            plan.status = status_for_failure(rule, input, &info, &plan);
            return plan;
        }
    }
    let parent = with_spec(input.parent, spec);

    let observed = input.observed.children_of(&rule.name, &info.uid);
    let mut children = Children::observed(rule, &observed);
    // Converted once: `spec` and `metadata` are the parent's own values
    // (shared, not copies), which halves the conversion cost of a pass.
    let parent_value = render::to_value(&parent);
    let field = |name: &str| {
        parent_value
            .get_attr(name)
            .ok()
            .filter(|v| !v.is_undefined())
            .unwrap_or_else(|| minijinja::Value::from(()))
    };
    let parent_ctx = context! {
        spec => field("spec"),
        metadata => field("metadata"),
        parent => parent_value,
        rule => context! { name => rule.name.clone() },
    };
    // Related entries decide what the pass may read: a refusal stops it
    // before anything is read or written.
    let related = match related::resolve(rule, &parent_ctx, &info, input) {
        Ok(resolved) => resolved,
        Err(failure) => {
            plan.errors.push(failure.error.to_string());
            plan.failure_reason = Some(failure.reason);
            plan.status = status_for_failure(rule, input, &info, &plan);
            return plan;
        }
    };
    plan.reads = related.reads;
    plan.errors
        .extend(related.errors.iter().map(ToString::to_string));
    let related_states = related.states;
    let reads_ctx = context! {
        related => render::to_value(&related.context),
        ..parent_ctx
    };
    let with_children = |fixed: &minijinja::Value, children: &Children| {
        context! { children => children.context(), ..fixed.clone() }
    };
    let vars = match related::eval_vars(rule, &with_children(&reads_ctx, &children)) {
        Ok(vars) => vars,
        Err(err) => {
            plan.errors.push(err.to_string());
            BTreeMap::new()
        }
    };
    let fixed = context! { vars => minijinja::Value::from(vars), ..reads_ctx };
    // `children` changes as `forEach` children render (item order): the
    // context is rebuilt then, around the same fixed part.
    let mut base = with_children(&fixed, &children);

    // Per child: what happened in this pass.
    let mut outcome: BTreeMap<usize, Outcome> = BTreeMap::new();
    let mut desired_keys: BTreeSet<ObjectKey> = BTreeSet::new();
    for &i in &rule.order {
        let child = &rule.children[i];
        let id = &child.spec.id;
        if let Some(pending) = related::holding_back(rule, child, &related_states) {
            plan.pending.push(pending);
            outcome.insert(i, Outcome::Pending);
            continue;
        }
        let result = plan_child(rule, child, &base, &info, input, &outcome);
        let result = match result {
            Ok(r) => r,
            Err(err) => {
                plan.errors.push(err.to_string());
                outcome.insert(i, Outcome::Failed);
                continue;
            }
        };
        match result {
            ChildResult::Excluded => {
                if children.excluded(id) {
                    base = with_children(&fixed, &children);
                }
                outcome.insert(i, Outcome::Excluded);
            }
            ChildResult::Pending(reason) => {
                plan.pending.push(Pending {
                    id: id.clone(),
                    reason,
                    message: None,
                });
                outcome.insert(i, Outcome::Pending);
            }
            ChildResult::Rendered(rendered) => {
                if children.rendered(id, rendered.iter().map(|(a, _)| &a.key)) {
                    base = with_children(&fixed, &children);
                }
                for (a, _) in &rendered {
                    if !desired_keys.insert(a.key.clone()) {
                        plan.errors.push(format!(
                            "child \"{id}\": {} is rendered twice in this rule",
                            a.key
                        ));
                    }
                }
                // A failed `readyWhen` is an error of the pass (nothing is
                // pruned) and holds back the child's dependents; the child
                // itself is applied, its readiness being read off the object.
                let ready = match child_ready(rule, child, &base, &observed, &rendered) {
                    Ok(ready) => ready,
                    Err(err) => {
                        let why = err.to_string();
                        plan.errors.push(why.clone());
                        Err(why)
                    }
                };
                if rendered.iter().any(|(a, _)| !a.owned) {
                    plan.needs_finalizer = true;
                }
                plan.apply.extend(rendered.into_iter().map(|(a, _)| a));
                outcome.insert(i, Outcome::Rendered(ready));
            }
        }
    }
    if rule.rule.spec.deletion.is_some() {
        plan.needs_finalizer = true;
    }
    if !plan.errors.is_empty() && plan.failure_reason.is_none() {
        plan.failure_reason = Some("RenderError");
    }

    if rule.writes_status() {
        let (status, errors) = build_status(rule, input, &info, &plan, &outcome, &base, &children);
        plan.status = Some(status);
        // A failed status field or condition is an error of the pass (render
        // exits 2, the operator reports it), though children were applied.
        if !errors.is_empty() {
            plan.errors.extend(errors);
            plan.failure_reason.get_or_insert("RenderError");
        }
    }

    // Prune: only on a clean pass, decided once every error of the pass
    // (status fields and conditions included) is known; pending children
    // keep what they have.
    if plan.errors.is_empty() {
        for (id, objects) in &observed {
            let index = rule.children.iter().position(|c| &c.spec.id == id);
            let keep_all = matches!(index.and_then(|i| outcome.get(&i)), Some(Outcome::Pending));
            for (key, obj) in objects {
                if keep_all || desired_keys.contains(key) {
                    continue;
                }
                plan.delete.push(Delete {
                    id: id.clone(),
                    key: (*key).clone(),
                    uid: obj
                        .pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    api_version: obj
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                });
            }
        }
    }
    plan
}

enum Outcome {
    Excluded,
    Pending,
    Failed,
    /// Rendered; `Err` names why the child is not ready yet.
    Rendered(Result<(), String>),
}

/// A `forEach` element and its position in the list.
type Item = (minijinja::Value, usize);

enum ChildResult {
    Excluded,
    Pending(String),
    /// Each object with the `forEach` item it was rendered from, which its
    /// `readyWhen` sees too.
    Rendered(Vec<(Apply, Option<Item>)>),
}

/// The parent as templates see it: its effective `spec` in place of its
/// own, without noise. Built field by field so the old spec and the managed
/// fields are never copied.
fn with_spec(parent: &Value, spec: Value) -> Value {
    let mut spec = Some(spec);
    let mut out: Map<String, Value> = parent
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let v = match k.as_str() {
                "spec" => spec.take().unwrap_or_default(),
                "metadata" => metadata_without_noise(v),
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    if let Some(spec) = spec {
        out.insert("spec".to_owned(), spec);
    }
    Value::Object(out)
}

fn metadata_without_noise(meta: &Value) -> Value {
    let Some(fields) = meta.as_object() else {
        return meta.clone();
    };
    let out = fields
        .iter()
        .filter(|(k, _)| k.as_str() != "managedFields")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut out = Value::Object(out);
    strip_noise_annotations(&mut out);
    out
}

/// Managed fields and the last-applied annotation are never read by rules:
/// keep them out of the evaluation context (and its cost).
fn strip_noise(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata") {
        if let Some(fields) = meta.as_object_mut() {
            fields.remove("managedFields");
        }
        strip_noise_annotations(meta);
    }
}

fn strip_noise_annotations(meta: &mut Value) {
    if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
        ann.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

fn plan_child(
    rule: &CompiledRule,
    child: &CompiledChild,
    base: &minijinja::Value,
    info: &ParentInfo,
    input: &Input,
    outcome: &BTreeMap<usize, Outcome>,
) -> Result<ChildResult, RenderError> {
    let id = &child.spec.id;
    let engine = &rule.engine;
    if let Some(expr) = child.include_when
        && !engine.eval_bool(expr, base, &format!("includeWhen of child \"{id}\""))?
    {
        return Ok(ChildResult::Excluded);
    }
    for &d in &child.depends_on {
        let dep = &rule.children[d].spec.id;
        let why = match outcome.get(&d) {
            Some(Outcome::Excluded) => continue,
            Some(Outcome::Rendered(Ok(()))) => continue,
            Some(Outcome::Rendered(Err(why))) => why.clone(),
            Some(Outcome::Pending) => format!("child \"{dep}\" is itself waiting"),
            Some(Outcome::Failed) => format!("child \"{dep}\" failed to render"),
            None => format!("child \"{dep}\" was not planned"),
        };
        return Ok(ChildResult::Pending(format!(
            "waiting for child \"{dep}\": {why}"
        )));
    }
    let items: Vec<Option<Item>> = match child.for_each {
        None => vec![None],
        Some(expr) => {
            let what = format!("forEach of child \"{id}\"");
            let list = engine.eval(expr, base, &what)?;
            if !matches!(list.kind(), ValueKind::Seq | ValueKind::Iterable) {
                return Err(RenderError {
                    what,
                    message: format!("must yield a list, got {}", list.kind()),
                });
            }
            let items: Vec<minijinja::Value> = list
                .try_iter()
                .map_err(|e| RenderError {
                    what: what.clone(),
                    message: e.to_string(),
                })?
                .collect();
            if items.len() > MAX_FOR_EACH_ITEMS {
                return Err(RenderError {
                    what,
                    message: format!(
                        "yields {} items, more than the limit of {MAX_FOR_EACH_ITEMS}",
                        items.len()
                    ),
                });
            }
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| Some((v, i)))
                .collect()
        }
    };
    let what = format!("template of child \"{id}\"");
    let mut applies = Vec::with_capacity(items.len());
    for item in items {
        let ctx = match &item {
            None => base.clone(),
            Some((item, index)) => {
                context! { item => item.clone(), index => *index, ..base.clone() }
            }
        };
        let what = match &item {
            None => what.clone(),
            Some((_, index)) => format!("{what} (item {index})"),
        };
        let text = engine.render(&child.template, &ctx, &what)?;
        let limits = yaml::Limits {
            max_bytes: engine.limits().max_bytes,
            ..yaml::Limits::FILES
        };
        let object = yaml::parse_value(&text, &limits).map_err(|e| RenderError {
            what: what.clone(),
            message: format!("rendered text is not valid YAML: {e}"),
        })?;
        applies.push((
            finish_object(rule, child, object, info, input, &what)?,
            item,
        ));
    }
    Ok(ChildResult::Rendered(applies))
}

mod children;
mod conditions;
mod object;
mod related;

use children::Children;
use conditions::{build_status, child_ready, status_for_failure};
use object::finish_object;
pub use object::object_hash;
pub use related::{
    MAX_RELATED_ITEMS, RelatedRead, RelatedTarget, Unreadable, selector_matches,
    selector_matches_with,
};

#[cfg(test)]
mod tests;
