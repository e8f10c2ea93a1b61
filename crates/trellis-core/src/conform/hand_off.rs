//! `handOff` paths the template never sets: a path trellis never sends
//! can never be handed off, so it is almost always a typo
//! (`spec.replica`). Judged from the sample rendering; a child the sample
//! parent does not render (excluded, or failing) is not judged.

use serde_json::Value;

use crate::plan::sample::{Sample, Sampled};
use crate::rules::{CompiledRule, Diagnostic};

/// One error per `handOff` path that no object of the child, as rendered
/// for the sample parent, holds.
pub(super) fn findings(rule: &CompiledRule, sample: &Sample) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (i, sampled) in &sample.children {
        let child = &rule.children[*i];
        let Sampled::Rendered(objects) = sampled else {
            continue;
        };
        if objects.is_empty() {
            continue;
        }
        for (n, keys) in child.hand_off.iter().enumerate() {
            if objects.iter().any(|o| holds(o, keys)) {
                continue;
            }
            let field = format!("spec.children[{i}].handOff[{n}]");
            out.push(Diagnostic::error(
                &rule.file,
                rule.lines.line_of(&field),
                &field,
                format!(
                    "handOff `{}`: the template of child `{}` never sets it (not in its rendering for the sample parent), so there is nothing to hand off",
                    child.spec.hand_off[n], child.spec.id
                ),
            ));
        }
    }
    out
}

fn holds(object: &Value, keys: &[String]) -> bool {
    keys.iter()
        .try_fold(object, |node, key| node.get(key.as_str()))
        .is_some()
}
