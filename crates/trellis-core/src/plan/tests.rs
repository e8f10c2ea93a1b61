use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::kinds;
use crate::rules::CompiledRule;

const NOW: &str = "2026-11-29T00:00:00Z";
const UID: &str = "uid-1";

fn rule(spec: &str) -> Arc<CompiledRule> {
    crate::rules::testing::rule_with_spec(spec)
}

const PARENT_KIND: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n";

fn parent(spec: Value) -> Value {
    json!({
        "apiVersion": "demo.trellis.dev/v1",
        "kind": "App",
        "metadata": {"name": "a", "namespace": "ns", "uid": UID, "generation": 3},
        "spec": spec,
    })
}

fn run(rule: &CompiledRule, parent: &Value, observed: Vec<Value>) -> Plan {
    plan(
        rule,
        &Input {
            parent,
            observed: &Observed::from_objects(observed),
            now: NOW,
            scope_of: &kinds::scope,
            clusters: &crate::clusters::Clusters::offline(),
        },
    )
}

/// A live child as the cluster would hold it.
fn live(kind: &str, name: &str, id: &str, extra: Value) -> Value {
    let api_version = if kind == "Deployment" {
        "apps/v1"
    } else {
        "v1"
    };
    let mut obj = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": format!("uid-{name}"),
            "labels": {LABEL_RULE: "app", LABEL_CHILD: id, LABEL_PARENT_UID: UID},
        },
    });
    if let (Value::Object(o), Value::Object(e)) = (&mut obj, extra) {
        o.extend(e);
    }
    obj
}

fn condition<'a>(plan: &'a Plan, type_: &str) -> &'a Value {
    plan.status.as_ref().unwrap()["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no condition {type_}"))
}

const CM: &str = "    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: {{ parent.metadata.name ~ '-cm' }}\n        data:\n          v: {{ spec.v | default('x') }}\n";

#[test]
fn renders_child_with_labels_owner_and_parent_namespace() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    let p = run(&r, &parent(json!({"v": "1"})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let obj = &p.apply[0].object;
    assert_eq!(obj["apiVersion"], "v1");
    assert_eq!(obj["kind"], "ConfigMap");
    assert_eq!(obj["metadata"]["namespace"], "ns");
    assert_eq!(obj["metadata"]["labels"][LABEL_MANAGED_BY], "trellis");
    assert_eq!(obj["metadata"]["labels"][LABEL_RULE], "app");
    assert_eq!(obj["metadata"]["labels"][LABEL_CHILD], "cm");
    assert_eq!(obj["metadata"]["labels"][LABEL_PARENT_UID], UID);
    assert_eq!(
        obj["metadata"]["labels"][crate::labels::LABEL_BUCKET],
        crate::labels::bucket_of(UID).to_string(),
        "the bucket of the parent's uid, for --shards"
    );
    assert_eq!(
        obj["metadata"]["ownerReferences"],
        json!([{"apiVersion": "demo.trellis.dev/v1", "kind": "App", "name": "a", "uid": UID, "controller": true, "blockOwnerDeletion": true}])
    );
    assert!(!p.needs_finalizer);
}

#[test]
fn an_edit_of_one_child_leaves_the_others_hash_and_writes_only_the_revision_label() {
    let other = "    - id: other\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: other\n        data:\n          w: {{ 'one' }}\n";
    let before = rule(&format!("{PARENT_KIND}  children:\n{CM}{other}"));
    let after = rule(&format!(
        "{PARENT_KIND}  children:\n{CM}{}",
        other.replace("'one'", "'two'")
    ));
    assert_ne!(before.revision, after.revision, "an edit is a new revision");
    let p = parent(json!({"v": "1"}));
    let (old, new) = (run(&before, &p, vec![]), run(&after, &p, vec![]));
    let cm = |plan: &Plan| {
        plan.apply
            .iter()
            .find(|a| a.id == "cm")
            .cloned()
            .expect("cm rendered")
    };
    let (old_cm, new_cm) = (cm(&old), cm(&new));
    assert_eq!(old_cm.hash, new_cm.hash, "cm's rendering did not change");
    assert_eq!(
        new_cm.object["metadata"]["labels"][LABEL_REVISION],
        after.revision.as_str()
    );
    // As the cluster holds cm written by the old version: nothing drifted.
    assert!(!crate::drift::drifted(&new_cm.object, &old_cm.object));
    let other_hash = |plan: &Plan| {
        plan.apply
            .iter()
            .find(|a| a.id == "other")
            .map(|a| a.hash.clone())
    };
    assert_ne!(
        other_hash(&old),
        other_hash(&new),
        "the edited child changed"
    );
}

#[test]
fn template_cannot_change_kind() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}",
        CM.replace(
            "        metadata:\n",
            "        kind: Secret\n        metadata:\n"
        )
    ));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(p.apply.is_empty());
    assert!(
        p.errors[0].contains("sets kind to \"Secret\""),
        "{:?}",
        p.errors
    );
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::RenderError)
    );
}

