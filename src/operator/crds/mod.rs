//! `trellis run --manage-crds`: the CRDs generated from rules (`crd:`) are
//! applied by the operator itself.
//!
//! ```text
//!  start / every good reload ──set──▶ watch channel ──▶ manager task
//!  became leader ─────────────────────────────────────────▶  │ gate open?
//!                                  server-side apply (field manager `trellis`)
//!                                  then wait until Established (logged)
//! ```
//!
//! A CRD is only ever created or updated, never deleted: deleting a CRD
//! deletes every object of its kind, which no rule edit should be able to
//! do. Only the replica that may write (the leader) applies; a failure is
//! logged and retried at the next reload or leadership change, and the rule
//! whose CRD is missing waits for it as it would for a hand-installed one.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub mod hold;
pub mod migration;

use super::leadership::leader::Gate;
use super::webhook::Endpoint;
use crate::rules::RuleSet;

/// How long one CRD may take to become Established before we log and move on.
const ESTABLISHED_WITHIN: Duration = Duration::from_secs(30);

/// Starts the manager, which follows `sets` (the rule set in force).
pub fn spawn(
    client: Client,
    gate: Gate,
    sets: watch::Receiver<Option<Arc<RuleSet>>>,
    webhook: Endpoint,
    migrations: migration::Progress,
    shutdown: CancellationToken,
) {
    tokio::spawn(manage(client, gate, sets, webhook, migrations, shutdown));
}

async fn manage(
    client: Client,
    gate: Gate,
    mut sets: watch::Receiver<Option<Arc<RuleSet>>>,
    mut webhook: Endpoint,
    migrations: migration::Progress,
    shutdown: CancellationToken,
) {
    let mut became_leader = gate.became_leader().boxed();
    loop {
        let set = sets.borrow_and_update().clone();
        webhook.ca.borrow_and_update();
        if let Some(set) = set
            && gate.may_write()
        {
            apply_all(&client, &set, &webhook).await;
            migrate_all(&client, &set, &migrations, &shutdown).await;
        }
        // A new CA (first made, or rotated) goes into every caBundle.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = sets.changed() => if changed.is_err() { return },
            changed = webhook.ca.changed() => if changed.is_err() { return },
            woke = became_leader.next() => if woke.is_none() { return },
        }
    }
}

/// Storage migration of every rule with versions whose CRD still lists
/// another stored version; while it runs no other CRD change is applied
/// (the next one waits for it), and shutdown interrupts it.
async fn migrate_all(
    client: &Client,
    set: &RuleSet,
    progress: &migration::Progress,
    shutdown: &CancellationToken,
) {
    for rule in set.rules.iter().filter(|r| !r.versions.is_empty()) {
        let name = crate::rules::crd::name(&rule.rule);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            done = migration::migrate(client, rule, &name, progress) => if let Err(e) = done {
                warn!(rule = %rule.name, crd = %name, "storage migration stopped: {e}; it starts again at the next reload or leadership change");
            },
        }
    }
}

/// The CRD as applied: a kind with versions gets the webhook's
/// `clientConfig` and CA; `None` while the CA it must carry is not known.
fn with_webhook(crd: &Value, webhook: &Endpoint) -> Option<Value> {
    if crd.pointer("/spec/conversion/webhook").is_none() {
        return Some(crd.clone());
    }
    let ca = webhook.ca.borrow().clone();
    if ca.is_none() && webhook.settings.cert_dir.is_none() {
        return None;
    }
    let mut crd = crd.clone();
    crd["spec"]["conversion"]["webhook"]["clientConfig"] =
        webhook.settings.client_config(ca.as_deref());
    Some(crd)
}

/// Applies every generated CRD of `set` and waits for each to be Established.
pub async fn apply_all(client: &Client, set: &RuleSet, webhook: &Endpoint) {
    for rule in &set.rules {
        let allow_breaking = rule.allows_breaking_crd();
        let Some(generated) = &rule.crd else {
            continue;
        };
        let Some(crd) = with_webhook(generated, webhook) else {
            info!(rule = %rule.name, "--manage-crds: the CRD waits for the conversion webhook's CA");
            continue;
        };
        if let Err(e) = apply_checked(client, &crd, allow_breaking).await {
            warn!(rule = %rule.name, "--manage-crds: {e}");
        }
    }
}

/// A live CRD whose webhook is reached the other way (a `service` where
/// this operator names a `url`, or the reverse: `kubectl apply` of the
/// generated CRD names the Service, an operator run outside the cluster a
/// URL) keeps that field under its own manager through a server-side
/// apply, and the API server refuses both at once: this swaps one for the
/// other first, with a merge patch.
async fn replace_other_client_config(
    client: &Client,
    name: &str,
    live: &Value,
    crd: &Value,
) -> Result<(), CrdApplyError> {
    let (Some(ours), Some(theirs)) = (
        crd.pointer("/spec/conversion/webhook/clientConfig"),
        live.pointer("/spec/conversion/webhook/clientConfig"),
    ) else {
        return Ok(());
    };
    let other = ["url", "service"]
        .into_iter()
        .find(|k| theirs.get(k).is_some() && ours.get(k).is_none());
    let Some(other) = other else {
        return Ok(());
    };
    let mut config = ours.clone();
    config[other] = Value::Null;
    let patch = serde_json::json!({"spec": {"conversion": {"webhook": {"clientConfig": config}}}});
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| CrdApplyError::Refused {
            name: name.to_owned(),
            source,
        })?;
    info!(
        crd = name,
        "conversion webhook: the CRD's clientConfig {other} replaced by this operator's"
    );
    Ok(())
}

