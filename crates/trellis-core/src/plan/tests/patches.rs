//! `patches:` (contributions to objects the rule does not own) and
//! `deletionPolicy: retain`, as the planner decides them.

use super::*;

const NS_PATCH: &str = "  patches:\n    - id: team\n      apiVersion: v1\n      kind: Namespace\n      allowCrossNamespace: true\n      includeWhen: \"spec.label | default(true)\"\n      template: |\n        metadata:\n          name: {{ spec.target }}\n          labels:\n            example.com/team: {{ parent.metadata.name }}\n";

fn namespace(name: &str, extra: Value) -> Value {
    let mut obj = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "uid": format!("uid-ns-{name}"),
                     "labels": {"kubernetes.io/metadata.name": name}},
    });
    if let (Value::Object(o), Value::Object(e)) = (&mut obj["metadata"], extra) {
        o.extend(e);
    }
    obj
}

fn ns_rule(extra: &str) -> Arc<CompiledRule> {
    rule(&format!("{PARENT_KIND}  children:\n{CM}{NS_PATCH}{extra}"))
}

#[test]
fn a_patch_holds_only_the_contributed_fields_and_the_targets_uid() {
    let r = ns_rule("");
    let p = run(
        &r,
        &parent(json!({"target": "team-a"})),
        vec![namespace("team-a", json!({}))],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply.len(), 1, "the child only");
    assert_eq!(p.patches.len(), 1);
    let patch = &p.patches[0];
    assert_eq!(
        patch.object,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "team-a", "labels": {"example.com/team": "a"}, "uid": "uid-ns-team-a"}}),
        "no trellis label, no ownerReference, no annotation"
    );
    assert_eq!(patch.uid.as_deref(), Some("uid-ns-team-a"));
    assert!(!patch.force);
    assert!(p.needs_finalizer, "release needs the cleanup finalizer");
    assert!(
        p.reads.iter().any(|r| r.id == "team"
            && r.kind == "Namespace"
            && r.target == RelatedTarget::Name("team-a".into())),
        "the target is read (indexed), {:?}",
        p.reads
    );
    assert!(p.pending.is_empty(), "{:?}", p.pending);
    assert!(p.release.is_empty());
}

#[test]
fn a_missing_target_is_pending_target_not_found_and_never_sent() {
    let r = ns_rule("");
    let cm = live("ConfigMap", "a-cm", "cm", json!({"data": {"v": "x"}}));
    let p = run(&r, &parent(json!({"target": "nowhere"})), vec![cm]);
    assert!(
        p.errors.is_empty(),
        "pending is not an error: {:?}",
        p.errors
    );
    assert_eq!(p.patches.len(), 1, "rendered, for render to show");
    assert_eq!(p.patches[0].uid, None, "no uid: the operator sends nothing");
    assert_eq!(p.pending.len(), 1);
    assert_eq!(p.pending[0].reason, TARGET_NOT_FOUND);
    let ready = condition(&p, "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], TARGET_NOT_FOUND);
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("Namespace nowhere does not exist"),
        "{ready}"
    );
    let synced = condition(&p, "Synced");
    assert_eq!(synced["reason"], TARGET_NOT_FOUND);
    assert!(
        synced["message"]
            .as_str()
            .unwrap()
            .starts_with("patch \"team\""),
        "{synced}"
    );
}

