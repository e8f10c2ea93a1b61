//! The rule's caches: one watch per kind feeding a store, and what every
//! watch shares (backoff, trimming, error handling, relist signals).
//!
//! ```text
//!  watcher (label selector, one namespace or all) ──trim──▶ observe (indexes) ──▶ reflector store
//!        │ parents and child kinds under --shards: the selector follows the replica's
//!        │ buckets; a new bucket set restarts the watch, whose fresh list replaces the store
//!        ▼
//!  InitDone ──▶ `listed`: the buckets whose children the store now holds
//! ```
//!
//! `controller` builds a rule's watches from here; `related` its reads.
//!
//! The room: what the operator knows of the cluster and how it stays
//! current — `discovery` (the kinds a rule names, resolved), this file
//! (the watches and their stores), `compact` and `decode` (objects as the
//! caches keep them), `relisted` and `by_uid` (indexes kept beside a
//! store), `related` (the caches `related:` entries read), `changed`
//! (which parent events are worth a pass) and `triggers` (what wakes a
//! parent besides its own events).

pub(super) mod by_uid;
pub(super) mod changed;
pub(super) mod compact;
pub(super) mod decode;
pub mod discovery;
pub mod related;
pub(super) mod relisted;
pub(super) mod triggers;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, future};
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::warn;

use super::retry::WatchBackoff;
use crate::rules::model::LabelSelector;
use crate::shard::BucketSet;
use compact::CompactObject;
use discovery::Resolved;

/// Children of `gvk` the rule may place in any namespace
/// (`allowCrossNamespace`): they are watched, and looked for, everywhere.
pub(super) fn children_anywhere(
    rule: &crate::rules::CompiledRule,
    gvk: &crate::kinds::Gvk,
) -> bool {
    rule.children
        .iter()
        .any(|c| &c.gvk == gvk && c.spec.allow_cross_namespace)
}

/// What a watch here can hold: an object of a kind found by discovery.
pub(super) trait Watched:
    Resource<DynamicType = decode::SharedResource, Scope = kube::core::DynamicResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = decode::SharedResource, Scope = kube::core::DynamicResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

type EventStream<K> =
    futures::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// `matchLabels`/`matchExpressions` as a label selector string.
pub fn selector_string(selector: &LabelSelector) -> String {
    selector.query()
}

/// Drops what the planner never reads before it reaches a cache, and fills
/// in apiVersion/kind, which list responses leave out of their items.
pub(super) fn trim(
    resource: &kube::discovery::ApiResource,
) -> impl FnMut(&mut CompactObject) + Send + 'static + use<> {
    let types = std::sync::Arc::new(kube::core::TypeMeta {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
    });
    move |obj: &mut CompactObject| {
        obj.metadata.managed_fields = None;
        if let Some(a) = obj.metadata.annotations.as_mut() {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
        obj.types = Some(types.clone());
    }
}

/// Feeds each event to `observe` (an index of the store) before the store
/// takes it: the store's readiness wakes the reconciles, on other threads,
/// and an index still swapping in its first list would tell them a listed
/// child does not exist (a restart that found everything in place flapped
/// Ready to False and back).
fn observed_then_stored<K, S>(
    stream: S,
    writer: Writer<K>,
    mut observe: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    stream
        .inspect(move |event| {
            if let Ok(event) = event {
                observe(event);
            }
        })
        .reflect(writer)
}

