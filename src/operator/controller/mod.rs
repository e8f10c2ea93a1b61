//! One rule's life: resolve its kinds, check permissions, run its watches
//! and queue until shutdown or until its kinds disappear.
//!
//! ```text
//!  waiting ──kinds served──▶ preflight ──ok──▶ running ──CRD gone──▶ waiting
//!     ▲  CRD change / retry      │ missing verb                │ shutdown
//!     └──────────────────────────┘ (inactive, retried)         ▼ done
//! ```
//!
//! This file is the life; `running.rs` the running state (the watches, the
//! queue, the context the passes share).

mod running;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::Shared;
use super::identity;
use super::identity::access;
use super::rollout::versions::Versions;
use super::watches::discovery::{self, RuleKinds};
use crate::rules::CompiledRule;
use crate::telemetry::RuleState;

/// Runs one rule until `shutdown`; a new value on `rules` (same parent and
/// child kinds) is picked up without restarting watches and re-reconciles
/// every parent.
pub fn spawn(
    rules: watch::Receiver<Arc<CompiledRule>>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(rule_loop(rules, shared, shutdown))
}

/// Waits for a CRD change, a timeout, or shutdown.
async fn pause(shared: &Shared, shutdown: &CancellationToken, timeout: Duration) {
    let mut epoch = shared.crd_epoch.clone();
    epoch.borrow_and_update();
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = epoch.changed() => {}
        _ = tokio::time::sleep(timeout) => {}
    }
}

/// How long a rule waiting for a kind (or for its versions) waits before
/// it looks again, when no CRD change wakes it first: 1 s doubling to 30 s.
fn waiting_backoff() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(30))
        .without_max_times()
        .build()
}

fn next_retry(backoff: &mut backon::ExponentialBackoff) -> Duration {
    backoff.next().unwrap_or(Duration::from_secs(30))
}

