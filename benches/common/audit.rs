//! Writes as the API server itself recorded them: the shared control plane
//! with a node keeps an audit log of every create, update, patch and delete
//! (`tests/cluster/cluster`, `DIR/logs/audit.log`). A count from there does
//! not rest on the operator's word, and holds the requests of a process
//! killed before anyone could read its own counters.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::support::audit::{mark_in, text_since};

/// A place in the audit log: what was written after it is read later.
#[derive(Debug, Clone)]
pub struct Mark {
    path: PathBuf,
    at: crate::support::audit::Mark,
}

/// Write requests on one namespace's objects of one resource, by object
/// name, as the audit log recorded them after a [`Mark`].
#[derive(Debug, Default, Clone)]
pub struct Writes {
    /// Object name → write requests (any verb that changes something).
    pub by_name: BTreeMap<String, u64>,
    /// Object name → those the API server answered with success (2xx).
    pub ok_by_name: BTreeMap<String, u64>,
    /// Write requests refused (code ≥ 400), e.g. cancelled by a SIGKILL
    /// while in flight (504): such a write may or may not have landed.
    pub refused: u64,
    /// Whether the log rotated between the mark and the read (the count
    /// then also read the rotated file).
    pub rotated: bool,
}

impl Writes {
    pub fn total(&self) -> u64 {
        self.by_name.values().sum()
    }

    /// Objects the API server accepted a write for more than once: every
    /// write beyond the first.
    pub fn repeated(&self) -> u64 {
        self.ok_by_name.values().map(|&n| n.saturating_sub(1)).sum()
    }
}

/// The audit log of the tests' control plane; `None` when there is none
/// (a cluster without a node, or another cluster).
pub fn log_path() -> Option<PathBuf> {
    let path = crate::support::cluster_dir().join("logs/audit.log");
    path.is_file().then_some(path)
}

/// Where the audit log ends now.
pub fn mark() -> Option<Mark> {
    let path = log_path()?;
    let at = mark_in(&path)?;
    Some(Mark { path, at })
}

/// Write requests on `resource` objects in `namespace` whose name passes
/// `wanted`, recorded after `mark`. The API server writes audit events in
/// batches: read a few seconds after the last write.
pub fn writes_since(
    mark: &Mark,
    namespace: &str,
    resource: &str,
    wanted: impl Fn(&str) -> bool,
) -> Writes {
    let mut out = Writes::default();
    let (text, rotated) = text_since(&mark.path, &mark.at);
    out.rotated = rotated;
    let texts = [text];
    let needle = format!("\"namespace\":\"{namespace}\"");
    for text in &texts {
        for line in text.lines().filter(|l| l.contains(&needle)) {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let object = &event["objectRef"];
            if event["stage"] != "ResponseComplete"
                || object["resource"] != resource
                || object["namespace"] != namespace
                || object["subresource"].is_string()
            {
                continue;
            }
            let name = object["name"].as_str().unwrap_or_default();
            if !wanted(name) {
                continue;
            }
            *out.by_name.entry(name.to_owned()).or_default() += 1;
            match event["responseStatus"]["code"].as_u64().unwrap_or(0) {
                200..=299 => *out.ok_by_name.entry(name.to_owned()).or_default() += 1,
                _ => out.refused += 1,
            }
        }
    }
    out
}
