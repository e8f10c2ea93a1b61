//! The offline commands besides `render`, `check` and `rbac` (`schema`,
//! `graph`, `crd`) and `diff`, which asks the live cluster.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use super::{GraphOutput, load, print_out};
use crate::manifests::read_objects;
use crate::render::Limits;
use crate::rules::RuleSet;
use crate::yaml;

pub fn schema() -> ExitCode {
    match serde_json::to_string_pretty(&crate::rules::model::json_schema()) {
        Ok(text) => print_out(&format!("{text}\n"))
            .err()
            .unwrap_or(ExitCode::SUCCESS),
        Err(e) => {
            stderr!("error: {e}");
            ExitCode::from(1)
        }
    }
}

pub fn graph(dirs: &[PathBuf], rule: Option<&str>, output: GraphOutput) -> ExitCode {
    let set = match load(dirs, Limits::default()) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let graphs: Vec<crate::graph::Graph> = set
        .rules
        .iter()
        .filter(|r| rule.is_none_or(|name| r.name == name))
        .map(|r| crate::graph::Graph::of(r))
        .collect();
    if let (Some(name), true) = (rule, graphs.is_empty()) {
        eprintln!(
            "error: no rule named `{name}` (rules: {})",
            set.rules
                .iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return ExitCode::from(1);
    }
    print!(
        "{}",
        match output {
            GraphOutput::Dot => crate::graph::to_dot(&graphs),
            GraphOutput::Mermaid => crate::graph::to_mermaid(&graphs),
        }
    );
    ExitCode::SUCCESS
}

/// `trellis diff` (a PARENT.yaml, or `--all` narrowed by `namespace` and
/// `rule`): exit 0 nothing would change, 1 something would, 2 error.
pub fn diff(
    dirs: &[PathBuf],
    parent_path: Option<&Path>,
    namespace: Option<String>,
    rule: Option<String>,
    operator_namespace: Option<String>,
    limits: Limits,
) -> ExitCode {
    let error = ExitCode::from(2);
    let Ok(set) = load(dirs, limits) else {
        return error;
    };
    let manifest = match parent_path
        .map(|p| read_objects(p, &yaml::Limits::FILES).map(|docs| (p, docs)))
        .transpose()
    {
        Ok(None) => None,
        Ok(Some((path, docs))) => match <[Value; 1]>::try_from(docs) {
            Ok([doc]) => Some(doc),
            Err(docs) => {
                stderr!(
                    "error: {}: expected exactly one parent object, found {}",
                    path.display(),
                    docs.len()
                );
                return error;
            }
        },
        Err(e) => {
            stderr!("error: {e}");
            return error;
        }
    };
    let target = match &manifest {
        Some(doc) => crate::diff::live::Target::Parent(doc),
        None => crate::diff::live::Target::All { namespace, rule },
    };
    let home = crate::operator::home::operator_namespace(operator_namespace.as_deref());
    let report = super::with_cluster(|client| async move {
        crate::diff::live::diff_as(&client, &set, &target, &home).await
    });
    match report {
        Ok(report) => {
            for note in &report.notes {
                stderr!("note: {note}");
            }
            let text = crate::diff::crd::print(&report.crds) + &crate::diff::print(&report.diffs);
            if print_out(&text).is_err() {
                return error;
            }
            let code = crate::diff::crd::exit_code(&report.crds);
            ExitCode::from(code.max(crate::diff::exit_code(&report.diffs)))
        }
        Err(e) => {
            stderr!("error: {e}");
            error
        }
    }
}

/// The YAML stream `trellis crd` prints: one document per rule with `crd:`,
/// in rule-name order.
pub fn crd_documents(set: &RuleSet) -> Result<String, yaml::SerializeError> {
    let mut out = String::new();
    for crd in set.rules.iter().filter_map(|r| r.crd.as_ref()) {
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&yaml::to_string(crd)?);
    }
    Ok(out)
}

