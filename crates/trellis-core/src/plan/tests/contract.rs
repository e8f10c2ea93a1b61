//! Typed results, missing values and literals in a whole pass (issue 10).

use super::*;

#[test]
fn include_when_string_false_is_an_error_not_truthy() {
    let optional = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: spec.enabled\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{optional}"));
    let p = run(&r, &parent(json!({"enabled": "false"})), vec![]);
    assert!(p.apply.is_empty());
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("includeWhen") && e.contains("boolean")),
        "{:?}",
        p.errors
    );
}

#[test]
fn missing_value_in_a_comparison_fails_the_pass() {
    let optional = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: spec.typo > 0\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{optional}"));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(
        p.errors.iter().any(|e| e.contains("spec.typo > 0")),
        "{:?}",
        p.errors
    );
}

#[test]
fn failed_status_field_is_an_error_of_the_pass() {
    let status = "  status:\n    fields:\n      - path: n\n        value: spec.count + 1\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{status}"));
    let p = run(&r, &parent(json!({})), vec![]);
    assert_eq!(p.apply.len(), 1, "children are still applied");
    assert!(
        p.errors.iter().any(|e| e.contains("status field `n`")),
        "{:?}",
        p.errors
    );
    assert_eq!(condition(&p, "Synced")["status"], "False");
}

#[test]
fn failed_condition_is_an_error_of_the_pass() {
    let status = "  status:\n    conditions:\n      - type: Big\n        when: spec.size\n        reason: IsBig\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{status}"));
    let p = run(&r, &parent(json!({"size": 3})), vec![]);
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("condition Big") && e.contains("boolean")),
        "{:?}",
        p.errors
    );
}

#[test]
fn leading_zero_literal_in_a_child_is_octal_and_integers_stay_integers() {
    let secret = "    - id: vol\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: x\n        data:\n          mode: 0400\n          replicas: {{ spec.n * 2 }}\n          plain: 7\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{secret}"));
    let p = run(&r, &parent(json!({"n": 3})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let data = &p.apply[0].object["data"];
    assert_eq!(data["mode"], json!(256));
    assert!(
        data["replicas"].is_i64() || data["replicas"].is_u64(),
        "{data}"
    );
    assert_eq!(data["replicas"], json!(6));
    assert!(data["plain"].is_u64() || data["plain"].is_i64(), "{data}");
}

#[test]
fn failed_status_field_prunes_nothing_even_when_include_when_turned_false() {
    let optional = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: spec.enabled\n",
    );
    let status = "  status:\n    fields:\n      - path: n\n        value: spec.count + 1\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{optional}{status}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({"enabled": false})), vec![cm]);
    assert!(
        p.errors.iter().any(|e| e.contains("status field `n`")),
        "{:?}",
        p.errors
    );
    assert!(
        p.delete.is_empty(),
        "pruned despite an error: {:?}",
        p.delete
    );
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::RenderError)
    );
    assert_eq!(condition(&p, "Synced")["reason"], "RenderError");
}

#[test]
fn failed_condition_prunes_nothing() {
    let optional = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: spec.enabled\n",
    );
    let status = "  status:\n    conditions:\n      - type: Big\n        when: spec.size > 1\n        reason: IsBig\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{optional}{status}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({"enabled": false})), vec![cm]);
    assert!(
        p.errors.iter().any(|e| e.contains("condition Big")),
        "{:?}",
        p.errors
    );
    assert!(
        p.delete.is_empty(),
        "pruned despite an error: {:?}",
        p.delete
    );
}

/// `cm` with `readyWhen: <expr>`, `web` depending on it.
fn gated_rule(ready_when: &str) -> Arc<CompiledRule> {
    let gated = CM.replace(
        "      kind: ConfigMap\n",
        &format!("      kind: ConfigMap\n      readyWhen: \"{ready_when}\"\n"),
    );
    rule(&format!("{PARENT_KIND}  children:\n{gated}{WEB}"))
}

#[test]
fn undefined_ready_when_is_an_error_naming_child_and_expression() {
    let r = gated_rule("self.status.ok");
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let stale = live("ConfigMap", "stale", "cm", json!({}));
    let p = run(&r, &parent(json!({})), vec![cm, stale]);
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    assert!(
        p.errors[0].contains("readyWhen of child \"cm\"") && p.errors[0].contains("self.status.ok"),
        "{:?}",
        p.errors
    );
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::RenderError)
    );
    assert_eq!(p.apply.len(), 1, "the child itself is applied");
    assert_eq!(p.apply[0].id, "cm");
    assert!(
        p.delete.is_empty(),
        "pruned despite an error: {:?}",
        p.delete
    );
    assert_eq!(p.pending.len(), 1, "its dependent waits: {:?}", p.pending);
    assert_eq!(p.pending[0].id, "web");
    let synced = condition(&p, "Synced");
    assert_eq!(synced["status"], "False");
    assert_eq!(synced["reason"], "RenderError");
    assert_eq!(condition(&p, "Ready")["status"], "False");
}

#[test]
fn ready_when_yielding_the_string_false_is_an_error_not_truthy() {
    let r = gated_rule("self.data.ok");
    let cm = live("ConfigMap", "a-cm", "cm", json!({"data": {"ok": "false"}}));
    let p = run(&r, &parent(json!({})), vec![cm]);
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("readyWhen of child \"cm\"") && e.contains("boolean")),
        "{:?}",
        p.errors
    );
    assert_eq!(p.pending.len(), 1, "{:?}", p.pending);
    assert_eq!(condition(&p, "Synced")["reason"], "RenderError");
}

#[test]
fn ready_when_with_default_on_a_child_without_status_is_not_ready_without_error() {
    let r = gated_rule("self.status.x | default(0) > 0");
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({})), vec![cm]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.pending.len(), 1, "{:?}", p.pending);
    assert!(p.pending[0].reason.contains("is false"), "{:?}", p.pending);
    assert_eq!(condition(&p, "Synced")["reason"], "DependencyNotReady");
}

#[test]
fn failed_ready_when_of_a_later_for_each_item_is_reported() {
    // Item "x" does not exist yet (not ready); item "y" exists and its
    // readyWhen fails: the failure is not hidden behind the first item.
    let each = EACH.replace(
        "      forEach: spec.items\n",
        "      forEach: spec.items\n      readyWhen: \"self.status.ok\"\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{each}"));
    let y = live("ConfigMap", "a-y", "each", json!({}));
    let p = run(&r, &parent(json!({"items": ["x", "y"]})), vec![y]);
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("readyWhen of child \"each\" (item 1)")),
        "{:?}",
        p.errors
    );
}
