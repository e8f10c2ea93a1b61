//! Writes as the API server itself recorded them: the shared control plane
//! with a node keeps an audit log of every create, update, patch and delete
//! (`tests/cluster/cluster`, `DIR/logs/audit.log`). A count from there does
//! not rest on the operator's word, and holds the requests of a process
//! killed before anyone could read its own counters.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A place in the audit log: what was written after it is read later.
#[derive(Debug, Clone)]
pub struct Mark {
    path: PathBuf,
    inode: u64,
    offset: u64,
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
    let meta = std::fs::metadata(&path).ok()?;
    Some(Mark {
        path,
        inode: meta.ino(),
        offset: meta.len(),
    })
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
    let now = std::fs::metadata(&mark.path).ok();
    let same_file = now.as_ref().is_some_and(|m| m.ino() == mark.inode);
    let mut texts = Vec::new();
    if same_file {
        texts.push(read_from(&mark.path, mark.offset));
    } else {
        // Rotated: the old file was renamed `audit-<time>.log`; the newest
        // such file is the one the mark was in.
        out.rotated = true;
        if let Some(old) = newest_backup(&mark.path) {
            texts.push(read_from(&old, mark.offset));
        }
        texts.push(read_from(&mark.path, 0));
    }
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

fn read_from(path: &Path, offset: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let _ = file.seek(SeekFrom::Start(offset));
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text
}

fn newest_backup(log: &Path) -> Option<PathBuf> {
    let dir = log.parent()?;
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("audit-") && name.ends_with(".log")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}
