//! One rule's life: resolve its kinds, check permissions, run its watches
//! and queue until shutdown or until its kinds disappear.
//!
//! ```text
//!  waiting ──kinds served──▶ preflight ──ok──▶ running ──CRD gone──▶ waiting
//!     ▲  CRD change / retry      │ missing verb                │ shutdown
//!     └──────────────────────────┘ (inactive, retried)         ▼ done
//! ```

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::authorization::v1::{SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::Shared;
use super::context::{self, ChildCache, RuleCtx};
use super::identity;
use super::identity::access;
use super::pass::reconcile;
use super::retry::{Failures, Outage};
use super::rollout::versions::Versions;
use super::watches::by_uid::ByUid;
use super::watches::compact::{ByParent, CompactObject};
use super::watches::decode::ParentObject;
use super::watches::discovery::{self, RuleKinds};
use super::watches::related;
use super::watches::triggers;
use super::watches::{self, cached_watch, own_errors, selector_string, trim};
use crate::plan::LABEL_RULE;
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

async fn rule_loop(
    rules: watch::Receiver<Arc<CompiledRule>>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let name = rules.borrow().name.clone();
    let mut retry = Duration::from_secs(1);
    let mut last_state: Option<RuleState> = None;
    // Logs a state once, not on every retry.
    let report = |last: &mut Option<RuleState>, state: RuleState| {
        shared.set_rule_state(&name, Some(state.clone()));
        if last.as_ref() != Some(&state) {
            match &state {
                RuleState::Waiting(why) => info!(rule = %name, "waiting: {why}"),
                RuleState::Inactive(why) => error!(rule = %name, "inactive: {why}"),
                RuleState::Running => {}
            }
            *last = Some(state);
        }
    };
    while !shutdown.is_cancelled() {
        let rule = rules.borrow().clone();
        let namespaces = match effective_namespaces(&rule, &shared.namespaces) {
            Ok(ns) => ns,
            Err(why) => {
                report(&mut last_state, RuleState::Inactive(why));
                shutdown.cancelled().await;
                return;
            }
        };
        let kinds = match discovery::resolve_rule(&shared.client, &rule).await {
            Ok(kinds) => kinds,
            Err(why) => {
                report(&mut last_state, RuleState::Waiting(why));
                pause(&shared, &shutdown, retry).await;
                retry = (retry * 2).min(Duration::from_secs(30));
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
                    "trellis may not {}; grant what `trellis rbac` prints",
                    missing.join(", ")
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
                report(&mut last_state, RuleState::Waiting(why));
                pause(&shared, &shutdown, retry).await;
                retry = (retry * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        retry = Duration::from_secs(1);
        if let Err(why) = identity::preflight(&shared, &rule, &kinds, &namespaces).await {
            account_denied(&shared, &name, true);
            report(&mut last_state, RuleState::Inactive(why));
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
                .map(|(g, _)| g.clone())
                .collect(),
            shared.clone(),
            stop.clone(),
        ));
        run_controller(
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

/// Namespaces a rule watches: its own list intersected with the operator's.
/// Empty means all.
pub(super) fn effective_namespaces(
    rule: &CompiledRule,
    operator: &[String],
) -> Result<Vec<String>, String> {
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
                Err(format!(
                    "its namespaces ({}) are outside the operator's --namespace ({})",
                    own.join(", "),
                    operator.join(", ")
                ))
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
            Ok(kinds) if kinds.unserved_related.iter().map(|(g, _)| g).ne(&unserved) => {
                info!(rule = %rule.name, "restarting watches: the related kinds served changed");
                stop.cancel();
                return;
            }
            Ok(_) => {}
        }
    }
}

/// What makes a parent worth a pass: anything but its status (and the
/// bookkeeping that changes with it). trellis's own status writes must not
/// wake the parent they were written for.
fn outside_status(parent: &ParentObject) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.undecodable.hash(&mut h);
    let meta = &parent.object.metadata;
    meta.uid.hash(&mut h);
    meta.labels.hash(&mut h);
    meta.annotations.hash(&mut h);
    meta.finalizers.hash(&mut h);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut h);
    parent.outside_status_text().hash(&mut h);
    Some(h.finish())
}

/// For a rule with `rollout:`: reads its stored versions into `versions`
/// and adds the child kinds of the versions in use to `kinds`.
async fn with_versions(
    shared: &Shared,
    rule: &Arc<CompiledRule>,
    versions: &Versions,
    mut kinds: RuleKinds,
) -> Result<RuleKinds, String> {
    if rule.rollout.is_none() {
        return Ok(kinds);
    }
    let stored =
        super::rollout::versions::list(&shared.client, &shared.operator_namespace, &rule.name)
            .await
            .map_err(|e| {
                format!(
                    "cannot read the rule's revision ConfigMaps in namespace {}: {e}",
                    shared.operator_namespace
                )
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

async fn run_controller(
    rules: watch::Receiver<Arc<CompiledRule>>,
    kinds: RuleKinds,
    namespaces: Vec<String>,
    shared: Arc<Shared>,
    versions: Arc<Versions>,
    stop: CancellationToken,
) {
    let rule = rules.borrow().clone();
    let parent_kind = kinds.parent.clone();
    // Parents come as watch events, never as one LIST response: a list
    // decodes as a whole, so one parent too deep to decode would fail every
    // parent of the kind (see `decode`); events decode one by one.
    let mut parent_config = watcher::Config::default().streaming_lists();
    if let Some(selector) = &rule.rule.spec.parent.selector {
        parent_config = parent_config.labels(&selector_string(selector));
    }
    let (relisted_tx, mut relisted_rx) = tokio::sync::mpsc::unbounded_channel();
    // Only a namespaced parent can have children without its controller
    // ownerReference (in another namespace, or cluster-scoped): the
    // mapper finds those by uid.
    let unowned_children = parent_kind.namespaced
        && (rule.children.iter().any(|c| c.spec.allow_cross_namespace)
            || kinds.children.iter().any(|k| !k.namespaced));
    let parents_by_uid = unowned_children.then(|| Arc::new(ByUid::default()));
    let (parents, parent_stream) = cached_watch(
        &shared.client,
        &parent_kind,
        &namespaces,
        parent_config,
        relisted_tx.clone(),
        {
            let mut trim = trim(&parent_kind.resource);
            move |p: &mut ParentObject| trim(&mut p.object)
        },
        {
            let index = parents_by_uid.clone();
            move |event: &watcher::Event<ParentObject>| {
                if let Some(index) = &index {
                    index.observe(event);
                }
            }
        },
    );

    let related = related::Caches::start(
        &shared.client,
        &rule,
        related::Scope {
            kinds: &kinds.related,
            unserved: &kinds.unserved_related,
            parent_cluster_scoped: !parent_kind.namespaced,
            parent_namespaces: &namespaces,
            operator_namespaces: &shared.namespaces,
            metrics: shared.metrics.clone(),
        },
    );
    for (_, why) in &kinds.unserved_related {
        warn!(rule = %rule.name, "its readers wait: {why}");
    }
    // A deleted parent reads nothing any more. The watch also reports a
    // parent whose labels left the selector as deleted: it may still be
    // there, to release (see `released`).
    let (released_tx, released_rx) = tokio::sync::mpsc::unbounded_channel();
    let forget = {
        let (caches, resource) = (related.caches.clone(), parent_kind.resource.clone());
        let (released, rules) = (released_tx.clone(), rules.clone());
        move |event: &Result<watcher::Event<ParentObject>, watcher::Error>| {
            if let Ok(watcher::Event::Delete(p)) = event {
                caches.forget(&ObjectRef::from_obj_with(p, resource.clone()));
            }
            if let Some(candidate) = super::pass::released::from_event(&rules.borrow(), event) {
                let _ = released.send(candidate);
            }
        }
    };
    let child_labels = format!("{LABEL_RULE}={}", rule.name);
    let owned = shared.shards.as_ref().map(|s| s.owned());
    let mut child_stores = Vec::new();
    let mut controller = Controller::for_stream_with(
        own_errors(
            format!("{} {}", rule.name, parent_kind.gvk),
            parent_stream.inspect(forget).applied_objects(),
        )
        .predicate_filter(
            outside_status,
            kube::runtime::utils::PredicateConfig::default(),
        ),
        parents.clone(),
        parent_kind.resource.clone(),
    );
    for kind in &kinds.children {
        // Children the rule may place anywhere are watched everywhere.
        let anywhere = watches::children_anywhere(&rule, &kind.gvk);
        let scope: &[String] = if anywhere { &[] } else { &namespaces };
        let by_parent = Arc::new(ByParent::default());
        let watches::ChildWatch {
            store,
            stream,
            listed,
        } = watches::cached_child_watch(
            &shared.client,
            kind,
            scope,
            child_labels.clone(),
            owned.clone(),
            relisted_tx.clone(),
            {
                let by_parent = by_parent.clone();
                move |event: &watcher::Event<CompactObject>| by_parent.observe(event)
            },
        );
        child_stores.push(ChildCache {
            kind: kind.clone(),
            store,
            by_parent,
            listed,
        });
        let mapper = triggers::parent_of(parents_by_uid.clone(), parent_kind.clone());
        let objects = own_errors(
            format!("{} {}", rule.name, kind.gvk),
            stream.touched_objects(),
        );
        controller = controller.watches_stream_with(objects, mapper, kind.resource.clone());
    }
    info!(
        rule = %rule.name,
        parent = %parent_kind.gvk,
        children = %kinds.children.iter().map(|c| c.gvk.to_string()).collect::<Vec<_>>().join(", "),
        related = %kinds.related.iter().map(|c| c.gvk.to_string()).collect::<Vec<_>>().join(", "),
        namespaces = %if namespaces.is_empty() { "all".to_owned() } else { namespaces.join(",") },
        "watching"
    );
    drop(relisted_tx);
    // Related events re-reconcile exactly the parents whose reads cover them.
    controller = controller.reconcile_on(related.triggers);
    let (caches_ready, listing) = context::caches_ready(
        child_stores
            .iter()
            .map(|c| context::listed(c.store.clone()))
            .chain(related.ready)
            .collect(),
    );
    let account = rule.rule.spec.service_account_name.as_deref();
    let ctx = Arc::new(RuleCtx {
        writer: shared.identities.client(account),
        account: account.map(|a| shared.identities.username(a)),
        related: related.caches,
        caches_ready,
        stop: stop.clone(),
        rules: rules.clone(),
        kinds,
        shared: shared.clone(),
        children: child_stores,
        parents: parents.clone(),
        released: released_tx,
        failures: Failures::default(),
        outage: Outage::default(),
        warned: Mutex::new(BTreeSet::new()),
        created: Mutex::default(),
        written: Mutex::default(),
        patches: Default::default(),
        versions,
    });
    let mut controller = controller.reconcile_on(triggers::recovered(ctx.clone()));
    if let Some(shards) = &shared.shards {
        controller =
            controller.reconcile_on(triggers::opened_parents(ctx.clone(), shards.writable()));
    }
    // The rollout's moves (and, on the leader, its decisions).
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::unbounded_channel();
    let rollout_task = tokio::spawn(super::rollout::run(ctx.clone(), wake_tx));
    let released_task = tokio::spawn(super::pass::released::run(ctx.clone(), released_rx));
    let controller =
        controller.reconcile_on(futures::stream::poll_fn(move |cx| wake_rx.poll_recv(cx)));
    // A reloaded rule with the same kinds, or a watch that had to relist
    // (its server was gone): re-reconcile every parent at once, backoffs lifted.
    let mut updates = rules;
    updates.borrow_and_update();
    let reloaded = futures::stream::unfold(updates, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    });
    let relisted = futures::stream::poll_fn(move |cx| relisted_rx.poll_recv(cx));
    let lifted = ctx.clone();
    // Taking over as leader likewise: every parent, at once.
    let leading = shared.gate.became_leader();
    let everyone = futures::stream::select(futures::stream::select(reloaded, relisted), leading)
        .map(move |()| {
            lifted.failures.release_all();
            lifted.report_backoff();
        });
    let concurrency = u16::try_from(shared.permits.available_permits()).unwrap_or(u16::MAX);
    let run = controller
        .reconcile_all_on(everyone)
        .with_config(Config::default().concurrency(concurrency))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile::reconcile_measured, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                match err {
                    kube::runtime::controller::Error::ObjectNotFound(_) => {}
                    other => warn!("controller: {other}"),
                }
            }
        });
    // kube's runner waits for the parent cache to be listed before it runs
    // anything, and a graceful shutdown stops the watch that would list it:
    // stopped before the first list, the controller would wait forever.
    // Nothing can be in flight then, so it is dropped instead.
    let unlisted_at_stop = async {
        stop.cancelled().await;
        if parents.wait_until_ready().now_or_never().is_some() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = run => {}
        () = unlisted_at_stop => debug!(rule = %rule.name, "stopped before the parents were listed"),
    }
    listing.abort();
    rollout_task.abort();
    released_task.abort();
}

fn error_policy(parent: Arc<ParentObject>, err: &context::Error, ctx: Arc<RuleCtx>) -> Action {
    if let context::Error::NotLeader(_) = err {
        // Not a failure of the parent: becoming leader reconciles every one.
        return Action::await_change();
    }
    let key = context::parent_key(&parent.object);
    if err.is_outage() {
        let at = ObjectRef::from_obj_with(parent.as_ref(), ctx.kinds.parent.resource.clone());
        ctx.outage.failed((key.clone(), at));
    }
    let delay = ctx.failures.record(
        &key,
        parent.object.metadata.generation,
        std::time::Instant::now(),
    );
    ctx.report_backoff();
    warn!(rule = %ctx.rule().name, parent = %key, retry_in = ?delay, "reconcile failed: {err}");
    Action::requeue(delay)
}
