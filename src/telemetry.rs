//! Metrics (Prometheus text format) and the HTTP endpoints of `trellis run`:
//! `/metrics`, `/healthz`, `/readyz` and `/status` (rule states and the last
//! reload's outcome, as JSON — where a rejected rule change explains itself;
//! and the leader election's state).
//!
//! A leaf: it knows nothing of the operator. It defines what it reports
//! ([`Snapshot`]: rule states, the last reload, the election) and the
//! operator hands it a function that takes one.
//!
//! This file holds the metrics; `endpoints.rs` what the endpoints show
//! (the [`Snapshot`]) and the server.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing::warn;

mod endpoints;

pub use endpoints::{LeaderStatus, Observability, ReloadStatus, RuleState, Snapshot, bind, serve};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabel {
    pub rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub rule: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub rule: String,
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub result: String,
}

/// Every metric the operator exports.
pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<ResultLabel, Counter>,
    pub reconcile_seconds: Family<RuleLabel, Histogram>,
    pub child_ops: Family<OpLabel, Counter>,
    pub status_writes: Family<RuleLabel, Counter>,
    pub reloads: Family<OutcomeLabel, Counter>,
    pub reload_ok: Gauge,
    pub rules_running: Gauge,
    /// 1 while this replica may write (always, without leader election).
    pub leader: Gauge,
    /// `--shards`: buckets whose parents this replica writes now.
    pub shard_buckets: Gauge,
    /// `--shards`: the assignment generation this replica has applied.
    pub shard_generation: Gauge,
    /// `--shards`: live members of the ring, as this replica sees them.
    pub shard_members: Gauge,
    pub parents_in_backoff: Family<RuleLabel, Gauge>,
    pub api_errors: Family<ApiErrorLabel, Counter>,
    pub undecodable: Family<KindLabel, Counter>,
    /// 1 for each rule the last reload rejected (it keeps its last good version).
    pub rule_rejected: Family<RuleLabel, Gauge>,
    /// Every request sent to the API server, watches included.
    pub api_requests: Family<RequestLabel, Counter>,
    /// Events written, by rule and reason.
    pub events: Family<EventLabel, Counter>,
    /// 1 for a rule Inactive because of its ServiceAccount (`serviceAccountName`).
    pub account_denied: Family<RuleLabel, Gauge>,
    /// 1 for each rule's current state (`running`, `waiting`, `inactive`):
    /// the series of its previous state is removed, a removed rule has none.
    pub rule_state: Family<RuleStateLabel, Gauge>,
    /// Parents on each live revision of a rule with `rollout:`.
    pub rollout_parents: Family<RevisionLabel, Gauge>,
    /// 1 for the state a rule's rollout is in, 0 for the others.
    pub rollout_state: Family<PhaseLabel, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RevisionLabel {
    pub rule: String,
    pub revision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub rule: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    /// `get`, `list`, `watch`, `create`, `apply`, `patch`, `update`, `delete`, …
    pub verb: String,
    /// `configmaps`, `apps/deployments`, `example.com/widgets/status`, …
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleStateLabel {
    pub rule: String,
    /// `running`, `waiting` or `inactive` ([`RuleState::label`]).
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabel {
    pub rule: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiErrorLabel {
    pub rule: String,
    /// HTTP status code, or `transport` when no response came back.
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("trellis");
        let reconciles = Family::<ResultLabel, Counter>::default();
        registry.register(
            "reconciles",
            "Reconcile passes by rule and result (ok, error)",
            reconciles.clone(),
        );
        let reconcile_seconds = Family::<RuleLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile pass",
            reconcile_seconds.clone(),
        );
        let child_ops = Family::<OpLabel, Counter>::default();
        registry.register(
            "child_operations",
            "Child API operations by rule and op (create, update, unchanged, delete)",
            child_ops.clone(),
        );
        let status_writes = Family::<RuleLabel, Counter>::default();
        registry.register(
            "status_writes",
            "Parent status patches (unchanged status is never written)",
            status_writes.clone(),
        );
        let reloads = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "rule_reloads",
            "Rule set reloads by result (success, failure)",
            reloads.clone(),
        );
        let reload_ok = Gauge::default();
        registry.register(
            "rule_reload_last_success",
            "1 when the last rule change loaded, 0 when it was rejected",
            reload_ok.clone(),
        );
        reload_ok.set(1);
        let rules_running = Gauge::default();
        registry.register(
            "rules_running",
            "Rules whose watches are running",
            rules_running.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and writes (always 1 without --leader-elect)",
            leader.clone(),
        );
        leader.set(1);
        let shard_buckets = Gauge::default();
        registry.register(
            "shard_buckets",
            "With --shards: the buckets (of 256) whose parents this replica writes now",
            shard_buckets.clone(),
        );
        let shard_generation = Gauge::default();
        registry.register(
            "shard_generation",
            "With --shards: the generation of the bucket assignment this replica has applied",
            shard_generation.clone(),
        );
        let shard_members = Gauge::default();
        registry.register(
            "shard_members",
            "With --shards: live members of the ring, as this replica sees them",
            shard_members.clone(),
        );
        let parents_in_backoff = Family::<RuleLabel, Gauge>::default();
        registry.register(
            "parents_in_backoff",
            "Parents whose last pass failed, waiting out their backoff",
            parents_in_backoff.clone(),
        );
        let api_errors = Family::<ApiErrorLabel, Counter>::default();
        registry.register(
            "api_errors",
            "Failed API requests by rule and HTTP status code",
            api_errors.clone(),
        );
        let undecodable = Family::<KindLabel, Counter>::default();
        registry.register(
            "undecodable_objects",
            "Objects skipped because they could not be decoded (too deep, malformed)",
            undecodable.clone(),
        );
        let rule_rejected = Family::<RuleLabel, Gauge>::default();
        registry.register(
            "rule_rejected",
            "1 for a rule whose last change was rejected (it runs its last good version, or not at all)",
            rule_rejected.clone(),
        );
        let api_requests = Family::<RequestLabel, Counter>::default();
        registry.register(
            "api_requests",
            "Requests sent to the API server by verb and resource (watches included)",
            api_requests.clone(),
        );
        let events = Family::<EventLabel, Counter>::default();
        registry.register(
            "events",
            "Events written by rule and reason",
            events.clone(),
        );
        let account_denied = Family::<RuleLabel, Gauge>::default();
        registry.register(
            "rule_account_denied",
            "1 for a rule held Inactive by its ServiceAccount: missing, not impersonable, or denied a read the rule needs",
            account_denied.clone(),
        );
        let rule_state = Family::<RuleStateLabel, Gauge>::default();
        registry.register(
            "rule_state",
            "1 for each rule's current state: running, waiting (a kind it names is not served) or inactive (a permission or its account is missing)",
            rule_state.clone(),
        );
        let rollout_parents = Family::<RevisionLabel, Gauge>::default();
        registry.register(
            "rollout_parents",
            "Parents on each live revision of a rule with rollout:",
            rollout_parents.clone(),
        );
        let rollout_state = Family::<PhaseLabel, Gauge>::default();
        registry.register(
            "rollout_state",
            "1 for the state of a rule's rollout (Progressing, Paused, Halted, RolledBack, Complete), 0 for the others",
            rollout_state.clone(),
        );
        Metrics {
            rule_state,
            rollout_parents,
            rollout_state,
            account_denied,
            api_requests,
            events,
            rule_rejected,
            parents_in_backoff,
            api_errors,
            undecodable,
            registry,
            reconciles,
            reconcile_seconds,
            child_ops,
            status_writes,
            reloads,
            reload_ok,
            rules_running,
            leader,
            shard_buckets,
            shard_generation,
            shard_members,
        }
    }
}