/// Why a generated CRD could not be applied, naming it.
#[derive(Debug, thiserror::Error)]
pub enum CrdApplyError {
    #[error("a generated CRD without a name")]
    Unnamed,
    #[error("applying CustomResourceDefinition {name}: {source}")]
    Refused { name: String, source: kube::Error },
    #[error("CustomResourceDefinition {0} disappeared after it was applied")]
    Disappeared(String),
    #[error("watching CustomResourceDefinition {name}: {source}")]
    Watch {
        name: String,
        source: kube::runtime::wait::Error,
    },
    #[error("CustomResourceDefinition {0} not Established within {ESTABLISHED_WITHIN:?}")]
    NotEstablished(String),
    #[error("reading the live CustomResourceDefinition {name}: {source}")]
    Read { name: String, source: kube::Error },
    /// The change would break stored parents or clients; `crd:
    /// {allowBreaking: true}` applies it anyway.
    #[error("CustomResourceDefinition {name} not applied: the change is breaking (crd: {{allowBreaking: true}} applies it anyway):\n{}", .changes.iter().map(|c| format!("  {c}")).collect::<Vec<_>>().join("\n"))]
    Breaking {
        name: String,
        changes: Vec<crate::crd::breaking::Breaking>,
    },
}

/// Server-side applies one CRD (taking over fields another manager set:
/// the rule is the source of truth) and waits until it is Established. A
/// change that would break stored parents or clients
/// ([`crate::crd::breaking`]) is refused unless `allow_breaking`.
pub async fn apply_checked(
    client: &Client,
    crd: &Value,
    allow_breaking: bool,
) -> Result<(), CrdApplyError> {
    let name = name_of(crd)?;
    let has_webhook = crd
        .pointer("/spec/conversion/webhook/clientConfig")
        .is_some();
    // Read once, for the check and the clientConfig, and only when needed.
    let live = if allow_breaking && !has_webhook {
        None
    } else {
        live(client, name).await?
    };
    if let Some(live) = &live {
        if !allow_breaking {
            let changes = crate::crd::breaking::changes(live, crd);
            if !changes.is_empty() {
                return Err(CrdApplyError::Breaking {
                    name: name.to_owned(),
                    changes,
                });
            }
        }
        replace_other_client_config(client, name, live, crd).await?;
    }
    apply(client, crd).await
}

/// What applying `crd` over the live one would break (nothing when there
/// is no live one).
pub async fn breaking_changes(
    client: &Client,
    crd: &Value,
) -> Result<Vec<crate::crd::breaking::Breaking>, CrdApplyError> {
    Ok(match live(client, name_of(crd)?).await? {
        Some(live) => crate::crd::breaking::changes(&live, crd),
        None => Vec::new(),
    })
}

fn name_of(crd: &Value) -> Result<&str, CrdApplyError> {
    crd.pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or(CrdApplyError::Unnamed)
}

/// The live CRD named `name`, as JSON; `None` when there is none.
async fn live(client: &Client, name: &str) -> Result<Option<Value>, CrdApplyError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let live = api
        .get_opt(name)
        .await
        .map_err(|source| CrdApplyError::Read {
            name: name.to_owned(),
            source,
        })?;
    Ok(live.map(|l| serde_json::to_value(&l).unwrap_or_default()))
}

/// [`apply_checked`] without the check: the rule is the source of truth.
pub async fn apply(client: &Client, crd: &Value) -> Result<(), CrdApplyError> {
    let name = name_of(crd)?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(crate::crd::FIELD_MANAGER).force();
    let applied = api
        .patch(name, &params, &Patch::Apply(crd))
        .await
        .map_err(|source| CrdApplyError::Refused {
            name: name.to_owned(),
            source,
        })?;
    let established = await_condition(api, name, conditions::is_crd_established());
    match tokio::time::timeout(ESTABLISHED_WITHIN, established).await {
        Ok(Ok(Some(_))) => {
            info!(
                crd = name,
                generation = applied.metadata.generation.unwrap_or_default(),
                "CRD applied and Established"
            );
            Ok(())
        }
        Ok(Ok(None)) => Err(CrdApplyError::Disappeared(name.to_owned())),
        Ok(Err(source)) => Err(CrdApplyError::Watch {
            name: name.to_owned(),
            source,
        }),
        Err(_) => Err(CrdApplyError::NotEstablished(name.to_owned())),
    }
}
