//! Children in other clusters, end to end with two real control planes: the
//! shared test cluster is the hub, a private control plane
//! (`support::faults::PrivateCluster`, `tests/cluster/cluster up`) is the
//! spoke, registered by a Secret holding its kubeconfig. One parent keeps a
//! ConfigMap at home and one in the spoke (`cluster: spec.region`).
mod support;

#[path = "spoke/mod.rs"]
mod spoke;

use std::net::SocketAddr;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use support::faults::{PrivateCluster, free_address, metric};
use support::operator::{Operator, TestKind, WAIT, install_kind, rule_set};
use support::{TestNamespace, eventually};

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
        data:
          v: {{ spec.v }}
    - id: remote
      apiVersion: v1
      kind: ConfigMap
      cluster: spec.region
      includeWhen: spec.remote | default(true)
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-remote" }}
        data:
          v: {{ spec.v }}
  status:
    fields:
      - path: remoteV
        from: remote
        jsonPath: $.data.v
"#;

use spoke::SPOKE;

/// The hub (the shared test cluster, the test's namespace) and the spoke
/// (a private control plane with a namespace of the same name).
struct Setup {
    hub: Hub,
    spoke: PrivateCluster,
    spoke_client: Client,
    _cleanup: support::operator::Cleanup,
}

/// One hub: its namespace (parents, the operator's own namespace, the
/// cluster Secret) and the parent kind.
struct Hub {
    ns: TestNamespace,
    kind: TestKind,
}

impl Drop for Hub {
    /// Takes trellis's finalizer off every parent left in the hub's
    /// namespace: a test that failed midway would otherwise leave parents,
    /// and their CRD, undeletable once the operator is gone, holding up the
    /// shared cluster's CRD finalizer for every test.
    fn drop(&mut self) {
        spoke::release_parents(self.ns.name(), &self.kind.resource);
    }
}

impl std::ops::Deref for Setup {
    type Target = Hub;
    fn deref(&self) -> &Hub {
        &self.hub
    }
}

async fn setup(name: &str) -> Setup {
    support::faults::logs();
    let ns = support::namespace().await;
    let (kind, cleanup) = install_kind(&ns, "Placed").await;
    let (spoke, spoke_client) = spoke::start(name, ns.name()).await;
    Setup {
        hub: Hub { ns, kind },
        spoke,
        spoke_client,
        _cleanup: cleanup,
    }
}

impl Setup {
    fn start_operator(&self, hub_name: &str, metrics: SocketAddr) -> Operator {
        let mut options = trellis::operator::Options::new(vec![], vec![self.ns.name().to_owned()]);
        options.instance = "clusters".into();
        options.operator_namespace = self.ns.name().to_owned();
        options.cluster_name = hub_name.to_owned();
        options.metrics_addr = Some(metrics);
        Operator::spawn(options, rule_set(&[&self.kind.rule(RULE)]), &self.ns.client)
    }

    fn spoke_configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.spoke_client.clone(), self.ns.name())
    }

    fn home_configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.ns.client.clone(), self.ns.name())
    }
}

impl Hub {
    fn parents(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.ns.client.clone(), self.ns.name(), &self.kind.resource)
    }

    /// Registers (or re-registers) the spoke with `kubeconfig`.
    async fn register(&self, kubeconfig: &Kubeconfig) {
        spoke::register(&self.ns.client, self.ns.name(), kubeconfig).await;
    }

    async fn patch_spec(&self, name: &str, spec: Value) {
        self.parents()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await
            .expect("patch parent");
    }

    /// Events about the parent `name`.
    async fn events_about(&self, name: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.ns.client.clone(), self.ns.name())
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }

    async fn parent(&self, name: &str) -> DynamicObject {
        self.parents().get(name).await.expect("parent")
    }

    async fn condition(&self, name: &str, type_: &str) -> Value {
        let parent = self.parent(name).await;
        parent.data["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == type_))
            .cloned()
            .unwrap_or(Value::Null)
    }
}

/// A kubeconfig for `account` in the spoke (a ServiceAccount of the
/// namespace, bound to cluster-admin): the spoke's server and CA from
/// `admin`, a fresh token.
async fn token_kubeconfig(
    spoke: &Client,
    admin: &Kubeconfig,
    ns: &str,
    account: &str,
) -> Kubeconfig {
    let accounts: Api<ServiceAccount> = Api::namespaced(spoke.clone(), ns);
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": account}})).expect("sa");
    let _ = accounts.create(&PostParams::default(), &sa).await;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-{account}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }))
    .expect("binding");
    let _ = Api::<ClusterRoleBinding>::all(spoke.clone())
        .create(&PostParams::default(), &binding)
        .await;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": []}})).expect("token request");
    let token = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("token")
        .status
        .expect("token status")
        .token;
    let mut config = admin.clone();
    let users = &mut config.auth_infos;
    users[0].auth_info = Some(serde_json::from_value(json!({"token": token})).expect("auth info"));
    config
}

