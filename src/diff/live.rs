//! The cluster side of `trellis diff`: reads the live parent, its children
//! and the related objects its rule reads, plans one pass exactly as the
//! operator would, and asks the API server what each write would do with
//! server-side **dry-run** requests. Nothing here writes: every request is a
//! GET, a LIST, or carries `dryRun=All`.
//!
//! Where the operator would skip a write (a `createOnly` child that exists,
//! a child whose live object carries this rendering's hash and every field
//! it sets), so does this, with the same functions
//! ([`crate::ownership::live_render_hash`], [`crate::drift::drifted`],
//! [`crate::ownership::foreign_owner`]).

use std::collections::BTreeSet;

use kube::api::{Api, DynamicObject, ListParams, TypeMeta};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::{ChildChange, ChildDiff, FieldChange, ParentDiff};
use crate::kinds::Gvk;
use crate::operator::FINALIZER;
use crate::operator::discovery::{Resolved, resolve};
use crate::plan::{
    self, Input, LABEL_PARENT_UID, LABEL_RULE, ObjectKey, Observed, RelatedRead, RelatedTarget,
};
use crate::rules::model::Scope;
use crate::rules::{CompiledRule, RuleSet};
use dry_run::{child_change, patch_change, status_changes};

mod crds;
mod dry_run;
mod fetched;
mod planned;
mod spokes;

use fetched::Fetched;
pub(crate) use planned::{Planned, plan_live};
pub(crate) use spokes::Spokes;

/// Which parents to diff.
pub enum Target<'a> {
    /// The live object named by this manifest (apiVersion, kind, namespace, name).
    Parent(&'a Value),
    /// Every parent of every rule (or of `rule`), in every watched namespace
    /// (or in `namespace`).
    All {
        namespace: Option<String>,
        rule: Option<String>,
    },
}

/// What `trellis diff` found.
#[derive(Debug, Default)]
pub struct Report {
    /// The generated CRD of each rule diffed (those with `crd:`).
    pub crds: Vec<crate::diff::CrdDiff>,
    pub diffs: Vec<ParentDiff>,
    /// Said on stderr: a rule skipped because its parent kind is not served.
    pub notes: Vec<String>,
}

/// Why `trellis diff` against a cluster could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The 404 of discovery says little: say what is likely missing.
    #[error("{0} is not served by the API server (is its CRD installed?)")]
    ParentNotServed(Gvk),
    #[error(transparent)]
    NotServed(#[from] crate::operator::discovery::NotServed),
    #[error("the parent manifest needs apiVersion, kind and metadata.name")]
    IncompleteManifest,
    #[error("no rule has parent {0}")]
    NoRuleForParent(Gvk),
    #[error("no rule named `{0}`")]
    NoSuchRule(String),
    #[error("{0} does not exist on the cluster (diff compares a live parent)")]
    ParentMissing(String),
    /// A read or a dry-run write the API server refused; `what` names it.
    #[error("{what}: {source}")]
    Api { what: String, source: kube::Error },
}

impl LiveError {
    fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> LiveError {
        let what = what.into();
        move |source| LiveError::Api { what, source }
    }
}

/// Every kind one rule touches, resolved through discovery.
pub(crate) struct Kinds {
    pub(crate) parent: Resolved,
    /// Child, related and patch-target kinds.
    pub(crate) others: Vec<Resolved>,
    /// Related and patch-target kinds the API server does not serve, and
    /// why: as in the operator, their entries hold back only their readers
    /// (`RelatedKindNotServed`), never the whole pass.
    pub(crate) unserved: Vec<(Gvk, String)>,
}

