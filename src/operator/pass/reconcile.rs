//! Reconciling one parent: caches → `plan` → carry the plan out.
//!
//! Nothing here decides *what* a parent needs; that is `plan`'s job. This
//! module is the pass: it waits for the caches, plans, hands each child to
//! [`super::apply`], prunes, and hands the status to
//! [`super::status_write`]; a parent being deleted goes to
//! [`super::finalize`].

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::{DeleteParams, DynamicObject, Preconditions, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::apply::{Applied, Outcome, apply_child};
use super::finalize::{finalize, set_finalizers};
use super::status_write::write_status;
use super::summary::{self, Summary};
use super::trace::Trace;
use crate::operator::FINALIZER;
use crate::operator::context::{Error, RuleCtx, parent_key};
use crate::operator::watches::decode::ParentObject;
use crate::operator::watches::related::{self, ParentRef};
use crate::pass::{self, Entry, Finish, Next, Rounds, Sent};
use crate::plan::{self, Input, ObjectKey, Observed, Plan};
use crate::rules::CompiledRule;
use crate::status_patch::mark_apply_error;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};

/// How soon a pass refused by a late member Lease renewal is tried again.
const FENCED_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// [`reconcile`], counted and timed in the metrics.
pub async fn reconcile_measured(
    parent: Arc<ParentObject>,
    ctx: Arc<RuleCtx>,
) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let rule = ctx.rule().name.clone();
    let skipped = AtomicBool::new(false);
    let uid = parent.object.metadata.uid.clone().unwrap_or_default();
    let result = match reconcile(parent, ctx.clone(), &skipped).await {
        // Under --shards, a parent of our bucket refused while our member
        // Lease's renewal is late: tried again shortly (under load a slow
        // renewal refused every pass of an edit, and nothing woke them).
        Err(Error::NotLeader(_))
            if ctx
                .shared
                .shards
                .as_ref()
                .is_some_and(|s| s.fenced_out(&uid)) =>
        {
            return Ok(Action::requeue(FENCED_RETRY));
        }
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
    // A pass that decided nothing (paused, held in its backoff, waiting for
    // its caches or its rule's first version) is neither a success nor a
    // failure: counted apart, so error rates and panels stay true.
    let outcome = match (&result, skipped.load(Ordering::Relaxed)) {
        (Err(_), _) => "error",
        (Ok(_), true) => "skipped",
        (Ok(_), false) => "ok",
    };
    metrics
        .reconciles
        .get_or_create(&crate::telemetry::ResultLabel {
            rule,
            result: outcome.into(),
        })
        .inc();
    result
}