impl Metrics {
    pub fn child_op(&self, rule: &str, op: &str) {
        self.child_ops
            .get_or_create(&OpLabel {
                rule: rule.to_owned(),
                op: op.to_owned(),
            })
            .inc();
    }

    pub fn api_request(&self, verb: &str, resource: &str) {
        self.api_requests
            .get_or_create(&RequestLabel {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            warn!("cannot encode metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_with_labels() {
        let m = Metrics::default();
        m.child_op("webapp", "create");
        m.reconciles
            .get_or_create(&ResultLabel {
                rule: "webapp".into(),
                result: "ok".into(),
            })
            .inc();
        let text = m.encode();
        assert!(
            text.contains("trellis_child_operations_total{rule=\"webapp\",op=\"create\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("trellis_reconciles_total{rule=\"webapp\",result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("trellis_rule_reload_last_success 1"),
            "{text}"
        );
        assert!(text.contains("trellis_leader 1"), "{text}");
        m.leader.set(0);
        assert!(m.encode().contains("trellis_leader 0"));
    }

    #[test]
    fn a_rejected_rule_is_a_gauge_per_rule() {
        let m = Metrics::default();
        let label = RuleLabel { rule: "web".into() };
        m.rule_rejected.get_or_create(&label).set(1);
        assert!(m.encode().contains("trellis_rule_rejected{rule=\"web\"} 1"));
        m.rule_rejected.remove(&label);
        assert!(!m.encode().contains("trellis_rule_rejected{"));
    }
}
