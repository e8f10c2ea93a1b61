//! Sharing: `propagate`, the inventory, per-item conditions and cartesian
//! `forEach`, as one pass decides them.

use super::*;

fn status(p: &Plan) -> &Value {
    p.status.as_ref().unwrap()
}

fn labelled(mut parent: Value, labels: Value, annotations: Value) -> Value {
    parent["metadata"]["labels"] = labels;
    parent["metadata"]["annotations"] = annotations;
    parent
}

const PROPAGATE: &str =
    "  propagate:\n    labels: [team, example.com/*]\n    annotations: [note]\n";

const LABELLED_CM: &str = "    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: cm\n          labels: {team: fixed}\n";

#[test]
fn propagate_copies_named_keys_and_the_template_and_trellis_win() {
    let r = rule(&format!(
        "{PARENT_KIND}{PROPAGATE}  children:\n{LABELLED_CM}"
    ));
    let parent = labelled(
        parent(json!({})),
        json!({"team": "parent", "example.com/cost": "7", "unnamed": "x", "trellis.dev/rule": "evil"}),
        json!({"note": "hello", "other": "no"}),
    );
    let p = run(&r, &parent, vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let meta = &p.apply[0].object["metadata"];
    assert_eq!(meta["labels"]["team"], "fixed", "the template's key wins");
    assert_eq!(meta["labels"]["example.com/cost"], "7", "a prefix matches");
    assert!(meta["labels"].get("unnamed").is_none());
    assert_eq!(meta["labels"][LABEL_RULE], "app", "trellis's labels win");
    assert_eq!(meta["annotations"]["note"], "hello");
    assert!(meta["annotations"].get("other").is_none());
}

#[test]
fn a_parent_label_change_changes_the_child_and_a_removal_drops_the_key() {
    let r = rule(&format!("{PARENT_KIND}{PROPAGATE}  children:\n{CM}"));
    let with = |labels: Value| {
        let p = run(&r, &labelled(parent(json!({})), labels, json!({})), vec![]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        p.apply.into_iter().next().unwrap()
    };
    let a = with(json!({"team": "a"}));
    let b = with(json!({"team": "b"}));
    let gone = with(json!({}));
    assert_eq!(a.object["metadata"]["labels"]["team"], "a");
    assert_eq!(b.object["metadata"]["labels"]["team"], "b");
    assert!(gone.object["metadata"]["labels"].get("team").is_none());
    assert!(gone.object["metadata"].get("annotations").unwrap()["note"].is_null());
    // Each change is a new rendering: the operator applies it once.
    assert_ne!(a.hash, b.hash);
    assert_ne!(b.hash, gone.hash);
    assert_eq!(a.hash, with(json!({"team": "a", "unnamed": "z"})).hash);
}

#[test]
fn propagate_reaches_no_patch_target() {
    let r = rule(&format!(
        "{PARENT_KIND}{PROPAGATE}  patches:\n    - id: ns\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {{name: target}}\n        data: {{x: '1'}}\n"
    ));
    let target = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "target", "namespace": "ns", "uid": "t-1"}});
    let parent = labelled(parent(json!({})), json!({"team": "a"}), json!({}));
    let p = run(&r, &parent, vec![target]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(
        p.patches[0].object["metadata"].get("labels").is_none(),
        "{}",
        p.patches[0].object
    );
}

const INVENTORY: &str = "  status:\n    inventory: true\n";

fn each_cm(n: usize) -> String {
    format!(
        "    - id: first\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {{name: first}}\n    - id: each\n      apiVersion: v1\n      kind: ConfigMap\n      forEach: \"range({n}) | list\"\n      template: |\n        metadata:\n          name: {{{{ 'e-' ~ index }}}}\n"
    )
}

