//! `trellis tree` against the real control plane: the binary, run as a user
//! runs it (KUBECONFIG), on parents the operator serves — ready, held back,
//! with missing, excluded, related and patched entries — its JSON and text,
//! `--watch` redrawing on a change, and the exit codes 0/1/2.
mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

use support::TestNamespace;
use support::operator::{Operator, TestKind, install_kind, wait_condition, wait_exists};

/// What one run of the binary gave.
struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.out)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}{}", self.out, self.err))
    }
}

fn kubeconfig() -> std::path::PathBuf {
    support::cluster()
        .kubeconfig_path
        .clone()
        .expect("a kubeconfig file")
}

fn tree_command(rules: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trellis"));
    cmd.arg("tree")
        .arg("--rules")
        .arg(rules)
        .args(args)
        .env("KUBECONFIG", kubeconfig())
        .env_remove("TRELLIS_OPERATOR_NAMESPACE");
    cmd
}

fn tree(rules: &Path, args: &[&str]) -> Run {
    let out = tree_command(rules, args)
        .output()
        .expect("run trellis tree");
    Run {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The rule written where the binary reads it.
fn rules_dir(rule: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("rule.yaml"), rule).expect("write rule");
    dir
}

/// The line of entry `id` (the `n`th, for several objects).
fn line<'v>(doc: &'v Value, id: &str) -> &'v Value {
    doc["trees"][0]["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .find(|l| l["id"] == id)
        .unwrap_or_else(|| panic!("no line {id}: {doc:#}"))
}

fn target(kind: &TestKind, name: &str) -> String {
    format!("{}/{name}", kind.kind.to_lowercase())
}

const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: tree
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
      dependsOn: [config]
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-extra" }}
        data:
          note: extra
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_parent_exits_zero_with_its_children_ready_synced_and_one_excluded() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Leaf").await;
    let rule = kind.rule(RULE);
    let dir = rules_dir(&rule);
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    kind.create(&ns, "a", json!({"greeting": "hi", "extra": false}), &[])
        .await;
    wait_condition(&kind.api(&ns), "a", "Ready", "True").await;

    let run = tree(
        dir.path(),
        &[&target(&kind, "a"), "-n", ns.name(), "-o", "json"],
    );
    assert_eq!(run.code, Some(0), "{}{}", run.out, run.err);
    let doc = run.json();
    assert_eq!(doc["ready"], true);
    assert_eq!(doc["trees"][0]["rule"], "tree");
    let parent = &doc["trees"][0]["parent"];
    assert_eq!(
        (&parent["name"], &parent["ready"]),
        (&json!("a"), &json!(true))
    );
    let types: Vec<&str> = parent["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert!(
        types.contains(&"Ready") && types.contains(&"Synced"),
        "{types:?}"
    );
    let config = line(&doc, "config");
    assert_eq!(
        (&config["state"], &config["ready"], &config["synced"]),
        (&json!("present"), &json!(true), &json!(true))
    );
    assert_eq!(config["namespace"], ns.name());
    assert_eq!(config["name"], "a");
    let extra = line(&doc, "extra");
    assert_eq!(extra["state"], "excluded");
    assert_eq!(
        extra["depth"], 2,
        "nested under config, which it depends on"
    );

    // The text: the parent, then the children drawn under it.
    let run = tree(dir.path(), &[&target(&kind, "a"), "-n", ns.name()]);
    assert_eq!(run.code, Some(0), "{}{}", run.out, run.err);
    let text = &run.out;
    assert!(
        text.starts_with(&format!("rule tree: Leaf {}/a\n", ns.name())),
        "{text}"
    );
    assert!(text.contains("  Ready=True"), "{text}");
    let row = |start: &str| {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no row {start:?}:\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row("Leaf/a")[..5],
        [
            "Leaf/a",
            "Leaf",
            &format!("{}/a", ns.name()),
            "True",
            "True"
        ]
    );
    assert_eq!(
        row("└─ config")[2..6],
        ["ConfigMap", &format!("{}/a", ns.name()), "True", "True"]
    );
    assert_eq!(
        row("   └─ extra")[2..],
        [
            "ConfigMap",
            "-",
            "-",
            "-",
            "excluded:",
            "includeWhen",
            "is",
            "false",
            "for",
            "this",
            "parent"
        ]
    );
    operator.stop().await;
}

