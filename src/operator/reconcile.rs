//! Reconciling one parent: caches → `plan` → carry the plan out.
//!
//! Nothing here decides *what* a parent needs; that is `plan`'s job. This
//! module only executes: server-side apply (skipped when nothing changed
//! since our own last apply), policies, pruning with UID preconditions, the
//! status patch (skipped when unchanged), the cleanup finalizer and Events.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{
    DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::decode::ParentObject;
use super::discovery::{Resolved, RuleKinds};
use super::{FINALIZER, PAUSED_ANNOTATION, Shared};
use crate::plan::{
    self, ANNOTATION_RENDER_HASH, Apply, Input, LABEL_CHILD, LABEL_PARENT_UID, LABEL_RULE,
    ObjectKey, Observed,
};
use crate::rules::CompiledRule;
use crate::rules::model::Policy;

/// Everything one rule's reconciles share.
pub struct RuleCtx {
    /// The rule as currently loaded; a reload swaps it in place.
    pub rules: watch::Receiver<Arc<CompiledRule>>,
    pub kinds: RuleKinds,
    pub shared: Arc<Shared>,
    /// Caches of child kinds, filtered to this rule by label.
    pub children: Vec<(Resolved, Store<DynamicObject>)>,
    /// The parent cache.
    pub parents: Store<ParentObject>,
    /// Consecutive failures per parent: backoff and Warning dedup.
    pub failures: super::retry::Failures,
    /// Status paths already reported as dropped by the API server.
    pub warned: Mutex<BTreeSet<String>>,
    /// True once every child cache has listed (see [`caches_ready`]).
    pub caches_ready: watch::Receiver<bool>,
    /// Cancelled when the rule's watches stop: nothing may wait past it.
    pub stop: tokio_util::sync::CancellationToken,
}

