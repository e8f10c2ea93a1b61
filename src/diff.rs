//! `trellis diff`: what one reconcile pass would change, per child and per
//! patch target (a release of contributions shows as the fields that would
//! go), shown as a field-by-field diff.
//!
//! ```text
//!  live parent + live children + related ──plan──▶ Plan
//!      │  (diff::live: reads and server-side dry-runs only)
//!      ▼
//!  per child: live object vs. the dry-run result ──object_changes──▶ [FieldChange]
//!      ▼
//!  ParentDiff { children, pending, parent_fields, errors } ──print──▶ text, exit code
//! ```
//!
//! This module is the pure part: comparing two objects and printing the
//! result. [`live`] talks to the cluster (it never writes: every request is
//! a GET, a LIST, or a dry-run). Comparing the live object with what the API
//! server answers to a dry-run apply, instead of with the rendering, shows
//! exactly what the apply would change — defaults, normalization and
//! fields a template stopped setting included — and nothing it would not.

pub mod crd;
pub mod live;

pub use crd::{CrdChange, CrdDiff};

use std::fmt::Write;

use serde_json::{Map, Value};

use crate::field_path::push_key;
use crate::plan::{ObjectKey, Pending};

/// One field that would change.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldChange {
    /// `spec.template.spec.containers[name=web].image`, `data["a.b"]`.
    pub path: String,
    /// `None`: the field does not exist yet.
    pub before: Option<Value>,
    /// `None`: the field would be removed.
    pub after: Option<Value>,
}

/// What one pass would do to one child object.
#[derive(Debug, Clone, PartialEq)]
pub enum ChildChange {
    /// The object does not exist: it would be created with these fields
    /// (as rendered; the API server accepted it in a dry-run).
    Create { object: Value },
    /// The object exists and these fields would change.
    Update { fields: Vec<FieldChange> },
    /// `policy: recreate` and the rendering changed: deleted and created again.
    Recreate { fields: Vec<FieldChange> },
    /// Observed but no longer rendered: it would be deleted.
    Prune,
    /// Would be pruned, but not in this pass: another write of it fails,
    /// and pruning waits for a pass in which everything applied.
    PruneHeld,
    /// Observed but no longer rendered, `deletionPolicy: retain`: released
    /// (kept, with nothing of trellis's left), not deleted.
    Release,
    /// Nothing would change (or `createOnly` and it exists).
    Unchanged,
    /// The pass would fail on this child (a foreign owner, the API server
    /// refusing the apply): why.
    Refused { why: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChildDiff {
    pub id: String,
    pub key: ObjectKey,
    pub change: ChildChange,
}

/// What one pass would do for one parent under one rule.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParentDiff {
    pub rule: String,
    /// `Kind namespace/name`.
    pub parent: String,
    /// Why the operator would do nothing at all for this parent (paused,
    /// being deleted, outside the rule's namespaces/selector).
    pub skipped: Option<String>,
    pub children: Vec<ChildDiff>,
    pub pending: Vec<Pending>,
    /// Changes of the parent itself: its `.status`, the cleanup finalizer.
    pub parent_fields: Vec<FieldChange>,
    /// What the pass would fail on (render, validation): `Synced=False`.
    pub errors: Vec<String>,
}

impl ParentDiff {
    /// Whether the pass would change anything on the cluster.
    pub fn changes(&self) -> bool {
        !self.parent_fields.is_empty()
            || self
                .children
                .iter()
                .any(|c| !matches!(c.change, ChildChange::Unchanged | ChildChange::PruneHeld))
    }

