//! The running rule set: starts, stops, restarts and updates rule
//! controllers as reloads demand, and cleans up after what a reload took
//! away: `onRuleRemoved` for a removed rule (or a rule's old parent kind),
//! deletion for children of a kind a rule no longer declares. Cleanup stays
//! within the namespaces the rule was watched in.
//!
//! Cleanup reads parents and children with the watch's tolerant decode
//! ([`ParentObject`]): it needs only their metadata, and one parent nested
//! too deep to decode must not fail the list of every other parent (nor a
//! response to a write on that parent read as a failed write).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::{
    DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::watches::decode::ParentObject;
use super::watches::discovery::{Resolved, RuleKinds};
use super::{FINALIZER, Shared, controller, watches::discovery};
use crate::plan::{LABEL_PARENT_UID, LABEL_RULE};
use crate::reload::{self, Change};
use crate::rules::model::OnRuleRemoved;
use crate::rules::{CompiledRule, RuleSet};
use spokes::{spoke_kinds_dropped, spokes_then_finalizers};

mod pending;
mod spokes;

struct Running {
    rule_tx: watch::Sender<Arc<CompiledRule>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

pub struct Supervisor {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    running: BTreeMap<String, Running>,
    current: RuleSet,
}

impl Supervisor {
    pub fn new(shared: Arc<Shared>, shutdown: CancellationToken) -> Self {
        // Spoke cleanups a previous process (or leader) left unfinished.
        pending::resume_when_leading(shared.clone(), shutdown.clone());
        Supervisor {
            shared,
            shutdown,
            running: BTreeMap::new(),
            current: RuleSet::default(),
        }
    }

    pub fn current(&self) -> &RuleSet {
        &self.current
    }

    fn start(&mut self, rule: Arc<CompiledRule>) {
        let (rule_tx, rule_rx) = watch::channel(rule.clone());
        let stop = self.shutdown.child_token();
        let task = controller::spawn(rule_rx, self.shared.clone(), stop.clone());
        self.running.insert(
            rule.name.clone(),
            Running {
                rule_tx,
                stop,
                task,
            },
        );
    }

    /// Stops a rule's watches and waits for in-flight reconciles.
    async fn stop(&mut self, name: &str) {
        if let Some(running) = self.running.remove(name) {
            running.stop.cancel();
            if let Err(err) = running.task.await {
                warn!(rule = %name, "rule task ended abnormally: {err}");
            }
        }
        self.shared.set_rule_state(name, None);
    }

    /// Makes `new` the running set: only what changed is touched.
    pub async fn apply(&mut self, new: RuleSet) {
        let changes = reload::diff(&self.current, &new);
        for (name, change) in &changes {
            match change {
                Change::Start => {
                    info!(rule = %name, "rule added: starting");
                    if let Some(rule) = new.get(name) {
                        self.start(rule.clone());
                    }
                }
                Change::Stop => {
                    info!(rule = %name, "rule removed: stopping");
                    self.stop(name).await;
                    if let Some(old) = self.current.get(name).cloned() {
                        on_rule_removed(&self.shared, &old, &self.shutdown).await;
                        delete_revisions(&self.shared, &old).await;
                    }
                }
                Change::Restart => {
                    info!(rule = %name, "rule's kinds changed: restarting its watches");
                    self.stop(name).await;
                    if let (Some(old), Some(rule)) = (self.current.get(name), new.get(name)) {
                        on_rule_restarted(&self.shared, old, rule, &self.shutdown).await;
                    }
                    if let Some(rule) = new.get(name) {
                        self.start(rule.clone());
                    }
                }
                Change::Update => {
                    info!(rule = %name, "rule changed: re-reconciling its parents");
                    if let (Some(old), Some(rule)) = (self.current.get(name), new.get(name)) {
                        spoke_kinds_dropped(&self.shared, old, rule, &self.shutdown);
                    }
                    match (self.running.get(name), new.get(name)) {
                        (Some(running), Some(rule)) => {
                            running.rule_tx.send_replace(rule.clone());
                        }
                        (None, Some(rule)) => self.start(rule.clone()),
                        _ => {}
                    }
                }
            }
        }
        self.current = new;
    }