const WEB: &str = "    - id: web\n      apiVersion: apps/v1\n      kind: Deployment\n      dependsOn: [cm]\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n        spec:\n          replicas: {{ spec.replicas | default(1) }}\n";

#[test]
fn depends_on_holds_child_until_dependency_exists_and_is_ready() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{WEB}"));
    let p = run(&r, &parent(json!({})), vec![]);
    assert_eq!(p.apply.len(), 1);
    assert_eq!(p.pending[0].id, "web");
    assert!(
        p.pending[0].reason.contains("does not exist yet"),
        "{}",
        p.pending[0].reason
    );
    assert_eq!(condition(&p, "Synced")["reason"], "DependencyNotReady");
    assert_eq!(condition(&p, "Ready")["status"], "False");
    assert!(
        condition(&p, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("child \"cm\"")
    );

    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({})), vec![cm]);
    assert!(p.pending.is_empty());
    assert_eq!(p.apply.len(), 2);
}

#[test]
fn depends_on_uses_ready_when_of_the_dependency() {
    let gated = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      readyWhen: \"self.data.ok | default('no') == 'yes'\"\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{gated}{WEB}"));
    let not_yet = live("ConfigMap", "a-cm", "cm", json!({"data": {"ok": "no"}}));
    let p = run(&r, &parent(json!({})), vec![not_yet]);
    assert_eq!(p.pending.len(), 1);
    assert!(
        p.pending[0]
            .reason
            .contains("readyWhen `self.data.ok | default('no') == 'yes'` is false"),
        "{:?}",
        p.pending
    );
    let ready = live("ConfigMap", "a-cm", "cm", json!({"data": {"ok": "yes"}}));
    let p = run(&r, &parent(json!({})), vec![ready]);
    assert!(p.pending.is_empty());
}

#[test]
fn pending_child_keeps_its_existing_object() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{WEB}"));
    let web = live("Deployment", "a", "web", json!({}));
    let p = run(&r, &parent(json!({})), vec![web]);
    assert_eq!(p.pending.len(), 1);
    assert!(
        p.delete.is_empty(),
        "held back is not pruned: {:?}",
        p.delete
    );
}

#[test]
fn default_readiness_reads_generation_and_conditions() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{WEB}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let web = live(
        "Deployment",
        "a",
        "web",
        json!({"status": {"conditions": [{"type": "Available", "status": "False", "message": "0/1"}]}}),
    );
    let p = run(&r, &parent(json!({})), vec![cm.clone(), web]);
    let ready = condition(&p, "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "ChildNotReady");
    assert!(
        ready["message"].as_str().unwrap().contains("child \"web\""),
        "{ready}"
    );
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("Available is False"),
        "{ready}"
    );

    let web = live(
        "Deployment",
        "a",
        "web",
        json!({"status": {"conditions": [{"type": "Available", "status": "True"}]}}),
    );
    let p = run(&r, &parent(json!({})), vec![cm, web]);
    assert_eq!(condition(&p, "Ready")["status"], "True");
    assert_eq!(condition(&p, "Synced")["status"], "True");
}

#[test]
fn prunes_child_when_include_when_turns_false() {
    let optional = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: spec.enabled\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{optional}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({"enabled": true})), vec![cm.clone()]);
    assert!(p.delete.is_empty());
    let p = run(&r, &parent(json!({"enabled": false})), vec![cm]);
    assert!(p.apply.is_empty());
    assert_eq!(p.delete.len(), 1);
    assert_eq!(p.delete[0].uid.as_deref(), Some("uid-a-cm"));
}

#[test]
fn include_when_on_missing_field_is_an_error_not_false() {
    let optional = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: spec.enabled\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{optional}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({})), vec![cm]);
    assert!(p.errors[0].contains("includeWhen"), "{:?}", p.errors);
    assert!(p.delete.is_empty(), "never prune on error");
}

const EACH: &str = "    - id: each\n      apiVersion: v1\n      kind: ConfigMap\n      forEach: spec.items\n      template: |\n        metadata:\n          name: {{ parent.metadata.name ~ '-' ~ item }}\n        data:\n          index: {{ index | string }}\n";

#[test]
fn for_each_renders_one_child_per_item_and_prunes_removed_items() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{EACH}"));
    let p = run(&r, &parent(json!({"items": ["x", "y"]})), vec![]);
    let names: Vec<&str> = p.apply.iter().map(|a| a.key.name.as_str()).collect();
    assert_eq!(names, ["a-x", "a-y"]);
    assert_eq!(p.apply[1].object["data"]["index"], "1");

    let observed = vec![
        live("ConfigMap", "a-x", "each", json!({})),
        live("ConfigMap", "a-y", "each", json!({})),
    ];
    let p = run(&r, &parent(json!({"items": ["x"]})), observed);
    assert_eq!(p.delete.len(), 1);
    assert_eq!(p.delete[0].key.name, "a-y");
}

