//! The parent's status: fields and conditions mapped from the children,
//! `lastTransitionTime` kept while a condition holds, and no status for a
//! built-in parent kind.

use super::*;

const STATUS: &str = "  status:\n    fields:\n      - path: replicas.ready\n        from: web\n        jsonPath: $.status.readyReplicas\n        default: 0\n      - path: name\n        value: \"parent.metadata.name | upper\"\n    conditions:\n      - type: Serving\n        when: \"children.web.status.readyReplicas | default(0) > 0\"\n        reason: HasReplicas\n        message: \"{{ children.web.status.readyReplicas | default(0) }} ready\"\n";

#[test]
fn maps_status_fields_and_conditions() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{WEB}{STATUS}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({})), vec![cm.clone()]);
    let status = p.status.as_ref().unwrap();
    assert_eq!(
        status["replicas"]["ready"], 0,
        "default before the child has status"
    );
    assert_eq!(status["name"], "A");
    assert_eq!(status["observedGeneration"], 3);
    let serving = condition(&p, "Serving");
    assert_eq!(serving["status"], "False");
    assert_eq!(serving["reason"], "NotHasReplicas");

    let web = live(
        "Deployment",
        "a",
        "web",
        json!({"status": {"readyReplicas": 2}}),
    );
    let p = run(&r, &parent(json!({})), vec![cm, web]);
    let status = p.status.as_ref().unwrap();
    assert_eq!(status["replicas"]["ready"], 2);
    let serving = condition(&p, "Serving");
    assert_eq!(serving["status"], "True");
    assert_eq!(serving["message"], "2 ready");
}

#[test]
fn keeps_last_transition_time_when_status_unchanged() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let mut p0 = parent(json!({}));
    p0["status"] = json!({"conditions": [
        {"type": "Ready", "status": "True", "reason": "AllChildrenReady", "lastTransitionTime": "2020-01-01T00:00:00Z"},
        {"type": "Synced", "status": "False", "reason": "RenderError", "lastTransitionTime": "2020-01-01T00:00:00Z"},
    ]});
    let p = run(&r, &p0, vec![cm]);
    assert_eq!(
        condition(&p, "Ready")["lastTransitionTime"],
        "2020-01-01T00:00:00Z"
    );
    assert_eq!(condition(&p, "Synced")["lastTransitionTime"], NOW);
}

#[test]
fn builtin_parents_get_children_but_no_status() {
    let r = rule(&format!(
        "  parent: {{apiVersion: apps/v1, kind: Deployment}}\n  children:\n{CM}"
    ));
    let mut d = parent(json!({}));
    d["apiVersion"] = json!("apps/v1");
    d["kind"] = json!("Deployment");
    let p = run(&r, &d, vec![]);
    assert_eq!(p.apply.len(), 1);
    assert!(p.status.is_none());
}
