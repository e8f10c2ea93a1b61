//! Readiness of rendered children, and the parent's new status: fields,
//! `Ready`, `Synced` and the rule's own conditions.

use std::collections::BTreeMap;

use minijinja::context;
use serde_json::{Map, Value, json};

use super::rule_conditions::rule_conditions;
use super::*;
use crate::render::{self, RenderError};
use crate::rules::{CompiledChild, CompiledRule, FieldSource};
use crate::status::{self, Condition};

/// Readiness of a rendered child (every object, for a `forEach` child)
/// against what is observed: `Ok(Err(why))` names the first object that is
/// not ready; `each` gets every object's key with its readiness (the
/// inventory's). A `readyWhen` that fails (a missing value, a non-boolean)
/// is `Err`: an error of the pass, as a failed `includeWhen` is, never "not
/// ready".
pub(super) fn child_ready(
    rule: &CompiledRule,
    child: &CompiledChild,
    base: &minijinja::Value,
    observed: &BTreeMap<String, Vec<(&ObjectKey, &Value)>>,
    rendered: &[(Apply, Option<Item>)],
    each: &mut BTreeMap<ObjectKey, bool>,
) -> Result<Result<(), String>, RenderError> {
    let mut ready = Ok(());
    // Every object is looked at, not only up to the first one that is not
    // ready, so that a failing `readyWhen` on a later item is reported.
    for (apply, item) in rendered {
        let this = object_ready(rule, child, base, observed, apply, item.as_ref())?;
        each.insert(apply.key.clone(), this.is_ok());
        if ready.is_ok() {
            ready = this;
        }
    }
    Ok(ready)
}

/// Readiness of one rendered object against what is observed.
fn object_ready(
    rule: &CompiledRule,
    child: &CompiledChild,
    base: &minijinja::Value,
    observed: &BTreeMap<String, Vec<(&ObjectKey, &Value)>>,
    apply: &Apply,
    item: Option<&Item>,
) -> Result<Result<(), String>, RenderError> {
    let found = observed
        .get(&child.spec.id)
        .and_then(|objs| objs.iter().find(|(k, _)| **k == apply.key))
        .map(|(_, o)| *o);
    let Some(obj) = found else {
        return Ok(Err(format!("{} does not exist yet", apply.key)));
    };
    let Some(expr) = child.ready_when else {
        return Ok(
            status::default_ready(obj).map_err(|why| format!("{} is not ready: {why}", apply.key))
        );
    };
    let ctx = match item {
        None => context! { self => render::to_value(obj), ..base.clone() },
        Some((item, index)) => context! {
            self => render::to_value(obj),
            item => item.clone(),
            index => *index,
            ..base.clone()
        },
    };
    let what = match item {
        None => format!("readyWhen of child \"{}\"", child.spec.id),
        Some((_, index)) => format!("readyWhen of child \"{}\" (item {index})", child.spec.id),
    };
    Ok(if rule.engine.eval_bool(expr, &ctx, &what)? {
        Ok(())
    } else {
        Err(format!(
            "{} is not ready: readyWhen `{}` is false",
            apply.key,
            render::one_line(rule.engine.expression_source(expr))
        ))
    })
}

pub(super) fn status_for_failure(
    rule: &CompiledRule,
    input: &Input,
    info: &ParentInfo,
    plan: &Plan,
) -> Option<Value> {
    if !rule.writes_status() {
        return None;
    }
    let reason = plan
        .failure_reason
        .unwrap_or(FailureReason::RenderError)
        .as_str();
    let message = plan.errors.join("; ");
    let ours = [
        Condition::new("Ready", false, reason, message.clone()),
        Condition::new("Synced", false, reason, message),
    ];
    let previous = input.parent.get("status");
    let mut out = previous.cloned().unwrap_or_else(|| json!({}));
    if !out.is_object() {
        out = json!({});
    }
    out["ruleRevision"] = json!(rule.revision);
    match info.generation {
        Some(generation) => out["observedGeneration"] = json!(generation),
        None => {
            if let Some(o) = out.as_object_mut() {
                o.remove("observedGeneration");
            }
        }
    }
    out["conditions"] = status::merge_conditions(
        previous.and_then(|s| s.get("conditions")),
        &ours,
        info.generation,
        input.now,
    );
    Some(out)
}

/// What became of the vars, and of the children and the patches by index,
/// in a pass.
pub(super) struct Outcomes<'a> {
    pub vars: &'a super::vars::Vars,
    pub children: &'a BTreeMap<usize, Outcome>,
    pub patches: &'a BTreeMap<usize, Outcome>,
    /// `status.children`, when the rule keeps an inventory.
    pub inventory: Option<super::inventory::Inventory>,
}