const HELD_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: held
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    # No node: its Pods never run, so it never becomes ready.
    - id: web
      apiVersion: apps/v1
      kind: Deployment
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        spec:
          replicas: 1
          selector: {matchLabels: {app: {{ parent.metadata.name }}}}
          template:
            metadata: {labels: {app: {{ parent.metadata.name }}}}
            spec:
              containers: [{name: app, image: registry.invalid/app:1}]
      readyWhen: "self.status.availableReplicas | default(0) >= 1"
    - id: after
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [web]
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-after" }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_held_back_by_one_not_ready_is_nested_under_it_and_a_deleted_one_is_missing() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Held").await;
    let rule = kind.rule(HELD_RULE);
    let dir = rules_dir(&rule);

    // Before any operator ran: every child the rule renders is missing,
    // and what waits for one is held back.
    kind.create(&ns, "h", json!({}), &[]).await;
    let run = tree(
        dir.path(),
        &[&target(&kind, "h"), "-n", ns.name(), "-o", "json"],
    );
    assert_eq!(run.code, Some(1), "not Ready: {}{}", run.out, run.err);
    let doc = run.json();
    assert_eq!(doc["ready"], false);
    let web = line(&doc, "web");
    assert_eq!(
        (&web["state"], &web["ready"]),
        (&json!("missing"), &json!(false))
    );
    assert_eq!(web["name"], "h");
    let after = line(&doc, "after");
    assert_eq!(
        (&after["state"], &after["depth"]),
        (&json!("pending"), &json!(2))
    );

    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    let deployments = ns.api::<Deployment>();
    wait_exists(&deployments, "h").await;
    wait_condition(&kind.api(&ns), "h", "Synced", "False").await;
    let run = tree(
        dir.path(),
        &[&target(&kind, "h"), "-n", ns.name(), "-o", "json"],
    );
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    let doc = run.json();
    let web = line(&doc, "web");
    assert_eq!(
        (&web["state"], &web["ready"], &web["synced"]),
        (&json!("present"), &json!(false), &json!(true))
    );
    let why = web["reason"].as_str().unwrap_or_default();
    assert!(why.contains("readyWhen"), "{why}");
    let after = line(&doc, "after");
    assert_eq!(after["state"], "pending");
    let why = after["reason"].as_str().unwrap_or_default();
    assert!(why.contains("waiting for child \"web\""), "{why}");
    let text = tree(dir.path(), &[&target(&kind, "h"), "-n", ns.name()]).out;
    assert!(
        text.contains("held back: waiting for child \"web\""),
        "{text}"
    );

    // With the operator stopped, a deleted child is missing, not synced.
    operator.stop().await;
    deployments
        .delete("h", &DeleteParams::default())
        .await
        .expect("delete the Deployment");
    support::operator::wait_gone(&deployments, "h", Duration::from_secs(30)).await;
    let doc = tree(
        dir.path(),
        &[&target(&kind, "h"), "-n", ns.name(), "-o", "json"],
    )
    .json();
    let web = line(&doc, "web");
    assert_eq!(
        (&web["state"], &web["synced"]),
        (&json!("missing"), &json!(false))
    );
}

const READS_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: reads
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
  patches:
    - id: mark
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ spec.mark }}
          labels:
            example.com/marked-by: {{ parent.metadata.name }}
"#;

