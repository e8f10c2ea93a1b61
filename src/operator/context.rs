//! What one rule's reconciles share: the caches, the clients, the
//! bookkeeping (backoff, warned status paths) and the errors a pass reports.
//!
//! The pass itself is in [`super::pass::reconcile`]; applying a child, writing
//! status and finalizing are in their own modules.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde_json::Value;
use tokio::sync::watch;

use super::Shared;
use super::lock;
use super::watches::compact::{ByParent, CompactObject};
use super::watches::decode::ParentObject;
use super::watches::discovery::{Resolved, RuleKinds};
use crate::plan::ObjectKey;
use crate::rules::CompiledRule;
use kube::runtime::reflector::ObjectRef;

mod error;
pub use error::Error;

/// Everything one rule's reconciles share.
pub struct RuleCtx {
    /// The rule as currently loaded; a reload swaps it in place.
    pub rules: watch::Receiver<Arc<CompiledRule>>,
    /// The versions parents may be on during a staged rollout (`rollout:`).
    pub versions: Arc<super::rollout::versions::Versions>,
    pub kinds: RuleKinds,
    pub shared: Arc<Shared>,
    /// Caches of child kinds, filtered to this rule by label.
    pub children: Vec<ChildCache>,
    /// The parent cache: under `--shards`, this replica's buckets' parents only.
    pub parents: Store<ParentObject>,
    /// The buckets whose parents the parent cache holds in full.
    pub parents_listed: watch::Receiver<crate::shard::BucketSet>,
    /// Parents that may have left the rule's scope, to release (see
    /// [`super::pass::released`]).
    pub released: super::pass::released::Sender,
    /// Consecutive failures per parent: backoff and Warning dedup.
    pub failures: super::retry::Failures,
    /// Parents whose pass failed for want of the API server, retried once
    /// it serves again.
    /// (By backoff key: `namespace/name`.)
    pub outage: super::retry::Outage<(String, ObjectRef<ParentObject>)>,
    /// Status paths already reported as dropped by the API server.
    pub warned: Mutex<BTreeSet<String>>,
    /// The related caches and the index of what each parent read.
    pub related: Arc<super::watches::related::Caches>,
    /// True once every child and related cache has listed (see [`caches_ready`]).
    pub caches_ready: watch::Receiver<bool>,
    /// Cancelled when the rule's watches stop: nothing may wait past it.
    pub stop: tokio_util::sync::CancellationToken,
    /// What this process wrote of its children until the watches show it
    /// (made children the pass trusts, versions whose events wake nobody).
    pub own: Arc<super::pass::own_writes::OwnWrites>,
    /// Parent uid → the status this process last wrote and the parent's
    /// resourceVersion it was written over: until the parent cache moves
    /// past that version, a pass reads the written status, not the stale
    /// cached one (which would write the same status, and Event, again).
    /// The parent watch forgets an entry once the cache holds the parent
    /// past it ([`forget_seen_status`]): otherwise one status text per
    /// parent written stays until its next pass (about 310 bytes a parent
    /// at 10,000 just converged). A pass reads it before its parent (see
    /// `pass::reconcile`).
    pub written: Arc<Written>,
    /// What this process last sent of each parent's patches.
    pub patches: super::pass::patch_writes::Memo,
    /// The client of the rule's child writes ([`RuleCtx::api_for`]): its
    /// account's, or the operator's own.
    pub writer: kube::Client,
    /// The user the rule's writes are sent as, with an account.
    pub account: Option<String>,
}

/// One child kind's cache, and its index by parent.
pub struct ChildCache {
    pub kind: Resolved,
    pub store: Store<CompactObject>,
    pub by_parent: Arc<ByParent>,
    /// The buckets whose children the store holds in full.
    pub listed: watch::Receiver<crate::shard::BucketSet>,
}

impl ChildCache {
    /// The cached object of this kind at `namespace`/`name`.
    fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<CompactObject>> {
        let mut at = ObjectRef::new_with(name, self.kind.resource.clone());
        if let Some(ns) = namespace {
            at = at.within(ns);
        }
        self.store.get(&at)
    }
}

/// Status writes the parent cache may not show yet, by parent uid.
pub type Written = Mutex<HashMap<String, WrittenStatus>>;

/// A status write the parent cache may not show yet.
pub struct WrittenStatus {
    pub over: String,
    /// As JSON text: as a `Value` a status weighs several times its text.
    pub status: Box<str>,
    pub at: Instant,
}

