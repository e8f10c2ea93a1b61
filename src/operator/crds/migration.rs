//! Storage migration (`storageVersion`): once a CRD whose storage version
//! changed is applied, the leader rewrites every stored parent once — an
//! update that changes nothing but the version etcd holds it in — and then
//! trims the CRD's `status.storedVersions` to the storage version, so the
//! old version can later be dropped. Paced (at most [`WRITES_PER_SECOND`])
//! so reconciles keep their share of the API server; interrupted (restart,
//! failover), it starts again from the CRD's `storedVersions` (every parent
//! is rewritten again: a rewrite is idempotent). Progress: `/status` →
//! `rules.<name>.migration {from, to, done, total}`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::info;

use crate::rules::CompiledRule;

/// The most parents rewritten per second.
pub const WRITES_PER_SECOND: u64 = 100;
const PAGE: u32 = 500;
/// Rewrites in flight at once.
const IN_FLIGHT: usize = 8;

/// Rule → its migration, as `/status` shows it.
pub type Progress = Arc<Mutex<BTreeMap<String, Value>>>;

/// Migrates `rule`'s parents to its storage version when the live CRD
/// `crd_name` still lists another stored version; returns once done (or
/// when nothing is to do).
pub async fn migrate(
    client: &Client,
    rule: &CompiledRule,
    crd_name: &str,
    progress: &Progress,
) -> Result<(), kube::Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let live = crds.get(crd_name).await?;
    let stored: Vec<String> = live
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    let to = rule.storage_version.clone();
    if stored.is_empty() || stored == [to.clone()] {
        return Ok(());
    }
    let from = stored
        .iter()
        .filter(|v| **v != to)
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&rule.parent.group, &to, &rule.parent.kind),
        &live.spec.names.plural,
    );
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    // Counted first (metadata only) for the progress; then rewritten page
    // by page from the listed objects, so each parent costs one write and
    // no read unless it changed meanwhile.
    let mut total = 0;
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = all.list_metadata(&params).await?;
        total += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let report = |done: usize| {
        if let Ok(mut p) = progress.lock() {
            p.insert(
                rule.name.clone(),
                json!({"from": from, "to": to, "done": done, "total": total}),
            );
        }
    };
    info!(rule = %rule.name, crd = crd_name, from = %from, to = %to, parents = total, "storage migration: rewriting every parent once");
    report(0);
    // Started at most WRITES_PER_SECOND a second, a few in flight: an
    // update's round trip (the API server converts the stored object for
    // it) would otherwise bound the pace well below the rate.
    let mut ticks = tokio::time::interval(Duration::from_millis(1000 / WRITES_PER_SECOND));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut done = 0;
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = all.list(&params).await?;
        // Spawned, so the ones in flight go on while the next waits its turn.
        let mut rewrites = tokio::task::JoinSet::new();
        let mut finished =
            |joined: Option<Result<Result<(), kube::Error>, tokio::task::JoinError>>| {
                match joined {
                    Some(Ok(Err(e))) => return Err(e),
                    Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    // Cancelled: only at shutdown, which drops this loop anyway.
                    Some(Err(_)) => return Ok(()),
                    Some(Ok(Ok(()))) => done += 1,
                    None => {}
                }
                if done % 100 == 0 {
                    report(done);
                }
                Ok(())
            };
        for parent in page.items {
            ticks.tick().await;
            while rewrites.len() >= IN_FLIGHT {
                finished(rewrites.join_next().await)?;
            }
            let api: Api<DynamicObject> = match parent.namespace() {
                Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            rewrites.spawn(async move { rewrite(&api, parent).await });
        }
        while !rewrites.is_empty() {
            finished(rewrites.join_next().await)?;
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    report(total);
    crds.patch_status(
        crd_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"storedVersions": [to]}})),
    )
    .await?;
    info!(rule = %rule.name, crd = crd_name, to = %to, parents = total, "storage migration done: status.storedVersions is [{to}]");
    Ok(())
}

/// One parent written back unchanged (guarded by its resourceVersion):
/// stored again at the storage version. A conflict means someone wrote it
/// after it was listed, that is after the new CRD was in force: that write
/// stored it at the new version already, so it is done without a read or a
/// second write (the reasoning of Kubernetes' own storage version
/// migrator). Gone: done.
async fn rewrite(api: &Api<DynamicObject>, parent: DynamicObject) -> Result<(), kube::Error> {
    match api
        .replace(&parent.name_any(), &PostParams::default(), &parent)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