/// Flags when every store has listed. One task awaits the stores, and the
/// reconciles wait on the flag: a store's own readiness future wakes only
/// its last waiter, so reconciles waiting on it directly would hold their
/// slots forever when parents already exist at start.
pub fn caches_ready(
    stores: Vec<Store<DynamicObject>>,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(stores.is_empty());
    let task = tokio::spawn(async move {
        for store in &stores {
            if store.wait_until_ready().await.is_err() {
                return;
            }
        }
        let _ = tx.send(true);
    });
    (rx, task)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Plan(String),
    #[error("applying {key}: {}", brief(source))]
    Apply {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting {key}: {}", brief(source))]
    Delete {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{key} already exists and belongs to {owner}; it is not taken over: give the child a name of its own"
    )]
    Conflict { key: String, owner: String },
    #[error("writing status: {}", brief(.0))]
    Status(#[source] kube::Error),
    #[error("updating finalizers: {}", brief(.0))]
    Finalizer(#[source] kube::Error),
    /// The gate closed (leadership lost or shutdown): the pass stops writing.
    #[error(transparent)]
    NotLeader(#[from] super::leader::NotLeader),
}

impl Error {
    /// The request got no HTTP answer (connection refused, reset, timeout).
    fn is_transport(&self) -> bool {
        self.kube_error()
            .is_some_and(|e| !matches!(e, kube::Error::Api(_)))
    }

    fn kube_error(&self) -> Option<&kube::Error> {
        match self {
            Error::Apply { source, .. } | Error::Delete { source, .. } => Some(source),
            Error::Status(e) | Error::Finalizer(e) => Some(e),
            _ => None,
        }
    }
}

/// The API server's own message, without the debug dump around it.
fn brief(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// `namespace/name` (or `name`) of a parent, for logs and backoff keys.
pub fn parent_key(parent: &DynamicObject) -> String {
    match parent.namespace() {
        Some(ns) => format!("{ns}/{}", parent.name_any()),
        None => parent.name_any(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RuleCtx {
    pub fn rule(&self) -> Arc<CompiledRule> {
        self.rules.borrow().clone()
    }

    /// Forgets bookkeeping about children and parents that are gone, so the
    /// maps do not grow with churn. Runs only when they look oversized.
    fn sweep(&self) {
        if self.failures.len() > 256 {
            let parents: std::collections::HashSet<String> = self
                .parents
                .state()
                .iter()
                .map(|p| parent_key(&p.object))
                .collect();
            self.failures.retain(|k| parents.contains(k));
        }
    }

    fn field_manager(&self) -> String {
        format!("trellis/{}", self.rule().name)
    }

    fn api_for(&self, kind: &Resolved, namespace: Option<&str>) -> Api<DynamicObject> {
        let client = self.shared.client.clone();
        match (kind.namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(client, ns, &kind.resource),
            _ => Api::all_with(client, &kind.resource),
        }
    }

    /// Responses decode as [`ParentObject`]: a parent too deep to decode
    /// can still be written to.
    fn parent_api(&self, parent: &DynamicObject) -> Api<ParentObject> {
        let (client, kind) = (self.shared.client.clone(), &self.kinds.parent);
        match (kind.namespaced, parent.namespace()) {
            (true, Some(ns)) => Api::namespaced_with(client, &ns, &kind.resource),
            _ => Api::all_with(client, &kind.resource),
        }
    }

    fn child_kind(&self, group: &str, kind: &str) -> Option<&Resolved> {
        self.kinds
            .children
            .iter()
            .find(|c| c.gvk.group == group && c.gvk.kind == kind)
    }

    /// Children of one parent, from the caches.
    fn observed(&self, uid: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for (_, store) in &self.children {
            for obj in store.state() {
                if obj.labels().get(LABEL_PARENT_UID).map(String::as_str) == Some(uid)
                    && let Ok(v) = serde_json::to_value(obj.as_ref())
                {
                    out.push(v);
                }
            }
        }
        out
    }

    /// Counts a failed request by HTTP status code (`transport`: no answer).
    fn count_api_error(&self, err: &Error) {
        let Some(e) = err.kube_error() else {
            return;
        };
        let code = match e {
            kube::Error::Api(status) => status.code.to_string(),
            _ => "transport".to_owned(),
        };
        self.shared
            .metrics
            .api_errors
            .get_or_create(&crate::telemetry::ApiErrorLabel {
                rule: self.rule().name.clone(),
                code,
            })
            .inc();
    }

    /// Publishes the parents-in-backoff gauge of this rule.
    pub fn report_backoff(&self) {
        self.shared
            .metrics
            .parents_in_backoff
            .get_or_create(&crate::telemetry::RuleLabel {
                rule: self.rule().name.clone(),
            })
            .set(self.failures.holding(std::time::Instant::now()) as i64);
    }

    /// A Warning Event, unless the same one was written during this run of
    /// failures: a retry of an identical failure adds no write.
    async fn warn(&self, parent: &DynamicObject, reason: &str, note: String) {
        if self
            .failures
            .should_warn(&parent_key(parent), &format!("{reason}: {note}"))
        {
            self.event(parent, EventType::Warning, reason, note).await;
        }
    }

    async fn event(&self, parent: &DynamicObject, type_: EventType, reason: &str, note: String) {
        if !self.shared.gate.may_write() {
            return;
        }
        let reference = parent.object_ref(&self.kinds.parent.resource);
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(crate::status::truncate(&note, 1000)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.shared.recorder.publish(&event, &reference).await {
            debug!("cannot publish event: {err}");
        }
    }
}

/// What happened to one child.
enum Outcome {
    Unchanged,
    Created,
    Updated,
}

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
    ctx.shared.gate.check()?;
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
    let _permit = tokio::select! {
        permit = ctx.shared.permits.acquire() => permit,
        _ = ctx.stop.cancelled() => return Ok(Action::await_change()),
    };
    ctx.sweep();
    if let Some(why) = &parent.undecodable {
        return undecodable(&ctx, &parent.object, why).await;
    }
    let parent = &parent.object;
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
    let parent_json = serde_json::to_value(parent).map_err(|e| Error::Plan(e.to_string()))?;
    if !plan::parent_matches(rule, &parent_json) {
        return Ok(Action::await_change());
    }

    let observed = Observed::from_objects(ctx.observed(&uid));
    let now = crate::cli::now_rfc3339();
    let scope_of = |g: &crate::kinds::Gvk| ctx.kinds.scope_of(g);
    let plan = plan::plan(
        rule,
        &Input {
            parent: &parent_json,
            observed: &observed,
            now: &now,
            scope_of: &scope_of,
        },
    );

    if plan.needs_finalizer && !parent.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = parent.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        set_finalizers(&ctx, parent, finalizers).await?;
    }

    let mut apply_errors = Vec::new();
    for apply in &plan.apply {
        let live = observed.objects.get(&apply.key);
        let result = apply_child(&ctx, apply, live).await;
        if let Err(Error::NotLeader(not)) = result {
            return Err(not.into());
        }
        let op = match &result {
            Ok(Outcome::Unchanged) => "unchanged",
            Ok(Outcome::Created) => "create",
            Ok(Outcome::Updated) => "update",
            Err(_) => "error",
        };
        ctx.shared.metrics.child_op(&rule.name, op);
        match result {
            Ok(Outcome::Unchanged) => {}
            Ok(Outcome::Created) => {
                info!(rule = %rule.name, parent = %key, child = %apply.id, object = %apply.key, "created");
                ctx.event(
                    parent,
                    EventType::Normal,
                    "Created",
                    format!("created {} (child {})", apply.key, apply.id),
                )
                .await;
            }
            Ok(Outcome::Updated) => {
                info!(rule = %rule.name, parent = %key, child = %apply.id, object = %apply.key, "applied");
            }
            Err(err) => {
                warn!(rule = %rule.name, parent = %key, child = %apply.id, "{err}");
                ctx.count_api_error(&err);
                // No answer at all (the API server is gone): the other
                // children would fail the same way; the backoff retries.
                let unreachable = err.is_transport();
                apply_errors.push(err);
                if unreachable {
                    break;
                }
            }
        }
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
            ctx.shared.gate.check()?;
            match api.delete(&delete.key.name, &params).await {
                Ok(_) => {
                    ctx.shared.metrics.child_op(&rule.name, "delete");
                    info!(rule = %rule.name, parent = %key, child = %delete.id, object = %delete.key, "deleted");
                    ctx.event(
                        parent,
                        EventType::Normal,
                        "Deleted",
                        format!("deleted {} (child {})", delete.key, delete.id),
                    )
                    .await;
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(source) => apply_errors.push(Error::Delete {
                    key: delete.key.to_string(),
                    source,
                }),
            }
        }
    }

    if !plan.errors.is_empty() {
        let reason = plan.failure_reason.unwrap_or("RenderError");
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
        mark_apply_error(status, &message, &parent_json, &now);
        ctx.warn(parent, "ApplyError", message).await;
    }
    if let Some(status) = status {
        write_status(&ctx, parent, &parent_json, status).await?;
    }

    if let Some(err) = apply_errors.into_iter().next() {
        return Err(err);
    }
    if plan.failure_reason == Some("InvalidSpec") {
        // Only an edit of the parent (or the rule) can fix it; its Warning
        // stays recorded so that a wake-up without an edit writes nothing.
        return Ok(Action::await_change());
    }
    if !plan.errors.is_empty() {
        return Err(Error::Plan(plan.errors.join("; ")));
    }
    ctx.failures.clear(&key);
    if !plan.pending.is_empty() {
        // Child watches normally wake us when a dependency turns ready; this is the safety net.
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    Ok(match rule.resync {
        Some(every) => Action::requeue(every),
        None => Action::await_change(),
    })
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
    let now = crate::cli::now_rfc3339();
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
        write_status(ctx, parent, &parent_json, status).await?;
    }
    Ok(Action::await_change())
}

async fn apply_child(ctx: &RuleCtx, apply: &Apply, live: Option<&Value>) -> Result<Outcome, Error> {
    let fail = |source| Error::Apply {
        key: apply.key.to_string(),
        source,
    };
    let Some(kind) = ctx.child_kind(&apply.key.group, &apply.key.kind) else {
        return Err(Error::Plan(format!("{}: kind not resolved", apply.key)));
    };
    let api = ctx.api_for(kind, apply.key.namespace.as_deref());
    // Whether the object exists, even where the cache has not caught up:
    // decides between "created" and "applied" in logs and Events.
    let mut existed = live.is_some();
    if live.is_none() {
        // Not among this parent's cached children: new, not in the cache yet,
        // or made for another parent (two parents rendering one name), which
        // a forced apply would silently take over.
        if let Some(existing) = api.get_opt(&apply.key.name).await.map_err(fail)? {
            existed = true;
            let existing = serde_json::to_value(&existing).unwrap_or_default();
            let adopt = ctx
                .rule()
                .children
                .iter()
                .any(|c| c.spec.id == apply.id && c.spec.adopt);
            if let Some(owner) = foreign_owner(&existing, &apply.object, adopt) {
                return Err(Error::Conflict {
                    key: apply.key.to_string(),
                    owner,
                });
            }
            if apply.policy == Policy::CreateOnly {
                return Ok(Outcome::Unchanged);
            }
        } else if apply.policy == Policy::CreateOnly {
            // A create, not an apply: should the object appear meanwhile it
            // is kept as it is (a `rand_alnum` secret is never re-rolled).
            let object: DynamicObject = serde_json::from_value(apply.object.clone())
                .map_err(|e| Error::Plan(format!("{}: {e}", apply.key)))?;
            let params = PostParams {
                field_manager: Some(ctx.field_manager()),
                ..PostParams::default()
            };
            ctx.shared.gate.check()?;
            return match api.create(&params, &object).await {
                Ok(_) => Ok(Outcome::Created),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Unchanged),
                Err(source) => Err(fail(source)),
            };
        }
    }
    match (apply.policy, live) {
        (Policy::CreateOnly, Some(_)) => return Ok(Outcome::Unchanged),
        (Policy::Recreate, Some(live)) if live_render_hash(live) != Some(apply.hash.as_str()) => {
            let uid = live.pointer("/metadata/uid").and_then(Value::as_str);
            let params = DeleteParams {
                preconditions: uid.map(|u| Preconditions {
                    uid: Some(u.to_owned()),
                    resource_version: None,
                }),
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            ctx.shared.gate.check()?;
            api.delete(&apply.key.name, &params)
                .await
                .map_err(|source| Error::Delete {
                    key: apply.key.to_string(),
                    source,
                })?;
            info!(rule = %ctx.rule().name, object = %apply.key, "deleted to recreate with a changed rendering");
            // The create follows once the deletion is observed.
            return Ok(Outcome::Updated);
        }
        _ => {}
    }
    // Nothing to send when the live object carries this rendering's hash
    // and still holds every field trellis sets: this survives a restart or
    // a failover (the hash is on the object), and ignores what others add.
    if let Some(live) = live
        && live_render_hash(live) == Some(apply.hash.as_str())
        && !crate::drift::drifted(&apply.object, live)
    {
        return Ok(Outcome::Unchanged);
    }

    let params = PatchParams::apply(&ctx.field_manager()).force();
    api.patch(&apply.key.name, &params, &Patch::Apply(&apply.object))
        .await
        .map_err(fail)?;
    Ok(if existed {
        Outcome::Updated
    } else {
        Outcome::Created
    })
}

/// Who an existing object belongs to, when not to the parent (and rule)
/// of `desired`: another parent's controller reference or uid label,
/// another rule's label, or — for an object without trellis's labels —
/// whoever made it. Such an object is never written unless the rule lets
/// the child `adopt` it and it has no controller owner.
fn foreign_owner(existing: &Value, desired: &Value, adopt: bool) -> Option<String> {
    let label = |obj: &Value, name: &str| {
        obj.pointer("/metadata/labels")
            .and_then(|l| l.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let uid = label(desired, LABEL_PARENT_UID);
    let rule = label(desired, LABEL_RULE);
    let controller = existing
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|refs| refs.iter().find(|r| r["controller"] == true));
    if let Some(owner) = controller
        && owner["uid"].as_str() != uid.as_deref()
    {
        return Some(format!(
            "{} {}",
            owner["kind"].as_str().unwrap_or_default(),
            owner["name"].as_str().unwrap_or_default()
        ));
    }
    match (
        label(existing, LABEL_PARENT_UID),
        label(existing, LABEL_RULE),
    ) {
        (Some(other), _) if Some(&other) != uid.as_ref() => Some(format!("parent uid {other}")),
        (_, Some(other)) if Some(&other) != rule.as_ref() => Some(format!("rule {other}")),
        (Some(_), Some(_)) => None,
        _ if adopt && controller.is_none() => None,
        _ => {
            let managers: BTreeSet<&str> = existing
                .pointer("/metadata/managedFields")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|m| m["manager"].as_str())
                .collect();
            Some(if managers.is_empty() {
                "someone else: it was not created by trellis for this parent".to_owned()
            } else {
                format!(
                    "someone else (managed by {}): it was not created by trellis for this parent",
                    managers.into_iter().collect::<Vec<_>>().join(", ")
                )
            })
        }
    }
}

/// The render hash recorded on a live child by the apply that made it.
fn live_render_hash(live: &Value) -> Option<&str> {
    live.pointer("/metadata/annotations")
        .and_then(|a| a.get(ANNOTATION_RENDER_HASH))
        .and_then(Value::as_str)
}

/// Turns `Synced` into `False/ApplyError` (and `Ready` too when it claimed
/// True), keeping the previous transition time when it was already False so
/// that a persistent failure does not rewrite the status on every retry.
fn mark_apply_error(status: &mut Value, message: &str, parent: &Value, now: &str) {
    let previous = parent
        .pointer("/status/conditions")
        .and_then(Value::as_array);
    let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) else {
        return;
    };
    for c in conditions.iter_mut() {
        let t = c
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if t == "Synced" || (t == "Ready" && c["status"] == "True") {
            let since = previous
                .and_then(|p| p.iter().find(|x| x["type"] == t.as_str()))
                .filter(|x| x["status"] == "False")
                .and_then(|x| x.get("lastTransitionTime"))
                .and_then(Value::as_str)
                .unwrap_or(now)
                .to_owned();
            c["status"] = json!("False");
            c["reason"] = json!("ApplyError");
            c["message"] = json!(message);
            c["lastTransitionTime"] = json!(since);
        }
    }
}

/// True when every field of `new` already has that value in `current`.
fn status_unchanged(current: Option<&Value>, new: &Value) -> bool {
    let (Some(Value::Object(cur)), Value::Object(new)) = (current, new) else {
        return false;
    };
    new.iter().all(|(k, v)| cur.get(k) == Some(v))
}

/// Paths (as key segments) of every leaf in a status object, conditions excluded.
fn leaf_paths(value: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                if prefix.is_empty() && k == "conditions" {
                    continue;
                }
                prefix.push(k.clone());
                leaf_paths(v, prefix, out);
                prefix.pop();
            }
        }
        _ => out.push(prefix.clone()),
    }
}

/// JSON Pointer of a key path (keys may contain `.` or `/`, as quota keys do).
fn pointer(path: &[String]) -> String {
    path.iter()
        .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// Status fields of the rule that this pass no longer produces (their child
/// was pruned, say): removed with `null` in the merge patch, which would
/// otherwise keep them forever. Only after a clean pass: a failed one keeps
/// the last good values. Each entry is the highest key that can go without
/// taking anything else along.
fn stale_fields<'a>(
    paths: impl IntoIterator<Item = &'a [String]>,
    current: Option<&Value>,
    new: &Value,
) -> Vec<Vec<String>> {
    let Some(current) = current else {
        return Vec::new();
    };
    let synced = new
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Synced"));
    let clean =
        synced.is_some_and(|c| c["status"] == "True" || c["reason"] == "DependencyNotReady");
    if !clean {
        return Vec::new();
    }
    let mut out: Vec<Vec<String>> = Vec::new();
    for path in paths {
        if current.pointer(&pointer(path)).is_none() || new.pointer(&pointer(path)).is_some() {
            continue;
        }
        let mut top = path.len();
        while top > 1 {
            let up = &path[..top - 1];
            let lone = current
                .pointer(&pointer(up))
                .and_then(Value::as_object)
                .is_some_and(|m| m.len() == 1);
            if !lone || new.pointer(&pointer(up)).is_some() {
                break;
            }
            top -= 1;
        }
        let stale = path[..top].to_vec();
        if !out.contains(&stale) {
            out.push(stale);
        }
    }
    out
}

/// Sets `path` to `null` in `value`, creating the objects on the way.
fn set_null(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut here = value;
    for key in parents {
        if !here.get(key).is_some_and(Value::is_object) {
            here[key.as_str()] = json!({});
        }
        here = &mut here[key.as_str()];
    }
    here[last.as_str()] = Value::Null;
}

/// `status` without the leaves at the given dotted paths.
fn without_paths(status: &Value, dotted: &BTreeSet<String>) -> Value {
    let mut out = status.clone();
    for path in dotted {
        let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
        let Some((last, parents)) = segments.split_last() else {
            continue;
        };
        if let Some(map) = out
            .pointer_mut(&pointer(parents))
            .and_then(Value::as_object_mut)
        {
            map.remove(last);
        }
    }
    out
}

/// Without the `/status` subresource, a status write is a change outside
/// metadata and bumps `metadata.generation` by one. The status claims the
/// generation the write produces (the spec is the one observed), or each
/// write would leave `observedGeneration` behind and cause the next.
fn claim_next_generation(status: &mut Value, generation: i64) {
    let (now, next) = (json!(generation), json!(generation + 1));
    if status.get("observedGeneration") == Some(&now) {
        status["observedGeneration"] = next.clone();
    }
    if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if c.get("observedGeneration") == Some(&now) {
                c["observedGeneration"] = next.clone();
            }
        }
    }
}

