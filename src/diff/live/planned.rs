//! One live parent's pass, planned exactly as the operator would plan it
//! now: `trellis diff` dry-runs its writes, `trellis tree` shows it.

use std::sync::Arc;

use kube::Client;
use serde_json::Value;

use super::spokes::Spokes;
use super::{Kinds, LiveError, live_children, plan_with_reads};
use crate::plan::{self, Observed};
use crate::rules::CompiledRule;

/// One live parent's pass, as the operator would plan it now.
pub(crate) enum Planned {
    /// The operator's entry checks stop it (paused, being deleted, out of
    /// scope): why.
    Skipped(String),
    Pass {
        /// The version that renders this parent (during a staged
        /// rollout, the one it is due to run).
        rule: Arc<CompiledRule>,
        /// The children, related objects and patch targets read.
        observed: Observed,
        plan: Box<plan::Plan>,
    },
}

/// Plans one pass over the live `parent` exactly as the operator would:
/// its entry checks, its children as the caches hold them, the version it
/// is due to run, and the related objects and patch targets the pass reads
/// (`trellis diff` and `trellis tree` both start here). Reads only.
/// Children in spokes, and related entries read there, come from `spokes`.
pub(crate) async fn plan_live(
    client: &Client,
    newest: &Arc<CompiledRule>,
    versions: Option<&crate::operator::versions::Versions>,
    kinds: &Kinds,
    parent: &Value,
    spokes: &Spokes,
) -> Result<Planned, LiveError> {
    // The operator's entry checks, in the operator's order.
    if let Some(why) = crate::pass::entry(newest, parent, None).skipped() {
        return Ok(Planned::Skipped(why));
    }
    let uid = parent
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();

    // The children, as the operator's caches hold them.
    let mut objects = live_children(client, newest, kinds, uid).await?;
    let (placed, clusters) = spokes.children(newest, uid).await;
    objects.extend(placed);
    let rule = match versions {
        None => newest.clone(),
        Some(v) => {
            let on = parent
                .pointer("/status/ruleRevision")
                .or_else(|| {
                    objects.iter().find_map(|o| {
                        o.pointer("/metadata/labels")?
                            .get(crate::plan::LABEL_REVISION)
                    })
                })
                .and_then(Value::as_str);
            v.rule_for(newest, uid, on)
        }
    };
    let reading = super::Reading {
        client,
        kinds,
        spokes,
        clusters: &clusters,
    };
    let (observed, plan) = plan_with_reads(&reading, &rule, parent, objects).await?;
    Ok(Planned::Pass {
        rule,
        observed,
        plan: Box::new(plan),
    })
}
