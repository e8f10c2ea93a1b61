//! A rule running: its watches (the parents, the children of each kind,
//! the related caches) wired into kube's `Controller`, the context its
//! passes share, and what re-reconciles every parent at once. Runs until
//! `stop`; the rule's life around it (kinds, preflight, restarts) is
//! `controller`'s.
//!
//! ```text
//!  parent watch ──(not status)──▶ Controller ◀── child watches (mapped to their parent)
//!                                     ▲  ◀── related triggers, outage recovery, opened buckets
//!  reload / relist / leadership ──────┘ every parent at once, backoffs lifted
//! ```

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::operator::Shared;
use crate::operator::context::{self, ChildCache, RuleCtx};
use crate::operator::leadership::shards::labeller;
use crate::operator::pass::own_writes::OwnWrites;
use crate::operator::pass::reconcile;
use crate::operator::retry::{Failures, Outage};
use crate::operator::rollout::versions::Versions;
use crate::operator::watches::by_uid::ByUid;
use crate::operator::watches::changed::changed_only;
use crate::operator::watches::compact::{ByParent, CompactObject};
use crate::operator::watches::decode::ParentObject;
use crate::operator::watches::discovery::RuleKinds;
use crate::operator::watches::triggers;
use crate::operator::watches::{self, own_errors, related, selector_string, trim};
use crate::plan::LABEL_RULE;
use crate::rules::CompiledRule;
use crate::shard::BucketSet;

/// One event of the parent watch.
type ParentEvent = Result<watcher::Event<ParentObject>, watcher::Error>;

/// What makes a parent worth a pass: anything but its status (and the
/// bookkeeping that changes with it). trellis's own status writes must not
/// wake the parent they were written for.
fn outside_status(parent: &ParentObject) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.undecodable.hash(&mut h);
    let meta = &parent.object.metadata;
    meta.uid.hash(&mut h);
    parent.object.meta_text().hash(&mut h);
    meta.finalizers.hash(&mut h);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut h);
    parent.outside_status_text().hash(&mut h);
    Some(h.finish())
}

