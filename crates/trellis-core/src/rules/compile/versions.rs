//! `spec.versions` and `spec.storageVersion`, checked and compiled: each
//! version's name, its `toHub`/`fromHub` templates (parent, spec, metadata,
//! rule and the vars that need no pass in scope: a conversion has no
//! children or related objects, so a var that reads them, itself or
//! through another var, is refused there), its `lossy` paths; the storage
//! version among the served ones. The CRD side is `rules::crd::versions`; converting is
//! `crate::conversion`.

use std::collections::BTreeSet;

use super::lint::{Code, lint};
use super::{Checker, CompiledVar, Known, VarReads};
use crate::kinds::Gvk;
use crate::render::{EngineBuilder, TemplateId, TemplateKind};
use crate::rules::model::RuleSpec;

/// At most this many versions besides the hub.
pub const MAX_VERSIONS: usize = 8;

/// One version besides the hub, compiled.
#[derive(Debug, Clone)]
pub struct CompiledVersion {
    pub name: String,
    /// `group/name`, as objects of this version carry it.
    pub api_version: String,
    pub served: bool,
    pub to_hub: TemplateId,
    pub from_hub: TemplateId,
    /// Hub paths (as keys, `spec` first) a round trip may lose.
    pub lossy: Vec<Vec<String>>,
    /// The vars its two templates read.
    pub reads_vars: VarReads,
}

/// The names a conversion template may read.
fn names() -> BTreeSet<&'static str> {
    ["parent", "spec", "metadata", "rule", "vars"]
        .into_iter()
        .collect()
}

/// The versions of `spec`, and the storage version's name; every problem
/// reported at its field.
pub(super) fn compile(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    spec: &RuleSpec,
    parent: &Gvk,
    vars: &[CompiledVar],
) -> (Vec<CompiledVersion>, String) {
    let hub = parent.version.clone();
    if spec.versions.is_empty() {
        if let Some(storage) = spec.storage_version.as_ref().filter(|s| **s != hub) {
            ck.error(
                "spec.storageVersion",
                format!(
                    "`{storage}` is not a version of this kind: the only one is the hub, `{hub}`"
                ),
            );
        }
        return (Vec::new(), hub);
    }
    if spec.crd.is_none() {
        ck.error(
            "spec.versions",
            "versions are served by the CRD trellis generates: set `crd:` too",
        );
    }
    if spec.versions.len() > MAX_VERSIONS {
        ck.error(
            "spec.versions",
            format!(
                "{} versions, more than the limit of {MAX_VERSIONS}",
                spec.versions.len()
            ),
        );
        return (Vec::new(), hub);
    }
    let known = Known {
        vars: vars.iter().map(|v| v.name.clone()).collect(),
        ..Known::default()
    };
    let mut seen: BTreeSet<&str> = [hub.as_str()].into();
    let mut out = Vec::new();
    for (i, v) in spec.versions.iter().enumerate() {
        let at = format!("spec.versions[{i}]");
        if !is_version_name(&v.name) {
            ck.error(
                &format!("{at}.name"),
                format!(
                    "`{}` is not a version name (a DNS-1035 label such as `v1` or `v1beta1`)",
                    v.name
                ),
            );
        } else if !seen.insert(&v.name) {
            ck.error(
                &format!("{at}.name"),
                if v.name == hub {
                    format!(
                        "`{}` is the hub (`spec.parent.apiVersion`): list only the other versions",
                        v.name
                    )
                } else {
                    format!("version `{}` is listed twice", v.name)
                },
            );
        }
        let mut reads_vars = VarReads::default();
        let mut template = |ck: &mut Checker,
                            builder: &mut EngineBuilder,
                            which: &str,
                            text: &str| {
            let field = format!("{at}.{which}");
            match builder.add_template(
                &format!("version:{}:{which}", v.name),
                TemplateKind::Object,
                text,
            ) {
                Ok(id) => {
                    lint(ck, builder, &field, Code::Object(&id, text));
                    let used = builder.template_names(&id, true);
                    ck.check_names(&field, "a conversion template", used, &names(), &known);
                    let reads = VarReads::of(&builder.template_calls(&id));
                    for var in vars.iter().filter(|v| v.reads_pass && reads.reads(&v.name)) {
                        ck.error(
                            &field,
                            format!(
                                "reads `vars.{}`, which reads related objects or children: a conversion has neither (only spec, metadata and the parent)",
                                var.name
                            ),
                        );
                    }
                    reads_vars.any |= reads.any;
                    reads_vars.names.extend(reads.names);
                    Some(id)
                }
                Err(err) => {
                    ck.error(&field, format!("template syntax: {err}"));
                    None
                }
            }
        };
        let to_hub = template(ck, builder, "toHub", &v.to_hub);
        let from_hub = template(ck, builder, "fromHub", &v.from_hub);
        let mut lossy = Vec::new();
        for (n, path) in v.lossy.iter().enumerate() {
            match crate::ownership::parse_path(path) {
                Ok(keys) if keys.first().map(String::as_str) == Some("spec") => lossy.push(keys),
                Ok(_) => ck.error(
                    &format!("{at}.lossy[{n}]"),
                    format!("`{path}` is not under `spec`: only the spec is converted"),
                ),
                Err(err) => ck.error(&format!("{at}.lossy[{n}]"), err.to_string()),
            }
        }
        if let (Some(to_hub), Some(from_hub)) = (to_hub, from_hub) {
            out.push(CompiledVersion {
                name: v.name.clone(),
                api_version: format!("{}/{}", parent.group, v.name),
                served: v.served,
                to_hub,
                from_hub,
                lossy,
                reads_vars,
            });
        }
    }
    let storage = spec.storage_version.clone().unwrap_or_else(|| hub.clone());
    let stored = spec.versions.iter().find(|v| v.name == storage);
    if storage != hub && stored.is_none() {
        ck.error(
            "spec.storageVersion",
            format!("`{storage}` is neither the hub (`{hub}`) nor one of `versions`"),
        );
    } else if stored.is_some_and(|v| !v.served) {
        ck.error(
            "spec.storageVersion",
            format!("`{storage}` is not served: objects are stored only in a served version"),
        );
    }
    (out, storage)
}

/// A Kubernetes version name: a DNS-1035 label (a letter first).
fn is_version_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}