async fn write_status(
    ctx: &RuleCtx,
    parent: &DynamicObject,
    parent_json: &Value,
    mut status: Value,
) -> Result<(), Error> {
    let current = parent_json.get("status");
    let rule = ctx.rule();
    let stale = stale_fields(
        rule.fields.iter().map(|f| f.path.as_slice()),
        current,
        &status,
    );
    // Fields the API server is known to drop would otherwise make every pass
    // look like a change; they are still sent along with any real one.
    let comparable = without_paths(&status, &lock(&ctx.warned));
    if stale.is_empty() && status_unchanged(current, &comparable) {
        return Ok(());
    }
    let subresource = ctx.kinds.parent.status_subresource;
    if !subresource && let Some(generation) = parent.metadata.generation {
        claim_next_generation(&mut status, generation);
    }
    let mut patch = json!({ "status": status.clone() });
    for path in &stale {
        set_null(&mut patch["status"], path);
    }
    if !subresource {
        // The generation claimed holds only if nothing else changes the parent first.
        patch["metadata"] = json!({ "resourceVersion": parent.resource_version() });
    }
    let api = ctx.parent_api(parent);
    let name = parent.name_any();
    ctx.shared.gate.check()?;
    let result = if ctx.kinds.parent.status_subresource {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
    } else {
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
    };
    let written = match result {
        Ok(obj) => {
            ctx.shared
                .metrics
                .status_writes
                .get_or_create(&crate::telemetry::RuleLabel {
                    rule: ctx.rule().name.clone(),
                })
                .inc();
            obj
        }
        // Gone, or changed since it was read: the change brings another pass.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
        Err(err) => return Err(Error::Status(err)),
    };
    // The API server silently prunes fields its schema does not know.
    let kept = written
        .object
        .data
        .get("status")
        .cloned()
        .unwrap_or(Value::Null);
    let mut paths = Vec::new();
    leaf_paths(&status, &mut Vec::new(), &mut paths);
    for segments in paths {
        if kept.pointer(&pointer(&segments)).is_none() {
            let path = segments.join(".");
            let first = lock(&ctx.warned).insert(path.clone());
            if first {
                let message = format!(
                    "the API server dropped status.{path}: the CRD's status schema does not declare it"
                );
                warn!(rule = %ctx.rule().name, "{message}");
                ctx.event(parent, EventType::Warning, "StatusFieldDropped", message)
                    .await;
            }
        }
    }
    Ok(())
}