/// A watch of one kind (one namespace, or all and filtered to `namespaces`),
/// with its own backoff and `trim` applied to every object.
pub(super) fn watch_stream<K>(
    client: &Client,
    kind: &Resolved,
    namespaces: &[String],
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Watched,
{
    let api: Api<K> = match namespaces {
        [one] => kind.api(client.clone(), Some(one)),
        _ => kind.api(client.clone(), None),
    };
    let keep: Option<BTreeSet<String>> =
        (kind.namespaced && namespaces.len() > 1).then(|| namespaces.iter().cloned().collect());
    watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(trim)
        .filter(move |event| {
            let pass = match (&keep, event) {
                (
                    Some(keep),
                    Ok(
                        watcher::Event::Apply(o)
                        | watcher::Event::InitApply(o)
                        | watcher::Event::Delete(o),
                    ),
                ) => o.namespace().is_some_and(|ns| keep.contains(&ns)),
                _ => true,
            };
            future::ready(pass)
        })
}

/// Signals every relist after the first. A relist (after a 410 Gone, say)
/// replaces the cache but reports no deletions, so a child deleted while the
/// watch was down would only come back at the next resync: the rule's
/// parents are all re-reconciled instead.
fn relist_signal<K, E>(
    relisted: tokio::sync::mpsc::UnboundedSender<()>,
) -> impl FnMut(&Result<watcher::Event<K>, E>) {
    let mut listed_before = false;
    move |event| {
        if let Ok(watcher::Event::InitDone) = event {
            if listed_before {
                let _ = relisted.send(());
            }
            listed_before = true;
        }
    }
}

/// A watch's errors stay with that watch: logged here, and retried by its
/// own backoff ([`WatchBackoff`]). Passed on, they would reach the
/// controller's trigger stream, whose one backoff pauses *every* watch of
/// the rule, growing to 30 s, on any one watch's error.
pub(super) fn own_errors<K: Send + 'static>(
    what: String,
    stream: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    stream.filter(move |item| {
        if let Err(err) = item {
            warn!(watch = %what, "watch failed, retrying: {err}");
        }
        future::ready(item.is_ok())
    })
}

/// A cache cut by bucket (a child kind's, and under `--shards` the
/// parents'). With `buckets` (a replica under `--shards`) the watch selects
/// only those buckets' objects and follows the set as it changes; `listed`
/// says which buckets the store holds in full, so a pass never plans a
/// parent whose children (or which parent) are still being listed (it
/// would re-create them). Without, `listed` is every bucket once the first
/// list is in.
pub(super) struct BucketWatch<K: Watched, S> {
    pub store: Store<K>,
    pub stream: S,
    pub listed: watch::Receiver<BucketSet>,
}

/// What a [`BucketWatch`] watches: `config` (its own label selector, to
/// which the buckets' is added), and `trim` made afresh for each watch a
/// new bucket set starts.
pub(super) struct BucketScope<'a, F> {
    pub kind: &'a Resolved,
    pub namespaces: &'a [String],
    pub config: watcher::Config,
    pub buckets: Option<watch::Receiver<BucketSet>>,
    pub trim: F,
}

pub(super) fn cached_bucket_watch<K, F, T, O>(
    client: &Client,
    scope: BucketScope<'_, F>,
    relisted: tokio::sync::mpsc::UnboundedSender<()>,
    observe: O,
) -> BucketWatch<
    K,
    impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>
    + Send
    + 'static
    + use<K, F, T, O>,
>
where
    K: Watched,
    O: FnMut(&watcher::Event<K>) + Send + 'static,
    F: Fn() -> T + Send + 'static,
    T: FnMut(&mut K) + Send + 'static,
{
    let BucketScope {
        kind,
        namespaces,
        config,
        buckets,
        trim,
    } = scope;
    let writer = Writer::new(kind.resource.clone());
    let store = writer.as_reader();
    let (listed_tx, listed) = watch::channel(BucketSet::empty());
    // The set the running watch selects, read when its list completes.
    let selecting = Arc::new(Mutex::new(BucketSet::all()));
    let source: EventStream<K> = match buckets {
        None => watch_stream(client, kind, namespaces, config, trim())
            .inspect(relist_signal(relisted))
            .boxed(),
        Some(buckets) => following(
            Following {
                client: client.clone(),
                kind: kind.clone(),
                namespaces: namespaces.to_vec(),
                config,
                trim,
                selecting: selecting.clone(),
                relisted,
            },
            buckets,
        ),
    };
    let stream = observed_then_stored(source, writer, observe).inspect(move |event| {
        if let Ok(watcher::Event::InitDone) = event {
            listed_tx.send_replace(*super::lock(&selecting));
        }
    });
    BucketWatch {
        store,
        stream,
        listed,
    }
}

/// What [`following`] restarts its watch with.
struct Following<F> {
    client: Client,
    kind: Resolved,
    namespaces: Vec<String>,
    config: watcher::Config,
    trim: F,
    selecting: Arc<Mutex<BucketSet>>,
    relisted: tokio::sync::mpsc::UnboundedSender<()>,
}

/// `config` with `by_bucket` added to its label selector.
fn with_buckets(config: &watcher::Config, by_bucket: &str) -> watcher::Config {
    let mut config = config.clone();
    config.label_selector = Some(match config.label_selector.as_deref() {
        Some(own) if !own.is_empty() => format!("{own},{by_bucket}"),
        _ => by_bucket.to_owned(),
    });
    config
}