/// The parent cache now holds `parent` past any status written over an
/// older version of it (the watch event has been stored), or the parent is
/// gone (`deleted`): its written status is not needed to read it right.
pub fn forget_seen_status(written: &Written, parent: &ParentObject, deleted: bool) {
    let meta = &parent.object.metadata;
    let Some(uid) = meta.uid.as_deref() else {
        return;
    };
    let mut written = lock(written);
    if written
        .get(uid)
        .is_some_and(|w| deleted || meta.resource_version.as_deref() != Some(w.over.as_str()))
    {
        written.remove(uid);
    }
}

/// A child this process wrote without the cache showing it yet.
pub struct Created {
    pub parent_uid: String,
    /// The render hash written.
    pub hash: String,
    pub at: Instant,
}

/// How long a made child is remembered when the cache does not show it.
const CREATED_MEMORY: Duration = Duration::from_secs(300);
/// How long a child written moments ago counts as there without the cache
/// showing it; the pass that relies on it checks again after this.
pub const UNSEEN_TRUST: Duration = Duration::from_secs(30);

/// Flags when every store has listed (each future: one store's readiness,
/// `false` when it was dropped). One task awaits the stores, and the
/// reconciles wait on the flag: a store's own readiness future wakes only
/// its last waiter, so reconciles waiting on it directly would hold their
/// slots forever when parents already exist at start.
pub fn caches_ready(
    stores: Vec<futures::future::BoxFuture<'static, bool>>,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(stores.is_empty());
    let task = tokio::spawn(async move {
        for store in stores {
            if !store.await {
                return;
            }
        }
        let _ = tx.send(true);
    });
    (rx, task)
}

/// A store's readiness as [`caches_ready`] takes it.
pub fn listed<K>(store: Store<K>) -> futures::future::BoxFuture<'static, bool>
where
    K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    Box::pin(async move { store.wait_until_ready().await.is_ok() })
}

/// `namespace/name` (or `name`) of a parent, for logs and backoff keys.
pub fn parent_key<K: Resource>(parent: &K) -> String {
    match parent.namespace() {
        Some(ns) => format!("{ns}/{}", parent.name_any()),
        None => parent.name_any(),
    }
}

impl RuleCtx {
    /// The newest accepted version of the rule.
    pub fn rule(&self) -> Arc<CompiledRule> {
        self.rules.borrow().clone()
    }

    /// The version that renders this parent: the newest, unless a staged
    /// rollout (`rollout:`) has it on another version still.
    pub fn rule_for(&self, parent: &Value, uid: &str) -> Arc<CompiledRule> {
        let newest = self.rule();
        if newest.rollout.is_none() {
            return newest;
        }
        let on = super::rollout::revision_on(self, parent.get("status"), uid);
        self.versions.rule_for(&newest, uid, on.as_deref())
    }

    /// Forgets bookkeeping about children and parents that are gone, so the
    /// maps do not grow with churn. Runs only when they look oversized.
    pub(super) fn sweep(&self) {
        if self.failures.len() > 256 {
            let parents: std::collections::HashSet<String> = self
                .parents
                .state()
                .iter()
                .map(|p| parent_key(&p.object))
                .collect();
            self.failures.retain(|k| parents.contains(k));
        }
        self.related.sweep(&self.parents);
        self.own.sweep();
        let mut created = lock(&self.own.created);
        if created.len() > 1024 {
            created.retain(|_, c| c.at.elapsed() < CREATED_MEMORY);
        }
        drop(created);
        let mut written = lock(&self.written);
        if written.len() > 1024 {
            written.retain(|_, w| w.at.elapsed() < CREATED_MEMORY);
        }
    }

    /// Records the status written over the parent's `resource_version`.
    pub(super) fn remember_status(
        &self,
        uid: &str,
        resource_version: Option<String>,
        status: &Value,
    ) {
        let Some(over) = resource_version else {
            return;
        };
        let written = WrittenStatus {
            over,
            status: status.to_string().into_boxed_str(),
            at: Instant::now(),
        };
        lock(&self.written).insert(uid.to_owned(), written);
    }

    /// The status last written over the parent with `uid`, and the
    /// resourceVersion it was written over: the parent as a pass reads it
    /// while the cache still holds that version.
    pub(super) fn written_status(&self, uid: &str) -> Option<(String, Value)> {
        let written = lock(&self.written);
        let entry = written.get(uid)?;
        // Text this process wrote from a Value: it parses again.
        let status = serde_json::from_str(&entry.status).ok()?;
        Some((entry.over.clone(), status))
    }

