//! `trellis render`: reads the rule set, the parent file and `--observed`,
//! prints what one pass would do ([`crate::offline::render`] decides).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{Output, load, load_crds, print_out, warn_dropped};
use crate::manifests::read_objects;
use crate::offline::render::{render_document_with, rule_for};
use crate::plan;
use crate::render::Limits;
use crate::yaml;

#[allow(clippy::too_many_arguments)]
pub fn render(
    dirs: &[PathBuf],
    parent_path: &Path,
    observed_path: Option<&Path>,
    output: Output,
    now: Option<String>,
    limits: Limits,
    crds_path: Option<&Path>,
) -> ExitCode {
    let set = match load(dirs, limits) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let crds = match load_crds(crds_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    warn_dropped(&set, crds.as_ref());
    let parents = match read_objects(parent_path, &yaml::Limits::FILES) {
        Ok(p) => p,
        Err(e) => {
            stderr!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let [parent] = parents.as_slice() else {
        stderr!(
            "error: {}: expected exactly one parent object, found {}",
            parent_path.display(),
            parents.len()
        );
        return ExitCode::from(1);
    };
    let observed = match observed_path
        .map(|p| read_objects(p, &yaml::Limits::OBSERVED))
        .transpose()
    {
        Ok(o) => o.unwrap_or_default(),
        Err(e) => {
            stderr!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let rule = match rule_for(&set, parent) {
        Ok(rule) => rule,
        Err(e) => {
            stderr!("error: {}: {e}", parent_path.display());
            return ExitCode::from(1);
        }
    };
    if parent.pointer("/metadata/uid").is_none() {
        stderr!(
            "note: {} has no metadata.uid; using {} in labels and ownerReferences",
            parent_path.display(),
            plan::PLACEHOLDER_UID
        );
    }
    let now = now.unwrap_or_else(crate::clock::now_rfc3339);
    let doc = render_document_with(rule, parent, observed, &now, crds.as_ref());
    let text = match output {
        Output::Json => serde_json::to_string_pretty(&doc).map_err(|e| e.to_string()),
        Output::Yaml => yaml::to_string(&doc).map_err(|e| e.to_string()),
    };
    match text {
        Ok(text) => {
            if let Err(code) = print_out(&format!("{}\n", text.trim_end())) {
                return code;
            }
            if doc.get("errors").is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            stderr!("error: cannot print the result: {e}");
            ExitCode::from(1)
        }
    }
}