pub(super) async fn run_controller(
    rules: watch::Receiver<Arc<CompiledRule>>,
    kinds: RuleKinds,
    namespaces: Vec<String>,
    shared: Arc<Shared>,
    versions: Arc<Versions>,
    stop: CancellationToken,
) {
    let rule = rules.borrow().clone();
    let parent_kind = kinds.parent.clone();
    let (relisted_tx, relisted_rx) = tokio::sync::mpsc::unbounded_channel();
    let (label_tx, label_rx) = tokio::sync::mpsc::unbounded_channel();
    let ParentWatch {
        store: parents,
        stream: parent_stream,
        by_uid: parents_by_uid,
        listed: parents_listed,
    } = watch_parents(
        &rule,
        &kinds,
        &namespaces,
        &shared,
        relisted_tx.clone(),
        label_tx.clone(),
    );
    let labeller = shared.shards.as_ref().map(|_| {
        tokio::spawn(labeller::run(
            labeller::Parents {
                client: shared.client.clone(),
                kind: kinds.parent.clone(),
                namespaces: namespaces.clone(),
                selector: rule.rule.spec.parent.selector.as_ref().map(selector_string),
                gate: shared.gate.clone(),
            },
            label_tx,
            label_rx,
            stop.clone(),
        ))
    });
    let restart = restart_when_parent_cut_changes(&rules, &shared, &stop);
    crate::operator::lock(&shared.parent_caches).insert(rule.name.clone(), parents.clone());
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
            spokes: Some(shared.clusters.clone()),
        },
    );
    for why in &kinds.unserved_related {
        warn!(rule = %rule.name, "its readers wait: {why}");
    }
    let (released_tx, released_rx) = tokio::sync::mpsc::unbounded_channel();
    let written: Arc<context::Written> = Arc::default();
    let forget = on_parent_event(
        &related.caches,
        &parent_kind,
        &rules,
        &released_tx,
        &written,
    );
    let (relisted_parents_tx, mut relisted_parents) = tokio::sync::mpsc::unbounded_channel();
    let mut keep = triggers::after_relists(
        parents.clone(),
        parent_kind.resource.clone(),
        |old, new| outside_status(old) != outside_status(new),
        relisted_parents_tx,
    );
    let mut changed = changed_only(outside_status);
    let parent_stream = parent_stream.inspect(forget).filter(move |event| {
        // Both see every event: each keeps its own account of the parents.
        let (changed, kept) = (changed(event), keep(event));
        std::future::ready(changed && kept)
    });
    let controller = Controller::for_stream_with(
        own_errors(
            format!("{} {}", rule.name, parent_kind.gvk),
            parent_stream.applied_objects(),
        ),
        parents.clone(),
        parent_kind.resource.clone(),
    );
    let spoke_parents = parents_by_uid.clone();
    let controller = controller.reconcile_on(futures::stream::poll_fn(move |cx| {
        relisted_parents.poll_recv(cx)
    }));
    // Shared by the passes (what they wrote) and the child watches (whose
    // events of those writes wake nobody).
    let own = Arc::new(OwnWrites::default());
    let (controller, child_stores) = watch_children(
        controller,
        &rule,
        &kinds,
        &namespaces,
        &shared,
        &relisted_tx,
        parents_by_uid,
        &own,
    );
    log_watching(&rule, &kinds, &namespaces);
    drop(relisted_tx);
    // Related events re-reconcile exactly the parents whose reads cover them.
    let controller = controller.reconcile_on(related.triggers);
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
        account: shared.identities.user_of(&rule),
        related: related.caches,
        caches_ready,
        stop: stop.clone(),
        rules: rules.clone(),
        kinds,
        shared: shared.clone(),
        children: child_stores,
        parents: parents.clone(),
        parents_listed,
        released: released_tx,
        failures: Failures::default(),
        outage: Outage::default(),
        warned: Mutex::new(BTreeSet::new()),
        own: own.clone(),
        written,
        patches: Default::default(),
        versions,
    });
    let mut controller = controller
        .reconcile_on(triggers::recovered(ctx.clone()))
        .reconcile_on(triggers::spoke_children(ctx.clone(), spoke_parents));
    if let Some(shards) = &shared.shards {
        controller =
            controller.reconcile_on(triggers::opened_parents(ctx.clone(), shards.writable()));
    }
    // The rollout's moves (and, on the leader, its decisions).
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::unbounded_channel();
    let rollout_task = tokio::spawn(crate::operator::rollout::run(ctx.clone(), wake_tx));
    let released_task = tokio::spawn(crate::operator::pass::released::run(
        ctx.clone(),
        released_rx,
    ));
    let controller =
        controller.reconcile_on(futures::stream::poll_fn(move |cx| wake_rx.poll_recv(cx)));
    let everyone = every_parent_at_once(rules, relisted_rx, ctx.clone(), &shared);
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
    if let Some(task) = labeller {
        task.abort();
    }
    restart.abort();
    forget_parent_cache(&shared, &rule.name);
    rollout_task.abort();
    released_task.abort();
}

/// What a parent's watch event tells besides the parent itself (seen
/// after the store took it). A deleted parent reads nothing any more; a
/// status written is in the cache once the cache moved past it. The watch also reports a parent whose
/// labels left the selector as deleted: it may still be there, to release
/// (see `released`).
fn on_parent_event(
    caches: &Arc<related::Caches>,
    parent_kind: &crate::operator::watches::discovery::Resolved,
    rules: &watch::Receiver<Arc<CompiledRule>>,
    released: &UnboundedSender<crate::operator::pass::released::Candidate>,
    written: &Arc<context::Written>,
) -> impl FnMut(&ParentEvent) + Send + 'static {
    let (caches, resource) = (caches.clone(), parent_kind.resource.clone());
    let (released, rules, written) = (released.clone(), rules.clone(), written.clone());
    move |event: &ParentEvent| {
        match event {
            Ok(watcher::Event::Delete(p)) => {
                caches.forget(&ObjectRef::from_obj_with(p, resource.clone()));
                context::forget_seen_status(&written, p, true);
            }
            Ok(watcher::Event::Apply(p)) => context::forget_seen_status(&written, p, false),
            _ => {}
        }
        if let Some(candidate) = crate::operator::pass::released::from_event(&rules.borrow(), event)
        {
            let _ = released.send(candidate);
        }
    }
}