#[test]
fn a_patch_is_ready_when_its_target_holds_the_fields_or_its_ready_when_says_so() {
    let r = ns_rule("");
    let parent = parent(json!({"target": "team-a"}));
    let p = run(&r, &parent, vec![namespace("team-a", json!({}))]);
    let ready = condition(&p, "Ready");
    assert_eq!(
        ready["reason"], "ChildNotReady",
        "the ConfigMap first: {ready}"
    );
    let cm = live("ConfigMap", "a-cm", "cm", json!({"data": {"v": "x"}}));
    let p = run(
        &r,
        &parent,
        vec![cm.clone(), namespace("team-a", json!({}))],
    );
    let ready = condition(&p, "Ready");
    assert_eq!(ready["reason"], "PatchNotReady", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("patch \"team\"")
    );
    let labelled = namespace("team-a", json!({"labels": {"example.com/team": "a"}}));
    let p = run(&r, &parent, vec![cm.clone(), labelled]);
    assert_eq!(condition(&p, "Ready")["status"], "True");

    let r = rule(&format!(
        "{PARENT_KIND}  patches:\n    - id: team\n      apiVersion: v1\n      kind: Namespace\n      allowCrossNamespace: true\n      readyWhen: \"self.status.phase == 'Active'\"\n      template: |\n        metadata: {{name: team-a, labels: {{x: y}}}}\n  status:\n    conditions:\n      - type: Labelled\n        when: \"patches.team.metadata.labels.x | default('') == 'y'\"\n        reason: TeamLabelled\n"
    ));
    let active = namespace("team-a", json!({"labels": {"x": "y"}}));
    let mut active = active;
    active["status"] = json!({"phase": "Active"});
    let p = run(&r, &parent, vec![active]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(condition(&p, "Ready")["status"], "True");
    assert_eq!(
        condition(&p, "Labelled")["status"],
        "True",
        "patches.<id> is the observed target"
    );
}

#[test]
fn a_for_each_patch_contributes_to_each_target_and_reads_as_a_list() {
    let r = rule(&format!(
        "{PARENT_KIND}  patches:\n    - id: cms\n      apiVersion: v1\n      kind: ConfigMap\n      forEach: \"spec.names\"\n      template: |\n        metadata:\n          name: {{{{ item }}}}\n          annotations: {{example.com/by: {{{{ parent.metadata.name }}}}}}\n  status:\n    fields:\n      - path: patched\n        value: \"patches.cms | length\"\n"
    ));
    let cm = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}")}})
    };
    let p = run(
        &r,
        &parent(json!({"names": ["one", "two", "three"]})),
        vec![cm("one"), cm("two")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.patches.len(), 3);
    assert_eq!(p.patches[0].object["metadata"]["namespace"], "ns");
    assert_eq!(p.patches[1].uid.as_deref(), Some("u-two"));
    assert_eq!(p.patches[2].uid, None, "three does not exist");
    assert_eq!(p.pending[0].reason, TARGET_NOT_FOUND);
    assert_eq!(p.status.as_ref().unwrap()["patched"], 2);
}

#[test]
fn contributions_no_longer_rendered_are_released_on_a_clean_pass_only() {
    let r = ns_rule("");
    let mine = json!([{"manager": field_manager("app", UID), "operation": "Apply"}]);
    let old = namespace("old-team", json!({"managedFields": mine}));
    let theirs = namespace(
        "other",
        json!({"managedFields": [{"manager": field_manager("app", "uid-2"), "operation": "Apply"}]}),
    );
    let current = namespace("team-a", json!({"managedFields": mine}));
    let observed = vec![old.clone(), theirs.clone(), current.clone()];
    let p = run(&r, &parent(json!({"target": "team-a"})), observed.clone());
    assert_eq!(
        p.release,
        vec![Release {
            key: ObjectKey::of(&old).unwrap(),
            api_version: "v1".into(),
            uid: Some("uid-ns-old-team".into()),
        }],
        "only this parent's, only what is not rendered"
    );
    assert_eq!(
        p.release[0].body(),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "old-team", "uid": "uid-ns-old-team"}}),
        "the empty apply: identity and uid only"
    );
    let p = run(
        &r,
        &parent(json!({"target": "team-a", "label": false})),
        observed.clone(),
    );
    assert_eq!(
        p.release.len(),
        2,
        "includeWhen false releases: {:?}",
        p.release
    );

    // A patch held back: what it contributed is kept.
    let held = rule(&format!(
        "{PARENT_KIND}  related:\n    - id: src\n      apiVersion: v1\n      kind: ConfigMap\n      name: src\n{NS_PATCH}      dependsOn: [src]\n"
    ));
    let p = run(
        &held,
        &parent(json!({"target": "team-a"})),
        observed.clone(),
    );
    assert_eq!(p.pending[0].reason, "RelatedNotFound");
    assert!(p.release.is_empty(), "{:?}", p.release);
    // A failed pass: nothing released either.
    let p = run(&r, &parent(json!({"target": 5})), observed);
    assert!(!p.errors.is_empty());
    assert!(p.release.is_empty());
}