#[test]
fn ready_when_of_for_each_child_sees_item_and_index() {
    // Item order (b, a) differs from name order (a-a, a-b): each object's
    // readyWhen sees its own item and index, whatever the names.
    let each = EACH.replace(
        "      forEach: spec.items\n",
        "      forEach: spec.items\n      readyWhen: \"self.data.seen == item ~ '@' ~ index\"\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{each}"));
    let live_item = |item: &str, seen: &str| {
        live(
            "ConfigMap",
            &format!("a-{item}"),
            "each",
            json!({"data": {"seen": seen}}),
        )
    };
    let spec = json!({"items": ["b", "a"]});
    let p = run(
        &r,
        &parent(spec.clone()),
        vec![live_item("b", "b@0"), live_item("a", "a@1")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let ready = condition(&p, "Ready");
    assert_eq!(ready["status"], "True", "{ready}");

    let p = run(
        &r,
        &parent(spec),
        vec![live_item("b", "b@0"), live_item("a", "a@0")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let ready = condition(&p, "Ready");
    assert_eq!(ready["status"], "False", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("ConfigMap ns/a-a is not ready: readyWhen"),
        "{ready}"
    );
}

#[test]
fn for_each_must_yield_a_list() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{EACH}"));
    let p = run(&r, &parent(json!({"items": "x"})), vec![]);
    assert!(p.errors[0].contains("must yield a list"), "{:?}", p.errors);
}

#[test]
fn duplicate_rendered_names_are_an_error() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}",
        EACH.replace("'-' ~ item", "'-same'")
    ));
    let p = run(&r, &parent(json!({"items": ["x", "y"]})), vec![]);
    assert!(
        p.errors.iter().any(|e| e.contains("rendered twice")),
        "{:?}",
        p.errors
    );
}

#[test]
fn prunes_children_whose_id_left_the_rule() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    let gone = live("Secret", "old", "removed", json!({}));
    let p = run(&r, &parent(json!({})), vec![gone]);
    assert_eq!(p.delete.len(), 1);
    assert_eq!(p.delete[0].id, "removed");
}

#[test]
fn never_prunes_when_any_render_fails() {
    let broken = "    - id: bad\n      apiVersion: v1\n      kind: Secret\n      template: |\n        metadata:\n          name: {{ spec.missing }}\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{broken}"));
    let stale = live("ConfigMap", "stale", "cm", json!({}));
    let p = run(&r, &parent(json!({})), vec![stale]);
    assert_eq!(p.errors.len(), 1);
    assert!(p.errors[0].contains("child \"bad\""), "{:?}", p.errors);
    assert!(p.delete.is_empty());
    assert_eq!(p.apply.len(), 1, "children that rendered are still applied");
    let synced = condition(&p, "Synced");
    assert_eq!(synced["reason"], "RenderError");
    assert!(
        synced["message"]
            .as_str()
            .unwrap()
            .contains("missing value")
    );
}

#[test]
fn ignores_observed_objects_of_other_parents() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    let mut other = live("ConfigMap", "other", "cm", json!({}));
    other["metadata"]["labels"][LABEL_PARENT_UID] = json!("someone-else");
    let p = run(&r, &parent(json!({})), vec![other]);
    assert!(p.delete.is_empty());
}

#[test]
fn parent_values_never_add_structure_to_children() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    let evil = "x\n  evil: true\nkind: Secret\n---\napiVersion: v1\nkind: Secret";
    let p = run(&r, &parent(json!({"v": evil})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply.len(), 1);
    assert_eq!(p.apply[0].object["kind"], "ConfigMap");
    assert_eq!(p.apply[0].object["data"], json!({"v": evil}));
}

#[test]
fn selector_and_namespaces_decide_which_parents_match() {
    let r = rule(
        "  parent:\n    apiVersion: demo.trellis.dev/v1\n    kind: App\n    namespaces: [ns]\n    selector:\n      matchLabels: {tier: web}\n      matchExpressions:\n        - {key: env, operator: In, values: [prod]}\n  children: []\n",
    );
    let mut p = parent(json!({}));
    assert!(!parent_matches(&r, &p));
    p["metadata"]["labels"] = json!({"tier": "web", "env": "prod"});
    assert!(parent_matches(&r, &p));
    p["metadata"]["namespace"] = json!("other");
    assert!(!parent_matches(&r, &p));
}

mod clusters;
mod contract;
mod excluded;
mod for_each;
mod json_path;
mod patches;
mod related;
mod scope;
mod sharing;
mod spec_schema;
mod status;
mod vars;