    /// Whether the pass would fail.
    pub fn failed(&self) -> bool {
        !self.errors.is_empty()
            || self
                .children
                .iter()
                .any(|c| matches!(c.change, ChildChange::Refused { .. }))
    }
}

/// Exit code of `trellis diff`: 0 nothing would change, 1 something would,
/// 2 a pass would fail.
pub fn exit_code(diffs: &[ParentDiff]) -> u8 {
    if diffs.iter().any(ParentDiff::failed) {
        2
    } else if diffs.iter().any(ParentDiff::changes) {
        1
    } else {
        0
    }
}

/// Metadata the API server maintains by itself: it changes on every write
/// and says nothing about what trellis sets.
const VOLATILE_METADATA: &[&str] = &[
    "resourceVersion",
    "generation",
    "managedFields",
    "creationTimestamp",
    "uid",
    "selfLink",
];

/// The changes between a live object and what it would become, leaving out
/// server-maintained metadata and `.status` (controllers write that, not an
/// apply).
pub fn object_changes(live: &Value, after: &Value) -> Vec<FieldChange> {
    field_changes(&comparable(live), &comparable(after))
}

fn comparable(obj: &Value) -> Value {
    let mut obj = obj.clone();
    if let Some(map) = obj.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for key in VOLATILE_METADATA {
                meta.remove(*key);
            }
        }
    }
    obj
}

/// Every leaf that differs between `before` and `after`, in path order.
pub fn field_changes(before: &Value, after: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    walk(&mut String::new(), Some(before), Some(after), &mut out);
    out
}

fn walk(
    path: &mut String,
    before: Option<&Value>,
    after: Option<&Value>,
    out: &mut Vec<FieldChange>,
) {
    match (before, after) {
        (Some(Value::Object(b)), Some(Value::Object(a))) => {
            let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let len = path.len();
                push_key(path, k);
                walk(path, b.get(k), a.get(k), out);
                path.truncate(len);
            }
        }
        (Some(Value::Array(b)), Some(Value::Array(a))) => match (keyed(b), keyed(a)) {
            (Some((field, kb)), Some((field_a, ka))) if field == field_a => {
                walk_keyed(path, field, &kb, &ka, out)
            }
            (None, Some((field, ka))) if b.is_empty() => walk_keyed(path, field, &[], &ka, out),
            (Some((field, kb)), None) if a.is_empty() => walk_keyed(path, field, &kb, &[], out),
            _ => {
                for i in 0..b.len().max(a.len()) {
                    let len = path.len();
                    let _ = write!(path, "[{i}]");
                    walk(path, b.get(i), a.get(i), out);
                    path.truncate(len);
                }
            }
        },
        (b, a) if b == a => {}
        // A map or list added or removed as a whole: shown leaf by leaf.
        (None, Some(Value::Object(a))) if !a.is_empty() => {
            walk(path, Some(&Value::Object(Map::new())), after, out)
        }
        (Some(Value::Object(b)), None) if !b.is_empty() => {
            walk(path, before, Some(&Value::Object(Map::new())), out)
        }
        (None, Some(Value::Array(a))) if !a.is_empty() => {
            walk(path, Some(&Value::Array(Vec::new())), after, out)
        }
        (Some(Value::Array(b)), None) if !b.is_empty() => {
            walk(path, before, Some(&Value::Array(Vec::new())), out)
        }
        (b, a) => out.push(FieldChange {
            path: if path.is_empty() {
                ".".into()
            } else {
                path.clone()
            },
            before: b.cloned(),
            after: a.cloned(),
        }),
    }
}

/// Two lists keyed by `field`, element by element in name order.
fn walk_keyed(
    path: &mut String,
    field: &str,
    before: &[(&str, &Value)],
    after: &[(&str, &Value)],
    out: &mut Vec<FieldChange>,
) {
    fn find<'v>(list: &[(&str, &'v Value)], name: &str) -> Option<&'v Value> {
        list.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
    let mut names: Vec<&str> = before.iter().chain(after).map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let len = path.len();
        let _ = write!(path, "[{field}={name}]");
        walk(path, find(before, name), find(after, name), out);
        path.truncate(len);
    }
}

