//! A rule's children in spokes after a reload took them from it: a removed
//! rule's (`onRuleRemoved`), and those of a kind the rule no longer places
//! in spokes at all. Each runs as a task: a spoke may not answer for long,
//! and a reload must not wait for it; each is recorded while it runs
//! ([`pending`]), so that a restart or a new leader resumes it.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::ResourceExt;
use kube::api::DynamicObject;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::pending::{self, Cleanup};
use super::release_finalizer;
use crate::operator::Shared;
use crate::operator::clusters::placed_kinds;
use crate::operator::watches::discovery::Resolved;
use crate::rules::CompiledRule;

/// A rule edit after which a child kind is no longer placed in spokes by
/// the rule (its last `cluster:` child of that kind gone, or moved home):
/// the spokes stop watching the kind, so no pass would prune what is left
/// there. Those objects of the rule (this hub's) are deleted there, retained
/// ones released, by a task that waits for spokes that do not answer, and
/// ends if the rule places the kind in spokes again.
pub(super) fn spoke_kinds_dropped(
    shared: &Arc<Shared>,
    old: &Arc<CompiledRule>,
    new: &CompiledRule,
    shutdown: &CancellationToken,
) {
    let now = placed_kinds([new]);
    let dropped: BTreeSet<_> = placed_kinds([old.as_ref()])
        .difference(&now)
        .cloned()
        .collect();
    if dropped.is_empty() || new.rollout.is_some() {
        // A staged rollout prunes per parent as each moves on.
        return;
    }
    info!(rule = %old.name, kinds = ?dropped, "child kinds no longer placed in spokes: their objects there are deleted");
    take_dropped(shared, old, dropped, shutdown);
}

/// The task of [`spoke_kinds_dropped`] for the kinds `dropped` of `old`,
/// recorded while it runs ([`pending`]): also what resumes a recorded one.
pub(super) fn take_dropped(
    shared: &Arc<Shared>,
    old: &Arc<CompiledRule>,
    dropped: BTreeSet<crate::kinds::Gvk>,
    shutdown: &CancellationToken,
) {
    let (shared, old, shutdown) = (shared.clone(), old.clone(), shutdown.clone());
    tokio::spawn(async move {
        for gvk in &dropped {
            pending::remember(&shared, &old, Cleanup::Dropped(gvk)).await;
        }
        let user = shared.identities.user_of(&old);
        loop {
            let again = shared.in_force.borrow().as_ref().is_some_and(|set| {
                set.get(&old.name)
                    .is_some_and(|r| !placed_kinds([r.as_ref()]).is_disjoint(&dropped))
            });
            if !shared.gate.may_write() {
                // The record stays: the next leader resumes it.
                return;
            }
            let waiting = if again {
                Vec::new()
            } else {
                let gate = shared.gate.clone();
                shared
                    .clusters
                    .remove_children_of(&old, &dropped, None, true, user.as_deref(), move || {
                        gate.check().is_ok()
                    })
                    .await
                    .waiting
            };
            if waiting.is_empty() {
                for gvk in &dropped {
                    pending::forget(&shared, &old.name, Cleanup::Dropped(gvk)).await;
                }
                return;
            }
            warn!(rule = %old.name, "waiting to take children of kinds no longer placed in spokes: {}", waiting.join("; "));
            tokio::select! {
                () = tokio::time::sleep(SPOKE_RETRY) => {}
                () = shutdown.cancelled() => return,
            }
        }
    });
}

/// How often a removed rule's spoke cleanup looks again at spokes that
/// did not answer.
const SPOKE_RETRY: std::time::Duration = std::time::Duration::from_secs(3);

/// A removed rule's children in spokes taken away (see
/// [`super::clusters::Clusters::remove_rule_children`]), then its parents'
/// finalizers released: a child in a spoke has no ownerReference, so the
/// finalizer is what lets its cleanup happen at all. While a spoke does
/// not answer, the parents wait, each told so once by a Warning. Ends
/// early if the rule comes back (its controller takes the parents over)
/// or this replica stops leading (the next leader's reload sees no rule
/// to remove: its finalizers are released by the parents' next owner).
pub(super) async fn spokes_then_finalizers(
    shared: Arc<Shared>,
    rule: Arc<CompiledRule>,
    parent_kind: Resolved,
    parents: Vec<DynamicObject>,
    delete: bool,
) {
    let uids: BTreeSet<String> = parents.iter().filter_map(|p| p.uid()).collect();
    let user = shared.identities.user_of(&rule);
    let mut told = false;
    loop {
        let back = shared
            .in_force
            .borrow()
            .as_ref()
            .is_some_and(|set| set.get(&rule.name).is_some_and(|r| r.parent == rule.parent));
        if back || !shared.gate.may_write() {
            info!(rule = %rule.name, "removed rule's cleanup in other clusters stopped (the rule is back, or this replica no longer leads)");
            if back {
                pending::forget(&shared, &rule.name, Cleanup::Removed).await;
            }
            return;
        }
        let gate = shared.gate.clone();
        let left = shared
            .clusters
            .remove_rule_children(&rule, &uids, delete, user.as_deref(), move || {
                gate.check().is_ok()
            })
            .await;
        if left.waiting.is_empty() {
            break;
        }
        let note = format!(
            "rule {} removed: waiting to take its children out of other clusters: {}",
            rule.name,
            left.waiting.join("; ")
        );
        warn!(rule = %rule.name, "{note}");
        if !told {
            told = true;
            for parent in &parents {
                let gate = shared.gate.clone();
                let event = kube::runtime::events::Event {
                    type_: kube::runtime::events::EventType::Warning,
                    reason: crate::clusters::UNREACHABLE.into(),
                    note: Some(crate::status::truncate(&note, 1000)),
                    action: "Cleanup".into(),
                    secondary: None,
                };
                let reference = kube::Resource::object_ref(parent, &parent_kind.resource);
                shared
                    .recorder
                    .enqueue(event, reference, move || gate.may_write())
                    .await;
            }
        }
        tokio::time::sleep(SPOKE_RETRY).await;
    }
    for parent in &parents {
        release_finalizer(&shared, &rule, &parent_kind, parent).await;
    }
    pending::forget(&shared, &rule.name, Cleanup::Removed).await;
}