    /// Waits for every rule task after `shutdown` was cancelled.
    pub async fn join(mut self) {
        for (name, running) in std::mem::take(&mut self.running) {
            running.stop.cancel();
            if let Err(err) = running.task.await {
                warn!(rule = %name, "rule task ended abnormally: {err}");
            }
        }
    }
}

/// A removed rule's parents and children: `orphan` leaves the children and
/// releases trellis's finalizer; `delete` deletes the children trellis
/// created, then releases the finalizer. The finalizer is always released,
/// or parents being deleted would hang forever. Only parents in the
/// namespaces this operator watches for the rule are touched, and only
/// children of those parents: another instance may run the same rule
/// elsewhere. Children in spokes go first, by a task that waits for
/// spokes that do not answer ([`spokes_then_finalizers`]).
async fn on_rule_removed(
    shared: &Arc<Shared>,
    rule: &Arc<CompiledRule>,
    shutdown: &CancellationToken,
) {
    let Some((kinds, parents)) = rule_parents(shared, rule).await else {
        return;
    };
    // Retained children are released whatever onRuleRemoved says, and
    // with `delete` the parents' patch contributions too.
    let delete = rule.rule.spec.on_rule_removed == OnRuleRemoved::Delete;
    super::pass::release::after_rule_removed(shared, rule, &kinds, &parents, delete).await;
    if delete {
        let reason = "rule removed, onRuleRemoved: delete";
        delete_children(shared, rule, &kinds.children, &parents, reason).await;
    }
    if rule.children.iter().any(|c| c.cluster.is_some()) {
        pending::remember(shared, rule, pending::Cleanup::Removed).await;
        let task =
            spokes_then_finalizers(shared.clone(), rule.clone(), kinds.parent, parents, delete);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = task => {}
                () = shutdown.cancelled() => {}
            }
        });
        return;
    }
    for parent in &parents {
        release_finalizer(shared, rule, &kinds.parent, parent).await;
    }
}

/// A removed rule's revision ConfigMaps (`rollout:`): no version of it
/// runs any more. The leader's duty, like the rest of the cleanup.
async fn delete_revisions(shared: &Shared, rule: &CompiledRule) {
    if !shared.gate.may_write() {
        return;
    }
    let ns = shared.operator_namespace.as_str();
    match super::rollout::versions::delete_all(&shared.client, ns, &rule.name).await {
        Ok(0) => {}
        Ok(deleted) => {
            info!(rule = %rule.name, deleted, namespace = ns, "rule removed: its revision ConfigMaps deleted")
        }
        Err(err) => {
            warn!(rule = %rule.name, namespace = ns, "rule removed: cannot delete its revision ConfigMaps: {err}")
        }
    }
}

/// A restarted rule: when its parent kind changed, the old kind's parents
/// lose their rule (`onRuleRemoved`); children of a kind the rule no longer
/// declares are deleted, as the new watches will never see them to prune.
async fn on_rule_restarted(
    shared: &Arc<Shared>,
    old: &Arc<CompiledRule>,
    new: &CompiledRule,
    shutdown: &CancellationToken,
) {
    if old.parent != new.parent {
        info!(rule = %old.name, parent = %old.parent, "rule moved to another parent kind: onRuleRemoved for the old one");
        on_rule_removed(shared, old, shutdown).await;
        return;
    }
    spoke_kinds_dropped(shared, old, new, shutdown);
    let kept = |gvk: &crate::kinds::Gvk| new.patches.iter().any(|p| &p.gvk == gvk);
    let patches_dropped = old.patches.iter().any(|p| !kept(&p.gvk));
    if old
        .children
        .iter()
        .all(|c| new.children.iter().any(|n| n.gvk == c.gvk))
        && !patches_dropped
    {
        return;
    }
    if new.rollout.is_some() {
        // A staged rollout: parents still on a version with that kind keep
        // their children; each one's pass on the new version prunes them
        // (the kinds of the versions in use stay watched).
        info!(rule = %new.name, "a child kind left the rule: pruned from each parent as it moves to the new version");
        return;
    }
    let Some((kinds, parents)) = rule_parents(shared, old).await else {
        return;
    };
    // Targets of a kind the rule no longer patches are not watched any more:
    // their contributions are released now.
    let unpatched: Vec<Resolved> = kinds
        .related
        .iter()
        .filter(|k| old.patches.iter().any(|p| p.gvk == k.gvk) && !kept(&k.gvk))
        .cloned()
        .collect();
    super::pass::release::release_contributions(shared, old, &unpatched, &parents).await;
    let dropped: Vec<Resolved> = kinds
        .children
        .into_iter()
        .filter(|k| !new.children.iter().any(|c| c.gvk == k.gvk))
        .collect();
    let reason = "child kind removed from the rule";
    delete_children(shared, old, &dropped, &parents, reason).await;
}

