//! The rule's own conditions in one pass: one per entry, or one per item
//! of a per-item entry (`forEach`, its `type` rendered per item). A type
//! that is not CamelCase, is trellis's own (`Ready`, `Synced`) or was given
//! already in this pass is an error of the pass, never dropped silently.

use std::collections::BTreeMap;

use minijinja::context;
use serde_json::Value;

use super::items::for_each_items;
use super::vars::Vars;
use crate::render::RenderError;
use crate::rules::{CompiledCondition, CompiledRule, is_condition_type};
use crate::status::Condition;

/// The rule's conditions decided in a pass.
pub(super) struct RuleConditions {
    pub conditions: Vec<Condition>,
    pub errors: Vec<String>,
    /// Reasons (`R`, `NotR`) of the per-item entries whose every item was
    /// decided: an earlier condition of theirs that this pass no longer
    /// gives (its item gone) is removed from the parent.
    pub retired: Vec<String>,
}

impl RuleConditions {
    /// `previous` (the parent's conditions) without the conditions of
    /// per-item entries whose item is gone; conditions of other writers
    /// stay.
    pub fn without_retired(&self, rule: &CompiledRule, previous: Option<&Value>) -> Option<Value> {
        let list = previous?.as_array()?;
        let kept = list
            .iter()
            .filter(|c| {
                let type_ = c.get("type").and_then(Value::as_str).unwrap_or_default();
                let reason = c.get("reason").and_then(Value::as_str).unwrap_or_default();
                let ours_now = self.conditions.iter().any(|o| o.type_ == type_)
                    || rule
                        .conditions
                        .iter()
                        .any(|d| d.per_item.is_none() && d.type_ == type_);
                ours_now || !self.retired.iter().any(|r| r == reason)
            })
            .cloned()
            .collect();
        Some(Value::Array(kept))
    }
}

/// Decides every condition of the rule in `base` (the status context).
pub(super) fn rule_conditions(
    rule: &CompiledRule,
    vars: &Vars,
    base: &minijinja::Value,
) -> RuleConditions {
    let mut out = RuleConditions {
        conditions: Vec::new(),
        errors: Vec::new(),
        retired: Vec::new(),
    };
    // Type → where it was given in this pass.
    let mut given: BTreeMap<String, String> = BTreeMap::new();
    for (i, c) in rule.conditions.iter().enumerate() {
        let what = match &c.per_item {
            None => format!("condition {}", c.type_),
            Some(_) => format!("condition spec.status.conditions[{i}]"),
        };
        if let Some(err) = vars.withheld(&c.reads_vars, &what) {
            out.errors.push(err.to_string());
            continue;
        }
        let Some(per_item) = &c.per_item else {
            match decide(rule, c, &c.type_, base, &what) {
                Ok(cond) => {
                    out.take(cond, what, &mut given);
                }
                Err(err) => out.errors.push(err.to_string()),
            }
            continue;
        };
        let items = match for_each_items(
            &rule.engine,
            &per_item.for_each,
            base,
            &format!("forEach of {what}"),
        ) {
            Ok(items) => items,
            Err(err) => {
                out.errors.push(err.to_string());
                continue;
            }
        };
        let mut clean = true;
        for (item, index) in items {
            let ctx = context! { item => item, index => index, ..base.clone() };
            let here = format!("{what} (item {index})");
            let decided = rule
                .engine
                .render(&per_item.type_, &ctx, &format!("type of {here}"))
                .and_then(|type_| checked_type(type_, &here))
                .and_then(|type_| decide(rule, c, &type_, &ctx, &here));
            match decided {
                Ok(cond) => clean &= out.take(cond, here, &mut given),
                Err(err) => {
                    out.errors.push(err.to_string());
                    clean = false;
                }
            }
        }
        if clean {
            out.retired.push(c.reason.clone());
            out.retired.push(format!("Not{}", c.reason));
        }
    }
    out
}

impl RuleConditions {
    /// Keeps `cond` unless its type was given already in this pass (an
    /// error naming both places); false when refused.
    fn take(
        &mut self,
        cond: Condition,
        here: String,
        given: &mut BTreeMap<String, String>,
    ) -> bool {
        if let Some(first) = given.get(&cond.type_) {
            self.errors.push(format!(
                "{here}: condition type `{}` is also given by {first}",
                cond.type_
            ));
            return false;
        }
        given.insert(cond.type_.clone(), here);
        self.conditions.push(cond);
        true
    }
}

/// A rendered per-item type, if it may be one.
fn checked_type(type_: String, here: &str) -> Result<String, RenderError> {
    let fail = |message: String| RenderError {
        what: format!("type of {here}"),
        message,
    };
    if type_ == "Ready" || type_ == "Synced" {
        return Err(fail(format!("`{type_}` is written by trellis itself")));
    }
    if !is_condition_type(&type_) {
        return Err(fail(format!(
            "`{type_}` is not a CamelCase condition type (a letter A-Z, then letters and digits, at most 316)"
        )));
    }
    Ok(type_)
}

/// One condition of type `type_`: its `when` and `message` in `ctx`.
fn decide(
    rule: &CompiledRule,
    c: &CompiledCondition,
    type_: &str,
    ctx: &minijinja::Value,
    what: &str,
) -> Result<Condition, RenderError> {
    let ok = rule
        .engine
        .eval_bool(c.when, ctx, &format!("{what} when"))?;
    let message = match &c.message {
        Some(t) => rule.engine.render(t, ctx, &format!("{what} message"))?,
        None => String::new(),
    };
    Ok(if ok {
        Condition::new(type_, true, &c.reason, message)
    } else {
        Condition::new(type_, false, &format!("Not{}", c.reason), message)
    })
}
