//! Spoke cleanups that outlive this process. A removed rule's children in
//! spokes (`onRuleRemoved`), and those of a kind a rule no longer places in
//! spokes, are taken away by a task that waits for spokes that do not
//! answer ([`super::spokes`]); were it only in memory, a restart or a new
//! leader while a spoke is down would leave them (and the removed rule's
//! parents' finalizers, hence their deletes) to nobody: the rule is gone
//! from the rules, so nothing else knows of it. So each such task is
//! recorded, for as long as it runs, in one ConfigMap in the operator's
//! namespace (`trellis-spoke-cleanup-<--cluster-name>`), one key per task:
//! the rule's document and template files (what rebuilds it, as a revision
//! ConfigMap keeps them), and what to do. Whoever leads resumes every record
//! whose rule is still not back: at start, and on becoming leader (the
//! spokes' Secrets are then watched even if no rule places anything in a
//! spoke any more). Nothing
//! is read cluster-wide to find them: the record names the rule, hence its
//! parent kind, namespaces and spoke kinds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::kinds::Gvk;
use crate::operator::Shared;
use crate::rules::CompiledRule;

/// One recorded cleanup.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    /// The rule as it was: what rebuilds it.
    document: Value,
    #[serde(default)]
    template_files: BTreeMap<String, String>,
    /// The kind no longer placed in spokes (`apiVersion`, `kind`); absent
    /// for a removed rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<(String, String)>,
}

/// What a record is for: its key in the ConfigMap.
pub(super) enum Cleanup<'a> {
    /// A removed rule (or a rule's old parent kind): `onRuleRemoved`.
    Removed,
    /// A child kind the rule no longer places in spokes.
    Dropped(&'a Gvk),
}

fn key(rule: &str, what: &Cleanup) -> String {
    match what {
        Cleanup::Removed => format!("removed.{rule}"),
        // Keys take letters, digits, `-`, `_` and `.`: a group is a DNS name.
        Cleanup::Dropped(gvk) => format!("dropped.{rule}.{}.{}", gvk.kind, gvk.group),
    }
}

fn name(shared: &Shared) -> String {
    format!("trellis-spoke-cleanup-{}", shared.clusters.hub)
}

fn api(shared: &Shared) -> Api<ConfigMap> {
    Api::namespaced(shared.client.clone(), &shared.operator_namespace)
}

/// Records a cleanup that begins (the leader's: only it writes).
pub(super) async fn remember(shared: &Shared, rule: &CompiledRule, what: Cleanup<'_>) {
    if !shared.gate.may_write() {
        return;
    }
    let record = Record {
        document: rule.document.clone(),
        template_files: rule.template_files.clone(),
        kind: match &what {
            Cleanup::Removed => None,
            Cleanup::Dropped(gvk) => Some((gvk.api_version(), gvk.kind.clone())),
        },
    };
    let text = serde_json::to_string(&record).unwrap_or_default();
    let key = key(&rule.name, &what);
    let name = name(shared);
    let patch = json!({"data": {&key: &text}});
    let api = api(shared);
    // A merge of one key: records of other rules are left as they are.
    let written = match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "trellis"}},
                "data": {&key: &text},
            }))
            .expect("a ConfigMap");
            match api.create(&PostParams::default(), &cm).await {
                // Made meanwhile by another: merge into it.
                Err(kube::Error::Api(e)) if e.code == 409 => api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ()),
                other => other.map(|_| ()),
            }
        }
        other => other.map(|_| ()),
    };
    if let Err(err) = written {
        warn!(rule = %rule.name, configmap = %name, "cannot record the cleanup in other clusters (a restart before it ends would forget it): {err}");
    }
}

/// Drops the record of a cleanup that ended (or is not needed any more).
pub(super) async fn forget(shared: &Shared, rule: &str, what: Cleanup<'_>) {
    if !shared.gate.may_write() {
        return;
    }
    let patch = json!({"data": {key(rule, &what): null}});
    match api(shared)
        .patch(
            &name(shared),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(err) => {
            warn!(rule = %rule, "cannot drop the record of an ended cleanup in other clusters: {err}")
        }
    }
}

/// Resumes the recorded cleanups each time this replica comes to lead
/// (at once without leader election), once the rules in force and the
/// cluster Secrets are known.
pub(super) fn resume_when_leading(shared: Arc<Shared>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        tokio::select! {
            _ = each_time_leading(&shared, &shutdown) => {}
            () = shutdown.cancelled() => {}
        }
    });
}

/// [`resume`] each time the gate opens; `None` when the channels close.
async fn each_time_leading(shared: &Arc<Shared>, shutdown: &CancellationToken) -> Option<()> {
    let mut rules = shared.in_force.subscribe();
    let mut leading = shared.gate.leading();
    rules.wait_for(Option::is_some).await.ok()?;
    loop {
        leading.wait_for(|l| *l).await.ok()?;
        resume(shared, shutdown).await;
        leading.wait_for(|l| !*l).await.ok()?;
    }
}

/// Starts again every recorded cleanup whose rule has not come back.
async fn resume(shared: &Arc<Shared>, shutdown: &CancellationToken) {
    let records = match api(shared).get_opt(&name(shared)).await {
        Ok(cm) => cm.and_then(|cm| cm.data).unwrap_or_default(),
        // Rules that never placed a child in a spoke grant no read of it
        // (`trellis rbac`): nothing can have been recorded.
        Err(kube::Error::Api(e)) if e.code == 403 => return,
        Err(err) => {
            warn!(configmap = %name(shared), "cannot read the recorded cleanups in other clusters: {err}");
            return;
        }
    };
    if records.is_empty() {
        return;
    }
    // The rules that placed children there may be gone: the spokes are
    // registered all the same, and known before anything is decided.
    shared.clusters.spokes_listed().await;
    for (key, text) in records {
        let rebuilt = serde_json::from_str::<Record>(&text)
            .map_err(|e| e.to_string())
            .and_then(|r| {
                let origin = std::path::Path::new("configmap").join(&key);
                crate::rules::rebuild(r.document, r.template_files, &origin, shared.limits)
                    .map(|rule| (Arc::new(rule), r.kind))
                    .map_err(|d| {
                        d.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("; ")
                    })
            });
        let (rule, kind) = match rebuilt {
            Ok(rebuilt) => rebuilt,
            Err(why) => {
                warn!(key = %key, "a recorded cleanup in other clusters does not rebuild; left as it is: {why}");
                continue;
            }
        };
        let now = shared
            .in_force
            .borrow()
            .as_ref()
            .and_then(|set| set.get(&rule.name).cloned());
        match kind {
            None => {
                if now.is_some_and(|r| r.parent == rule.parent) {
                    forget(shared, &rule.name, Cleanup::Removed).await;
                    continue;
                }
                info!(rule = %rule.name, "resuming a removed rule's cleanup in other clusters");
                super::on_rule_removed(shared, &rule, shutdown).await;
            }
            Some((api_version, kind)) => {
                let gvk = Gvk::new(&api_version, &kind);
                info!(rule = %rule.name, kind = %gvk, "resuming the cleanup of a kind no longer placed in spokes");
                let dropped = BTreeSet::from([gvk]);
                super::spokes::take_dropped(shared, &rule, dropped, shutdown);
            }
        }
    }
}