/// The rule's kinds and its parents in the namespaces it was watched in;
/// `None` (logged) when they cannot be had.
async fn rule_parents(
    shared: &Shared,
    rule: &CompiledRule,
) -> Option<(RuleKinds, Vec<DynamicObject>)> {
    let kinds = match discovery::resolve_rule(&shared.client, rule).await {
        Ok(kinds) => kinds,
        Err(why) => {
            warn!(rule = %rule.name, "cannot clean up after the rule: {why}");
            return None;
        }
    };
    let scopes = scopes(rule, &shared.namespaces);
    match list_in(shared, &kinds.parent, &scopes, &ListParams::default()).await {
        Ok(parents) => Some((kinds, parents)),
        Err(err) => {
            warn!(rule = %rule.name, "cannot list parents to clean up: {err}");
            None
        }
    }
}

/// Where the rule's parents were watched: one entry per namespace, or a
/// single `None` for all namespaces. Empty when the rule never ran (its
/// namespaces and the operator's do not meet).
pub(super) fn scopes(rule: &CompiledRule, operator: &[String]) -> Vec<Option<String>> {
    match controller::effective_namespaces(rule, operator) {
        Ok(namespaces) if namespaces.is_empty() => vec![None],
        Ok(namespaces) => namespaces.into_iter().map(Some).collect(),
        // Outside the operator's namespaces: the rule never touched anything.
        Err(_) => Vec::new(),
    }
}

/// Lists `kind` in each of `scopes` (a cluster-scoped kind: once, everywhere;
/// no scopes: nothing).
pub(super) async fn list_in(
    shared: &Shared,
    kind: &Resolved,
    scopes: &[Option<String>],
    params: &ListParams,
) -> Result<Vec<DynamicObject>, kube::Error> {
    if scopes.is_empty() {
        return Ok(Vec::new());
    }
    let objects = |list: kube::core::ObjectList<ParentObject>| {
        list.items.into_iter().map(|p| {
            if let Some(why) = &p.undecodable {
                info!(kind = %kind.gvk, name = %p.object.name_any(), "cleanup reads only the metadata of an undecodable object: {why}");
            }
            p.to_object()
        })
    };
    if !kind.namespaced || scopes.contains(&None) {
        let api: Api<ParentObject> = kind.api(shared.client.clone(), None);
        return Ok(objects(api.list(params).await?).collect());
    }
    let mut out = Vec::new();
    for ns in scopes.iter().flatten() {
        let api: Api<ParentObject> = kind.api(shared.client.clone(), Some(ns));
        out.extend(objects(api.list(params).await?));
    }
    Ok(out)
}

/// An `Api` whose responses decode tolerantly (see the module docs).
fn api_for(shared: &Shared, kind: &Resolved, obj: &DynamicObject) -> Api<ParentObject> {
    api_on(&shared.client, kind, obj)
}

/// Like [`api_for`], on `client` (a rule's account's, for its children).
fn api_on(client: &kube::Client, kind: &Resolved, obj: &DynamicObject) -> Api<ParentObject> {
    kind.api(client.clone(), obj.namespace().as_deref())
}

