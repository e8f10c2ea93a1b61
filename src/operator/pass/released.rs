//! A parent that stops matching its rule — its labels leave
//! `parent.selector`, or its namespace leaves the rule's `namespaces` — is
//! finalized like a deleted one: its contributions released, its children
//! deleted (retained ones released), trellis's finalizer removed, and a
//! `Released` Event written on it.
//!
//! The parent watch is label-selected, so the API server reports such a
//! parent as deleted, and the controller, which serves only what its cache
//! holds, never sees it again. This task does:
//!
//! ```text
//!  parent watch: Delete ──┐
//!  a pass: out of scope ──┼─▶ waiting ──writable here?──▶ live GET ──gone, other uid, in scope──▶ done
//!  start: sweep (list) ───┘      ▲ no (standby,              │ out of scope
//!                                │  another shard's bucket)  ▼
//!                                └──── every few s ◀── rounds of finalize::remove_children
//!                                                          ──▶ finalizer off ──▶ `Released` Event
//! ```
//!
//! The sweep at the rule's start finds the parents that left while no
//! watch of this rule saw them (trellis down, or a reload that narrowed the
//! selector or the namespaces): it reads the parent kind's metadata, page
//! by page, outside the rule's scope, and keeps those that carry this
//! rule's children or contributions (by parent uid) or trellis's finalizer
//! where this rule sets one; a sweep the API server does not answer is
//! tried again every few seconds. A rule without a selector or namespaces
//! has nothing outside its scope, and lists nothing.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DynamicObject, ListParams};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::finalize::{Removal, release_finalizer, remove_children};
use crate::operator::FINALIZER;
use crate::operator::context::{Error, RuleCtx, parent_key};
use crate::operator::watches::decode::ParentObject;
use crate::rules::CompiledRule;

/// How often parents waiting for this replica to write them are looked at.
const RETRY: Duration = Duration::from_secs(3);
/// At most this many parents wait here; more are dropped with a warning
/// (the next start's sweep finds them again).
const MAX_WAITING: usize = 10_000;
/// The sweep reads the parent kind's metadata in pages of this many.
const PAGE: u32 = 500;
/// How long the sweep waits for one page.
const PAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// A parent that may have left the rule, as last seen.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(in crate::operator) struct Candidate {
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    /// Seen served by this rule (in its cache): released with an Event
    /// even when only the finalizer was left.
    pub served: bool,
}

impl Candidate {
    pub fn of(parent: &impl ResourceExt, served: bool) -> Option<Self> {
        Some(Self {
            namespace: parent.namespace(),
            name: parent.name_any(),
            uid: parent.uid()?,
            served,
        })
    }
}

/// Where a pass or a watch hands a parent that may have left the rule.
pub(in crate::operator) type Sender = mpsc::UnboundedSender<Candidate>;

/// The candidate a parent watch event names. The label-selected watch
/// reports a parent whose labels left the selector as deleted, carrying
/// its state from before the change (so its labels cannot tell): any
/// delete of a rule with a selector is a candidate, but for the last event
/// of a real deletion (marked for deletion, trellis's finalizer already
/// gone), so a deletion through the finalizer costs no read. Without a
/// selector a delete is always a deletion.
pub(in crate::operator) fn from_event(
    rule: &CompiledRule,
    event: &Result<watcher::Event<ParentObject>, watcher::Error>,
) -> Option<Candidate> {
    let Ok(watcher::Event::Delete(p)) = event else {
        return None;
    };
    rule.rule.spec.parent.selector.as_ref()?;
    let meta = &p.object.metadata;
    let finalized = meta.finalizers.iter().flatten().any(|f| f == FINALIZER);
    if meta.deletion_timestamp.is_some() && !finalized {
        return None;
    }
    Candidate::of(&p.object, true)
}

/// Why the rule does not serve a parent, from its metadata (see
/// [`crate::plan::why_not_selected`]); `None` when it does.
pub(in crate::operator) fn why_out(
    rule: &CompiledRule,
    metadata: &kube::api::ObjectMeta,
) -> Option<String> {
    let parent = json!({
        "metadata": {"namespace": metadata.namespace, "labels": metadata.labels}
    });
    crate::plan::why_not_selected(rule, &parent)
}

