//! `trellis diff` against the real control plane: what one pass would
//! change, from the live parent and children, by server-side dry-run — and
//! that it never writes anything.
mod support;

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use trellis::diff::live::{Report, Target, diff};
use trellis::diff::{ChildChange, exit_code, print};

use support::TestNamespace;
use support::operator::{
    Operator, TestKind, install_kind, rule_set, wait_condition, wait_exists, wait_for,
};

const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: greeter
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        data:
          greeting: {{ spec.greeting }}
    - id: extra
      apiVersion: v1
      kind: ConfigMap
      includeWhen: "spec.extra"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-extra" }}
        data:
          note: extra
    # Never updated once it exists.
    - id: token
      apiVersion: v1
      kind: Secret
      policy: createOnly
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-token" }}
        stringData:
          token: {{ spec.greeting }}
    # Immutable: a changed rendering is a delete and a create.
    - id: frozen
      apiVersion: v1
      kind: ConfigMap
      policy: recreate
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-frozen" }}
        immutable: true
        data:
          greeting: {{ spec.greeting }}
  status:
    fields:
      - path: greeting
        from: config
        jsonPath: $.data.greeting
"#;

/// resourceVersion of the parents and every ConfigMap in the namespace.
async fn versions(ns: &TestNamespace, kind: &TestKind) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let parents = kind
        .api(ns)
        .list(&ListParams::default())
        .await
        .expect("list parents");
    for p in parents {
        out.insert(
            format!("parent {}", p.name_any()),
            p.resource_version().unwrap_or_default(),
        );
    }
    let cms: Api<ConfigMap> = ns.api();
    for cm in cms
        .list(&ListParams::default())
        .await
        .expect("list configmaps")
    {
        out.insert(
            format!("cm {}", cm.name_any()),
            cm.resource_version().unwrap_or_default(),
        );
    }
    out
}

/// Runs the diff and asserts it changed nothing on the cluster.
async fn dry(ns: &TestNamespace, kind: &TestKind, rules: &str, target: Target<'_>) -> Report {
    let set = rule_set(&[rules]);
    let before = versions(ns, kind).await;
    let report = diff(&ns.client, &set, &target).await.expect("diff");
    assert_eq!(
        versions(ns, kind).await,
        before,
        "diff wrote to the cluster"
    );
    report
}

fn manifest(kind: &TestKind, ns: &TestNamespace, name: &str) -> Value {
    json!({"apiVersion": kind.api_version(), "kind": kind.kind,
           "metadata": {"name": name, "namespace": ns.name()}})
}

/// Starts the operator, waits until `names` are Ready at their current
/// generation, and stops it.
async fn converge(ns: &TestNamespace, kind: &TestKind, rules: &str, names: &[&str]) {
    let operator = Operator::start(&ns.client, ns.name(), &[rules]);
    for name in names {
        let generation = kind
            .api(ns)
            .get(name)
            .await
            .expect("get parent")
            .metadata
            .generation;
        wait_condition(&kind.api(ns), name, "Ready", "True").await;
        wait_for(
            &kind.api(ns),
            name,
            "status.observedGeneration",
            |p: &DynamicObject| match p
                .data
                .pointer("/status/observedGeneration")
                .and_then(Value::as_i64)
            {
                g if g == generation => Ok(()),
                g => Err(format!(
                    "observedGeneration {g:?}, generation {generation:?}"
                )),
            },
        )
        .await;
    }
    operator.stop().await;
}