#[test]
fn inventory_lists_every_object_in_declaration_then_item_order() {
    // `web` depends on `cm` but is declared first: declaration order wins.
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n    - id: web\n      apiVersion: v1\n      kind: Secret\n      dependsOn: [cm]\n      template: |\n        metadata: {{name: web}}\n{CM}{INVENTORY}"
    ));
    let observed = vec![live("ConfigMap", "a-cm", "cm", json!({}))];
    let p = run(&r, &parent(json!({})), observed);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(
        status(&p)["children"],
        json!([
            {"id": "web", "apiVersion": "v1", "kind": "Secret", "namespace": "ns", "name": "web", "ready": false},
            {"id": "cm", "apiVersion": "v1", "kind": "ConfigMap", "namespace": "ns", "name": "a-cm", "ready": true},
        ])
    );
    assert!(status(&p).get("childrenTruncated").is_none());
}

#[test]
fn inventory_keeps_a_held_back_childs_objects_and_leaves_out_an_excluded_one() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{CM}    - id: gone\n      apiVersion: v1\n      kind: Secret\n      includeWhen: \"false\"\n      template: |\n        metadata: {{name: gone}}\n    - id: waits\n      apiVersion: v1\n      kind: Secret\n      dependsOn: [cm]\n      template: |\n        metadata: {{name: waits}}\n{INVENTORY}"
    ));
    let observed = vec![
        live("Secret", "gone", "gone", json!({})),
        live("Secret", "waits", "waits", json!({})),
    ];
    let p = run(&r, &parent(json!({})), observed);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let ids: Vec<(&str, bool)> = status(&p)["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_str().unwrap(), e["ready"].as_bool().unwrap()))
        .collect();
    assert_eq!(ids, [("cm", false), ("waits", false)]);
}

#[test]
fn inventory_stops_at_one_hundred_and_counts_the_rest() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}{INVENTORY}",
        each_cm(120)
    ));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let children = status(&p)["children"].as_array().unwrap();
    assert_eq!(children.len(), MAX_INVENTORY);
    assert_eq!(children[0]["name"], "first");
    assert_eq!(children[1]["name"], "e-0");
    assert_eq!(children[99]["name"], "e-98");
    assert_eq!(status(&p)["childrenTruncated"], 21);
}

#[test]
fn without_inventory_the_status_has_no_children() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{}", each_cm(2)));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(status(&p).get("children").is_none());
}

const PER_ITEM: &str = "  status:\n    conditions:\n      - type: \"{{ item.name | title }}Ready\"\n        forEach: spec.dbs\n        when: \"item.ok\"\n        reason: Up\n        message: \"{{ index }}: {{ item.name }}\"\n";

#[test]
fn a_per_item_condition_gives_one_condition_per_item() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{PER_ITEM}"));
    let spec = json!({"dbs": [{"name": "orders", "ok": true}, {"name": "users", "ok": false}]});
    let p = run(&r, &parent(spec), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let orders = condition(&p, "OrdersReady");
    assert_eq!(
        (&orders["status"], &orders["reason"], &orders["message"]),
        (&json!("True"), &json!("Up"), &json!("0: orders"))
    );
    let users = condition(&p, "UsersReady");
    assert_eq!(
        (&users["status"], &users["reason"]),
        (&json!("False"), &json!("NotUp"))
    );
}

#[test]
fn duplicate_or_invalid_per_item_types_are_errors_of_the_pass() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{PER_ITEM}"));
    let dup = json!({"dbs": [{"name": "a", "ok": true}, {"name": "a", "ok": false}]});
    let p = run(&r, &parent(dup), vec![]);
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    assert!(
        p.errors[0].contains("condition type `AReady` is also given by")
            && p.errors[0].contains("(item 1)"),
        "{}",
        p.errors[0]
    );
    assert!(p.delete.is_empty() && p.failure_reason.is_some());
    assert_eq!(condition(&p, "Synced")["status"], "False");

    for bad in ["a b", "x-y", "1x"] {
        let spec = json!({"dbs": [{"name": bad, "ok": true}]});
        let p = run(&r, &parent(spec), vec![]);
        assert_eq!(p.errors.len(), 1, "{bad}: {:?}", p.errors);
        assert!(
            p.errors[0].contains("not a CamelCase condition type"),
            "{}",
            p.errors[0]
        );
    }
    let own = json!({"dbs": [{"name": "", "ok": true}]});
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{CM}{}",
        PER_ITEM.replace("{{ item.name | title }}Ready", "{{ item.name }}Synced")
    ));
    let p = run(&r, &parent(own), vec![]);
    assert!(
        p.errors[0].contains("written by trellis itself"),
        "{:?}",
        p.errors
    );
}