async fn config_map(ns: &TestNamespace, name: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name}, "data": {"k": "v"}
    }))
    .expect("configmap");
    ns.api::<ConfigMap>()
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("creating ConfigMap {name}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn related_entries_and_patch_targets_are_lines_missing_until_they_exist() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Reader").await;
    let rule = kind.rule(READS_RULE);
    let dir = rules_dir(&rule);
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    kind.create(&ns, "r", json!({"from": "src", "mark": "shared"}), &[])
        .await;
    wait_condition(&kind.api(&ns), "r", "Ready", "False").await;

    let run = tree(
        dir.path(),
        &[&target(&kind, "r"), "-n", ns.name(), "-o", "json"],
    );
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    let doc = run.json();
    let source = line(&doc, "source");
    assert_eq!(
        (
            &source["role"],
            &source["state"],
            &source["name"],
            &source["depth"]
        ),
        (
            &json!("related"),
            &json!("missing"),
            &json!("src"),
            &json!(1)
        )
    );
    assert!(
        source["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("RelatedNotFound"),
        "{source}"
    );
    let copy = line(&doc, "copy");
    assert_eq!(
        (&copy["state"], &copy["depth"]),
        (&json!("pending"), &json!(2))
    );
    let mark = line(&doc, "mark");
    assert_eq!(
        (&mark["role"], &mark["state"]),
        (&json!("patch"), &json!("missing"))
    );
    assert!(
        mark["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("TargetNotFound"),
        "{mark}"
    );

    config_map(&ns, "src").await;
    config_map(&ns, "shared").await;
    wait_condition(&kind.api(&ns), "r", "Ready", "True").await;
    let run = tree(
        dir.path(),
        &[&target(&kind, "r"), "-n", ns.name(), "-o", "json"],
    );
    assert_eq!(run.code, Some(0), "{}{}", run.out, run.err);
    let doc = run.json();
    let source = line(&doc, "source");
    assert_eq!(
        (&source["state"], &source["ready"], &source["synced"]),
        (&json!("present"), &json!(true), &Value::Null)
    );
    let copy = line(&doc, "copy");
    assert_eq!(
        (&copy["state"], &copy["synced"]),
        (&json!("present"), &json!(true))
    );
    let mark = line(&doc, "mark");
    assert_eq!(
        (
            &mark["state"],
            &mark["ready"],
            &mark["synced"],
            &mark["name"]
        ),
        (
            &json!("present"),
            &json!(true),
            &json!(true),
            &json!("shared")
        )
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_the_tree_again_when_a_child_appears() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Watched").await;
    let rule = kind.rule(RULE);
    let dir = rules_dir(&rule);
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    kind.create(&ns, "w", json!({"greeting": "hi", "extra": false}), &[])
        .await;
    wait_condition(&kind.api(&ns), "w", "Ready", "True").await;

    let mut child = tree_command(
        dir.path(),
        &[
            &target(&kind, "w"),
            "-n",
            ns.name(),
            "-o",
            "json",
            "--watch",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn trellis tree --watch");
    let stdout = child.stdout.take().expect("stdout");
    let (send, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(l).is_err() {
                return;
            }
        }
    });
    let next = |what: &str| -> Value {
        let l = lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no tree printed ({what}): {e}"));
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))
    };
    let first = next("the first look");
    assert_eq!(line(&first, "extra")["state"], "excluded");

    kind.patch(&ns, "w", json!({"spec": {"extra": true}})).await;
    // Redraws come as what the tree shows changes; the last says extra exists.
    let mut seen = Vec::new();
    loop {
        let doc = next("after spec.extra turned true");
        let state = line(&doc, "extra")["state"].clone();
        seen.push(state.clone());
        if state == "present" && line(&doc, "extra")["synced"] == true {
            break;
        }
        assert!(seen.len() < 20, "no redraw with extra present: {seen:?}");
    }
    let _ = child.kill();
    let _ = child.wait();
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_exit_two_with_a_clear_message() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Lost").await;
    let dir = rules_dir(&kind.rule(RULE));

    let run = tree(dir.path(), &[&target(&kind, "nosuch"), "-n", ns.name()]);
    assert_eq!(run.code, Some(2), "{}{}", run.out, run.err);
    assert!(
        run.err
            .contains(&format!("Lost {}/nosuch does not exist", ns.name())),
        "{}",
        run.err
    );
    let run = tree(dir.path(), &["tenant/acme", "-n", ns.name()]);
    assert_eq!(run.code, Some(2), "{}{}", run.out, run.err);
    assert!(
        run.err
            .contains("no rule has parent kind \"tenant\" (the rules' parent kinds: Lost)"),
        "{}",
        run.err
    );
    let run = tree(dir.path(), &["lost", "-n", ns.name()]);
    assert_eq!(run.code, Some(2), "{}{}", run.out, run.err);
    assert!(run.err.contains("expected KIND/NAME"), "{}", run.err);
    assert!(run.out.is_empty(), "{}", run.out);

    // A parent its kind's only rule does not select.
    let picky = kind.rule(&RULE.replace(
        "    kind: @KIND@\n",
        "    kind: @KIND@\n    selector: {matchLabels: {tier: web}}\n",
    ));
    assert!(picky.contains("selector:"), "{picky}");
    let dir = rules_dir(&picky);
    kind.create(&ns, "plain", json!({}), &[]).await;
    let run = tree(dir.path(), &[&target(&kind, "plain"), "-n", ns.name()]);
    assert_eq!(run.code, Some(2), "{}{}", run.out, run.err);
    assert!(
        run.err.contains("rule tree does not select it"),
        "{}",
        run.err
    );
}

