//! Children in other clusters: the spokes this hub keeps children in
//! (`cluster:` on a child), registered by Secrets in the operator's
//! namespace.
//!
//! ```text
//!  Secret trellis.dev/cluster=<name> ──secrets──▶ Clusters { name → Spoke(client) }
//!  rule set in force ──kinds placed in spokes──▶ each spoke: one watch per kind,
//!                                                selected by trellis.dev/hub=<--cluster-name>
//!  spoke probe (/readyz), a kind listed ──▶ `changed` ──▶ every parent of the rules with spoke children
//!  spoke watch event ──▶ (rule, parent uid) ──▶ that parent's pass
//! ```
//!
//! The rest of the operator asks this room four things: what the planner
//! may know of the spokes ([`Clusters::view`]), a parent's objects in them
//! ([`Clusters::observed`]), the `Api` to write one of them with
//! ([`Clusters::api`]), and what `/status` shows. The decisions (what is
//! held back, what is pruned) are the core's `clusters` and `plan`.

mod cleanup;
mod related;
mod secrets;
mod spoke;

pub use related::{RelatedTouched, SpokeWatch};
pub use secrets::{Refused, client_of};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::clusters::Reach;
use crate::kinds::Gvk;
use crate::operator::lock;
use crate::plan::ObjectKey;
use crate::rules::{CompiledRule, RuleSet};
use crate::shard::BucketSet;
use spoke::{Readiness, Spoke};

/// A spoke object changed: the parent uid its label names (uids are
/// unique: each rule looks it up among its own parents).
#[derive(Debug, Clone)]
pub struct Touched {
    pub uid: String,
}

/// The spokes of this hub.
pub struct Clusters {
    /// `--cluster-name`: the `trellis.dev/hub` label of this hub's objects.
    pub hub: String,
    spokes: std::sync::Mutex<BTreeMap<String, Arc<Spoke>>>,
    /// The child kinds rules place in spokes: what every spoke watches.
    kinds: watch::Sender<BTreeSet<Gvk>>,
    /// Bumped when a spoke comes or goes, answers or stops answering, or
    /// has listed a kind: rules with spoke children run every parent again.
    changed: watch::Sender<u64>,
    /// True once the Secrets have been listed: before, an unregistered
    /// name may just not be read yet.
    listed: watch::Sender<bool>,
    /// Set when spokes are needed though no rule places anything there: a
    /// recorded cleanup of a rule removed before a restart.
    wanted: watch::Sender<bool>,
    touched: broadcast::Sender<Touched>,
    /// The related watches rules read from spokes: what every spoke keeps.
    related: watch::Sender<BTreeSet<SpokeWatch>>,
    related_touched: broadcast::Sender<RelatedTouched>,
    /// The operator's namespaces (empty: all): where related watches look.
    namespaces: Vec<String>,
    metrics: Arc<crate::telemetry::Metrics>,
    /// Under `--shards`, this replica's buckets: spoke watches select only
    /// their children, as the hub's child watches do.
    owned: Option<watch::Receiver<BucketSet>>,
}

impl Clusters {
    pub fn new(hub: String, metrics: Arc<crate::telemetry::Metrics>) -> Arc<Clusters> {
        Clusters::watching(hub, Vec::new(), metrics, None)
    }

    /// [`Clusters::new`] for an operator watching `namespaces` (empty:
    /// all): where spokes' related watches look; `owned`: this replica's
    /// buckets under `--shards` (spoke watches select only their children).
    pub fn watching(
        hub: String,
        namespaces: Vec<String>,
        metrics: Arc<crate::telemetry::Metrics>,
        owned: Option<watch::Receiver<BucketSet>>,
    ) -> Arc<Clusters> {
        Arc::new(Clusters {
            hub,
            spokes: std::sync::Mutex::default(),
            kinds: watch::Sender::new(BTreeSet::new()),
            changed: watch::Sender::new(0),
            listed: watch::Sender::new(false),
            wanted: watch::Sender::new(false),
            touched: broadcast::Sender::new(4096),
            related: watch::Sender::new(BTreeSet::new()),
            related_touched: broadcast::Sender::new(4096),
            namespaces,
            metrics,
            owned,
        })
    }

    /// [`Clusters::new`], following the rule set in force
    /// ([`Clusters::follow_rules`]; `secrets`: the client and namespace of
    /// the Secrets registering spokes; `owned`: this replica's buckets
    /// under `--shards`). `namespaces`: the operator's (empty: all).
    pub fn start(
        hub: String,
        namespaces: Vec<String>,
        metrics: Arc<crate::telemetry::Metrics>,
        secrets: (kube::Client, String),
        owned: Option<watch::Receiver<BucketSet>>,
        in_force: watch::Receiver<Option<Arc<RuleSet>>>,
        shutdown: CancellationToken,
    ) -> Arc<Clusters> {
        let clusters = Clusters::watching(hub, namespaces, metrics, owned);
        clusters.follow_rules(secrets.0, secrets.1, in_force, shutdown);
        clusters
    }

