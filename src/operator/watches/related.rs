//! Related objects live: the watch-backed caches a rule's `related:` entries
//! are read from, and the index from a related object to the parents that
//! read it.
//!
//! ```text
//!  related watch (one per kind, or per static selector) ──step──▶ store
//!        │ under the index lock: old labels from the store, event applied
//!        ▼
//!  ReadIndex: (kind, namespace, name) / selector reads ──▶ parents to re-reconcile
//!        ▲                                                    │ (controller trigger)
//!        └── record(parent, plan.reads) after every pass ◀────┘
//! ```
//!
//! The planner never sees a cache: it asks [`Caches`] (a
//! [`RelatedSource`]) per read, and gets only the object a name read names
//! or the objects a selector read matches. What to watch is decided from
//! the rule alone ([`crate::related_watches`]): a selector with no template in it is a
//! label-selected watch; anything else watches the whole kind, in the
//! parent's namespaces unless an entry may read elsewhere. Watches keep
//! whole objects (templates read `data`, `spec`, `status`), trimmed of
//! managed fields like every other cache.
//!
//! What this module does not own: deciding what a pass reads (that is
//! `plan::related`), and running the watches' controller (`controller`).

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use serde_json::Value;
use tracing::warn;

use super::decode::ParentObject;
use super::discovery::Resolved;
use crate::kinds::Gvk;
use crate::operator::watches::{own_errors, selector_string, trim, watch_stream};
use crate::plan::{RelatedRead, RelatedTarget, Unreadable};
use crate::related_watches::{WatchSpec, reads_match_labels, watch_specs};
use crate::rules::CompiledRule;
pub use index::{ReadIndex, Touched};
use labels::LabelIndex;

/// A cached object's namespace and name.
type NamespacedName = (Option<String>, String);

