//! What every rule's controller shares: the client, the permits, the
//! gate and shards, the rule set in force, and each rule's state as
//! `/status` and the gauges show it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::{Semaphore, watch};

use super::leadership::{leader, shards};
use super::pass::summary;
use super::{ReloadStatus, RuleState, clusters, crds, identity, lock, watches};
use crate::render::Limits;
use crate::rules::RuleSet;

/// What every rule's controller shares.
pub struct Shared {
    pub client: Client,
    pub recorder: summary::Publisher,
    pub namespaces: Vec<String>,
    /// Bounds reconciles in flight across all rules (FIFO, so fair).
    pub permits: Semaphore,
    /// Bumped whenever a CRD changes: waiting rules retry discovery.
    pub crd_epoch: watch::Receiver<u64>,
    /// What the last reload did, for logs, metrics and `/status`.
    pub reload: Arc<std::sync::Mutex<ReloadStatus>>,
    /// Each rule's state, for `/status`.
    pub rule_states: Arc<std::sync::Mutex<RuleStates>>,
    pub metrics: Arc<crate::telemetry::Metrics>,
    /// Whether this replica may write (always, without leader election);
    /// under `--shards`, whether it does the leader's cluster-wide duties.
    pub gate: leader::Gate,
    /// `--shards`: the buckets whose parents this replica writes.
    pub shards: Option<Arc<shards::Shards>>,
    /// The rule set in force: the CRD manager (`--manage-crds`) and the
    /// conversion webhook follow it.
    pub in_force: watch::Sender<Option<Arc<RuleSet>>>,
    /// Each rule's storage migration (`rules.<name>.migration`).
    pub migrations: crds::migration::Progress,
    /// The operator's own namespace: revision ConfigMaps, rules' accounts.
    pub operator_namespace: String,
    /// The clients rules with `serviceAccountName` write their children with.
    pub identities: identity::Identities,
    /// How often a running rule's account is checked again.
    pub account_recheck: Duration,
    /// Each rule's rollout as `/status` shows it (`rules.<name>.rollout`).
    pub rollouts: Arc<std::sync::Mutex<BTreeMap<String, serde_json::Value>>>,
    /// Render limits, for versions rebuilt from their ConfigMaps.
    pub limits: Limits,
    /// The spokes children may be placed in (`cluster:`).
    pub clusters: Arc<clusters::Clusters>,
    /// Each running rule's parent cache, counted for `/status` and
    /// `trellis_parents_cached` when asked.
    pub parent_caches: ParentCaches,
}

/// Rule → its parent cache.
pub type ParentCaches = Arc<
    std::sync::Mutex<
        BTreeMap<String, kube::runtime::reflector::Store<watches::decode::ParentObject>>,
    >,
>;

/// Rule → `{full, stub}`: the parents each rule's cache holds. Every parent
/// is held in full; under `--shards` only this replica's buckets' are
/// listed at all (a rule with `rollout:` aside), so none is a stub.
pub(super) fn parents_cached(
    caches: &ParentCaches,
    metrics: &crate::telemetry::Metrics,
) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for (rule, store) in lock(caches).iter() {
        let full = store.state().len() as i64;
        for (form, n) in [("full", full), ("stub", 0)] {
            metrics
                .parents_cached
                .get_or_create(&crate::telemetry::FormLabel {
                    rule: rule.clone(),
                    form: form.to_owned(),
                })
                .set(n);
        }
        out.insert(rule.clone(), serde_json::json!({"full": full, "stub": 0}));
    }
    out
}

impl Shared {
    /// Whether this replica may write for the parent with `parent_uid` now:
    /// the leader, or under `--shards` the writer of the parent's bucket.
    pub fn check_parent_write(&self, parent_uid: &str) -> Result<(), leader::NotLeader> {
        match &self.shards {
            None => self.gate.check(),
            Some(shards) if shards.may_write(parent_uid) => Ok(()),
            Some(_) => Err(leader::NotLeader),
        }
    }

    /// Puts a rule set in force for the CRD manager (`--manage-crds`) and
    /// the conversion webhook.
    pub fn put_in_force(&self, set: &RuleSet) {
        self.in_force.send_replace(Some(Arc::new(set.clone())));
    }

    /// Records the state a rule's controller reports (and the running-rules
    /// and rule-state gauges); a rule held back as breaking shows that instead.
    pub fn set_rule_state(&self, rule: &str, state: Option<RuleState>) {
        let mut states = lock(&self.rule_states);
        match state {
            Some(s) => states.reported.insert(rule.to_owned(), s),
            None => states.reported.remove(rule),
        };
        self.publish_state(&mut states, rule);
    }

    /// Records the rules a reload held back because their CRD change is
    /// breaking ([`crds::hold`]); every other rule is no longer held.
    pub fn set_held(&self, held: crds::hold::HeldRules) {
        let mut states = lock(&self.rule_states);
        let before = std::mem::replace(&mut states.held, held);
        let touched: std::collections::BTreeSet<String> = before
            .into_keys()
            .chain(states.held.keys().cloned())
            .collect();
        for rule in touched {
            self.publish_state(&mut states, &rule);
        }
    }

    fn publish_state(&self, states: &mut RuleStates, rule: &str) {
        let label = |s: &RuleState| crate::telemetry::RuleStateLabel {
            rule: rule.to_owned(),
            state: s.label().to_owned(),
        };
        let shown = match states.held.get(rule) {
            Some(changes) => Some(RuleState::Breaking(changes.clone())),
            None => states.reported.get(rule).cloned(),
        };
        let previous = match shown {
            Some(s) => {
                self.metrics.rule_state.get_or_create(&label(&s)).set(1);
                states
                    .shown
                    .insert(rule.to_owned(), s.clone())
                    .filter(|p| p.label() != s.label())
            }
            None => states.shown.remove(rule),
        };
        if let Some(p) = previous {
            self.metrics.rule_state.remove(&label(&p));
        }
        let running = states
            .shown
            .values()
            .filter(|s| **s == RuleState::Running)
            .count();
        self.metrics.rules_running.set(running as i64);
    }
}

/// Each rule's state: what its controller reports, the rules held back as
/// breaking, and what `/status` and the gauges show of both.
#[derive(Default)]
pub struct RuleStates {
    reported: BTreeMap<String, RuleState>,
    held: crds::hold::HeldRules,
    pub shown: BTreeMap<String, RuleState>,
}