pub(super) fn build_status(
    rule: &CompiledRule,
    input: &Input,
    info: &ParentInfo,
    plan: &Plan,
    outcome: &Outcomes,
    base: &minijinja::Value,
    children: &Children,
) -> (Value, Vec<String>) {
    let mut errors: Vec<String> = Vec::new();
    let mut out = Map::new();
    if let Some(generation) = info.generation {
        out.insert("observedGeneration".into(), json!(generation));
    }
    out.insert("ruleRevision".into(), json!(rule.revision));

    // Fields.
    for field in &rule.fields {
        let value = match &field.source {
            FieldSource::JsonPath { child, .. } => match children.json(child) {
                Some(root) => status::json_path_value(field, &root),
                None => status::json_path_unobserved(field),
            },
            FieldSource::Value(expr) => {
                let what = format!("status field `{}`", field.path.join("."));
                let value = match outcome.vars.withheld(&field.reads_vars, &what) {
                    Some(err) => Err(err),
                    None => rule.engine.eval(*expr, base, &what),
                };
                match value.and_then(|v| {
                    render::to_json(&v).map_err(|e| RenderError {
                        what,
                        message: e.to_string(),
                    })
                }) {
                    Ok(v) => Some(v),
                    Err(err) => {
                        errors.push(err.to_string());
                        None
                    }
                }
            }
        };
        if let Some(value) = value.or_else(|| field.default.clone()) {
            status::set_path(&mut out, &field.path, value);
        }
    }

    if let Some(inventory) = &outcome.inventory {
        inventory.write(&mut out);
    }

    // Conditions: Ready, Synced, then the rule's own.
    let mut ours = vec![ready_condition(rule, plan, outcome)];
    let decided = rule_conditions(rule, outcome.vars, base);
    errors.extend(decided.errors.iter().cloned());
    let mut all_errors = plan.errors.clone();
    all_errors.extend(errors.iter().cloned());
    let synced = if !all_errors.is_empty() {
        Condition::new(
            "Synced",
            false,
            plan.failure_reason
                .unwrap_or(FailureReason::RenderError)
                .as_str(),
            all_errors.join("; "),
        )
    } else if let Some(p) = plan.pending.first() {
        let reason = match p.message {
            Some(_) => p.reason.as_str(),
            None => "DependencyNotReady",
        };
        let why = p.message.as_deref().unwrap_or(&p.reason);
        let noun = if rule.patch(&p.id).is_some() {
            "patch"
        } else {
            "child"
        };
        Condition::new(
            "Synced",
            false,
            reason,
            format!("{noun} \"{}\" held back: {why}", p.id),
        )
    } else {
        Condition::new("Synced", true, "Applied", "all children applied")
    };
    ours.push(synced);
    ours.extend(decided.conditions.iter().cloned());
    let previous = input.parent.get("status");
    let previous = decided.without_retired(rule, previous.and_then(|s| s.get("conditions")));
    out.insert(
        "conditions".into(),
        status::merge_conditions(previous.as_ref(), &ours, info.generation, input.now),
    );
    (Value::Object(out), errors)
}

fn ready_condition(rule: &CompiledRule, plan: &Plan, outcome: &Outcomes) -> Condition {
    if let Some(reason) = plan.failure_reason {
        return Condition::new("Ready", false, reason.as_str(), plan.errors.join("; "));
    }
    let children = rule
        .order
        .iter()
        .map(|&i| ("child", &rule.children[i].spec.id, outcome.children.get(&i)));
    let patches = rule
        .patch_order
        .iter()
        .map(|&i| ("patch", &rule.patches[i].spec.id, outcome.patches.get(&i)));
    for (noun, id, outcome) in children.chain(patches) {
        match outcome {
            Some(Outcome::Rendered(Err(why))) => {
                let reason = if noun == "patch" {
                    "PatchNotReady"
                } else {
                    "ChildNotReady"
                };
                return Condition::new("Ready", false, reason, format!("{noun} \"{id}\": {why}"));
            }
            Some(Outcome::Pending) => {
                let pending = plan.pending.iter().find(|p| &p.id == id);
                // Held back by a related entry, or a missing target: name
                // it, not the child.
                if let Some(Pending {
                    reason,
                    message: Some(message),
                    ..
                }) = pending
                {
                    return Condition::new("Ready", false, reason, message.clone());
                }
                let reason = pending.map(|p| p.reason.clone()).unwrap_or_default();
                return Condition::new(
                    "Ready",
                    false,
                    "DependencyNotReady",
                    format!("{noun} \"{id}\": {reason}"),
                );
            }
            _ => {}
        }
    }
    Condition::new("Ready", true, "AllChildrenReady", "all children are ready")
}