fn name_of(o: &ParentObject) -> NamespacedName {
    let meta = &o.object.metadata;
    (
        meta.namespace.clone(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A parent as the controller queues it.
pub type ParentRef = ObjectRef<ParentObject>;

/// The queue's reference to a parent object.
pub fn parent_ref(
    parent: &kube::api::DynamicObject,
    resource: &super::decode::SharedResource,
) -> ParentRef {
    let meta = &parent.metadata;
    let r = ObjectRef::new_with(meta.name.as_deref().unwrap_or_default(), resource.clone());
    match &meta.namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

/// One related watch, started.
struct Watch {
    spec: WatchSpec,
    kind: Resolved,
    /// The namespaces it lists (empty: all); a read elsewhere is
    /// `RelatedOutOfScope`, never "does not exist".
    scope: Vec<String>,
    /// By label pair, for `matchLabels` reads of a whole-kind watch (a
    /// label-selected watch holds only its selection: scanned).
    /// Keyed by (namespace, name), not `ObjectRef`, which carries the
    /// kind's `ApiResource` (five strings) in every key.
    labels: Option<Mutex<LabelIndex<NamespacedName>>>,
    /// Objects are decoded one by one, as parents are: one object too deep
    /// to decode never fails the list of its kind (see `decode`).
    store: Store<ParentObject>,
}

/// A rule's related caches and read index.
pub struct Caches {
    watches: Vec<Watch>,
    /// Related kinds discovery does not serve, with why: their readers are
    /// pending until the CRD appears (which restarts the rule's watches).
    unserved: Vec<super::discovery::NotServed>,
    metrics: Arc<crate::telemetry::Metrics>,
    index: Mutex<ReadIndex<ParentRef>>,
    /// Parents a pass may have read stale data for: reconciled again.
    missed: tokio::sync::mpsc::UnboundedSender<ParentRef>,
    /// The undecodable-object Warning last written per parent.
    warned: Mutex<std::collections::HashMap<ParentRef, String>>,
    /// Patch manager → the targets (watch, namespace, name) it contributes to.
    managers: Mutex<managers::Managers>,
    /// Where entries with `cluster:` are read ([`RelatedSource::find_in`]).
    spokes: Option<Arc<crate::operator::clusters::Clusters>>,
}

/// What [`Caches::start`] watches, and where.
pub struct Scope<'a> {
    pub kinds: &'a [Resolved],
    pub unserved: &'a [super::discovery::NotServed],
    pub parent_cluster_scoped: bool,
    pub parent_namespaces: &'a [String],
    pub operator_namespaces: &'a [String],
    pub metrics: Arc<crate::telemetry::Metrics>,
    /// The spokes, for a rule reading related objects there.
    pub spokes: Option<Arc<crate::operator::clusters::Clusters>>,
}

/// The parts [`Caches::start`] hands the controller.
pub struct Started {
    pub caches: Arc<Caches>,
    /// Parents to re-reconcile (`Controller::reconcile_on`).
    pub triggers: futures::stream::BoxStream<'static, ParentRef>,
    /// What the caches-ready gate waits on.
    pub ready: Vec<futures::future::BoxFuture<'static, bool>>,
}

impl Caches {
    /// Sets up one watch per [`WatchSpec`]; nothing runs until `triggers`
    /// is polled. `kinds` are the resolved related kinds (`unserved` the
    /// others); a namespaced kind is watched in `scope.parent_namespaces`,
    /// or in `scope.operator_namespaces` when an entry may read elsewhere or
    /// the parent is cluster-scoped (empty: all).
    pub fn start(client: &Client, rule: &CompiledRule, scope: Scope<'_>) -> Started {
        let Scope {
            kinds,
            unserved,
            parent_cluster_scoped,
            parent_namespaces,
            operator_namespaces,
            metrics,
            spokes,
        } = scope;
        let (missed, missed_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut watches = Vec::new();
        let mut streams = Vec::new();
        for spec in watch_specs(rule) {
            let Some(kind) = kinds.iter().find(|k| k.gvk == spec.gvk) else {
                continue;
            };
            let scope = if spec.anywhere || parent_cluster_scoped {
                operator_namespaces
            } else {
                parent_namespaces
            };
            let scope = if kind.namespaced { scope } else { &[] };
            let mut config = watcher::Config::default().streaming_lists();
            if let Some(labels) = &spec.labels {
                config = config.labels(labels);
            }
            let writer = Writer::new(kind.resource.clone());
            let store = writer.as_reader();
            let mut trim = trim(&kind.resource);
            let patched = spec.patched;
            let stream = watch_stream(client, kind, scope, config, move |o: &mut ParentObject| {
                // Patch managers stay: they tell who contributed to a target.
                let managers = o.object.metadata.managed_fields.take();
                trim(&mut o.object);
                if patched {
                    o.object.metadata.managed_fields = managers;
                }
            });
            let what = format!("{} related {}", rule.name, spec.gvk);
            streams.push((own_errors(what, stream), writer, watches.len()));
            let labels = (spec.labels.is_none() && reads_match_labels(rule, &spec.gvk))
                .then(|| Mutex::new(LabelIndex::default()));
            watches.push(Watch {
                spec,
                kind: kind.clone(),
                scope: scope.to_vec(),
                labels,
                store,
            });
        }
        let ready = watches
            .iter()
            .map(|w| crate::operator::context::listed(w.store.clone()))
            .collect();
        let caches = Arc::new(Caches {
            watches,
            unserved: unserved.to_vec(),
            metrics,
            index: Mutex::new(ReadIndex::default()),
            missed,
            warned: Mutex::default(),
            managers: Mutex::default(),
            spokes: spokes.filter(|_| rule.related.iter().any(|r| r.cluster.is_some())),
        });
        let mut triggers: Vec<futures::stream::BoxStream<'static, ParentRef>> = Vec::new();
        for (stream, mut writer, w) in streams {
            let caches = caches.clone();
            let mut listed = false;
            triggers.push(
                stream
                    .flat_map(move |event| {
                        let parents = match event {
                            Ok(event) => caches.step(w, &mut writer, &mut listed, &event),
                            Err(_) => Vec::new(),
                        };
                        futures::stream::iter(parents)
                    })
                    .boxed(),
            );
        }
        triggers.push(tokio_stream_of(missed_rx));
        if let Some(spokes) = &caches.spokes {
            triggers.push(spoke_triggers(caches.clone(), spokes.related_touched()));
        }
        Started {
            caches,
            triggers: futures::stream::select_all(triggers).boxed(),
            ready,
        }
    }

    /// Applies one event to watch `w`'s store and returns the parents to
    /// re-reconcile. Runs under the index lock, so a pass recording its
    /// reads sees every event either in the store or in `recent`.
    fn step(
        &self,
        w: usize,
        writer: &mut Writer<ParentObject>,
        listed: &mut bool,
        event: &watcher::Event<ParentObject>,
    ) -> Vec<ParentRef> {
        let Some(watch) = self.watches.get(w) else {
            return Vec::new();
        };
        let gvk = &watch.kind.gvk;
        if report_undecodable(gvk, event) {
            self.metrics
                .undecodable
                .get_or_create(&crate::telemetry::KindLabel {
                    kind: gvk.to_string(),
                })
                .inc();
        }
        let mut index = crate::operator::lock(&self.index);
        let key = |o: &ParentObject| ObjectRef::from_obj_with(o, watch.kind.resource.clone());
        let labels_of = |o: &ParentObject| o.object.labels();
        match event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                let old = watch.store.get(&key(o));
                writer.apply_watcher_event(event);
                if watch.spec.patched {
                    let mut managers = crate::operator::lock(&self.managers);
                    let at = (w, name_of(o));
                    if let Some(old) = &old {
                        managers.remove(&at, &old.object.metadata);
                    }
                    if let watcher::Event::Apply(o) = event {
                        managers.add(&at, &o.object.metadata);
                    }
                }
                let meta = &o.object.metadata;
                let mut labels = vec![labels_of(o)];
                let before = old.as_ref().map(|o| labels_of(o));
                if let Some(before) = &before
                    && *before != labels[0]
                {
                    labels.push(before.clone());
                }
                if let Some(by_label) = &watch.labels {
                    let mut by_label = crate::operator::lock(by_label);
                    let old = before.as_ref();
                    match event {
                        watcher::Event::Delete(_) => {
                            by_label.delete(&name_of(o), old.unwrap_or(&labels[0]));
                        }
                        _ => by_label.apply(&name_of(o), old, &labels[0]),
                    }
                }
                index.touch(Touched {
                    group: gvk.group.clone(),
                    kind: gvk.kind.clone(),
                    namespace: meta.namespace.clone(),
                    name: meta.name.clone(),
                    labels,
                })
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {
                writer.apply_watcher_event(event);
                if watch.spec.patched {
                    let mut managers = crate::operator::lock(&self.managers);
                    match event {
                        watcher::Event::InitApply(o) => {
                            managers.add(&(w, name_of(o)), &o.object.metadata)
                        }
                        _ => managers.clear(w),
                    }
                }
                if let Some(by_label) = &watch.labels {
                    let mut by_label = crate::operator::lock(by_label);
                    match event {
                        watcher::Event::InitApply(o) => {
                            by_label.apply(&name_of(o), None, &labels_of(o))
                        }
                        _ => by_label.relist(),
                    }
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                writer.apply_watcher_event(event);
                if let Some(by_label) = &watch.labels {
                    crate::operator::lock(by_label).relisted();
                }
                // A relist replaces the cache without reporting what went
                // while the watch was down: every reader of the kind looks.
                if std::mem::replace(listed, true) {
                    index.touch(Touched {
                        group: gvk.group.clone(),
                        kind: gvk.kind.clone(),
                        namespace: None,
                        name: None,
                        labels: Vec::new(),
                    })
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// Take before a pass reads the caches; hand to [`record`](Self::record).
    pub fn seq(&self) -> u64 {
        crate::operator::lock(&self.index).seq()
    }

    /// Records what a parent's pass read; one that may have missed an event
    /// is queued again.
    pub fn record(&self, parent: ParentRef, reads: &[RelatedRead], since: u64) {
        let missed = crate::operator::lock(&self.index).record(&parent, reads, since);
        if missed {
            let _ = self.missed.send(parent);
        }
    }

    pub fn forget(&self, parent: &ParentRef) {
        crate::operator::lock(&self.index).forget(parent);
        crate::operator::lock(&self.warned).remove(parent);
    }

    /// The Warning a pass owes `parent` for an undecodable related object:
    /// once per message, though a pending parent is passed again every few
    /// seconds (remembered here, and in the parent's status when it has one).
    pub fn undecodable_warning(
        &self,
        parent: &ParentRef,
        plan: &crate::plan::Plan,
        parent_json: &Value,
    ) -> Option<String> {
        let mut warned = crate::operator::lock(&self.warned);
        let Some(pending) = plan
            .pending
            .iter()
            .find(|p| p.reason == Unreadable::UNDECODABLE)
        else {
            warned.remove(parent);
            return None;
        };
        let message = pending.message.clone().unwrap_or_default();
        if warned.get(parent) == Some(&message) {
            return None;
        }
        warned.insert(parent.clone(), message.clone());
        (!status_tells(parent_json, &message)).then_some(message)
    }

    /// Forgets parents gone from the cache, when the index looks oversized.
    pub fn sweep(&self, parents: &Store<ParentObject>) {
        let mut index = crate::operator::lock(&self.index);
        if index.len() > parents.len() + 256 {
            index.retain(|p| parents.get(p).is_some());
        }
    }

    /// Objects held in the related caches, by kind (for logs and tests).
    pub fn sizes(&self) -> Vec<(String, usize)> {
        self.watches
            .iter()
            .map(|w| (w.spec.gvk.to_string(), w.store.len()))
            .collect()
    }

    /// The watch a read is served from: the whole-kind watch, or the
    /// label-selected one with the read's selector.
    fn watch_for(&self, gvk: &Gvk, read: &RelatedRead) -> Option<&Watch> {
        let same_kind = |w: &&Watch| w.kind.gvk.group == gvk.group && w.kind.gvk.kind == gvk.kind;
        if let Some(w) = self
            .watches
            .iter()
            .filter(same_kind)
            .find(|w| w.spec.labels.is_none())
        {
            return Some(w);
        }
        let RelatedTarget::Selector(sel) = &read.target else {
            return None;
        };
        let wanted = selector_string(sel);
        self.watches
            .iter()
            .filter(same_kind)
            .find(|w| w.spec.labels.as_deref() == Some(wanted.as_str()))
    }
}

impl Caches {
    /// The parent uids whose contributions under `rule` the patch targets'
    /// caches show (managers `trellis/<rule>/<uid>`).
    pub fn contributors(&self, rule: &str) -> Vec<String> {
        let prefix = crate::plan::field_manager(rule, "");
        crate::operator::lock(&self.managers)
            .named(&prefix)
            .into_iter()
            .filter_map(|m| m.strip_prefix(&prefix).map(str::to_owned))
            .collect()
    }
}

/// The parents that read a spoke's related object that changed, through
/// this rule's read index (which knows no cluster: a hub object of the
/// same kind and name read by a parent wakes it too, harmlessly).
fn spoke_triggers(
    caches: Arc<Caches>,
    touched: tokio::sync::broadcast::Receiver<crate::operator::clusters::RelatedTouched>,
) -> futures::stream::BoxStream<'static, ParentRef> {
    futures::stream::unfold((touched, caches), |(mut touched, caches)| async move {
        loop {
            let t = match touched.recv().await {
                Ok(t) => t.touched,
                // Missed changes: every reader of every kind looks again.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let parents = crate::operator::lock(&caches.index).parents();
                    return Some((futures::stream::iter(parents), (touched, caches)));
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            };
            let parents = crate::operator::lock(&caches.index).touch(t);
            if !parents.is_empty() {
                return Some((futures::stream::iter(parents), (touched, caches)));
            }
        }
    })
    .flatten()
    .boxed()
}

/// A related object too deep or malformed to decode: logged (and counted)
/// as it arrives; its readers are pending with `RelatedUndecodable`, and its
/// kind's watch goes on. Returns whether it was one.
fn report_undecodable(gvk: &Gvk, event: &watcher::Event<ParentObject>) -> bool {
    if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event
        && let Some(why) = &o.undecodable
    {
        let meta = &o.object.metadata;
        warn!(
            kind = %gvk,
            object = %format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ),
            "related object cannot be decoded (its readers wait): {why}"
        );
        return true;
    }
    false
}

/// Whether the parent's last status already tells `message` (so that a
/// restarted operator does not warn again).
fn status_tells(parent: &Value, message: &str) -> bool {
    parent
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .is_some_and(|c| c["reason"] == Unreadable::UNDECODABLE && c["message"] == message)
}

/// An unbounded receiver as a stream.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> futures::stream::BoxStream<'static, T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

mod index;
mod labels;
mod managers;
mod read;
#[cfg(test)]
mod tests;