/// What the operator tells on `/status` about the spoke.
async fn spoke_status(addr: SocketAddr) -> Value {
    let body = support::http_get(addr, "/status").await.unwrap_or_default();
    let status: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    status["clusters"][SPOKE].clone()
}

#[tokio::test]
async fn children_in_a_spoke_follow_their_parent_through_an_outage_and_a_token_rotation() {
    let s = setup("clusters-spoke").await;
    let metrics = free_address();
    let account_a =
        token_kubeconfig(&s.spoke_client, &s.spoke.kubeconfig, s.ns.name(), "hub-a").await;
    s.register(&account_a).await;
    let operator = s.start_operator("hub-a", metrics);

    let remote_uid = made_drift_prune(&s, metrics).await;
    outage(&s, metrics, &remote_uid).await;
    let account_b = rotation(&s, metrics).await;
    unregistered(&s, &account_b).await;
    deleted_while_down(&s, metrics).await;
    operator.stop().await;
}

/// A child made in the spoke, its status mapped back, drift restored and
/// prune there; the uid of the object made again.
async fn made_drift_prune(s: &Setup, metrics: SocketAddr) -> String {
    // Made in the spoke with the trellis labels, the parent's uid and this
    // hub's name, no ownerReference; its data mapped back to the status.
    let parent = DynamicObject::new("p", &s.kind.resource)
        .within(s.ns.name())
        .data(json!({"spec": {"region": SPOKE, "v": "1"}}));
    let started = std::time::Instant::now();
    s.parents()
        .create(&PostParams::default(), &parent)
        .await
        .expect("create parent");
    let uid = s.parent("p").await.uid().expect("uid");
    let remote = eventually("the remote child made in the spoke", WAIT, || async {
        s.spoke_configmaps()
            .get("p-remote")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    eprintln!(
        "[clusters] spoke child made {:?} after the parent",
        started.elapsed()
    );
    let labels = remote.labels();
    assert_eq!(labels["trellis.dev/hub"], "hub-a");
    assert_eq!(labels["trellis.dev/parent-uid"], uid);
    assert_eq!(labels["trellis.dev/rule"], "placed");
    assert_eq!(labels["trellis.dev/child"], "remote");
    assert!(remote.owner_references().is_empty());
    assert!(
        s.home_configmaps()
            .get_opt("p-remote")
            .await
            .expect("get")
            .is_none(),
        "not made at home"
    );
    eventually("status mapped back from the spoke", WAIT, || async {
        let p = s.parent("p").await;
        let synced = s.condition("p", "Synced").await;
        match (&p.data["status"]["remoteV"], &synced["status"]) {
            (Value::String(v), Value::String(st)) if v == "1" && st == "True" => Ok(()),
            _ => Err(format!("{:#}", p.data["status"])),
        }
    })
    .await;
    assert!(
        s.parent("p")
            .await
            .finalizers()
            .iter()
            .any(|f| f == trellis::operator::FINALIZER),
        "the parent carries the cleanup finalizer"
    );
    let status = spoke_status(metrics).await;
    assert_eq!(status["reachable"], true, "{status}");
    assert_eq!(status["kinds"], json!(["v1/ConfigMap"]), "{status}");
    assert_eq!(
        metric(
            &metrics.to_string(),
            "trellis_cluster_reachable",
            &["cluster=\"spoke-1\""]
        )
        .await,
        1.0
    );

    // Drift in the spoke is restored there.
    s.spoke_configmaps()
        .patch(
            "p-remote",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": "tampered"}})),
        )
        .await
        .expect("tamper");
    eventually("drift restored in the spoke", WAIT, || async {
        let cm = s
            .spoke_configmaps()
            .get("p-remote")
            .await
            .map_err(|e| e.to_string())?;
        match cm
            .data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str)
        {
            Some("1") => Ok(()),
            other => Err(format!("v = {other:?}")),
        }
    })
    .await;

    // Pruned there when no longer rendered, and made again.
    s.patch_spec("p", json!({"remote": false})).await;
    eventually("pruned in the spoke", WAIT, || async {
        match s.spoke_configmaps().get_opt("p-remote").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    s.patch_spec("p", json!({"remote": true})).await;
    let remote = eventually("made again in the spoke", WAIT, || async {
        s.spoke_configmaps()
            .get("p-remote")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    remote.uid().expect("uid")
}

/// The spoke's API server killed, then back.
async fn outage(s: &Setup, metrics: SocketAddr, remote_uid: &str) {
    // The spoke's API server stops: its child is held back (ClusterUnreachable,
    // naming it), the home child still follows an edit.
    s.spoke.kill("kube-apiserver", "KILL").await;
    let killed = std::time::Instant::now();
    s.patch_spec("p", json!({"v": "2"})).await;
    eventually("ClusterUnreachable on the parent", WAIT, || async {
        let synced = s.condition("p", "Synced").await;
        let message = synced["message"].as_str().unwrap_or_default();
        if synced["reason"] == "ClusterUnreachable" && message.contains("\"spoke-1\"") {
            Ok(())
        } else {
            Err(synced.to_string())
        }
    })
    .await;
    eprintln!(
        "[clusters] ClusterUnreachable {:?} after the kill",
        killed.elapsed()
    );
    eventually("the home child follows the edit", WAIT, || async {
        let cm = s
            .home_configmaps()
            .get("p-home")
            .await
            .map_err(|e| e.to_string())?;
        match cm
            .data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str)
        {
            Some("2") => Ok(()),
            other => Err(format!("v = {other:?}")),
        }
    })
    .await;
    let status = spoke_status(metrics).await;
    assert_eq!(status["reachable"], false, "{status}");
    assert_eq!(
        metric(
            &metrics.to_string(),
            "trellis_cluster_reachable",
            &["cluster=\"spoke-1\""]
        )
        .await,
        0.0
    );

    // Back: it converges, on the same object (nothing was deleted there).
    s.spoke.restart("kube-apiserver").await;
    let back = std::time::Instant::now();
    eventually(
        "the spoke child converges once it answers",
        WAIT,
        || async {
            let cm = s
                .spoke_configmaps()
                .get("p-remote")
                .await
                .map_err(|e| e.to_string())?;
            let v = cm.data.as_ref().and_then(|d| d.get("v")).cloned();
            let synced = s.condition("p", "Synced").await;
            if v.as_deref() == Some("2") && synced["status"] == "True" {
                Ok(cm)
            } else {
                Err(format!("v = {v:?}, Synced = {synced}"))
            }
        },
    )
    .await;
    eprintln!(
        "[clusters] converged {:?} after the spoke's API server was healthy again",
        back.elapsed()
    );
    let after = s.spoke_configmaps().get("p-remote").await.expect("remote");
    assert_eq!(after.uid().as_deref(), Some(remote_uid), "the same object");
}

/// A new token in the Secret.
async fn rotation(s: &Setup, metrics: SocketAddr) -> Kubeconfig {
    // A new token in the Secret, the old account gone: writes go on
    // with the new credentials, without a restart.
    let account_b =
        token_kubeconfig(&s.spoke_client, &s.spoke.kubeconfig, s.ns.name(), "hub-b").await;
    s.register(&account_b).await;
    eventually("the new credentials in use", WAIT, || async {
        let status = spoke_status(metrics).await;
        (status["reachable"] == true)
            .then_some(())
            .ok_or(status.to_string())
    })
    .await;
    // The old account loses its rights (authorization is not cached, as
    // a deleted account's token may be for seconds).
    Api::<ClusterRoleBinding>::all(s.spoke_client.clone())
        .delete(&format!("{}-hub-a", s.ns.name()), &DeleteParams::default())
        .await
        .expect("unbind the old account");
    s.patch_spec("p", json!({"v": "3"})).await;
    eventually("written with the rotated token", WAIT, || async {
        let cm = s
            .spoke_configmaps()
            .get("p-remote")
            .await
            .map_err(|e| e.to_string())?;
        match cm
            .data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str)
        {
            Some("3") => Ok(()),
            other => Err(format!("v = {other:?}")),
        }
    })
    .await;
    account_b
}

/// The Secret removed: the spoke is unknown, its child held back and kept
/// (nothing deleted there); registered again, it converges.
async fn unregistered(s: &Setup, kubeconfig: &Kubeconfig) {
    Api::<Secret>::namespaced(s.ns.client.clone(), s.ns.name())
        .delete("spoke-1-kubeconfig", &DeleteParams::default())
        .await
        .expect("delete the cluster Secret");
    s.patch_spec("p", json!({"v": "4"})).await;
    eventually("ClusterUnknown on the parent", WAIT, || async {
        let synced = s.condition("p", "Synced").await;
        (synced["reason"] == "ClusterUnknown")
            .then_some(())
            .ok_or(synced.to_string())
    })
    .await;
    let home = s.home_configmaps().get("p-home").await.expect("home child");
    assert_eq!(
        home.data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str),
        Some("4")
    );
    let remote = s
        .spoke_configmaps()
        .get("p-remote")
        .await
        .expect("kept in the spoke");
    assert_eq!(
        remote
            .data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str),
        Some("3")
    );
    s.register(kubeconfig).await;
    eventually("converged once registered again", WAIT, || async {
        let cm = s
            .spoke_configmaps()
            .get("p-remote")
            .await
            .map_err(|e| e.to_string())?;
        let synced = s.condition("p", "Synced").await;
        let v = cm.data.as_ref().and_then(|d| d.get("v")).cloned();
        (v.as_deref() == Some("4") && synced["status"] == "True")
            .then_some(())
            .ok_or(format!("v = {v:?}, Synced = {synced}"))
    })
    .await;
}

/// The parent deleted while the spoke is down, then up.
async fn deleted_while_down(s: &Setup, metrics: SocketAddr) {
    // The parent deleted while the spoke does not answer: it waits for
    // the spoke, saying so; once the spoke answers, its child goes first,
    // then the parent.
    s.spoke.kill("kube-apiserver", "KILL").await;
    eventually("the spoke seen unreachable", WAIT, || async {
        let status = spoke_status(metrics).await;
        (status["reachable"] == false)
            .then_some(())
            .ok_or(status.to_string())
    })
    .await;
    s.parents()
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete parent");
    eventually(
        "a Warning that the finalizer waits for the spoke",
        WAIT,
        || async {
            let events = s.events_about("p").await;
            events
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("ClusterUnreachable")
                        && e.note.as_deref().is_some_and(|n| n.contains("spoke-1"))
                })
                .map(|_| ())
                .ok_or(format!(
                    "{:?}",
                    events
                        .iter()
                        .map(|e| (&e.reason, &e.note))
                        .collect::<Vec<_>>()
                ))
        },
    )
    .await;
    assert!(
        s.parents().get_opt("p").await.expect("get").is_some(),
        "the parent waits for its spoke child"
    );
    s.spoke.restart("kube-apiserver").await;
    eventually("spoke child and parent gone", WAIT, || async {
        let child = s
            .spoke_configmaps()
            .get_opt("p-remote")
            .await
            .map_err(|e| e.to_string())?;
        let parent = s.parents().get_opt("p").await.map_err(|e| e.to_string())?;
        match (child, parent) {
            (None, None) => Ok(()),
            (child, parent) => Err(format!(
                "child there: {}, parent there: {}",
                child.is_some(),
                parent.is_some()
            )),
        }
    })
    .await;
}

