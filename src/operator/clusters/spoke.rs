//! One spoke: its client (the credentials of its Secret), whether it
//! answers (a probe of `/readyz`), and one watch per child kind that rules
//! place in spokes, selected by this hub's `trellis.dev/hub` label, so a
//! spoke shared by hubs shows each only its own objects, and under
//! `--shards` by this replica's buckets, as the hub's child watches are.
//!
//! A spoke lives from its Secret's arrival to its removal or rotation
//! ([`super::secrets`]); `stop` ends every task it started.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Clusters;
use crate::kinds::Gvk;
use crate::labels::{LABEL_CLUSTER, LABEL_HUB, LABEL_RULE};
use crate::operator::lock;
use crate::operator::watches::compact::{ByParent, CompactObject};
use crate::operator::watches::discovery::{self, Resolved};
use crate::operator::watches::{BucketScope, BucketWatch, cached_bucket_watch, trim};
use crate::shard::BucketSet;

/// How often a spoke's `/readyz` is asked.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a probe waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A registered spoke.
pub struct Spoke {
    pub name: String,
    /// The Secret that registers it.
    pub secret: String,
    /// What the Secret held (its `kubeconfig`), to tell a rotation from a
    /// resync.
    pub fingerprint: String,
    pub client: Client,
    /// The clients of rules' accounts (`serviceAccountName`) here: the
    /// spoke's client impersonating each, made once.
    accounts: std::sync::Mutex<std::collections::HashMap<String, Client>>,
    state: std::sync::Mutex<Reachability>,
    /// Child kind → its cache here.
    caches: std::sync::Mutex<BTreeMap<Gvk, KindCache>>,
    /// The related watches rules read here ([`super::related`]).
    pub(super) related: super::related::RelatedCaches,
    pub(super) stop: CancellationToken,
}

/// Whether the spoke answers, since when, and why not.
#[derive(Debug, Clone)]
struct Reachability {
    /// The first probe has come back (answer or not): until then, the
    /// spoke counts as still being listed, not as unreachable.
    probed: bool,
    reachable: bool,
    since: String,
    why: String,
}

/// One child kind's watch in a spoke: the hub's own child cache
/// (`watches::cached_bucket_watch`), with its index by parent uid.
struct KindCache {
    /// Discovery's answer; `None` until it came.
    kind: Option<Resolved>,
    store: Option<Store<CompactObject>>,
    by_parent: Arc<ByParent>,
    /// The first list is in (or discovery said the kind is not served).
    listed: bool,
    /// Under `--shards`, the buckets whose objects the cache holds in full:
    /// a bucket just gained is listed again before its parents are planned
    /// (they would re-create what exists).
    buckets: Option<watch::Receiver<BucketSet>>,
    /// Why the kind cannot be watched here (not served, refused).
    error: Option<String>,
    stop: CancellationToken,
}

/// How the spoke looks to one rule's pass.
pub(super) enum Readiness {
    Ready,
    /// It answers; some of the rule's kinds are still being listed.
    Listing,
    Unreachable(String),
}

impl Spoke {
    pub(super) fn new(name: String, secret: String, fingerprint: String, client: Client) -> Spoke {
        Spoke {
            name,
            secret,
            fingerprint,
            client,
            accounts: std::sync::Mutex::default(),
            state: std::sync::Mutex::new(Reachability {
                probed: false,
                reachable: false,
                since: crate::clock::now_rfc3339(),
                why: "not probed yet".into(),
            }),
            caches: std::sync::Mutex::default(),
            related: std::sync::Mutex::default(),
            stop: CancellationToken::new(),
        }
    }

    /// Starts the probe and the watches of the kinds rules place in spokes.
    pub(super) fn start(self: &Arc<Spoke>, clusters: &Arc<Clusters>) {
        tokio::spawn(probe(self.clone(), clusters.clone()));
        tokio::spawn(follow_kinds(self.clone(), clusters.clone()));
        tokio::spawn(super::related::follow(self.clone(), clusters.clone()));
    }

    /// The client a rule's writes here go through: the Secret's
    /// credentials, impersonating `user` (the rule's account, named as at
    /// home) when the rule has one, so the spoke authorizes each write as
    /// that account.
    pub(super) fn client_as(&self, user: Option<&str>) -> Client {
        let Some(user) = user else {
            return self.client.clone();
        };
        lock(&self.accounts)
            .entry(user.to_owned())
            .or_insert_with(|| crate::operator::identity::impersonating(self.client.clone(), user))
            .clone()
    }

    pub(super) fn reachable(&self) -> bool {
        lock(&self.state).reachable
    }

    /// How the spoke stands for a rule placing `kinds` here.
    pub(super) fn readiness(
        &self,
        kinds: &BTreeSet<Gvk>,
        owned: Option<&watch::Receiver<BucketSet>>,
    ) -> Readiness {
        let state = lock(&self.state).clone();
        if !state.probed {
            return Readiness::Listing;
        }
        if !state.reachable {
            return Readiness::Unreachable(state.why);
        }
        let caches = lock(&self.caches);
        for gvk in kinds {
            match caches.get(gvk) {
                Some(KindCache {
                    error: Some(why), ..
                }) => return Readiness::Unreachable(why.clone()),
                Some(c) if c.listed && c.holds(owned) => {}
                _ => return Readiness::Listing,
            }
        }
        Readiness::Ready
    }

