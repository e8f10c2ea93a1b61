//! A rule whose new CRD would break stored parents or clients is held back
//! before it is put in force (`--manage-crds`): the rule keeps its last good
//! version (the one whose CRD is live), or, with no last good version (a new
//! rule, or the operator's start), does not start. Running the new version
//! against the old CRD is what the refusal is there to avoid: its templates
//! read the schema that was refused.
//!
//! Every replica holds alike (they all read the same live CRD), so a
//! standby that becomes leader runs the same versions the old leader ran.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Client;
use tracing::warn;

use crate::crd::breaking::Breaking;
use crate::rules::{CompiledRule, RuleSet};

/// The rules held back, by name: each breaking change, one line per change.
pub type HeldRules = BTreeMap<String, Vec<String>>;

/// `set` with every rule whose CRD change is breaking replaced by its
/// version in `last_good` (or left out when it has none), and those rules.
/// A rule whose CRD is the one already in force is not read again; a live
/// CRD that cannot be read holds nothing (the CRD manager reports it).
pub async fn hold_breaking(
    client: &Client,
    last_good: &RuleSet,
    set: RuleSet,
) -> (RuleSet, HeldRules) {
    let mut held = HeldRules::new();
    let mut rules = Vec::with_capacity(set.rules.len());
    for rule in set.rules {
        let previous = last_good.get(&rule.name);
        match breaking(client, &rule, previous).await {
            Some(changes) if !changes.is_empty() => {
                let lines: Vec<String> = changes.iter().map(ToString::to_string).collect();
                warn!(
                    rule = %rule.name,
                    changes = %lines.join("; "),
                    "CRD change refused as breaking (crd: {{allowBreaking: true}} applies it anyway): {}",
                    if previous.is_some() {
                        "the rule keeps its last good version"
                    } else {
                        "the rule does not start"
                    }
                );
                held.insert(rule.name.clone(), lines);
                rules.extend(previous.cloned());
            }
            _ => rules.push(rule),
        }
    }
    (
        RuleSet {
            rules,
            warnings: set.warnings,
        },
        held,
    )
}

/// The breaking changes of `rule`'s CRD over the live one; `None` when
/// nothing needs checking or the live CRD cannot be read.
async fn breaking(
    client: &Client,
    rule: &CompiledRule,
    previous: Option<&Arc<CompiledRule>>,
) -> Option<Vec<Breaking>> {
    let crd = rule.crd.as_ref()?;
    if rule.allows_breaking_crd() || previous.is_some_and(|p| p.crd.as_ref() == Some(crd)) {
        return None;
    }
    match super::breaking_changes(client, crd).await {
        Ok(changes) => Some(changes),
        Err(e) => {
            warn!(rule = %rule.name, "checking the CRD change: {e}");
            None
        }
    }
}