/// Whether the rule itself ever sets trellis's finalizer on a parent (see
/// `plan::plan`): only then does the finalizer alone say it served one.
fn sets_finalizer(rule: &CompiledRule) -> bool {
    rule.rule.spec.deletion.is_some()
        || !rule.patches.is_empty()
        || rule.retains_children()
        || rule.children.iter().any(|c| c.spec.allow_cross_namespace)
        // A child in a spoke has no ownerReference: the finalizer is on
        // every parent of such a rule.
        || rule.children.iter().any(|c| c.cluster.is_some())
}

/// Runs until the rule stops: releases every candidate it is handed, and
/// those its start-up sweep finds, once this replica may write them.
pub(in crate::operator) async fn run(
    ctx: Arc<RuleCtx>,
    mut candidates: mpsc::UnboundedReceiver<Candidate>,
) {
    let name = ctx.rule().name.clone();
    debug!(rule = %name, "release task: waiting for the caches");
    let mut ready = ctx.caches_ready.clone();
    tokio::select! {
        listed = ready.wait_for(|r| *r) => if listed.is_err() { return },
        () = ctx.stop.cancelled() => return,
    }
    // Not the parents' cache: its first list can take long (a streaming
    // list waits for the API server's watch cache to be fresh), and the
    // sweep asks each parent's scope of its own metadata anyway.
    debug!(rule = %name, "release task: children listed");
    // uid → candidate; one per parent, the served mark kept.
    let mut waiting: BTreeMap<String, Candidate> = BTreeMap::new();
    // A sweep the API server did not answer is tried again at each tick.
    let mut swept = false;
    let mut busy: HashSet<String> = HashSet::new();
    let mut running: JoinSet<(Candidate, Fate)> = JoinSet::new();
    let mut tick = tokio::time::interval(RETRY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = ctx.stop.cancelled() => break,
            c = candidates.recv() => match c {
                Some(c) => add(&mut waiting, c),
                None => break,
            },
            Some(Ok((c, fate))) = running.join_next(), if !running.is_empty() => {
                busy.remove(&c.uid);
                if fate == Fate::Later {
                    add(&mut waiting, c);
                }
            }
            _ = tick.tick() => {}
        }
        while let Ok(c) = candidates.try_recv() {
            add(&mut waiting, c);
        }
        if !swept && let Some(found) = sweep(&ctx).await {
            swept = true;
            for c in found {
                add(&mut waiting, c);
            }
        }
        let due: Vec<String> = waiting
            .keys()
            .filter(|uid| !busy.contains(*uid) && ctx.check_write(uid).is_ok())
            .cloned()
            .collect();
        for uid in due {
            if let Some(c) = waiting.remove(&uid) {
                busy.insert(uid);
                let ctx = ctx.clone();
                running.spawn(async move {
                    let fate = release(&ctx, &c).await;
                    (c, fate)
                });
            }
        }
    }
    running.abort_all();
}

fn add(waiting: &mut BTreeMap<String, Candidate>, c: Candidate) {
    if waiting.len() >= MAX_WAITING && !waiting.contains_key(&c.uid) {
        warn!(parent = %c.name, "more than {MAX_WAITING} parents wait to be released here: this one is left to the next start");
        return;
    }
    let served = waiting.get(&c.uid).is_some_and(|w| w.served) || c.served;
    waiting.insert(c.uid.clone(), Candidate { served, ..c });
}

/// What became of one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Released, gone, replaced, or back in the rule's scope.
    Settled,
    /// Not this replica's to write now, or a write failed: look again.
    Later,
}