    /// Whether every one of `kinds` has been listed here at least once
    /// (or is known not to be served): the caches tell what the spoke
    /// holds, if perhaps stale.
    pub(super) fn ever_listed(&self, kinds: &BTreeSet<Gvk>) -> bool {
        let caches = lock(&self.caches);
        kinds
            .iter()
            .all(|gvk| caches.get(gvk).is_some_and(|c| c.listed))
    }

    /// `/status` → `clusters.<name>`.
    pub(super) fn status_json(&self) -> Value {
        let state = lock(&self.state).clone();
        let caches = lock(&self.caches);
        let kinds: Vec<String> = caches.keys().map(ToString::to_string).collect();
        // What this hub (under `--shards`: this replica) holds of the spoke.
        let objects: usize = caches
            .values()
            .filter_map(|c| c.store.as_ref())
            .map(Store::len)
            .sum();
        drop(caches);
        let mut related: Vec<String> = lock(&self.related)
            .keys()
            .map(|w| w.gvk.to_string())
            .collect();
        related.dedup();
        let mut out = serde_json::json!({
            "reachable": state.reachable,
            "kinds": kinds,
            "objects": objects,
            "related": related,
            "since": state.since,
            "secret": self.secret,
        });
        if !state.reachable {
            out["reason"] = Value::String(state.why);
        }
        out
    }

    /// The kind of `group`/`kind` as this spoke serves it.
    pub(super) fn kind(&self, group: &str, kind: &str) -> Option<Resolved> {
        lock(&self.caches)
            .values()
            .filter_map(|c| c.kind.as_ref())
            .find(|k| k.gvk.group == group && k.gvk.kind == kind)
            .cloned()
    }

    /// This spoke's objects of `rule` for the parent `uid` (looked up by
    /// the caches' index, not a scan), each with the annotation that
    /// places it here (what the planner keys it by).
    pub(super) fn observed(&self, rule: &str, uid: &str, out: &mut Vec<Value>) {
        let caches = lock(&self.caches);
        for cache in caches.values() {
            let (Some(store), Some(kind)) = (&cache.store, &cache.kind) else {
                continue;
            };
            for (namespace, name) in cache.by_parent.of(uid) {
                let mut at = ObjectRef::new_with(&name, kind.resource.clone());
                if let Some(ns) = namespace {
                    at = at.within(&ns);
                }
                let Some(obj) = store.get(&at).filter(|o| o.parent_uid() == Some(uid)) else {
                    continue;
                };
                let mut value = obj.to_value();
                if value
                    .pointer("/metadata/labels")
                    .and_then(|l| l.get(LABEL_RULE))
                    != Some(&Value::String(rule.to_owned()))
                {
                    continue;
                }
                if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    let annotations = meta
                        .entry("annotations")
                        .or_insert_with(|| Value::Object(Default::default()));
                    if let Some(a) = annotations.as_object_mut() {
                        a.insert(LABEL_CLUSTER.into(), Value::String(self.name.clone()));
                    }
                }
                out.push(value);
            }
        }
    }

    /// Records an answer (or its absence); whether reachability changed.
    fn set_reachable(&self, reachable: bool, why: String) -> bool {
        let mut state = lock(&self.state);
        state.why = why;
        let first = !state.probed;
        state.probed = true;
        if state.reachable == reachable && !first {
            return false;
        }
        state.reachable = reachable;
        state.since = crate::clock::now_rfc3339();
        true
    }
}