/// One pass over `parent`; `skipped` is set when it returns without
/// planning (see [`reconcile_measured`]).
pub async fn reconcile(
    parent: Arc<ParentObject>,
    ctx: Arc<RuleCtx>,
    skipped: &AtomicBool,
) -> Result<Action, Error> {
    let mut trace = Trace::start();
    let skip = |action: Action| {
        skipped.store(true, Ordering::Relaxed);
        action
    };
    let parent_uid = parent.object.metadata.uid.as_deref().unwrap_or_default();
    // Under --shards a pass runs only in a bucket this replica writes, and
    // counts as running until it ends: the handover waits for it.
    let _pass = match &ctx.shared.shards {
        None => {
            ctx.shared.gate.check()?;
            None
        }
        Some(shards) => Some(
            shards
                .begin(parent_uid)
                .ok_or(crate::operator::leadership::leader::NotLeader)?,
        ),
    };
    // Planning on a half-filled cache would re-create what exists (and
    // re-roll `createOnly` secrets): wait until every child kind is listed,
    // but never past the rule's stop, so shutdown is never held up.
    let mut ready = ctx.caches_ready.clone();
    tokio::select! {
        listed = ready.wait_for(|r| *r) => if listed.is_err() {
            return Err(Error::Plan("child cache was dropped".into()));
        },
        _ = ctx.stop.cancelled() => return Ok(skip(Action::await_change())),
    }
    // A bucket just gained may still be listing its children: planning now
    // would re-create them. Its listing wakes the parent again.
    if ctx.shared.shards.is_some()
        && !ctx
            .listed_buckets()
            .contains(crate::shard::bucket_of(parent_uid))
    {
        return Ok(skip(Action::await_change()));
    }
    // Spokes still being listed (at start, after a Secret rotation): the
    // pass would hold their children back as unreachable, or re-create
    // what exists. Their listing wakes every parent of the rule.
    if ctx.shared.clusters.settling(&ctx.rule()) {
        return Ok(skip(Action::await_change()));
    }
    let _permit = tokio::select! {
        permit = ctx.shared.permits.acquire() => permit,
        _ = ctx.stop.cancelled() => return Ok(skip(Action::await_change())),
    };
    trace.permit = trace.lap();
    ctx.sweep();
    // The status this process wrote last, then the parent as the cache has
    // it now, in that order: the parent watch forgets a written status once
    // it stored the parent past it. Read the other way round, a status
    // written, then stored, between the two reads is in neither: the pass
    // would read the status before it and write it again.
    let written = ctx.written_status(parent_uid);
    let parent = ctx.newest(parent);
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
        return Ok(skip(Action::requeue(wait)));
    }
    let mut parent_json = serde_json::to_value(parent).map_err(|e| Error::Plan(e.to_string()))?;
    if let Some((over, status)) = written
        && parent.resource_version().as_deref() == Some(over.as_str())
    {
        parent_json["status"] = status;
    }
    let parent_ref = related::parent_ref(parent, &ctx.kinds.parent.resource);
    match pass::entry(rule, &parent_json, None) {
        Entry::Proceed => {}
        Entry::Deleting => return finalize(parent, &ctx, &uid).await,
        Entry::OutOfScope(why) => {
            // Outside the rule (a watch not yet restarted after a reload
            // narrowed it): finalized as one that left it.
            debug!(rule = %rule.name, parent = %key, "outside the rule: {why}");
            ctx.related.forget(&parent_ref);
            if let Some(candidate) = super::released::Candidate::of(parent, true) {
                let _ = ctx.released.send(candidate);
            }
            return Ok(skip(Action::await_change()));
        }
        Entry::Paused => {
            debug!(rule = %rule.name, parent = %key, "paused");
            return Ok(skip(Action::await_change()));
        }
        Entry::Undecodable(why) => return undecodable(&ctx, parent, &why).await,
    }
    // A rule with `rollout:` runs no pass until the version its parents are
    // on is recorded in the cluster: a pass on an unrecorded version, then
    // an edit, would make the edit the "first" version and move every
    // parent at once. The leader records it at the rollout's first look,
    // which wakes every parent.
    if rule.rollout.is_some() && ctx.versions.record().is_none() {
        debug!(rule = %rule.name, parent = %key, "waiting for the rule's first version to be recorded");
        return Ok(skip(Action::await_change()));
    }
    // The version this parent is due to run: the newest, unless a staged
    // rollout keeps it on an earlier one. The whole pass uses it.
    let rule = &ctx.rule_for(&parent_json, &uid);
    trace.prepare = trace.lap();
    let pass = Pass {
        ctx: &ctx,
        rule,
        parent,
        parent_json: &parent_json,
        parent_ref: &parent_ref,
        key: &key,
        uid: &uid,
        now: crate::clock::now_rfc3339(),
        // Related objects are looked up in their caches per read; `since`
        // lets the index catch an event landing between those reads and
        // the record.
        since: ctx.related.seq(),
        observed: Observed::from_objects(ctx.observed(&uid)).with_related(ctx.related.clone()),
        rounds: Rounds::new(rule),
        summary: Summary::default(),
        errors: Vec::new(),
        patch_sent: BTreeMap::new(),
        trace,
    };
    pass.run().await
}

/// One pass over one parent that is due to run: what it reads, and what it
/// has done so far. What to do next is the core's [`pass`] decider's; this
/// carries it out.
struct Pass<'a> {
    ctx: &'a RuleCtx,
    /// The version this parent runs.
    rule: &'a CompiledRule,
    parent: &'a DynamicObject,
    parent_json: &'a Value,
    parent_ref: &'a ParentRef,
    key: &'a str,
    uid: &'a str,
    now: String,
    since: u64,
    /// The caches' children, then what the API server answered.
    observed: Observed,
    rounds: Rounds,
    summary: Summary,
    /// Every write that failed, in order.
    errors: Vec<Error>,
    /// Contribution key → hash sent this pass.
    patch_sent: BTreeMap<ObjectKey, String>,
    trace: Trace,
}