impl Kinds {
    pub(crate) async fn of(client: &Client, rule: &CompiledRule) -> Result<Kinds, LiveError> {
        let parent = resolve(client, &rule.parent)
            .await
            .map_err(|_| LiveError::ParentNotServed(rule.parent.clone()))?;
        let mut others: Vec<Resolved> = Vec::new();
        let mut unserved: Vec<(Gvk, String)> = Vec::new();
        // A child kind placed in spokes may not be served here: not required.
        let children = rule
            .children
            .iter()
            .map(|c| (c.gvk.clone(), c.cluster.is_none()));
        let reads = rule
            .related
            .iter()
            .map(|r| r.gvk.clone())
            .chain(rule.patches.iter().map(|p| p.gvk.clone()))
            .map(|gvk| (gvk, false));
        for (gvk, required) in children.chain(reads) {
            if others.iter().any(|o| o.gvk == gvk) || unserved.iter().any(|(g, _)| *g == gvk) {
                continue;
            }
            match resolve(client, &gvk).await {
                Ok(kind) => others.push(kind),
                Err(why) if !required => unserved.push((gvk, why.to_string())),
                Err(why) => return Err(why.into()),
            }
        }
        Ok(Kinds {
            parent,
            others,
            unserved,
        })
    }

    pub(crate) fn find(&self, group: &str, kind: &str) -> Option<&Resolved> {
        std::iter::once(&self.parent)
            .chain(&self.others)
            .find(|k| k.gvk.group == group && k.gvk.kind == kind)
    }

    fn scope_of(&self, gvk: &Gvk) -> Scope {
        match self.find(&gvk.group, &gvk.kind) {
            Some(k) if k.namespaced => Scope::Namespaced,
            Some(_) => Scope::Cluster,
            None => crate::kinds::scope(gvk),
        }
    }
}

/// The operator's choice of a namespaced or cluster-wide `Api`.
fn api(client: &Client, kind: &Resolved, namespace: Option<&str>) -> Api<DynamicObject> {
    kind.api(client.clone(), namespace)
}

/// An object as JSON, with its apiVersion/kind (list items may lack them).
pub(crate) fn to_value(mut obj: DynamicObject, kind: &Resolved) -> Value {
    obj.types = Some(TypeMeta {
        api_version: kind.resource.api_version.clone(),
        kind: kind.resource.kind.clone(),
    });
    serde_json::to_value(&obj).unwrap_or(Value::Null)
}

