//! Driving a rule's staged rollout: the leader's duty, every [`TICK`].
//!
//! ```text
//!  revision ConfigMaps ──watch──▶ Revisions (+ own writes not yet shown) ─┐
//!  parent cache ──▶ ParentView (uid, canary, on, health) ──▶ State::step ──▶ changed?
//!                                                              │ yes
//!        write the target's ConfigMap (durable first) ◀────────┘
//!        then: Events (Upgraded / RolledBack / RolloutFailed), wake the
//!        moved parents' reconciles, one log line per step
//! ```
//!
//! A standby only reads the ConfigMaps back into [`Versions`], so that it
//! renders (and, once leader, decides) from where the leader left off. No
//! tick sends anything when nothing changed: the ConfigMaps come from a
//! watch (while the rule has `rollout:`), the parents from the rule's cache;
//! a restart reads the state, finds the same parents, and moves nobody. A
//! change the watch shows (a decision, the leader's step seen by a standby)
//! is looked at at once rather than at the next tick.
//!
//! Files: this one (the tick), `versions.rs` (the versions and the state,
//! kept in ConfigMaps), `revision_watch.rs` (the watch that reads them).
//!
//! [`Versions`]: versions::Versions

pub(super) mod revision_watch;
pub mod versions;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info, warn};

use super::context::RuleCtx;
use super::watches::decode::ParentObject;
use crate::plan::LABEL_REVISION;
use crate::rollout::{Effect, Health, Input, ParentView, Phase, Settings, State};
use crate::rules::CompiledRule;
use revision_watch::Revisions;
use versions::Record;

/// How often the leader looks at a rollout (and a standby reads it back).
pub const TICK: Duration = Duration::from_secs(2);

