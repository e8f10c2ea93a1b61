//! Related objects read from spokes (`cluster:` on a `related:` entry): per
//! spoke, one watch per [`SpokeWatch`] the rules in force need — the kind,
//! a static selector's labels when every entry of the kind has one, and
//! the namespaces the entries may read in — decided as the hub's related
//! watches are ([`crate::related_watches::spoke_watch_specs`]). A change
//! there is broadcast ([`RelatedTouched`]); each rule reading from spokes
//! maps it through its own read index to the parents that read it.
//!
//! ```text
//!  rules in force ──spoke_watch_specs + namespaces──▶ Clusters.related (set)
//!  each spoke: one watch per SpokeWatch ──store──▶ Clusters::find_related (a pass's read)
//!                                       ──event──▶ RelatedTouched ──▶ rule's ReadIndex ──▶ parents
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::watcher;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Clusters;
use super::spoke::Spoke;
use crate::kinds::Gvk;
use crate::operator::lock;
use crate::operator::watches::decode::ParentObject;
use crate::operator::watches::discovery::{self, Resolved};
use crate::operator::watches::related::Touched;
use crate::operator::watches::{selector_string, trim, watch_stream};
use crate::plan::{ObjectKey, RelatedRead, RelatedTarget, Unreadable};
use crate::rules::CompiledRule;

/// One related watch every spoke keeps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpokeWatch {
    pub gvk: Gvk,
    /// A static selector: the watch lists only what it selects.
    pub labels: Option<String>,
    /// Where it lists (empty: every namespace).
    pub namespaces: Vec<String>,
}

/// A spoke's related object changed.
#[derive(Debug, Clone)]
pub struct RelatedTouched {
    pub cluster: String,
    pub touched: Touched,
}

/// The related watches `rules` need in spokes; `operator`: the operator's
/// namespaces (empty: all).
pub(super) fn spoke_watches<'r>(
    rules: impl IntoIterator<Item = &'r CompiledRule>,
    operator: &[String],
) -> BTreeSet<SpokeWatch> {
    let mut out = BTreeSet::new();
    for rule in rules {
        let Ok(own) = crate::operator::controller::effective_namespaces(rule, operator) else {
            continue;
        };
        for spec in crate::related_watches::spoke_watch_specs(rule) {
            out.insert(SpokeWatch {
                gvk: spec.gvk,
                labels: spec.labels,
                // An entry that may read elsewhere: wherever the operator looks.
                namespaces: if spec.anywhere {
                    operator.to_vec()
                } else {
                    own.clone()
                },
            });
        }
    }
    out
}

/// One related watch in one spoke.
pub(super) struct RelatedCache {
    watch: SpokeWatch,
    kind: Option<Resolved>,
    store: Option<Store<ParentObject>>,
    listed: bool,
    error: Option<String>,
    stop: CancellationToken,
}

/// Whether a related watch of `spoke` is still listing (not listed, no
/// error): its readers would be held back for a moment, and wait instead.
pub(super) fn listing(spoke: &Spoke) -> bool {
    lock(&spoke.related)
        .values()
        .any(|c| !c.listed && c.error.is_none())
}

/// Keeps one watch per [`SpokeWatch`] in `spoke`, following the set in force.
pub(super) async fn follow(spoke: Arc<Spoke>, clusters: Arc<Clusters>) {
    let mut wanted_rx = clusters.related.subscribe();
    loop {
        let wanted = wanted_rx.borrow_and_update().clone();
        {
            let mut caches = lock(&spoke.related);
            caches.retain(|w, cache| {
                let keep = wanted.contains(w);
                if !keep {
                    cache.stop.cancel();
                }
                keep
            });
            for w in &wanted {
                if caches.contains_key(w) {
                    continue;
                }
                let stop = spoke.stop.child_token();
                caches.insert(
                    w.clone(),
                    RelatedCache {
                        watch: w.clone(),
                        kind: None,
                        store: None,
                        listed: false,
                        error: None,
                        stop: stop.clone(),
                    },
                );
                tokio::spawn(run(spoke.clone(), clusters.clone(), w.clone(), stop));
            }
        }
        tokio::select! {
            _ = spoke.stop.cancelled() => return,
            changed = wanted_rx.changed() => if changed.is_err() { return },
        }
    }
}

