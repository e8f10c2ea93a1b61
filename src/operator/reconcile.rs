//! Reconciling one parent: caches → `plan` → carry the plan out.
//!
//! Nothing here decides *what* a parent needs; that is `plan`'s job. This
//! module is the pass: it waits for the caches, plans, hands each child to
//! [`super::apply`], prunes, and hands the status to
//! [`super::status_write`]; a parent being deleted goes to
//! [`super::finalize`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, Preconditions, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::apply::{Outcome, apply_child};
use super::context::{Error, RuleCtx, parent_key};
use super::decode::ParentObject;
use super::finalize::{finalize, set_finalizers};
use super::status_write::{mark_apply_error, write_status};
use super::summary::{self, Summary};
use super::{FINALIZER, PAUSED_ANNOTATION};
use crate::plan::{self, Input, ObjectKey, Observed};

/// How soon a pass that relied on a child it cannot see yet looks again.
const UNSEEN_RECHECK: Duration = Duration::from_secs(1);

/// [`reconcile`], counted and timed in the metrics.
pub async fn reconcile_measured(
    parent: Arc<ParentObject>,
    ctx: Arc<RuleCtx>,
) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let rule = ctx.rule().name.clone();
    let result = match reconcile(parent, ctx.clone()).await {
        // A standby (or a leader that just lost the Lease) leaves the pass
        // to the leader, which reconciles every parent on taking over.
        Err(Error::NotLeader(_)) => return Ok(Action::await_change()),
        other => other,
    };
    let metrics = &ctx.shared.metrics;
    metrics
        .reconcile_seconds
        .get_or_create(&crate::telemetry::RuleLabel { rule: rule.clone() })
        .observe(started.elapsed().as_secs_f64());
    let outcome = if result.is_ok() { "ok" } else { "error" };
    metrics
        .reconciles
        .get_or_create(&crate::telemetry::ResultLabel {
            rule,
            result: outcome.into(),
        })
        .inc();
    result
}

