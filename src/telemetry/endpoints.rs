//! The HTTP endpoints of `trellis run`: what `/status` and `/readyz` show
//! (the [`Snapshot`] the operator hands in), `/metrics` and `/healthz`, and
//! the server. Apart from the metrics (`telemetry.rs`) because this is the
//! part that speaks HTTP and knows the shape of `/status`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Metrics;

/// Where a rule stands, for logs and `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleState {
    /// A kind it names is not served yet.
    Waiting(String),
    /// It may not do something it needs.
    Inactive(String),
    /// Its new CRD would break stored parents or clients (`--manage-crds`):
    /// it keeps its last good version, or does not start; one line per change.
    Breaking(Vec<String>),
    Running,
}

impl RuleState {
    /// The state's name in the `trellis_rule_state` gauge's `state` label.
    pub fn label(&self) -> &'static str {
        match self {
            RuleState::Running => "running",
            RuleState::Waiting(_) => "waiting",
            RuleState::Inactive(_) => "inactive",
            RuleState::Breaking(_) => "breaking",
        }
    }
}

/// The outcome of the last look at the rules directories.
#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    /// RFC 3339 time of the last reload attempt that found a change.
    pub at: Option<String>,
    /// `None` when the last change loaded whole; else every diagnostic, one per line.
    pub error: Option<String>,
    /// Rules in force.
    pub rules: usize,
    pub successes: u64,
    pub failures: u64,
    /// Rule → the errors that kept it at its last good version (or, for a
    /// rule that never loaded, from starting).
    pub rejected: BTreeMap<String, Vec<String>>,
    /// Errors that concern no rule by name (a new file that does not parse).
    pub unattributed: Vec<String>,
}

/// The election as `/status` shows it.
#[derive(Debug, Clone, Default)]
pub struct LeaderStatus {
    pub enabled: bool,
    pub identity: String,
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// Whether this replica writes now.
    pub leader: bool,
    /// Who holds the Lease, as last seen.
    pub holder: Option<String>,
    /// RFC 3339 time `leader` last changed.
    pub since: Option<String>,
    /// How often this replica became leader.
    pub terms: u64,
}

impl LeaderStatus {
    pub fn to_json(&self) -> serde_json::Value {
        if !self.enabled {
            return json!({"enabled": false, "leader": true});
        }
        json!({
            "enabled": true,
            "identity": self.identity,
            "lease": self.lease,
            "leader": self.leader,
            "holder": self.holder,
            "since": self.since,
            "terms": self.terms,
        })
    }
}

/// What `/status` and `/readyz` show, as of one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub reload: ReloadStatus,
    pub rules: BTreeMap<String, RuleState>,
    pub leader: LeaderStatus,
    /// Rule → its rollout (`rules.<name>.rollout`), for rules with `rollout:`.
    pub rollouts: BTreeMap<String, serde_json::Value>,
    /// Rule → its storage migration (`rules.<name>.migration`): kept, done
    /// = total, until the next one.
    pub migrations: BTreeMap<String, serde_json::Value>,
    /// `shard` under `--shards`: member, generation, buckets, members.
    pub shard: Option<serde_json::Value>,
    /// `clusters`: each registered spoke (reachable, kinds, since).
    pub clusters: serde_json::Value,
    /// Rule → the parents its cache holds (`rules.<name>.parents`:
    /// `{full, stub}`).
    pub parents: BTreeMap<String, serde_json::Value>,
}

/// What the endpoints read: the metrics, and a way to take a [`Snapshot`]
/// of the operator's state (the operator supplies it).
pub struct Observability {
    pub metrics: Arc<Metrics>,
    pub snapshot: Box<dyn Fn() -> Snapshot + Send + Sync>,
    /// Brings the gauges counted on demand up to date, before a scrape.
    pub refresh: Box<dyn Fn() + Send + Sync>,
}

fn state_json(state: &RuleState) -> serde_json::Value {
    match state {
        RuleState::Running => json!({"state": "Running"}),
        RuleState::Waiting(why) => json!({"state": "Waiting", "reason": why}),
        RuleState::Inactive(why) => json!({"state": "Inactive", "reason": why}),
        RuleState::Breaking(changes) => json!({
            "state": "Breaking",
            "reason": "the CRD change is breaking (crd: {allowBreaking: true} applies it anyway)",
            "changes": changes,
        }),
    }
}

async fn metrics(State(obs): State<Arc<Observability>>) -> impl IntoResponse {
    (obs.refresh)();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        obs.metrics.encode(),
    )
}