async fn set_finalizers(
    ctx: &RuleCtx,
    parent: &DynamicObject,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    ctx.shared.gate.check()?;
    // resourceVersion makes this a compare-and-swap: other finalizers are never lost.
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": parent.resource_version(),
        }
    });
    ctx.parent_api(parent)
        .patch(
            &parent.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(Error::Finalizer)?;
    Ok(())
}

/// Whether any child of this parent still exists, by a live list per child
/// kind (not the cache).
async fn live_children_remain(
    ctx: &RuleCtx,
    parent: &DynamicObject,
    uid: &str,
) -> Result<bool, Error> {
    let rule = ctx.rule();
    let selector = format!("{LABEL_RULE}={},{LABEL_PARENT_UID}={uid}", rule.name);
    let params = kube::api::ListParams::default().labels(&selector).limit(1);
    for kind in &ctx.kinds.children {
        // Children live in the parent's namespace unless the rule lets them out.
        let anywhere = rule
            .children
            .iter()
            .any(|c| c.gvk == kind.gvk && c.spec.allow_cross_namespace);
        let namespace = parent.namespace().filter(|_| !anywhere);
        let api = ctx.api_for(kind, namespace.as_deref());
        match api.list_metadata(&params).await {
            Ok(list) if !list.items.is_empty() => return Ok(true),
            Ok(_) => {}
            Err(source) => {
                return Err(Error::Delete {
                    key: format!("children of kind {}", kind.gvk),
                    source,
                });
            }
        }
    }
    Ok(false)
}