/// The remote child at a fixed place in the spoke, so that two hubs'
/// parents render the same object.
const SHARED_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: placed
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: remote
      apiVersion: v1
      kind: ConfigMap
      cluster: "'spoke-1'"
      allowCrossNamespace: true
      template: |
        metadata:
          name: shared-remote
          namespace: shared
        data:
          v: {{ spec.v }}
"#;

#[tokio::test]
async fn a_second_hub_on_the_same_spoke_never_touches_the_first_hubs_objects() {
    let s = setup("clusters-two-hubs").await;
    let shared: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "shared"}})).expect("namespace");
    Api::<Namespace>::all(s.spoke_client.clone())
        .create(&PostParams::default(), &shared)
        .await
        .expect("shared namespace in the spoke");
    let other = support::namespace_for("clusters-hub-b").await;
    let start = |ns: &TestNamespace, hub: &str| {
        let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
        options.instance = hub.to_owned();
        options.operator_namespace = ns.name().to_owned();
        options.cluster_name = hub.to_owned();
        Operator::spawn(options, rule_set(&[&s.kind.rule(SHARED_RULE)]), &ns.client)
    };
    let hub_b_setup = Hub {
        ns: other,
        kind: s.kind.clone(),
    };
    s.register(&s.spoke.kubeconfig).await;
    hub_b_setup.register(&s.spoke.kubeconfig).await;
    let hub_a = start(&s.ns, "hub-a");
    let hub_b = start(&hub_b_setup.ns, "hub-b");

    let parent =
        |v: &str| DynamicObject::new("p", &s.kind.resource).data(json!({"spec": {"v": v}}));
    s.parents()
        .create(&PostParams::default(), &parent("a").within(s.ns.name()))
        .await
        .expect("hub-a's parent");
    let spoke_cms: Api<ConfigMap> = Api::namespaced(s.spoke_client.clone(), "shared");
    eventually("hub-a's object in the spoke", WAIT, || async {
        let cm = spoke_cms
            .get("shared-remote")
            .await
            .map_err(|e| e.to_string())?;
        (cm.labels().get("trellis.dev/hub").map(String::as_str) == Some("hub-a"))
            .then_some(())
            .ok_or(format!("{:?}", cm.labels()))
    })
    .await;

    // hub-b renders the same object: refused, naming the other hub.
    hub_b_setup
        .parents()
        .create(
            &PostParams::default(),
            &parent("b").within(hub_b_setup.ns.name()),
        )
        .await
        .expect("hub-b's parent");
    eventually("hub-b refuses to take hub-a's object", WAIT, || async {
        let synced = hub_b_setup.condition("p", "Synced").await;
        let message = synced["message"].as_str().unwrap_or_default();
        (synced["status"] == "False" && message.contains("belongs to hub hub-a"))
            .then_some(())
            .ok_or(synced.to_string())
    })
    .await;
    // hub-b's parent deleted: its finalizer goes without touching hub-a's object.
    hub_b_setup
        .parents()
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete hub-b's parent");
    eventually("hub-b's parent gone", WAIT, || async {
        match hub_b_setup.parents().get_opt("p").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let cm = spoke_cms
        .get("shared-remote")
        .await
        .expect("hub-a's object stays");
    assert_eq!(cm.labels()["trellis.dev/hub"], "hub-a");
    assert_eq!(
        cm.data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str),
        Some("a")
    );
    // hub-a's own parent deleted: its object in the spoke goes with it.
    s.parents()
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete hub-a's parent");
    eventually("hub-a's object and parent gone", WAIT, || async {
        let child = spoke_cms
            .get_opt("shared-remote")
            .await
            .map_err(|e| e.to_string())?;
        let parent = s.parents().get_opt("p").await.map_err(|e| e.to_string())?;
        (child.is_none() && parent.is_none())
            .then_some(())
            .ok_or(format!(
                "child {}, parent {}",
                child.is_some(),
                parent.is_some()
            ))
    })
    .await;
    hub_b.stop().await;
    hub_a.stop().await;
}

