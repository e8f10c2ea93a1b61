//! The versions of a rule with `rollout:` that parents may be on, and the
//! rollout's state, kept in the cluster.
//!
//! ```text
//!  operator namespace: ConfigMap trellis-revision-<rule>-<revision>   (one per version)
//!      labels   trellis.dev/revision-of: <rule>, trellis.dev/revision: <revision>
//!      data     rule.json            the rule document as parsed (canonical JSON)
//!               template-files.json  templateFile path → contents
//!               rollout.json         on the rollout's target only: the State and
//!                                    the decisions already acted on
//!      annotations trellis.dev/decision: promote/<token> | abort/<token>  (written by the CLI)
//!        │ list (at the rule's start); then watched while the rule runs
//!        │ (`revision_watch`: the tick reads the watch's cache, no request)
//!        ▼
//!  Versions: the State + each live version compiled ──rule_for(newest, uid, on)──▶ the
//!            version that renders a parent
//! ```
//!
//! The ConfigMaps are the operator's own records, never children: they do
//! not carry `trellis.dev/rule`. Reads and writes use the operator's client.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::warn;

use crate::plan::{LABEL_MANAGED_BY, LABEL_REVISION, MANAGED_BY};
use crate::render::Limits;
use crate::rollout::State;
use crate::rules::CompiledRule;
use crate::rules::revision::canonical_json;

/// Label naming the rule a revision ConfigMap is a version of.
pub const LABEL_REVISION_OF: &str = "trellis.dev/revision-of";
/// Annotation the CLI writes on the target's ConfigMap: `promote/<token>` or `abort/<token>`.
pub const ANNOTATION_DECISION: &str = "trellis.dev/decision";
const KEY_RULE: &str = "rule.json";
const KEY_TEMPLATES: &str = "template-files.json";
const KEY_STATE: &str = "rollout.json";
/// Older versions kept beside the ones in use.
pub const KEEP_OLDER: usize = 5;
/// Field manager of the operator's writes of revision ConfigMaps.
const MANAGER: &str = "trellis";

/// `trellis-revision-<rule>-<revision>`.
pub fn configmap_name(rule: &str, revision: &str) -> String {
    format!("trellis-revision-{rule}-{revision}")
}

/// What the target version's ConfigMap keeps about the rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub state: State,
    /// Decision tokens already acted on (the newest few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handled: Vec<String>,
}

/// One version as read back from its ConfigMap.
#[derive(Debug, Clone)]
pub struct Stored {
    pub revision: String,
    pub document: Value,
    pub template_files: BTreeMap<String, String>,
    pub record: Option<Record>,
    /// The CLI's decision not acted on yet, if any: (`promote`|`abort`, token).
    pub decision: Option<(String, String)>,
    pub created: Option<String>,
}

impl Stored {
    /// Marked failed: the rollout to it was rolled back or aborted.
    pub fn failed(&self) -> bool {
        self.record.as_ref().is_some_and(|r| {
            r.state.to == self.revision && r.state.phase == crate::rollout::Phase::RolledBack
        })
    }

    pub fn decode(cm: &ConfigMap) -> Option<Stored> {
        let revision = cm.labels().get(LABEL_REVISION)?.clone();
        let data = cm.data.as_ref()?;
        let document: Value = serde_json::from_str(data.get(KEY_RULE)?).ok()?;
        let template_files = match data.get(KEY_TEMPLATES) {
            Some(text) => serde_json::from_str(text).ok()?,
            None => BTreeMap::new(),
        };
        let record = data
            .get(KEY_STATE)
            .and_then(|text| serde_json::from_str(text).ok());
        let decision = cm
            .annotations()
            .get(ANNOTATION_DECISION)
            .and_then(|d| d.split_once('/'))
            .map(|(what, token)| (what.to_owned(), token.to_owned()))
            .filter(|(_, token)| {
                !record
                    .as_ref()
                    .is_some_and(|r: &Record| r.handled.iter().any(|h| h == token))
            });
        Some(Stored {
            revision,
            document,
            template_files,
            record,
            decision,
            created: cm
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string()),
        })
    }

    /// Compiles the version again (its revision checked).
    pub fn compile(&self, limits: Limits) -> Result<CompiledRule, RebuildError> {
        let origin = Path::new("configmap").join(&self.revision);
        let rule = crate::rules::rebuild(
            self.document.clone(),
            self.template_files.clone(),
            &origin,
            limits,
        )
        .map_err(RebuildError::Invalid)?;
        if rule.revision != self.revision {
            return Err(RebuildError::OtherRevision {
                rebuilt: rule.revision,
                stored: self.revision.clone(),
            });
        }
        Ok(rule)
    }
}

