//! `trellis tree` and `trellis diff` on a parent with a child in a spoke,
//! end to end with two real control planes (see `tests/clusters.rs`): both
//! reach the spoke through the cluster Secret in the operator's namespace,
//! as the operator does. `tree` shows the spoke child with its cluster,
//! ready and synced; `diff` finds nothing to change there (a diff that
//! looked at the hub would create it). With the spoke's API server stopped,
//! `tree` still answers: the spoke child's line says the cluster is
//! unreachable, the home child's line is as before.
mod support;

#[path = "clusters/hub.rs"]
mod hub;

use std::process::Command;

use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};

use hub::{SPOKE, setup};
use support::eventually;
use support::operator::{Operator, WAIT, rule_set};
use trellis::diff::ChildChange;

const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: placed
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: home
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-home" }}
    - id: remote
      apiVersion: v1
      kind: ConfigMap
      cluster: "'spoke-1'"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-remote" }}
        data:
          v: "1"
"#;

/// `trellis tree -o json` of the parent `p`: its exit code and document.
fn tree(rules: &std::path::Path, kind: &str, ns: &str) -> (Option<i32>, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("tree")
        .arg("--rules")
        .arg(rules)
        .args([
            &format!("{}/p", kind.to_lowercase()),
            "-n",
            ns,
            "-o",
            "json",
        ])
        .args(["--operator-namespace", ns])
        .env(
            "KUBECONFIG",
            support::cluster()
                .kubeconfig_path
                .clone()
                .expect("a kubeconfig file"),
        )
        .output()
        .expect("run trellis tree");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), doc, err)
}

/// The line of entry `id`.
fn line<'v>(doc: &'v Value, id: &str) -> &'v Value {
    doc["trees"][0]["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["id"] == id)
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_and_diff_read_the_spoke_through_its_secret() {
    let s = setup("clusters-cli").await;
    let ns = s.ns.name().to_owned();
    let text = s.kind.rule(RULE);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("rule.yaml"), &text).expect("write rule");
    s.register(&s.spoke.kubeconfig).await;
    let mut options = trellis::operator::Options::new(vec![], vec![ns.clone()]);
    options.instance = "clusters-cli".into();
    options.operator_namespace = ns.clone();
    options.cluster_name = "hub-a".into();
    let operator = Operator::spawn(options, rule_set(&[&text]), &s.ns.client);
    let parent = DynamicObject::new("p", &s.kind.resource)
        .within(&ns)
        .data(json!({"spec": {}}));
    s.parents()
        .create(&PostParams::default(), &parent)
        .await
        .expect("create parent");
    eventually("the parent Ready", WAIT, || async {
        let ready = s.condition("p", "Ready").await;
        (ready["status"] == "True")
            .then_some(())
            .ok_or(ready.to_string())
    })
    .await;
    operator.stop().await;

    // tree: the spoke child with its cluster, ready and synced.
    let (code, doc, err) = tree(dir.path(), &s.kind.kind, &ns);
    let remote = line(&doc, "remote");
    assert_eq!(code, Some(0), "{doc:#}\n{err}");
    assert_eq!(remote["cluster"], SPOKE, "{doc:#}");
    assert_eq!(remote["ready"], true, "{doc:#}");
    assert_eq!(remote["synced"], true, "{doc:#}");
    assert!(line(&doc, "home")["cluster"].is_null(), "{doc:#}");

    // diff: nothing to change, the spoke child read (and dry-run) there.
    let set = rule_set(&[&text]);
    let manifest = json!({
        "apiVersion": s.kind.api_version(),
        "kind": s.kind.kind,
        "metadata": {"name": "p", "namespace": ns},
    });
    let report = trellis::diff::live::diff_as(
        &s.ns.client,
        &set,
        &trellis::diff::live::Target::Parent(&manifest),
        &ns,
    )
    .await
    .expect("diff");
    let children = &report.diffs[0].children;
    let remote = children
        .iter()
        .find(|c| c.id == "remote")
        .expect("the remote child diffed");
    assert_eq!(remote.key.cluster.as_deref(), Some(SPOKE));
    assert!(
        matches!(remote.change, ChildChange::Unchanged),
        "{:?}",
        remote.change
    );

    // The spoke down: tree answers; the spoke child's line says why.
    s.spoke.kill("kube-apiserver", "KILL").await;
    let (code, doc, err) = tree(dir.path(), &s.kind.kind, &ns);
    let remote = line(&doc, "remote");
    // READY is the parent's own condition (the operator, stopped, left it
    // True): what matters is an answer, not an error (2).
    assert!(
        matches!(code, Some(0 | 1)),
        "an answer, not an error: {doc:#}\n{err}"
    );
    let reason = remote["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("ClusterUnreachable") && reason.contains(SPOKE),
        "{doc:#}"
    );
    assert_eq!(line(&doc, "home")["ready"], true, "{doc:#}");
    s.spoke.restart("kube-apiserver").await;
}
