//! What wakes a rule's parents besides their own events: a child's event
//! (mapped to its parent), the API server serving again after an outage,
//! a parent that changed while its watch listed again, under `--shards`, a
//! bucket becoming this replica's to write, and a child in another cluster
//! changing, or that cluster's state.

use std::sync::Arc;

use futures::{StreamExt, future};
use kube::Client;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;
use tracing::info;

use super::by_uid::ByUid;
use super::compact::CompactObject;
use super::decode::ParentObject;
use super::discovery::Resolved;
use crate::operator::context::RuleCtx;
use crate::operator::pass::own_writes::OwnWrites;
use crate::operator::retry::WatchBackoff;
use crate::shard::{BucketSet, bucket_of};

/// Maps a child event to its parent: the controller ownerReference when it
/// points at the parent kind, else the `trellis.dev/parent-uid` label
/// looked up in `by_uid` (kept only for a rule whose children may have
/// no such ownerReference). The event of a version a pass wrote maps to
/// nobody: that pass read it already (see [`OwnWrites`]).
pub(in crate::operator) fn parent_of(
    by_uid: Option<Arc<ByUid>>,
    parent: Resolved,
    own: Arc<OwnWrites>,
) -> impl Fn(CompactObject) -> Option<ObjectRef<ParentObject>> + Send + Sync + 'static {
    move |child: CompactObject| {
        let meta = &child.metadata;
        if own.is_own(meta.uid.as_deref(), meta.resource_version.as_deref()) {
            return None;
        }
        let owner = child.owner_references().iter().find(|r| {
            r.controller == Some(true)
                && r.kind == parent.gvk.kind
                && r.api_version == parent.gvk.api_version()
        });
        if let Some(owner) = owner {
            let r = ObjectRef::new_with(&owner.name, parent.resource.clone());
            return Some(match (parent.namespaced, child.namespace()) {
                (true, Some(ns)) => r.within(&ns),
                _ => r,
            });
        }
        let (namespace, name) = by_uid.as_ref()?.get(child.parent_uid()?)?;
        let r = ObjectRef::new_with(&name, parent.resource.clone());
        Some(match namespace {
            Some(ns) => r.within(&ns),
            None => r,
        })
    }
}

/// Under `--shards`: the parents of each bucket that becomes ready for a
/// pass here, writable and its parents and children listed (a bucket
/// gained in a handover, or listed after it opened).
pub(in crate::operator) fn opened_parents(
    ctx: Arc<RuleCtx>,
    writable: watch::Receiver<BucketSet>,
) -> impl futures::Stream<Item = ObjectRef<ParentObject>> + Send {
    let listed: Vec<_> = ctx
        .children
        .iter()
        .map(|c| c.listed.clone())
        .chain(std::iter::once(ctx.parents_listed.clone()))
        .collect();
    let changes = futures::stream::select_all(
        std::iter::once(changes_of(writable)).chain(listed.into_iter().map(changes_of)),
    );
    let mut ready = BucketSet::empty();
    changes.flat_map(move |()| {
        let shards = ctx.shared.shards.as_ref();
        let now = shards
            .map_or(BucketSet::empty(), |s| *s.writable().borrow())
            .intersection(&ctx.listed_buckets());
        let gained = now.minus(&ready);
        ready = now;
        let parents: Vec<ObjectRef<ParentObject>> = if gained.is_empty() {
            Vec::new()
        } else {
            ctx.parents
                .state()
                .iter()
                .filter(|p| {
                    p.object
                        .metadata
                        .uid
                        .as_deref()
                        .is_some_and(|uid| gained.contains(bucket_of(uid)))
                })
                .map(|p| ObjectRef::from_obj_with(p.as_ref(), ctx.kinds.parent.resource.clone()))
                .collect()
        };
        futures::stream::iter(parents)
    })
}

/// The parents a list after the first brings new or changed, woken once
/// the list is in the store. A pass reads its parent from the store, and
/// the store takes a list whole at its end: woken by the listed object
/// itself, a pass would read the parent as it was before the list (an
/// edit made while a watch switched buckets was lost so: the pass saw the
/// old spec, and once the list was in nothing woke the parent again).
/// So, once the store has been listed, a list's objects are kept from the
/// controller (`keep` says no), compared with the store's, and those new or
/// changed are handed to `woken` when the list is done. The first list
/// goes to the controller as it comes: it runs nothing before the store is
/// ready.
pub(in crate::operator) fn after_relists(
    store: kube::runtime::reflector::Store<ParentObject>,
    resource: super::decode::SharedResource,
    differs: impl Fn(&ParentObject, &ParentObject) -> bool + Send + 'static,
    woken: tokio::sync::mpsc::UnboundedSender<ObjectRef<ParentObject>>,
) -> impl FnMut(
    &Result<kube::runtime::watcher::Event<ParentObject>, kube::runtime::watcher::Error>,
) -> bool
+ Send
+ 'static {
    use kube::runtime::watcher::Event;
    let mut listed = false;
    let mut changed: Vec<ObjectRef<ParentObject>> = Vec::new();
    move |event| match event {
        Ok(Event::InitApply(p)) if listed => {
            let at = ObjectRef::from_obj_with(p, resource.clone());
            if store.get(&at).is_none_or(|old| differs(&old, p)) {
                changed.push(at);
            }
            false
        }
        Ok(Event::InitDone) => {
            for at in changed.drain(..) {
                let _ = woken.send(at);
            }
            changed.shrink_to_fit();
            listed = true;
            true
        }
        _ => true,
    }
}