/// A stored version that no longer compiles as it did: this build's rule
/// checks refuse it, or it compiles to another revision.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<crate::rules::Diagnostic>),
    #[error("rebuilt as revision {rebuilt}, not {stored}")]
    OtherRevision { rebuilt: String, stored: String },
}

/// The ConfigMap body of `rule`, with `record` when it is the target.
pub fn body(rule: &CompiledRule, namespace: &str, record: Option<&Record>) -> Value {
    let files: serde_json::Map<String, Value> = rule
        .template_files
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut data = json!({
        KEY_RULE: canonical_json(&rule.document),
        KEY_TEMPLATES: canonical_json(&Value::Object(files)),
    });
    if let Some(record) = record {
        data[KEY_STATE] = json!(serde_json::to_string(record).unwrap_or_default());
    }
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(&rule.name, &rule.revision),
            "namespace": namespace,
            "labels": {
                LABEL_REVISION_OF: rule.name,
                LABEL_REVISION: rule.revision,
                LABEL_MANAGED_BY: MANAGED_BY,
            },
        },
        "data": data,
    })
}

/// Every stored version of `rule`, with its ConfigMap's name.
pub async fn list(
    client: &Client,
    namespace: &str,
    rule: &str,
) -> Result<Vec<Stored>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("{LABEL_REVISION_OF}={rule}")))
        .await?;
    Ok(list.items.iter().filter_map(Stored::decode).collect())
}

/// Writes a version's ConfigMap (server-side apply: `rollout.json` goes
/// away from a version that is no longer the target); returns it as
/// written, with its new resourceVersion.
pub async fn write(
    client: &Client,
    namespace: &str,
    rule: &CompiledRule,
    record: Option<&Record>,
) -> Result<ConfigMap, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams::apply(MANAGER).force();
    api.patch(
        &configmap_name(&rule.name, &rule.revision),
        &params,
        &Patch::Apply(body(rule, namespace, record)),
    )
    .await
}

/// The stored record of the rollout: the one targeting `newest` if any,
/// else the one begun last.
pub fn current_record<'a>(stored: &'a [Stored], newest: &str) -> Option<&'a Stored> {
    stored
        .iter()
        .filter(|s| s.record.is_some())
        .max_by_key(|s| {
            let r = s.record.as_ref().map(|r| &r.state);
            (s.revision == newest, r.map(|r| r.since).unwrap_or(0))
        })
}

/// Deletes versions beyond the ones in use and the `KEEP_OLDER` newest
/// others; returns the names of those now gone (deleted, or found gone).
pub async fn prune(
    client: &Client,
    namespace: &str,
    rule: &str,
    stored: &[Stored],
    live: &[&str],
) -> Vec<String> {
    let mut older: Vec<&Stored> = stored
        .iter()
        .filter(|s| !live.contains(&s.revision.as_str()))
        .collect();
    if older.len() <= KEEP_OLDER {
        return Vec::new();
    }
    older.sort_by(|a, b| b.created.cmp(&a.created));
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut gone = Vec::new();
    for old in &older[KEEP_OLDER..] {
        let name = configmap_name(rule, &old.revision);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => gone.push(name),
            Err(kube::Error::Api(e)) if e.code == 404 => gone.push(name),
            Err(err) => warn!(rule, configmap = %name, "cannot delete an old revision: {err}"),
        }
    }
    gone
}

/// Deletes every revision ConfigMap of `rule` (the rule was removed, or
/// no longer has `rollout:`: nothing is staged and every parent runs the
/// newest version, so a record left behind would only be taken up again,
/// stale, should `rollout:` come back). Returns how many were deleted.
pub async fn delete_all(
    client: &Client,
    namespace: &str,
    rule: &str,
) -> Result<usize, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("{LABEL_REVISION_OF}={rule}")))
        .await?;
    let mut deleted = 0;
    for cm in &list.items {
        match api.delete(&cm.name_any(), &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(err) => return Err(err),
        }
    }
    Ok(deleted)
}

/// The versions of one rule parents may be on, and the rollout's state.
#[derive(Default)]
pub struct Versions {
    inner: RwLock<Inner>,
    /// The revision of a rule without `rollout:` whose leftover revision
    /// ConfigMaps were deleted already (once each time such a version comes
    /// into force on a replica, not a LIST every tick).
    cleared: std::sync::Mutex<Option<String>>,
}

#[derive(Default)]
struct Inner {
    record: Option<Record>,
    compiled: BTreeMap<String, Arc<CompiledRule>>,
}