const UNSERVED_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: unserved
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: cert
      apiVersion: nowhere.trellis.test/v1
      kind: Certificate
      name: "{{ parent.metadata.name }}"
  children:
    - id: plain
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
    - id: secured
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [cert]
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-secured" }}
"#;

/// As in the operator, a related kind the API server does not serve holds
/// back only its readers: the tree shows the pass, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_related_kind_that_is_not_served_holds_back_only_its_readers() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Unserved").await;
    let dir = rules_dir(&kind.rule(UNSERVED_RULE));
    kind.create(&ns, "u", json!({}), &[]).await;
    let run = tree(
        dir.path(),
        &[&target(&kind, "u"), "-n", ns.name(), "-o", "json"],
    );
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    let doc = run.json();
    let cert = line(&doc, "cert");
    assert_eq!(cert["state"], "missing");
    let why = cert["reason"].as_str().unwrap_or_default();
    assert!(why.starts_with("RelatedKindNotServed: "), "{why}");
    assert_eq!(line(&doc, "secured")["state"], "pending");
    assert_eq!(line(&doc, "plain")["state"], "missing");
}

/// `trellis rbac --viewer` prints all `trellis tree` needs: a kubeconfig
/// acting as an account bound to that ClusterRole alone sees the tree;
/// the same account without it gets exit 2 and the API server's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_role_rbac_prints_is_all_tree_needs() {
    use k8s_openapi::api::authorization::v1::ResourceAttributes;
    use support::operator::service_account_with_role;

    let ns = support::namespace().await;
    let (kind, mut cleanup) = install_kind(&ns, "Viewed").await;
    let rule = kind.rule(RULE);
    let dir = rules_dir(&rule);
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    kind.create(&ns, "v", json!({"greeting": "hi", "extra": true}), &[])
        .await;
    wait_condition(&kind.api(&ns), "v", "Ready", "True").await;

    // As an account with no rights: refused, exit 2.
    let as_user = |user: &str| {
        let mut config = support::cluster().kubeconfig.clone();
        for auth in &mut config.auth_infos {
            if let Some(info) = auth.auth_info.as_mut() {
                info.impersonate = Some(user.to_owned());
            }
        }
        let path = dir
            .path()
            .join(format!("kubeconfig-{}", user.replace(':', "-")));
        std::fs::write(&path, serde_json::to_string(&config).expect("kubeconfig")).expect("write");
        path
    };
    let account = format!("system:serviceaccount:{}:trellis", ns.name());
    let run_as = |kubeconfig: &Path| {
        let out = tree_command(
            dir.path(),
            &[&target(&kind, "v"), "-n", ns.name(), "-o", "json"],
        )
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run trellis tree");
        Run {
            code: out.status.code(),
            out: String::from_utf8_lossy(&out.stdout).into_owned(),
            err: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let kubeconfig = as_user(&account);
    let run = run_as(&kubeconfig);
    assert_eq!(run.code, Some(2), "{}{}", run.out, run.err);
    assert!(run.err.contains("forbidden"), "{}", run.err);

    // With exactly what `trellis rbac --viewer` prints, bound to it.
    let printed = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["rbac", "--viewer", "--name"])
        .arg(support::unique_name("tree"))
        .arg("--rules")
        .arg(dir.path())
        .output()
        .expect("trellis rbac --viewer");
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let role = trellis::yaml::parse_value(
        &String::from_utf8_lossy(&printed.stdout),
        &trellis::yaml::Limits::FILES,
    )
    .expect("one ClusterRole");
    let probe = ResourceAttributes {
        group: Some(kind.group.clone()),
        resource: Some(kind.plural.clone()),
        verb: Some("watch".into()),
        namespace: Some(ns.name().to_owned()),
        ..Default::default()
    };
    let _client = service_account_with_role(&ns, role, probe, &mut cleanup).await;
    let run = run_as(&kubeconfig);
    assert_eq!(run.code, Some(0), "{}{}", run.out, run.err);
    let doc = run.json();
    assert_eq!(line(&doc, "extra")["state"], "present");
    operator.stop().await;
}