/// Yields once at once, then on every change of `rx`.
fn changes_of<T: Send + Sync + 'static>(
    rx: watch::Receiver<T>,
) -> futures::stream::BoxStream<'static, ()> {
    let later = futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    });
    futures::stream::once(future::ready(()))
        .chain(later)
        .boxed()
}

/// Parents whose pass failed while the API server could not serve,
/// handed back with their holds lifted as soon as it serves again (see
/// [`Outage`](crate::operator::retry::Outage)): a watch that resumes after the outage brings them nothing.
pub(in crate::operator) fn recovered(
    ctx: Arc<RuleCtx>,
) -> impl futures::Stream<Item = ObjectRef<ParentObject>> + Send {
    futures::stream::unfold(ctx, |ctx| async move {
        let client = ctx.shared.client.clone();
        let failed = ctx
            .outage
            .recovered(WatchBackoff::default, || serving(client.clone()))
            .await;
        info!(rule = %ctx.rule().name, parents = failed.len(), "the API server serves again: retrying the parents that failed meanwhile");
        for (key, _) in &failed {
            ctx.failures.release(key);
        }
        ctx.report_backoff();
        let parents: Vec<_> = failed.into_iter().map(|(_, at)| at).collect();
        Some((futures::stream::iter(parents), ctx))
    })
    .flatten()
}

/// Whether the API server serves: `/readyz` answers (it checks etcd). Any
/// other answer that is not the server's failure (a 403 where `/readyz` is
/// not granted) counts as serving too: it was reached.
async fn serving(client: Client) -> bool {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    match client.request_text(request).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) => status.code < 500 && status.code != 429,
        Err(_) => false,
    }
}

/// The parents whose children in a spoke changed, by the parent uid the
/// objects' label names, looked up in `by_uid` (kept for every rule with
/// spoke children: a uid of another rule's parent is not found there).
pub(in crate::operator) fn spoke_children(
    ctx: Arc<RuleCtx>,
    by_uid: Option<Arc<ByUid>>,
) -> impl futures::Stream<Item = ObjectRef<ParentObject>> + Send {
    let touched = ctx.shared.clusters.touched();
    let resource = ctx.kinds.parent.resource.clone();
    let clusters = ctx.shared.clusters.clone();
    futures::stream::unfold(touched, move |mut touched| {
        let (by_uid, resource, clusters) = (by_uid.clone(), resource.clone(), clusters.clone());
        async move {
            loop {
                let t = match touched.recv().await {
                    Ok(t) => t,
                    // Missed events: every parent's pass reads the caches
                    // as they are, so waking them all loses nothing.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        clusters.bump();
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                };
                let Some((namespace, name)) = by_uid.as_ref().and_then(|i| i.get(&t.uid)) else {
                    continue;
                };
                let at = ObjectRef::new_with(&name, resource.clone());
                let at = match namespace {
                    Some(ns) => at.within(&ns),
                    None => at,
                };
                return Some((at, touched));
            }
        }
    })
}

/// Once per change of the spokes (registered, gone, answering or not,
/// listed), for a rule that places children in spokes.
pub(in crate::operator) fn spokes_changed(
    ctx: Arc<RuleCtx>,
) -> impl futures::Stream<Item = ()> + Send {
    let changed = ctx.shared.clusters.changed();
    futures::stream::unfold((changed, ctx), |(mut changed, ctx)| async move {
        loop {
            changed.changed().await.ok()?;
            if crate::operator::clusters::reads_spokes(&ctx.rule()) {
                return Some(((), (changed, ctx)));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::WatchStreamExt;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    fn parent(name: &str, v: &str) -> ParentObject {
        ParentObject::from_json(&format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"a","uid":"{name}"}},"spec":{{"v":"{v}"}}}}"#
        ))
        .expect("decodes")
    }

    #[test]
    fn a_relist_wakes_its_new_and_changed_parents_once_the_store_holds_them() {
        let resource: super::super::decode::SharedResource =
            kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&())
                .into();
        let writer = Writer::<ParentObject>::new(resource.clone());
        let store = writer.as_reader();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut keep = after_relists(
            store.clone(),
            resource,
            |old, new| old.outside_status_text() != new.outside_status_text(),
            tx,
        );
        let list = |items: Vec<ParentObject>| {
            std::iter::once(Ok(Event::Init))
                .chain(items.into_iter().map(|p| Ok(Event::InitApply(p))))
                .chain(std::iter::once(Ok(Event::InitDone)))
                .collect::<Vec<_>>()
        };
        let mut events = list(vec![parent("p1", "one"), parent("p2", "one")]);
        events.extend(list(vec![
            parent("p1", "one"),
            parent("p2", "two"),
            parent("p3", "one"),
        ]));
        let kept: Vec<String> = futures::executor::block_on(
            futures::stream::iter(events)
                .reflect(writer)
                .filter(|e| future::ready(keep(e)))
                .filter_map(|e| {
                    future::ready(match e {
                        Ok(Event::InitApply(p)) => p.object.metadata.name.clone(),
                        Ok(Event::InitDone) => Some("done".to_owned()),
                        _ => None,
                    })
                })
                .collect(),
        );
        assert_eq!(
            kept,
            ["p1", "p2", "done", "done"],
            "the first list goes to the controller, the second is held back"
        );
        let mut woken = Vec::new();
        while let Ok(at) = rx.try_recv() {
            woken.push(at.name);
        }
        assert_eq!(woken, ["p2", "p3"], "changed or new, not the unchanged p1");
        assert_eq!(store.state().len(), 3);
    }
}
