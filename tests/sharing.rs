//! Sharing in `trellis run` against the real control plane: `propagate`
//! follows the parent's labels (added, changed, removed) with one apply per
//! changed child; the `scale` subresource of a generated CRD reaches the
//! child Deployment, as `kubectl scale` and an HPA use it; the inventory in
//! the parent's status; per-item conditions and a cartesian `forEach`.
mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use support::faults::{free_address, metric};
use support::operator::{
    Cleanup, Operator, QUIET, TestKind, condition, install_kind, wait_condition, wait_for,
    wait_gone,
};

/// Starts the operator on `rule` with its metrics on a free address.
fn start(ns: &support::TestNamespace, rule: &str) -> (Operator, String) {
    let addr = free_address();
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    options.metrics_addr = Some(addr);
    let operator = Operator::spawn(options, support::operator::rule_set(&[rule]), &ns.client);
    (operator, addr.to_string())
}

async fn configmap_applies(addr: &str) -> f64 {
    metric(
        addr,
        "trellis_api_requests",
        &["verb=\"apply\"", "resource=\"configmaps\""],
    )
    .await
}

/// Four ConfigMaps (one plain, two from a `forEach`, one setting `team`
/// itself); the parent's `team` and `example.com/*` labels and its `note`
/// annotation are copied onto each. The parent keeps an inventory.
const PROPAGATE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: propagate
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  propagate:
    labels: [team, example.com/*]
    annotations: [note]
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
    - id: each
      apiVersion: v1
      kind: ConfigMap
      forEach: "['a', 'b']"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-" ~ item }}
    - id: fixed
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-fixed" }}
          labels:
            team: template
  status:
    inventory: true
"#;

/// One parent edit: what it is, the patch, the `team` and
/// `example.com/cost` labels every propagated child then has, and the
/// ConfigMap applies it costs.
type Step = (
    &'static str,
    Value,
    (Option<&'static str>, Option<&'static str>),
    f64,
);

fn labels_of(cm: &ConfigMap) -> (Option<String>, Option<String>, Option<String>) {
    let labels = cm.labels();
    (
        labels.get("team").cloned(),
        labels.get("example.com/cost").cloned(),
        cm.annotations().get("note").cloned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn propagate_follows_parent_labels_with_one_apply_per_changed_child() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Shared").await;
    let (operator, addr) = start(&ns, &kind.rule(PROPAGATE_RULE));
    let parents = kind.api(&ns);
    kind.create(&ns, "p", json!({}), &[("note", "hello")]).await;
    wait_condition(&parents, "p", "Ready", "True").await;
    let cms: Api<ConfigMap> = ns.api();
    let propagated = ["p-config", "p-a", "p-b"];
    for name in propagated {
        let cm = cms.get(name).await.unwrap();
        assert_eq!(labels_of(&cm), (None, None, Some("hello".into())), "{name}");
    }
    tokio::time::sleep(QUIET).await;
    let mut applies = configmap_applies(&addr).await;
    let statuses = metric(&addr, "trellis_status_writes", &[]).await;
    assert_eq!(applies, 4.0, "one apply per child at creation");

    // Each parent edit below is a label or annotation change only (no new
    // generation): it must wake the controller all the same.
    let steps: [Step; 4] = [
        (
            "added",
            json!({"metadata": {"labels": {"team": "blue", "example.com/cost": "7"}}}),
            (Some("blue"), Some("7")),
            // `fixed` sets `team` itself, but takes `example.com/cost`.
            4.0,
        ),
        (
            "changed",
            json!({"metadata": {"labels": {"team": "green"}}}),
            (Some("green"), Some("7")),
            // `fixed` keeps its own `team`: it is not written.
            3.0,
        ),
        (
            "removed",
            json!({"metadata": {"labels": {"team": null, "example.com/cost": null}}}),
            (None, None),
            4.0,
        ),
        (
            "an unnamed key",
            json!({"metadata": {"labels": {"unrelated": "x"}}}),
            (None, None),
            0.0,
        ),
    ];
    for (what, patch, (team, cost), writes) in steps {
        kind.patch(&ns, "p", patch).await;
        for name in propagated {
            let want = (team.map(str::to_owned), cost.map(str::to_owned));
            wait_for(&cms, name, &format!("label {what} on {name}"), |cm| {
                let (t, c, _) = labels_of(cm);
                ((t.clone(), c.clone()) == want)
                    .then_some(())
                    .ok_or(format!("team={t:?} example.com/cost={c:?}"))
            })
            .await;
        }
        let fixed = cms.get("p-fixed").await.unwrap();
        assert_eq!(
            labels_of(&fixed).0.as_deref(),
            Some("template"),
            "the template's own key wins"
        );
        assert_eq!(labels_of(&fixed).1.as_deref(), cost);
        tokio::time::sleep(QUIET).await;
        let now = configmap_applies(&addr).await;
        eprintln!(
            "[sharing] label {what}: {} ConfigMap applies",
            now - applies
        );
        assert_eq!(
            now - applies,
            writes,
            "label {what}: one apply per changed child"
        );
        applies = now;
    }
    assert_eq!(
        metric(&addr, "trellis_status_writes", &[]).await,
        statuses,
        "a label edit changes nothing in the status, inventory included: no status write"
    );
    let parent = parents.get("p").await.unwrap();
    let names: Vec<&str> = parent.data["status"]["children"]
        .as_array()
        .map(|c| c.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["p-config", "p-a", "p-b", "p-fixed"]);
    // The removed keys are gone from the live children, not only unsent.
    for name in propagated {
        let cm = cms.get(name).await.unwrap();
        assert!(
            !cm.labels().contains_key("team"),
            "{name}: {:?}",
            cm.labels()
        );
    }
    operator.stop().await;
}

/// A generated CRD with the `scale` subresource: `.spec.replicas` drives the
/// child Deployment, `.status.replicas.ready` and `.status.selector` come
/// from status fields; the parent keeps an inventory.
const SCALE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: scaled
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  crd:
    scale:
      specReplicasPath: .spec.replicas
      statusReplicasPath: .status.replicas.ready
      labelSelectorPath: .status.selector
  schema:
    type: object
    properties:
      replicas: {type: integer, minimum: 0}
  defaults: {replicas: 1}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
    - id: web
      apiVersion: apps/v1
      kind: Deployment
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        spec:
          replicas: {{ spec.replicas }}
          selector:
            matchLabels: {app: {{ parent.metadata.name }}}
          template:
            metadata:
              labels: {app: {{ parent.metadata.name }}}
            spec:
              containers:
                - name: web
                  image: registry.k8s.io/pause:3.10
  status:
    inventory: true
    fields:
      - {path: replicas.ready, from: web, jsonPath: $.status.readyReplicas, default: 0}
      - {path: selector, value: "'app=' ~ parent.metadata.name"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_a_parent_reaches_its_deployment_and_the_inventory_lists_its_children() {
    let ns = support::namespace().await;
    let kind = TestKind::new("Scaler");
    let _cleanup = Cleanup::crds(&[&kind]);
    let rule = kind.rule(SCALE_RULE);
    let set = support::operator::rule_set(&[&rule]);
    let generated = set.rules[0]
        .crd
        .clone()
        .expect("the rule generates its CRD");
    assert_eq!(generated["metadata"]["name"], kind.crd_name());
    let crd: CustomResourceDefinition = serde_json::from_value(generated).unwrap();
    support::apply_crd(&ns.client, &crd).await;
    let (operator, _addr) = start(&ns, &rule);

    kind.create(&ns, "web", json!({}), &[]).await;
    let deployments: Api<Deployment> = ns.api();
    let replicas = |d: &Deployment| d.spec.as_ref().and_then(|s| s.replicas);
    wait_for(&deployments, "web", "1 replica (the default)", |d| {
        (replicas(d) == Some(1))
            .then_some(())
            .ok_or(format!("{:?}", replicas(d)))
    })
    .await;

    // The inventory: declaration order, `ready` per object (no node: the
    // Deployment never becomes available).
    let parents = kind.api(&ns);
    let inventory = wait_for(&parents, "web", "status.children", |p| {
        p.data["status"]["children"]
            .as_array()
            .filter(|c| c.len() == 2)
            .cloned()
            .ok_or(format!("status {}", p.data["status"]))
    })
    .await;
    assert_eq!(
        inventory,
        [
            json!({"id": "config", "apiVersion": "v1", "kind": "ConfigMap", "namespace": ns.name(), "name": "web-config", "ready": true}),
            json!({"id": "web", "apiVersion": "apps/v1", "kind": "Deployment", "namespace": ns.name(), "name": "web", "ready": false}),
        ]
    );

    // `kubectl scale` and an HPA write the parent's `/scale` subresource.
    parents
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("patch /scale");
    wait_for(&deployments, "web", "3 replicas", |d| {
        (replicas(d) == Some(3))
            .then_some(())
            .ok_or(format!("{:?}", replicas(d)))
    })
    .await;
    let scale = parents.get_scale("web").await.expect("get /scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    let status = scale.status.expect("scale status");
    assert_eq!(status.replicas, 0, "no node: no replica is ready");
    assert_eq!(status.selector.as_deref(), Some("app=web"));
    let parent = parents.get("web").await.unwrap();
    assert_eq!(parent.data["spec"]["replicas"], 3);

    // A HorizontalPodAutoscaler can target the parent: the controller
    // manager's HPA controller reads its `/scale` (without a metrics server
    // it cannot go further, and says so in another condition).
    let hpas: Api<HorizontalPodAutoscaler> = ns.api();
    let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "scaleTargetRef": {"apiVersion": kind.api_version(), "kind": kind.kind, "name": "web"},
            "minReplicas": 1,
            "maxReplicas": 5,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}],
        },
    }))
    .unwrap();
    hpas.create(&PostParams::default(), &hpa)
        .await
        .expect("create HPA");
    let able = support::eventually(
        "the HPA reads the parent's /scale",
        Duration::from_secs(90),
        || async {
            let hpa = hpas.get("web").await.map_err(|e| e.to_string())?;
            let conditions = hpa.status.and_then(|s| s.conditions).unwrap_or_default();
            match conditions.iter().find(|c| c.type_ == "AbleToScale") {
                Some(c) if c.status == "True" => Ok(c.reason.clone().unwrap_or_default()),
                other => Err(format!("AbleToScale: {other:?}")),
            }
        },
    )
    .await;
    assert_eq!(able, "SucceededGetScale");
    operator.stop().await;
}

/// One ConfigMap per region × tier, and one condition per region.
const GRID_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: grid
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: cell
      apiVersion: v1
      kind: ConfigMap
      forEach: {region: spec.regions, tier: spec.tiers}
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-" ~ item.region ~ "-" ~ item.tier }}
        data:
          index: {{ index | string }}
  status:
    conditions:
      - type: "{{ item | title }}Served"
        forEach: spec.regions
        when: "(children.cell | length) == (spec.regions | length) * (spec.tiers | length)"
        reason: AllTiers
        message: "{{ item }}: {{ spec.tiers | length }} tiers"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cartesian_for_each_and_per_item_conditions_live() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Grid").await;
    let (operator, _addr) = start(&ns, &kind.rule(GRID_RULE));
    let spec = json!({"regions": ["eu", "us"], "tiers": ["web", "db"]});
    kind.create(&ns, "g", spec, &[]).await;
    let parents = kind.api(&ns);
    wait_condition(&parents, "g", "UsServed", "True").await;
    let cms: Api<ConfigMap> = ns.api();
    let want = [
        ("g-eu-web", "0"),
        ("g-eu-db", "1"),
        ("g-us-web", "2"),
        ("g-us-db", "3"),
    ];
    for (name, index) in want {
        let cm = cms.get(name).await.unwrap();
        let data = cm.data.unwrap_or_default();
        assert_eq!(data.get("index").map(String::as_str), Some(index), "{name}");
    }
    let parent = wait_condition(&parents, "g", "EuServed", "True").await;
    assert_eq!(
        condition(&parent, "EuServed").unwrap()["message"],
        "eu: 2 tiers"
    );

    // A region goes: its combinations are pruned, its condition removed.
    kind.patch(&ns, "g", json!({"spec": {"regions": ["eu"]}}))
        .await;
    wait_gone(&cms, "g-us-web", support::operator::WAIT).await;
    wait_gone(&cms, "g-us-db", support::operator::WAIT).await;
    wait_for(&parents, "g", "UsServed removed", |p| {
        match condition(p, "UsServed") {
            None => Ok(()),
            Some(c) => Err(format!("still {c}")),
        }
    })
    .await;
    let parent = parents.get("g").await.unwrap();
    assert_eq!(condition(&parent, "EuServed").unwrap()["status"], "True");

    // Two regions of one name: a duplicate condition type fails the pass
    // and says so; nothing is pruned.
    kind.patch(&ns, "g", json!({"spec": {"regions": ["eu", "eu"]}}))
        .await;
    let parent = wait_condition(&parents, "g", "Synced", "False").await;
    let message = condition(&parent, "Synced").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("condition type `EuServed` is also given by"),
        "{message}"
    );
    assert!(cms.get_opt("g-eu-web").await.unwrap().is_some());
    operator.stop().await;
}
