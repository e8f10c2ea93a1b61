//! The API server's own record of who wrote what: its audit log (the shared
//! control plane logs every create, update, patch and delete at level
//! Metadata when it runs with the node, see tests/cluster). Processes that
//! share one address and one kubeconfig user are told apart by giving each
//! a kubeconfig that impersonates a user of its own ([`impersonating_kubeconfig`]).

use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;
use serde_json::Value;

fn log_path() -> PathBuf {
    super::node::state_dir().join("logs/audit.log")
}

/// Where the audit log ends now: pass it to [`writes_since`].
pub fn offset() -> u64 {
    std::fs::metadata(log_path()).map(|m| m.len()).unwrap_or(0)
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

/// The writes to objects in `namespace` logged after `offset`.
pub fn writes_since(offset: u64, namespace: &str) -> Vec<Write> {
    let path = log_path();
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len() as u64 >= offset,
        "{} shrank below byte {offset}: the API server rotated it mid-test",
        path.display()
    );
    let text = String::from_utf8_lossy(&bytes[offset as usize..]);
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