async fn status(State(obs): State<Arc<Observability>>) -> impl IntoResponse {
    let now = (obs.snapshot)();
    let mut out = status_json(&now.reload, &now.rules, now.leader.to_json());
    for (rule, rollout) in now.rollouts {
        if let Some(entry) = out["rules"].get_mut(&rule) {
            entry["rollout"] = rollout;
        }
    }
    for (rule, parents) in now.parents {
        if let Some(entry) = out["rules"].get_mut(&rule) {
            entry["parents"] = parents;
        }
    }
    for (rule, migration) in now.migrations {
        if let Some(entry) = out["rules"].get_mut(&rule) {
            entry["migration"] = migration;
        }
    }
    if let Some(shard) = now.shard {
        out["shard"] = shard;
    }
    out["clusters"] = now.clusters;
    axum::Json(out)
}

/// `/status`: each rule's state, with the errors of its rejected change
/// (a rejected rule that never loaded shows as `Rejected`), and the reload.
fn status_json(
    reload: &ReloadStatus,
    states: &BTreeMap<String, RuleState>,
    leader: serde_json::Value,
) -> serde_json::Value {
    let mut rules: serde_json::Map<String, serde_json::Value> = states
        .iter()
        .map(|(name, s)| (name.clone(), state_json(s)))
        .collect();
    for (name, errors) in &reload.rejected {
        let entry = rules
            .entry(name.clone())
            .or_insert_with(|| json!({"state": "Rejected"}));
        entry["rejected"] = json!(errors);
    }
    json!({
        "reload": {
            "ok": reload.error.is_none(),
            "at": reload.at,
            "error": reload.error,
            "rules": reload.rules,
            "successes": reload.successes,
            "failures": reload.failures,
            "rejected": reload.rejected,
            "unattributed": reload.unattributed,
        },
        "rules": rules,
        "leader": leader,
    })
}

/// Ready once the operator runs; a rejected rule change keeps it ready (the
/// previous rules still work) but says so. A standby is ready too: its
/// caches are warm and it can take over at once, so a rolling update and a
/// PodDisruptionBudget count it.
async fn readyz(State(obs): State<Arc<Observability>>) -> impl IntoResponse {
    let Snapshot { reload, leader, .. } = (obs.snapshot)();
    let role = if leader.enabled && !leader.leader {
        format!(
            " (standby; leader: {})",
            leader.holder.as_deref().unwrap_or("none yet")
        )
    } else {
        String::new()
    };
    match reload.error {
        None => (StatusCode::OK, format!("ok{role}\n")),
        Some(err) => (
            StatusCode::OK,
            format!("ok{role} (last rule change rejected; previous rules in force):\n{err}\n"),
        ),
    }
}

/// Binds the endpoints' address: an address that cannot be had is a
/// startup error (a process without probes would be killed, or worse, not).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| anyhow::anyhow!("--metrics-addr {addr}: cannot listen: {err}"))
}

/// Serves the endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    obs: Arc<Observability>,
    shutdown: CancellationToken,
) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .with_state(obs);
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz, /readyz, /status");
    }
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    if let Err(err) = result {
        warn!("metrics server: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_each_rejected_rule_with_its_errors() {
        let reload = ReloadStatus {
            error: Some("a.yaml:3: error: x".into()),
            rejected: BTreeMap::from([
                ("kept".to_owned(), vec!["a.yaml:3: error: x".to_owned()]),
                ("fresh".to_owned(), vec!["b.yaml:9: error: y".to_owned()]),
            ]),
            ..ReloadStatus::default()
        };
        let states = BTreeMap::from([
            ("kept".to_owned(), RuleState::Running),
            ("fine".to_owned(), RuleState::Running),
        ]);
        let status = status_json(&reload, &states, json!(null));
        assert_eq!(status["reload"]["ok"], false);
        assert_eq!(status["rules"]["kept"]["state"], "Running");
        assert_eq!(status["rules"]["kept"]["rejected"][0], "a.yaml:3: error: x");
        assert_eq!(status["rules"]["fresh"]["state"], "Rejected");
        assert_eq!(
            status["rules"]["fresh"]["rejected"][0],
            "b.yaml:9: error: y"
        );
        assert!(status["rules"]["fine"].get("rejected").is_none());
        assert_eq!(
            status["reload"]["rejected"]["fresh"][0],
            "b.yaml:9: error: y"
        );
    }

    #[tokio::test]
    async fn an_address_in_use_is_an_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind(addr).await.unwrap_err().to_string();
        assert!(err.contains(&addr.to_string()), "{err}");
    }
}
