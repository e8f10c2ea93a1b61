//! Whether a rule's parents converged and, when not, what is left: which
//! parents, their `Ready`/`Synced` conditions (reason, message,
//! observedGeneration against generation) and which children they lack. A
//! wait that times out on [`check`] says what did not converge, not only
//! that something did not.

use std::collections::BTreeMap;

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

/// What "converged" means for one rule's parents in one namespace.
pub struct Expect<'a> {
    pub namespace: &'a str,
    /// The parent kind.
    pub parents: &'a ApiResource,
    /// How many parents there must be.
    pub count: usize,
    /// The rule's name (its children carry it as `trellis.dev/rule`).
    pub rule: &'a str,
    /// Each parent has exactly one child of each of these kinds.
    pub children: &'a [ApiResource],
}

/// Parents listed in a failure message, at most.
const SHOWN: usize = 12;

/// One condition as a failure message shows it.
fn condition_text(parent: &DynamicObject, type_: &str) -> String {
    let Some(c) = super::operator::condition(parent, type_) else {
        return format!("{type_}: none");
    };
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    let observed = match &c["observedGeneration"] {
        Value::Null => String::new(),
        g => format!(", observedGeneration {g}"),
    };
    format!(
        "{type_}={}/{}{observed}: {:?}",
        s("status"),
        s("reason"),
        s("message")
    )
}

/// Whether `parent` is Ready=True and Synced=True for its current generation.
pub fn parent_converged(parent: &DynamicObject) -> bool {
    let is_true = |t: &str| {
        super::operator::condition(parent, t).is_some_and(|c| c["status"].as_str() == Some("True"))
    };
    is_true("Ready")
        && is_true("Synced")
        && observed_generation(parent) == parent.metadata.generation
}

fn observed_generation(parent: &DynamicObject) -> Option<i64> {
    parent.data.pointer("/status/observedGeneration")?.as_i64()
}

/// A parent's conditions and generations, for a failure message.
pub fn describe(parent: &DynamicObject) -> String {
    format!(
        "{}: {}; {}; generation {:?}, status.observedGeneration {:?}",
        parent.name_any(),
        condition_text(parent, "Ready"),
        condition_text(parent, "Synced"),
        parent.metadata.generation,
        observed_generation(parent),
    )
}

/// `Ok` once every parent converged and has its children; otherwise what is
/// left, parent by parent.
pub async fn check(client: &Client, expect: &Expect<'_>) -> Result<(), String> {
    let ns = expect.namespace;
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, expect.parents);
    let parents = parents
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing {} in {ns}: {e}", expect.parents.kind))?
        .items;
    // Children by parent uid, per kind.
    let selector = ListParams::default().labels(&format!("trellis.dev/rule={}", expect.rule));
    let mut children: Vec<(&str, BTreeMap<String, usize>, usize)> = Vec::new();
    for kind in expect.children {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, kind);
        let items = api
            .list(&selector)
            .await
            .map_err(|e| format!("listing {} in {ns}: {e}", kind.kind))?
            .items;
        let mut by_parent = BTreeMap::new();
        for child in &items {
            let uid = child
                .labels()
                .get("trellis.dev/parent-uid")
                .cloned()
                .unwrap_or_default();
            *by_parent.entry(uid).or_default() += 1;
        }
        children.push((kind.kind.as_str(), by_parent, items.len()));
    }

    let mut left = Vec::new();
    for parent in &parents {
        let uid = parent.uid().unwrap_or_default();
        let wrong: Vec<String> = children
            .iter()
            .filter_map(|(kind, by_parent, _)| match by_parent.get(&uid) {
                Some(1) => None,
                None => Some(format!("no {kind}")),
                Some(n) => Some(format!("{n} {kind}s")),
            })
            .collect();
        if !parent_converged(parent) || !wrong.is_empty() {
            let children = if wrong.is_empty() {
                String::new()
            } else {
                format!("; children: {}", wrong.join(", "))
            };
            left.push(format!("{}{children}", describe(parent)));
        }
    }
    let counts: Vec<String> = children
        .iter()
        .map(|(kind, _, total)| format!("{total} {kind}s"))
        .collect();
    if left.is_empty()
        && parents.len() == expect.count
        && children.iter().all(|(_, _, total)| *total == expect.count)
    {
        return Ok(());
    }
    let unconverged = left.len();
    let more = unconverged.saturating_sub(SHOWN);
    left.truncate(SHOWN);
    if more > 0 {
        left.push(format!("... and {more} more"));
    }
    Err(format!(
        "{} of {} {}s in {ns} not converged (want {} parents, each with one child of each kind; \
         found {}):\n  {}",
        unconverged,
        parents.len(),
        expect.parents.kind,
        expect.count,
        counts.join(", "),
        left.join("\n  ")
    ))
}