/// Reasons of `Synced=False` that mean "waiting", not "failed".
const WAITING: &[&str] = &[
    "DependencyNotReady",
    "RelatedNotFound",
    "RelatedNotReady",
    "RelatedKindNotServed",
    "TargetNotFound",
];

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Ticks until the rule stops, and looks at once when the watch shows a change.
pub(super) async fn run(ctx: Arc<RuleCtx>, wake: UnboundedSender<ObjectRef<ParentObject>>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Watched only while the rule has `rollout:` (the Role grants the
    // ConfigMaps only then); a reload may add or drop it.
    let mut watch: Option<BoxStream<'static, watcher::Event<ConfigMap>>> = None;
    let mut revisions = Revisions::default();
    loop {
        let event = async {
            match watch.as_mut() {
                Some(events) => events.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ctx.stop.cancelled() => return,
            _ = tick.tick() => {}
            Some(event) = event => {
                if !revisions.observe(event) {
                    continue;
                }
                tick.reset();
            }
        }
        match (ctx.rule().rollout.is_some(), watch.is_some()) {
            (true, false) => {
                let (client, ns) = (&ctx.shared.client, &ctx.shared.operator_namespace);
                watch = Some(revision_watch::watch(client, ns, &ctx.rule().name));
            }
            (false, true) => {
                watch = None;
                revisions = Revisions::default();
            }
            _ => {}
        }
        if let Err(err) = once(&ctx, &wake, &mut revisions).await {
            warn!(rule = %ctx.rule().name, "rollout: {err}");
        }
    }
}

/// One look at the rollout.
async fn once(
    ctx: &RuleCtx,
    wake: &UnboundedSender<ObjectRef<ParentObject>>,
    revisions: &mut Revisions,
) -> Result<(), kube::Error> {
    let newest = ctx.rule();
    let Some(settings) = newest.rollout.clone() else {
        return without_rollout(ctx, &newest).await;
    };
    // On a half-listed cache the order and N would be wrong, and a restart
    // could move parents that are not due: wait for the first full list
    // (of the parents, the children and the revision ConfigMaps).
    use futures::FutureExt;
    if !*ctx.caches_ready.borrow()
        || ctx.parents.wait_until_ready().now_or_never().is_none()
        || !revisions.listed()
    {
        return Ok(());
    }
    let (client, ns) = (&ctx.shared.client, ctx.shared.operator_namespace.as_str());
    let stored = revisions.stored();
    let before = ctx.versions.record();
    ctx.versions.absorb(&stored, &newest, ctx.shared.limits);
    if !ctx.shared.gate.may_write() {
        let record = ctx.versions.record();
        // Under --shards the leader decides but each parent's owner moves
        // it: a decision read back here wakes this replica's parents (those
        // of other buckets end their pass at once), and so does the first
        // version recorded, which their passes wait for.
        if ctx.shared.shards.is_some() && record.is_some() && record != before {
            wake_all(ctx, wake);
        }
        publish(ctx, Some(&settings), record.as_ref());
        return Ok(());
    }
    let now = unix_now();
    let current = versions::current_record(&stored, &newest.revision);
    let Some(mut record) = current.and_then(|s| s.record.clone()) else {
        // The first version, made durable before any parent runs it: no
        // pass of a rule with `rollout:` runs without a record (see
        // `reconcile`), so no parent is on another version of this text's
        // history, and an edit from now on is staged from this version.
        let record = Record {
            state: State::start(&newest.revision, &newest.revision, now),
            handled: Vec::new(),
        };
        revisions.wrote(&versions::write(client, ns, &newest, Some(&record)).await?);
        ctx.versions.set(Some(record.clone()), &newest);
        info!(rule = %newest.name, revision = %newest.revision, "rollout: first version of the rule recorded; its parents' passes may run");
        publish(ctx, Some(&settings), Some(&record));
        wake_all(ctx, wake);
        return Ok(());
    };
    let mut decision = current.and_then(|s| s.decision.clone());
    if record.state.to != newest.revision {
        let failed = stored
            .iter()
            .any(|s| s.revision == newest.revision && s.failed());
        if !failed {
            let previous = record.state.clone();
            record = Record {
                state: previous.retarget(&newest.revision, now),
                handled: record.handled,
            };
            revisions.wrote(&versions::write(client, ns, &newest, Some(&record)).await?);
            ctx.versions.set(Some(record.clone()), &newest);
            decision = None;
            info!(
                rule = %newest.name,
                from = %record.state.from,
                to = %record.state.to,
                between = record.state.between.as_deref().unwrap_or(""),
                "rollout: a new version, from the first step"
            );
            // Parents on an in-between version that is no longer live go back.
            wake_all(ctx, wake);
        }
    }
    let target = if record.state.to == newest.revision {
        newest.clone()
    } else {
        match ctx.versions.compiled(&record.state.to) {
            Some(rule) => rule,
            None => return Ok(()),
        }
    };
    let input = decision_input(&mut record, decision, &newest.name);
    let parents: Vec<Arc<ParentObject>> = ctx.parents.state();
    let views: Vec<ParentView> = parents
        .iter()
        .filter(|p| p.object.metadata.deletion_timestamp.is_none())
        .map(|p| view(ctx, &newest, &settings, &record.state.to, p))
        .collect();
    let before = record.clone();
    let effects = record
        .state
        .step(&settings, &newest.name, now, &views, input);
    if record != before {
        revisions.wrote(&versions::write(client, ns, &target, Some(&record)).await?);
        ctx.versions.set(Some(record.clone()), &newest);
        if input != Input::Tick {
            info!(rule = %newest.name, decision = ?input, "rollout: decision acted on");
        }
        carry_out(ctx, &settings, &record.state, &parents, &effects, wake).await;
    }
    let live = record.state.live();
    // A version no longer live has no parents to count: no series.
    for gone in stored
        .iter()
        .filter(|s| !live.contains(&s.revision.as_str()))
    {
        ctx.shared
            .metrics
            .rollout_parents
            .remove(&crate::telemetry::RevisionLabel {
                rule: newest.name.clone(),
                revision: gone.revision.clone(),
            });
    }
    for name in versions::prune(client, ns, &newest.name, &stored, &live).await {
        revisions.deleted(&name);
    }
    publish(ctx, Some(&settings), Some(&record));
    Ok(())
}

/// A rule without `rollout:` (any more): nothing to publish, and its
/// leftover revision ConfigMaps, once, deleted.
async fn without_rollout(ctx: &RuleCtx, newest: &CompiledRule) -> Result<(), kube::Error> {
    publish(ctx, None, None);
    if ctx.shared.gate.may_write() && ctx.versions.needs_clearing(&newest.revision) {
        let (client, ns) = (&ctx.shared.client, ctx.shared.operator_namespace.as_str());
        let deleted = match versions::delete_all(client, ns, &newest.name).await {
            Ok(deleted) => deleted,
            Err(kube::Error::Api(e)) if e.code == 403 => {
                // `trellis rbac` grants ConfigMaps in the operator's
                // namespace only while some rule has `rollout:`, and the
                // preflight does not ask for them for a rule without
                // it: said once, not retried every tick.
                info!(rule = %newest.name, namespace = ns, "rollout: not looking for leftover revision ConfigMaps of the rule: the operator may not list ConfigMaps in its namespace (any left stay)");
                ctx.versions.cleared(&newest.revision);
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        if deleted > 0 {
            info!(rule = %newest.name, deleted, "rollout: the rule has no rollout: any more; its revision ConfigMaps deleted");
        }
        ctx.versions.cleared(&newest.revision);
    }
    Ok(())
}

/// The input of this step: a decision not handled yet (remembered as
/// handled, the last ten), or a tick.
fn decision_input(record: &mut Record, decision: Option<(String, String)>, rule: &str) -> Input {
    match decision {
        Some((what, token)) => {
            record.handled.push(token);
            let keep = record.handled.len().saturating_sub(10);
            record.handled.drain(..keep);
            match what.as_str() {
                "promote" => Input::Promote,
                "abort" => Input::Abort,
                other => {
                    warn!(rule = %rule, "rollout: unknown decision `{other}` ignored");
                    Input::Tick
                }
            }
        }
        None => Input::Tick,
    }
}

/// What the rollout sees of a parent.
fn view(
    ctx: &RuleCtx,
    newest: &CompiledRule,
    settings: &Settings,
    to: &str,
    parent: &ParentObject,
) -> ParentView {
    let meta = &parent.object.metadata;
    let uid = meta.uid.clone().unwrap_or_default();
    let labels = parent.object.labels();
    let canary = settings.canary.as_ref().is_some_and(|selector| {
        crate::plan::selector_matches_with(selector, |k| labels.get(k).map(String::as_str))
    });
    let status = parent.status_value();
    let on = revision_on(ctx, status.as_ref(), &uid);
    let health = if !newest.writes_status() {
        // No status to read health from: being on the version is all there is.
        Health::Healthy
    } else {
        health(
            status.as_ref(),
            meta.generation,
            &settings.condition,
            on.as_deref() == Some(to),
        )
    };
    ParentView {
        uid,
        canary,
        on,
        health,
    }
}

/// The revision a parent is on: its `status.ruleRevision`, else the label
/// of one of its children.
pub(super) fn revision_on(ctx: &RuleCtx, status: Option<&Value>, uid: &str) -> Option<String> {
    if let Some(rev) = status
        .and_then(|s| s.get("ruleRevision"))
        .and_then(Value::as_str)
    {
        return Some(rev.to_owned());
    }
    ctx.observed(uid).iter().find_map(|c| {
        c.pointer("/metadata/labels")
            .and_then(|l| l.get(LABEL_REVISION))
            .and_then(Value::as_str)
            .map(str::to_owned)
    })
}

/// Healthy: `condition` True at the current generation; failed: `Synced`
/// False at the current generation for a reason other than waiting.
fn health(
    status: Option<&Value>,
    generation: Option<i64>,
    condition: &str,
    on_new: bool,
) -> Health {
    let Some(status) = status else {
        return Health::NotYet;
    };
    let observed = status.get("observedGeneration").and_then(Value::as_i64);
    let find = |t: &str| {
        status
            .get("conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
    };
    let current = |c: &Value| {
        let at = c
            .get("observedGeneration")
            .and_then(Value::as_i64)
            .or(observed);
        generation.is_none() || at == generation
    };
    if let Some(c) = find(condition)
        && c["status"] == "True"
        && current(c)
    {
        return Health::Healthy;
    }
    if on_new
        && let Some(c) = find("Synced")
        && c["status"] == "False"
        && current(c)
    {
        let reason = c["reason"].as_str().unwrap_or("");
        if !WAITING.contains(&reason) {
            let message = c["message"].as_str().unwrap_or("");
            return Health::Failed(format!("{reason}: {message}"));
        }
    }
    Health::NotYet
}

/// Events, wake-ups and log lines for what a step decided.
async fn carry_out(
    ctx: &RuleCtx,
    settings: &Settings,
    state: &State,
    parents: &[Arc<ParentObject>],
    effects: &[Effect],
    wake: &UnboundedSender<ObjectRef<ParentObject>>,
) {
    let by_uid: HashMap<String, &Arc<ParentObject>> = parents
        .iter()
        .filter_map(|p| Some((p.object.metadata.uid.clone()?, p)))
        .collect();
    let rule = ctx.rule().name.clone();
    let step = format!("{}/{}", state.step + 1, settings.steps.len());
    let mut moved = 0;
    for effect in effects {
        match effect {
            Effect::Moved(uid) => {
                moved += 1;
                if let Some(p) = by_uid.get(uid) {
                    let note = format!(
                        "moves to rule {rule} revision {} (from {}; step {step})",
                        state.to, state.from
                    );
                    ctx.leader_event(&p.to_object(), EventType::Normal, "Upgraded", note)
                        .await;
                    wake_one(ctx, p, wake);
                }
            }
            Effect::Failed(uid, why) => {
                warn!(rule = %rule, parent = %uid, revision = %state.to, "rollout: a moved parent failed: {why}");
                if let Some(p) = by_uid.get(uid) {
                    let note = format!("on rule {rule} revision {}: {why}", state.to);
                    ctx.leader_event(&p.to_object(), EventType::Warning, "RolloutFailed", note)
                        .await;
                }
            }
            Effect::RolledBack(uids) => {
                warn!(rule = %rule, from = %state.to, to = %state.from, parents = uids.len(), failed = state.failed.len(), "rollout: rolled back; the new version is marked failed");
                for uid in uids {
                    if let Some(p) = by_uid.get(uid) {
                        let note = format!(
                            "back to rule {rule} revision {} (revision {} failed or was aborted)",
                            state.from, state.to
                        );
                        ctx.leader_event(&p.to_object(), EventType::Normal, "RolledBack", note)
                            .await;
                        wake_one(ctx, p, wake);
                    }
                }
            }
            Effect::Halted => {
                warn!(rule = %rule, to = %state.to, failed = state.failed.len(), "rollout: halted; `trellis rollout promote` resumes, `abort` goes back")
            }
            Effect::Step(_) | Effect::Paused | Effect::Complete => {}
        }
    }
    let stepped = effects
        .iter()
        .any(|e| matches!(e, Effect::Step(_) | Effect::Paused | Effect::Complete));
    if moved > 0 || stepped {
        info!(
            rule = %rule,
            from = %state.from,
            to = %state.to,
            step = %step,
            moved = state.moved.len(),
            total = state.total,
            failed = state.failed.len(),
            state = state.phase.as_str(),
            "rollout: step"
        );
    }
}

fn wake_one(ctx: &RuleCtx, parent: &ParentObject, wake: &UnboundedSender<ObjectRef<ParentObject>>) {
    let _ = wake.send(ObjectRef::from_obj_with(
        parent,
        ctx.kinds.parent.resource.clone(),
    ));
}

fn wake_all(ctx: &RuleCtx, wake: &UnboundedSender<ObjectRef<ParentObject>>) {
    for p in ctx.parents.state() {
        wake_one(ctx, &p, wake);
    }
}

/// `/status` → `rules.<name>.rollout` and the rollout metrics.
fn publish(ctx: &RuleCtx, settings: Option<&Settings>, record: Option<&Record>) {
    let rule = ctx.rule().name.clone();
    let metrics = &ctx.shared.metrics;
    let (Some(settings), Some(record)) = (settings, record) else {
        super::lock(&ctx.shared.rollouts).remove(&rule);
        return;
    };
    let state = &record.state;
    let mut on: HashMap<String, i64> = HashMap::new();
    for p in ctx.parents.state() {
        let uid = p.object.metadata.uid.clone().unwrap_or_default();
        if let Some(rev) = revision_on(ctx, p.status_value().as_ref(), &uid) {
            *on.entry(rev).or_default() += 1;
        }
    }
    for rev in state.live() {
        metrics
            .rollout_parents
            .get_or_create(&crate::telemetry::RevisionLabel {
                rule: rule.clone(),
                revision: rev.to_owned(),
            })
            .set(on.get(rev).copied().unwrap_or(0));
    }
    for phase in Phase::ALL {
        metrics
            .rollout_state
            .get_or_create(&crate::telemetry::PhaseLabel {
                rule: rule.clone(),
                state: phase.as_str().to_owned(),
            })
            .set(i64::from(phase == state.phase));
    }
    let since = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(state.since));
    let entry = json!({
        "from": state.from,
        "to": state.to,
        "between": state.between,
        "step": state.step + 1,
        "steps": settings.steps.len(),
        "moved": state.moved.len(),
        "total": state.total,
        "failed": state.failed.len(),
        "state": state.phase.as_str(),
        "since": since.to_string(),
        "resumeAt": state.resume_at(settings).map(|at| humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(at)).to_string()),
    });
    super::lock(&ctx.shared.rollouts).insert(rule, entry);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(conditions: Value) -> Value {
        json!({"observedGeneration": 2, "ruleRevision": "b", "conditions": conditions})
    }

    #[test]
    fn healthy_means_the_condition_true_at_the_current_generation() {
        let ready = status(json!([{"type": "Ready", "status": "True", "observedGeneration": 2}]));
        assert_eq!(
            health(Some(&ready), Some(2), "Ready", true),
            Health::Healthy
        );
        assert_eq!(
            health(Some(&ready), Some(3), "Ready", true),
            Health::NotYet,
            "True for an older generation says nothing of this one"
        );
        assert_eq!(
            health(Some(&ready), Some(2), "Serving", true),
            Health::NotYet
        );
        assert_eq!(health(None, Some(2), "Ready", true), Health::NotYet);
    }

    #[test]
    fn a_failed_pass_on_the_new_version_is_a_failure_and_waiting_is_not() {
        let failed = status(json!([
            {"type": "Ready", "status": "False", "observedGeneration": 2},
            {"type": "Synced", "status": "False", "reason": "RenderError", "message": "boom", "observedGeneration": 2},
        ]));
        assert_eq!(
            health(Some(&failed), Some(2), "Ready", true),
            Health::Failed("RenderError: boom".into())
        );
        assert_eq!(
            health(Some(&failed), Some(2), "Ready", false),
            Health::NotYet,
            "a failure on the old version is not the new version's"
        );
        let waiting = status(json!([
            {"type": "Synced", "status": "False", "reason": "DependencyNotReady", "observedGeneration": 2},
        ]));
        assert_eq!(
            health(Some(&waiting), Some(2), "Ready", true),
            Health::NotYet
        );
    }
}
