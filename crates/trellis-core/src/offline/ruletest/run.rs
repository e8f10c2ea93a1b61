//! One case through the offline pass ([`crate::offline::render::pass`],
//! the pass `trellis render` prints and the operator plans), and its
//! outcome held against the case's `expect`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::file::{Case, Expect, Suite};
use super::matcher::{Mismatch, match_errors, subset};
use super::report::{CaseResult, Report, SuiteResult};
use crate::offline::render;
use crate::plan::Plan;
use crate::rules::CompiledRule;

/// The clock every case reads: fixed, so a condition's
/// `lastTransitionTime` is the same on every run.
pub const NOW: &str = "2026-01-01T00:00:00Z";

/// Runs every case of every suite.
pub fn run_suites(suites: &[Suite]) -> Report {
    Report {
        suites: suites
            .iter()
            .map(|suite| SuiteResult {
                file: suite.file.clone(),
                name: suite.name.clone(),
                rule: suite.rule.name.clone(),
                cases: suite
                    .cases
                    .iter()
                    .map(|case| CaseResult {
                        name: case.name.clone(),
                        line: case.line,
                        mismatches: run_case(&suite.rule, case),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Where one case's pass differs from its `expect`; empty: it passes.
pub fn run_case(rule: &CompiledRule, case: &Case) -> Vec<Mismatch> {
    if let Some(why) = crate::plan::why_not_selected(rule, &case.parent) {
        // The operator would never run this rule for the parent.
        return vec![Mismatch {
            path: "parent".into(),
            expected: json!(format!("a parent rule `{}` selects", rule.name)),
            actual: Some(json!(format!("not selected: {why}"))),
        }];
    }
    let pass = render::pass(rule, &case.parent, case.observed.clone(), NOW, None);
    compare(&case.expect, &pass.plan)
}

/// The objects of the pass by child (or patch) id, in the order the pass
/// rendered them (a forEach child's in item order). A contribution whose
/// target is missing is not sent, so it is no object of the pass.
fn objects_by_id(plan: &Plan) -> BTreeMap<&str, Vec<&Value>> {
    let mut by_id: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for apply in &plan.apply {
        by_id.entry(&apply.id).or_default().push(&apply.object);
    }
    for patch in plan.patches.iter().filter(|p| p.uid.is_some()) {
        by_id.entry(&patch.id).or_default().push(&patch.object);
    }
    by_id
}

/// Every mismatch between `expect` and the plan, in the order of `expect`'s
/// keys.
pub fn compare(expect: &Expect, plan: &Plan) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let objects = objects_by_id(plan);
    let pending_of = |id: &str| plan.pending.iter().find(|p| p.id == id);
    // What a child without an object was instead, to make a failure legible.
    let instead = |id: &str| match pending_of(id) {
        Some(p) => json!(format!("no object: pending ({})", p.describe())),
        None => json!("no object: not rendered in this pass"),
    };
    for (id, want) in &expect.children {
        let path = format!("children.{id}");
        let have = objects.get(id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        match (want, have) {
            (Value::Array(want), have) if want.len() == have.len() => {
                for (i, (want, have)) in want.iter().zip(have).enumerate() {
                    subset(want, have, &format!("{path}[{i}]"), &mut out);
                }
            }
            (Value::Array(want), []) => out.push(Mismatch {
                path,
                expected: json!(format!("{} object(s)", want.len())),
                actual: Some(instead(id)),
            }),
            (Value::Array(want), have) => out.push(Mismatch {
                path,
                expected: json!(format!("{} object(s)", want.len())),
                actual: Some(json!(format!(
                    "{} object(s): {}",
                    have.len(),
                    names(have).join(", ")
                ))),
            }),
            (want, [one]) => subset(want, one, &path, &mut out),
            (want, []) => out.push(Mismatch {
                path,
                expected: want.clone(),
                actual: Some(instead(id)),
            }),
            (want, many) => out.push(Mismatch {
                path,
                expected: want.clone(),
                actual: Some(json!(format!(
                    "{} objects: {}",
                    many.len(),
                    names(many).join(", ")
                ))),
            }),
        }
    }
    for id in &expect.absent {
        if let Some(have) = objects.get(id.as_str()) {
            out.push(Mismatch {
                path: format!("absent.{id}"),
                expected: json!("no object"),
                actual: Some(json!(format!("rendered: {}", names(have).join(", ")))),
            });
        }
    }
    for (id, want) in &expect.pending {
        let have = pending_of(id).map(|p| p.describe());
        if !have.as_deref().is_some_and(|h| h.contains(want.as_str())) {
            out.push(Mismatch {
                path: format!("pending.{id}"),
                expected: json!(format!("pending, the reason containing {want:?}")),
                actual: Some(json!(match have {
                    Some(reason) => format!("pending: {reason}"),
                    None if objects.contains_key(id.as_str()) => "not pending: rendered".into(),
                    None => "not pending, not rendered".to_owned(),
                })),
            });
        }
    }
    let status = plan.status.clone().unwrap_or(Value::Null);
    if let Some(want) = &expect.status {
        subset(want, &status, "status", &mut out);
    }
    for (kind, want) in &expect.conditions {
        let have = condition(&status, kind);
        let matches = match (want.split_once('/'), &have) {
            (_, None) => false,
            (Some(_), Some(have)) => have == want,
            (None, Some(have)) => have.split_once('/').map_or(have.as_str(), |(s, _)| s) == want,
        };
        if !matches {
            out.push(Mismatch {
                path: format!("conditions.{kind}"),
                expected: json!(want),
                actual: have.map(Value::String),
            });
        }
    }
    if let Some(want) = &expect.errors {
        let (missing, extra) = match_errors(want, &plan.errors);
        for i in missing {
            out.push(Mismatch {
                path: format!("errors[{i}]"),
                expected: json!(format!("an error containing {:?}", want[i])),
                actual: Some(json!(plan.errors)),
            });
        }
        for j in extra {
            out.push(Mismatch {
                path: "errors".into(),
                expected: json!(format!("{} error(s), as listed", want.len())),
                actual: Some(json!(format!("an error not listed: {}", plan.errors[j]))),
            });
        }
    }
    out
}

/// A condition of the new status as `Status/Reason`.
fn condition(status: &Value, kind: &str) -> Option<String> {
    let c = status
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))?;
    let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
    Some(format!("{}/{}", field("status"), field("reason")))
}

fn names(objects: &[&Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            let meta = |k: &str| o.pointer(&format!("/metadata/{k}")).and_then(Value::as_str);
            let kind = o.get("kind").and_then(Value::as_str).unwrap_or("?");
            match (meta("namespace"), meta("name")) {
                (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
                (None, Some(name)) => format!("{kind} {name}"),
                _ => kind.to_owned(),
            }
        })
        .collect()
}
