//! `cluster:` on a child or a related entry: an expression naming the
//! cluster, evaluated per parent (by the planner; `local` is the hub). Checked here as any
//! expression is (syntax, names it may read); a quoted constant is checked
//! as a cluster name at once, so `cluster: "'EU'"` fails `trellis check`
//! rather than every pass.

use std::collections::BTreeSet;

use super::lint::{Code, lint};
use super::{Checker, Known};
use crate::render::{Calls, EngineBuilder, ExprId};

/// Where the expression sits and what it may read.
pub(super) struct Place<'p> {
    /// `spec.children[0].cluster`.
    pub field: &'p str,
    /// `a child's cluster`, for the names check.
    pub what: &'p str,
    pub allowed: &'p BTreeSet<&'static str>,
    pub known: &'p Known,
}

/// Compiles `src`; its reads are added to `reads` (implicit dependencies).
pub(super) fn compile(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    place: &Place,
    src: &str,
    reads: Option<&mut Calls>,
) -> Option<ExprId> {
    if let Some(constant) = crate::rules::names::quoted_constant(src)
        && let Err(why) = crate::rules::names::check_cluster_name(constant)
    {
        ck.error(place.field, why);
        return None;
    }
    match builder.add_expression(src) {
        Ok(id) => {
            lint(ck, builder, place.field, Code::Expression(id, src));
            if let Some(reads) = reads {
                super::merge_reads(reads, builder.expression_calls(id));
            }
            let names = builder.expression_names(id, true);
            ck.check_names(place.field, place.what, names, place.allowed, place.known);
            Some(id)
        }
        Err(err) => {
            ck.error(
                place.field,
                format!(
                    "expression syntax: {err} (a constant name is quoted: cluster: \"'eu-1'\")"
                ),
            );
            None
        }
    }
}
