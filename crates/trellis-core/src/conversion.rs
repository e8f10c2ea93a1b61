//! Converting parents between the API versions of their kind
//! (`spec.versions`): version A to B goes A → hub → B, the hub being the
//! rule's `parent.apiVersion`. `toHub`/`fromHub` templates render the
//! `spec` only; `metadata` and `status` pass through unchanged (the status
//! schema is the hub's, shared by every version). Pure: the operator's
//! `/convert` endpoint answers ConversionReviews with [`review`], `trellis
//! convert` prints [`convert`], and `check` reports what a round trip
//! loses ([`round_trip_losses`]).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::kinds::Gvk;
use crate::render::TemplateId;
use crate::rules::{CompiledRule, RuleSet, VarReads};

/// Why an object could not be converted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConversionError {
    #[error("no rule serves {kind} objects of group `{group}` with versions")]
    NoRule { group: String, kind: String },
    #[error("rule {rule}: {kind} has no version `{version}` (versions: {known})")]
    UnknownVersion {
        rule: String,
        kind: String,
        version: String,
        known: String,
    },
    #[error("rule {rule}: converting {kind} from {from} to {to}: {message}")]
    Template {
        rule: String,
        kind: String,
        from: String,
        to: String,
        message: String,
    },
    #[error("an object to convert needs apiVersion and kind")]
    Untyped,
}

/// The rule that serves `group`/`kind` with versions, if any.
pub fn rule_for<'a>(set: &'a RuleSet, group: &str, kind: &str) -> Option<&'a Arc<CompiledRule>> {
    set.rules
        .iter()
        .find(|r| r.parent.group == group && r.parent.kind == kind && r.crd.is_some())
}

/// Every version of `rule`'s kind, the hub last.
pub fn version_names(rule: &CompiledRule) -> Vec<String> {
    rule.versions
        .iter()
        .map(|v| v.name.clone())
        .chain([rule.parent.version.clone()])
        .collect()
}

/// `object` (of `rule`'s parent kind, at any of its versions) at version
/// `to`: A → hub → B. The same version: returned as it is.
pub fn convert(rule: &CompiledRule, object: &Value, to: &str) -> Result<Value, ConversionError> {
    let gvk = gvk_of(object)?;
    let hub = rule.parent.version.as_str();
    let unknown = |version: &str| ConversionError::UnknownVersion {
        rule: rule.name.clone(),
        kind: rule.parent.kind.clone(),
        version: version.to_owned(),
        known: version_names(rule).join(", "),
    };
    let step = |template: Option<(&TemplateId, &VarReads)>,
                object: &Value,
                from: &str,
                to: &str|
     -> Result<Value, ConversionError> {
        match template {
            None => Ok(object.clone()),
            Some((template, reads)) => render_spec(rule, template, reads, object, from, to),
        }
    };
    let version = |name: &str| rule.versions.iter().find(|v| v.name == name);
    if gvk.version != hub && version(&gvk.version).is_none() {
        return Err(unknown(&gvk.version));
    }
    if to != hub && version(to).is_none() {
        return Err(unknown(to));
    }
    if gvk.version == to {
        return Ok(object.clone());
    }
    let at_hub = step(
        version(&gvk.version).map(|v| (&v.to_hub, &v.reads_vars)),
        object,
        &gvk.version,
        hub,
    )?;
    let mut at_hub = at_hub;
    at_hub["apiVersion"] = json!(rule.parent.api_version());
    let mut out = step(
        version(to).map(|v| (&v.from_hub, &v.reads_vars)),
        &at_hub,
        hub,
        to,
    )?;
    out["apiVersion"] = json!(format!("{}/{to}", rule.parent.group).trim_start_matches('/'));
    Ok(out)
}

/// `object` with its `spec` rendered by `template` from it.
fn render_spec(
    rule: &CompiledRule,
    template: &TemplateId,
    reads: &VarReads,
    object: &Value,
    from: &str,
    to: &str,
) -> Result<Value, ConversionError> {
    let fail = |message: String| ConversionError::Template {
        rule: rule.name.clone(),
        kind: rule.parent.kind.clone(),
        from: from.to_owned(),
        to: to.to_owned(),
        message,
    };
    let what = if to == rule.parent.version {
        format!("toHub of version {from}")
    } else {
        format!("fromHub of version {to}")
    };
    let ctx = crate::plan::conversion_context(rule, object, reads, &what)
        .map_err(|e| fail(e.to_string()))?;
    let text = rule
        .engine
        .render(template, &ctx, &what)
        .map_err(|e| fail(e.to_string()))?;
    let limits = crate::yaml::Limits {
        max_bytes: rule.engine.limits().max_bytes,
        ..crate::yaml::Limits::FILES
    };
    let spec = crate::yaml::parse_value(&text, &limits)
        .map_err(|e| fail(format!("{what}: rendered text is not valid YAML: {e}")))?;
    let spec = match spec {
        Value::Null => json!({}),
        Value::Object(_) => spec,
        other => {
            return Err(fail(format!(
                "{what}: renders {}, not a mapping (the spec)",
                kind_of(&other)
            )));
        }
    };
    let mut out = object.clone();
    out["spec"] = spec;
    Ok(out)
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Array(_) => "a list",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        _ => "nothing",
    }
}

