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

use futures::{FutureExt, StreamExt, future};
use k8s_openapi::api::authorization::v1::{SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::api::PostParams;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::Shared;
use super::access;
use super::by_uid::ByUid;
use super::compact::{ByParent, CompactObject};
use super::context::{self, ChildCache, RuleCtx};
use super::decode::ParentObject;
use super::discovery::{self, Resolved, RuleKinds};
use super::identity;
use super::reconcile;
use super::related;
use super::retry::{Failures, Outage, WatchBackoff};
use super::versions::Versions;
use crate::plan::LABEL_RULE;
use crate::rules::CompiledRule;
use crate::rules::model::{LabelSelector, SelectorOperator};
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
/// needs (where [`access::checks`] says it is used); returns what is missing.
async fn preflight(
    shared: &Shared,
    rule: &CompiledRule,
    kinds: &RuleKinds,
    namespaces: &[String],
) -> Vec<String> {
    let api: Api<SelfSubjectAccessReview> = Api::all(shared.client.clone());
    let checks = access::checks(
        crate::rbac::rule_permissions(rule),
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

/// `matchLabels`/`matchExpressions` as a label selector string.
pub fn selector_string(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for req in &selector.match_expressions {
        let values = req.values.join(",");
        parts.push(match req.operator {
            SelectorOperator::In => format!("{} in ({values})", req.key),
            SelectorOperator::NotIn => format!("{} notin ({values})", req.key),
            SelectorOperator::Exists => req.key.clone(),
            SelectorOperator::DoesNotExist => format!("!{}", req.key),
        });
    }
    parts.join(",")
}

/// Drops what the planner never reads before it reaches a cache, and fills
/// in apiVersion/kind, which list responses leave out of their items.
pub(super) fn trim(
    resource: &kube::discovery::ApiResource,
) -> impl FnMut(&mut CompactObject) + Send + 'static {
    let types = kube::core::TypeMeta {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
    };
    move |obj: &mut CompactObject| {
        obj.metadata.managed_fields = None;
        if let Some(a) = obj.metadata.annotations.as_mut() {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
        obj.types = Some(types.clone());
    }
}

/// A cache of one kind: a watch (one namespace, or all and filtered) feeding a store.
fn cached_watch<K>(
    client: &Client,
    kind: &Resolved,
    namespaces: &[String],
    config: watcher::Config,
    relisted: tokio::sync::mpsc::UnboundedSender<()>,
    trim: impl FnMut(&mut K) + Send + 'static,
    observe: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Resource<
            DynamicType = super::decode::SharedResource,
            Scope = kube::core::DynamicResourceScope,
        > + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let writer = Writer::new(kind.resource.clone());
    let store = writer.as_reader();
    let stream = observed_then_stored(
        watch_stream(client, kind, namespaces, config, trim),
        writer,
        observe,
    )
    .inspect(relist_signal(relisted));
    (store, stream)
}

/// Feeds each event to `observe` (an index of the store) before the store
/// takes it: the store's readiness wakes the reconciles, on other threads,
/// and an index still swapping in its first list would tell them a listed
/// child does not exist (a restart that found everything in place flapped
/// Ready to False and back).
fn observed_then_stored<K, S>(
    stream: S,
    writer: Writer<K>,
    mut observe: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    stream
        .inspect(move |event| {
            if let Ok(event) = event {
                observe(event);
            }
        })
        .reflect(writer)
}

/// A watch of one kind (one namespace, or all and filtered to `namespaces`),
/// with its own backoff and `trim` applied to every object.
pub(super) fn watch_stream<K>(
    client: &Client,
    kind: &Resolved,
    namespaces: &[String],
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<
            DynamicType = super::decode::SharedResource,
            Scope = kube::core::DynamicResourceScope,
        > + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = match (kind.namespaced, namespaces) {
        (true, [one]) => Api::namespaced_with(client.clone(), one, &kind.resource),
        _ => Api::all_with(client.clone(), &kind.resource),
    };
    let keep: Option<BTreeSet<String>> =
        (kind.namespaced && namespaces.len() > 1).then(|| namespaces.iter().cloned().collect());
    watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(trim)
        .filter(move |event| {
            let pass = match (&keep, event) {
                (
                    Some(keep),
                    Ok(
                        watcher::Event::Apply(o)
                        | watcher::Event::InitApply(o)
                        | watcher::Event::Delete(o),
                    ),
                ) => o.namespace().is_some_and(|ns| keep.contains(&ns)),
                _ => true,
            };
            future::ready(pass)
        })
}

/// Signals every relist after the first. A relist (after a 410 Gone, say)
/// replaces the cache but reports no deletions, so a child deleted while the
/// watch was down would only come back at the next resync: the rule's
/// parents are all re-reconciled instead.
fn relist_signal<K, E>(
    relisted: tokio::sync::mpsc::UnboundedSender<()>,
) -> impl FnMut(&Result<watcher::Event<K>, E>) {
    let mut listed_before = false;
    move |event| {
        if let Ok(watcher::Event::InitDone) = event {
            if listed_before {
                let _ = relisted.send(());
            }
            listed_before = true;
        }
    }
}

/// A watch's errors stay with that watch: logged here, and retried by its
/// own backoff ([`WatchBackoff`]). Passed on, they would reach the
/// controller's trigger stream, whose one backoff pauses *every* watch of
/// the rule, growing to 30 s, on any one watch's error.
pub(super) fn own_errors<K: Send + 'static>(
    what: String,
    stream: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    stream.filter(move |item| {
        if let Err(err) = item {
            warn!(watch = %what, "watch failed, retrying: {err}");
        }
        future::ready(item.is_ok())
    })
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
    let stored = super::versions::list(&shared.client, &shared.operator_namespace, &rule.name)
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
    // A deleted parent reads nothing any more.
    let forget = {
        let (caches, resource) = (related.caches.clone(), parent_kind.resource.clone());
        move |event: &Result<watcher::Event<ParentObject>, watcher::Error>| {
            if let Ok(watcher::Event::Delete(p)) = event {
                caches.forget(&ObjectRef::from_obj_with(p, resource.clone()));
            }
        }
    };
    let child_config = watcher::Config::default().labels(&format!("{LABEL_RULE}={}", rule.name));
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
        let anywhere = rule
            .children
            .iter()
            .any(|c| c.gvk == kind.gvk && c.spec.allow_cross_namespace);
        let scope: &[String] = if anywhere { &[] } else { &namespaces };
        let by_parent = Arc::new(ByParent::default());
        let (store, stream) = cached_watch(
            &shared.client,
            kind,
            scope,
            child_config.clone(),
            relisted_tx.clone(),
            trim(&kind.resource),
            {
                let by_parent = by_parent.clone();
                move |event: &watcher::Event<CompactObject>| by_parent.observe(event)
            },
        );
        child_stores.push(ChildCache {
            kind: kind.clone(),
            store,
            by_parent,
        });
        let mapper = parent_of(parents_by_uid.clone(), parent_kind.clone());
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
        failures: Failures::default(),
        outage: Outage::default(),
        warned: Mutex::new(BTreeSet::new()),
        created: Mutex::default(),
        written: Mutex::default(),
        patches: Default::default(),
        versions,
    });
    let controller = controller.reconcile_on(recovered(ctx.clone()));
    // The rollout's moves (and, on the leader, its decisions).
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::unbounded_channel();
    let rollout_task = tokio::spawn(super::rollout::run(ctx.clone(), wake_tx));
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
}

