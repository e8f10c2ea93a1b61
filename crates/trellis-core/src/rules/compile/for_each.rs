//! `forEach:` of a child, a patch or a condition, compiled: one list
//! expression, or the named lists of a cartesian product (each name a
//! valid identifier, since it is read as `item.<name>`).

use std::collections::BTreeSet;

use super::lint::{Code, lint};
use super::related::is_var_name;
use super::{Checker, Known, merge_reads};
use crate::render::{self, EngineBuilder, ExprId};
use crate::rules::model::ForEach;

/// Most names one cartesian `forEach` may combine.
pub const MAX_FOR_EACH_NAMES: usize = 8;

/// A compiled `forEach`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompiledForEach {
    /// One list: `item` is its element.
    List(ExprId),
    /// Named lists, in the order written: `item.<name>` is each list's
    /// element of the combination, the first name varying slowest.
    Product(Vec<(String, ExprId)>),
}

/// Where a `forEach` is compiled, and what its expressions may read.
pub(super) struct Place<'a> {
    /// The `forEach` field, e.g. `spec.children[2].forEach`.
    pub field: &'a str,
    /// What it belongs to, for messages: `a child's forEach`.
    pub what: &'a str,
    pub allowed: &'a BTreeSet<&'a str>,
    pub known: &'a Known,
}

/// Compiles `for_each` at `place`, adding what its expressions read to
/// `reads`; `None` when any expression does not compile (reported).
pub(super) fn compile_for_each(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    place: &Place,
    for_each: &ForEach,
    reads: &mut render::Calls,
) -> Option<CompiledForEach> {
    let mut expr = |ck: &mut Checker, field: &str, src: &str| match builder.add_expression(src) {
        Ok(id) => {
            lint(ck, builder, field, Code::Expression(id, src));
            merge_reads(reads, builder.expression_calls(id));
            let names = builder.expression_names(id, true);
            ck.check_names(field, place.what, names, place.allowed, place.known);
            Some(id)
        }
        Err(err) => {
            ck.error(field, format!("expression syntax: {err}"));
            None
        }
    };
    match for_each {
        ForEach::List(src) => expr(ck, place.field, src).map(CompiledForEach::List),
        ForEach::Product(named) => {
            if named.0.is_empty() {
                ck.error(
                    place.field,
                    "names no list: give at least one `name: expression`",
                );
                return None;
            }
            if named.0.len() > MAX_FOR_EACH_NAMES {
                ck.error(
                    place.field,
                    format!(
                        "combines {} lists, more than the limit of {MAX_FOR_EACH_NAMES}",
                        named.0.len()
                    ),
                );
            }
            let mut out = Vec::new();
            let mut seen = BTreeSet::new();
            let mut ok = true;
            for (name, src) in &named.0 {
                let field = format!("{}.{name}", place.field);
                if !is_var_name(name) {
                    ck.error(
                        &field,
                        format!(
                            "`{name}` is not a valid name ([a-zA-Z_][a-zA-Z0-9_]*): it is read as `item.{name}`"
                        ),
                    );
                }
                if !seen.insert(name.as_str()) {
                    ck.error(&field, format!("duplicate name `{name}`"));
                }
                match expr(ck, &field, src) {
                    Some(id) => out.push((name.clone(), id)),
                    None => ok = false,
                }
            }
            ok.then_some(CompiledForEach::Product(out))
        }
    }
}