/// Asks `/readyz` every [`PROBE_EVERY`]; a change of reachability wakes
/// the rules placing children in spokes.
async fn probe(spoke: Arc<Spoke>, clusters: Arc<Clusters>) {
    loop {
        let answer = tokio::time::timeout(PROBE_TIMEOUT, readyz(spoke.client.clone())).await;
        let (reachable, why) = match answer {
            Ok(Ok(())) => (true, String::new()),
            Ok(Err(why)) => (false, why),
            Err(_) => (false, format!("no answer within {PROBE_TIMEOUT:?}")),
        };
        if spoke.set_reachable(reachable, why.clone()) {
            if reachable {
                info!(cluster = %spoke.name, "cluster answers");
            } else {
                warn!(cluster = %spoke.name, "cluster unreachable: {why}");
            }
            clusters.report(&spoke.name, reachable);
            clusters.bump();
        }
        tokio::select! {
            _ = spoke.stop.cancelled() => return,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}

/// `/readyz` answered; a 403 counts as an answer (the server was reached).
async fn readyz(client: Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code < 500 && status.code != 429 => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Keeps one watch per kind rules place in spokes: started when a rule
/// set places a kind here, stopped when none does any more.
async fn follow_kinds(spoke: Arc<Spoke>, clusters: Arc<Clusters>) {
    let mut kinds = clusters.kinds.subscribe();
    loop {
        let wanted = kinds.borrow_and_update().clone();
        {
            let mut caches = lock(&spoke.caches);
            caches.retain(|gvk, cache| {
                let keep = wanted.contains(gvk);
                if !keep {
                    cache.stop.cancel();
                }
                keep
            });
            for gvk in &wanted {
                if caches.contains_key(gvk) {
                    continue;
                }
                let stop = spoke.stop.child_token();
                caches.insert(
                    gvk.clone(),
                    KindCache {
                        kind: None,
                        store: None,
                        by_parent: Arc::default(),
                        listed: false,
                        buckets: None,
                        error: None,
                        stop: stop.clone(),
                    },
                );
                tokio::spawn(watch_kind(
                    spoke.clone(),
                    clusters.clone(),
                    gvk.clone(),
                    stop,
                ));
            }
        }
        tokio::select! {
            _ = spoke.stop.cancelled() => return,
            changed = kinds.changed() => if changed.is_err() { return },
        }
    }
}

/// Discovery of `gvk` in the spoke (retried until the spoke answers),
/// then the hub's own child watch over it, label-selected by this hub's
/// name, feeding the cache; each event wakes the parent its uid names.
async fn watch_kind(spoke: Arc<Spoke>, clusters: Arc<Clusters>, gvk: Gvk, stop: CancellationToken) {
    let kind = loop {
        match discovery::resolve(&spoke.client, &gvk).await {
            Ok(kind) => break kind,
            Err(why) if spoke.reachable() => {
                // It answers and does not serve the kind: children of it
                // placed here fail to apply, saying so.
                warn!(cluster = %spoke.name, "{why}");
                spoke.update(&gvk, |c| {
                    c.error = Some(why.to_string());
                    c.listed = true;
                });
                clusters.bump();
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    };
    let by_parent = Arc::new(ByParent::default());
    // Relists are seen as `InitDone` below; nothing else listens.
    let (relisted, _) = tokio::sync::mpsc::unbounded_channel();
    let resource = kind.resource.clone();
    let watch: BucketWatch<CompactObject, _> = cached_bucket_watch(
        &spoke.client,
        BucketScope {
            kind: &kind,
            namespaces: &[],
            config: watcher::Config::default().labels(&format!("{LABEL_HUB}={}", clusters.hub)),
            buckets: clusters.owned.clone(),
            trim: move || trim(&resource),
        },
        relisted,
        {
            let by_parent = by_parent.clone();
            move |event: &watcher::Event<CompactObject>| by_parent.observe(event)
        },
    );
    spoke.update(&gvk, |c| {
        c.kind = Some(kind.clone());
        c.store = Some(watch.store.clone());
        c.by_parent = by_parent.clone();
        c.buckets = clusters.owned.is_some().then(|| watch.listed.clone());
        c.error = None;
    });
    let mut events = std::pin::pin!(watch.stream);
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(err)) => {
                warn!(cluster = %spoke.name, kind = %gvk, "watch failed, retrying: {err}");
                // A first list the spoke refuses (its account may not list
                // the kind) would otherwise hold every pass back as still
                // listing: its children are held back as unreachable,
                // saying why. Later errors (a relist) leave the cache as it
                // is; whether the spoke answers is the probe's to say.
                let why = format!("cannot watch {gvk} there: {err}");
                let first = |c: &KindCache| c.error.is_none() && !c.listed;
                if spoke.update_if(&gvk, first, |c| c.error = Some(why)) {
                    clusters.bump();
                }
            }
            Some(Ok(watcher::Event::InitDone)) => {
                spoke.update(&gvk, |c| {
                    c.listed = true;
                    c.error = None;
                });
                clusters.bump();
            }
            Some(Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj))) => {
                if let Some(uid) = obj.parent_uid() {
                    clusters.touched_uid(uid);
                }
            }
            Some(Ok(_)) => {}
        }
    }
}

impl KindCache {
    /// Whether the cache holds every bucket of `owned` (this replica's,
    /// under `--shards`) in full.
    fn holds(&self, owned: Option<&watch::Receiver<BucketSet>>) -> bool {
        match (owned, &self.buckets) {
            (Some(owned), Some(listed)) => owned.borrow().minus(&listed.borrow()).is_empty(),
            // Not sharded, or the kind is not served here (nothing listed).
            _ => true,
        }
    }
}

impl Spoke {
    fn update(&self, gvk: &Gvk, change: impl FnOnce(&mut KindCache)) {
        self.update_if(gvk, |_| true, change);
    }

    /// Changes the cache of `gvk` when `when` holds; whether it did.
    fn update_if(
        &self,
        gvk: &Gvk,
        when: impl FnOnce(&KindCache) -> bool,
        change: impl FnOnce(&mut KindCache),
    ) -> bool {
        match lock(&self.caches).get_mut(gvk) {
            Some(cache) if when(cache) => {
                change(cache);
                true
            }
            _ => false,
        }
    }
}
