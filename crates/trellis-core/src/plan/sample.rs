//! Every child and patch of a rule rendered once for one parent, whatever
//! holds it back in a real pass: what `check` validates against their
//! kinds' schemas (`crate::conform`).
//!
//! A pass renders a child only when the children and related entries it
//! depends on are there and ready; a sample parent has none of them, so
//! that would leave most children unseen. Here every child is rendered in
//! dependency order as if its dependencies were ready, reading whatever
//! `children.*` and `related.*` the observed objects give (often nothing:
//! a template that needs them then fails to render and is reported as not
//! reached). `includeWhen` is still obeyed: an excluded child is a branch
//! this parent does not take.

use std::collections::BTreeMap;

use minijinja::context;
use serde_json::Value;

use super::child::{ChildResult, Outcome, plan_child};
use super::children::{Children, with_children};
use super::parent::{ParentInfo, effective_spec, parent_context, scope_error, with_spec};
use super::vars::Vars;
use super::{Input, related};
use crate::render;
use crate::rules::CompiledRule;

/// What became of one child with the sample parent.
#[derive(Debug)]
pub enum Sampled {
    /// The objects it renders (one per `forEach` item), as they would be
    /// applied.
    Rendered(Vec<Value>),
    /// Its `includeWhen` is false for this parent.
    Excluded,
    /// An expression or its template failed for this parent (often: it
    /// reads a child or related object the sample does not have).
    Failed(String),
    /// It reads a var that has no value for this parent (one that failed,
    /// which [`Sample::vars`] holds).
    Withheld(String),
}

/// What a rule renders for one parent.
#[derive(Debug, Default)]
pub struct Sample {
    /// Each child (by index into `rule.children`, in dependency order).
    pub children: Vec<(usize, Sampled)>,
    /// The bodies each patch renders (by index into `rule.patches`), its
    /// target found or not; a patch that renders nothing is left out.
    pub patches: Vec<(usize, Vec<Value>)>,
    /// Each patch that failed for this parent (by index), and why; one
    /// that reads a var without a value is left out.
    pub failed_patches: Vec<(usize, String)>,
    /// Each var that failed for this parent (by index into `rule.vars`),
    /// and why.
    pub vars: Vec<(usize, String)>,
}

/// Every child and patch rendered for `input.parent`; `Err` when the
/// parent itself is refused (its spec fails the rule's schema, its
/// namespace its kind's scope, a related entry refuses the read).
pub fn render_children(rule: &CompiledRule, input: &Input) -> Result<Sample, Vec<String>> {
    if !input.parent.is_object() {
        return Err(vec!["the parent is not an object".into()]);
    }
    let info = ParentInfo::of(input.parent);
    if let Some(error) = scope_error(rule, &info, input) {
        return Err(vec![error]);
    }
    let parent = with_spec(input.parent, effective_spec(rule, input.parent)?);
    // The context as `plan` builds it (see there): parent, related, vars,
    // children.
    let observed = input.observed.children_of(&rule.name, &info.uid);
    let mut children = Children::observed(rule, &observed);
    let parent_ctx = parent_context(rule, &parent);
    let resolved = related::resolve(rule, &parent_ctx, &info, input)
        .map_err(|failure| vec![failure.error.to_string()])?;
    let reads_ctx = context! {
        related => render::to_value(&resolved.context),
        ..parent_ctx
    };
    // As in a pass, a var that fails withholds itself from whatever reads it.
    let vars = Vars::evaluate(rule, &with_children(&reads_ctx, &children));
    let fixed = context! { vars => minijinja::Value::from(vars.values.clone()), ..reads_ctx };
    let mut base = with_children(&fixed, &children);

    // Every dependency reads as ready, so no child waits.
    let ready: BTreeMap<usize, Outcome> = (0..rule.children.len())
        .map(|i| (i, Outcome::Rendered(Ok(()))))
        .collect();
    let mut out = Vec::with_capacity(rule.children.len());
    for &i in &rule.order {
        let child = &rule.children[i];
        let id = &child.spec.id;
        if let Some(err) = vars.withheld(&child.reads_vars, &format!("child \"{id}\"")) {
            out.push((i, Sampled::Withheld(err.to_string())));
            continue;
        }
        let sampled = match plan_child(rule, child, &base, &info, input, &ready) {
            Ok(ChildResult::Rendered(rendered)) => {
                if children.rendered(id, rendered.iter().map(|(a, _)| &a.key)) {
                    base = with_children(&fixed, &children);
                }
                Sampled::Rendered(rendered.into_iter().map(|(a, _)| a.object).collect())
            }
            Ok(ChildResult::Excluded) => {
                if children.excluded(id) {
                    base = with_children(&fixed, &children);
                }
                Sampled::Excluded
            }
            // Not reached: every dependency reads as ready.
            Ok(ChildResult::Pending { reason, message }) => {
                Sampled::Failed(message.unwrap_or(reason))
            }
            Err(err) => Sampled::Failed(err.to_string()),
        };
        out.push((i, sampled));
    }
    // Patches after the children, as in a pass; no related entry holds
    // them back. A patch waiting for another whose target the sample lacks
    // renders nothing.
    let patched = super::patch::plan_patches(rule, &base, &info, input, &ready, &[], &vars);
    let failed_patches = patched
        .outcome
        .iter()
        .filter(|(_, outcome)| matches!(outcome, Outcome::Failed))
        .filter_map(|(&i, _)| {
            let patch = &rule.patches[i];
            // The pass's errors name the patch they are about.
            let named = format!("patch \"{}\"", patch.spec.id);
            let why = patched.errors.iter().find(|e| e.contains(&named))?;
            let withheld = vars.withheld(&patch.reads_vars, &named).is_some();
            (!withheld).then(|| (i, why.clone()))
        })
        .collect();
    let mut patches: Vec<(usize, Vec<Value>)> = Vec::new();
    for apply in patched.apply {
        let Some(i) = rule.patches.iter().position(|p| p.spec.id == apply.id) else {
            continue;
        };
        match patches.iter_mut().find(|(j, _)| *j == i) {
            Some((_, bodies)) => bodies.push(apply.object),
            None => patches.push((i, vec![apply.object])),
        }
    }
    let vars = vars
        .errors()
        .filter_map(|(name, err)| {
            let i = rule.vars.iter().position(|v| v.name == name)?;
            Some((i, err.to_string()))
        })
        .collect();
    Ok(Sample {
        children: out,
        patches,
        failed_patches,
        vars,
    })
}
