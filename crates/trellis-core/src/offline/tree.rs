//! `trellis tree`'s pure part: one live parent, its rule, what is observed
//! for it and one pass's [`Plan`] → a [`Tree`]: one line per related entry,
//! child object and patch target, in dependency order, each nested under
//! what it depends on; and the text and JSON printed from it
//! ([`text`](mod@text)). The cluster side — reading the parent, its children
//! and reads, planning, watching — is the binary's `cli::tree`.
//!
//! ```text
//!  rule, parent, observed, plan ──build──▶ Tree { parent, lines, errors }
//!                                              │
//!                                              ├──text::print──▶ a table, nested
//!                                              └──serde────────▶ JSON
//! ```
//!
//! Nothing is decided a second time here: exclusion, holding back and
//! readiness are the planner's verdicts ([`EntryOutcome`]); "synced" is the
//! operator's own test for skipping a write (the live object carries this
//! rendering's hash and holds every field it sets, [`crate::drift::drifted`]).

mod nest;
mod readiness;
pub mod target;
pub mod text;

use serde::Serialize;
use serde_json::Value;

use crate::plan::{EntryOutcome, ObjectKey, Observed, Plan, RelatedTarget};
use crate::rules::{CompiledChild, CompiledRule};
use crate::status::default_ready;
use nest::nest;
use readiness::{FirstNotReady, synced};

/// One parent under one rule, as `trellis tree` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tree {
    pub rule: String,
    pub parent: ParentView,
    /// Depth first: every line comes after everything it depends on.
    pub lines: Vec<Line>,
    /// What the pass fails on (`Synced=False`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Why the operator does nothing for this parent (paused, being
    /// deleted, outside the rule's scope); then there are no lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentView {
    pub api_version: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The parent's own `status.conditions`, as they are.
    pub conditions: Vec<ConditionView>,
    pub ready: bool,
    /// Where `ready` comes from.
    pub ready_from: ReadyFrom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ReadyFrom {
    /// The parent's `Ready` condition, as the operator wrote it.
    Condition,
    /// A built-in parent kind, to which trellis writes no status: its own
    /// default readiness (as a child's: `status.observedGeneration` current,
    /// `Available`/`Ready`/`Complete` True where it has them), and its
    /// rule's pass: every included entry there and ready, nothing held back
    /// or failed.
    Children,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    Related,
    Child,
    Patch,
}

/// What one line's object is in this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// It exists: a child, a patch's target, a related object.
    Present,
    /// Rendered but not there yet (a child: the operator creates it; a
    /// patch target: the patch waits for it); a required related object
    /// that does not exist or cannot be read.
    Missing,
    /// `includeWhen` is false for this parent.
    Excluded,
    /// Held back by what it depends on (`reason` says what).
    Pending,
    /// Its template or an expression failed, or the pass stopped before it.
    Failed,
    /// An `optional` related object that does not exist.
    Absent,
    /// Observed but no longer rendered: deleted (or released) by the next
    /// pass in which nothing fails.
    Pruning,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    /// 1 under the parent, one more per dependency level.
    pub depth: usize,
    pub id: String,
    pub role: Role,
    pub api_version: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `None`: no object (excluded, failed, held back before a first
    /// render) or a selector (then `matched` counts the objects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The spoke the object lives in (`cluster:`); `None`: the hub.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched: Option<usize>,
    pub state: State,
    /// `None`: does not apply (excluded, absent, pruned) or not known.
    pub ready: Option<bool>,
    /// Whether the live object holds what this pass renders for it; `None`
    /// for what trellis does not write (related objects) or no longer
    /// renders.
    pub synced: Option<bool>,
    /// Why it is held back, not ready, missing or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What else it depends on, besides the line it is nested under.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
}

impl Tree {
    /// Whether the parent is Ready: `trellis tree` exits 0 then, else 1.
    pub fn ready(&self) -> bool {
        self.parent.ready
    }
}

/// `trellis tree -o json`: `{ready, trees}`, `ready` when every tree's
/// parent is Ready (one tree per rule of the parent's kind that selects it).
pub fn to_json(trees: &[Tree]) -> Value {
    serde_json::json!({"ready": trees.iter().all(Tree::ready), "trees": trees})
}