/// A stopped rule's parent cache is no longer counted.
fn forget_parent_cache(shared: &Shared, rule: &str) {
    crate::operator::lock(&shared.parent_caches).remove(rule);
    for form in ["full", "stub"] {
        shared
            .metrics
            .parents_cached
            .remove(&crate::telemetry::FormLabel {
                rule: rule.to_owned(),
                form: form.to_owned(),
            });
    }
}

/// One line on what a running rule watches.
fn log_watching(rule: &CompiledRule, kinds: &RuleKinds, namespaces: &[String]) {
    info!(
        rule = %rule.name,
        parent = %kinds.parent.gvk,
        children = %kinds.children.iter().map(|c| c.gvk.to_string()).collect::<Vec<_>>().join(", "),
        related = %kinds.related.iter().map(|c| c.gvk.to_string()).collect::<Vec<_>>().join(", "),
        namespaces = %if namespaces.is_empty() { "all".to_owned() } else { namespaces.join(",") },
        "watching"
    );
}

/// The parent watch: its store, its events, the buckets it holds in full,
/// and (for a namespaced parent whose children may live elsewhere) the
/// parents by uid, for the mapper of children without a controller
/// ownerReference.
struct ParentWatch<S> {
    store: Store<ParentObject>,
    stream: S,
    by_uid: Option<Arc<ByUid>>,
    listed: watch::Receiver<BucketSet>,
}

/// Whether a replica under `--shards` lists only its own buckets' parents
/// (by their bucket label): yes, but for a rule with `rollout:`, whose
/// decisions (the leader's) count every parent.
fn parents_cut(rule: &CompiledRule, shared: &Shared) -> bool {
    shared.shards.is_some() && rule.rollout.is_none()
}

fn watch_parents(
    rule: &CompiledRule,
    kinds: &RuleKinds,
    namespaces: &[String],
    shared: &Shared,
    relisted: UnboundedSender<()>,
    label: labeller::Sender,
) -> ParentWatch<impl Stream<Item = ParentEvent> + Send + 'static> {
    // Parents come as watch events, never as one LIST response: a list
    // decodes as a whole, so one parent too deep to decode would fail every
    // parent of the kind (see `decode`); events decode one by one.
    let mut parent_config = watcher::Config::default().streaming_lists();
    if let Some(selector) = &rule.rule.spec.parent.selector {
        parent_config = parent_config.labels(&selector_string(selector));
    }
    // Only a namespaced parent can have children without its controller
    // ownerReference (in another namespace, or cluster-scoped): the
    // mapper finds those by uid.
    let unowned_children = (kinds.parent.namespaced
        && (rule.children.iter().any(|c| c.spec.allow_cross_namespace)
            || kinds.children.iter().any(|k| !k.namespaced)))
        || rule.children.iter().any(|c| c.cluster.is_some());
    let parents_by_uid = unowned_children.then(|| Arc::new(ByUid::default()));
    let cut = parents_cut(rule, shared);
    let buckets = shared
        .shards
        .as_ref()
        .filter(|_| cut)
        .map(|shards| shards.owned());
    let resource = kinds.parent.resource.clone();
    let watches::BucketWatch {
        store,
        stream,
        listed,
    } = watches::cached_bucket_watch(
        &shared.client,
        watches::BucketScope {
            kind: &kinds.parent,
            namespaces,
            config: parent_config,
            buckets,
            trim: move || {
                let mut trim = trim(&resource);
                move |p: &mut ParentObject| trim(&mut p.object)
            },
        },
        relisted,
        {
            let index = parents_by_uid.clone();
            move |event: &watcher::Event<ParentObject>| {
                if let Some(index) = &index {
                    index.observe(event);
                }
                // Selected by a label that is not its uid's bucket (a
                // copied manifest): labelled again, then its owner's.
                if cut
                    && let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = event
                    && let Some(to) = labeller::mislabelled(&p.object.full_metadata())
                {
                    let _ = label.send(to);
                }
            }
        },
    );
    ParentWatch {
        store,
        stream,
        by_uid: parents_by_uid,
        listed,
    }
}

