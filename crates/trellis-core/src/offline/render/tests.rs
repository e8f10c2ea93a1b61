//! `render`'s document: which objects count as children, scope offline,
//! patches of the parent, CRD checks, clusters.

use std::sync::Arc;

use serde_json::{Value, json};

use super::render_document;
use crate::rules::CompiledRule;

const NOW: &str = "2026-11-29T00:00:00Z";

fn rule(spec: &str) -> Arc<CompiledRule> {
    crate::rules::testing::rule_with_spec(spec)
}

/// ConfigMaps `a-one` ← `a-two` ← `a-three`, each behind the one before.
const CHAIN: &str = "  children:
    - id: one
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-one' }}}
    - id: two
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [one]
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-two' }}}
    - id: three
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [two]
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-three' }}}
";

fn parent(namespace: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "demo.trellis.dev/v1",
        "kind": "App",
        "metadata": {"name": "a", "uid": "uid-1", "generation": 1},
    });
    if let Some(ns) = namespace {
        p["metadata"]["namespace"] = json!(ns);
    }
    p
}

fn unlabelled(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
}

fn ready(doc: &Value) -> &Value {
    doc["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
}

#[test]
fn observed_children_behind_depends_on_are_matched() {
    let r = rule(&format!(
        "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n{CHAIN}"
    ));
    let observed = vec![
        unlabelled("a-three"),
        unlabelled("a-two"),
        unlabelled("a-one"),
    ];
    let doc = render_document(&r, &parent(Some("ns")), observed, NOW);
    assert_eq!(doc["pending"], json!([]), "{doc:#}");
    assert!(doc.get("errors").is_none(), "{doc:#}");
    assert_eq!(doc["children"].as_array().unwrap().len(), 3, "{doc:#}");
    assert_eq!(ready(&doc)["status"], "True", "{doc:#}");
}

/// A copy per item into namespace `item`, of the source `src/cfg`.
const COPIES: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App, scope: Cluster}
  related:
    - id: source
      apiVersion: v1
      kind: ConfigMap
      namespace: src
      name: cfg
  children:
    - id: copy
      apiVersion: v1
      kind: ConfigMap
      forEach: \"['team-a', 'team-b']\"
      template: |
        metadata: {name: cfg, namespace: {{ item }}}
        data: {{ related.source.data }}
  status:
    fields:
      - path: copies
        value: \"children.copy | default([]) | length\"
";

#[test]
fn an_observed_related_object_named_like_a_child_elsewhere_is_not_that_child() {
    let r = rule(COPIES);
    let object = |ns: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "cfg", "namespace": ns}, "data": {"k": "v"}})
    };
    let doc = render_document(&r, &parent(None), vec![object("src")], NOW);
    assert!(doc.get("errors").is_none(), "{doc:#}");
    assert_eq!(doc["status"]["copies"], 0, "no copy exists yet: {doc:#}");
    assert!(
        doc.get("delete").is_none(),
        "the source is never pruned: {doc:#}"
    );
    assert_eq!(doc["children"].as_array().map(Vec::len), Some(2));
    let doc = render_document(
        &r,
        &parent(None),
        vec![object("src"), object("team-a")],
        NOW,
    );
    assert_eq!(doc["status"]["copies"], 1, "{doc:#}");
    assert!(doc.get("delete").is_none(), "{doc:#}");
}

#[test]
fn parent_scope_comes_from_the_rule_offline() {
    let cluster = rule(&format!(
        "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App, scope: Cluster}}\n{}",
        CHAIN.replace("{name: {{", "{namespace: team, name: {{")
    ));
    let doc = render_document(&cluster, &parent(None), vec![], NOW);
    assert!(doc.get("errors").is_none(), "{doc:#}");
    assert_eq!(doc["children"][0]["metadata"]["namespace"], "team");
    let doc = render_document(&cluster, &parent(Some("ns")), vec![], NOW);
    assert_eq!(
        doc["errors"],
        json!(["App ns/a: cluster-scoped parent must not have metadata.namespace"])
    );

    // Without a hint, a CRD parent written without a namespace is
    // cluster-scoped (so its namespaced children must name one)...
    let unhinted = rule(&format!(
        "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n{CHAIN}"
    ));
    let doc = render_document(&unhinted, &parent(None), vec![], NOW);
    assert_eq!(
        doc["errors"],
        json!(["template of child \"one\": the parent is cluster-scoped: \
                 a namespaced child must set metadata.namespace"])
    );
    // ...and one with a namespace is namespaced.
    let doc = render_document(&unhinted, &parent(Some("ns")), vec![], NOW);
    assert!(doc.get("errors").is_none(), "{doc:#}");
    assert_eq!(doc["children"][0]["metadata"]["namespace"], "ns");

    // A rule's `crd:` block is its parent's CRD: namespaced by default.
    let with_crd = rule(&format!(
        "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n  crd: {{}}\n{CHAIN}"
    ));
    let doc = render_document(&with_crd, &parent(None), vec![], NOW);
    assert_eq!(
        doc["errors"],
        json!([
            "App a: the parent has no metadata.namespace (App is namespaced; \
                 if it is not, set spec.parent.scope: Cluster in the rule)"
        ])
    );
    assert_eq!(doc["children"], json!([]));
}

