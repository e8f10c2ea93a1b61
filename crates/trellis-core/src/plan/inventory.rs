//! `status.inventory: true`: the parent's `status.children`, one entry per
//! child object `{id, apiVersion, kind, namespace, name, ready}`, children
//! in the rule's declaration order and a `forEach` child's objects in item
//! order; at most [`MAX_INVENTORY`], then `status.childrenTruncated` says
//! how many are left out.
//!
//! The objects are those the parent has after the pass: what it rendered
//! (`ready` as readiness judged them: an object not created yet is not
//! ready), and what a child held back or failed in this pass keeps
//! (`ready: false`: not judged in this pass). An excluded child's objects
//! are about to be pruned and are not listed.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::child::Outcome;
use super::{ObjectKey, Plan};
use crate::rules::CompiledRule;

/// Most entries of `status.children`.
pub const MAX_INVENTORY: usize = 100;

/// `status.children` and `status.childrenTruncated` of one pass.
pub(super) struct Inventory {
    entries: Vec<Value>,
    truncated: usize,
}

impl Inventory {
    /// Writes the inventory under `status`; `childrenTruncated` only when
    /// something is left out.
    pub fn write(&self, status: &mut Map<String, Value>) {
        status.insert("children".into(), Value::Array(self.entries.clone()));
        if self.truncated > 0 {
            status.insert("childrenTruncated".into(), json!(self.truncated));
        }
    }
}

/// The inventory of a pass (`None` when the rule keeps none): `plan`'s
/// applies, each child's `outcome`, the `observed` objects by child id and
/// the readiness of each rendered object.
pub(super) fn entries(
    rule: &CompiledRule,
    plan: &Plan,
    outcome: &BTreeMap<usize, Outcome>,
    observed: &BTreeMap<String, Vec<(&ObjectKey, &Value)>>,
    ready: &BTreeMap<ObjectKey, bool>,
) -> Option<Inventory> {
    if !rule.rule.spec.status.as_ref().is_some_and(|s| s.inventory) {
        return None;
    }
    let mut all = Vec::new();
    for (i, child) in rule.children.iter().enumerate() {
        let id = &child.spec.id;
        match outcome.get(&i) {
            Some(Outcome::Rendered(_)) => {
                for a in plan.apply.iter().filter(|a| &a.id == id) {
                    let api_version = a.object.get("apiVersion").cloned().unwrap_or_default();
                    let ready = ready.get(&a.key).copied().unwrap_or(false);
                    all.push(entry(id, api_version, &a.key, ready));
                }
            }
            Some(Outcome::Excluded) => {}
            // Held back, failed, or not planned: what it has is kept.
            _ => {
                for (key, obj) in observed.get(id).into_iter().flatten() {
                    let api_version = obj.get("apiVersion").cloned().unwrap_or_default();
                    all.push(entry(id, api_version, key, false));
                }
            }
        }
    }
    let truncated = all.len().saturating_sub(MAX_INVENTORY);
    all.truncate(MAX_INVENTORY);
    Some(Inventory {
        entries: all,
        truncated,
    })
}

fn entry(id: &str, api_version: Value, key: &ObjectKey, ready: bool) -> Value {
    let mut e = Map::new();
    e.insert("id".into(), json!(id));
    e.insert("apiVersion".into(), api_version);
    e.insert("kind".into(), json!(key.kind));
    if let Some(ns) = &key.namespace {
        e.insert("namespace".into(), json!(ns));
    }
    e.insert("name".into(), json!(key.name));
    e.insert("ready".into(), json!(ready));
    Value::Object(e)
}