    /// Follows the rule set in force: the kinds its rules place in spokes
    /// are the kinds every spoke watches. The Secrets registering spokes
    /// (in `namespace`, read with `client`) are watched from the first
    /// rule set that places a child in a spoke: an operator whose rules
    /// never do needs no access to Secrets.
    pub fn follow_rules(
        self: &Arc<Clusters>,
        client: kube::Client,
        namespace: String,
        mut in_force: watch::Receiver<Option<Arc<RuleSet>>>,
        shutdown: CancellationToken,
    ) {
        let clusters = self.clone();
        let mut wanted = self.wanted.subscribe();
        tokio::spawn(async move {
            let mut secrets = Some((client, namespace));
            loop {
                let wanted_now = *wanted.borrow_and_update();
                let (kinds, related) = in_force
                    .borrow_and_update()
                    .as_ref()
                    .map(|set| {
                        let rules = || set.rules.iter().map(|r| r.as_ref());
                        (
                            placed_kinds(rules()),
                            related::spoke_watches(rules(), &clusters.namespaces),
                        )
                    })
                    .unwrap_or_default();
                if (!kinds.is_empty() || !related.is_empty() || wanted_now)
                    && let Some((client, namespace)) = secrets.take()
                {
                    tokio::spawn(secrets::run(
                        client,
                        namespace,
                        clusters.clone(),
                        shutdown.clone(),
                    ));
                }
                clusters.kinds.send_if_modified(|now| {
                    let changed = *now != kinds;
                    *now = kinds;
                    changed
                });
                clusters.related.send_if_modified(|now| {
                    let changed = *now != related;
                    *now = related;
                    changed
                });
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    changed = in_force.changed() => if changed.is_err() { return },
                    _ = wanted.changed() => {}
                }
            }
        });
    }

    /// What the planner may know of the spokes, for a rule placing
    /// children there.
    pub fn view(&self, rule: &CompiledRule) -> crate::clusters::Clusters {
        let kinds = placed_kinds([rule]);
        let spokes = lock(&self.spokes)
            .iter()
            .map(|(name, spoke)| {
                let reach = match spoke.readiness(&kinds, self.owned.as_ref()) {
                    Readiness::Ready => Reach::Ready,
                    Readiness::Listing => Reach::Unreachable("its objects are being listed".into()),
                    Readiness::Unreachable(why) => Reach::Unreachable(why),
                };
                (name.clone(), reach)
            })
            .collect();
        crate::clusters::Clusters {
            hub: self.hub.clone(),
            spokes: Some(spokes),
            unread: None,
        }
    }

    /// Whether a pass of `rule` must wait: the Secrets are not listed yet,
    /// or a spoke that answers is still listing the rule's kinds (planning
    /// then would report it unreachable, or re-create what exists).
    /// [`Clusters::changed`] fires when that ends.
    pub fn settling(&self, rule: &CompiledRule) -> bool {
        if !reads_spokes(rule) {
            return false;
        }
        if !*self.listed.borrow() {
            return true;
        }
        let kinds = placed_kinds([rule]);
        let reads = rule.related.iter().any(|r| r.cluster.is_some());
        lock(&self.spokes).values().any(|s| {
            matches!(s.readiness(&kinds, self.owned.as_ref()), Readiness::Listing)
                || (reads && s.reachable() && related::listing(s))
        })
    }

    /// The spokes (by name) where a kind `rule` places there was never
    /// listed: what they hold of the rule is unknown.
    pub fn never_listed(&self, rule: &CompiledRule) -> Vec<String> {
        let kinds = placed_kinds([rule]);
        if kinds.is_empty() {
            return Vec::new();
        }
        lock(&self.spokes)
            .iter()
            .filter(|(_, s)| !s.ever_listed(&kinds))
            .map(|(name, _)| format!("cluster \"{name}\""))
            .collect()
    }

    /// The objects of `rule` for the parent `uid` in every spoke, placed
    /// by the `trellis.dev/cluster` annotation.
    pub fn observed(&self, rule: &str, uid: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for spoke in lock(&self.spokes).values() {
            spoke.observed(rule, uid, &mut out);
        }
        out
    }

    /// The `Api` of a spoke object (`key.cluster` set), with the spoke's
    /// credentials; `Err` says why there is none.
    pub fn api(&self, key: &ObjectKey) -> Result<Api<DynamicObject>, String> {
        self.api_as(key, None)
    }

    /// [`Clusters::api`], sent as `user` (a rule's account,
    /// `system:serviceaccount:<operator namespace>:<name>`) when given.
    pub fn api_as(
        &self,
        key: &ObjectKey,
        user: Option<&str>,
    ) -> Result<Api<DynamicObject>, String> {
        let name = key.cluster.as_deref().unwrap_or(crate::clusters::LOCAL);
        let Some(spoke) = lock(&self.spokes).get(name).cloned() else {
            return Err(format!("cluster \"{name}\" is not registered"));
        };
        let Some(kind) = spoke.kind(&key.group, &key.kind) else {
            return Err(format!(
                "{key}: kind not served (or not discovered yet) in cluster \"{name}\""
            ));
        };
        Ok(kind.api(spoke.client_as(user), key.namespace.as_deref()))
    }

    /// Whether `gvk` is namespaced, as the first spoke whose discovery
    /// resolved it says (`None`: none has): the scope of a kind only
    /// spokes serve.
    pub fn namespaced(&self, gvk: &Gvk) -> Option<bool> {
        lock(&self.spokes)
            .values()
            .find_map(|s| s.kind(&gvk.group, &gvk.kind).map(|k| k.namespaced))
    }

    /// Fires on every change that may let a held-back pass go on.
    /// Registers the spokes (watches their Secrets) whatever the rules,
    /// and returns once the Secrets have been listed: every spoke
    /// registered then is known.
    pub async fn spokes_listed(&self) {
        self.wanted.send_replace(true);
        let _ = self.listed.subscribe().wait_for(|l| *l).await;
    }

    pub fn changed(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Spoke objects changing, by rule and parent uid.
    pub fn touched(&self) -> broadcast::Receiver<Touched> {
        self.touched.subscribe()
    }

    /// Related objects changing in spokes.
    pub fn related_touched(&self) -> broadcast::Receiver<RelatedTouched> {
        self.related_touched.subscribe()
    }

    /// `/status` → `clusters`.
    pub fn status_json(&self) -> Value {
        let spokes = lock(&self.spokes);
        Value::Object(
            spokes
                .iter()
                .map(|(name, s)| (name.clone(), s.status_json()))
                .collect(),
        )
    }

    /// Wakes every parent of the rules with spoke children: something
    /// changed, or spoke events were missed.
    pub fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn report(&self, name: &str, reachable: bool) {
        let label = crate::telemetry::ClusterLabel {
            cluster: name.to_owned(),
        };
        self.metrics
            .cluster_reachable
            .get_or_create(&label)
            .set(i64::from(reachable));
    }

    fn forget_metric(&self, name: &str) {
        let label = crate::telemetry::ClusterLabel {
            cluster: name.to_owned(),
        };
        self.metrics.cluster_reachable.remove(&label);
    }

    fn touched_uid(&self, uid: &str) {
        let _ = self.touched.send(Touched {
            uid: uid.to_owned(),
        });
    }
}