fn gvk_of(object: &Value) -> Result<Gvk, ConversionError> {
    match (
        object.get("apiVersion").and_then(Value::as_str),
        object.get("kind").and_then(Value::as_str),
    ) {
        (Some(api_version), Some(kind)) => Ok(Gvk::new(api_version, kind)),
        _ => Err(ConversionError::Untyped),
    }
}

/// The answer to one `apiextensions.k8s.io/v1` ConversionReview: every
/// object converted to `desiredAPIVersion`, or a failure naming the first
/// object that could not be (the API server then fails the request that
/// needed it, and nothing else).
pub fn review(set: &RuleSet, review: &Value) -> Value {
    let request = review.get("request").cloned().unwrap_or(Value::Null);
    let uid = request.get("uid").cloned().unwrap_or(json!(""));
    let answer = |result: Result<Vec<Value>, String>| {
        let mut response = json!({"uid": uid});
        match result {
            Ok(objects) => {
                response["convertedObjects"] = Value::Array(objects);
                response["result"] = json!({"status": "Success"});
            }
            Err(message) => {
                response["convertedObjects"] = json!([]);
                response["result"] = json!({"status": "Failure", "message": message});
            }
        }
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "response": response,
        })
    };
    let Some(desired) = request.get("desiredAPIVersion").and_then(Value::as_str) else {
        return answer(Err("the review has no request.desiredAPIVersion".into()));
    };
    let to = Gvk::new(desired, "");
    let objects = request
        .get("objects")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let converted: Result<Vec<Value>, String> = objects
        .iter()
        .map(|object| {
            let gvk = gvk_of(object).map_err(|e| e.to_string())?;
            if gvk.group != to.group {
                return Err(format!(
                    "cannot convert {} of group `{}` to {desired}",
                    gvk.kind, gvk.group
                ));
            }
            let rule = rule_for(set, &gvk.group, &gvk.kind).ok_or_else(|| {
                ConversionError::NoRule {
                    group: gvk.group.clone(),
                    kind: gvk.kind.clone(),
                }
                .to_string()
            })?;
            convert(rule, object, &to.version).map_err(|e| e.to_string())
        })
        .collect();
    answer(converted)
}

/// What a round trip hub → `version` → hub loses of `hub_object`: one
/// path (`spec.ports`) per field that does not come back equal and is not
/// under a `lossy` path of that version; `Err` when a conversion fails.
pub fn round_trip_losses(
    rule: &CompiledRule,
    hub_object: &Value,
    version: &str,
) -> Result<Vec<String>, ConversionError> {
    let there = convert(rule, hub_object, version)?;
    let back = convert(rule, &there, &rule.parent.version)?;
    let lossy: &[Vec<String>] = rule
        .versions
        .iter()
        .find(|v| v.name == version)
        .map(|v| v.lossy.as_slice())
        .unwrap_or_default();
    let mut lost = Vec::new();
    let mut path = vec!["spec".to_owned()];
    differences(
        hub_object.get("spec").unwrap_or(&Value::Null),
        back.get("spec").unwrap_or(&Value::Null),
        &mut path,
        &mut lost,
    );
    lost.retain(|p: &Vec<String>| !lossy.iter().any(|l| p.starts_with(l)));
    Ok(lost
        .iter()
        .map(|p| {
            let mut text = String::new();
            for key in p {
                crate::field_path::push_key(&mut text, key);
            }
            text
        })
        .collect())
}

/// The leaves of `before` that `after` does not hold equal (a list is one
/// leaf: its items have no key to pair them by).
fn differences(before: &Value, after: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (key, value) in b {
                path.push(key.clone());
                differences(value, a.get(key).unwrap_or(&Value::Null), path, out);
                path.pop();
            }
        }
        (b, a) if b == a => {}
        _ => out.push(path.clone()),
    }
}

#[cfg(test)]
mod tests;