/// Maps a child event to its parent: the controller ownerReference when it
/// points at the parent kind, else the `trellis.dev/parent-uid` label
/// looked up in `by_uid` (kept only for a rule whose children may have
/// no such ownerReference).
fn parent_of(
    by_uid: Option<Arc<ByUid>>,
    parent: Resolved,
) -> impl Fn(CompactObject) -> Option<ObjectRef<ParentObject>> + Send + Sync + 'static {
    move |child: CompactObject| {
        let owner = child.owner_references().iter().find(|r| {
            r.controller == Some(true)
                && r.kind == parent.gvk.kind
                && r.api_version == parent.gvk.api_version()
        });
        if let Some(owner) = owner {
            let r = ObjectRef::new_with(&owner.name, parent.resource.clone());
            return Some(match (parent.namespaced, child.namespace()) {
                (true, Some(ns)) => r.within(&ns),
                _ => r,
            });
        }
        let (namespace, name) = by_uid.as_ref()?.get(child.parent_uid()?)?;
        let r = ObjectRef::new_with(&name, parent.resource.clone());
        Some(match namespace {
            Some(ns) => r.within(&ns),
            None => r,
        })
    }
}

/// Parents whose pass failed while the API server could not serve,
/// handed back with their holds lifted as soon as it serves again (see
/// [`Outage`]): a watch that resumes after the outage brings them nothing.
fn recovered(ctx: Arc<RuleCtx>) -> impl futures::Stream<Item = ObjectRef<ParentObject>> + Send {
    futures::stream::unfold(ctx, |ctx| async move {
        let client = ctx.shared.client.clone();
        let failed = ctx
            .outage
            .recovered(WatchBackoff::default, || serving(client.clone()))
            .await;
        info!(rule = %ctx.rule().name, parents = failed.len(), "the API server serves again: retrying the parents that failed meanwhile");
        for (key, _) in &failed {
            ctx.failures.release(key);
        }
        ctx.report_backoff();
        let parents: Vec<_> = failed.into_iter().map(|(_, at)| at).collect();
        Some((futures::stream::iter(parents), ctx))
    })
    .flatten()
}