#[test]
fn a_patch_may_not_set_identity_owners_or_trellis_labels_nor_leave_its_namespace() {
    let bad = |template: &str, cross: bool| {
        let r = rule(&format!(
            "{PARENT_KIND}  patches:\n    - id: p\n      apiVersion: v1\n      kind: ConfigMap\n      allowCrossNamespace: {cross}\n      template: '{template}'\n"
        ));
        let p = run(&r, &parent(json!({})), vec![]);
        assert_eq!(p.patches.is_empty(), !p.errors.is_empty());
        p.errors.join("; ")
    };
    assert!(
        bad("{metadata: {name: x, ownerReferences: []}}", false)
            .contains("sets metadata.ownerReferences")
    );
    assert!(bad("{metadata: {name: x, uid: u}}", false).contains("sets metadata.uid"));
    assert!(
        bad(
            "{metadata: {name: x, labels: {trellis.dev/rule: app}}}",
            false
        )
        .contains("nothing of trellis")
    );
    assert!(
        bad("{metadata: {name: x, namespace: other}}", false)
            .contains("allowCrossNamespace: true on the patch")
    );
    assert!(bad("{metadata: {name: x, namespace: other}}", true).is_empty());
}

#[test]
fn a_patch_waits_for_children_and_patches_it_depends_on() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{CM}  patches:\n    - id: first\n      apiVersion: v1\n      kind: ConfigMap\n      dependsOn: [cm]\n      template: '{{metadata: {{name: t1, labels: {{a: b}}}}}}'\n    - id: second\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {{name: t2, labels: {{from: {{{{ patches.first.metadata.name }}}}}}}}\n"
    ));
    let target = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels}})
    };
    let observed = vec![target("t1", json!({})), target("t2", json!({}))];
    let p = run(&r, &parent(json!({})), observed.clone());
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.pending.len(), 2, "{:?}", p.pending);
    assert!(p.pending[0].reason.contains("waiting for child \"cm\""));
    assert!(p.pending[1].reason.contains("waiting for patch \"first\""));
    let mut observed = observed;
    observed.push(live("ConfigMap", "a-cm", "cm", json!({"data": {"v": "x"}})));
    observed[0] = target("t1", json!({"a": "b"}));
    let p = run(&r, &parent(json!({})), observed);
    assert!(p.pending.is_empty(), "{:?}", p.pending);
    assert_eq!(p.patches[1].object["metadata"]["labels"]["from"], "t1");
}

#[test]
fn a_retained_child_is_labelled_and_released_instead_of_deleted() {
    let retained =
        "      deletionPolicy: retain\n      includeWhen: \"spec.keep | default(true)\"\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{retained}"));
    let p = run(&r, &parent(json!({})), vec![]);
    assert_eq!(
        p.apply[0].object["metadata"]["labels"][LABEL_DELETION_POLICY],
        RETAIN
    );
    assert!(p.needs_finalizer, "a deleted parent releases it first");
    let mut cm = live("ConfigMap", "a-cm", "cm", json!({"data": {"v": "x"}}));
    cm["metadata"]["labels"][LABEL_DELETION_POLICY] = json!(RETAIN);
    let p = run(&r, &parent(json!({"keep": false})), vec![cm]);
    assert!(p.delete.is_empty(), "{:?}", p.delete);
    assert_eq!(p.retain.len(), 1);
    assert_eq!(p.retain[0].key.name, "a-cm");

    // Without the label (made before the rule said `retain`): the rule says.
    let cm = live("ConfigMap", "a-cm", "cm", json!({"data": {"v": "x"}}));
    let p = run(&r, &parent(json!({"keep": false})), vec![cm.clone()]);
    assert_eq!(p.retain.len(), 1);
    // Neither label nor rule: deleted.
    let plain = rule(&format!(
        "{PARENT_KIND}  children:\n{CM}      includeWhen: \"spec.keep\"\n"
    ));
    let p = run(&plain, &parent(json!({"keep": false})), vec![cm]);
    assert_eq!(p.delete.len(), 1);
    assert!(p.retain.is_empty());
}

#[test]
fn one_target_is_contributed_to_once_per_parent() {
    let r = rule(&format!(
        "{PARENT_KIND}  patches:\n    - id: twice\n      apiVersion: v1\n      kind: ConfigMap\n      forEach: \"[1, 2]\"\n      template: |\n        metadata: {{name: same, labels: {{n: {{{{ item | string }}}}}}}}\n"
    ));
    let target = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "same", "namespace": "ns", "uid": "u"}});
    let p = run(&r, &parent(json!({})), vec![target]);
    assert_eq!(p.patches.len(), 1);
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("ConfigMap ns/same is patched twice")),
        "{:?}",
        p.errors
    );
}
