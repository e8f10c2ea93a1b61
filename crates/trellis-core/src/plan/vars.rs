//! `vars:` in a pass: each computed once, in declaration order, before any
//! child, seeing the parent, `related`, `children` and the vars before it.
//!
//! A var that fails is an error of the pass, reported once and naming the
//! var. It then has no value in this pass, and neither has a later var
//! that reads it: that one did not fail, it is withheld, and is not
//! reported on its own. The vars before the failing one, and the later
//! ones that do not read it, keep their values, so whatever reads only
//! them renders as usual. Whatever reads a var without a value — a child,
//! a patch, a status field or condition, by name or through `vars` read
//! whole — is an error naming that var and why, instead of being rendered
//! without it (a `| default` would hide the failure). What each piece of
//! code reads is found when the rule is compiled ([`VarReads`]).
//!
//! A `template:` var whose text writes a block sequence (`- ` items) or
//! mapping (`key:` lines) and that renders no YAML node — its loop had no
//! items, its `if` was false — is `[]` or `{}`, not the null of an empty
//! document ([`shape`]); one whose text writes neither stays as YAML reads
//! it.
//!
//! What an error does to the pass (nothing is pruned) is `plan`'s to decide.

use std::collections::BTreeMap;

use crate::render::{self, RenderError, shape};
use crate::rules::{CompiledRule, VarReads, VarSource};
use crate::yaml;

/// The rule's vars in one pass.
#[derive(Debug, Default)]
pub(super) struct Vars {
    /// The vars that have a value, by name.
    pub values: BTreeMap<String, minijinja::Value>,
    /// The vars without a value, in declaration order, and why.
    missing: Vec<(String, Missing)>,
}

/// Why a var has no value in this pass.
#[derive(Debug)]
enum Missing {
    /// Its own evaluation failed.
    Failed(RenderError),
    /// It reads this earlier var, which has no value.
    Reads(String),
}

/// The context of a conversion template reading `reads` (`toHub` or
/// `fromHub`, named `what`): `parent_context` of `object`, with the vars it
/// reads. Only vars that need no pass can be read there (the compiler sees
/// to it); one that fails is the conversion's error, naming the var.
pub fn conversion_context(
    rule: &CompiledRule,
    object: &serde_json::Value,
    reads: &VarReads,
    what: &str,
) -> Result<minijinja::Value, RenderError> {
    let ctx = super::parent::parent_context(rule, object);
    if !reads.any && reads.names.is_empty() {
        return Ok(ctx);
    }
    let vars = Vars::evaluate(rule, &ctx);
    if let Some(err) = vars.withheld(reads, what) {
        return Err(err);
    }
    Ok(minijinja::context! { vars => minijinja::Value::from(vars.values), ..ctx })
}

impl Vars {
    /// Evaluates every var of `rule` in order; `ctx` is the pass's context
    /// without `vars`.
    pub fn evaluate(rule: &CompiledRule, ctx: &minijinja::Value) -> Vars {
        let mut vars = Vars::default();
        for var in &rule.vars {
            if let Some(first) = vars.first_missing(&var.reads) {
                let first = first.to_owned();
                vars.missing.push((var.name.clone(), Missing::Reads(first)));
                continue;
            }
            let here = minijinja::context! {
                vars => minijinja::Value::from(vars.values.clone()),
                ..ctx.clone()
            };
            match evaluate_one(rule, &var.name, &var.source, &here) {
                Ok(value) => {
                    vars.values.insert(var.name.clone(), value);
                }
                Err(err) => {
                    vars.missing.push((var.name.clone(), Missing::Failed(err)));
                }
            }
        }
        vars
    }

    /// Each var whose own evaluation failed, with its error, in declaration
    /// order: the errors of the pass (a withheld var is not one).
    pub fn errors(&self) -> impl Iterator<Item = (&str, &RenderError)> {
        self.missing.iter().filter_map(|(name, why)| match why {
            Missing::Failed(err) => Some((name.as_str(), err)),
            Missing::Reads(_) => None,
        })
    }

    /// The error of `reader` (e.g. child "web", status field `url`) when
    /// code that `reads` reads a var without a value: the first such var
    /// in declaration order, and why it has none.
    pub fn withheld(&self, reads: &VarReads, reader: &str) -> Option<RenderError> {
        let first = self.first_missing(reads)?;
        Some(RenderError {
            what: reader.to_owned(),
            message: self.why(first),
        })
    }

    fn first_missing(&self, reads: &VarReads) -> Option<&str> {
        self.missing
            .iter()
            .map(|(name, _)| name.as_str())
            .find(|name| reads.reads(name))
    }

    /// `reads var `b`, which reads var `a`, which failed in this pass`.
    fn why(&self, first: &str) -> String {
        let mut text = format!("reads var `{first}`");
        let mut at = first;
        // A var reads only vars declared before it, so the chain ends; the
        // bound is a guard, not a limit.
        for _ in 0..self.missing.len() {
            match self.missing.iter().find(|(name, _)| name == at) {
                Some((_, Missing::Reads(next))) => {
                    text.push_str(&format!(", which reads var `{next}`"));
                    at = next;
                }
                _ => break,
            }
        }
        text.push_str(", which failed in this pass");
        text
    }
}

/// One var's value: its expression's, or its template's rendered YAML.
fn evaluate_one(
    rule: &CompiledRule,
    name: &str,
    source: &VarSource,
    ctx: &minijinja::Value,
) -> Result<minijinja::Value, RenderError> {
    let what = format!("var `{name}`");
    match source {
        VarSource::Value(expr) => rule.engine.eval(*expr, ctx, &what),
        VarSource::Template { template, shape } => {
            let text = rule.engine.render(template, ctx, &what)?;
            // A loop with no items leaves an empty document, which YAML
            // reads as null: the template's text says what it builds.
            if let Some(shape) = shape
                && shape::holds_nothing(&text)
            {
                return Ok(render::to_value(&shape.empty()));
            }
            let limits = yaml::Limits {
                max_bytes: rule.engine.limits().max_bytes,
                ..yaml::Limits::FILES
            };
            let parsed = yaml::parse_value(&text, &limits).map_err(|e| RenderError {
                what: what.clone(),
                message: format!("rendered text is not valid YAML: {e}"),
            })?;
            Ok(render::to_value(&parsed))
        }
    }
}