#[test]
fn a_per_item_condition_whose_item_is_gone_is_removed_and_others_stay() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{PER_ITEM}"));
    let mut parent = parent(json!({"dbs": [{"name": "orders", "ok": true}]}));
    parent["status"] = json!({"conditions": [
        {"type": "UsersReady", "status": "False", "reason": "NotUp"},
        {"type": "Foreign", "status": "True", "reason": "Theirs"},
    ]});
    let p = run(&r, &parent, vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let types: Vec<&str> = status(&p)["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["Ready", "Synced", "OrdersReady", "Foreign"]);
}

const CARTESIAN: &str = "    - id: cell\n      apiVersion: v1\n      kind: ConfigMap\n      forEach: {region: spec.regions, tier: spec.tiers}\n      template: |\n        metadata:\n          name: {{ item.region ~ '-' ~ item.tier }}\n        data:\n          index: {{ index | string }}\n";

#[test]
fn a_cartesian_for_each_renders_every_combination_first_name_slowest() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CARTESIAN}"));
    let spec = json!({"regions": ["eu", "us"], "tiers": ["web", "db", "cache"]});
    let p = run(&r, &parent(spec), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let names: Vec<(&str, &str)> = p
        .apply
        .iter()
        .map(|a| {
            (
                a.object["metadata"]["name"].as_str().unwrap(),
                a.object["data"]["index"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("eu-web", "0"),
            ("eu-db", "1"),
            ("eu-cache", "2"),
            ("us-web", "3"),
            ("us-db", "4"),
            ("us-cache", "5")
        ]
    );
    // An empty list: no combination, and the old objects are pruned.
    let observed = vec![live("ConfigMap", "eu-web", "cell", json!({}))];
    let p = run(
        &r,
        &parent(json!({"regions": ["eu"], "tiers": []})),
        observed,
    );
    assert!(p.apply.is_empty() && p.errors.is_empty());
    assert_eq!(p.delete.len(), 1);
}

#[test]
fn a_cartesian_for_each_is_bounded_by_the_product_of_its_lengths() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CARTESIAN}"));
    let spec =
        json!({"regions": (0..40).collect::<Vec<_>>(), "tiers": (0..26).collect::<Vec<_>>()});
    let p = run(&r, &parent(spec), vec![]);
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    assert!(
        p.errors[0].contains("more than the limit of 1000 combinations (region: 40 × tier: 26)"),
        "{}",
        p.errors[0]
    );
    assert!(p.apply.is_empty());
    let spec = json!({"regions": "eu", "tiers": ["a"]});
    let p = run(&r, &parent(spec), vec![]);
    assert!(
        p.errors[0].contains("forEach of child \"cell\" (region)")
            && p.errors[0].contains("must yield a list"),
        "{:?}",
        p.errors
    );
}

#[test]
fn combinations_that_render_the_same_name_are_an_error() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}",
        CARTESIAN.replace("item.region ~ '-' ~ item.tier", "item.region")
    ));
    let p = run(
        &r,
        &parent(json!({"regions": ["eu"], "tiers": ["a", "b"]})),
        vec![],
    );
    assert!(
        p.errors.iter().any(|e| e.contains("rendered twice")),
        "{:?}",
        p.errors
    );
}

#[test]
fn a_per_item_condition_takes_a_cartesian_for_each() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{CM}  status:\n    conditions:\n      - type: \"{{{{ item.a | title }}}}{{{{ item.b | title }}}}\"\n        forEach: {{a: spec.as, b: spec.bs}}\n        when: \"true\"\n        reason: Yes\n"
    ));
    let p = run(&r, &parent(json!({"as": ["x", "y"], "bs": ["p"]})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    condition(&p, "XP");
    condition(&p, "YP");
}