impl Versions {
    /// The version that renders the parent `uid`, on revision `on`: the
    /// newest when there is no rollout state (or the rule has no `rollout:`).
    pub fn rule_for(
        &self,
        newest: &Arc<CompiledRule>,
        uid: &str,
        on: Option<&str>,
    ) -> Arc<CompiledRule> {
        if newest.rollout.is_none() {
            return newest.clone();
        }
        let inner = crate::operator::read(&self.inner);
        let Some(record) = &inner.record else {
            return newest.clone();
        };
        let want = record.state.desired(uid, on);
        if want == newest.revision {
            return newest.clone();
        }
        match inner.compiled.get(want) {
            Some(rule) => rule.clone(),
            None => {
                warn!(rule = %newest.name, revision = want, "the version a parent is due to run is not known here; rendering the newest");
                newest.clone()
            }
        }
    }

    /// Whether the leftovers of `revision` (a version without `rollout:`)
    /// still need [`delete_all`].
    pub fn needs_clearing(&self, revision: &str) -> bool {
        self.cleared
            .lock()
            .map(|c| c.as_deref() != Some(revision))
            .unwrap_or(true)
    }

    /// [`delete_all`] succeeded for `revision`; forgets the state it read.
    pub fn cleared(&self, revision: &str) {
        if let Ok(mut c) = self.cleared.lock() {
            *c = Some(revision.to_owned());
        }
        let mut inner = crate::operator::write(&self.inner);
        inner.record = None;
        inner.compiled.clear();
    }

    pub fn record(&self) -> Option<Record> {
        crate::operator::read(&self.inner).record.clone()
    }

    pub fn compiled(&self, revision: &str) -> Option<Arc<CompiledRule>> {
        crate::operator::read(&self.inner)
            .compiled
            .get(revision)
            .cloned()
    }

    /// Every version known, compiled (for watches and RBAC).
    pub fn all_compiled(&self) -> Vec<Arc<CompiledRule>> {
        crate::operator::read(&self.inner)
            .compiled
            .values()
            .cloned()
            .collect()
    }

    /// Takes `record` as the state, keeping `newest` and the live versions compiled.
    pub fn set(&self, record: Option<Record>, newest: &Arc<CompiledRule>) {
        let mut inner = crate::operator::write(&self.inner);
        inner
            .compiled
            .insert(newest.revision.clone(), newest.clone());
        if let Some(r) = &record {
            let live: Vec<String> = r.state.live().into_iter().map(str::to_owned).collect();
            inner
                .compiled
                .retain(|rev, _| live.contains(rev) || *rev == newest.revision);
        }
        inner.record = record;
    }

    /// Reads the state and the live versions from what is stored: at
    /// start (before any pass), and on every tick (from the watch's cache).
    pub fn absorb(&self, stored: &[Stored], newest: &Arc<CompiledRule>, limits: Limits) {
        // A version with `rollout:` is in force: the next version without
        // it (the same text as an earlier one, say) must clear again.
        if let Ok(mut c) = self.cleared.lock() {
            *c = None;
        }
        let record = current_record(stored, &newest.revision).and_then(|s| s.record.clone());
        if let Some(r) = &record {
            for rev in r.state.live() {
                if rev == newest.revision || self.compiled(rev).is_some() {
                    continue;
                }
                let Some(s) = stored.iter().find(|s| s.revision == rev) else {
                    warn!(rule = %newest.name, revision = rev, "a version in use has no ConfigMap");
                    continue;
                };
                match s.compile(limits) {
                    Ok(rule) => {
                        crate::operator::write(&self.inner)
                            .compiled
                            .insert(rev.to_owned(), Arc::new(rule));
                    }
                    Err(why) => {
                        warn!(rule = %newest.name, revision = rev, "cannot rebuild a version in use: {why}")
                    }
                }
            }
        }
        self.set(record, newest);
    }
}

/// Records a decision (`promote` or `abort`) for the leader, on the
/// ConfigMap of the current rollout's target; returns that ConfigMap's name.
pub async fn decide(
    client: &Client,
    namespace: &str,
    rule: &str,
    what: &str,
) -> Result<String, String> {
    let stored = list(client, namespace, rule).await.map_err(|e| {
        format!("cannot read the revisions of rule {rule} in namespace {namespace}: {e}")
    })?;
    let current = stored
        .iter()
        .filter(|s| s.record.is_some())
        .max_by_key(|s| s.record.as_ref().map(|r| r.state.since))
        .ok_or_else(|| format!("rule {rule} has no rollout in namespace {namespace}"))?;
    let record = current.record.as_ref().map(|r| &r.state);
    if record.is_some_and(|s| s.phase.is_final()) {
        return Err(format!(
            "the rollout of rule {rule} is {} already: nothing to {what}",
            record.map(|s| s.phase.as_str()).unwrap_or_default()
        ));
    }
    let token = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = configmap_name(rule, &current.revision);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let patch =
        json!({"metadata": {"annotations": {ANNOTATION_DECISION: format!("{what}/{token}")}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| format!("cannot record the decision on ConfigMap {namespace}/{name}: {e}"))?;
    Ok(name)
}