    /// The parent as the cache holds it now, unless it is gone or another
    /// object by now (deleted and made again): the controller took `parent`
    /// from the cache when it queued the pass, maybe long before the pass
    /// got a permit.
    pub(super) fn newest(&self, parent: Arc<ParentObject>) -> Arc<ParentObject> {
        let at = ObjectRef::from_obj_with(parent.as_ref(), self.kinds.parent.resource.clone());
        match self.parents.get(&at) {
            Some(now) if now.object.metadata.uid == parent.object.metadata.uid => now,
            _ => parent,
        }
    }

    /// Records a child written for the parent with `uid`, with `hash`.
    pub(super) fn remember_created(&self, key: &ObjectKey, uid: &str, hash: &str) {
        let created = Created {
            parent_uid: uid.to_owned(),
            hash: hash.to_owned(),
            at: Instant::now(),
        };
        lock(&self.own.created).insert(key.clone(), created);
    }

    /// The parent uid and render hash of a child this process wrote
    /// recently, and whether that was recent enough to trust it is still
    /// there as written.
    pub(super) fn created_for(&self, key: &ObjectKey) -> Option<(String, String, bool)> {
        lock(&self.own.created)
            .get(key)
            .filter(|c| c.at.elapsed() < CREATED_MEMORY)
            .map(|c| {
                let fresh = c.at.elapsed() < UNSEEN_TRUST;
                (c.parent_uid.clone(), c.hash.clone(), fresh)
            })
    }

    /// The cache shows the child: no need to remember it.
    pub(super) fn forget_created(&self, key: &ObjectKey) {
        let mut created = lock(&self.own.created);
        if !created.is_empty() {
            created.remove(key);
        }
    }

    /// An object of this rule's child caches by key, whatever parent it is
    /// for. A spoke's caches hold only this rule's objects of this hub:
    /// anyone else's there is found by the create-only apply's refusal.
    pub(super) fn cached_child(&self, key: &ObjectKey) -> Option<Value> {
        self.cached_compact(key).map(|obj| obj.to_value())
    }

    /// The object at `key` in this rule's child caches, as they keep it.
    fn cached_compact(&self, key: &ObjectKey) -> Option<Arc<CompactObject>> {
        if key.cluster.is_some() {
            return None;
        }
        self.children
            .iter()
            .find(|c| c.kind.gvk.group == key.group && c.kind.gvk.kind == key.kind)?
            .get(key.namespace.as_deref(), &key.name)
    }

    /// The cached child at `key` when the cache holds another version of it
    /// than `taken`, the object a pass took from it moments ago.
    pub(super) fn newer_cached(&self, key: &ObjectKey, taken: &Value) -> Option<Value> {
        let now = self.cached_compact(key)?;
        let taken_version = taken["metadata"]["resourceVersion"].as_str();
        (now.metadata.resource_version.as_deref() != taken_version).then(|| now.to_value())
    }

    pub(super) fn field_manager(&self) -> String {
        format!("trellis/{}", self.rule().name)
    }

    /// The one path of every write to the rule's children: on the rule's
    /// account's client when it has one ([`super::identity`]), else the
    /// operator's own.
    pub(super) fn api_for(&self, kind: &Resolved, namespace: Option<&str>) -> Api<DynamicObject> {
        kind.api(self.writer.clone(), namespace)
    }

    /// The `Api` a child is written with: in its spoke, with the spoke's
    /// credentials (impersonating the rule's account there when it has
    /// one); at home, [`RuleCtx::api_for`] its kind. `Err` says why
    /// there is none.
    pub(super) fn child_api(&self, key: &ObjectKey) -> Result<Api<DynamicObject>, String> {
        if key.cluster.is_some() {
            return self.shared.clusters.api_as(key, self.account.as_deref());
        }
        let Some(kind) = self.child_kind(&key.group, &key.kind) else {
            return Err(format!("{key}: kind not resolved"));
        };
        Ok(self.api_for(kind, key.namespace.as_deref()))
    }

    /// A child write refused to the rule's account, named as such (see
    /// [`Error::Denied`]); any other error as it is.
    pub(super) fn attribute(&self, err: Error) -> Error {
        let Some(user) = &self.account else {
            return err;
        };
        let (doing, key, source) = match err {
            Error::Apply { key, source } => ("applying", key, source),
            Error::Delete { key, source } => ("deleting", key, source),
            other => return other,
        };
        match super::identity::refusal(user, &source) {
            Some(refusal) => Error::Denied {
                doing,
                key,
                refusal,
                source,
            },
            None if doing == "applying" => Error::Apply { key, source },
            None => Error::Delete { key, source },
        }
    }

