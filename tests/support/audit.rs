//! The API server's own record of who wrote what: its audit log (the shared
//! control plane logs every create, update, patch and delete at level
//! Metadata, see tests/cluster). Processes that
//! share one address and one kubeconfig user are told apart by giving each
//! a kubeconfig that impersonates a user of its own ([`impersonating_kubeconfig`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;
use serde_json::Value;

/// The local control plane's audit log: in its state directory, or beside
/// the kubeconfig `TRELLIS_TEST_KUBECONFIG` names when that is one
/// (`tests/cluster/cluster up DIR` writes DIR/kubeconfig).
fn log_path() -> PathBuf {
    let cluster = super::cluster();
    let dir = cluster.dir.clone().or_else(|| {
        let beside = cluster.kubeconfig_path.as_ref()?.parent()?.to_path_buf();
        beside.join("logs/audit.log").is_file().then_some(beside)
    });
    match dir {
        Some(dir) => dir.join("logs/audit.log"),
        None => panic!(
            "no audit log: {} is not a control plane of tests/cluster/cluster",
            cluster.source
        ),
    }
}

/// A place in an audit log: what was written after it is read later, also
/// across a rotation (the API server renames a full log to
/// `audit-<time>.log`, keeping one such backup, and starts a new one).
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    inode: u64,
    offset: u64,
}

/// Where the audit log at `log` ends now; `None` when there is none.
pub fn mark_in(log: &Path) -> Option<Mark> {
    let meta = std::fs::metadata(log).ok()?;
    Some(Mark {
        inode: meta.ino(),
        offset: meta.len(),
    })
}

/// Where the test cluster's audit log ends now: pass it to [`writes_since`].
pub fn offset() -> Mark {
    mark_in(&log_path()).unwrap_or(Mark {
        inode: 0,
        offset: 0,
    })
}

/// The text `log` gained after `mark`, and whether it rotated meanwhile (the
/// text then starts in the newest backup). Rotated twice, the first part is
/// gone: the API server keeps one backup.
pub fn text_since(log: &Path, mark: &Mark) -> (String, bool) {
    let now = std::fs::metadata(log).ok();
    if mark.inode == 0 || now.as_ref().is_some_and(|m| m.ino() == mark.inode) {
        let from = if mark.inode == 0 { 0 } else { mark.offset };
        return (read_from(log, from), false);
    }
    let mut text = newest_backup(log)
        .map(|old| read_from(&old, mark.offset))
        .unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&read_from(log, 0));
    (text, true)
}

fn read_from(path: &Path, offset: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = Vec::new();
    if let Ok(mut file) = std::fs::File::open(path)
        && file.seek(SeekFrom::Start(offset)).is_ok()
    {
        let _ = file.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
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

/// One write the API server completed, as its audit log records it.
#[derive(Debug, Clone)]
pub struct Write {
    /// The impersonated user, else the authenticated one.
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub code: u16,
    /// When the API server received it.
    pub received: k8s_openapi::jiff::Timestamp,
}

/// The writes to objects in `namespace` logged after `mark`.
pub fn writes_since(mark: Mark, namespace: &str) -> Vec<Write> {
    writes_in(&log_path(), mark, namespace)
}

/// [`writes_since`] in the audit log at `log` (another control plane's).
pub fn writes_in(log: &Path, mark: Mark, namespace: &str) -> Vec<Write> {
    let (text, _) = text_since(log, &mark);
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && e["objectRef"]["namespace"] == namespace)
        .filter_map(|e| {
            let user = e["impersonatedUser"]["username"]
                .as_str()
                .or(e["user"]["username"].as_str())?
                .to_owned();
            let object = &e["objectRef"];
            Some(Write {
                user,
                verb: e["verb"].as_str()?.to_owned(),
                resource: object["resource"].as_str()?.to_owned(),
                subresource: object["subresource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                name: object["name"].as_str().unwrap_or_default().to_owned(),
                code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                received: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
            })
        })
        .collect()
}

/// A kubeconfig file at `path`: the test cluster's, acting as `user` (in
/// group system:masters, so it may do all the cluster admin may). The API
/// server checks and logs the impersonated user, not the admin.
pub fn impersonating_kubeconfig(path: &Path, user: &str) -> PathBuf {
    let mut config: Kubeconfig = super::cluster().kubeconfig.clone();
    for named in &mut config.auth_infos {
        let info = named.auth_info.get_or_insert_with(Default::default);
        info.impersonate = Some(user.to_owned());
        info.impersonate_groups = Some(vec![
            "system:masters".to_owned(),
            "system:authenticated".to_owned(),
        ]);
    }
    let text = serde_json::to_string(&config).expect("kubeconfig as JSON");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path.to_owned()
}
