//! `related:` entries read from a spoke by the operator, end to end with two
//! real control planes (see `tests/clusters.rs`): a ConfigMap in the spoke
//! is read into a child at home; edited there, the child follows; while the
//! spoke does not answer, its readers are held back (`ClusterUnreachable`)
//! and an edit of the parent still reaches what does not read it.
mod support;

#[path = "clusters/hub.rs"]
mod hub;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use hub::{SPOKE, setup, spoke_status};
use support::eventually;
use support::faults::free_address;
use support::operator::{Operator, WAIT, rule_set};

const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: reads
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: settings
      apiVersion: v1
      kind: ConfigMap
      cluster: "'spoke-1'"
      name: settings
  children:
    - id: copy
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-copy" }}
        data:
          color: {{ related.settings.data.color }}
    - id: own
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-own" }}
        data:
          v: {{ spec.v }}
"#;

/// The `data.<key>` of the ConfigMap `name` at home, if any.
async fn home_data(api: &Api<ConfigMap>, name: &str, key: &str) -> Option<String> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|cm| cm.data)
        .and_then(|d| d.get(key).cloned())
}

#[tokio::test]
async fn a_related_object_in_a_spoke_is_read_and_followed() {
    let s = setup("clusters-related").await;
    let metrics = free_address();
    let settings: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"},
        "data": {"color": "blue"},
    }))
    .expect("settings");
    s.spoke_configmaps()
        .create(&PostParams::default(), &settings)
        .await
        .expect("settings in the spoke");
    // None at home: a hub read would find nothing, or the wrong object.
    s.register(&s.spoke.kubeconfig).await;
    let mut options = trellis::operator::Options::new(vec![], vec![s.ns.name().to_owned()]);
    options.instance = "clusters-related".into();
    options.operator_namespace = s.ns.name().to_owned();
    options.metrics_addr = Some(metrics);
    let operator = Operator::spawn(options, rule_set(&[&s.kind.rule(RULE)]), &s.ns.client);

    let parent = DynamicObject::new("p", &s.kind.resource)
        .within(s.ns.name())
        .data(json!({"spec": {"v": "1"}}));
    s.parents()
        .create(&PostParams::default(), &parent)
        .await
        .expect("create parent");
    let home = s.home_configmaps();
    eventually("the spoke's settings read into the child", WAIT, || async {
        match home_data(&home, "p-copy", "color").await.as_deref() {
            Some("blue") => Ok(()),
            other => Err(format!("color = {other:?}")),
        }
    })
    .await;

    // Watched there: the related kind only, no child kind.
    let status = spoke_status(metrics).await;
    assert_eq!(status["related"], json!(["v1/ConfigMap"]), "{status}");
    assert_eq!(status["kinds"], json!([]), "{status}");

    // Edited in the spoke: the child follows.
    s.spoke_configmaps()
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"color": "green"}})),
        )
        .await
        .expect("edit settings");
    eventually("the child follows the spoke's edit", WAIT, || async {
        match home_data(&home, "p-copy", "color").await.as_deref() {
            Some("green") => Ok(()),
            other => Err(format!("color = {other:?}")),
        }
    })
    .await;

    // The spoke down: its reader held back, naming it; what does not read
    // it follows an edit of the parent.
    s.spoke.kill("kube-apiserver", "KILL").await;
    eventually("the spoke seen unreachable", WAIT, || async {
        let status = spoke_status(metrics).await;
        (status["reachable"] == false)
            .then_some(())
            .ok_or(status.to_string())
    })
    .await;
    s.patch_spec("p", json!({"v": "2"})).await;
    eventually(
        "the reader held back, the other child edited",
        WAIT,
        || async {
            let conditions = s.parent("p").await.data["status"]["conditions"].clone();
            let held = conditions.as_array().into_iter().flatten().any(|c| {
                c["reason"] == "ClusterUnreachable"
                    && c["message"].as_str().is_some_and(|m| m.contains(SPOKE))
            });
            let own = home_data(&home, "p-own", "v").await;
            (held && own.as_deref() == Some("2"))
                .then_some(())
                .ok_or(format!("conditions {conditions}, own v = {own:?}"))
        },
    )
    .await;
    assert_eq!(
        home_data(&home, "p-copy", "color").await.as_deref(),
        Some("green"),
        "the reader is kept as it was"
    );

    // Back: it converges.
    s.spoke.restart("kube-apiserver").await;
    eventually("Ready once the spoke answers", WAIT, || async {
        let ready = s.condition("p", "Ready").await;
        (ready["status"] == "True")
            .then_some(())
            .ok_or(ready.to_string())
    })
    .await;
    operator.stop().await;
}