/// Discovery of the kind in the spoke (retried until it answers), then its
/// watch, feeding the store; each change is broadcast.
async fn run(spoke: Arc<Spoke>, clusters: Arc<Clusters>, w: SpokeWatch, stop: CancellationToken) {
    let update = |change: &dyn Fn(&mut RelatedCache)| {
        if let Some(c) = lock(&spoke.related).get_mut(&w) {
            change(c);
        }
    };
    let kind = loop {
        match discovery::resolve(&spoke.client, &w.gvk).await {
            Ok(kind) => break kind,
            Err(why) if spoke.reachable() => {
                update(&|c| {
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
    let mut config = watcher::Config::default();
    if let Some(labels) = &w.labels {
        config = config.labels(labels);
    }
    let namespaces = if kind.namespaced {
        w.namespaces.clone()
    } else {
        Vec::new()
    };
    let mut trim = trim(&kind.resource);
    let stream = watch_stream(
        &spoke.client,
        &kind,
        &namespaces,
        config,
        move |o: &mut ParentObject| trim(&mut o.object),
    );
    let mut writer = Writer::new(kind.resource.clone());
    let store = writer.as_reader();
    update(&|c| {
        c.kind = Some(kind.clone());
        c.store = Some(store.clone());
        c.error = None;
    });
    let mut events = std::pin::pin!(stream);
    let mut listed = false;
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => event,
        };
        let event = match event {
            None => return,
            Some(Err(err)) => {
                warn!(cluster = %spoke.name, kind = %w.gvk, "related watch failed, retrying: {err}");
                if !listed {
                    let why = format!("cannot watch {} there: {err}", w.gvk);
                    update(&|c| c.error = Some(why.clone()));
                    clusters.bump();
                }
                continue;
            }
            Some(Ok(event)) => event,
        };
        // Stored first: a pass woken by the broadcast reads the new object.
        let old_labels = match &event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => store
                .get(&kube::runtime::reflector::ObjectRef::from_obj_with(
                    o,
                    kind.resource.clone(),
                ))
                .map(|old| old.object.labels()),
            _ => None,
        };
        writer.apply_watcher_event(&event);
        let touched = match &event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                let meta = &o.object.metadata;
                let mut labels = vec![o.object.labels()];
                if let Some(old) = old_labels.filter(|old| *old != labels[0]) {
                    labels.push(old);
                }
                Some(Touched {
                    group: w.gvk.group.clone(),
                    kind: w.gvk.kind.clone(),
                    namespace: meta.namespace.clone(),
                    name: meta.name.clone(),
                    labels,
                })
            }
            watcher::Event::InitDone => {
                update(&|c| {
                    c.listed = true;
                    c.error = None;
                });
                clusters.bump();
                // A relist may hide what went meanwhile: every reader looks.
                std::mem::replace(&mut listed, true).then(|| Touched {
                    group: w.gvk.group.clone(),
                    kind: w.gvk.kind.clone(),
                    namespace: None,
                    name: None,
                    labels: Vec::new(),
                })
            }
            _ => None,
        };
        if let Some(touched) = touched {
            let _ = clusters.related_touched.send(RelatedTouched {
                cluster: spoke.name.clone(),
                touched,
            });
        }
    }
}

impl Clusters {
    /// The objects of `gvk` in the spoke `cluster` that `read` covers, from
    /// that spoke's related watches; why not when they cannot tell (not
    /// registered, not listed yet, refused, outside their namespaces).
    pub fn find_related(
        &self,
        cluster: &str,
        gvk: &Gvk,
        read: &RelatedRead,
    ) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
        let unreachable = |message: String| Unreadable {
            reason: crate::clusters::UNREACHABLE,
            message,
        };
        let Some(spoke) = lock(&self.spokes).get(cluster).cloned() else {
            return Err(Unreadable {
                reason: crate::clusters::UNKNOWN,
                message: format!("cluster \"{cluster}\" is not registered"),
            });
        };
        let caches = lock(&spoke.related);
        let same_kind = |c: &&RelatedCache| c.watch.gvk == *gvk;
        let wanted = match &read.target {
            RelatedTarget::Selector(sel) => Some(selector_string(sel)),
            RelatedTarget::Name(_) => None,
        };
        let cache = caches
            .values()
            .filter(same_kind)
            .filter(|c| {
                read.namespace.as_ref().is_none_or(|ns| {
                    c.watch.namespaces.is_empty() || c.watch.namespaces.contains(ns)
                })
            })
            .find(|c| c.watch.labels.is_none() || c.watch.labels == wanted)
            .ok_or_else(|| {
                unreachable(format!(
                    "{gvk} is not watched in cluster \"{cluster}\" for this read yet"
                ))
            })?;
        if let Some(why) = &cache.error {
            return Err(unreachable(format!("cluster \"{cluster}\": {why}")));
        }
        let (Some(store), Some(kind), true) = (&cache.store, &cache.kind, cache.listed) else {
            return Err(unreachable(format!(
                "cluster \"{cluster}\": {gvk} is being listed"
            )));
        };
        let covers = |o: &ParentObject| {
            let meta = &o.object.metadata;
            let labels = o.object.labels();
            read.covers_with(
                meta.namespace.as_deref().filter(|_| kind.namespaced),
                meta.name.as_deref().unwrap_or_default(),
                |k| labels.get(k).map(String::as_str),
            )
        };
        let mut out = Vec::new();
        for o in store.state_filter(covers) {
            let value = o.to_value();
            if let Some(mut key) = ObjectKey::of(&value) {
                key.cluster = Some(cluster.to_owned());
                out.push((key, value));
            }
        }
        Ok(out)
    }
}

/// Every spoke's related caches, by watch.
pub(super) type RelatedCaches = std::sync::Mutex<BTreeMap<SpokeWatch, RelatedCache>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spokes_watch_related_kinds_in_the_namespaces_the_entries_read() {
        let rule = crate::rules::testing::rule_with_spec(
            "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  related:\n    - id: s\n      apiVersion: v1\n      kind: ConfigMap\n      cluster: spec.region\n      name: settings\n    - id: home\n      apiVersion: v1\n      kind: Secret\n      name: x\n  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: 'metadata: {name: a}'\n",
        );
        let ops = vec!["team-a".to_owned()];
        assert_eq!(
            spoke_watches([rule.as_ref()], &ops),
            BTreeSet::from([SpokeWatch {
                gvk: Gvk::new("v1", "ConfigMap"),
                labels: None,
                namespaces: ops.clone(),
            }]),
            "only the entry read in a spoke, in the namespaces the operator watches"
        );
    }
}
