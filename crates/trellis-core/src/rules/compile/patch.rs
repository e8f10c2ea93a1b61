//! What `check` holds `spec.patches` to beyond what a child is held to
//! ([`super::entry`] compiles both): ids unique across children, related
//! entries and patches, and an order of patches without cycles.

use std::collections::BTreeMap;

use super::order::topological_order;
use super::{Checker, CompiledChild};
use crate::rules::model::RuleSpec;

/// Every patch id once, and never a child's or a related entry's.
pub(super) fn check_ids(ck: &mut Checker, spec: &RuleSpec) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, p) in spec.patches.iter().enumerate() {
        let field = format!("spec.patches[{i}].id");
        if let Some(first) = seen.insert(&p.id, i) {
            ck.error(
                &field,
                format!("duplicate patch id `{}` (also spec.patches[{first}])", p.id),
            );
        }
        if let Some(j) = spec.children.iter().position(|c| c.id == p.id) {
            ck.error(
                &field,
                format!(
                    "id `{}` is also spec.children[{j}]: ids are unique across children, related and patches",
                    p.id
                ),
            );
        }
        if let Some(j) = spec.related.iter().position(|r| r.id == p.id) {
            ck.error(
                &field,
                format!(
                    "id `{}` is also spec.related[{j}]: ids are unique across children, related and patches",
                    p.id
                ),
            );
        }
    }
}

/// Patches in dependency order (among patches; every child comes first).
pub(super) fn order(ck: &mut Checker, spec: &RuleSpec, patches: &[CompiledChild]) -> Vec<usize> {
    let deps: Vec<&[usize]> = patches
        .iter()
        .map(|p| p.depends_on_patches.as_slice())
        .collect();
    let ids: Vec<&str> = patches.iter().map(|p| p.spec.id.as_str()).collect();
    match topological_order(&deps, &ids) {
        Ok(order) => order,
        Err(cycle) => {
            let i = spec
                .patches
                .iter()
                .position(|p| p.id == cycle[0])
                .unwrap_or(0);
            ck.error(
                &format!("spec.patches[{i}].dependsOn"),
                format!("dependency cycle: {}", cycle.join(" -> ")),
            );
            Vec::new()
        }
    }
}