/// Under `--shards`, a reload that adds or drops `rollout:` changes which
/// parents this replica lists ([`parents_cut`]): the rule's watches start
/// again.
fn restart_when_parent_cut_changes(
    rules: &watch::Receiver<Arc<CompiledRule>>,
    shared: &Arc<Shared>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (mut rules, shared, stop) = (rules.clone(), shared.clone(), stop.clone());
    tokio::spawn(async move {
        let cut = parents_cut(&rules.borrow_and_update(), &shared);
        while rules.changed().await.is_ok() {
            let rule = rules.borrow_and_update().clone();
            if parents_cut(&rule, &shared) != cut {
                info!(rule = %rule.name, "restarting watches: rollout: added or removed changes which parents this replica lists");
                stop.cancel();
                return;
            }
        }
    })
}

/// One watch per child kind, each feeding its cache and waking the parent
/// of a child that changed (not for a version `own` says a pass wrote).
#[allow(clippy::too_many_arguments)]
fn watch_children(
    mut controller: Controller<ParentObject>,
    rule: &CompiledRule,
    kinds: &RuleKinds,
    namespaces: &[String],
    shared: &Shared,
    relisted: &UnboundedSender<()>,
    parents_by_uid: Option<Arc<ByUid>>,
    own: &Arc<OwnWrites>,
) -> (Controller<ParentObject>, Vec<ChildCache>) {
    let child_labels = format!("{LABEL_RULE}={}", rule.name);
    let owned = shared.shards.as_ref().map(|s| s.owned());
    let mut child_stores = Vec::new();
    for kind in &kinds.children {
        // Children the rule may place anywhere are watched everywhere.
        let anywhere = watches::children_anywhere(rule, &kind.gvk);
        let scope: &[String] = if anywhere { &[] } else { namespaces };
        let by_parent = Arc::new(ByParent::default());
        let resource = kind.resource.clone();
        let watches::BucketWatch {
            store,
            stream,
            listed,
        } = watches::cached_bucket_watch(
            &shared.client,
            watches::BucketScope {
                kind,
                namespaces: scope,
                config: watcher::Config::default().labels(&child_labels),
                buckets: owned.clone(),
                trim: move || trim(&resource),
            },
            relisted.clone(),
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
        let mapper = triggers::parent_of(parents_by_uid.clone(), kinds.parent.clone(), own.clone());
        let objects = own_errors(
            format!("{} {}", rule.name, kind.gvk),
            stream.touched_objects(),
        );
        controller = controller.watches_stream_with(objects, mapper, kind.resource.clone());
    }
    (controller, child_stores)
}

/// What re-reconciles every parent at once, backoffs lifted.
fn every_parent_at_once(
    rules: watch::Receiver<Arc<CompiledRule>>,
    mut relisted_rx: UnboundedReceiver<()>,
    ctx: Arc<RuleCtx>,
    shared: &Shared,
) -> impl Stream<Item = ()> + Send + 'static {
    // A reloaded rule with the same kinds, or a watch that had to relist
    // (its server was gone): re-reconcile every parent at once, backoffs lifted.
    let mut updates = rules;
    updates.borrow_and_update();
    let reloaded = futures::stream::unfold(updates, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    });
    let relisted = futures::stream::poll_fn(move |cx| relisted_rx.poll_recv(cx));
    let lifted = ctx;
    // Taking over as leader likewise: every parent, at once.
    let leading = shared.gate.became_leader();
    // A spoke registered, gone, answering again or listed.
    let spokes = triggers::spokes_changed(lifted.clone());
    let all = futures::stream::select(futures::stream::select(reloaded, relisted), leading);
    futures::stream::select(all, spokes).map(move |()| {
        lifted.failures.release_all();
        lifted.report_backoff();
    })
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