#[test]
fn offline_a_childs_scope_hint_comes_before_the_built_in_table() {
    use crate::kinds::Gvk;
    use crate::rules::model::Scope;
    let hinted = rule(
        "  parent: {apiVersion: demo.trellis.dev/v1, kind: App, scope: Cluster}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      scope: Cluster
      template: |
        metadata: {name: x}
",
    );
    let scope_of = crate::plan::offline_input::offline_scope(&hinted);
    assert_eq!(scope_of(&Gvk::new("v1", "ConfigMap")), Scope::Cluster);
    assert_eq!(
        scope_of(&Gvk::new("demo.trellis.dev/v1", "App")),
        Scope::Cluster
    );
    assert_eq!(scope_of(&Gvk::new("v1", "Secret")), Scope::Namespaced);
    let plain = rule(&format!(
        "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n{CHAIN}"
    ));
    assert_eq!(
        crate::plan::offline_input::offline_scope(&plain)(&Gvk::new("v1", "ConfigMap")),
        Scope::Namespaced
    );
}

/// A rule whose one patch labels the parent itself.
const SELF_PATCH: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}
  patches:
    - id: mark
      apiVersion: demo.trellis.dev/v1
      kind: App
      template: |
        metadata:
          name: {{ parent.metadata.name }}
          labels: {marked: \"yes\"}
";

#[test]
fn a_patch_of_the_parent_itself_finds_the_parent_file_as_its_target() {
    let r = rule(SELF_PATCH);
    let doc = render_document(&r, &parent(Some("ns")), vec![], NOW);
    assert_eq!(doc["pending"], json!([]), "{doc:#}");
    assert!(doc.get("errors").is_none(), "{doc:#}");
    assert_eq!(
        doc["patches"],
        json!([{"apiVersion": "demo.trellis.dev/v1", "kind": "App", "metadata": {
            "name": "a", "namespace": "ns", "uid": "uid-1",
            "labels": {"marked": "yes"}}}]),
        "the body carries the parent's uid, as for any observed target: {doc:#}"
    );
    // Without a uid in the file, the placeholder that labels and
    // ownerReferences use stands for it here too.
    let mut anonymous = parent(Some("ns"));
    anonymous["metadata"].as_object_mut().unwrap().remove("uid");
    let doc = render_document(&r, &anonymous, vec![], NOW);
    assert_eq!(doc["pending"], json!([]), "{doc:#}");
    assert_eq!(
        doc["patches"][0]["metadata"]["uid"],
        crate::plan::PLACEHOLDER_UID,
        "{doc:#}"
    );
}

#[test]
fn a_parent_its_crd_refuses_prunes_nothing() {
    let r = rule(
        "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}
  children:
    - id: one
      apiVersion: v1
      kind: ConfigMap
      includeWhen: spec.keep
      template: |
        metadata: {name: a-one}
",
    );
    let dir = tempfile::tempdir().unwrap();
    let crd = dir.path().join("crd.yaml");
    std::fs::write(
        &crd,
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: apps.demo.trellis.dev}
spec:
  group: demo.trellis.dev
  scope: Namespaced
  names: {kind: App, plural: apps}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                keep: {type: boolean}
                n: {type: integer}
",
    )
    .unwrap();
    let crds = crate::crd::offline::OfflineCrds::load(&crd).unwrap();
    let mut p = parent(Some("ns"));
    let live = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "a-one", "namespace": "ns", "labels": {
            "trellis.dev/rule": "app", "trellis.dev/child": "one",
            "trellis.dev/parent-uid": "uid-1"}}});
    p["spec"] = json!({"keep": false, "n": 3});
    let doc = super::render_document_with(&r, &p, vec![live.clone()], NOW, Some(&crds));
    assert_eq!(doc["delete"], json!(["ConfigMap ns/a-one"]), "{doc:#}");
    p["spec"]["n"] = json!("three");
    let doc = super::render_document_with(&r, &p, vec![live], NOW, Some(&crds));
    assert!(doc.get("delete").is_none(), "{doc:#}");
    assert!(doc["errors"].to_string().contains("spec.n"), "{doc:#}");
    let synced = &doc["status"]["conditions"][1];
    assert_eq!(
        (&synced["type"], &synced["reason"]),
        (&json!("Synced"), &json!("InvalidSpec"))
    );
}

