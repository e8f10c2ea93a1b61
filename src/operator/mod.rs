//! `trellis run`: the operator, the imperative shell around `plan`.
//!
//! ```text
//!  rules dir ──reload (watch + poll, validate)──▶ supervisor: start / stop / restart / update rules
//!                                                     │
//!  RuleSet ──▶ one task per rule (controller) ──resolve kinds (watches::discovery)──▶ waiting ◀── CRD watch
//!                    │                      └─preflight (identity: SelfSubjectAccessReview)─▶ inactive
//!                    ▼
//!          watches/: parent watch + child watches (label trellis.dev/rule) + related caches
//!                    │ queue: dedup per parent, per-key backoff (retry), shared concurrency limit
//!                    ▼
//!          pass/: reconcile: caches → plan() → apply / delete / patches / status / Events
//!                    ▲ every write asks leadership/ (leader gate, --shards buckets)
//!          rollout/: the leader's tick of a staged rollout, its versions in ConfigMaps
//! ```
//!
//! Each rule runs on its own, so a rule whose CRD is missing, or which lacks
//! a permission, never holds up the others. With `--leader-elect` every write
//! goes through one gate ([`leadership::leader::Gate`]), open only on the
//! replica that holds the Lease; the others run the same watches and write
//! nothing.
//!
//! The rooms, one entry file each: `watches/` (what the operator knows of
//! the cluster: discovery, watches, caches, related reads, triggers),
//! `pass/` (one pass over one parent and what it writes), `leadership/`
//! (who may write: the leader gate and the shards runtime), `rollout/`
//! (staged rollouts at run time), `identity/` (the account a rule writes
//! as, and the preflight). At the top: this file (`run`, the reload loop),
//! `supervisor` (the running rule set), `controller/` (one rule's life;
//! `running.rs` its watches wired into kube's `Controller`), `context`
//! (what one rule's passes share), and what every room uses:
//! `home` (the operator's namespace), `crds` (`--manage-crds`), `requests`
//! (the counting client), `retry` (backoff).

pub mod clusters;
mod context;
mod controller;
pub mod crds;
pub mod home;
pub mod identity;
pub mod leadership;
mod options;
mod pass;
mod requests;
mod retry;
pub mod rollout;
mod supervisor;
pub mod watches;
pub mod webhook;

pub use options::Options;

// `trellis diff` and the CLI reach these by the names they had before the
// operator had rooms.
pub use rollout::versions;
pub use watches::discovery;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::events::Reporter;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::render::Limits;
use crate::rules::RuleSet;
use leadership::{leader, shards};
use pass::summary;

pub use crate::telemetry::{LeaderStatus, ReloadStatus, RuleState};

