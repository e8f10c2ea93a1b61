//! The per-parent pass as a decider: every decision `trellis run` makes
//! around one [`plan`](crate::plan::plan) — and `trellis diff` makes the
//! same way — with none of the I/O.
//!
//! ```text
//!  parent ──entry()──▶ Undecodable | Deleting | OutOfScope | Paused | Proceed
//!                                                                      │
//!        ┌─────────────────────────── Rounds ◀─────────────────────────┘
//!        │ begin_round() ── to_send(plan) ──▶ (caller applies) ──▶ record(child, Sent)
//!        │ round_done(wrote) ── true: plan again with what the server answered
//!        ▼
//!  may_prune() ──▶ (caller deletes, releases)
//!  withholds_status(), finish(plan, resync) ──▶ Failed | Stop | Next
//! ```
//!
//! The operator's `reconcile` and `diff`'s live side carry out what this
//! says; the unit tests below step a pass through its rounds with no
//! cluster. Entry checks run in one order for both, so the two can no
//! longer disagree about a parent that is, say, paused and being deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;

use crate::plan::{Apply, FailureReason, ObjectKey, Plan, why_not_selected};
use crate::rules::CompiledRule;

/// Annotation that pauses reconciliation of one parent.
pub const PAUSED_ANNOTATION: &str = "trellis.dev/paused";

/// What a pass does with a parent before planning anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// It did not decode (too deep, too large): reported, never planned.
    Undecodable(String),
    /// Marked for deletion: its children go, then trellis's finalizer.
    /// Ahead of `Paused`: holding the finalizer would leave a delete the
    /// user asked for hanging.
    Deleting,
    /// The rule does not select it (why): released like a deleted one.
    /// Ahead of `Paused` for the same reason.
    OutOfScope(String),
    /// `trellis.dev/paused: "true"`: nothing is written for it.
    Paused,
    /// Plan it.
    Proceed,
}

impl Entry {
    /// What `trellis diff` says of a parent it does not diff; `None` for
    /// one it diffs.
    pub fn skipped(&self) -> Option<String> {
        match self {
            Entry::Proceed => None,
            Entry::Undecodable(why) => Some(format!("undecodable: {why}")),
            Entry::Deleting => Some("being deleted: the operator only removes its children".into()),
            Entry::OutOfScope(why) => Some(format!(
                "outside the rule's parent namespaces or selector ({why}): the operator releases it"
            )),
            Entry::Paused => Some(format!("paused ({PAUSED_ANNOTATION}=true)")),
        }
    }
}

/// The entry checks, in their one order. `undecodable` is the decoder's
/// reason when the parent could not be read as a whole.
pub fn entry(rule: &CompiledRule, parent: &Value, undecodable: Option<&str>) -> Entry {
    if let Some(why) = undecodable {
        return Entry::Undecodable(why.to_owned());
    }
    if parent.pointer("/metadata/deletionTimestamp").is_some() {
        return Entry::Deleting;
    }
    if let Some(why) = why_not_selected(rule, parent) {
        return Entry::OutOfScope(why);
    }
    let paused = parent
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(PAUSED_ANNOTATION))
        .and_then(Value::as_str)
        == Some("true");
    if paused {
        return Entry::Paused;
    }
    Entry::Proceed
}

/// What became of one child the pass sent, as the caller saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Made; the server's answer is observed from now on.
    Created,
    /// Changed; likewise.
    Updated,
    /// Nothing to send, and nothing new to observe.
    Unchanged,
    /// Nothing to send; the object (read after a refused create, or found
    /// in the cache since the pass took its children) is observed now.
    Found,
    /// Taken as written without the cache showing it yet (see
    /// [`Rounds::withholds_status`]).
    Unseen,
    /// The write failed; `unreachable` when there was no answer at all
    /// (the API server is gone: the other children would fail the same
    /// way, so the round stops).
    Failed { unreachable: bool },
}

/// The bookkeeping of one pass's rounds: each round applies what the plan
/// asks, then the pass plans again with the objects the API server
/// answered as observed state, so a child whose dependency this pass made
/// is applied in the same pass, and the status written once describes what
/// the pass left. At most one round per child and patch, plus one.
#[derive(Debug)]
pub struct Rounds {
    /// Key → hash sent this pass: one write each, unless a later round
    /// renders it differently.
    sent: BTreeMap<ObjectKey, String>,
    /// Keys already counted in the metrics as unchanged.
    counted: BTreeSet<ObjectKey>,
    left: usize,
    unseen: bool,
    failed: bool,
    stop_round: bool,
}

impl Rounds {
    pub fn new(rule: &CompiledRule) -> Rounds {
        Rounds {
            sent: BTreeMap::new(),
            counted: BTreeSet::new(),
            left: rule.children.len() + rule.patches.len() + 1,
            unseen: false,
            failed: false,
            stop_round: false,
        }
    }

