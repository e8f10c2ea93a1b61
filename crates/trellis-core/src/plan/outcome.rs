//! What became of each entry of a rule — child, patch, related entry — in
//! one pass, by id: the planner's own verdicts, handed out with the plan so
//! that what shows a parent's state (`trellis tree`) never decides them a
//! second time.
//!
//! It decides nothing: `plan` records here what its steps decided.

use std::collections::BTreeMap;

use serde::Serialize;

use super::child::Outcome;
use super::related::RelatedState;
use crate::rules::CompiledRule;

/// One entry's verdict in a pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum EntryOutcome {
    /// A child or patch whose `includeWhen` is false for this parent.
    Excluded,
    /// A child or patch held back: the plan's `pending` says why.
    Pending,
    /// A child or patch whose template or expressions failed: the plan's
    /// `errors` say how.
    Failed,
    /// A child or patch rendered; `not_ready` names the first object that is
    /// not ready, and why (`None`: every object is ready).
    Rendered { not_ready: Option<String> },
    /// A related entry that was read; `not_ready`: its `readyWhen` is false
    /// or failed, and why.
    Read { not_ready: Option<String> },
    /// A related entry that holds its readers back: missing, or the source
    /// could not tell (`reason`: `RelatedNotFound`, `RelatedKindNotServed`, …).
    Missing { reason: String, message: String },
    /// An `optional` related entry that does not exist: absent from the
    /// context, holding nothing back.
    Absent,
}

/// The verdicts of a pass: children and patches by index into the rule's
/// lists, related entries in the rule's order.
pub(super) fn collect(
    rule: &CompiledRule,
    children: &BTreeMap<usize, Outcome>,
    patches: &BTreeMap<usize, Outcome>,
    related: &[RelatedState],
) -> BTreeMap<String, EntryOutcome> {
    let mut out = BTreeMap::new();
    for (entries, outcomes) in [(&rule.children, children), (&rule.patches, patches)] {
        for (&i, outcome) in outcomes {
            if let Some(entry) = entries.get(i) {
                out.insert(entry.spec.id.clone(), of_outcome(outcome));
            }
        }
    }
    for (entry, state) in rule.related.iter().zip(related) {
        out.insert(entry.spec.id.clone(), of_related(state));
    }
    out
}

fn of_outcome(outcome: &Outcome) -> EntryOutcome {
    match outcome {
        Outcome::Excluded => EntryOutcome::Excluded,
        Outcome::Pending => EntryOutcome::Pending,
        Outcome::Failed => EntryOutcome::Failed,
        Outcome::Rendered(ready) => EntryOutcome::Rendered {
            not_ready: ready.clone().err(),
        },
    }
}

fn of_related(state: &RelatedState) -> EntryOutcome {
    match state {
        RelatedState::Ready => EntryOutcome::Read { not_ready: None },
        RelatedState::NotReady(why) => EntryOutcome::Read {
            not_ready: Some(why.clone()),
        },
        RelatedState::Missing(why) => EntryOutcome::Missing {
            reason: "RelatedNotFound".into(),
            message: why.clone(),
        },
        RelatedState::Unreadable(u) => EntryOutcome::Missing {
            reason: u.reason.to_owned(),
            message: u.message.clone(),
        },
        RelatedState::Absent => EntryOutcome::Absent,
    }
}
