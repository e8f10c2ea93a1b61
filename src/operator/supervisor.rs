//! The running rule set: starts, stops, restarts and updates rule
//! controllers as reloads demand, and carries out `onRuleRemoved`.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PropagationPolicy};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{FINALIZER, Shared, controller, discovery};
use crate::plan::LABEL_RULE;
use crate::reload::{self, Change};
use crate::rules::model::OnRuleRemoved;
use crate::rules::{CompiledRule, RuleSet};

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
                        on_rule_removed(&self.shared, &old).await;
                    }
                }
                Change::Restart => {
                    info!(rule = %name, "rule's kinds changed: restarting its watches");
                    self.stop(name).await;
                    if let Some(rule) = new.get(name) {
                        self.start(rule.clone());
                    }
                }
                Change::Update => {
                    info!(rule = %name, "rule changed: re-reconciling its parents");
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
/// or parents being deleted would hang forever.
async fn on_rule_removed(shared: &Shared, rule: &CompiledRule) {
    let policy = rule.rule.spec.on_rule_removed;
    let kinds = match discovery::resolve_rule(&shared.client, rule).await {
        Ok(kinds) => kinds,
        Err(why) => {
            warn!(rule = %rule.name, "cannot clean up after the removed rule: {why}");
            return;
        }
    };
    if policy == OnRuleRemoved::Delete {
        let selector = ListParams::default().labels(&format!("{LABEL_RULE}={}", rule.name));
        for kind in &kinds.children {
            let api: Api<DynamicObject> = Api::all_with(shared.client.clone(), &kind.resource);
            let list = match api.list(&selector).await {
                Ok(list) => list,
                Err(err) => {
                    warn!(rule = %rule.name, kind = %kind.gvk, "cannot list children to delete: {err}");
                    continue;
                }
            };
            for child in list {
                let api: Api<DynamicObject> = match child.namespace() {
                    Some(ns) if kind.namespaced => {
                        Api::namespaced_with(shared.client.clone(), &ns, &kind.resource)
                    }
                    _ => Api::all_with(shared.client.clone(), &kind.resource),
                };
                let params = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Background),
                    ..DeleteParams::default()
                };
                match api.delete(&child.name_any(), &params).await {
                    Ok(_) => {
                        info!(rule = %rule.name, kind = %kind.gvk, name = %child.name_any(), "deleted (rule removed, onRuleRemoved: delete)")
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(err) => {
                        warn!(rule = %rule.name, name = %child.name_any(), "cannot delete child: {err}")
                    }
                }
            }
        }
    }
    let parents: Api<DynamicObject> = Api::all_with(shared.client.clone(), &kinds.parent.resource);
    let list = match parents.list(&ListParams::default()).await {
        Ok(list) => list,
        Err(err) => {
            warn!(rule = %rule.name, "cannot list parents to release finalizers: {err}");
            return;
        }
    };
    for parent in list {
        if !parent.finalizers().iter().any(|f| f == FINALIZER) {
            continue;
        }
        let rest: Vec<&String> = parent
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .collect();
        let patch =
            json!({"metadata": {"finalizers": rest, "resourceVersion": parent.resource_version()}});
        let api: Api<DynamicObject> = match parent.namespace() {
            Some(ns) => Api::namespaced_with(shared.client.clone(), &ns, &kinds.parent.resource),
            None => Api::all_with(shared.client.clone(), &kinds.parent.resource),
        };
        match api
            .patch(
                &parent.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                info!(rule = %rule.name, parent = %parent.name_any(), "finalizer released (rule removed)")
            }
            Err(err) => {
                warn!(rule = %rule.name, parent = %parent.name_any(), "cannot release finalizer: {err}")
            }
        }
    }
}
