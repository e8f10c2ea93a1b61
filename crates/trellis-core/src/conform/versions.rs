//! Round trips through every version of a kind (`spec.versions`): the
//! sample parent (or the one given with `--observed`) converted from the
//! hub to each version and back must come back whole, but for the paths
//! that version lists as `lossy`. A conversion that fails is an error too:
//! the API server would fail every request that needs it.

use serde_json::Value;

use crate::rules::{CompiledRule, Diagnostic};

pub(super) fn findings(rule: &CompiledRule, parent: &Value) -> Vec<Diagnostic> {
    let mut hub = parent.clone();
    hub["apiVersion"] = Value::String(rule.parent.api_version());
    round_trips(rule, &hub, "the sample parent")
}

/// The round trips of each of `parents` (`trellis check --parents DIR`:
/// stored parents, at any version of `rule`'s kind): each is converted to
/// the hub (a failure is an error), then through every version and back.
/// `(file, object)` pairs; objects of other kinds are left alone.
pub fn parent_findings(rule: &CompiledRule, parents: &[(String, Value)]) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if rule.versions.is_empty() {
        return out;
    }
    for (file, parent) in parents {
        let s = |p: &str| {
            parent
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        let gvk = crate::kinds::Gvk::new(s("/apiVersion"), s("/kind"));
        if gvk.group != rule.parent.group || gvk.kind != rule.parent.kind {
            continue;
        }
        let name = match s("/metadata/namespace") {
            "" => s("/metadata/name").to_owned(),
            ns => format!("{ns}/{}", s("/metadata/name")),
        };
        let what = format!("parent {name} ({file})");
        match crate::conversion::convert(rule, parent, &rule.parent.version) {
            Ok(hub) => out.extend(round_trips(rule, &hub, &what)),
            Err(err) => out.push(Diagnostic::error(
                &rule.file,
                rule.lines.line_of("spec.versions"),
                "spec.versions",
                format!("{what} does not convert to {}: {err}", rule.parent.version),
            )),
        }
    }
    out
}

/// `hub` (`what`) converted from the hub to each version and back.
fn round_trips(rule: &CompiledRule, hub: &Value, what: &str) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (i, version) in rule.versions.iter().enumerate() {
        let field = format!("spec.versions[{i}]");
        let line = rule.lines.line_of(&format!("{field}.fromHub"));
        match crate::conversion::round_trip_losses(rule, hub, &version.name) {
            Ok(lost) => {
                for path in lost {
                    out.push(Diagnostic::error(
                        &rule.file,
                        line,
                        &format!("{field}.fromHub"),
                        format!(
                            "a round trip {hub} -> {v} -> {hub} loses `{path}` of {what}; convert it, or list it in `lossy:`",
                            hub = rule.parent.version,
                            v = version.name
                        ),
                    ));
                }
            }
            Err(err) => out.push(Diagnostic::error(
                &rule.file,
                line,
                &field,
                format!("{what} does not convert: {err}"),
            )),
        }
    }
    out
}
