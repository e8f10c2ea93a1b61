//! The pure core: (rule, parent, observed objects) → [`Plan`].
//!
//! ```text
//!  parent ─▶ scope fits? ─▶ defaults ─▶ schema ─▶ effective spec     (parent)
//!     │    (not an object, a namespace that does not fit its kind's scope,
//!     │     a spec the schema refuses: stop, touch nothing)
//!     ▼
//!  related entries ─▶ vars     (related, vars; a refused read: stop;
//!     │                          a failed var: an error, its readers too)
//!     │
//!     ▼ for each child in dependency order                            (child)
//!  related entry missing? ── yes ─▶ pending (RelatedNotFound, …; objects kept)
//!  includeWhen?           ── no ──▶ excluded (its observed objects are pruned;
//!                                   from here on `children.<id>` reads as
//!                                   never created)                 (children)
//!  deps ready?            ── no ──▶ pending (held back; objects kept)
//!  forEach items ─▶ render ─▶ YAML ─▶ enforce kind/name/namespace/
//!     │                               labels/owner ─▶ apply          (object)
//!     │           readiness, for the children that depend on it  (conditions)
//!     ▼
//!  status ─▶ prune set (only when the pass, status included,     (conditions)
//!                       had no error)
//! ```
//!
//! The modules, one concept each: `observed` (what the cluster holds for
//! the parent), `parent` (the parent as the pass sees it), `related`
//! (reads), `vars` (what a failing var withholds), `children` (`children.<id>` as templates and status see
//! it), `child` (one child's includeWhen, dependencies, items and render),
//! `object` (a rendered object made safe to apply), `conditions` (readiness
//! and the parent's new status). This file holds the pass itself and what it
//! returns.
//!
//! Nothing here performs I/O or reads the clock: the caller passes `now`, and
//! the operator and `trellis render` get the very same answer.

use std::collections::BTreeMap;

use minijinja::context;
use serde::Serialize;
use serde_json::Value;

use crate::kinds::Gvk;
use crate::render;
use crate::rules::model::{Policy, Scope};
use crate::rules::{CompiledChild, CompiledRule};

pub use crate::labels::{
    ANNOTATION_RENDER_HASH, LABEL_CHILD, LABEL_DELETION_POLICY, LABEL_MANAGED_BY, LABEL_PARENT_UID,
    LABEL_REVISION, LABEL_RULE, MANAGED_BY, RETAIN,
};
/// Used when an offline parent file has no `metadata.uid`.
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

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
    /// The child's `handOff` paths as keys: left out of the apply once
    /// another manager owns them ([`crate::ownership::handed_off`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hand_off: Vec<Vec<String>>,
}

impl Apply {
    /// The rendering as drift detection compares it with the live object:
    /// without the `handOff` paths, which differ from the rendering only
    /// once someone else has changed them, and are then theirs.
    pub fn compared(&self) -> std::borrow::Cow<'_, Value> {
        if self.hand_off.is_empty() {
            return std::borrow::Cow::Borrowed(&self.object);
        }
        let all: Vec<&[String]> = self.hand_off.iter().map(Vec::as_slice).collect();
        std::borrow::Cow::Owned(crate::ownership::without_fields(&self.object, &all))
    }

    /// What an apply over `live` (read with its `managedFields`) sends as
    /// field manager `manager`: the rendering, less the `handOff` paths
    /// another manager owns there.
    pub fn body_over(&self, live: &Value, manager: &str) -> std::borrow::Cow<'_, Value> {
        let taken = crate::ownership::handed_off(live, &self.hand_off, manager);
        if taken.is_empty() {
            return std::borrow::Cow::Borrowed(&self.object);
        }
        std::borrow::Cow::Owned(crate::ownership::without_fields(&self.object, &taken))
    }
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

/// Why a pass failed: the reason of the parent's `Ready` and `Synced`
/// conditions (and of the Warning) when a pass has errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// The spec cannot be planned as it stands (not an object, refused by
    /// the rule's or the CRD's schema): only an edit of the parent fixes it.
    InvalidSpec,
    /// A template, expression, status field or condition failed, or the
    /// parent does not fit its kind's scope; the default for a failed pass.
    RenderError,
    /// The operator could not decode the parent.
    Undecodable,
    /// A related entry reads outside the parent's namespace without
    /// `allowCrossNamespace`.
    CrossNamespaceRefused,
}

