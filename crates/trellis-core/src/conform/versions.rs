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
    let mut out = Vec::new();
    for (i, version) in rule.versions.iter().enumerate() {
        let field = format!("spec.versions[{i}]");
        let line = rule.lines.line_of(&format!("{field}.fromHub"));
        match crate::conversion::round_trip_losses(rule, &hub, &version.name) {
            Ok(lost) => {
                for path in lost {
                    out.push(Diagnostic::error(
                        &rule.file,
                        line,
                        &format!("{field}.fromHub"),
                        format!(
                            "a round trip {hub} -> {v} -> {hub} loses `{path}` of the sample parent; convert it, or list it in `lossy:`",
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
                format!("the sample parent does not convert: {err}"),
            )),
        }
    }
    out
}
