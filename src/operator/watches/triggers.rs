//! What wakes a rule's parents besides their own events: a child's event
//! (mapped to its parent), the API server serving again after an outage,
//! and, under `--shards`, a bucket becoming this replica's to write.

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
use crate::operator::retry::WatchBackoff;
use crate::shard::{BucketSet, bucket_of};

/// Maps a child event to its parent: the controller ownerReference when it
/// points at the parent kind, else the `trellis.dev/parent-uid` label
/// looked up in `by_uid` (kept only for a rule whose children may have
/// no such ownerReference).
pub(in crate::operator) fn parent_of(
    by_uid: Option<Arc<ByUid>>,
    parent: Resolved,
) -> impl Fn(CompactObject) -> Option<ObjectRef<ParentObject>> + Send + Sync + 'static {
    move |child: CompactObject| {
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