impl FailureReason {
    /// The condition reason, as written to the parent's status.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::InvalidSpec => "InvalidSpec",
            FailureReason::RenderError => "RenderError",
            FailureReason::Undecodable => "Undecodable",
            FailureReason::CrossNamespaceRefused => "CrossNamespaceRefused",
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
    pub failure_reason: Option<FailureReason>,
    /// Children without ownerReference, or `deletion.order: reverse`: the
    /// parent needs the cleanup finalizer.
    pub needs_finalizer: bool,
    /// What the rule's `related:` entries and patch targets read in this pass.
    pub reads: Vec<RelatedRead>,
    /// Contributions to objects the rule does not own (`patches:`), in
    /// order; one whose target is missing has no `uid` and is not sent.
    pub patches: Vec<PatchApply>,
    /// Contributions no longer rendered, to take back (clean passes only).
    pub release: Vec<Release>,
    /// Children no longer rendered with `deletionPolicy: retain`: released
    /// (kept without anything of trellis's) instead of deleted.
    pub retain: Vec<Delete>,
    /// What became of each child, patch and related entry, by id (empty
    /// when the pass stopped before planning them: see `errors`).
    pub outcomes: BTreeMap<String, EntryOutcome>,
}

/// Inputs of [`plan`] besides the rule.
pub struct Input<'a> {
    pub parent: &'a Value,
    pub observed: &'a Observed,
    /// RFC 3339 timestamp used for new condition transitions.
    pub now: &'a str,
    /// Every kind's scope: discovery's on a live cluster; offline, the
    /// rule's `scope:` hints, then the built-in table (`plan::offline_input`).
    pub scope_of: ScopeOf<'a>,
    /// This hub's name and the spokes children may be placed in (offline:
    /// [`crate::clusters::Clusters::offline`]).
    pub clusters: &'a crate::clusters::Clusters,
}

/// The pass for a parent the operator could not decode (`why`): no child is
/// rendered, applied or pruned; the status says why, with reason `Undecodable`.
pub fn undecodable(rule: &CompiledRule, input: &Input, why: &str) -> Plan {
    refused(
        rule,
        input,
        vec![why.to_owned()],
        FailureReason::Undecodable,
    )
}

/// The pass for a parent its CRD's schema refuses (`render --crds`): as for
/// a spec the rule's `schema` refuses, nothing is rendered or pruned and
/// the status says why, with reason `InvalidSpec`.
pub fn refused_by_crd(rule: &CompiledRule, input: &Input, errors: Vec<String>) -> Plan {
    refused(rule, input, errors, FailureReason::InvalidSpec)
}