fn change_of<'a>(report: &'a Report, id: &str) -> &'a ChildChange {
    let [d] = report.diffs.as_slice() else {
        panic!("one parent expected:\n{}", print(&report.diffs));
    };
    &d.children
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no child {id}:\n{}", print(&report.diffs)))
        .change
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_shows_nothing_after_a_pass_and_each_change_a_pass_would_make() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Greeter").await;
    let rules = kind.rule(RULE);
    kind.create(
        &ns,
        "hello",
        json!({"greeting": "hello", "extra": true}),
        &[],
    )
    .await;
    converge(&ns, &kind, &rules, &["hello"]).await;
    let parent = manifest(&kind, &ns, "hello");

    // Converged: nothing would change.
    let report = dry(&ns, &kind, &rules, Target::Parent(&parent)).await;
    let text = print(&report.diffs);
    assert_eq!(exit_code(&report.diffs), 0, "{text}");
    assert!(text.contains("no changes (4 children unchanged)"), "{text}");

    // The parent's spec edited while no operator runs: the child's field
    // and the status it maps are named, old and new value.
    kind.patch(&ns, "hello", json!({"spec": {"greeting": "hi"}}))
        .await;
    let report = dry(&ns, &kind, &rules, Target::Parent(&parent)).await;
    let text = print(&report.diffs);
    assert_eq!(exit_code(&report.diffs), 1, "{text}");
    assert!(
        text.contains("  ~ config ConfigMap "),
        "the changed child is listed:\n{text}"
    );
    assert!(
        text.contains("      ~ data.greeting: \"hello\" -> \"hi\"\n"),
        "{text}"
    );
    assert!(
        !text.contains("render-hash"),
        "the render hash is noise beside the real change:\n{text}"
    );
    // The pass reads the child as it is now: the status it maps keeps the
    // old value, and only observedGeneration moves.
    assert!(
        text.contains("      ~ status.observedGeneration: 1 -> 2\n")
            && !text.contains("status.greeting"),
        "{text}"
    );
    assert_eq!(
        change_of(&report, "extra"),
        &ChildChange::Unchanged,
        "{text}"
    );
    assert_eq!(
        change_of(&report, "token"),
        &ChildChange::Unchanged,
        "createOnly:\n{text}"
    );
    assert!(
        text.contains(
            " (recreate: delete, then create)\n      ~ data.greeting: \"hello\" -> \"hi\"\n"
        ),
        "{text}"
    );

    // A child deleted: listed as a creation; another's field edited by
    // someone else: listed as the update that restores it.
    let cms: Api<ConfigMap> = ns.api();
    cms.delete("hello", &DeleteParams::default())
        .await
        .expect("delete child");
    support::operator::wait_gone(&cms, "hello", support::operator::WAIT).await;
    cms.patch(
        "hello-extra",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"note": "edited"}})),
    )
    .await
    .expect("edit child");
    let report = dry(&ns, &kind, &rules, Target::Parent(&parent)).await;
    let text = print(&report.diffs);
    assert!(
        matches!(change_of(&report, "config"), ChildChange::Create { .. }),
        "{text}"
    );
    assert!(
        text.contains("(create)\n      + data.greeting: \"hi\"\n"),
        "{text}"
    );
    assert!(
        text.contains("      ~ data.note: \"edited\" -> \"extra\"\n"),
        "{text}"
    );

    // includeWhen turned false: the child would be pruned.
    kind.patch(&ns, "hello", json!({"spec": {"extra": false}}))
        .await;
    let report = dry(&ns, &kind, &rules, Target::Parent(&parent)).await;
    let text = print(&report.diffs);
    assert_eq!(change_of(&report, "extra"), &ChildChange::Prune, "{text}");
    assert!(text.contains(" (prune)\n"), "{text}");
    // The deleted child's status field is removed, as the operator removes
    // the fields a pass no longer produces.
    assert!(
        text.contains("      - status.greeting: \"hello\"\n"),
        "{text}"
    );
    assert_eq!(exit_code(&report.diffs), 1, "{text}");

    // One pass later (the recreated child made again), nothing is left to change.
    let operator = Operator::start(&ns.client, ns.name(), &[&rules]);
    wait_for(&cms, "hello-frozen", "the recreated child", |cm| {
        match cm.data.as_ref().and_then(|d| d.get("greeting")) {
            Some(g) if g == "hi" => Ok(()),
            other => Err(format!("greeting {other:?}")),
        }
    })
    .await;
    operator.stop().await;
    converge(&ns, &kind, &rules, &["hello"]).await;
    wait_exists(&cms, "hello").await;
    let report = dry(&ns, &kind, &rules, Target::Parent(&parent)).await;
    let text = print(&report.diffs);
    assert_eq!(exit_code(&report.diffs), 0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_all_covers_every_parent_of_a_rule_in_a_namespace_and_names_a_failing_write() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Greeter").await;
    let rules = kind.rule(RULE);
    for name in ["a", "b"] {
        kind.create(&ns, name, json!({"greeting": name, "extra": false}), &[])
            .await;
    }
    converge(&ns, &kind, &rules, &["a", "b"]).await;
    kind.patch(&ns, "b", json!({"spec": {"extra": true}})).await;
    // b's new child would take the name of an object someone else made.
    let cms: Api<ConfigMap> = ns.api();
    let foreign: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "b-extra"}})).expect("ConfigMap");
    cms.create(&Default::default(), &foreign)
        .await
        .expect("create foreign ConfigMap");

    let all = Target::All {
        namespace: Some(ns.name().to_owned()),
        rule: Some("greeter".into()),
    };
    let report = dry(&ns, &kind, &rules, all).await;
    let text = print(&report.diffs);
    assert_eq!(
        report
            .diffs
            .iter()
            .map(|d| d.parent.as_str())
            .collect::<Vec<_>>(),
        [
            format!("Greeter {}/a", ns.name()),
            format!("Greeter {}/b", ns.name())
        ],
        "{text}"
    );
    assert!(!report.diffs[0].changes(), "{text}");
    assert!(
        text.contains(&format!("  x extra ConfigMap {}/b-extra\n", ns.name()))
            && text.contains("belongs to someone else"),
        "{text}"
    );
    assert_eq!(exit_code(&report.diffs), 2, "a pass would fail:\n{text}");

    let unknown = Target::All {
        namespace: None,
        rule: Some("nosuch".into()),
    };
    let err = diff(&ns.client, &rule_set(&[&rules]), &unknown)
        .await
        .expect_err("an unknown rule is an error");
    assert!(err.to_string().contains("no rule named `nosuch`"), "{err}");
}