impl Pass<'_> {
    fn plan(&mut self) -> Plan {
        let started = std::time::Instant::now();
        let scope_of = |g: &crate::kinds::Gvk| self.ctx.scope_of(g);
        let plan = plan::plan(
            self.rule,
            &Input {
                parent: self.parent_json,
                observed: &self.observed,
                now: &self.now,
                scope_of: &scope_of,
                clusters: &self.ctx.shared.clusters.view(self.rule),
            },
        );
        self.trace.plan += started.elapsed();
        plan
    }

    async fn run(mut self) -> Result<Action, Error> {
        let (ctx, rule, parent) = (self.ctx, self.rule, self.parent);
        let mut plan = self.plan();
        ctx.related
            .record(self.parent_ref.clone(), &plan.reads, self.since);
        debug!(
            rule = %rule.name,
            parent = %self.key,
            reads = plan.reads.len(),
            apply = plan.apply.len(),
            pending = plan.pending.len(),
            "planned"
        );
        // The finalizer goes on before anything that needs it is written:
        // checked again each round, as a child placed in a spoke may be
        // rendered only once what it depends on is ready.
        let mut finalized = parent.finalizers().iter().any(|f| f == FINALIZER);
        if plan.needs_finalizer && !finalized {
            add_finalizer(ctx, parent).await?;
            finalized = true;
        }
        // Each round applies what the plan asks, then plans again with the
        // objects the API server answered as observed state.
        while self.rounds.begin_round() {
            let mut wrote = self.send_children(&plan).await?;
            // Patches once the children of this round are sent.
            if self.rounds.patches_due() {
                wrote |= super::patch_writes::send_all(
                    ctx,
                    rule,
                    &plan,
                    &mut self.observed,
                    self.uid,
                    &mut self.patch_sent,
                    &mut self.errors,
                )
                .await?;
                if !self.errors.is_empty() {
                    self.rounds.failed();
                }
            }
            if !self.rounds.round_done(wrote) {
                break;
            }
            plan = self.plan();
            ctx.related
                .record(self.parent_ref.clone(), &plan.reads, self.since);
            if plan.needs_finalizer && !finalized {
                // The parent as read: only this pass writes it before its status.
                add_finalizer(ctx, parent).await?;
                finalized = true;
            }
        }
        if self.rounds.may_prune() {
            self.prune(&plan).await?;
        }
        self.report(&plan).await?;
        self.trace.log(&rule.name, self.key);
        match self.rounds.finish(&plan, rule.resync) {
            Finish::WriteFailed => Err(self
                .errors
                .into_iter()
                .next()
                .unwrap_or_else(|| Error::Plan("a write failed".into()))),
            Finish::Stop => Ok(Action::await_change()),
            Finish::PlanFailed => Err(Error::Plan(plan.errors.join("; "))),
            Finish::Next(next) => {
                ctx.failures.clear(self.key);
                Ok(action(next))
            }
        }
    }

    /// Sends this round's children; whether any answer is observed now.
    async fn send_children(&mut self, plan: &Plan) -> Result<bool, Error> {
        let (ctx, rule, key) = (self.ctx, self.rule, self.key);
        let mut wrote = false;
        for apply in self.rounds.to_send(plan) {
            if !self.rounds.round_goes_on() {
                break;
            }
            let live = self.observed.objects.get(&apply.key);
            let started = std::time::Instant::now();
            let result = apply_child(ctx, apply, live, self.uid).await;
            let wrote_it = matches!(
                &result,
                Ok(Applied {
                    outcome: Outcome::Created | Outcome::Updated,
                    ..
                })
            );
            self.trace
                .children
                .push((apply.id.clone(), started.elapsed(), wrote_it));
            let (sent, object) = match result {
                Err(Error::NotLeader(not)) => return Err(not.into()),
                Ok(applied) => {
                    let sent = match applied.outcome {
                        Outcome::Unchanged if applied.object.is_none() => Sent::Unchanged,
                        // Read after a refused create, or arrived in the
                        // cache since the pass took its children: the
                        // status counts it as there.
                        Outcome::Unchanged => Sent::Found,
                        Outcome::Unseen => Sent::Unseen,
                        Outcome::Created => {
                            info!(rule = %rule.name, parent = %key, child = %apply.id, object = %apply.key, "created");
                            self.summary.created.push(apply.key.to_string());
                            Sent::Created
                        }
                        Outcome::Updated => {
                            info!(rule = %rule.name, parent = %key, child = %apply.id, object = %apply.key, "applied");
                            self.summary.updated.push(apply.key.to_string());
                            Sent::Updated
                        }
                    };
                    (sent, applied.object)
                }
                Err(err) => {
                    let err = ctx.attribute(err);
                    warn!(rule = %rule.name, parent = %key, child = %apply.id, "{err}");
                    ctx.count_api_error(&err);
                    let sent = Sent::Failed {
                        unreachable: err.is_transport(),
                    };
                    self.errors.push(err);
                    (sent, None)
                }
            };
            if let (Sent::Created | Sent::Updated, Some(object)) = (sent, &object) {
                ctx.own.wrote(&apply.key, object);
            }
            let recorded = self.rounds.record(apply, sent);
            if recorded.count {
                ctx.shared.metrics.child_op(&rule.name, op_label(sent));
            }
            if let (true, Some(object)) = (recorded.observe, object) {
                self.observed.objects.insert(apply.key.clone(), object);
                wrote = true;
            }
        }
        Ok(wrote)
    }

    /// Deletes what the plan no longer renders, releases contributions and
    /// retained children no longer rendered: only after a pass in which
    /// everything applied.
    async fn prune(&mut self, plan: &Plan) -> Result<(), Error> {
        let (ctx, rule, key, uid) = (self.ctx, self.rule, self.key, self.uid);
        for delete in &plan.delete {
            // Deleted by an earlier pass, still in the cache: once is enough.
            if ctx.own.was_deleted(delete.uid.as_deref()) {
                continue;
            }
            let Ok(api) = ctx.child_api(&delete.key) else {
                continue;
            };
            let params = DeleteParams {
                preconditions: delete.uid.clone().map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            ctx.check_write(uid)?;
            match api.delete(&delete.key.name, &params).await {
                Ok(_) => {
                    ctx.own.deleted(delete.uid.as_deref());
                    ctx.shared.metrics.child_op(&rule.name, "delete");
                    info!(rule = %rule.name, parent = %key, child = %delete.id, object = %delete.key, "deleted");
                    self.summary.deleted.push(delete.key.to_string());
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(source) => {
                    self.rounds.failed();
                    self.errors.push(ctx.attribute(Error::Delete {
                        key: delete.key.to_string(),
                        source,
                    }));
                }
            }
        }
        super::patch_writes::release_all(ctx, rule, &plan.release, uid, &mut self.errors).await?;
        super::release::retain_all(ctx, rule, &plan.retain, uid, &mut self.errors).await?;
        if !self.errors.is_empty() {
            self.rounds.failed();
        }
        Ok(())
    }

    /// What the pass tells: Warnings for its errors, the status (unless
    /// withheld), at most one summary Event.
    async fn report(&mut self, plan: &Plan) -> Result<(), Error> {
        let (ctx, rule, parent, key) = (self.ctx, self.rule, self.parent, self.key);
        if !plan.errors.is_empty() {
            let reason = plan
                .failure_reason
                .unwrap_or(plan::FailureReason::RenderError)
                .as_str();
            warn!(rule = %rule.name, parent = %key, reason, "{}", plan.errors.join("; "));
            ctx.warn(parent, reason, plan.errors.join("; ")).await;
        }
        let mut status = plan.status.clone();
        if let (Some(status), false) = (status.as_mut(), self.errors.is_empty()) {
            let message = self
                .errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            let reason = super::patch_writes::failure_reason(&self.errors);
            mark_apply_error(status, reason, &message, self.parent_json, &self.now);
            ctx.warn(parent, reason, message).await;
        }
        // A pass that cannot see a child this process made moments ago
        // writes no status (see `pass::Rounds::withholds_status`): the
        // child's event, or the requeue, brings a pass that sees it.
        if self.rounds.withholds_status(plan) {
            status = None;
        } else {
            self.summary.ready = summary::ready_change(self.parent_json, status.as_ref());
        }
        // Someone must fix it (the parent's Ready names it): a Warning,
        // once, unless the lost-readiness Warning of this pass tells it.
        if let Some(note) = ctx
            .related
            .undecodable_warning(self.parent_ref, plan, self.parent_json)
            && !matches!(self.summary.ready, Some(summary::ReadyChange::Lost(_)))
        {
            ctx.warn(parent, crate::plan::Unreadable::UNDECODABLE, note)
                .await;
        }
        if let Some((type_, reason, note)) = self.summary.event() {
            ctx.event(parent, type_, reason, note).await;
        }
        if let Some(status) = status {
            let started = std::time::Instant::now();
            self.trace.status_written =
                write_status(ctx, rule, parent, self.parent_json, status).await?;
            self.trace.status = started.elapsed();
        }
        Ok(())
    }
}

/// The metrics label of what became of a child.
fn op_label(sent: Sent) -> &'static str {
    match sent {
        Sent::Unchanged | Sent::Found | Sent::Unseen => "unchanged",
        Sent::Created => "create",
        Sent::Updated => "update",
        Sent::Failed { .. } => "error",
    }
}

/// The controller's action for when the pass looks again.
fn action(next: Next) -> Action {
    match next {
        Next::OnChange => Action::await_change(),
        Next::After(after) => Action::requeue(after),
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
    let scope_of = |g: &crate::kinds::Gvk| ctx.scope_of(g);
    let plan = plan::undecodable(
        &rule,
        &Input {
            parent: &parent_json,
            observed: &observed,
            now: &now,
            scope_of: &scope_of,
            clusters: &crate::clusters::Clusters::offline(),
        },
        why,
    );
    if let Some(status) = plan.status {
        write_status(ctx, &rule, parent, &parent_json, status).await?;
    }
    Ok(Action::await_change())
}

/// Adds the cleanup finalizer to the parent as read, keeping the others.
async fn add_finalizer(ctx: &RuleCtx, parent: &DynamicObject) -> Result<(), Error> {
    let mut finalizers = parent.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    set_finalizers(ctx, parent, finalizers).await
}