fn refused(rule: &CompiledRule, input: &Input, errors: Vec<String>, reason: FailureReason) -> Plan {
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
        let error = format!("{}: the parent is not an object", rule.parent.kind);
        return refused(rule, input, vec![error], FailureReason::InvalidSpec);
    }

    if let Some(error) = parent::scope_error(rule, &info, input) {
        return refused(rule, input, vec![error], FailureReason::RenderError);
    }
    let spec = match parent::effective_spec(rule, input.parent) {
        Ok(spec) => spec,
        Err(problems) => return refused(rule, input, problems, FailureReason::InvalidSpec),
    };
    let parent = with_spec(input.parent, spec);

    let observed = input.observed.children_of(&rule.name, &info.uid);
    let mut children = Children::observed(rule, &observed);
    let parent_ctx = parent::parent_context(rule, &parent);
    // Related entries decide what the pass may read: a refusal stops it
    // before anything is read or written.
    let related = match related::resolve(rule, &parent_ctx, &info, input) {
        Ok(resolved) => resolved,
        Err(failure) => {
            return refused(rule, input, vec![failure.error.to_string()], failure.reason);
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
    // A var that fails is reported once; only what reads it is withheld.
    let vars = Vars::evaluate(rule, &with_children(&reads_ctx, &children));
    plan.errors
        .extend(vars.errors().map(|(_, err)| err.to_string()));
    let fixed = context! { vars => minijinja::Value::from(vars.values.clone()), ..reads_ctx };
    // `children` changes as `forEach` children render (item order): the
    // context is rebuilt then, around the same fixed part.
    let mut base = with_children(&fixed, &children);

    // Per child: what happened in this pass.
    let mut outcome: BTreeMap<usize, Outcome> = BTreeMap::new();
    // Every object rendered in this pass, with its readiness once known.
    let mut desired_keys: BTreeMap<ObjectKey, bool> = BTreeMap::new();
    for &i in &rule.order {
        let child = &rule.children[i];
        let id = &child.spec.id;
        if let Some(pending) = related::holding_back(rule, child, &related_states) {
            plan.pending.push(pending);
            outcome.insert(i, Outcome::Pending);
            continue;
        }
        if let Some(err) = vars.withheld(&child.reads_vars, &format!("child \"{id}\"")) {
            plan.errors.push(err.to_string());
            outcome.insert(i, Outcome::Failed);
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
            ChildResult::Pending { reason, message } => {
                plan.pending.push(Pending {
                    id: id.clone(),
                    reason,
                    message,
                });
                outcome.insert(i, Outcome::Pending);
            }
            ChildResult::Rendered(rendered) => {
                if children.rendered(id, rendered.iter().map(|(a, _)| &a.key)) {
                    base = with_children(&fixed, &children);
                }
                let ready = take_rendered(
                    rule,
                    child,
                    rendered,
                    &base,
                    &observed,
                    &mut desired_keys,
                    &mut plan,
                );
                outcome.insert(i, Outcome::Rendered(ready));
            }
        }
    }
    // Patches, after every child; they see `patches`, and so does status.
    let patched = patch::plan_patches(rule, &base, &info, input, &outcome, &related_states, &vars);
    plan.pending.extend(patched.pending);
    plan.errors.extend(patched.errors);
    plan.reads.extend(patched.reads);
    plan.patches = patched.apply;
    if !rule.patches.is_empty() {
        base = context! {
            patches => minijinja::Value::from(patched.context),
            ..base
        };
    }
    if needs_cleanup(rule) || in_a_spoke(&observed) || held_in_a_spoke(rule, &plan) {
        plan.needs_finalizer = true;
    }
    if !plan.errors.is_empty() && plan.failure_reason.is_none() {
        plan.failure_reason = Some(FailureReason::RenderError);
    }

    plan.outcomes = outcome::collect(rule, &outcome, &patched.outcome, &related_states);

    if rule.writes_status() {
        let inventory = inventory::entries(rule, &plan, &outcome, &observed, &desired_keys);
        let outcomes = Outcomes {
            vars: &vars,
            children: &outcome,
            patches: &patched.outcome,
            inventory,
        };
        plan_status(rule, input, &info, &outcomes, &base, &children, &mut plan);
    }

    // Prune: only on a clean pass, decided once every error of the pass
    // (status fields and conditions included) is known.
    if plan.errors.is_empty() {
        plan_prune(rule, input, &observed, &outcome, &desired_keys, &mut plan);
        if !patched.holding {
            let manager = patch::field_manager(&rule.name, &info.uid);
            plan.release = patch::releases(input, &manager, &plan.patches);
        }
    }
    plan
}

/// Whether every parent of the rule needs the cleanup finalizer, whatever
/// it renders: ordered deletion, patches and retained children are undone
/// behind it. A child in a spoke is not a reason for every parent: only a
/// parent with one (rendered now: not `owned`, see `take_rendered`; or
/// observed there, or placed in a spoke that cannot be read now) needs it,
/// since a spoke child has no ownerReference and only the finalizer takes
/// it away; a parent whose children are all at home is left to the garbage
/// collector.
fn needs_cleanup(rule: &CompiledRule) -> bool {
    rule.rule.spec.deletion.is_some() || !rule.patches.is_empty() || rule.retains_children()
}

/// Whether the parent has a child in a spoke as last seen: one its
/// `cluster:` no longer places there is still there until pruned.
fn in_a_spoke(observed: &BTreeMap<String, Vec<(&ObjectKey, &Value)>>) -> bool {
    observed
        .values()
        .flatten()
        .any(|(key, _)| key.cluster.is_some())
}

/// Whether a child is held back by a spoke that cannot be read: what it
/// holds there is not known (its cache may never have been filled).
fn held_in_a_spoke(rule: &CompiledRule, plan: &Plan) -> bool {
    let holds = [crate::clusters::UNREACHABLE, crate::clusters::UNKNOWN];
    plan.pending
        .iter()
        .any(|p| holds.contains(&p.reason.as_str()) && rule.child(&p.id).is_some())
}

/// The parent's new status, and its failed fields and conditions as errors
/// of the pass (render exits 2, the operator reports them), though the
/// children were applied.
fn plan_status(
    rule: &CompiledRule,
    input: &Input,
    info: &ParentInfo,
    outcomes: &Outcomes,
    base: &minijinja::Value,
    children: &Children,
    plan: &mut Plan,
) {
    let (status, errors) = build_status(rule, input, info, plan, outcomes, base, children);
    plan.status = Some(status);
    if !errors.is_empty() {
        plan.errors.extend(errors);
        plan.failure_reason
            .get_or_insert(FailureReason::RenderError);
    }
}

/// A rendered child's objects into the plan (each key once in the rule),
/// and its readiness for the children that depend on it.
fn take_rendered(
    rule: &CompiledRule,
    child: &CompiledChild,
    rendered: Vec<(Apply, Option<Item>)>,
    base: &minijinja::Value,
    observed: &BTreeMap<String, Vec<(&ObjectKey, &Value)>>,
    desired_keys: &mut BTreeMap<ObjectKey, bool>,
    plan: &mut Plan,
) -> Result<(), String> {
    let id = &child.spec.id;
    for (a, _) in &rendered {
        if desired_keys.insert(a.key.clone(), false).is_some() {
            plan.errors.push(format!(
                "child \"{id}\": {} is rendered twice in this rule",
                a.key
            ));
        }
    }
    // A failed `readyWhen` is an error of the pass (nothing is
    // pruned) and holds back the child's dependents; the child
    // itself is applied, its readiness being read off the object.
    let ready = match child_ready(rule, child, base, observed, &rendered, desired_keys) {
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
    ready
}

/// What a clean pass prunes: the observed children it no longer renders,
/// deleted, or released where they are to be retained (the child's
/// `deletionPolicy: retain`, or the object's own retain label).
fn plan_prune(
    rule: &CompiledRule,
    input: &Input,
    observed: &BTreeMap<String, Vec<(&ObjectKey, &Value)>>,
    outcome: &BTreeMap<usize, Outcome>,
    desired_keys: &BTreeMap<ObjectKey, bool>,
    plan: &mut Plan,
) {
    let (retain, delete) = prune(rule, input, observed, outcome, desired_keys)
        .into_iter()
        .partition(|d| {
            let obj = input.observed.objects.get(&d.key);
            obj.is_some_and(retained)
                || rule.child(&d.id).is_some_and(|c| {
                    c.spec.deletion_policy == crate::rules::model::DeletionPolicy::Retain
                })
        });
    plan.delete = delete;
    plan.retain = retain;
}

/// Whether an observed child is to be released rather than deleted: it
/// says so itself (`trellis.dev/deletion-policy: retain`), whichever rule
/// version made it.
pub fn retained(obj: &Value) -> bool {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(LABEL_DELETION_POLICY))
        .and_then(Value::as_str)
        == Some(RETAIN)
}

/// The observed objects no child rendered in this pass; a pending child
/// keeps what it has, and nothing is taken from a spoke that cannot be
/// reached (or is no longer registered): its objects as last seen may be
/// stale, and it is not there to ask.
fn prune(
    rule: &CompiledRule,
    input: &Input,
    observed: &BTreeMap<String, Vec<(&ObjectKey, &Value)>>,
    outcome: &BTreeMap<usize, Outcome>,
    desired_keys: &BTreeMap<ObjectKey, bool>,
) -> Vec<Delete> {
    let mut delete = Vec::new();
    for (id, objects) in observed {
        let index = rule.children.iter().position(|c| &c.spec.id == id);
        let keep_all = matches!(index.and_then(|i| outcome.get(&i)), Some(Outcome::Pending));
        for (key, obj) in objects {
            if keep_all
                || desired_keys.contains_key(key)
                || input.clusters.hold(key.cluster.as_deref()).is_some()
            {
                continue;
            }
            delete.push(Delete {
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
    delete
}

mod child;
mod children;
mod conditions;
mod inventory;
mod items;
mod object;
mod observed;
pub mod offline_input;
mod outcome;
mod parent;
mod patch;
mod propagate;
mod related;
mod rule_conditions;
pub mod sample;
mod vars;

use child::{ChildResult, Item, Outcome, plan_child};
use children::{Children, with_children};
use conditions::{Outcomes, build_status, child_ready, status_for_failure};
pub use inventory::MAX_INVENTORY;
pub use items::MAX_FOR_EACH_ITEMS;
pub use object::object_hash;
pub use observed::{ObjectKey, Observed, RelatedSource};
pub use outcome::EntryOutcome;
pub use parent::parent_context;
use parent::{ParentInfo, with_spec};
pub use parent::{deep_merge, parent_matches, why_not_selected};
pub use patch::{PatchApply, Release, TARGET_NOT_FOUND, field_manager, has_manager};
pub use propagate::{MAX_PROPAGATED_BYTES, MAX_PROPAGATED_KEYS};
pub use related::{
    MAX_RELATED_ITEMS, RelatedRead, RelatedTarget, Unreadable, selector_matches,
    selector_matches_with,
};
use vars::Vars;
pub use vars::conversion_context;

#[cfg(test)]
mod tests;