/// Finalizer that holds a parent until trellis has removed its children.
pub const FINALIZER: &str = "trellis.dev/cleanup";
/// Annotation that pauses reconciliation of one parent.
pub use crate::pass::PAUSED_ANNOTATION;

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
fn parents_cached(
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

/// Runs the operator until `shutdown` is cancelled; in-flight reconciles finish first.
///
/// A rule with errors does not stop the others from starting: the rules that
/// validate run, the broken ones are reported (log, `/status`, metrics) and
/// start once fixed. Only a set in which nothing validates is refused.
pub async fn run(options: Options, shutdown: CancellationToken) -> anyhow::Result<()> {
    let loaded = load(&options);
    let partition = crate::reload::partition(&RuleSet::default(), loaded);
    if partition.has_errors() && partition.set.rules.is_empty() {
        for d in &partition.diagnostics {
            tracing::error!("{d}");
        }
        anyhow::bail!("no rule in the rule set validates; nothing started");
    }
    // Diagnostics of a partly broken set are logged by the reload loop's
    // first pass, which also reports them on `/status`.
    if !partition.has_errors() {
        for w in &partition.set.warnings {
            warn!("{w}");
        }
    }
    let set = partition.set;
    let client = Client::try_default()
        .await
        .context("cannot build a Kubernetes client (KUBECONFIG or in-cluster config)")?;
    run_with(options, set, client, shutdown).await
}

/// Serves `/metrics`, `/healthz`, `/readyz` and `/status` on `listener`,
/// from snapshots of `shared`.
fn serve_status(
    listener: tokio::net::TcpListener,
    shared: &Shared,
    leader: Arc<std::sync::Mutex<LeaderStatus>>,
    shutdown: CancellationToken,
) {
    let (reload, rules, rollouts, shard, migrations) = (
        shared.reload.clone(),
        shared.rule_states.clone(),
        shared.rollouts.clone(),
        shared.shards.clone(),
        shared.migrations.clone(),
    );
    let clusters = shared.clusters.clone();
    let (caches, metrics) = (shared.parent_caches.clone(), shared.metrics.clone());
    let (counted, counted_metrics) = (caches.clone(), metrics.clone());
    let obs = Arc::new(crate::telemetry::Observability {
        metrics: shared.metrics.clone(),
        snapshot: Box::new(move || crate::telemetry::Snapshot {
            reload: lock(&reload).clone(),
            rules: lock(&rules).shown.clone(),
            leader: lock(&leader).clone(),
            rollouts: lock(&rollouts).clone(),
            migrations: lock(&migrations).clone(),
            shard: shard.as_ref().map(|s| s.status_json()),
            clusters: clusters.status_json(),
            parents: parents_cached(&caches, &metrics),
        }),
        refresh: Box::new(move || {
            parents_cached(&counted, &counted_metrics);
        }),
    });
    tokio::spawn(crate::telemetry::serve(listener, obs, shutdown));
}

/// The settings that can be wrong together, checked before anything
/// starts; the shards' settings, under `--shards`.
fn checked_settings(options: &Options) -> anyhow::Result<Option<leader::Settings>> {
    if let Some(settings) = &options.leader_election {
        settings.validate().map_err(|e| anyhow::anyhow!(e))?;
    }
    crate::clusters::check_name(&options.cluster_name)
        .map_err(|why| anyhow::anyhow!("--cluster-name: {why}"))?;
    Ok(match (&options.leader_election, options.shards) {
        (Some(settings), true) => Some(settings.clone()),
        (None, true) => {
            anyhow::bail!("--shards needs --leader-elect: the leader assigns the buckets")
        }
        (_, false) => None,
    })
}

/// Like [`run`], with a loaded rule set and a client (used by tests).
pub async fn run_with(
    options: Options,
    set: RuleSet,
    client: Client,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let metrics = Arc::<crate::telemetry::Metrics>::default();
    let client = requests::counted(client, metrics.clone());
    let (epoch_tx, epoch_rx) = watch::channel(0u64);
    let recorder = summary::Publisher::new(
        client.clone(),
        Reporter {
            controller: "trellis".into(),
            instance: Some(options.instance.clone()),
        },
    );
    let shard_settings = checked_settings(&options)?;
    // Bound before anything starts: an address in use is a startup error.
    let listener = match options.metrics_addr {
        Some(addr) => Some(crate::telemetry::bind(addr).await?),
        None => None,
    };
    let gate = match options.leader_election {
        Some(_) => leader::Gate::closed(),
        None => leader::Gate::open(),
    };
    let (in_force, in_force_rx) = watch::channel(None);
    let clusters = clusters::Clusters::start(
        options.cluster_name.clone(),
        metrics.clone(),
        (client.clone(), options.operator_namespace.clone()),
        in_force_rx.clone(),
        shutdown.clone(),
    );
    let migrations = crds::migration::Progress::default();
    // Stopped last, after a drain: see `webhook::DRAIN`.
    let webhook_shutdown = CancellationToken::new();
    let endpoint = webhook::spawn(
        client.clone(),
        options.webhook.clone(),
        gate.clone(),
        options.operator_namespace.clone(),
        in_force_rx.clone(),
        metrics.clone(),
        webhook_shutdown.clone(),
    );
    let webhook_serving = endpoint.serving.clone();
    if options.manage_crds {
        crds::spawn(
            client.clone(),
            gate.clone(),
            in_force_rx,
            endpoint,
            migrations.clone(),
            shutdown.clone(),
        );
    }
    let shared = Arc::new(Shared {
        client: client.clone(),
        recorder,
        namespaces: options.namespaces.clone(),
        permits: Semaphore::new(options.concurrency.max(1)),
        crd_epoch: epoch_rx,
        reload: Arc::default(),
        rule_states: Arc::default(),
        rollouts: Arc::default(),
        limits: options.limits,
        metrics,
        gate: gate.clone(),
        shards: shard_settings
            .as_ref()
            .map(|s| shards::Shards::new(&s.identity)),
        migrations: migrations.clone(),
        in_force,
        operator_namespace: options.operator_namespace.clone(),
        identities: identity::Identities::new(client.clone(), options.operator_namespace.clone()),
        account_recheck: options.account_recheck,
        clusters,
        parent_caches: Arc::default(),
    });
    let leader_status = Arc::new(std::sync::Mutex::new(LeaderStatus::default()));
    let elector = options.leader_election.clone().map(|settings| {
        leader::Elector::start(
            client.clone(),
            settings,
            gate.clone(),
            shared.metrics.clone(),
            leader_status.clone(),
            shutdown.clone(),
        )
    });
    let membership = shard_settings.map(|settings| {
        shards::Membership::start(
            client.clone(),
            settings,
            shared
                .shards
                .clone()
                .expect("shards are set with their settings"),
            gate.clone(),
            shared.metrics.clone(),
            shutdown.clone(),
        )
    });
    if let Some(listener) = listener {
        serve_status(listener, &shared, leader_status.clone(), shutdown.clone());
    }
    info!(
        rules = set.rules.len(),
        namespaces = if options.namespaces.is_empty() {
            "all".to_owned()
        } else {
            options.namespaces.join(",")
        },
        concurrency = options.concurrency,
        leader_election = options.leader_election.is_some(),
        shards = options.shards,
        operator_namespace = %options.operator_namespace,
        "trellis starting"
    );

    let crd_task = tokio::spawn(watch_crds(client, epoch_tx, shutdown.clone()));
    let mut supervisor = supervisor::Supervisor::new(shared.clone(), shutdown.clone());
    let set = hold_breaking(&options, &shared, &RuleSet::default(), set).await;
    shared.put_in_force(&set);
    supervisor.apply(set).await;
    if options.rules.is_empty() {
        shutdown.cancelled().await;
    } else {
        reload_loop(&options, &shared, &mut supervisor, &shutdown).await;
    }
    info!("shutting down: finishing in-flight reconciles");
    let drained_at = std::time::Instant::now() + webhook::DRAIN;
    match elector {
        None => supervisor.join().await,
        Some(elector) => {
            // The gate closed with the shutdown, so in-flight reconciles end
            // at their next write; the Lease is handed on once they have (or
            // after a short wait: a successor must not wait on a slow pass).
            let mut join = tokio::spawn(supervisor.join());
            let drained = tokio::time::timeout(Duration::from_secs(1), &mut join).await;
            elector.release().await;
            if drained.is_err() && join.await.is_err() {
                warn!("a rule task ended abnormally");
            }
        }
    }
    if let Some(membership) = membership {
        membership.release().await;
    }
    crd_task.abort();
    if webhook_serving.load(std::sync::atomic::Ordering::Relaxed) {
        info!(drain = ?webhook::DRAIN, "conversion webhook: answering until this replica has left its Service");
        tokio::time::sleep_until(drained_at.into()).await;
    }
    webhook_shutdown.cancel();
    info!("trellis stopped");
    Ok(())
}

/// Watches the rules directories and swaps in every rule that validates.
async fn reload_loop(
    options: &Options,
    shared: &Shared,
    supervisor: &mut supervisor::Supervisor,
    shutdown: &CancellationToken,
) {
    let mut wake =
        crate::reload::watch(&options.rules, options.reload_debounce, options.reload_poll);
    // Empty, so the first pass re-reads the rules once: they may have changed
    // between the initial load and the start of the watch, and a partly
    // broken initial set is reported from here.
    let mut seen = String::new();
    let mut first = true;
    {
        let mut status = lock(&shared.reload);
        status.rules = supervisor.current().rules.len();
    }
    loop {
        if !std::mem::take(&mut first) {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                woke = wake.recv() => if woke.is_none() { return },
            }
        }
        let now = crate::reload::fingerprint(&options.rules);
        if now == seen {
            continue;
        }
        let initial = seen.is_empty();
        seen = now;
        let started = std::time::Instant::now();
        let loaded = load(options);
        let partition = crate::reload::partition(supervisor.current(), loaded);
        let rejected = partition.has_errors();
        if initial
            && !rejected
            && crate::reload::diff(supervisor.current(), &partition.set).is_empty()
        {
            continue;
        }
        for w in &partition.set.warnings {
            warn!("{w}");
        }
        if rejected {
            for d in partition
                .diagnostics
                .iter()
                .filter(|d| d.severity == crate::rules::Severity::Error)
            {
                tracing::error!("{d}");
            }
            for name in partition.rejected.keys() {
                if supervisor.current().get(name).is_some() {
                    warn!(rule = %name, "rule change rejected: the rule keeps its last good version");
                } else {
                    warn!(rule = %name, "rule rejected: not started");
                }
            }
        }
        let rejected_rules: BTreeMap<String, Vec<String>> = partition
            .rejected
            .iter()
            .map(|(name, diags)| (name.clone(), diags.iter().map(|d| d.to_string()).collect()))
            .collect();
        let unattributed: Vec<String> = partition
            .unattributed
            .iter()
            .map(|d| d.to_string())
            .collect();
        let error_text = rejected.then(|| {
            partition
                .diagnostics
                .iter()
                .filter(|d| d.severity == crate::rules::Severity::Error)
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        });
        let set = hold_breaking(options, shared, supervisor.current(), partition.set).await;
        let count = set.rules.len();
        shared.put_in_force(&set);
        supervisor.apply(set).await;
        let mut status = lock(&shared.reload);
        for gone in status
            .rejected
            .keys()
            .filter(|n| !rejected_rules.contains_key(*n))
        {
            shared
                .metrics
                .rule_rejected
                .remove(&crate::telemetry::RuleLabel { rule: gone.clone() });
        }
        for name in rejected_rules.keys() {
            shared
                .metrics
                .rule_rejected
                .get_or_create(&crate::telemetry::RuleLabel { rule: name.clone() })
                .set(1);
        }
        status.at = Some(crate::clock::now_rfc3339());
        status.rules = count;
        status.rejected = rejected_rules;
        status.unattributed = unattributed;
        status.error = error_text;
        let result = if rejected {
            status.failures += 1;
            shared.metrics.reload_ok.set(0);
            warn!(
                rejected = status.rejected.len(),
                unattributed = status.unattributed.len(),
                rules = count,
                took = ?started.elapsed(),
                "rule change partly rejected: every rule that validates is in force"
            );
            "failure"
        } else {
            status.successes += 1;
            shared.metrics.reload_ok.set(1);
            info!(rules = count, took = ?started.elapsed(), "rules reloaded");
            "success"
        };
        shared
            .metrics
            .reloads
            .get_or_create(&crate::telemetry::OutcomeLabel {
                result: result.into(),
            })
            .inc();
    }
}