/// The tree of `parent` under `rule`, from one pass's `plan` over
/// `observed` (children, related objects and patch targets as read);
/// `skipped`: why the operator would not run a pass at all.
pub fn build(
    rule: &CompiledRule,
    parent: &Value,
    observed: &Observed,
    plan: &Plan,
    skipped: Option<String>,
) -> Tree {
    let s = |p: &str| parent.pointer(p).and_then(Value::as_str);
    let lines = if skipped.is_some() {
        Vec::new()
    } else {
        nest(entries(
            rule,
            s("/metadata/uid").unwrap_or_default(),
            observed,
            plan,
        ))
    };
    let conditions = conditions(parent);
    let (ready, ready_from) = if rule.writes_status() {
        let ready = conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready, ReadyFrom::Condition)
    } else {
        let ready = skipped.is_none()
            && default_ready(parent).is_ok()
            && plan.errors.is_empty()
            && plan.pending.is_empty()
            && lines.iter().all(|l| l.ready != Some(false));
        (ready, ReadyFrom::Children)
    };
    Tree {
        rule: rule.name.clone(),
        parent: ParentView {
            api_version: s("/apiVersion").unwrap_or_default().to_owned(),
            kind: s("/kind").unwrap_or(&rule.parent.kind).to_owned(),
            namespace: s("/metadata/namespace").map(str::to_owned),
            name: s("/metadata/name").unwrap_or_default().to_owned(),
            conditions,
            ready,
            ready_from,
        },
        lines,
        errors: plan.errors.clone(),
        skipped,
    }
}

fn conditions(parent: &Value) -> Vec<ConditionView> {
    let text = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
    parent
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|c| ConditionView {
            type_: text(c, "type").unwrap_or_default(),
            status: text(c, "status").unwrap_or_else(|| "Unknown".into()),
            reason: text(c, "reason").filter(|r| !r.is_empty()),
            message: text(c, "message").filter(|m| !m.is_empty()),
        })
        .collect()
}

/// One entry of the rule and its lines (depth not yet set), with the ids
/// of what it depends on.
pub(super) struct Entry {
    pub(super) deps: Vec<String>,
    pub(super) lines: Vec<Line>,
}

/// Every entry in a dependency order: related entries (they depend on
/// nothing), children in the rule's order, then patches in theirs (a patch
/// is planned after every child).
fn entries(rule: &CompiledRule, uid: &str, observed: &Observed, plan: &Plan) -> Vec<Entry> {
    let mut out = Vec::new();
    for related in &rule.related {
        let id = &related.spec.id;
        out.push(Entry {
            deps: Vec::new(),
            lines: related_lines(
                id,
                &related.gvk.api_version(),
                &related.gvk.kind,
                observed,
                plan,
            ),
        });
    }
    let live = observed.children_of(&rule.name, uid);
    for &i in &rule.order {
        let child = &rule.children[i];
        let lines = child_lines(child, &live, plan);
        out.push(Entry {
            deps: deps(rule, child),
            lines,
        });
    }
    // Objects of a child the rule no longer has: pruned.
    let mut gone: Vec<&str> = plan
        .delete
        .iter()
        .chain(&plan.retain)
        .map(|d| d.id.as_str())
        .filter(|id| rule.child(id).is_none())
        .collect();
    gone.dedup();
    for id in gone {
        out.push(Entry {
            deps: Vec::new(),
            lines: pruned(id, plan, |state| line(id, Role::Child, "", "", state)),
        });
    }
    for &i in &rule.patch_order {
        let patch = &rule.patches[i];
        out.push(Entry {
            deps: deps(rule, patch),
            lines: patch_lines(patch, plan),
        });
    }
    out
}

fn deps(rule: &CompiledRule, entry: &CompiledChild) -> Vec<String> {
    let related = entry
        .depends_on_related
        .iter()
        .map(|&r| &rule.related[r].spec.id);
    let children = entry.depends_on.iter().map(|&c| &rule.children[c].spec.id);
    let patches = entry
        .depends_on_patches
        .iter()
        .map(|&p| &rule.patches[p].spec.id);
    related.chain(children).chain(patches).cloned().collect()
}

