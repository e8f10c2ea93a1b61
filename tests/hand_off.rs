//! `handOff:` on the real control plane: `kubectl scale` of a Deployment
//! whose `spec.replicas` the rule hands off sticks through many passes —
//! rendering changes, drift of another field put back, a restart of the
//! operator — while fields it does not hand off are restored; trellis's
//! field manager never takes `spec.replicas` back. With `policy: recreate`
//! too: a drifted field is put back without recreating or rescaling.
mod support;

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use support::operator::{Operator, QUIET, TestKind, install_kind, wait_for};

const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: scaled
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: web
      apiVersion: apps/v1
      kind: Deployment
      policy: @POLICY@
      handOff: [spec.replicas]
      template: |
        metadata:
          name: {{ parent.metadata.name }}
          annotations:
            example.com/tier: {{ spec.tier | default("gold") }}
        spec:
          replicas: {{ spec.replicas | default(2) }}
          selector:
            matchLabels: {app: {{ parent.metadata.name }}}
          template:
            metadata:
              labels: {app: {{ parent.metadata.name }}}
            spec:
              containers:
                - name: web
                  image: registry.invalid/web:1
"#;

fn start(ns: &support::TestNamespace, kind: &TestKind, policy: &str) -> Operator {
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    Operator::spawn(
        options,
        support::operator::rule_set(&[&kind.rule(&RULE.replace("@POLICY@", policy))]),
        &ns.client,
    )
}

/// `kubectl` of the test cluster, as a person would run it.
fn kubectl(args: &[&str]) {
    let bin = Command::new(support::cluster_script())
        .arg("bin")
        .output()
        .expect("tests/cluster/cluster bin");
    let bin = PathBuf::from(String::from_utf8_lossy(&bin.stdout).trim()).join("kubectl");
    let kubeconfig = support::cluster()
        .kubeconfig_path
        .clone()
        .expect("a kubeconfig file");
    let out = Command::new(&bin)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn replicas(d: &Deployment) -> Option<i32> {
    d.spec.as_ref().and_then(|s| s.replicas)
}

fn tier(d: &Deployment) -> Option<String> {
    d.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("example.com/tier"))
        .cloned()
}

/// Who owns `spec.replicas`, by field manager.
fn replica_owners(d: &Deployment) -> Vec<String> {
    d.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect()
}

/// Someone edits the Deployment's tier annotation by hand.
async fn drift_tier(api: &Api<Deployment>, name: &str) {
    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    api.patch(
        name,
        &edit,
        &Patch::Merge(json!({"metadata": {"annotations": {"example.com/tier": "bronze"}}})),
    )
    .await
    .expect("drift the annotation");
}

async fn wait_state(api: &Api<Deployment>, name: &str, want_tier: &str, want_replicas: i32) {
    wait_for(
        api,
        name,
        &format!("{name}: tier {want_tier}, {want_replicas} replicas"),
        |d| match (tier(d), replicas(d)) {
            (Some(t), Some(r)) if t == want_tier && r == want_replicas => Ok(()),
            other => Err(format!("tier and replicas are {other:?}")),
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_of_a_handed_off_field_sticks_while_other_fields_are_restored() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Scaled").await;
    let operator = start(&ns, &kind, "apply");
    let parents = kind.api(&ns);
    kind.create(&ns, "shop", json!({}), &[]).await;
    let deployments: Api<Deployment> = Api::namespaced(ns.client.clone(), ns.name());
    wait_state(&deployments, "shop", "gold", 2).await;

    // Set when made, then handed off: someone else scales it.
    kubectl(&["scale", "deployment/shop", "--replicas=5", "-n", ns.name()]);
    wait_state(&deployments, "shop", "gold", 5).await;

    // Another field is drifted by hand: trellis puts it back, and only it.
    drift_tier(&deployments, "shop").await;
    wait_state(&deployments, "shop", "gold", 5).await;

    // Rendering changes (a new tier, a new desired replica count): each is
    // applied, none brings `spec.replicas` back.
    for (i, tier) in ["silver", "platinum", "gold", "silver", "bronze"]
        .iter()
        .enumerate()
    {
        parents
            .patch(
                "shop",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"tier": tier, "replicas": 3 + i}})),
            )
            .await
            .expect("edit the parent");
        wait_state(&deployments, "shop", tier, 5).await;
    }
    tokio::time::sleep(QUIET).await;
    let now = deployments.get("shop").await.expect("read");
    assert_eq!(replicas(&now), Some(5), "five passes later, still scaled");
    assert_eq!(
        replica_owners(&now),
        ["kubectl"],
        "trellis's manager never takes spec.replicas back"
    );

    // State comes from managedFields, not memory: a new process agrees.
    operator.stop().await;
    let operator = start(&ns, &kind, "apply");
    parents
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"tier": "gold"}})),
        )
        .await
        .expect("edit the parent");
    wait_state(&deployments, "shop", "gold", 5).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        replicas(&deployments.get("shop").await.expect("read")),
        Some(5)
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreate_child_keeps_its_handed_off_field_when_a_drift_is_put_back() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Remade").await;
    let operator = start(&ns, &kind, "recreate");
    kind.create(&ns, "shop", json!({}), &[]).await;
    let deployments: Api<Deployment> = Api::namespaced(ns.client.clone(), ns.name());
    wait_state(&deployments, "shop", "gold", 2).await;
    let uid = deployments.get("shop").await.expect("read").metadata.uid;

    kubectl(&["scale", "deployment/shop", "--replicas=4", "-n", ns.name()]);
    wait_state(&deployments, "shop", "gold", 4).await;
    drift_tier(&deployments, "shop").await;
    wait_state(&deployments, "shop", "gold", 4).await;
    tokio::time::sleep(QUIET).await;
    let now = deployments.get("shop").await.expect("read");
    assert_eq!(now.metadata.uid, uid, "a drift is put back, not recreated");
    assert_eq!(replicas(&now), Some(4));
    operator.stop().await;
}