    /// The children of `plan` to send this round, in the plan's order.
    pub fn to_send<'p>(&self, plan: &'p Plan) -> Vec<&'p Apply> {
        plan.apply
            .iter()
            .filter(|a| self.sent.get(&a.key) != Some(&a.hash))
            .collect()
    }

    /// Whether the round goes on after the last write (false once a write
    /// found no API server).
    pub fn round_goes_on(&self) -> bool {
        !self.stop_round
    }

    /// Records what became of `apply`: whether it counts in the
    /// child-operation metrics (a write or a failure always; an unchanged
    /// child once per pass), and whether the object the caller holds for it
    /// is observed state from now on.
    pub fn record(&mut self, apply: &Apply, sent: Sent) -> Recorded {
        let unchanged = matches!(sent, Sent::Unchanged | Sent::Found | Sent::Unseen);
        let count = !unchanged || self.counted.insert(apply.key.clone());
        let observe = match sent {
            Sent::Created | Sent::Updated | Sent::Found => {
                self.sent.insert(apply.key.clone(), apply.hash.clone());
                true
            }
            Sent::Unchanged => false,
            Sent::Unseen => {
                self.unseen = true;
                false
            }
            Sent::Failed { unreachable } => {
                self.sent.insert(apply.key.clone(), apply.hash.clone());
                self.failed = true;
                self.stop_round |= unreachable;
                false
            }
        };
        Recorded { count, observe }
    }

    /// A write other than a child's failed (a patch, a delete, a release).
    pub fn failed(&mut self) {
        self.failed = true;
    }

    /// Whether any write of this pass failed.
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// Whether patches are sent this round: only once every child of it
    /// was sent without error.
    pub fn patches_due(&self) -> bool {
        !self.failed
    }

    /// The start of a round: false once every round the pass may run has
    /// run.
    pub fn begin_round(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        self.stop_round = false;
        true
    }

    /// The end of a round: whether to plan again (with what the server
    /// answered) and run another — only when the round wrote something and
    /// nothing failed.
    pub fn round_done(&self, wrote: bool) -> bool {
        wrote && !self.failed
    }

    /// Pruning (deletes, releases, retained children let go) waits for a
    /// pass in which everything applied.
    pub fn may_prune(&self) -> bool {
        !self.failed
    }

    /// Whether the pass writes no status: it relied on a child it cannot
    /// see, and has no error of its own to report. Such a pass knows less
    /// than the pass that made the child, which wrote the status from the
    /// API server's answer; its own status would say the child "does not
    /// exist yet", and Ready would flap.
    pub fn withholds_status(&self, plan: &Plan) -> bool {
        self.unseen && !self.failed && plan.errors.is_empty()
    }

    /// How the pass ends, once its writes are done.
    pub fn finish(&self, plan: &Plan, resync: Option<Duration>) -> Finish {
        if self.failed {
            return Finish::WriteFailed;
        }
        if plan.failure_reason == Some(FailureReason::InvalidSpec) {
            // Only an edit of the parent (or the rule) can fix it; its
            // Warning stays recorded so that a wake-up without an edit
            // writes nothing.
            return Finish::Stop;
        }
        if !plan.errors.is_empty() {
            return Finish::PlanFailed;
        }
        Finish::Next(next_pass(self.unseen, !plan.pending.is_empty(), resync))
    }
}

/// What [`Rounds::record`] tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// Count it in the child-operation metrics.
    pub count: bool,
    /// The server's answer (or the object found) is observed state now.
    pub observe: bool,
}

/// How a pass ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A write failed: the first failure is the pass's error (backoff).
    WriteFailed,
    /// The plan failed (render errors): an error of the pass (backoff).
    PlanFailed,
    /// Nothing will change until the parent or the rule does.
    Stop,
    /// The pass succeeded.
    Next(Next),
}

/// When a pass that ended without error looks again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// At the next event of the parent, a child or a read.
    OnChange,
    /// After this long, whatever happens.
    After(Duration),
}

/// How soon a pass that relied on a child it cannot see yet looks again.
pub const UNSEEN_RECHECK: Duration = Duration::from_secs(1);
/// How soon a pass with a pending child looks again, should no child
/// event wake it (the watches normally do).
pub const PENDING_RECHECK: Duration = Duration::from_secs(10);

/// When a pass that ended without error looks again.
pub fn next_pass(unseen: bool, pending: bool, resync: Option<Duration>) -> Next {
    if unseen {
        // Its status waits for a pass that sees the child: soon, not at
        // the child's event alone (after a network outage a parent once
        // waited the full 30 s, saying that a child which existed did not,
        // no event having woken it).
        return Next::After(UNSEEN_RECHECK);
    }
    if pending {
        return Next::After(PENDING_RECHECK);
    }
    match resync {
        Some(every) => Next::After(every),
        None => Next::OnChange,
    }
}

#[cfg(test)]
mod tests;