/// Whether the API server serves: `/readyz` answers (it checks etcd). Any
/// other answer that is not the server's failure (a 403 where `/readyz` is
/// not granted) counts as serving too: it was reached.
async fn serving(client: Client) -> bool {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    match client.request_text(request).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) => status.code < 500 && status.code != 429,
        Err(_) => false,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::model::LabelSelectorRequirement;

    #[test]
    fn builds_label_selector_strings() {
        let selector = LabelSelector {
            match_labels: [("tier".to_owned(), "web".to_owned())].into(),
            match_expressions: vec![
                LabelSelectorRequirement {
                    key: "env".into(),
                    operator: SelectorOperator::In,
                    values: vec!["a".into(), "b".into()],
                },
                LabelSelectorRequirement {
                    key: "legacy".into(),
                    operator: SelectorOperator::DoesNotExist,
                    values: vec![],
                },
            ],
        };
        assert_eq!(selector_string(&selector), "tier=web,env in (a,b),!legacy");
    }

    /// What a pass woken by the store's readiness reads of the index: the
    /// waker runs inside the store's `InitDone`, as a reconcile on another
    /// thread may.
    struct WokenReader {
        index: Arc<ByParent>,
        seen: Mutex<Option<Vec<super::super::compact::ChildName>>>,
    }

    impl futures::task::ArcWake for WokenReader {
        fn wake_by_ref(me: &Arc<Self>) {
            *super::super::lock(&me.seen) = Some(me.index.of("p1"));
        }
    }

    #[test]
    fn the_children_index_holds_the_first_list_when_the_store_wakes_its_readers() {
        let resource =
            kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let writer = Writer::<CompactObject>::new(resource.into());
        let store = writer.as_reader();
        let reader = Arc::new(WokenReader {
            index: Arc::new(ByParent::default()),
            seen: Mutex::new(None),
        });
        let mut ready = Box::pin(store.wait_until_ready());
        let waker = futures::task::waker(reader.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(ready.as_mut().poll(&mut cx).is_pending());

        let child = CompactObject::from_json(
            r#"{"metadata":{"name":"p-config","namespace":"a",
                "labels":{"trellis.dev/parent-uid":"p1"}}}"#,
        )
        .expect("decodes");
        let events = futures::stream::iter([
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(child)),
            Ok(watcher::Event::InitDone),
        ]);
        let index = reader.index.clone();
        let stream = observed_then_stored(events, writer, move |e: &watcher::Event<_>| {
            index.observe(e)
        });
        futures::executor::block_on(stream.for_each(|_| future::ready(())));

        assert!(ready.as_mut().poll(&mut cx).is_ready());
        assert_eq!(
            *super::super::lock(&reader.seen),
            Some(vec![(Some("a".to_owned()), "p-config".to_owned())]),
            "a pass woken by the store's readiness must find the listed child in the index"
        );
    }
}