fn describe(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Diffs the targeted parents. `Err` when the cluster cannot answer (or the
/// manifest names no rule's parent); a failing pass is reported in the diff.
pub async fn diff(
    client: &Client,
    set: &RuleSet,
    target: &Target<'_>,
) -> Result<Report, LiveError> {
    let home = crate::operator::home::operator_namespace(None);
    diff_as(client, set, target, &home).await
}

/// Like [`diff`], with the operator's namespace (`--operator-namespace`):
/// a rule with `serviceAccountName` dry-runs its children's writes as that
/// account of that namespace, as the operator would send them.
pub async fn diff_as(
    client: &Client,
    set: &RuleSet,
    target: &Target<'_>,
    operator_namespace: &str,
) -> Result<Report, LiveError> {
    let writer = |rule: &CompiledRule| match &rule.rule.spec.service_account_name {
        Some(account) => crate::operator::identity::impersonating(
            client.clone(),
            &crate::operator::identity::username(operator_namespace, account),
        ),
        None => client.clone(),
    };
    let mut report = Report::default();
    let spokes = Spokes::read(
        client,
        operator_namespace,
        set.rules.iter().map(|r| r.as_ref()),
    )
    .await;
    match target {
        Target::Parent(manifest) => {
            let s = |p: &str| manifest.pointer(p).and_then(Value::as_str);
            let (Some(api_version), Some(kind), Some(name)) =
                (s("/apiVersion"), s("/kind"), s("/metadata/name"))
            else {
                return Err(LiveError::IncompleteManifest);
            };
            let gvk = Gvk::new(api_version, kind);
            let rules: Vec<_> = set.for_parent(&gvk).collect();
            if rules.is_empty() {
                return Err(LiveError::NoRuleForParent(gvk));
            }
            for rule in rules {
                crds::add(client, rule, &mut report).await;
                let kinds = Kinds::of(client, rule).await?;
                let versions =
                    versions_of(client, operator_namespace, rule, &mut report.notes).await;
                let namespace = s("/metadata/namespace");
                let live = api(client, &kinds.parent, namespace)
                    .get_opt(name)
                    .await
                    .map_err(LiveError::api(describe(kind, namespace, name)))?
                    .ok_or_else(|| LiveError::ParentMissing(describe(kind, namespace, name)))?;
                let live = to_value(live, &kinds.parent);
                report.diffs.push(
                    diff_parent(
                        client,
                        &writer(rule),
                        rule,
                        versions.as_ref(),
                        &kinds,
                        &live,
                        &spokes,
                    )
                    .await?,
                );
            }
        }
        Target::All { namespace, rule } => {
            if let Some(name) = rule
                && set.get(name).is_none()
            {
                return Err(LiveError::NoSuchRule(name.clone()));
            }
            for r in &set.rules {
                if rule.as_ref().is_some_and(|n| *n != r.name) {
                    continue;
                }
                crds::add(client, r, &mut report).await;
                let kinds = match Kinds::of(client, r).await {
                    Ok(k) => k,
                    Err(e) => {
                        report.notes.push(format!("rule {}: skipped: {e}", r.name));
                        continue;
                    }
                };
                let parents = api(client, &kinds.parent, namespace.as_deref())
                    .list(&ListParams::default())
                    .await
                    .map_err(LiveError::api(format!("listing {}", r.parent)))?;
                let mut parents: Vec<Value> = parents
                    .items
                    .into_iter()
                    .map(|p| to_value(p, &kinds.parent))
                    .collect();
                parents.sort_by_key(|p| ObjectKey::of(p).map(|k| (k.namespace, k.name)));
                let writer = writer(r);
                let versions = versions_of(client, operator_namespace, r, &mut report.notes).await;
                for p in &parents {
                    if plan::parent_matches(r, p) {
                        report.diffs.push(
                            diff_parent(client, &writer, r, versions.as_ref(), &kinds, p, &spokes)
                                .await?,
                        );
                    }
                }
            }
        }
    }
    Ok(report)
}

/// For a rule with `rollout:`, its versions as the cluster keeps them (so
/// each parent is diffed against the version it is due to run).
pub(crate) async fn versions_of(
    client: &Client,
    operator_namespace: &str,
    rule: &std::sync::Arc<CompiledRule>,
    notes: &mut Vec<String>,
) -> Option<crate::operator::versions::Versions> {
    rule.rollout.as_ref()?;
    match crate::operator::versions::list(client, operator_namespace, &rule.name).await {
        Ok(stored) => {
            let versions = crate::operator::versions::Versions::default();
            versions.absorb(&stored, rule, crate::render::Limits::default());
            Some(versions)
        }
        Err(e) => {
            notes.push(format!(
                "rule {}: cannot read its rollout in namespace {operator_namespace} ({e}): every parent is diffed against the newest version",
                rule.name
            ));
            None
        }
    }
}

/// One parent under one rule: the pass the operator would run, dry; the
/// children's writes on `writer` (the rule's account's client, or `client`).
/// During a staged rollout, the version the parent is due to run renders it.
/// Children in spokes are dry-run there, with the spoke's credentials.
async fn diff_parent(
    client: &Client,
    writer: &Client,
    newest: &std::sync::Arc<CompiledRule>,
    versions: Option<&crate::operator::versions::Versions>,
    kinds: &Kinds,
    parent: &Value,
    spokes: &Spokes,
) -> Result<ParentDiff, LiveError> {
    let rule: &CompiledRule = newest;
    let s = |p: &str| parent.pointer(p).and_then(Value::as_str);
    let (name, namespace) = (
        s("/metadata/name").unwrap_or_default(),
        s("/metadata/namespace"),
    );
    let mut out = ParentDiff {
        rule: rule.name.clone(),
        parent: describe(&rule.parent.kind, namespace, name),
        ..ParentDiff::default()
    };
    let planned = plan_live(client, newest, versions, kinds, parent, spokes).await?;
    let (rule, observed, pass) = match planned {
        Planned::Skipped(why) => {
            out.skipped = Some(why);
            return Ok(out);
        }
        Planned::Pass {
            rule,
            observed,
            plan,
        } => (rule, observed, plan),
    };
    let rule: &CompiledRule = &rule;
    let uid = s("/metadata/uid").unwrap_or_default();

    for apply in &pass.apply {
        let live = observed.objects.get(&apply.key);
        let change = match &apply.key.cluster {
            None => child_change(writer, rule, kinds, apply, live).await,
            Some(cluster) => {
                let kind = (apply.key.group.as_str(), apply.key.kind.as_str());
                match spokes.writer(cluster, rule, &kinds.parent, kind).await {
                    Ok((w, k)) => child_change(&w, rule, &k, apply, live).await,
                    Err(why) => ChildChange::Refused { why },
                }
            }
        };
        out.children.push(ChildDiff {
            id: apply.id.clone(),
            key: apply.key.clone(),
            change,
        });
    }
    // Pruning waits for a pass in which everything applied.
    let refused = out
        .children
        .iter()
        .any(|c| matches!(c.change, ChildChange::Refused { .. }));
    for delete in &pass.delete {
        out.children.push(ChildDiff {
            id: delete.id.clone(),
            key: delete.key.clone(),
            change: if refused {
                ChildChange::PruneHeld
            } else {
                ChildChange::Prune
            },
        });
    }
    // Patches after the children, as the operator sends them; releases and
    // retained children only where pruning would happen.
    let manager = plan::field_manager(&rule.name, uid);
    for patch in pass.patches.iter().filter(|p| p.uid.is_some()) {
        let live = observed.objects.get(&patch.key);
        let change = patch_change(
            writer,
            kinds,
            (&patch.key, &patch.object),
            live,
            &manager,
            patch.force,
        )
        .await;
        out.children.push(ChildDiff {
            id: patch.id.clone(),
            key: patch.key.clone(),
            change,
        });
    }
    if pass.errors.is_empty() {
        for release in &pass.release {
            let live = observed.objects.get(&release.key);
            let change = if refused {
                ChildChange::PruneHeld
            } else {
                let body = release.body();
                patch_change(writer, kinds, (&release.key, &body), live, &manager, false).await
            };
            out.children.push(ChildDiff {
                id: "(released)".into(),
                key: release.key.clone(),
                change,
            });
        }
        for retained in &pass.retain {
            out.children.push(ChildDiff {
                id: retained.id.clone(),
                key: retained.key.clone(),
                change: if refused {
                    ChildChange::PruneHeld
                } else {
                    ChildChange::Release
                },
            });
        }
    }
    out.pending = pass.pending.clone();
    out.errors = pass.errors.clone();

    let finalizers: Vec<String> = parent
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|f| {
            f.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if pass.needs_finalizer && !finalizers.iter().any(|f| f == FINALIZER) {
        let mut after = finalizers.clone();
        after.push(FINALIZER.to_owned());
        out.parent_fields.push(FieldChange {
            path: "metadata.finalizers".into(),
            before: (!finalizers.is_empty()).then(|| json!(finalizers)),
            after: Some(json!(after)),
        });
    }
    if let Some(status) = &pass.status {
        out.parent_fields
            .extend(status_changes(client, rule, kinds, parent, name, namespace, status).await?);
    }
    Ok(out)
}

/// The rule's children of one parent, as the operator's caches hold them:
/// one labelled list per child kind.
async fn live_children(
    client: &Client,
    rule: &CompiledRule,
    kinds: &Kinds,
    uid: &str,
) -> Result<Vec<Value>, LiveError> {
    let mut objects = Vec::new();
    let selector = format!("{LABEL_RULE}={},{LABEL_PARENT_UID}={uid}", rule.name);
    for child in &rule.children {
        let Some(kind) = kinds.find(&child.gvk.group, &child.gvk.kind) else {
            continue;
        };
        if objects
            .iter()
            .any(|(g, _): &(Gvk, Value)| g.group == child.gvk.group && g.kind == child.gvk.kind)
        {
            continue;
        }
        let list = api(client, kind, None)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(LiveError::api(format!("listing {} children", child.gvk)))?;
        objects.extend(
            list.items
                .into_iter()
                .map(|o| (child.gvk.clone(), to_value(o, kind))),
        );
    }
    Ok(objects.into_iter().map(|(_, v)| v).collect())
}

/// Where a live plan reads: the hub (`client`, `kinds`) and the spokes.
struct Reading<'a> {
    client: &'a Client,
    kinds: &'a Kinds,
    spokes: &'a Spokes,
    /// What the planner may know of the spokes.
    clusters: &'a crate::clusters::Clusters,
}

/// Plans, fetches what the related entries read, and plans again until the
/// reads stop changing (a related name may come from a var).
async fn plan_with_reads(
    reading: &Reading<'_>,
    rule: &CompiledRule,
    parent: &Value,
    mut objects: Vec<Value>,
) -> Result<(Observed, plan::Plan), LiveError> {
    let (client, kinds) = (reading.client, reading.kinds);
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let scope_of = |g: &Gvk| kinds.scope_of(g);
    let mut fetched: BTreeSet<String> = BTreeSet::new();
    let mut observed;
    let mut pass;
    let mut rounds = 0;
    loop {
        observed = Observed::from_objects(objects.iter().cloned());
        if !kinds.unserved.is_empty() {
            let fetched = Fetched::new(&observed, &kinds.unserved);
            observed = observed.with_related(std::sync::Arc::new(fetched));
        }
        pass = plan::plan(
            rule,
            &Input {
                parent,
                observed: &observed,
                now: &now,
                scope_of: &scope_of,
                clusters: reading.clusters,
            },
        );
        let new: Vec<&RelatedRead> = pass
            .reads
            .iter()
            .filter(|r| !fetched.contains(&format!("{r:?}")))
            .collect();
        rounds += 1;
        if new.is_empty() || rounds > 4 {
            break;
        }
        for read in new {
            fetched.insert(format!("{read:?}"));
            objects.extend(fetch_related(client, kinds, read).await?);
            objects.extend(reading.spokes.related(rule, read).await);
        }
    }

    Ok((observed, pass))
}

/// The objects one related read covers.
async fn fetch_related(
    client: &Client,
    kinds: &Kinds,
    read: &RelatedRead,
) -> Result<Vec<Value>, LiveError> {
    let gvk = Gvk::new(&read.api_version, &read.kind);
    let Some(kind) = kinds.find(&gvk.group, &gvk.kind) else {
        return Ok(Vec::new());
    };
    let api = api(client, kind, read.namespace.as_deref());
    let fail = |source: kube::Error| LiveError::Api {
        what: format!("reading related `{}` ({gvk})", read.id),
        source,
    };
    match &read.target {
        RelatedTarget::Name(name) => Ok(api
            .get_opt(name)
            .await
            .map_err(fail)?
            .map(|o| to_value(o, kind))
            .into_iter()
            .collect()),
        RelatedTarget::Selector(_) => {
            let list = api.list(&ListParams::default()).await.map_err(fail)?;
            Ok(list
                .items
                .into_iter()
                .filter(|o| {
                    let labels = serde_json::to_value(o.labels()).ok();
                    read.covers(
                        o.namespace().as_deref(),
                        &o.name_any(),
                        labels.as_ref().and_then(Value::as_object),
                    )
                })
                .map(|o| to_value(o, kind))
                .collect())
        }
    }
}