async fn rule_loop(
    rules: watch::Receiver<Arc<CompiledRule>>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let name = rules.borrow().name.clone();
    let mut retry = waiting_backoff();
    let mut last_state: Option<RuleState> = None;
    // Logs a state once, not on every retry.
    let report = |last: &mut Option<RuleState>, state: RuleState| {
        shared.set_rule_state(&name, Some(state.clone()));
        if last.as_ref() != Some(&state) {
            match &state {
                RuleState::Waiting(why) => info!(rule = %name, "waiting: {why}"),
                RuleState::Inactive(why) => error!(rule = %name, "inactive: {why}"),
                RuleState::Breaking(_) | RuleState::Running => {}
            }
            *last = Some(state);
        }
    };
    while !shutdown.is_cancelled() {
        let rule = rules.borrow().clone();
        let namespaces = match effective_namespaces(&rule, &shared.namespaces) {
            Ok(ns) => ns,
            Err(why) => {
                report(&mut last_state, RuleState::Inactive(why.to_string()));
                shutdown.cancelled().await;
                return;
            }
        };
        let kinds = match discovery::resolve_rule(&shared.client, &rule).await {
            Ok(kinds) => kinds,
            Err(why) => {
                report(&mut last_state, RuleState::Waiting(why.to_string()));
                pause(&shared, &shutdown, next_retry(&mut retry)).await;
                continue;
            }
        };
        // Before the revision ConfigMaps are first listed, so a rule the
        // operator may not list them for is Inactive, not Waiting. It asks
        // about the rule on disk only, whose kinds are all resolved here;
        // the child kinds `with_versions` adds for older versions are not
        // among its permissions.
        let missing = preflight(&shared, &rule, &kinds, &namespaces).await;
        if !missing.is_empty() {
            report(
                &mut last_state,
                RuleState::Inactive(format!(
                    "trellis may not {}; grant what `trellis rbac{}` prints",
                    missing.join(", "),
                    if shared.shards.is_some() {
                        " --shards"
                    } else {
                        ""
                    }
                )),
            );
            pause(&shared, &shutdown, Duration::from_secs(60)).await;
            continue;
        }
        // A staged rollout: the versions parents are on are read back
        // before any pass, and their child kinds are watched too.
        let versions = Arc::new(Versions::default());
        let kinds = match with_versions(&shared, &rule, &versions, kinds).await {
            Ok(kinds) => kinds,
            Err(why) => {
                report(&mut last_state, RuleState::Waiting(why.to_string()));
                pause(&shared, &shutdown, next_retry(&mut retry)).await;
                continue;
            }
        };
        retry = waiting_backoff();
        if let Err(why) = identity::preflight(&shared, &rule, &kinds, &namespaces).await {
            account_denied(&shared, &name, true);
            report(&mut last_state, RuleState::Inactive(why.to_string()));
            pause_or_reload(&shared, &shutdown, &rules, Duration::from_secs(60)).await;
            continue;
        }
        account_denied(&shared, &name, false);
        report(&mut last_state, RuleState::Running);
        let stop = shutdown.child_token();
        // The account is checked again while the rule runs: a denial stops
        // the watches (children stay as they are) and makes it Inactive.
        let denied = Arc::new(Mutex::new(None));
        let guard = tokio::spawn({
            let (shared, rules, kinds) = (shared.clone(), rules.clone(), kinds.clone());
            let (namespaces, denied, stop) = (namespaces.clone(), denied.clone(), stop.clone());
            async move {
                let why = identity::recheck(&shared, rules, &kinds, &namespaces).await;
                *super::lock(&denied) = Some(why);
                stop.cancel();
            }
        });
        let monitor = tokio::spawn(stop_when_kinds_change(
            rule.clone(),
            kinds
                .unserved_related
                .iter()
                .map(|u| u.gvk.clone())
                .collect(),
            shared.clone(),
            stop.clone(),
        ));
        running::run_controller(
            rules.clone(),
            kinds,
            namespaces,
            shared.clone(),
            versions,
            stop,
        )
        .await;
        monitor.abort();
        guard.abort();
        let denied = super::lock(&denied).take();
        if let Some(why) = denied {
            account_denied(&shared, &name, true);
            warn!(rule = %name, "stopping watches: {why}");
            report(&mut last_state, RuleState::Inactive(why));
            pause_or_reload(&shared, &shutdown, &rules, Duration::from_secs(60)).await;
            continue;
        }
        if !shutdown.is_cancelled() {
            last_state = None;
            info!(rule = %rule.name, "watches stopped: the kinds the rule names changed");
        }
    }
}

/// Like [`pause`], also woken by a new version of the rule (a reload).
async fn pause_or_reload(
    shared: &Shared,
    shutdown: &CancellationToken,
    rules: &watch::Receiver<Arc<CompiledRule>>,
    timeout: Duration,
) {
    let mut rules = rules.clone();
    rules.borrow_and_update();
    tokio::select! {
        () = pause(shared, shutdown, timeout) => {}
        _ = rules.changed() => {}
    }
}

/// Publishes whether the rule is held Inactive by its account (the
/// `trellis_rule_account_denied` gauge; absent for a rule without one).
fn account_denied(shared: &Shared, rule: &str, denied: bool) {
    let label = crate::telemetry::RuleLabel {
        rule: rule.to_owned(),
    };
    if denied {
        shared.metrics.account_denied.get_or_create(&label).set(1);
    } else {
        shared.metrics.account_denied.remove(&label);
    }
}

/// A rule whose own namespaces all lie outside the operator's `--namespace`.
#[derive(Debug, thiserror::Error)]
#[error("its namespaces ({}) are outside the operator's --namespace ({})", .own.join(", "), .operator.join(", "))]
pub(super) struct OutsideOperatorNamespaces {
    own: Vec<String>,
    operator: Vec<String>,
}

/// Namespaces a rule watches: its own list intersected with the operator's.
/// Empty means all.
pub(super) fn effective_namespaces(
    rule: &CompiledRule,
    operator: &[String],
) -> Result<Vec<String>, OutsideOperatorNamespaces> {
    let own = &rule.rule.spec.parent.namespaces;
    match (own.is_empty(), operator.is_empty()) {
        (true, _) => Ok(operator.to_vec()),
        (false, true) => Ok(own.clone()),
        (false, false) => {
            let both: Vec<String> = own
                .iter()
                .filter(|n| operator.contains(n))
                .cloned()
                .collect();
            if both.is_empty() {
                Err(OutsideOperatorNamespaces {
                    own: own.clone(),
                    operator: operator.to_vec(),
                })
            } else {
                Ok(both)
            }
        }
    }
}