/// A line with what every line of an entry shares.
fn line(id: &str, role: Role, api_version: &str, kind: &str, state: State) -> Line {
    Line {
        depth: 0,
        id: id.to_owned(),
        role,
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        namespace: None,
        name: None,
        cluster: None,
        matched: None,
        state,
        ready: None,
        synced: None,
        reason: None,
        after: Vec::new(),
    }
}

fn at(mut line: Line, key: &ObjectKey) -> Line {
    line.namespace = key.namespace.clone();
    line.name = Some(key.name.clone());
    line.cluster = key.cluster.clone();
    line
}

/// Why a pending entry waits, as the plan says it.
fn pending_reason(plan: &Plan, id: &str) -> Option<String> {
    plan.pending
        .iter()
        .find(|p| p.id == id)
        .map(|p| p.describe())
}

/// The first error of the pass that names the entry.
fn error_of(plan: &Plan, noun: &str, id: &str) -> Option<String> {
    let needle = format!("{noun} \"{id}\"");
    plan.errors.iter().find(|e| e.contains(&needle)).cloned()
}

const NOT_PLANNED: &str = "not planned: the pass stopped before it (see the errors)";

fn related_lines(
    id: &str,
    api_version: &str,
    kind: &str,
    observed: &Observed,
    plan: &Plan,
) -> Vec<Line> {
    let base = |state| line(id, Role::Related, api_version, kind, state);
    let read = plan.reads.iter().find(|r| r.id == id);
    let mut out = match plan.outcomes.get(id) {
        Some(EntryOutcome::Read { not_ready }) => {
            let mut l = base(State::Present);
            l.ready = Some(not_ready.is_none());
            l.reason = not_ready.clone();
            l
        }
        Some(EntryOutcome::Missing { reason, message }) => {
            let mut l = base(State::Missing);
            l.ready = Some(false);
            l.reason = Some(format!("{reason}: {message}"));
            l
        }
        Some(EntryOutcome::Absent) => {
            let mut l = base(State::Absent);
            l.reason = Some("optional, does not exist".into());
            l
        }
        _ => {
            let mut l = base(State::Failed);
            l.ready = Some(false);
            l.reason = Some(error_of(plan, "related", id).unwrap_or_else(|| NOT_PLANNED.into()));
            l
        }
    };
    if let Some(read) = read {
        out.namespace = read.namespace.clone();
        match &read.target {
            RelatedTarget::Name(name) => out.name = Some(name.clone()),
            RelatedTarget::Selector(_) => {
                let gvk = crate::kinds::Gvk::new(api_version, kind);
                out.matched = Some(
                    observed
                        .objects
                        .iter()
                        .filter(|(k, o)| read.covers_object(&gvk, k, o))
                        .count(),
                );
            }
        }
    }
    vec![out]
}

type Live<'a> = std::collections::BTreeMap<String, Vec<(&'a ObjectKey, &'a Value)>>;

fn child_lines(child: &CompiledChild, live: &Live, plan: &Plan) -> Vec<Line> {
    let id = &child.spec.id;
    let base = |state| {
        line(
            id,
            Role::Child,
            &child.gvk.api_version(),
            &child.gvk.kind,
            state,
        )
    };
    let observed: &[(&ObjectKey, &Value)] = live.get(id).map(Vec::as_slice).unwrap_or_default();
    let mut out = Vec::new();
    match plan.outcomes.get(id) {
        Some(EntryOutcome::Excluded) => {
            let mut l = base(State::Excluded);
            l.reason = Some("includeWhen is false for this parent".into());
            out.push(l);
        }
        Some(EntryOutcome::Pending) => {
            let l = held_back(base(State::Pending), plan, id);
            // What it has already is kept while it waits.
            match observed {
                [] => out.push(l),
                objects => out.extend(objects.iter().map(|(k, _)| at(l.clone(), k))),
            }
        }
        Some(EntryOutcome::Rendered { not_ready }) => {
            let keys = plan.apply.iter().filter(|a| &a.id == id).map(|a| &a.key);
            let mut first = FirstNotReady::new(not_ready, keys);
            for apply in plan.apply.iter().filter(|a| &a.id == id) {
                let mut l = at(base(State::Present), &apply.key);
                match observed.iter().find(|(k, _)| **k == apply.key) {
                    None => {
                        first.missing(not_ready, &apply.key);
                        l.state = State::Missing;
                        l.ready = Some(false);
                        l.synced = Some(false);
                        l.reason = Some("does not exist yet".into());
                    }
                    Some((_, live)) => {
                        // Past the planner's first object that is not
                        // ready, only default readiness can be read off
                        // the object; a `readyWhen` was not kept.
                        let after = || match child.ready_when {
                            None => Some(default_ready(live)),
                            Some(_) => None,
                        };
                        (l.ready, l.reason) = first.readiness(not_ready, &apply.key, after);
                        l.synced = Some(synced(apply, live));
                    }
                }
                out.push(l);
            }
        }
        _ => out.push(failed(base(State::Failed), plan, "child", id)),
    }
    out.extend(pruned(id, plan, base));
    out
}

