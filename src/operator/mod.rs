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
mod reloading;
mod requests;
mod retry;
pub mod rollout;
mod shared;
mod supervisor;
pub mod watches;
pub mod webhook;

pub use options::Options;
use reloading::{hold_breaking, load, reload_loop};
use shared::parents_cached;
pub use shared::{ParentCaches, RuleStates, Shared};

// `trellis diff` and the CLI reach these by the names they had before the
// operator had rooms.
pub use rollout::versions;
pub use watches::discovery;

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

use crate::rules::RuleSet;
use leadership::{leader, shards};
use pass::summary;

pub use crate::telemetry::{LeaderStatus, ReloadStatus, RuleState};

/// Finalizer that holds a parent until trellis has removed its children.
pub const FINALIZER: &str = "trellis.dev/cleanup";
/// Annotation that pauses reconciliation of one parent.
pub use crate::pass::PAUSED_ANNOTATION;

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
        (Some(settings), true) => {
            settings.validate_member().map_err(|e| anyhow::anyhow!(e))?;
            Some(settings.member())
        }
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
    let shards = shard_settings
        .as_ref()
        .map(|s| shards::Shards::new(&s.identity));
    let clusters = clusters::Clusters::start(
        options.cluster_name.clone(),
        options.namespaces.clone(),
        metrics.clone(),
        (client.clone(), options.operator_namespace.clone()),
        shards.as_ref().map(|s| s.owned()),
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
        shards,
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
