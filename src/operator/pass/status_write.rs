//! Writing a parent's status: the patch [`crate::status_patch`] computes,
//! sent only when something changed, and the fields the API server dropped
//! reported once.

use kube::ResourceExt;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::{Value, json};
use tracing::warn;

use crate::operator::context::{Error, RuleCtx};
use crate::operator::lock;
use crate::status_patch::{
    leaf_paths, pointer, stale_fields, status_patch, status_unchanged, without_paths,
};

/// Writes the status if it changed; whether a write was sent.
pub(in crate::operator) async fn write_status(
    ctx: &RuleCtx,
    rule: &crate::rules::CompiledRule,
    parent: &DynamicObject,
    parent_json: &Value,
    status: Value,
) -> Result<bool, Error> {
    let current = parent_json.get("status");
    let owned = rule.status_paths();
    let stale = stale_fields(owned.iter().map(Vec::as_slice), current, &status);
    // Fields the API server is known to drop would otherwise make every pass
    // look like a change; they are still sent along with any real one.
    let comparable = without_paths(&status, &lock(&ctx.warned));
    if stale.is_empty() && status_unchanged(current, &comparable) {
        return Ok(false);
    }
    let subresource = ctx.kinds.parent.status_subresource;
    let claim = if subresource {
        None
    } else {
        parent.metadata.generation
    };
    let mut patch = status_patch(rule, current, &status, claim);
    if !subresource {
        // The generation claimed holds only if nothing else changes the parent first.
        patch["metadata"] = json!({ "resourceVersion": parent.resource_version() });
    }
    let api = ctx.parent_api(parent);
    let name = parent.name_any();
    ctx.check_write(&parent.uid().unwrap_or_default())?;
    let result = if ctx.kinds.parent.status_subresource {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
    } else {
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
    };
    let written = match result {
        Ok(obj) => {
            ctx.shared
                .metrics
                .status_writes
                .get_or_create(&crate::telemetry::RuleLabel {
                    rule: ctx.rule().name.clone(),
                })
                .inc();
            obj
        }
        // Gone, or changed since it was read: the change brings another pass.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(true),
        Err(err) => return Err(Error::Status(err)),
    };
    // The API server silently prunes fields its schema does not know.
    let kept = written.status_value().unwrap_or(Value::Null);
    if let Some(uid) = parent.uid() {
        ctx.remember_status(&uid, parent.resource_version(), &kept);
    }
    let mut paths = Vec::new();
    leaf_paths(&status, &mut Vec::new(), &mut paths);
    for segments in paths {
        if kept.pointer(&pointer(&segments)).is_none() {
            let path = segments.join(".");
            let first = lock(&ctx.warned).insert(path.clone());
            if first {
                let message = format!(
                    "the API server dropped status.{path}: the CRD's status schema does not declare it"
                );
                warn!(rule = %ctx.rule().name, "{message}");
                ctx.event(parent, EventType::Warning, "StatusFieldDropped", message)
                    .await;
            }
        }
    }
    Ok(true)
}
