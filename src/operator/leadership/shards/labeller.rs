//! The bucket label on parents: how a replica lists only its own parents.
//!
//! ```text
//!  leader: watch (metadata only) of the rule's parents without trellis.dev/bucket ─┐
//!  any replica: a parent in its watch whose label is not its uid's bucket ─────────┤
//!                                                                                  ▼
//!                  merge patch of that one label (manager trellis-bucket, uid precondition)
//! ```
//!
//! A replica's parent watch selects `trellis.dev/bucket in (<its buckets>)`,
//! so a parent without the label is nobody's until it is labelled: the
//! leader labels it (one write per parent, once: at the first start of a
//! ring over existing parents, then on each new parent), and its bucket's
//! owner then sees it arrive like a new parent. A copied manifest may carry
//! another object's label: whoever selects the parent by that label
//! rewrites it. The value is a function of the uid, so two writers (a
//! leader change, a bucket moving) write the same value.
//!
//! A merge patch, not an apply: an apply by this manager of the label alone
//! is what it would be, but an apply of an object that has just been
//! deleted creates it, where a patch finds nothing (404). The uid in the
//! patch is a precondition: a parent deleted and made again under the same
//! name is left to the watch to see afresh.

use std::collections::BTreeSet;

use futures::StreamExt;
use kube::api::{DynamicObject, ObjectMeta, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::operator::leadership::leader::Gate;
use crate::operator::retry::WatchBackoff;
use crate::operator::watches::discovery::Resolved;
use crate::shard::{LABEL_BUCKET, bucket_of};

/// The field manager of the bucket label, apart from the rules' own.
pub const LABEL_MANAGER: &str = "trellis-bucket";

/// How many label writes are in flight at once.
const IN_FLIGHT: usize = 16;

/// How long a label write the API server could not take waits to be sent again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// A parent whose label is missing or wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToLabel {
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
}

pub type Sender = UnboundedSender<ToLabel>;

/// The parent, when its bucket label is not its uid's bucket (or missing).
pub fn mislabelled(meta: &ObjectMeta) -> Option<ToLabel> {
    let uid = meta.uid.as_deref()?;
    let want = bucket_of(uid).0.to_string();
    let has = meta.labels.as_ref().and_then(|l| l.get(LABEL_BUCKET));
    if has == Some(&want) || meta.deletion_timestamp.is_some() {
        return None;
    }
    Some(ToLabel {
        namespace: meta.namespace.clone(),
        name: meta.name.clone()?,
        uid: uid.to_owned(),
    })
}

/// Where the rule's parents are and which the rule selects.
pub struct Parents {
    pub client: kube::Client,
    pub kind: Resolved,
    /// Empty: all.
    pub namespaces: Vec<String>,
    /// The rule's `parent.selector`, as a label selector string.
    pub selector: Option<String>,
    pub gate: Gate,
}

/// Runs until `stop`: labels every parent it is handed on `found`, and,
/// while this replica leads, every parent of the rule without the label.
pub async fn run(
    parents: Parents,
    found: Sender,
    mut handed: UnboundedReceiver<ToLabel>,
    stop: CancellationToken,
) {
    let unlabelled = tokio::spawn(watch_while_leading(
        parents.client.clone(),
        parents.kind.clone(),
        parents.namespaces.clone(),
        parents.selector.clone(),
        parents.gate.clone(),
        found.clone(),
    ));
    // A parent handed over again while its write is queued or in flight
    // (the leader's watch lists again on each new term, and a relist
    // finds the parents not labelled yet) is written once.
    let queued = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::<String>::new()));
    let incoming = futures::stream::poll_fn(move |cx| handed.poll_recv(cx)).filter({
        let queued = queued.clone();
        move |parent| std::future::ready(crate::operator::lock(&queued).insert(parent.uid.clone()))
    });
    let writes = incoming
        .map(|parent| {
            let queued = queued.clone();
            let (client, kind) = (&parents.client, &parents.kind);
            async move {
                let uid = parent.uid.clone();
                let again = label(client, kind, parent).await;
                crate::operator::lock(&queued).remove(&uid);
                again
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|again| {
            // The API server could not take it now: handed back later, as
            // nothing else would bring the parent back before a relist.
            if let Some(parent) = again {
                let found = found.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY).await;
                    let _ = found.send(parent);
                });
            }
            async {}
        });
    tokio::select! {
        () = writes => {}
        () = stop.cancelled() => {}
    }
    unlabelled.abort();
}