/// Releases one parent if it is still there and outside the rule: rounds of
/// [`remove_children`] until nothing is left, then the finalizer.
async fn release(ctx: &RuleCtx, c: &Candidate) -> Fate {
    let kind = &ctx.kinds.parent;
    let api: Api<ParentObject> = kind.api(ctx.shared.client.clone(), c.namespace.as_deref());
    let mut acted = false;
    debug!(rule = %ctx.rule().name, parent = %format!("{}/{}", c.namespace.as_deref().unwrap_or(""), c.name), "releasing a parent that may have left the rule");
    loop {
        if ctx.stop.is_cancelled() || ctx.check_write(&c.uid).is_err() {
            return Fate::Later;
        }
        let parent = match api.get_opt(&c.name).await {
            Ok(Some(p)) => p.to_object(),
            Ok(None) => return Fate::Settled,
            Err(err) => {
                warn!(rule = %ctx.rule().name, parent = %c.name, "cannot read a parent that left the rule: {err}");
                return Fate::Later;
            }
        };
        if parent.uid().as_deref() != Some(c.uid.as_str()) {
            return Fate::Settled;
        }
        let rule = ctx.rule();
        let Some(why) = why_out(&rule, &parent.metadata) else {
            debug!(rule = %rule.name, parent = %parent_key(&parent), "back in the rule's scope");
            return Fate::Settled;
        };
        let result = remove_children(&parent, ctx, &c.uid, "parent left the rule").await;
        match result {
            Ok(Removal::Waiting(after)) => {
                acted = true;
                tokio::select! {
                    () = tokio::time::sleep(after) => continue,
                    () = ctx.stop.cancelled() => return Fate::Later,
                }
            }
            Ok(Removal::Done { acted: a }) => {
                acted |= a;
                let finalized = parent.finalizers().iter().any(|f| f == FINALIZER);
                if finalized && let Err(err) = release_finalizer(ctx, &parent).await {
                    if let Error::NotLeader(_) = err {
                        return Fate::Later;
                    }
                    // Most often a write in between (the patch carries the
                    // resourceVersion): read again.
                    debug!(rule = %rule.name, parent = %parent_key(&parent), "finalizer release refused, reading again: {err}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                ctx.related
                    .forget(&crate::operator::watches::related::parent_ref(
                        &parent,
                        &ctx.kinds.parent.resource,
                    ));
                if acted || (finalized && c.served) {
                    info!(rule = %rule.name, parent = %parent_key(&parent), "released: {why}");
                    let note = format!(
                        "rule {} no longer selects this parent ({why}): its children and contributions were removed",
                        rule.name
                    );
                    ctx.event(&parent, EventType::Normal, "Released", note)
                        .await;
                }
                return Fate::Settled;
            }
            Err(Error::NotLeader(_)) => return Fate::Later,
            Err(err) => {
                warn!(rule = %rule.name, parent = %parent_key(&parent), "releasing a parent that left the rule failed: {err}");
                return Fate::Later;
            }
        }
    }
}

/// The parents outside the rule that still carry something of it: see the
/// module docs. `None` (logged) when the API server did not answer: the
/// caller sweeps again later, so no parent is left behind by an outage.
async fn sweep(ctx: &RuleCtx) -> Option<Vec<Candidate>> {
    let rule = ctx.rule();
    let spec = &rule.rule.spec.parent;
    if spec.selector.is_none() && spec.namespaces.is_empty() {
        return Some(Vec::new());
    }
    let mut named: BTreeSet<String> = ctx.related.contributors(&rule.name).into_iter().collect();
    for cache in &ctx.children {
        named.extend(
            cache
                .store
                .state()
                .iter()
                .filter_map(|c| c.parent_uid().map(str::to_owned)),
        );
    }
    let finalizes = sets_finalizer(&rule);
    if named.is_empty() && !finalizes {
        return Some(Vec::new());
    }
    let kind = &ctx.kinds.parent;
    let scopes: Vec<Option<&String>> = if !kind.namespaced || ctx.shared.namespaces.is_empty() {
        vec![None]
    } else {
        ctx.shared.namespaces.iter().map(Some).collect()
    };
    let mut out = Vec::new();
    for scope in scopes {
        let api: Api<DynamicObject> =
            kind.api(ctx.shared.client.clone(), scope.map(String::as_str));
        let mut params = ListParams::default().limit(PAGE);
        loop {
            debug!(rule = %rule.name, scope = ?scope, "sweeping the parents outside the rule");
            // A request that hangs (a pooled connection the server dropped)
            // must not hold the sweep, and every candidate behind it, for
            // good: given up after PAGE_TIMEOUT and tried again.
            let page = match tokio::time::timeout(PAGE_TIMEOUT, api.list_metadata(&params)).await {
                Ok(Ok(page)) => page,
                Err(_) => {
                    warn!(rule = %rule.name, kind = %kind.gvk, "cannot look for parents that left the rule (trying again in {RETRY:?}): no answer within {PAGE_TIMEOUT:?}");
                    return None;
                }
                Ok(Err(err)) => {
                    warn!(rule = %rule.name, kind = %kind.gvk, "cannot look for parents that left the rule (trying again in {RETRY:?}): {err}");
                    return None;
                }
            };
            for p in &page.items {
                let Some(uid) = p.metadata.uid.as_deref() else {
                    continue;
                };
                if why_out(&rule, &p.metadata).is_none() {
                    continue;
                }
                let finalized = p
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == FINALIZER);
                if named.contains(uid) || (finalizes && finalized) {
                    out.extend(Candidate::of(p, false));
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    if !out.is_empty() {
        info!(rule = %rule.name, parents = out.len(), "found parents that left the rule while it was not watching them");
    }
    debug!(rule = %rule.name, found = ?out.iter().map(|c| format!("{}/{}", c.namespace.as_deref().unwrap_or(""), c.name)).collect::<Vec<_>>(), named = named.len(), "swept the parents outside the rule");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn rule(parent: &str) -> Arc<CompiledRule> {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: r\nspec:\n  parent: {parent}\n  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: 'metadata: {{name: x}}'\n"
        );
        std::fs::write(dir.path().join("r.yaml"), text).unwrap();
        crate::rules::load_dir(dir.path()).unwrap().rules[0].clone()
    }

    fn meta(namespace: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_parent_whose_labels_leave_the_selector_is_out_of_scope_and_says_why() {
        let r = rule(
            "{apiVersion: demo.trellis.dev/v1, kind: Box, selector: {matchLabels: {managed: 'yes'}}}",
        );
        assert_eq!(why_out(&r, &meta("a", &[("managed", "yes")])), None);
        let left = meta("a", &[("managed", "no")]);
        assert_eq!(
            why_out(&r, &left).as_deref(),
            Some("its labels (managed=no) do not match the rule's parent.selector (managed=yes)")
        );
    }

    #[test]
    fn a_parent_outside_the_rules_namespaces_is_out_of_scope_and_says_why() {
        let r = rule("{apiVersion: demo.trellis.dev/v1, kind: Box, namespaces: [a, b]}");
        assert_eq!(why_out(&r, &meta("b", &[])), None);
        let elsewhere = meta("c", &[]);
        assert_eq!(
            why_out(&r, &elsewhere).as_deref(),
            Some("its namespace c is not among the rule's namespaces (a, b)")
        );
    }

    #[test]
    fn a_served_mark_survives_a_later_unserved_sighting() {
        let mut waiting = BTreeMap::new();
        let c = Candidate {
            namespace: Some("a".into()),
            name: "p".into(),
            uid: "u".into(),
            served: true,
        };
        add(&mut waiting, c.clone());
        add(
            &mut waiting,
            Candidate {
                served: false,
                ..c.clone()
            },
        );
        assert_eq!(waiting.get("u"), Some(&c));
    }

    #[test]
    fn only_a_rule_that_sets_the_finalizer_claims_it() {
        let plain = rule("{apiVersion: demo.trellis.dev/v1, kind: Box}");
        assert!(!sets_finalizer(&plain));
    }

    #[test]
    fn a_watch_delete_under_a_selector_is_a_candidate_but_the_end_of_a_finalized_deletion_is_not() {
        let r = rule(
            "{apiVersion: demo.trellis.dev/v1, kind: Box, selector: {matchLabels: {managed: 'yes'}}}",
        );
        let box_labelled = |labels: &str, more: &str| {
            ParentObject::from_json(&format!(
                r#"{{"apiVersion":"demo.trellis.dev/v1","kind":"Box","metadata":{{"name":"p","namespace":"a","uid":"u","labels":{labels}{more}}}}}"#
            ))
            .unwrap()
        };
        // The event carries the state before the labels changed.
        let left = box_labelled(r#"{"managed":"yes"}"#, "");
        let c = from_event(&r, &Ok(watcher::Event::Delete(left.clone()))).unwrap();
        assert_eq!(
            (c.name.as_str(), c.uid.as_str(), c.served),
            ("p", "u", true)
        );
        assert!(from_event(&r, &Ok(watcher::Event::Apply(left))).is_none());
        // The last event of a deletion through the finalizer.
        let deleted = box_labelled(
            r#"{"managed":"yes"}"#,
            r#","deletionTimestamp":"2026-12-04T00:00:00Z","finalizers":[]"#,
        );
        assert!(from_event(&r, &Ok(watcher::Event::Delete(deleted))).is_none());
        // Without a selector, a delete is a deletion.
        let plain = rule("{apiVersion: demo.trellis.dev/v1, kind: Box}");
        let gone = box_labelled("{}", "");
        assert!(from_event(&plain, &Ok(watcher::Event::Delete(gone))).is_none());
    }
}
