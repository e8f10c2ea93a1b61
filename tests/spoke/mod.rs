//! What the tests of children in other clusters share (`tests/clusters.rs`,
//! `tests/clusters_shards.rs`): a spoke (a private control plane,
//! `support::faults::PrivateCluster`) with a namespace named like the
//! hub's, its registration by a Secret in the hub's operator namespace,
//! the writes its own audit log recorded, and the release of parents left
//! behind by a failed test.
#![allow(dead_code)]

use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::json;

use crate::support;
use support::audit::{self, Write};
use support::faults::PrivateCluster;

/// The spoke's name in the tests.
pub const SPOKE: &str = "spoke-1";

/// A spoke control plane under `target/fault-clusters/NAME`, with the
/// namespace `ns` (children land in their parent's namespace's name).
pub async fn start(name: &str, ns: &str) -> (PrivateCluster, Client) {
    let spoke = PrivateCluster::start(name).await;
    let client = spoke.client().await;
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace in the spoke");
    (spoke, client)
}

/// Registers (or re-registers) [`SPOKE`] with `kubeconfig`: the Secret
/// `spoke-1-kubeconfig` in `ns` of the hub (the operator's namespace).
pub async fn register(hub: &Client, ns: &str, kubeconfig: &Kubeconfig) {
    // JSON is YAML: what a kubeconfig Secret holds either way.
    let text = serde_json::to_string(kubeconfig).expect("kubeconfig text");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "spoke-1-kubeconfig", "labels": {"trellis.dev/cluster": SPOKE}},
        "stringData": {"kubeconfig": text},
    }))
    .expect("secret");
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(hub.clone(), ns)
        .patch(
            "spoke-1-kubeconfig",
            &PatchParams::apply("clusters-test").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("cluster Secret");
}

/// Where the spoke's audit log ends now.
pub fn audit_mark(spoke: &PrivateCluster) -> audit::Mark {
    audit::mark_in(&spoke.dir.join("logs/audit.log")).expect("the spoke's audit log")
}

/// The writes in `ns` the spoke's audit log recorded after `mark`.
pub fn writes_since(spoke: &PrivateCluster, mark: audit::Mark, ns: &str) -> Vec<Write> {
    audit::writes_in(&spoke.dir.join("logs/audit.log"), mark, ns)
}
