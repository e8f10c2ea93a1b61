//! The parent's `spec` against the rule's `schema` and `defaults`:
//! defaults merged in, an invalid spec touching nothing, errors naming the
//! field as users write it.

use super::*;

const SCHEMA: &str = "  schema:\n    type: object\n    required: [replicas]\n    properties:\n      replicas: {type: integer, maximum: 5}\n  defaults:\n    replicas: 2\n    nested: {a: 1, b: 2}\n";

#[test]
fn defaults_merge_deeply_under_spec() {
    let r = rule(&format!(
        "{PARENT_KIND}{SCHEMA}  children:\n{}",
        CM.replace("spec.v | default('x')", "spec.nested")
    ));
    let p = run(&r, &parent(json!({"nested": {"b": 3}})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply[0].object["data"]["v"], json!({"a": 1, "b": 3}));
}

#[test]
fn invalid_spec_touches_nothing() {
    let r = rule(&format!("{PARENT_KIND}{SCHEMA}  children:\n{CM}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({"replicas": 9})), vec![cm]);
    assert!(p.apply.is_empty());
    assert!(p.delete.is_empty());
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::InvalidSpec)
    );
    let synced = condition(&p, "Synced");
    assert_eq!(synced["status"], "False");
    assert_eq!(synced["reason"], "InvalidSpec");
    assert!(
        synced["message"]
            .as_str()
            .unwrap()
            .contains("spec.replicas"),
        "{synced}"
    );
    assert_eq!(p.status.as_ref().unwrap()["observedGeneration"], 3);
}

#[test]
fn schema_errors_name_the_field_as_users_write_it() {
    let schema = "  schema:\n    type: object\n    properties:\n      hosts:\n        type: array\n        items: {type: string, pattern: '^[a-z.]+$'}\n      labels:\n        type: object\n        additionalProperties: {type: string}\n      byIndex:\n        type: object\n        additionalProperties: {type: string}\n";
    let r = rule(&format!("{PARENT_KIND}{schema}  children:\n{CM}"));
    let spec = json!({
        "hosts": ["ok.example", "bad_host"],
        "labels": {"app.kubernetes.io/name": 5},
        "byIndex": {"0": 1},
    });
    let mut p = parent(spec);
    p["status"] = json!({"observedGeneration": 1, "foreign": "kept"});
    let p = run(&r, &p, vec![]);
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::InvalidSpec)
    );
    let mut at: Vec<&str> = p
        .errors
        .iter()
        .map(|e| e.split(": ").next().unwrap())
        .collect();
    at.sort();
    assert_eq!(
        at,
        [
            "spec.byIndex[\"0\"]",
            "spec.hosts[1]",
            "spec.labels[\"app.kubernetes.io/name\"]"
        ],
        "{:?}",
        p.errors
    );
    let status = p.status.as_ref().unwrap();
    assert_eq!(status["observedGeneration"], 3, "{status}");
    assert_eq!(status["foreign"], "kept", "{status}");
}