/// Whether `rule` places children in spokes or reads related objects
/// there: its passes then depend on the spokes' state.
pub fn reads_spokes(rule: &CompiledRule) -> bool {
    rule.children.iter().any(|c| c.cluster.is_some())
        || rule.related.iter().any(|r| r.cluster.is_some())
}

/// The child kinds `rules` place in spokes (those with `cluster:`).
pub(in crate::operator) fn placed_kinds<'r>(
    rules: impl IntoIterator<Item = &'r CompiledRule>,
) -> BTreeSet<Gvk> {
    rules
        .into_iter()
        .flat_map(|r| r.children.iter())
        .filter(|c| c.cluster.is_some())
        .map(|c| c.gvk.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(children: &str) -> Arc<CompiledRule> {
        crate::rules::testing::rule_with_spec(&format!(
            "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n  children:\n{children}"
        ))
    }

    const CM: &str = "    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: 'metadata: {name: a}'\n";
    const REMOTE: &str = "    - id: remote\n      apiVersion: apps/v1\n      kind: Deployment\n      cluster: spec.region\n      template: 'metadata: {name: a}'\n";

    #[test]
    fn spokes_watch_only_the_kinds_rules_place_there() {
        let local = rule(CM);
        assert!(placed_kinds([local.as_ref()]).is_empty());
        let both = rule(&format!("{CM}{REMOTE}"));
        assert_eq!(
            placed_kinds([local.as_ref(), both.as_ref()]),
            BTreeSet::from([Gvk::new("apps/v1", "Deployment")])
        );
    }
}