/// The binary: the kubeconfig like `trellis run`, the exit codes, and a
/// parent that is not on the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diff_command_exits_one_on_a_change_and_two_for_a_missing_parent() {
    let cluster = support::cluster();
    let kubeconfig = cluster.kubeconfig_path.clone().expect("a kubeconfig file");
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Greeter").await;
    let rules = kind.rule(RULE);
    kind.create(
        &ns,
        "cli",
        json!({"greeting": "hello", "extra": false}),
        &[],
    )
    .await;
    converge(&ns, &kind, &rules, &["cli"]).await;
    kind.patch(&ns, "cli", json!({"spec": {"greeting": "bye"}}))
        .await;

    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("rule.yaml"), &rules).expect("write rule");
    let parents = tempfile::tempdir().expect("temp dir");
    let run = |parent: &Value| {
        let path = parents.path().join("parent.yaml");
        std::fs::write(&path, serde_json::to_string(parent).expect("json")).expect("write");
        let before = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args(["diff", "--rules"])
            .arg(dir.path())
            .arg(&path)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("run trellis diff");
        eprintln!("trellis diff took {:?}", before.elapsed());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let before = versions(&ns, &kind).await;
    let (code, out, err) = run(&manifest(&kind, &ns, "cli"));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("      ~ data.greeting: \"hello\" -> \"bye\"\n"),
        "{out}"
    );
    let (code, out, err) = run(&manifest(&kind, &ns, "nosuch"));
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("does not exist on the cluster"), "{err}");
    assert_eq!(
        versions(&ns, &kind).await,
        before,
        "diff wrote to the cluster"
    );
}

const COPY_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: copier
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: source
      apiVersion: v1
      kind: ConfigMap
      name: "{{ spec.from }}"
  children:
    - id: copy
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-copy" }}
        data: {{ related.source.data }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_reads_the_related_objects_the_rule_reads() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Copier").await;
    let rules = kind.rule(COPY_RULE);
    kind.create(&ns, "c", json!({"from": "settings"}), &[])
        .await;
    let parent = manifest(&kind, &ns, "c");

    // The source is missing: the copy is held back, nothing else happens.
    let report = dry(&ns, &kind, &rules, Target::Parent(&parent)).await;
    let text = print(&report.diffs);
    assert!(
        text.contains("  . copy held back: RelatedNotFound"),
        "{text}"
    );
    assert!(report.diffs[0].children.is_empty(), "{text}");

    // Once it exists, its data is what the copy would be created with.
    let cms: Api<ConfigMap> = ns.api();
    let source: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"}, "data": {"color": "blue"}
    }))
    .expect("ConfigMap");
    cms.create(&Default::default(), &source)
        .await
        .expect("create source");
    let report = dry(&ns, &kind, &rules, Target::Parent(&parent)).await;
    let text = print(&report.diffs);
    assert!(
        matches!(change_of(&report, "copy"), ChildChange::Create { .. }),
        "{text}"
    );
    assert!(text.contains("      + data.color: \"blue\"\n"), "{text}");
    assert_eq!(exit_code(&report.diffs), 1, "{text}");
}