/// Deletes the rule's children of `kinds` that belong to `parents`.
async fn delete_children(
    shared: &Shared,
    rule: &CompiledRule,
    kinds: &[Resolved],
    parents: &[DynamicObject],
    reason: &str,
) {
    let uids: BTreeSet<String> = parents.iter().filter_map(|p| p.uid()).collect();
    if uids.is_empty() {
        return;
    }
    if !shared.gate.may_write() {
        info!(rule = %rule.name, "not the leader: cleanup ({reason}) left to the leader");
        return;
    }
    let selector = ListParams::default().labels(&format!("{LABEL_RULE}={}", rule.name));
    let writer = shared
        .identities
        .client(rule.rule.spec.service_account_name.as_deref());
    for kind in kinds {
        // Children the rule may place anywhere are looked for everywhere.
        let anywhere = super::watches::children_anywhere(rule, &kind.gvk);
        let scopes = if anywhere {
            vec![None]
        } else {
            scopes(rule, &shared.namespaces)
        };
        let list = match list_in(shared, kind, &scopes, &selector).await {
            Ok(list) => list,
            Err(err) => {
                warn!(rule = %rule.name, kind = %kind.gvk, "cannot list children to delete: {err}");
                continue;
            }
        };
        let theirs = list.into_iter().filter(|c| {
            c.labels()
                .get(LABEL_PARENT_UID)
                .is_some_and(|uid| uids.contains(uid))
        });
        for child in theirs {
            if shared.gate.check().is_err() {
                return;
            }
            // A retained child is released, never deleted.
            if child
                .labels()
                .get(crate::plan::LABEL_DELETION_POLICY)
                .map(String::as_str)
                == Some(crate::plan::RETAIN)
            {
                let api: Api<DynamicObject> =
                    kind.api(writer.clone(), child.namespace().as_deref());
                if let Err(err) = super::pass::release::release_child(&api, &child.name_any()).await
                {
                    warn!(rule = %rule.name, name = %child.name_any(), "cannot release retained child: {err}");
                }
                continue;
            }
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                preconditions: child.uid().map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            // A child write: as the rule's account, when it has one.
            match api_on(&writer, kind, &child)
                .delete(&child.name_any(), &params)
                .await
            {
                Ok(_) => {
                    info!(rule = %rule.name, kind = %kind.gvk, name = %child.name_any(), "deleted ({reason})")
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(err) => {
                    warn!(rule = %rule.name, name = %child.name_any(), "cannot delete child: {err}")
                }
            }
        }
    }
}

/// Removes trellis's finalizer from one parent, re-reading it when a
/// concurrent write wins (a finalizer left behind would hang its deletion).
async fn release_finalizer(
    shared: &Shared,
    rule: &CompiledRule,
    kind: &Resolved,
    parent: &DynamicObject,
) {
    let api = api_for(shared, kind, parent);
    let name = parent.name_any();
    let mut current = parent.clone();
    for _ in 0..5 {
        if !current.finalizers().iter().any(|f| f == FINALIZER) {
            return;
        }
        if !shared.gate.may_write() {
            info!(rule = %rule.name, parent = %name, "not the leader: finalizer left to the leader");
            return;
        }
        let rest: Vec<&String> = current
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .collect();
        let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": current.resource_version()}});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(rule = %rule.name, parent = %name, "finalizer released (rule removed)");
                return;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(kube::Error::Api(e)) if e.code == 409 => match api.get_opt(&name).await {
                Ok(Some(fresh)) => current = fresh.to_object(),
                Ok(None) => return,
                Err(err) => {
                    warn!(rule = %rule.name, parent = %name, "cannot release finalizer: {err}");
                    return;
                }
            },
            Err(err) => {
                warn!(rule = %rule.name, parent = %name, "cannot release finalizer: {err}");
                return;
            }
        }
    }
    warn!(rule = %rule.name, parent = %name, "cannot release finalizer: it keeps changing under us");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(namespaces: &str) -> Arc<CompiledRule> {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: r\nspec:\n  parent: {{apiVersion: demo.trellis.dev/v1, kind: A, namespaces: {namespaces}}}\n  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: 'metadata: {{name: x}}'\n"
        );
        std::fs::write(dir.path().join("r.yaml"), text).unwrap();
        crate::rules::load_dir(dir.path()).unwrap().rules[0].clone()
    }

    fn ns(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn cleanup_stays_in_the_namespaces_the_rule_was_watched_in() {
        assert_eq!(scopes(&rule("[]"), &[]), vec![None]);
        assert_eq!(
            scopes(&rule("[]"), &ns(&["a", "b"])),
            vec![Some("a".to_owned()), Some("b".to_owned())]
        );
        assert_eq!(
            scopes(&rule("[b, c]"), &[]),
            vec![Some("b".to_owned()), Some("c".to_owned())]
        );
        assert_eq!(
            scopes(&rule("[b, c]"), &ns(&["a", "b"])),
            vec![Some("b".to_owned())]
        );
        assert!(
            scopes(&rule("[c]"), &ns(&["a"])).is_empty(),
            "a rule that never ran cleans up nowhere"
        );
    }
}
