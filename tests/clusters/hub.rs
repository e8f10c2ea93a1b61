//! What the tests of children in other clusters share: a hub (the shared
//! test cluster, the test's namespace) and a spoke (a private control plane
//! started by the test, `support::faults::PrivateCluster`), registered by a
//! Secret holding a kubeconfig.
#![allow(dead_code)]

use std::net::SocketAddr;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::{Value, json};

use crate::support;
use crate::support::TestNamespace;
use crate::support::faults::PrivateCluster;
use crate::support::operator::{TestKind, install_kind};

pub const SPOKE: &str = "spoke-1";

/// The hub (the shared test cluster, the test's namespace) and the spoke
/// (a private control plane with a namespace of the same name).
pub struct Setup {
    pub hub: Hub,
    pub spoke: PrivateCluster,
    pub spoke_client: Client,
    pub cleanup: support::operator::Cleanup,
}

/// One hub: its namespace (parents, the operator's own namespace, the
/// cluster Secret) and the parent kind.
pub struct Hub {
    pub ns: TestNamespace,
    pub kind: TestKind,
}

impl Drop for Hub {
    /// Takes trellis's finalizer off every parent left in the hub's
    /// namespace: a test that failed midway would otherwise leave parents,
    /// and their CRD, undeletable once the operator is gone, holding up the
    /// shared cluster's CRD finalizer for every test.
    fn drop(&mut self) {
        support::operator::release_parents(self.ns.name(), &self.kind.resource);
    }
}

impl std::ops::Deref for Setup {
    type Target = Hub;
    fn deref(&self) -> &Hub {
        &self.hub
    }
}

pub async fn setup(name: &str) -> Setup {
    support::faults::logs();
    let ns = support::namespace().await;
    let (kind, cleanup) = install_kind(&ns, "Placed").await;
    let spoke = PrivateCluster::start(name).await;
    let spoke_client = spoke.client().await;
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns.name()}})).expect("namespace");
    Api::<Namespace>::all(spoke_client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace in the spoke");
    Setup {
        hub: Hub { ns, kind },
        spoke,
        spoke_client,
        cleanup,
    }
}

impl Hub {
    pub fn parents(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.ns.client.clone(), self.ns.name(), &self.kind.resource)
    }

    /// Registers (or re-registers) the spoke with `kubeconfig`.
    pub async fn register(&self, kubeconfig: &Kubeconfig) {
        // JSON is YAML: what a kubeconfig Secret holds either way.
        let text = serde_json::to_string(kubeconfig).expect("kubeconfig text");
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "spoke-1-kubeconfig", "labels": {"trellis.dev/cluster": SPOKE}},
            "stringData": {"kubeconfig": text},
        }))
        .expect("secret");
        Api::<Secret>::namespaced(self.ns.client.clone(), self.ns.name())
            .patch(
                "spoke-1-kubeconfig",
                &PatchParams::apply("clusters-test").force(),
                &Patch::Apply(&secret),
            )
            .await
            .expect("cluster Secret");
    }

    pub async fn patch_spec(&self, name: &str, spec: Value) {
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
    pub async fn events_about(&self, name: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.ns.client.clone(), self.ns.name())
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }

    pub async fn parent(&self, name: &str) -> DynamicObject {
        self.parents().get(name).await.expect("parent")
    }

    pub async fn condition(&self, name: &str, type_: &str) -> Value {
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
pub async fn token_kubeconfig(
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
pub async fn spoke_status(addr: SocketAddr) -> Value {
    let body = support::http_get(addr, "/status").await.unwrap_or_default();
    let status: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    status["clusters"][SPOKE].clone()
}

impl Setup {
    pub fn spoke_configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.spoke_client.clone(), self.ns.name())
    }

    pub fn home_configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.ns.client.clone(), self.ns.name())
    }
}