#[tokio::test]
async fn a_child_kind_only_the_spoke_serves_is_made_there() {
    let s = setup("clusters-spoke-kind").await;
    // Installed in the spoke only: the hub does not serve it.
    let widget = s.kind.sibling("Widget");
    widget.install(&s.spoke_client).await;
    let rule = s.kind.rule(&format!(
        r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: widgets
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: widget
      apiVersion: {}
      kind: Widget
      cluster: "'spoke-1'"
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-widget" }}}}
        spec:
          size: 3
"#,
        widget.api_version()
    ));
    s.register(&s.spoke.kubeconfig).await;
    let mut options = trellis::operator::Options::new(vec![], vec![s.ns.name().to_owned()]);
    options.operator_namespace = s.ns.name().to_owned();
    let operator = Operator::spawn(options, rule_set(&[&rule]), &s.ns.client);
    let parent = DynamicObject::new("w", &s.kind.resource)
        .within(s.ns.name())
        .data(json!({"spec": {}}));
    s.parents()
        .create(&PostParams::default(), &parent)
        .await
        .expect("create parent");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(s.spoke_client.clone(), s.ns.name(), &widget.resource);
    eventually(
        "the widget made in the spoke, the parent Synced",
        WAIT,
        || async {
            let made = widgets
                .get_opt("w-widget")
                .await
                .map_err(|e| e.to_string())?;
            let synced = s.condition("w", "Synced").await;
            match made {
                Some(w) if w.data["spec"]["size"] == 3 && synced["status"] == "True" => Ok(()),
                other => Err(format!("{:?}, Synced {synced}", other.map(|w| w.data))),
            }
        },
    )
    .await;
    s.parents()
        .delete("w", &DeleteParams::default())
        .await
        .expect("delete parent");
    eventually("the widget and the parent gone", WAIT, || async {
        let made = widgets
            .get_opt("w-widget")
            .await
            .map_err(|e| e.to_string())?;
        let parent = s.parents().get_opt("w").await.map_err(|e| e.to_string())?;
        (made.is_none() && parent.is_none())
            .then_some(())
            .ok_or(format!(
                "widget {}, parent {}",
                made.is_some(),
                parent.is_some()
            ))
    })
    .await;
    operator.stop().await;
}