pub async fn reconcile(parent: Arc<ParentObject>, ctx: Arc<RuleCtx>) -> Result<Action, Error> {
    let parent_uid = parent.object.metadata.uid.as_deref().unwrap_or_default();
    // Under --shards a pass runs only in a bucket this replica writes, and
    // counts as running until it ends: the handover waits for it.
    let _pass = match &ctx.shared.shards {
        None => {
            ctx.shared.gate.check()?;
            None
        }
        Some(shards) => Some(shards.begin(parent_uid).ok_or(super::leader::NotLeader)?),
    };
    // Planning on a half-filled cache would re-create what exists (and
    // re-roll `createOnly` secrets): wait until every child kind is listed,
    // but never past the rule's stop, so shutdown is never held up.
    let mut ready = ctx.caches_ready.clone();
    tokio::select! {
        listed = ready.wait_for(|r| *r) => if listed.is_err() {
            return Err(Error::Plan("child cache was dropped".into()));
        },
        _ = ctx.stop.cancelled() => return Ok(Action::await_change()),
    }
    // A bucket just gained may still be listing its children: planning now
    // would re-create them. Its listing wakes the parent again.
    if ctx.shared.shards.is_some()
        && !ctx
            .listed_buckets()
            .contains(crate::shard::bucket_of(parent_uid))
    {
        return Ok(Action::await_change());
    }
    let _permit = tokio::select! {
        permit = ctx.shared.permits.acquire() => permit,
        _ = ctx.stop.cancelled() => return Ok(Action::await_change()),
    };
    ctx.sweep();
    if let Some(why) = &parent.undecodable {
        return undecodable(&ctx, &parent.to_object(), why).await;
    }
    // Parsed from the cache's text once per pass.
    let parent = &parent.to_object();
    let rule = &ctx.rule();
    let key = parent_key(parent);
    let uid = parent.uid().unwrap_or_default();
    // A failing parent waits out its backoff whatever woke it (a child
    // event, its own status write); an edit of its spec is tried at once.
    if parent.meta().deletion_timestamp.is_none()
        && let Some(wait) =
            ctx.failures
                .held(&key, parent.metadata.generation, std::time::Instant::now())
    {
        debug!(rule = %rule.name, parent = %key, retry_in = ?wait, "held back by its backoff");
        return Ok(Action::requeue(wait));
    }
    // Deletion goes ahead even for a paused parent: holding the finalizer
    // would leave a delete the user asked for hanging.
    if parent.meta().deletion_timestamp.is_some() {
        return finalize(parent, &ctx, &uid).await;
    }
    if parent
        .annotations()
        .get(PAUSED_ANNOTATION)
        .map(String::as_str)
        == Some("true")
    {
        debug!(rule = %rule.name, parent = %key, "paused");
        return Ok(Action::await_change());
    }
    let mut parent_json = serde_json::to_value(parent).map_err(|e| Error::Plan(e.to_string()))?;
    if let Some(status) = ctx.unseen_status(&uid, parent.resource_version().as_deref()) {
        parent_json["status"] = status;
    }
    let parent_ref = super::related::parent_ref(parent, &ctx.kinds.parent.resource);
    if !plan::parent_matches(rule, &parent_json) {
        // Outside the rule (a watch not yet restarted after a reload
        // narrowed it): finalized as one that left it.
        ctx.related.forget(&parent_ref);
        if let Some(candidate) = super::released::Candidate::of(parent, true) {
            let _ = ctx.released.send(candidate);
        }
        return Ok(Action::await_change());
    }
    // A rule with `rollout:` runs no pass until the version its parents are
    // on is recorded in the cluster: a pass on an unrecorded version, then
    // an edit, would make the edit the "first" version and move every
    // parent at once. The leader records it at the rollout's first look,
    // which wakes every parent.
    if rule.rollout.is_some() && ctx.versions.record().is_none() {
        debug!(rule = %rule.name, parent = %key, "waiting for the rule's first version to be recorded");
        return Ok(Action::await_change());
    }
    // The version this parent is due to run: the newest, unless a staged
    // rollout keeps it on an earlier one. The whole pass uses it.
    let rule = &ctx.rule_for(&parent_json, &uid);

    // Related objects are looked up in their caches per read; `since` lets
    // the index catch an event landing between those reads and the record.
    let since = ctx.related.seq();
    let mut observed = Observed::from_objects(ctx.observed(&uid)).with_related(ctx.related.clone());
    let now = crate::clock::now_rfc3339();
    let scope_of = |g: &crate::kinds::Gvk| ctx.kinds.scope_of(g);
    let plan_with = |observed: &Observed| {
        plan::plan(
            rule,
            &Input {
                parent: &parent_json,
                observed,
                now: &now,
                scope_of: &scope_of,
            },
        )
    };
    let mut plan = plan_with(&observed);
    ctx.related.record(parent_ref.clone(), &plan.reads, since);
    debug!(
        rule = %rule.name,
        parent = %key,
        reads = plan.reads.len(),
        apply = plan.apply.len(),
        pending = plan.pending.len(),
        "planned"
    );

    if plan.needs_finalizer && !parent.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = parent.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        set_finalizers(&ctx, parent, finalizers).await?;
    }

    // Each round applies what the plan asks, then plans again with the
    // objects the API server answered as observed state: a child whose
    // dependency this pass made is applied in the same pass, and the status
    // written once describes what the pass left, not the caches before it.
    let mut apply_errors = Vec::new();
    let mut summary = Summary::default();
    // Key → hash sent this pass (or the recreate started): one write each,
    // unless a later round renders it differently.
    let mut sent: BTreeMap<ObjectKey, String> = BTreeMap::new();
    let mut counted: BTreeSet<ObjectKey> = BTreeSet::new();
    // A child taken as written without the cache showing it: look again.
    let mut unseen = false;
    let mut patch_sent: BTreeMap<ObjectKey, String> = BTreeMap::new();
    for _round in 0..=rule.children.len() + rule.patches.len() {
        let mut wrote = false;
        for apply in &plan.apply {
            if sent.get(&apply.key) == Some(&apply.hash) {
                continue;
            }
            let live = observed.objects.get(&apply.key);
            let result = apply_child(&ctx, apply, live, &uid).await;
            if let Err(Error::NotLeader(not)) = result {
                return Err(not.into());
            }
            let op = match &result {
                Ok(a) => match a.outcome {
                    Outcome::Unchanged | Outcome::Unseen => "unchanged",
                    Outcome::Created => "create",
                    Outcome::Updated => "update",
                },
                Err(_) => "error",
            };
            if op != "unchanged" || counted.insert(apply.key.clone()) {
                ctx.shared.metrics.child_op(&rule.name, op);
            }
            match result {
                Ok(applied) => {
                    match applied.outcome {
                        Outcome::Unchanged if applied.object.is_none() => continue,
                        // Read after a refused create, or arrived in the
                        // cache since the pass took its children: the
                        // status counts it as there.
                        Outcome::Unchanged => {}
                        Outcome::Unseen => {
                            unseen = true;
                            continue;
                        }
                        Outcome::Created => {
                            info!(rule = %rule.name, parent = %key, child = %apply.id, object = %apply.key, "created");
                            summary.created.push(apply.key.to_string());
                        }
                        Outcome::Updated => {
                            info!(rule = %rule.name, parent = %key, child = %apply.id, object = %apply.key, "applied");
                            summary.updated.push(apply.key.to_string());
                        }
                    }
                    sent.insert(apply.key.clone(), apply.hash.clone());
                    if let Some(object) = applied.object {
                        observed.objects.insert(apply.key.clone(), object);
                        wrote = true;
                    }
                }
                Err(err) => {
                    let err = ctx.attribute(err);
                    warn!(rule = %rule.name, parent = %key, child = %apply.id, "{err}");
                    ctx.count_api_error(&err);
                    // No answer at all (the API server is gone): the other
                    // children would fail the same way; the backoff retries.
                    let unreachable = err.is_transport();
                    sent.insert(apply.key.clone(), apply.hash.clone());
                    apply_errors.push(err);
                    if unreachable {
                        break;
                    }
                }
            }
        }
        // Patches once the children of this round are sent.
        if apply_errors.is_empty() {
            wrote |= super::patch::send_all(
                &ctx,
                rule,
                &plan,
                &mut observed,
                &uid,
                &mut patch_sent,
                &mut apply_errors,
            )
            .await?;
        }
        if !wrote || !apply_errors.is_empty() {
            break;
        }
        plan = plan_with(&observed);
        ctx.related.record(parent_ref.clone(), &plan.reads, since);
    }

    // Pruning waits for a pass in which everything applied.
    if apply_errors.is_empty() {
        for delete in &plan.delete {
            let Some(kind) = ctx.child_kind(&delete.key.group, &delete.key.kind) else {
                continue;
            };
            let api = ctx.api_for(kind, delete.key.namespace.as_deref());
            let params = DeleteParams {
                preconditions: delete.uid.clone().map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            ctx.check_write(&uid)?;
            match api.delete(&delete.key.name, &params).await {
                Ok(_) => {
                    ctx.shared.metrics.child_op(&rule.name, "delete");
                    info!(rule = %rule.name, parent = %key, child = %delete.id, object = %delete.key, "deleted");
                    summary.deleted.push(delete.key.to_string());
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(source) => apply_errors.push(ctx.attribute(Error::Delete {
                    key: delete.key.to_string(),
                    source,
                })),
            }
        }
        // Contributions and retained children no longer rendered.
        super::patch::release_all(&ctx, rule, &plan.release, &uid, &mut apply_errors).await?;
        super::release::retain_all(&ctx, rule, &plan.retain, &uid, &mut apply_errors).await?;
    }

    if !plan.errors.is_empty() {
        let reason = plan
            .failure_reason
            .unwrap_or(plan::FailureReason::RenderError)
            .as_str();
        warn!(rule = %rule.name, parent = %key, reason, "{}", plan.errors.join("; "));
        ctx.warn(parent, reason, plan.errors.join("; ")).await;
    }

    let mut status = plan.status.clone();
    if let (Some(status), false) = (status.as_mut(), apply_errors.is_empty()) {
        let message = apply_errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        let reason = super::patch::failure_reason(&apply_errors);
        mark_apply_error(status, reason, &message, &parent_json, &now);
        ctx.warn(parent, reason, message).await;
    }
    // A pass that cannot see a child this process made moments ago (its
    // watch event not in yet) knows less than the pass that made it, which
    // wrote the status from the API server's answer: its own status would
    // say the child "does not exist yet", and Ready would flap to False and
    // back (two writes, a NotReady Event; a restart in between finds the
    // False one and writes again). The child's event, or the requeue
    // below, brings a pass that sees it.
    if withholds_status(unseen, !apply_errors.is_empty() || !plan.errors.is_empty()) {
        status = None;
    } else {
        summary.ready = summary::ready_change(&parent_json, status.as_ref());
    }
    // Someone must fix it (the parent's Ready names it): a Warning, once,
    // unless the lost-readiness Warning of this pass already tells it.
    if let Some(note) = ctx
        .related
        .undecodable_warning(&parent_ref, &plan, &parent_json)
        && !matches!(summary.ready, Some(summary::ReadyChange::Lost(_)))
    {
        ctx.warn(parent, crate::plan::Unreadable::UNDECODABLE, note)
            .await;
    }
    if let Some((type_, reason, note)) = summary.event() {
        ctx.event(parent, type_, reason, note).await;
    }
    if let Some(status) = status {
        write_status(&ctx, rule, parent, &parent_json, status).await?;
    }

    if let Some(err) = apply_errors.into_iter().next() {
        return Err(err);
    }
    if plan.failure_reason == Some(plan::FailureReason::InvalidSpec) {
        // Only an edit of the parent (or the rule) can fix it; its Warning
        // stays recorded so that a wake-up without an edit writes nothing.
        return Ok(Action::await_change());
    }
    if !plan.errors.is_empty() {
        return Err(Error::Plan(plan.errors.join("; ")));
    }
    ctx.failures.clear(&key);
    Ok(next_pass(unseen, !plan.pending.is_empty(), rule.resync))
}

/// Whether a pass writes no status: it relied on a child it cannot see
/// (see above), and has no error of its own to report.
fn withholds_status(unseen: bool, failed: bool) -> bool {
    unseen && !failed
}

/// When a pass that ended without error looks again.
fn next_pass(unseen: bool, pending: bool, resync: Option<Duration>) -> Action {
    if unseen {
        // Its status waits for a pass that sees the child: soon, not at
        // the child's event alone (after a network outage a parent once
        // waited the full 30 s, saying that a child which existed did not,
        // no event having woken it). Until the child has been trusted unseen
        // for `UNSEEN_TRUST`, each recheck is a pass without a write; then
        // it is applied again (a deletion the cache saw before any pass
        // saw the child would otherwise wait for the next change).
        return Action::requeue(UNSEEN_RECHECK);
    }
    if pending {
        // Child watches normally wake us when a dependency turns ready; this is the safety net.
        return Action::requeue(Duration::from_secs(10));
    }
    match resync {
        Some(every) => Action::requeue(every),
        None => Action::await_change(),
    }
}

/// A parent that did not decode (too deep, malformed): reported on the
/// object — condition, Event, log, metric — and skipped. Only an edit wakes
/// it again.
async fn undecodable(ctx: &RuleCtx, parent: &DynamicObject, why: &str) -> Result<Action, Error> {
    let rule = ctx.rule();
    let key = parent_key(parent);
    ctx.shared
        .metrics
        .undecodable
        .get_or_create(&crate::telemetry::KindLabel {
            kind: ctx.kinds.parent.gvk.to_string(),
        })
        .inc();
    warn!(rule = %rule.name, parent = %key, "skipped: {why}");
    ctx.warn(parent, "Undecodable", why.to_owned()).await;
    let parent_json = serde_json::to_value(parent).map_err(|e| Error::Plan(e.to_string()))?;
    let observed = Observed::from_objects(Vec::new());
    let now = crate::clock::now_rfc3339();
    let scope_of = |g: &crate::kinds::Gvk| ctx.kinds.scope_of(g);
    let plan = plan::undecodable(
        &rule,
        &Input {
            parent: &parent_json,
            observed: &observed,
            now: &now,
            scope_of: &scope_of,
        },
        why,
    );
    if let Some(status) = plan.status {
        write_status(ctx, &rule, parent, &parent_json, status).await?;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const RULE: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: {{ parent.metadata.name ~ '-config' }}\n        data: {k: v}\n";

    /// The status the plan gives a parent whose ConfigMap the cache does not show.
    fn planned_without_the_child() -> Value {
        let rule = crate::rules::testing::rule_with_spec(RULE);
        let parent = json!({
            "apiVersion": "demo.trellis.dev/v1", "kind": "App",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {},
        });
        let observed = Observed::from_objects(Vec::new());
        let plan = plan::plan(
            &rule,
            &Input {
                parent: &parent,
                observed: &observed,
                now: "2026-12-01T00:00:00Z",
                scope_of: &crate::kinds::scope,
            },
        );
        assert!(plan.errors.is_empty(), "{:?}", plan.errors);
        plan.status.expect("a status")
    }

    #[test]
    fn a_pass_that_cannot_see_a_child_it_just_made_writes_no_status_and_looks_again_in_a_second() {
        // What it would write is false: the child exists, the pass that
        // made it wrote the status from the API server's answer.
        let planned = planned_without_the_child();
        assert!(
            planned.to_string().contains("does not exist yet"),
            "{planned}"
        );
        assert!(withholds_status(true, false));
        let hour = Some(Duration::from_secs(3600));
        for (pending, resync) in [(false, None), (true, None), (false, hour), (true, hour)] {
            assert_eq!(
                next_pass(true, pending, resync),
                Action::requeue(Duration::from_secs(1)),
                "pending {pending}, resync {resync:?}"
            );
        }
    }

    #[test]
    fn a_pass_that_cannot_see_a_child_it_just_made_still_reports_its_own_errors() {
        assert!(!withholds_status(true, true));
    }

    #[test]
    fn a_child_never_made_and_not_in_the_cache_is_reported_as_not_existing_yet() {
        let planned = planned_without_the_child();
        assert!(
            planned.to_string().contains("does not exist yet"),
            "{planned}"
        );
        assert!(
            !withholds_status(false, false),
            "the usual status is written"
        );
        assert_eq!(next_pass(false, false, None), Action::await_change());
        assert_eq!(
            next_pass(false, true, None),
            Action::requeue(Duration::from_secs(10))
        );
    }
}