/// Asks the API server, verb by verb, whether trellis may do what the rule
/// needs (where [`access::operator_checks`] says it is used, the revision
/// ConfigMaps of a rule with `rollout:` included); returns what is missing.
async fn preflight(
    shared: &Shared,
    rule: &CompiledRule,
    kinds: &RuleKinds,
    namespaces: &[String],
) -> Vec<String> {
    let api: Api<SelfSubjectAccessReview> = Api::all(shared.client.clone());
    let checks = access::operator_checks(
        rule,
        kinds,
        namespaces,
        &shared.namespaces,
        &shared.operator_namespace,
    );
    let mut checks = checks;
    if shared.shards.is_some() {
        // The bucket label each replica selects its own parents by.
        checks.extend(access::checks(
            vec![crate::rbac::shard_label_permission(rule)],
            rule,
            kinds,
            namespaces,
            &shared.namespaces,
            &shared.operator_namespace,
        ));
    }
    let mut missing = Vec::new();
    for check in checks {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(access::attributes(&check)),
                ..Default::default()
            },
            ..Default::default()
        };
        let allowed = match api.create(&PostParams::default(), &review).await {
            Ok(r) => r.status.map(|s| s.allowed).unwrap_or(false),
            Err(err) => {
                warn!(rule = %rule.name, "preflight could not ask about {}: {err}", check.perm);
                false
            }
        };
        if !allowed {
            missing.push(check.to_string());
        }
    }
    missing
}

/// Cancels `stop` once a CRD change leaves one of the rule's kinds
/// unserved, or changes which related kinds are unserved (`unserved` when
/// the watches started): the rule restarts with its watches, and the
/// readers it held back proceed.
async fn stop_when_kinds_change(
    rule: Arc<CompiledRule>,
    unserved: Vec<crate::kinds::Gvk>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut epoch = shared.crd_epoch.clone();
    epoch.borrow_and_update();
    while epoch.changed().await.is_ok() {
        match discovery::resolve_rule(&shared.client, &rule).await {
            Err(why) => {
                warn!(rule = %rule.name, "stopping watches: {why}");
                stop.cancel();
                return;
            }
            Ok(kinds) if kinds.unserved_related.iter().map(|u| &u.gvk).ne(&unserved) => {
                info!(rule = %rule.name, "restarting watches: the related kinds served changed");
                stop.cancel();
                return;
            }
            Ok(_) => {}
        }
    }
}

/// The revision ConfigMaps of a rule with `rollout:` cannot be listed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the rule's revision ConfigMaps in namespace {namespace}: {source}")]
struct VersionsUnreadable {
    namespace: String,
    source: kube::Error,
}

/// For a rule with `rollout:`: reads its stored versions into `versions`
/// and adds the child kinds of the versions in use to `kinds`.
async fn with_versions(
    shared: &Shared,
    rule: &Arc<CompiledRule>,
    versions: &Versions,
    mut kinds: RuleKinds,
) -> Result<RuleKinds, VersionsUnreadable> {
    if rule.rollout.is_none() {
        return Ok(kinds);
    }
    let stored =
        super::rollout::versions::list(&shared.client, &shared.operator_namespace, &rule.name)
            .await
            .map_err(|source| VersionsUnreadable {
                namespace: shared.operator_namespace.clone(),
                source,
            })?;
    versions.absorb(&stored, rule, shared.limits);
    for version in versions.all_compiled() {
        for child in &version.children {
            if kinds.children.iter().any(|k| k.gvk == child.gvk) {
                continue;
            }
            match discovery::resolve(&shared.client, &child.gvk).await {
                Ok(kind) => kinds.children.push(kind),
                Err(why) => {
                    warn!(rule = %rule.name, revision = %version.revision, "a child kind of a version in use is not served: {why}")
                }
            }
        }
    }
    Ok(kinds)
}