/// A parent being deleted: remove children (in reverse dependency order when
/// asked, one wave per child id), then release the finalizer.
async fn finalize(parent: &DynamicObject, ctx: &RuleCtx, uid: &str) -> Result<Action, Error> {
    if !parent.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let rule = &ctx.rule();
    let key = parent_key(parent);
    let observed = ctx.observed(uid);
    let id_of = |o: &Value| {
        o.pointer("/metadata/labels")
            .and_then(|l| l.get(LABEL_CHILD))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let ordered = rule.rule.spec.deletion.is_some();
    let wave: Vec<&Value> = if ordered {
        // Last in dependency order goes first; ids the rule no longer has go first of all.
        let rank = |o: &Value| {
            let id = id_of(o);
            rule.order
                .iter()
                .position(|&i| Some(&rule.children[i].spec.id) == id.as_ref())
                .map(|p| p + 1)
                .unwrap_or(usize::MAX)
        };
        let top = observed.iter().map(rank).max();
        observed.iter().filter(|o| Some(rank(o)) == top).collect()
    } else {
        observed.iter().collect()
    };
    if wave.is_empty() {
        // The cache may not have seen a child created moments ago: ask the
        // API server before letting the parent go.
        if live_children_remain(ctx, parent, uid).await? {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        let rest: Vec<String> = parent
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        set_finalizers(ctx, parent, rest).await?;
        info!(rule = %rule.name, parent = %key, "children removed; finalizer released");
        return Ok(Action::await_change());
    }
    for obj in wave {
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let Some(key) = ObjectKey::of(obj) else {
            continue;
        };
        let Some(kind) = ctx.child_kind(&key.group, &key.kind) else {
            continue;
        };
        let api = ctx.api_for(kind, key.namespace.as_deref());
        let params = DeleteParams {
            preconditions: obj
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(|u| Preconditions {
                    uid: Some(u.to_owned()),
                    resource_version: None,
                }),
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        ctx.shared.gate.check()?;
        match api.delete(&key.name, &params).await {
            Ok(_) => {
                info!(rule = %rule.name, parent = %parent_key(parent), object = %key, "deleted (parent is being deleted)")
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(source) => {
                return Err(Error::Delete {
                    key: key.to_string(),
                    source,
                });
            }
        }
    }
    // Watches on the children wake us as they go; poll as a safety net.
    Ok(Action::requeue(Duration::from_secs(2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_no_longer_produced_is_stale_up_to_its_highest_lone_key() {
        let owned: Vec<Vec<String>> =
            vec![vec!["extra".into(), "name".into()], vec!["kept".into()]];
        let paths = || owned.iter().map(Vec::as_slice);
        let synced = json!([{"type": "Synced", "status": "True"}]);
        let current = json!({"extra": {"name": "a"}, "kept": "y"});
        let new = json!({"kept": "y", "conditions": synced});
        assert_eq!(
            stale_fields(paths(), Some(&current), &new),
            [vec!["extra".to_owned()]]
        );
        // A sibling key the rule does not own keeps the parent object.
        let current = json!({"extra": {"name": "a", "other": 1}, "kept": "y"});
        assert_eq!(
            stale_fields(paths(), Some(&current), &new),
            [vec!["extra".to_owned(), "name".to_owned()]]
        );
        // A failed pass keeps the last good values.
        let failed = json!({"kept": "y", "conditions": [{"type": "Synced", "status": "False", "reason": "RenderError"}]});
        assert!(stale_fields(paths(), Some(&current), &failed).is_empty());
    }

    #[test]
    fn an_object_not_made_for_this_parent_and_rule_is_never_taken_over() {
        let desired = json!({"metadata": {"labels": {
            "trellis.dev/rule": "app", "trellis.dev/parent-uid": "u1"}}});
        let ours = json!({"metadata": {
            "labels": {"trellis.dev/rule": "app", "trellis.dev/parent-uid": "u1"},
            "ownerReferences": [{"kind": "App", "name": "a", "uid": "u1", "controller": true}]}});
        assert_eq!(foreign_owner(&ours, &desired, false), None);
        let unmanaged = json!({"metadata": {"name": "x",
            "managedFields": [{"manager": "kubectl-create", "operation": "Update"}]}});
        assert_eq!(
            foreign_owner(&unmanaged, &desired, false).as_deref(),
            Some(
                "someone else (managed by kubectl-create): it was not created by trellis for this parent"
            )
        );
        assert_eq!(
            foreign_owner(&unmanaged, &desired, true),
            None,
            "adopt: true takes it over"
        );
        let controlled = json!({"metadata": {"name": "x",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "u9", "controller": true}]}});
        assert_eq!(
            foreign_owner(&controlled, &desired, true).as_deref(),
            Some("ReplicaSet rs"),
            "adopt never takes an object another controller owns"
        );
        let other_parent = json!({"metadata": {
            "labels": {"trellis.dev/rule": "app", "trellis.dev/parent-uid": "u2"},
            "ownerReferences": [{"kind": "App", "name": "b", "uid": "u2", "controller": true}]}});
        assert_eq!(
            foreign_owner(&other_parent, &desired, false).as_deref(),
            Some("App b")
        );
        let unowned = json!({"metadata": {"labels": {"trellis.dev/parent-uid": "u2"}}});
        assert_eq!(
            foreign_owner(&unowned, &desired, false).as_deref(),
            Some("parent uid u2")
        );
        let other_rule = json!({"metadata": {"labels": {
            "trellis.dev/rule": "db", "trellis.dev/parent-uid": "u1"}}});
        assert_eq!(
            foreign_owner(&other_rule, &desired, true).as_deref(),
            Some("rule db")
        );
    }

    #[test]
    fn without_the_status_subresource_the_status_claims_the_next_generation() {
        let mut status = json!({"observedGeneration": 4, "conditions": [
            {"type": "Ready", "observedGeneration": 4},
            {"type": "Foreign", "observedGeneration": 2}
        ]});
        claim_next_generation(&mut status, 4);
        assert_eq!(status["observedGeneration"], 5);
        assert_eq!(status["conditions"][0]["observedGeneration"], 5);
        assert_eq!(status["conditions"][1]["observedGeneration"], 2);
    }

    #[test]
    fn nulls_a_path_and_leaves_out_dotted_paths() {
        let mut patch = json!({"a": 1});
        set_null(&mut patch, &["x".to_owned(), "y".to_owned()]);
        assert_eq!(patch, json!({"a": 1, "x": {"y": null}}));
        let dropped: BTreeSet<String> = ["x.y".to_owned()].into();
        assert_eq!(
            without_paths(&json!({"x": {"y": 1, "z": 2}}), &dropped),
            json!({"x": {"z": 2}})
        );
    }

    #[test]
    fn status_is_unchanged_when_every_field_matches() {
        let cur = json!({"a": 1, "b": {"c": 2}, "foreign": true});
        assert!(status_unchanged(
            Some(&cur),
            &json!({"a": 1, "b": {"c": 2}})
        ));
        assert!(!status_unchanged(Some(&cur), &json!({"a": 2})));
        assert!(!status_unchanged(None, &json!({"a": 1})));
    }

    #[test]
    fn lists_leaf_paths_without_conditions() {
        let mut out = Vec::new();
        let status = json!({"a": {"b": 1, "limits.cpu": [1]}, "conditions": [], "d": "x"});
        leaf_paths(&status, &mut Vec::new(), &mut out);
        let joined: Vec<String> = out.iter().map(|p| p.join("|")).collect();
        assert_eq!(joined, ["a|b", "a|limits.cpu", "d"]);
        assert_eq!(pointer(&out[1]), "/a/limits.cpu");
        assert!(
            status.pointer(&pointer(&out[1])).is_some(),
            "dotted keys resolve"
        );
    }

    #[test]
    fn apply_error_turns_synced_false_and_keeps_time_when_already_false() {
        let parent = json!({"status": {"conditions": [{"type": "Synced", "status": "False", "lastTransitionTime": "t0"}]}});
        // The plan saw Synced go True and stamped a fresh time; the failure keeps the old one.
        let mut status = json!({"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "t0"},
            {"type": "Synced", "status": "True", "lastTransitionTime": "t2"}
        ]});
        mark_apply_error(&mut status, "boom", &parent, "t1");
        assert_eq!(status["conditions"][0]["status"], "False");
        assert_eq!(status["conditions"][0]["lastTransitionTime"], "t1");
        assert_eq!(status["conditions"][1]["reason"], "ApplyError");
        assert_eq!(status["conditions"][1]["lastTransitionTime"], "t0");
    }
}
