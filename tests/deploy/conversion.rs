//! The conversion webhook in the cluster: trellis deployed from
//! examples/deploy (two replicas, `--manage-crds`), the example WebApp rule
//! serving v2alpha1 beside v1. The API server reaches `/convert` through the
//! `trellis-webhook` Service on the node's Pod network, with the CA the
//! leader made and wrote into the CRD; conversions keep being answered
//! while the leader Pod is deleted (its Service endpoint goes, the standby
//! answers, and the leaving Pod serves until then).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use super::support;
use super::{DEPLOY, NS, WAIT, deploy, leader, wait_ready_replicas, webapps};

fn webapps_v2(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("demo.trellis.dev", "v2alpha1", "WebApp");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

#[tokio::test]
async fn a_webapp_written_at_v2alpha1_is_read_at_v1_and_conversions_go_on_while_the_leader_pod_is_deleted()
 {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    deploy(&client).await;
    let ns = support::namespace().await;

    // The leader writes the CA of the certificate it made into the CRD.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    support::eventually("the WebApp CRD carrying the webhook's CA", WAIT, || async {
        let crd = crds
            .get("webapps.demo.trellis.dev")
            .await
            .map_err(|e| e.to_string())?;
        let config =
            serde_json::to_value(&crd).map_err(|e| e.to_string())?["spec"]["conversion"]["webhook"]
                ["clientConfig"]
                .clone();
        let has_ca = config["caBundle"].as_str().is_some_and(|c| !c.is_empty());
        let service = &config["service"];
        (has_ca && service["namespace"] == NS && service["name"] == "trellis-webhook")
            .then_some(())
            .ok_or(format!("clientConfig {config}"))
    })
    .await;

    // Written at v2alpha1: stored at v1 (the storage version) by the webhook.
    let parent: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v2alpha1",
        "kind": "WebApp",
        "metadata": {"name": "shop"},
        "spec": {
            "image": support::node::APP_IMAGE,
            "ingress": {"enabled": true, "className": "public", "hosts": ["shop.example.com"]},
        },
    }))
    .unwrap();
    let v2 = webapps_v2(&client, ns.name());
    support::eventually("the v2alpha1 WebApp created", WAIT, || async {
        v2.create(&PostParams::default(), &parent)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let at_v1 = webapps(&client, ns.name()).get("shop").await.unwrap();
    assert_eq!(
        at_v1.data["spec"],
        json!({
            "image": support::node::APP_IMAGE, "replicas": 1, "port": 8080, "greeting": "hello",
            "expose": true, "hosts": ["shop.example.com"], "ingressClassName": "public",
        }),
        "read at v1"
    );
    let back = v2.get("shop").await.unwrap();
    assert_eq!(
        back.data["spec"]["ingress"]["hosts"],
        json!(["shop.example.com"])
    );

    // Conversions, one after the other, while the leader Pod is deleted.
    let (holder, leader_pod) =
        support::eventually("a Lease holder", WAIT, || leader(&client)).await;
    let reader = {
        let v2 = v2.clone();
        tokio::spawn(async move {
            let (mut answered, mut failed) = (0usize, Vec::new());
            let until = Instant::now() + Duration::from_secs(40);
            while Instant::now() < until {
                match v2.get("shop").await {
                    Ok(obj) if obj.data["spec"]["ingress"]["enabled"] == true => answered += 1,
                    Ok(obj) => failed.push(format!("wrong conversion: {:?}", obj.data["spec"])),
                    Err(e) => failed.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (answered, failed)
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete(&leader_pod, &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("a new Lease holder", WAIT, || async {
        match leader(&client).await {
            Ok((h, p)) if h != holder && p != leader_pod => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_ready_replicas(&client, 2).await;
    let (answered, failed) = reader.await.unwrap();
    println!(
        "[deploy] conversions while the leader Pod was deleted: {answered} answered, {} failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} conversions failed, e.g. {:?}",
        failed.len(),
        answered + failed.len(),
        failed.first()
    );
    assert!(answered > 100, "only {answered} conversions in 40 s");
}