/// A list whose elements are all objects with a distinct string `name` (or
/// `type`, for conditions) is shown keyed by it: `containers[name=web]`
/// reads better than `containers[0]` and survives reordering.
fn keyed(list: &[Value]) -> Option<(&'static str, Vec<(&str, &Value)>)> {
    ["name", "type"].into_iter().find_map(|field| {
        let items: Option<Vec<(&str, &Value)>> = list
            .iter()
            .map(|v| Some((v.get(field)?.as_str()?, v)))
            .collect();
        let items = items.filter(|i| !i.is_empty())?;
        let mut names: Vec<&str> = items.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        (names.len() == items.len()).then_some((field, items))
    })
}

fn show(v: &Option<Value>) -> String {
    match v {
        None => "(none)".into(),
        Some(v) => v.to_string(),
    }
}

pub(crate) fn write_fields(out: &mut String, fields: &[FieldChange]) {
    for f in fields {
        let _ = match (&f.before, &f.after) {
            (None, Some(_)) => writeln!(out, "      + {}: {}", f.path, show(&f.after)),
            (Some(_), None) => writeln!(out, "      - {}: {}", f.path, show(&f.before)),
            _ => writeln!(
                out,
                "      ~ {}: {} -> {}",
                f.path,
                show(&f.before),
                show(&f.after)
            ),
        };
    }
}

/// The fields a created object would have, without the metadata every
/// child carries (labels, owner reference) and server-maintained fields.
fn created_fields(object: &Value) -> Vec<FieldChange> {
    let mut obj = comparable(object);
    if let Some(map) = obj.as_object_mut() {
        map.remove("apiVersion");
        map.remove("kind");
        map.remove("metadata");
    }
    field_changes(&Value::Object(Map::new()), &obj)
}

/// The human-readable report: one block per parent, one line per child that
/// would change, its fields indented below.
pub fn print(diffs: &[ParentDiff]) -> String {
    let mut out = String::new();
    for d in diffs {
        let _ = writeln!(out, "{} (rule {})", d.parent, d.rule);
        if let Some(why) = &d.skipped {
            let _ = writeln!(out, "  skipped: {why}");
            continue;
        }
        let mut unchanged = 0;
        for c in &d.children {
            let head = |sign: &str, what: &str| format!("  {sign} {} {}{what}\n", c.id, c.key);
            match &c.change {
                ChildChange::Unchanged => unchanged += 1,
                ChildChange::Create { object } => {
                    out.push_str(&head("+", " (create)"));
                    write_fields(&mut out, &created_fields(object));
                }
                ChildChange::Update { fields } => {
                    out.push_str(&head("~", ""));
                    write_fields(&mut out, fields);
                }
                ChildChange::Recreate { fields } => {
                    out.push_str(&head("!", " (recreate: delete, then create)"));
                    write_fields(&mut out, fields);
                }
                ChildChange::Prune => out.push_str(&head("-", " (prune)")),
                ChildChange::Release => {
                    out.push_str(&head("-", " (release: deletionPolicy retain, kept)"))
                }
                ChildChange::PruneHeld => out.push_str(&head(
                    "-",
                    " (prune, in the first pass in which no write fails)",
                )),
                ChildChange::Refused { why } => {
                    out.push_str(&head("x", ""));
                    let _ = writeln!(out, "      error: {why}");
                }
            }
        }
        for p in &d.pending {
            let _ = writeln!(out, "  . {} held back: {}", p.id, p.describe());
        }
        if !d.parent_fields.is_empty() {
            out.push_str("  ~ the parent\n");
            write_fields(&mut out, &d.parent_fields);
        }
        for e in &d.errors {
            let _ = writeln!(out, "  error: {e}");
        }
        if !d.changes() && d.errors.is_empty() {
            let _ = writeln!(out, "  no changes ({unchanged} children unchanged)");
        } else if unchanged > 0 {
            let _ = writeln!(out, "  ({unchanged} children unchanged)");
        }
    }
    if diffs.is_empty() {
        out.push_str("no parents\n");
    }
    out
}

#[cfg(test)]
mod tests;