#[test]
fn offline_crds_give_scope_schema_checks_and_dropped_status_warnings() {
    use crate::crd::offline::{OfflineCrds, dropped_status_fields, parent_scope};
    let dir = tempfile::tempdir().unwrap();
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "apps.demo.example.com"},
        "spec": {
            "group": "demo.example.com",
            "scope": "Cluster",
            "names": {"kind": "App", "plural": "apps"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "properties": {
                        "replicas": {"type": "integer", "maximum": 5, "default": 1},
                    }},
                    "status": {"type": "object", "properties": {
                        "observedGeneration": {"type": "integer"},
                        "conditions": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                        "ready": {"type": "integer"},
                    }},
                },
            }}}],
        },
    });
    std::fs::write(
        dir.path().join("app.yaml"),
        crate::yaml::to_string(&crd).unwrap(),
    )
    .unwrap();
    let crds = OfflineCrds::load(dir.path()).unwrap();
    let rule = crate::rules::testing::rule_with_spec(
        "  parent: {apiVersion: demo.example.com/v1, kind: App}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {namespace: team, name: {{ parent.metadata.name }}}
  status:
    fields:
      - {path: ready, value: '1'}
      - {path: url, value: \"'x'\"}
",
    );
    let parent = json!({"apiVersion": "demo.example.com/v1", "kind": "App",
    "metadata": {"name": "a", "namespace": "ns"}, "spec": {"replicas": 9}});
    assert_eq!(
        parent_scope(&rule, &parent, Some(&crds)),
        Some(crate::rules::model::Scope::Cluster)
    );
    let doc =
        super::render_document_with(&rule, &parent, vec![], "2026-11-29T00:00:00Z", Some(&crds));
    let errors: Vec<&str> = doc["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("cluster-scoped parent must not have metadata.namespace")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("the CRD's schema refuses spec.replicas")),
        "{errors:?}"
    );
    let (crd_doc, version) = crds.find(&rule.parent).unwrap();
    let warnings = dropped_status_fields(&rule, crd_doc, version);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].field, "spec.status.fields[1].path");
    assert!(
        warnings[0].message.contains("would drop .status.url"),
        "{}",
        warnings[0]
    );
}

/// `cm` at home, `remote` in the cluster `spec.region` names.
const PLACED: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}
  children:
    - id: cm
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-cm' }}}
    - id: remote
      apiVersion: v1
      kind: ConfigMap
      cluster: spec.region
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-cm' }}}
        data: {v: x}
";

#[test]
fn render_names_each_childs_cluster_and_places_observed_objects_by_annotation() {
    let r = rule(PLACED);
    let mut p = parent(Some("ns"));
    p["spec"] = json!({"region": "eu-1"});
    let doc = render_document(&r, &p, vec![], NOW);
    assert!(doc.get("errors").is_none(), "{doc:#}");
    assert_eq!(
        doc["clusters"],
        json!([
            {"child": "cm", "object": "ConfigMap ns/a-cm", "cluster": "local"},
            {"child": "remote", "object": "ConfigMap ns/a-cm", "cluster": "eu-1"},
        ]),
        "{doc:#}"
    );
    let remote = &doc["children"][1];
    assert_eq!(remote["metadata"]["labels"]["trellis.dev/hub"], "hub");
    assert!(remote["metadata"].get("ownerReferences").is_none());

    // An observed object the annotation places in eu-1 is the remote
    // child, not the local one of the same name; one placed in a cluster
    // the child left is pruned there.
    let observed = |cluster: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "a-cm", "namespace": "ns",
                            "annotations": {"trellis.dev/cluster": cluster},
                            "labels": {"trellis.dev/rule": "app", "trellis.dev/child": "remote",
                                       "trellis.dev/parent-uid": "uid-1"}}})
    };
    let doc = render_document(&r, &p, vec![observed("us-1")], NOW);
    assert_eq!(
        doc["delete"],
        json!(["ConfigMap ns/a-cm in cluster us-1"]),
        "{doc:#}"
    );
    let doc = render_document(&r, &p, vec![observed("eu-1")], NOW);
    assert!(doc.get("delete").is_none(), "{doc:#}");
    // Without a `cluster:` child, no `clusters` list.
    let chain = rule(&format!(
        "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n{CHAIN}"
    ));
    let doc = render_document(&chain, &parent(Some("ns")), vec![], NOW);
    assert!(doc.get("clusters").is_none());
}
