//! What `--manage-crds` would do to each rule's generated CRD: the live
//! CRD against the API server's answer to a dry-run of the apply the
//! operator sends, and whether the change is breaking (it would then not
//! be applied, and the rule would keep its last good version).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

use super::LiveError;
use crate::diff::{CrdChange, CrdDiff, object_changes};
use crate::rules::CompiledRule;

/// Adds the CRD diff of `rule` (if it has `crd:`) to `report`, or a note
/// saying why it could not be compared (a diff of the parents needs no
/// right on CRDs; this one needs get and, for the dry-run, patch).
pub(super) async fn add(client: &Client, rule: &CompiledRule, report: &mut super::Report) {
    match crd_diff(client, rule).await {
        Ok(diff) => report.crds.extend(diff),
        Err(e) => report
            .notes
            .push(format!("rule {}: its CRD is not compared: {e}", rule.name)),
    }
}

/// The CRD diff of `rule`, or `None` when it has no `crd:`.
async fn crd_diff(client: &Client, rule: &CompiledRule) -> Result<Option<CrdDiff>, LiveError> {
    let Some(generated) = &rule.crd else {
        return Ok(None);
    };
    let name = generated
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let what = || format!("CustomResourceDefinition {name}");
    let live = api.get_opt(&name).await.map_err(LiveError::api(what()))?;
    let Some(live) = live else {
        return Ok(Some(CrdDiff {
            rule: rule.name.clone(),
            name,
            change: CrdChange::Create,
        }));
    };
    let live = serde_json::to_value(&live).unwrap_or_default();
    let mut applied = generated.clone();
    // Where the webhook is and its CA are the running operator's, not the
    // rule's: keep the live ones, so only the rule's change shows.
    if let (Some(client_config), Some(webhook)) = (
        live.pointer("/spec/conversion/webhook/clientConfig"),
        applied.pointer_mut("/spec/conversion/webhook"),
    ) {
        webhook["clientConfig"] = client_config.clone();
    }
    let params = PatchParams::apply(crate::crd::FIELD_MANAGER)
        .force()
        .dry_run();
    let after = api
        .patch(&name, &params, &Patch::Apply(&applied))
        .await
        .map_err(LiveError::api(format!("{} (dry-run apply)", what())))?;
    let after = serde_json::to_value(&after).unwrap_or_default();
    let fields = object_changes(&live, &after);
    let breaking = crate::crd::breaking::changes(&live, generated);
    Ok(Some(CrdDiff {
        rule: rule.name.clone(),
        name,
        change: if fields.is_empty() && breaking.is_empty() {
            CrdChange::Unchanged
        } else {
            CrdChange::Update {
                fields,
                breaking: breaking.iter().map(ToString::to_string).collect(),
                allowed: rule.allows_breaking_crd(),
            }
        },
    }))
}
