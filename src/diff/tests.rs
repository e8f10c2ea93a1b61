use serde_json::json;

use super::*;

fn key(name: &str) -> ObjectKey {
    ObjectKey {
        group: String::new(),
        kind: "ConfigMap".into(),
        namespace: Some("ns".into()),
        name: name.into(),
        cluster: None,
    }
}

fn paths(changes: &[FieldChange]) -> Vec<&str> {
    changes.iter().map(|c| c.path.as_str()).collect()
}

#[test]
fn server_maintained_metadata_and_status_are_not_changes() {
    let live = json!({"metadata": {"name": "a", "resourceVersion": "1", "generation": 1,
        "managedFields": [{"manager": "x"}]}, "status": {"ready": false}, "data": {"k": "v"}});
    let after = json!({"metadata": {"name": "a", "resourceVersion": "2", "generation": 2,
        "managedFields": [{"manager": "y"}]}, "status": {"ready": true}, "data": {"k": "v"}});
    assert_eq!(object_changes(&live, &after), []);
}

#[test]
fn changed_added_and_removed_fields_are_named_by_path() {
    let live = json!({"data": {"a": "1", "gone": "x", "app.kubernetes.io/name": "old"}});
    let after = json!({"data": {"a": "2", "new": "y", "app.kubernetes.io/name": "new"}});
    let changes = object_changes(&live, &after);
    assert_eq!(
        paths(&changes),
        [
            "data.a",
            "data[\"app.kubernetes.io/name\"]",
            "data.gone",
            "data.new"
        ]
    );
    assert_eq!(changes[0].before, Some(json!("1")));
    assert_eq!(changes[0].after, Some(json!("2")));
    assert_eq!(changes[2].after, None);
    assert_eq!(changes[3].before, None);
}

#[test]
fn lists_of_named_objects_are_keyed_by_name_and_conditions_by_type() {
    let live = json!({"spec": {"containers": [{"name": "web", "image": "a"}, {"name": "log", "image": "b"}]},
        "conditions": [{"type": "Ready", "status": "True"}]});
    let after = json!({"spec": {"containers": [{"name": "log", "image": "b"}, {"name": "web", "image": "c"}]},
        "conditions": [{"type": "Ready", "status": "False"}]});
    assert_eq!(
        paths(&field_changes(&live, &after)),
        [
            "conditions[type=Ready].status",
            "spec.containers[name=web].image"
        ]
    );
}

#[test]
fn a_new_list_is_shown_element_by_element_and_keyed_when_it_can_be() {
    let live = json!({"status": {"observedGeneration": 1}});
    let after = json!({"status": {"observedGeneration": 1, "hosts": ["a"],
        "conditions": [{"type": "Ready", "status": "True"}]}});
    assert_eq!(
        paths(&field_changes(&live, &after)),
        [
            "status.conditions[type=Ready].status",
            "status.conditions[type=Ready].type",
            "status.hosts[0]"
        ]
    );
}

#[test]
fn lists_without_names_compare_by_index_and_a_new_map_is_shown_leaf_by_leaf() {
    let live = json!({"args": ["a", "b"]});
    let after = json!({"args": ["a", "c", "d"], "spec": {"x": {"y": 1}}});
    let changes = field_changes(&live, &after);
    assert_eq!(paths(&changes), ["args[1]", "args[2]", "spec.x.y"]);
    assert_eq!(changes[1].before, None);
}

fn parent(children: Vec<ChildDiff>) -> ParentDiff {
    ParentDiff {
        rule: "app".into(),
        parent: "App ns/a".into(),
        children,
        ..ParentDiff::default()
    }
}

#[test]
fn nothing_to_change_prints_no_changes_and_exits_zero() {
    let d = parent(vec![ChildDiff {
        id: "config".into(),
        key: key("a"),
        change: ChildChange::Unchanged,
    }]);
    assert_eq!(exit_code(std::slice::from_ref(&d)), 0);
    assert_eq!(
        print(&[d]),
        "App ns/a (rule app)\n  no changes (1 children unchanged)\n"
    );
}

#[test]
fn creations_updates_and_prunes_are_listed_and_exit_one() {
    let d = parent(vec![
        ChildDiff {
            id: "config".into(),
            key: key("a"),
            change: ChildChange::Update {
                fields: vec![FieldChange {
                    path: "data.greeting".into(),
                    before: Some(json!("hello")),
                    after: Some(json!("hi")),
                }],
            },
        },
        ChildDiff {
            id: "extra".into(),
            key: key("b"),
            change: ChildChange::Create {
                object: json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "b", "uid": "u"}, "data": {"k": "v"}}),
            },
        },
        ChildDiff {
            id: "old".into(),
            key: key("c"),
            change: ChildChange::Prune,
        },
    ]);
    assert_eq!(exit_code(std::slice::from_ref(&d)), 1);
    assert_eq!(
        print(&[d]),
        "App ns/a (rule app)\n\
         \x20 ~ config ConfigMap ns/a\n\
         \x20     ~ data.greeting: \"hello\" -> \"hi\"\n\
         \x20 + extra ConfigMap ns/b (create)\n\
         \x20     + data.k: \"v\"\n\
         \x20 - old ConfigMap ns/c (prune)\n"
    );
}

#[test]
fn a_pass_that_would_fail_exits_two_and_says_why() {
    let mut d = parent(vec![ChildDiff {
        id: "config".into(),
        key: key("a"),
        change: ChildChange::Refused {
            why: "exists and belongs to rule other".into(),
        },
    }]);
    d.children.push(ChildDiff {
        id: "old".into(),
        key: key("b"),
        change: ChildChange::PruneHeld,
    });
    assert_eq!(exit_code(std::slice::from_ref(&d)), 2);
    let text = print(std::slice::from_ref(&d));
    assert!(
        text.contains("      error: exists and belongs to rule other\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "  - old ConfigMap ns/b (prune, in the first pass in which no write fails)\n"
        ),
        "{text}"
    );
    d.children.clear();
    d.errors
        .push("spec.replicas: \"x\" is not of type \"integer\"".into());
    assert_eq!(exit_code(std::slice::from_ref(&d)), 2);
    assert!(print(&[d]).contains("  error: spec.replicas"));
}

#[test]
fn status_changes_count_as_changes() {
    let mut d = parent(vec![]);
    d.parent_fields.push(FieldChange {
        path: "status.observedGeneration".into(),
        before: Some(json!(1)),
        after: Some(json!(2)),
    });
    assert_eq!(exit_code(std::slice::from_ref(&d)), 1);
    assert!(print(&[d]).contains("  ~ the parent\n      ~ status.observedGeneration: 1 -> 2\n"));
}