    /// Responses decode as [`ParentObject`]: a parent too deep to decode
    /// can still be written to.
    pub(super) fn parent_api(&self, parent: &DynamicObject) -> Api<ParentObject> {
        let namespace = parent.namespace();
        (self.kinds.parent).api(self.shared.client.clone(), namespace.as_deref())
    }

    /// A kind's scope for the planner: as the hub's discovery says, or for
    /// a kind only spokes serve, as theirs does (namespaced until one has).
    pub(super) fn scope_of(&self, gvk: &crate::kinds::Gvk) -> crate::rules::model::Scope {
        if self.kinds.knows(gvk) {
            return self.kinds.scope_of(gvk);
        }
        match self.shared.clusters.namespaced(gvk) {
            Some(false) => crate::rules::model::Scope::Cluster,
            _ => crate::rules::model::Scope::Namespaced,
        }
    }

    pub(super) fn child_kind(&self, group: &str, kind: &str) -> Option<&Resolved> {
        self.kinds
            .children
            .iter()
            .find(|c| c.gvk.group == group && c.gvk.kind == kind)
    }

    /// Children of one parent, from the caches.
    pub(super) fn observed(&self, uid: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for cache in &self.children {
            for (namespace, name) in cache.by_parent.of(uid) {
                let Some(obj) = cache.get(namespace.as_deref(), &name) else {
                    continue;
                };
                if obj.parent_uid() == Some(uid) {
                    out.push(obj.to_value());
                }
            }
        }
        let rule = self.rule();
        if rule.children.iter().any(|c| c.cluster.is_some()) {
            out.extend(self.shared.clusters.observed(&rule.name, uid));
        }
        out
    }

    /// Counts a failed request by HTTP status code (`transport`: no answer).
    pub(super) fn count_api_error(&self, err: &Error) {
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
    pub(super) async fn warn(&self, parent: &DynamicObject, reason: &str, note: String) {
        if self
            .failures
            .should_warn(&parent_key(parent), &format!("{reason}: {note}"))
        {
            self.event(parent, EventType::Warning, reason, note).await;
        }
    }

    pub(super) async fn event(
        &self,
        parent: &DynamicObject,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let uid = parent.uid().unwrap_or_default();
        if self.check_write(&uid).is_err() {
            return;
        }
        let shared = self.shared.clone();
        let allowed = move || shared.check_parent_write(&uid).is_ok();
        self.publish_event(parent, type_, reason, note, allowed)
            .await;
    }

    /// An Event the leader writes about a parent whatever its bucket (a
    /// rollout's decisions are the leader's).
    pub(super) async fn leader_event(
        &self,
        parent: &DynamicObject,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        if self.shared.gate.may_write() {
            let gate = self.shared.gate.clone();
            self.publish_event(parent, type_, reason, note, move || gate.may_write())
                .await;
        }
    }

    /// Whether this replica may write for the parent with `parent_uid` now:
    /// the leader, or under `--shards` the writer of the parent's bucket.
    pub(super) fn check_write(
        &self,
        parent_uid: &str,
    ) -> Result<(), super::leadership::leader::NotLeader> {
        self.shared.check_parent_write(parent_uid)
    }

    /// The buckets whose parents and children the caches hold (all
    /// without `--shards`, once listed).
    pub(super) fn listed_buckets(&self) -> crate::shard::BucketSet {
        self.children
            .iter()
            .fold(*self.parents_listed.borrow(), |all, c| {
                all.intersection(&c.listed.borrow())
            })
    }

    async fn publish_event(
        &self,
        parent: &DynamicObject,
        type_: EventType,
        reason: &str,
        note: String,
        allowed: impl Fn() -> bool + Send + 'static,
    ) {
        let reference = parent.object_ref(&self.kinds.parent.resource);
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(crate::status::truncate(&note, 1000)),
            action: "Reconcile".into(),
            secondary: None,
        };
        self.shared
            .metrics
            .events
            .get_or_create(&crate::telemetry::EventLabel {
                rule: self.rule().name.clone(),
                reason: reason.to_owned(),
            })
            .inc();
        self.shared
            .recorder
            .enqueue(event, reference, allowed)
            .await;
    }
}
