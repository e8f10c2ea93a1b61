//! One child in one pass: its `includeWhen`, whether the children it
//! depends on are ready, its `forEach` items, and each item's render into
//! the object to apply ([`finish_object`] enforces kind, name, namespace,
//! labels and owner).
//!
//! Related entries holding the child back, readiness, status and pruning
//! are decided by `plan` around it.

use std::collections::BTreeMap;

use super::items::for_each_items;
use super::object::finish_object;
use super::parent::ParentInfo;
use super::{Apply, Input};
use crate::render::RenderError;
use crate::rules::{CompiledChild, CompiledRule};
use crate::yaml;
use minijinja::context;

/// What happened to one child in this pass.
pub(super) enum Outcome {
    Excluded,
    Pending,
    Failed,
    /// Rendered; `Err` names why the child is not ready yet.
    Rendered(Result<(), String>),
}

/// Why an entry waits for the `noun` `dep` (a child, or a patch) that came
/// to `outcome` in this pass; `None` when it need not wait.
pub(super) fn waiting_for(outcome: Option<&Outcome>, noun: &str, dep: &str) -> Option<String> {
    let why = match outcome {
        Some(Outcome::Excluded) | Some(Outcome::Rendered(Ok(()))) => return None,
        Some(Outcome::Rendered(Err(why))) => why.clone(),
        Some(Outcome::Pending) => format!("{noun} \"{dep}\" is itself waiting"),
        Some(Outcome::Failed) => format!("{noun} \"{dep}\" failed to render"),
        None => format!("{noun} \"{dep}\" was not planned"),
    };
    Some(format!("waiting for {noun} \"{dep}\": {why}"))
}

/// A `forEach` element and its position in the list.
pub(super) type Item = (minijinja::Value, usize);

/// What [`plan_child`] decided for one child (`T`: [`Apply`]), or
/// [`plan_entry`] for one patch.
pub(super) enum ChildResult<T = Apply> {
    Excluded,
    /// Held back: a sentence for a dependency; a reason and a message
    /// naming the cluster for a child whose cluster cannot be reached.
    Pending {
        reason: String,
        message: Option<String>,
    },
    /// Each object with the `forEach` item it was rendered from, which its
    /// `readyWhen` sees too.
    Rendered(Vec<(T, Option<Item>)>),
}

/// Decides one child no related entry holds back, against `outcome` (what
/// became of the children before it): excluded, waiting for a child it
/// depends on, or its objects rendered. `Err`: an expression or a render
/// failed.
pub(super) fn plan_child(
    rule: &CompiledRule,
    child: &CompiledChild,
    base: &minijinja::Value,
    info: &ParentInfo,
    input: &Input,
    outcome: &BTreeMap<usize, Outcome>,
) -> Result<ChildResult, RenderError> {
    // `cluster:` after `includeWhen` (an excluded child is nowhere), before
    // its dependencies: a child whose cluster cannot be reached says so.
    let cluster = match plan_entry_included(rule, child, "child", base)? {
        false => return Ok(ChildResult::Excluded),
        true => child_cluster(rule, child, base)?,
    };
    if let Some(held) = input.clusters.hold(cluster.as_deref()) {
        return Ok(ChildResult::Pending {
            reason: held.reason.to_owned(),
            message: Some(held.message),
        });
    }
    let finish = |object, what: &str| {
        finish_object(rule, child, object, info, input, cluster.as_deref(), what)
    };
    plan_included(rule, child, "child", base, outcome, &|| None, &finish)
}

/// Whether the entry's `includeWhen` (if any) holds.
fn plan_entry_included(
    rule: &CompiledRule,
    child: &CompiledChild,
    noun: &str,
    base: &minijinja::Value,
) -> Result<bool, RenderError> {
    let Some(expr) = child.include_when else {
        return Ok(true);
    };
    let id = &child.spec.id;
    rule.engine
        .eval_bool(expr, base, &format!("includeWhen of {noun} \"{id}\""))
}

/// The spoke a child is placed in for this parent (`None`: the hub), from
/// its `cluster:` expression.
fn child_cluster(
    rule: &CompiledRule,
    child: &CompiledChild,
    base: &minijinja::Value,
) -> Result<Option<String>, RenderError> {
    let Some(expr) = child.cluster else {
        return Ok(None);
    };
    let what = format!("cluster of child \"{}\"", child.spec.id);
    let value = rule.engine.eval(expr, base, &what)?;
    let fail = |message: String| RenderError {
        what: what.clone(),
        message,
    };
    let Some(name) = value.as_str() else {
        return Err(fail(format!(
            "must be a cluster name (a string), not {}",
            value.kind()
        )));
    };
    crate::clusters::placement(name).map_err(fail)
}

impl<T> ChildResult<T> {
    /// Held back by a dependency (`why`, a sentence).
    fn waiting(why: String) -> ChildResult<T> {
        ChildResult::Pending {
            reason: why,
            message: None,
        }
    }
}

/// [`plan_child`] for a child or a patch (`noun`): `waiting` names what
/// else it waits for (a patch: other patches), `finish` turns each rendered
/// mapping into what the caller keeps.
pub(super) fn plan_entry<T>(
    rule: &CompiledRule,
    child: &CompiledChild,
    noun: &str,
    base: &minijinja::Value,
    outcome: &BTreeMap<usize, Outcome>,
    waiting: &dyn Fn() -> Option<String>,
    finish: &dyn Fn(serde_json::Value, &str) -> Result<T, RenderError>,
) -> Result<ChildResult<T>, RenderError> {
    if !plan_entry_included(rule, child, noun, base)? {
        return Ok(ChildResult::Excluded);
    }
    plan_included(rule, child, noun, base, outcome, waiting, finish)
}

/// [`plan_entry`] past its `includeWhen`.
fn plan_included<T>(
    rule: &CompiledRule,
    child: &CompiledChild,
    noun: &str,
    base: &minijinja::Value,
    outcome: &BTreeMap<usize, Outcome>,
    waiting: &dyn Fn() -> Option<String>,
    finish: &dyn Fn(serde_json::Value, &str) -> Result<T, RenderError>,
) -> Result<ChildResult<T>, RenderError> {
    let id = &child.spec.id;
    let engine = &rule.engine;
    for &d in &child.depends_on {
        if let Some(why) = waiting_for(outcome.get(&d), "child", &rule.children[d].spec.id) {
            return Ok(ChildResult::waiting(why));
        }
    }
    if let Some(why) = waiting() {
        return Ok(ChildResult::waiting(why));
    }
    let items: Vec<Option<Item>> = match &child.for_each {
        None => vec![None],
        Some(for_each) => {
            let what = format!("forEach of {noun} \"{id}\"");
            for_each_items(engine, for_each, base, &what)?
                .into_iter()
                .map(Some)
                .collect()
        }
    };
    let what = format!("template of {noun} \"{id}\"");
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
        applies.push((finish(object, &what)?, item));
    }
    Ok(ChildResult::Rendered(applies))
}
