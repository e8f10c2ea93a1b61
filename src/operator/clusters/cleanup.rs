//! A removed rule's children in the spokes (`onRuleRemoved`): found by a
//! live list in every registered spoke (the rule's watches there stopped
//! with it), by this hub's label, the rule's and its parents' uids.
//! Retained children are released whatever `onRuleRemoved` says; with
//! `delete` the others are deleted. Nothing is done in a spoke that does
//! not answer: the caller waits for it, saying so on each parent; an
//! unregistered spoke is unknown, and nothing is deleted there.

use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Preconditions, PropagationPolicy};
use tracing::{info, warn};

use super::Clusters;
use crate::labels::{LABEL_HUB, LABEL_RULE};
use crate::operator::lock;
use crate::operator::watches::discovery;
use crate::plan::{LABEL_DELETION_POLICY, LABEL_PARENT_UID, RETAIN};
use crate::rules::CompiledRule;
use crate::rules::model::DeletionPolicy;

/// What one round of a removed rule's spoke cleanup left to do.
#[derive(Debug, Default)]
pub struct Left {
    /// Spokes that do not answer (or refused a list), with why: their
    /// children wait for them.
    pub waiting: Vec<String>,
}

impl Clusters {
    /// One round of taking a removed rule's children out of every
    /// registered spoke: those of the parents `uids`, released when
    /// retained, deleted when `delete` (else left). `may_write` is asked
    /// before each write (the leader's fence). Writes are sent as the
    /// rule's account (`user`) where it has one, as at home.
    pub async fn remove_rule_children(
        &self,
        rule: &CompiledRule,
        uids: &BTreeSet<String>,
        delete: bool,
        user: Option<&str>,
        may_write: impl Fn() -> bool,
    ) -> Left {
        let kinds = super::placed_kinds([rule]);
        if uids.is_empty() {
            return Left::default();
        }
        self.remove_children_of(rule, &kinds, Some(uids), delete, user, may_write)
            .await
    }

    /// One round of taking `rule`'s children of `kinds` out of every
    /// registered spoke: those of the parents `uids`, or (`None`) of any
    /// parent (kinds the rule no longer places in spokes at all: no watch
    /// there sees them any more, so no pass could prune them).
    pub async fn remove_children_of(
        &self,
        rule: &CompiledRule,
        kinds: &BTreeSet<crate::kinds::Gvk>,
        uids: Option<&BTreeSet<String>>,
        delete: bool,
        user: Option<&str>,
        may_write: impl Fn() -> bool,
    ) -> Left {
        let mut left = Left::default();
        if kinds.is_empty() {
            return left;
        }
        let spokes: Vec<_> = lock(&self.spokes).values().cloned().collect();
        let selector = format!("{LABEL_RULE}={},{LABEL_HUB}={}", rule.name, self.hub);
        let retained_ids: BTreeSet<&str> = rule
            .children
            .iter()
            .filter(|c| c.spec.deletion_policy == DeletionPolicy::Retain)
            .map(|c| c.spec.id.as_str())
            .collect();
        for spoke in spokes {
            if !spoke.reachable() {
                left.waiting
                    .push(format!("cluster \"{}\" is unreachable", spoke.name));
                continue;
            }
            for gvk in kinds {
                // The rule's watches in the spoke stopped with it: ask again.
                let kind = match discovery::resolve(&spoke.client, gvk).await {
                    Ok(kind) => kind,
                    // Not served there: nothing of it to take away.
                    Err(_) => continue,
                };
                let list = match kind
                    .api::<kube::api::DynamicObject>(spoke.client.clone(), None)
                    .list_metadata(&ListParams::default().labels(&selector))
                    .await
                {
                    Ok(list) => list.items,
                    Err(err) => {
                        left.waiting.push(format!(
                            "cluster \"{}\": cannot list {gvk}: {err}",
                            spoke.name
                        ));
                        continue;
                    }
                };
                for child in list {
                    let labels = child.labels();
                    let theirs = labels
                        .get(LABEL_PARENT_UID)
                        .is_some_and(|u| uids.is_none_or(|uids| uids.contains(u)));
                    if !theirs {
                        continue;
                    }
                    let retained = labels.get(LABEL_DELETION_POLICY).map(String::as_str)
                        == Some(RETAIN)
                        || labels
                            .get(crate::plan::LABEL_CHILD)
                            .is_some_and(|id| retained_ids.contains(id.as_str()));
                    if (!retained && !delete) || !may_write() {
                        continue;
                    }
                    let api = kind.api(spoke.client_as(user), child.namespace().as_deref());
                    let name = child.name_any();
                    let done = if retained {
                        crate::operator::pass::release::release_child(&api, &name)
                            .await
                            .map(|_| "released (deletionPolicy: retain)")
                    } else {
                        let params = DeleteParams {
                            propagation_policy: Some(PropagationPolicy::Background),
                            preconditions: child.uid().map(|uid| Preconditions {
                                uid: Some(uid),
                                resource_version: None,
                            }),
                            ..DeleteParams::default()
                        };
                        match api.delete(&name, &params).await {
                            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                                Ok("already gone")
                            }
                            other => other.map(|_| "deleted (rule removed, or its kind no longer placed in spokes)"),
                        }
                    };
                    match done {
                        Ok(what) => {
                            info!(rule = %rule.name, cluster = %spoke.name, kind = %gvk, name = %name, "{what}")
                        }
                        Err(err) => {
                            warn!(rule = %rule.name, cluster = %spoke.name, kind = %gvk, name = %name, "cannot take a removed rule's child away: {err}");
                            left.waiting
                                .push(format!("cluster \"{}\": {gvk} {name}: {err}", spoke.name));
                        }
                    }
                }
            }
        }
        left
    }
}
