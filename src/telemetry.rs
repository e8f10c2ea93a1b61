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
use prometheus_client::registry::{Metric, Registry};
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
    /// Parents in each rule's cache, by form (`full`, `stub`): under
    /// `--shards`, only this replica's buckets' (set at each scrape).
    pub parents_cached: Family<FormLabel, Gauge>,
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
    /// ConversionReviews answered by this replica, by result (ok, failed).
    pub conversion_reviews: Family<OutcomeLabel, Counter>,
    /// 1 while a registered spoke answers, 0 while it does not.
    pub cluster_reachable: Family<ClusterLabel, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabel {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FormLabel {
    pub rule: String,
    pub form: String,
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
    /// `local` (the operator's own cluster) or a spoke's name.
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleStateLabel {
    pub rule: String,
    /// `running`, `waiting`, `inactive` or `breaking` ([`RuleState::label`]).
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

/// The help of `cluster_reachable`.
const REACHABLE: &str =
    "1 while a spoke registered by a trellis.dev/cluster Secret answers, 0 while it does not";

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("trellis");
        let r = &mut registry;
        // Registered in this order, which is the order `/metrics` lists them in.
        let metrics = Metrics {
            reconciles: registered(
                r,
                "reconciles",
                "Reconcile passes by rule and result (ok, error)",
                Family::<ResultLabel, Counter>::default(),
            ),
            reconcile_seconds: registered(
                r,
                "reconcile_duration_seconds",
                "Time of one reconcile pass",
                Family::<RuleLabel, Histogram>::new_with_constructor(|| {
                    Histogram::new(exponential_buckets(0.001, 2.0, 16))
                }),
            ),
            child_ops: registered(
                r,
                "child_operations",
                "Child API operations by rule and op (create, update, unchanged, delete)",
                Family::<OpLabel, Counter>::default(),
            ),
            status_writes: registered(
                r,
                "status_writes",
                "Parent status patches (unchanged status is never written)",
                Family::<RuleLabel, Counter>::default(),
            ),
            reloads: registered(
                r,
                "rule_reloads",
                "Rule set reloads by result (success, failure)",
                Family::<OutcomeLabel, Counter>::default(),
            ),
            reload_ok: registered(
                r,
                "rule_reload_last_success",
                "1 when the last rule change loaded, 0 when it was rejected",
                Gauge::default(),
            ),
            rules_running: registered(
                r,
                "rules_running",
                "Rules whose watches are running",
                Gauge::default(),
            ),
            leader: registered(
                r,
                "leader",
                "1 while this replica holds the leader Lease and writes (always 1 without --leader-elect)",
                Gauge::default(),
            ),
            shard_buckets: registered(
                r,
                "shard_buckets",
                "With --shards: the buckets (of 256) whose parents this replica writes now",
                Gauge::default(),
            ),
            parents_cached: registered(
                r,
                "parents_cached",
                "Parents held in the rule's cache, in full or as a stub; with --shards only this replica's buckets' parents are listed",
                Family::<FormLabel, Gauge>::default(),
            ),
            shard_generation: registered(
                r,
                "shard_generation",
                "With --shards: the generation of the bucket assignment this replica has applied",
                Gauge::default(),
            ),
            shard_members: registered(
                r,
                "shard_members",
                "With --shards: live members of the ring, as this replica sees them",
                Gauge::default(),
            ),
            parents_in_backoff: registered(
                r,
                "parents_in_backoff",
                "Parents whose last pass failed, waiting out their backoff",
                Family::<RuleLabel, Gauge>::default(),
            ),
            api_errors: registered(
                r,
                "api_errors",
                "Failed API requests by rule and HTTP status code",
                Family::<ApiErrorLabel, Counter>::default(),
            ),
            undecodable: registered(
                r,
                "undecodable_objects",
                "Objects skipped because they could not be decoded (too deep, malformed)",
                Family::<KindLabel, Counter>::default(),
            ),
            rule_rejected: registered(
                r,
                "rule_rejected",
                "1 for a rule whose last change was rejected (it runs its last good version, or not at all)",
                Family::<RuleLabel, Gauge>::default(),
            ),
            api_requests: registered(
                r,
                "api_requests",
                "Requests sent to the API servers by verb, resource and cluster (watches included)",
                Family::<RequestLabel, Counter>::default(),
            ),
            events: registered(
                r,
                "events",
                "Events written by rule and reason",
                Family::<EventLabel, Counter>::default(),
            ),
            account_denied: registered(
                r,
                "rule_account_denied",
                "1 for a rule held Inactive by its ServiceAccount: missing, not impersonable, or denied a read the rule needs",
                Family::<RuleLabel, Gauge>::default(),
            ),
            rule_state: registered(
                r,
                "rule_state",
                "1 for each rule's current state: running, waiting (a kind it names is not served) or inactive (a permission or its account is missing)",
                Family::<RuleStateLabel, Gauge>::default(),
            ),
            rollout_parents: registered(
                r,
                "rollout_parents",
                "Parents on each live revision of a rule with rollout:",
                Family::<RevisionLabel, Gauge>::default(),
            ),
            rollout_state: registered(
                r,
                "rollout_state",
                "1 for the state of a rule's rollout (Progressing, Paused, Halted, RolledBack, Complete), 0 for the others",
                Family::<PhaseLabel, Gauge>::default(),
            ),
            conversion_reviews: registered(
                r,
                "conversion_reviews",
                "ConversionReviews answered by the /convert webhook, by result (ok, failed)",
                Family::<OutcomeLabel, Counter>::default(),
            ),
            cluster_reachable: registered(r, "cluster_reachable", REACHABLE, Family::default()),
            registry,
        };
        metrics.reload_ok.set(1);
        metrics.leader.set(1);
        metrics
    }
}

/// Registers `metric` under `name` and hands it back.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
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

    pub fn api_request(&self, verb: &str, resource: &str, cluster: &str) {
        self.api_requests
            .get_or_create(&RequestLabel {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                cluster: cluster.to_owned(),
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