/// A watch whose selector follows `buckets`: each new set starts a fresh
/// watch (its list replaces the store's content); an empty set lists
/// nothing. A relist that is not a switch (the server lost the watch) is
/// signalled on `relisted` like any other watch's.
fn following<K, F, T>(how: Following<F>, buckets: watch::Receiver<BucketSet>) -> EventStream<K>
where
    K: Watched,
    F: Fn() -> T + Send + 'static,
    T: FnMut(&mut K) + Send + 'static,
{
    let start = move |set: BucketSet| -> EventStream<K> {
        *super::lock(&how.selecting) = set;
        match set.label_selector() {
            None => futures::stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
                .chain(futures::stream::pending())
                .boxed(),
            Some(by_bucket) => watch_stream(
                &how.client,
                &how.kind,
                &how.namespaces,
                with_buckets(&how.config, &by_bucket),
                (how.trim)(),
            )
            .inspect(relist_signal(how.relisted.clone()))
            .boxed(),
        }
    };
    let mut buckets = buckets;
    let first = *buckets.borrow_and_update();
    let inner = start(first);
    futures::stream::unfold(
        (buckets, inner, first, start, false),
        |(mut buckets, mut inner, mut current, start, mut closed)| async move {
            loop {
                tokio::select! {
                    changed = buckets.changed(), if !closed => {
                        if changed.is_err() {
                            // The owner of the set is gone: keep the last one.
                            closed = true;
                            continue;
                        }
                        let set = *buckets.borrow_and_update();
                        if set != current {
                            current = set;
                            inner = start(set);
                        }
                    }
                    item = inner.next() => {
                        let item = item?;
                        return Some((item, (buckets, inner, current, start, closed)));
                    }
                }
            }
        },
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::compact::ByParent;
    use super::*;
    use crate::rules::model::LabelSelectorRequirement;
    use crate::rules::model::SelectorOperator;
    use kube::runtime::reflector::store::Writer;

    #[test]
    fn builds_label_selector_strings() {
        let selector = LabelSelector {
            match_labels: [("tier".to_owned(), "web".to_owned())].into(),
            match_expressions: vec![
                LabelSelectorRequirement {
                    key: "env".into(),
                    operator: SelectorOperator::In,
                    values: vec!["a".into(), "b".into()],
                },
                LabelSelectorRequirement {
                    key: "legacy".into(),
                    operator: SelectorOperator::DoesNotExist,
                    values: vec![],
                },
            ],
        };
        assert_eq!(selector_string(&selector), "tier=web,env in (a,b),!legacy");
    }

    /// What a pass woken by the store's readiness reads of the index: the
    /// waker runs inside the store's `InitDone`, as a reconcile on another
    /// thread may.
    struct WokenReader {
        index: Arc<ByParent>,
        seen: Mutex<Option<Vec<super::compact::ChildName>>>,
    }

    impl futures::task::ArcWake for WokenReader {
        fn wake_by_ref(me: &Arc<Self>) {
            *crate::operator::lock(&me.seen) = Some(me.index.of("p1"));
        }
    }

    #[test]
    fn the_children_index_holds_the_first_list_when_the_store_wakes_its_readers() {
        let resource =
            kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let writer = Writer::<CompactObject>::new(resource.into());
        let store = writer.as_reader();
        let reader = Arc::new(WokenReader {
            index: Arc::new(ByParent::default()),
            seen: Mutex::new(None),
        });
        let mut ready = Box::pin(store.wait_until_ready());
        let waker = futures::task::waker(reader.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(ready.as_mut().poll(&mut cx).is_pending());

        let child = CompactObject::from_json(
            r#"{"metadata":{"name":"p-config","namespace":"a",
                "labels":{"trellis.dev/parent-uid":"p1"}}}"#,
        )
        .expect("decodes");
        let events = futures::stream::iter([
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(child)),
            Ok(watcher::Event::InitDone),
        ]);
        let index = reader.index.clone();
        let stream = observed_then_stored(events, writer, move |e: &watcher::Event<_>| {
            index.observe(e)
        });
        futures::executor::block_on(stream.for_each(|_| future::ready(())));

        assert!(ready.as_mut().poll(&mut cx).is_ready());
        assert_eq!(
            *crate::operator::lock(&reader.seen),
            Some(vec![(Some("a".to_owned()), "p-config".to_owned())]),
            "a pass woken by the store's readiness must find the listed child in the index"
        );
    }
}