/// `trellis convert`: every object of `parent_path` at version `to`.
pub fn convert(dirs: &[PathBuf], parent_path: &Path, to: &str) -> ExitCode {
    let Ok(set) = load(dirs, Limits::default()) else {
        return ExitCode::from(2);
    };
    let objects = match read_objects(parent_path, &yaml::Limits::FILES) {
        Ok(objects) => objects,
        Err(e) => {
            stderr!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let version = to.rsplit('/').next().unwrap_or(to);
    let mut out = String::new();
    let mut failed = false;
    for object in &objects {
        let gvk = crate::kinds::Gvk::new(
            object
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            object
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let converted = crate::conversion::rule_for(&set, &gvk.group, &gvk.kind)
            .ok_or_else(|| crate::conversion::ConversionError::NoRule {
                group: gvk.group.clone(),
                kind: gvk.kind.clone(),
            })
            .and_then(|rule| crate::conversion::convert(rule, object, version));
        match converted.map(|c| yaml::to_string(&c)) {
            Ok(Ok(text)) => {
                if !out.is_empty() {
                    out.push_str("---\n");
                }
                out.push_str(&text);
            }
            Ok(Err(e)) => {
                stderr!("error: {} {name}: {e}", gvk.kind);
                failed = true;
            }
            Err(e) => {
                stderr!("error: {}: {} {name}: {e}", parent_path.display(), gvk.kind);
                failed = true;
            }
        }
    }
    if let Err(code) = print_out(&out) {
        return code;
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `trellis crd --against-cluster`: per rule with `crd:`, whether applying
/// its CRD over the live one would break anything. Exit 0 when nothing
/// unallowed would, 1 when something would, 2 on an error.
pub fn crd_against_cluster(dirs: &[PathBuf]) -> ExitCode {
    let Ok(set) = load(dirs, Limits::default()) else {
        return ExitCode::from(2);
    };
    let verdicts = super::with_cluster(|client| async move {
        let mut out = Vec::new();
        for rule in set.rules.iter().filter(|r| r.crd.is_some()) {
            let crd = rule.crd.as_ref().expect("filtered");
            let changes = crate::operator::crds::breaking_changes(&client, crd).await?;
            let allowed = rule.allows_breaking_crd();
            out.push((rule.name.clone(), crd_name(crd), changes, allowed));
        }
        Ok::<_, crate::operator::crds::CrdApplyError>(out)
    });
    let verdicts = match verdicts {
        Ok(v) => v,
        Err(e) => {
            stderr!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut text = String::new();
    let mut refused = false;
    for (rule, name, changes, allowed) in &verdicts {
        if changes.is_empty() {
            text.push_str(&format!(
                "rule {rule}: CustomResourceDefinition {name}: safe to apply\n"
            ));
            continue;
        }
        refused |= !allowed;
        text.push_str(&format!(
            "rule {rule}: CustomResourceDefinition {name}: breaking{}\n",
            if *allowed {
                " (applied anyway: allowBreaking)"
            } else {
                " (not applied by --manage-crds)"
            }
        ));
        for change in changes {
            text.push_str(&format!("  {change}\n"));
        }
    }
    if let Err(code) = print_out(&text) {
        return code;
    }
    ExitCode::from(u8::from(refused))
}

fn crd_name(crd: &Value) -> String {
    crd.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

pub fn crd(dirs: &[PathBuf]) -> ExitCode {
    let set = match load(dirs, Limits::default()) {
        Ok(set) => set,
        Err(code) => return code,
    };
    if !set.rules.iter().any(|r| r.crd.is_some()) {
        stderr!("note: no rule sets `crd:`; nothing to print");
        return ExitCode::SUCCESS;
    }
    match crd_documents(&set) {
        Ok(text) => print_out(&text).err().unwrap_or(ExitCode::SUCCESS),
        Err(e) => {
            stderr!("error: {e}");
            ExitCode::from(1)
        }
    }
}