/// What the pass prunes of the child `id`.
fn pruned(id: &str, plan: &Plan, base: impl Fn(State) -> Line) -> Vec<Line> {
    let deleted = plan.delete.iter().map(|d| (d, "deleted"));
    let retained = plan
        .retain
        .iter()
        .map(|d| (d, "released (deletionPolicy: retain)"));
    deleted
        .chain(retained)
        .filter(|(d, _)| d.id == id)
        .map(|(gone, how)| {
            let mut l = at(base(State::Pruning), &gone.key);
            l.kind.clone_from(&gone.key.kind);
            if l.api_version.is_empty() {
                l.api_version.clone_from(&gone.api_version);
            }
            l.synced = Some(false);
            l.reason = Some(format!("no longer rendered: {how}"));
            l
        })
        .collect()
}

fn held_back(mut l: Line, plan: &Plan, id: &str) -> Line {
    l.state = State::Pending;
    l.ready = Some(false);
    l.synced = Some(false);
    l.reason = pending_reason(plan, id);
    l
}

fn failed(mut l: Line, plan: &Plan, noun: &str, id: &str) -> Line {
    l.state = State::Failed;
    l.ready = Some(false);
    l.synced = Some(false);
    l.reason = Some(error_of(plan, noun, id).unwrap_or_else(|| NOT_PLANNED.into()));
    l
}

fn patch_lines(patch: &CompiledChild, plan: &Plan) -> Vec<Line> {
    let id = &patch.spec.id;
    let base = |state| {
        line(
            id,
            Role::Patch,
            &patch.gvk.api_version(),
            &patch.gvk.kind,
            state,
        )
    };
    let targets: Vec<_> = plan.patches.iter().filter(|p| &p.id == id).collect();
    let mut out = Vec::new();
    let not_ready = match plan.outcomes.get(id) {
        Some(EntryOutcome::Excluded) => {
            let mut l = base(State::Excluded);
            l.reason = Some("includeWhen is false for this parent".into());
            return vec![l];
        }
        Some(EntryOutcome::Pending) if targets.is_empty() => {
            return vec![held_back(base(State::Pending), plan, id)];
        }
        Some(EntryOutcome::Pending) => None,
        Some(EntryOutcome::Rendered { not_ready }) => not_ready.clone(),
        _ => return vec![failed(base(State::Failed), plan, "patch", id)],
    };
    let pending = matches!(plan.outcomes.get(id), Some(EntryOutcome::Pending));
    let mut first = FirstNotReady::new(&not_ready, targets.iter().map(|t| &t.key));
    for target in targets {
        let mut l = at(base(State::Present), &target.key);
        if target.uid.is_none() {
            l.state = State::Missing;
            l.ready = Some(false);
            l.synced = Some(false);
            l.reason = pending_reason(plan, id);
        } else if pending {
            l = held_back(l, plan, id);
            l.synced = Some(target.held);
        } else {
            (l.ready, l.reason) = first.readiness(&not_ready, &target.key, || None);
            l.synced = Some(target.held);
        }
        out.push(l);
    }
    out
}

#[cfg(test)]
mod tests;