/// Under `--manage-crds`, `set` without the rule versions whose CRD change
/// is breaking (each keeps its version in `last_good`), recorded for
/// `/status` and the rule-state gauge.
async fn hold_breaking(
    options: &Options,
    shared: &Shared,
    last_good: &RuleSet,
    set: RuleSet,
) -> RuleSet {
    if !options.manage_crds {
        return set;
    }
    let (set, held) = crds::hold::hold_breaking(&shared.client, last_good, set).await;
    shared.set_held(held);
    set
}

/// Reads the rules directories, a rule without an account counting as
/// broken under `--require-service-account`.
fn load(options: &Options) -> crate::rules::Loaded {
    let mut loaded = crate::rules::Loaded::read(&options.rules, options.limits);
    if options.require_service_account {
        loaded.require_service_account();
    }
    loaded
}

pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn read<T>(m: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn write<T>(m: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// Bumps the epoch on every CRD change so waiting rules retry discovery and
/// running rules notice their kind disappearing.
async fn watch_crds(client: Client, epoch: watch::Sender<u64>, shutdown: CancellationToken) {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default())
        .backoff(retry::WatchBackoff::default())
        .boxed();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => {
                    epoch.send_modify(|e| *e += 1);
                }
                Some(Ok(_)) => {}
                Some(Err(err)) => warn!("watching CustomResourceDefinitions: {err}"),
                None => return,
            }
        }
    }
}

/// Waits on SIGTERM or Ctrl-C, then cancels `token`.
pub async fn cancel_on_signal(token: CancellationToken) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => info!("interrupt received"),
    }
    token.cancel();
}