/// While the gate is open (this replica leads): watches the parents
/// without the label (metadata only, kept nowhere) and hands each on.
async fn watch_while_leading(
    client: kube::Client,
    kind: Resolved,
    namespaces: Vec<String>,
    selector: Option<String>,
    gate: Gate,
    found: Sender,
) {
    let mut leading = gate.leading();
    let without = match selector.as_deref() {
        Some(own) if !own.is_empty() => format!("{own},!{LABEL_BUCKET}"),
        _ => format!("!{LABEL_BUCKET}"),
    };
    let api: kube::Api<PartialObjectMeta<DynamicObject>> = match namespaces.as_slice() {
        [one] => kind.api(client, Some(one)),
        _ => kind.api(client, None),
    };
    let keep: Option<BTreeSet<String>> =
        (kind.namespaced && namespaces.len() > 1).then(|| namespaces.iter().cloned().collect());
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        debug!(parent = %kind.gvk, "leading: labelling the parents without a bucket");
        let mut events = watcher(api.clone(), watcher::Config::default().labels(&without))
            .backoff(WatchBackoff::default())
            .boxed();
        loop {
            tokio::select! {
                changed = leading.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if !*leading.borrow_and_update() {
                        break;
                    }
                }
                event = events.next() => {
                    let parent = match event {
                        Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) => p,
                        Some(Ok(_)) => continue,
                        Some(Err(err)) => {
                            warn!(parent = %kind.gvk, "watch of unlabelled parents failed, retrying: {err}");
                            continue;
                        }
                        None => return,
                    };
                    let inside = keep.as_ref().is_none_or(|keep| {
                        parent.metadata.namespace.as_ref().is_some_and(|ns| keep.contains(ns))
                    });
                    if let Some(to) = mislabelled(&parent.metadata).filter(|_| inside)
                        && found.send(to).is_err()
                    {
                        return;
                    }
                }
            }
        }
    }
}

/// One label write; the parent back when it is worth sending again (the
/// API server was unavailable or busy). Any other refusal is logged: the
/// watch that found the parent finds it again after its next relist, and a
/// new leader lists them all.
async fn label(client: &kube::Client, kind: &Resolved, parent: ToLabel) -> Option<ToLabel> {
    let api: kube::Api<DynamicObject> = kind.api(client.clone(), parent.namespace.as_deref());
    let bucket = bucket_of(&parent.uid).0.to_string();
    let patch = serde_json::json!({
        "metadata": {"uid": parent.uid, "labels": {LABEL_BUCKET: bucket}}
    });
    let params = PatchParams {
        field_manager: Some(LABEL_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let result = api
        .patch(&parent.name, &params, &Patch::Merge(&patch))
        .await;
    match result {
        Ok(_) => debug!(parent = %parent.name, bucket = %bucket, "labelled with its bucket"),
        // Gone, or made again under the same name: nothing to label here.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(kube::Error::Api(e)) if e.code < 500 && e.code != 429 => {
            warn!(parent = %parent.name, "could not label the parent with its bucket (no pass runs for it until it has one): {}", e.message)
        }
        Err(err) => {
            info!(parent = %parent.name, "could not label the parent with its bucket, trying again in {RETRY:?}: {err}");
            return Some(parent);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(uid: &str, label: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some("p".into()),
            namespace: Some("a".into()),
            uid: Some(uid.into()),
            labels: label.map(|l| [(LABEL_BUCKET.to_owned(), l.to_owned())].into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_parent_needs_its_uids_bucket_and_nothing_else() {
        let uid = "0b5e3c1a-1111-2222-3333-444455556666";
        let right = bucket_of(uid).0.to_string();
        let wrong = ((bucket_of(uid).0 as u16 + 1) % 256).to_string();
        assert_eq!(mislabelled(&meta(uid, Some(&right))), None);
        let want = Some(ToLabel {
            namespace: Some("a".into()),
            name: "p".into(),
            uid: uid.into(),
        });
        assert_eq!(mislabelled(&meta(uid, None)), want, "unlabelled");
        assert_eq!(mislabelled(&meta(uid, Some(&wrong))), want, "copied");
    }
}
