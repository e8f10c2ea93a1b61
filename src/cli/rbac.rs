//! `trellis rbac`: the operator's ClusterRole(s) and its Role in its own
//! namespace, for the rules on disk and, with `--from-cluster`, for the
//! older versions a rollout in progress still runs.
//!
//! A staged rollout keeps up to three versions of a rule live at once; an
//! older one may use kinds (or verbs) the version on disk dropped, and the
//! operator must keep serving it until every parent has moved. Those
//! versions live only in the cluster (the revision ConfigMaps), so offline
//! the command says which rules it cannot vouch for, on stderr, and
//! `--from-cluster` reads them back and covers them too.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use super::{load, print_out};
use crate::operator::rollout::versions;
use crate::render::Limits;
use crate::rules::{CompiledRule, RuleSet};
use crate::yaml;

/// Which roles `trellis rbac` prints.
pub struct RbacRoles {
    /// Also what `trellis run --manage-crds` needs.
    pub manage_crds: bool,
    /// Also what `trellis run --shards` needs.
    pub shards: bool,
    /// Only the read-only role `trellis tree` needs (`--viewer`).
    pub viewer: bool,
    /// Only what the credentials of this spoke need there (`--cluster`).
    pub cluster: Option<String>,
}

pub fn rbac(
    dirs: &[PathBuf],
    name: &str,
    roles: RbacRoles,
    operator_namespace: &str,
    from_cluster: bool,
) -> ExitCode {
    let RbacRoles {
        manage_crds,
        shards,
        viewer,
        cluster,
    } = roles;
    let set = match load(dirs, Limits::default()) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let staged: Vec<&str> = set
        .rules
        .iter()
        .filter(|r| r.rollout.is_some())
        .map(|r| r.name.as_str())
        .collect();
    let live = if from_cluster {
        match live_versions(&set, operator_namespace) {
            Ok(live) => live,
            Err(e) => {
                stderr!("error: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        if !staged.is_empty() {
            stderr!(
                "note: rules with rollout: ({}): only their versions on disk are covered; a rollout in progress may still run older versions: add --from-cluster to cover those too",
                staged.join(", ")
            );
        }
        Vec::new()
    };
    let mut versions: Vec<&CompiledRule> = set.rules.iter().map(|r| r.as_ref()).collect();
    versions.extend(live.iter().map(|r| r.as_ref()));
    // One document per role: the operator's ClusterRole, one ClusterRole
    // per rule with `serviceAccountName`, then the operator's Role.
    let mut documents = Vec::new();
    let roles = if let Some(cluster) = &cluster {
        if let Err(why) = crate::clusters::check_name(cluster) {
            stderr!("error: --cluster: {why}");
            return ExitCode::from(2);
        }
        crate::rbac::spoke_roles(&versions, name, cluster)
    } else if viewer {
        vec![crate::rbac::viewer_role(&versions, name)]
    } else {
        crate::rbac::all_roles_with(&versions, name, operator_namespace, manage_crds, shards)
    };
    for role in roles {
        match yaml::to_string(&role) {
            Ok(text) => documents.push(text.trim_end().to_owned()),
            Err(e) => {
                stderr!("error: {e}");
                return ExitCode::from(1);
            }
        }
    }
    print_out(&format!("{}\n", documents.join("\n---\n")))
        .err()
        .unwrap_or(ExitCode::SUCCESS)
}

/// The versions of the set's rules with `rollout:`, other than the one on
/// disk, that the rollout recorded in `namespace` still runs (its live
/// versions), rebuilt from their ConfigMaps. Each is named on stderr; a live
/// version that cannot be read back is an error, since the output would
/// not cover it.
fn live_versions(set: &RuleSet, namespace: &str) -> Result<Vec<Arc<CompiledRule>>, String> {
    super::with_cluster(|client| async move {
        let mut out = Vec::new();
        for rule in set.rules.iter().filter(|r| r.rollout.is_some()) {
            let stored = versions::list(&client, namespace, &rule.name)
                .await
                .map_err(|e| {
                    format!(
                        "cannot list the revision ConfigMaps of rule {} in namespace {namespace}: {e}",
                        rule.name
                    )
                })?;
            let record = versions::current_record(&stored, &rule.revision)
                .and_then(|s| s.record.as_ref());
            let Some(record) = record else {
                stderr!(
                    "rule {}: no rollout recorded in namespace {namespace}: the version on disk ({}) only",
                    rule.name,
                    rule.revision
                );
                continue;
            };
            for revision in record.state.live() {
                if revision == rule.revision {
                    continue;
                }
                let name = versions::configmap_name(&rule.name, revision);
                let version = stored
                    .iter()
                    .find(|s| s.revision == revision)
                    .ok_or_else(|| {
                        format!(
                            "rule {}: revision {revision} is live but ConfigMap {namespace}/{name} is missing",
                            rule.name
                        )
                    })?
                    .compile(Limits::default())
                    .map_err(|e| {
                        format!(
                            "rule {}: live revision {revision} (ConfigMap {namespace}/{name}) cannot be rebuilt, so it is not covered: {e}",
                            rule.name
                        )
                    })?;
                stderr!(
                    "rule {}: covers live revision {revision} (ConfigMap {namespace}/{name}) beside the version on disk ({})",
                    rule.name,
                    rule.revision
                );
                out.push(Arc::new(version));
            }
        }
        Ok::<_, String>(out)
    })
    .map_err(|e| format!("--from-cluster: {e}"))
}
