//! Smoke tests of the test control plane itself: the features the operator
//! relies on (CRDs, dynamic objects, the garbage collector, the namespace
//! controller, server-side apply) work against the cluster the harness gives.
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use kube::discovery;
use serde_json::json;

const GROUP: &str = "smoke.trellis.dev";

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("widgets.{GROUP}") },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "listKind": "WidgetList"
            },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "properties": {
                                "size": { "type": "integer" },
                                "color": { "type": "string" }
                            }
                        },
                        "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
                    }
                }}
            }]
        }
    }))
    .expect("valid CRD")
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn api_server_reports_a_kubernetes_1_35_version() {
    let client = support::client().await;
    let info = client.apiserver_version().await.expect("GET /version");
    assert_eq!(info.major, "1", "{info:?}");
    assert!(info.minor.starts_with("35"), "{info:?}");
    if support::cluster().local {
        assert_eq!(info.git_version, "v1.35.4", "{info:?}");
    }
}

#[tokio::test]
async fn applied_crd_becomes_established_and_discoverable() {
    let client = support::client().await;
    support::apply_crd(&client, &widget_crd()).await;

    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get(&format!("widgets.{GROUP}"))
        .await
        .expect("CRD readable");
    let established = crd
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established, "CRD not Established");

    let gvk = GroupVersionKind::gvk(GROUP, "v1", "Widget");
    let (resource, caps) = support::eventually(
        "Widget to appear in discovery",
        Duration::from_secs(30),
        || discovery::pinned_kind(&client, &gvk),
    )
    .await;
    assert_eq!(resource.plural, "widgets");
    assert_eq!(caps.scope, discovery::Scope::Namespaced);
}

#[tokio::test]
async fn custom_objects_can_be_created_and_listed_through_the_dynamic_api() {
    let ns = support::namespace().await;
    support::apply_crd(&ns.client, &widget_crd()).await;
    let gvk = GroupVersionKind::gvk(GROUP, "v1", "Widget");
    let (resource, _caps) = support::eventually(
        "Widget to appear in discovery",
        Duration::from_secs(30),
        || discovery::pinned_kind(&ns.client, &gvk),
    )
    .await;
    let widgets: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), ns.name(), &resource);

    for (name, size) in [("small", 1), ("large", 9)] {
        let obj = DynamicObject::new(name, &resource)
            .within(ns.name())
            .data(json!({ "spec": { "size": size, "color": "green" } }));
        widgets
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating Widget {name}: {e}"));
    }

    let list = widgets.list(&ListParams::default()).await.expect("list");
    let mut names: Vec<_> = list
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["large", "small"]);

    let large = widgets.get("large").await.expect("get");
    assert_eq!(large.data["spec"]["size"], json!(9));
    assert_eq!(
        large.types.as_ref().map(|t| t.kind.as_str()),
        Some("Widget")
    );
}

#[tokio::test]
async fn garbage_collector_deletes_dependents_of_a_deleted_owner() {
    let ns = support::namespace().await;
    let cms: Api<ConfigMap> = ns.api();

    let owner = cms
        .create(
            &PostParams::default(),
            &config_map("owner", &[("role", "owner")]),
        )
        .await
        .expect("create owner");
    let mut dependent = config_map("dependent", &[("role", "dependent")]);
    dependent.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().expect("owner uid"),
        ..OwnerReference::default()
    }]);
    cms.create(&PostParams::default(), &dependent)
        .await
        .expect("create dependent");

    cms.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");

    support::eventually(
        "the garbage collector to delete the dependent",
        Duration::from_secs(60),
        || async {
            match cms.get_opt("dependent").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("dependent still exists".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn server_side_apply_records_the_field_manager() {
    let ns = support::namespace().await;
    let cms: Api<ConfigMap> = ns.api();
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": "applied" },
        "data": { "greeting": "hello" }
    });

    let applied = cms
        .patch(
            "applied",
            &PatchParams::apply("smoke").force(),
            &Patch::Apply(&manifest),
        )
        .await
        .expect("server-side apply");
    assert_eq!(
        applied.data.as_ref().and_then(|d| d.get("greeting")),
        Some(&"hello".to_string())
    );

    let fetched = cms.get("applied").await.expect("get");
    let managers: Vec<_> = fetched
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.manager.unwrap_or_default(),
                m.operation.unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&("smoke".to_string(), "Apply".to_string())),
        "managedFields: {managers:?}"
    );
}

#[tokio::test]
async fn deleting_a_namespace_removes_it_and_its_contents() {
    let client = support::client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let name = support::unique_name("smoke-ns-deletion");
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some([(support::TEST_LABEL.to_string(), "true".to_string())].into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .expect("create namespace");
    Api::<ConfigMap>::namespaced(client.clone(), &name)
        .create(
            &PostParams::default(),
            &config_map("content", &[("a", "b")]),
        )
        .await
        .expect("create content");

    namespaces
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete namespace");
    support::eventually(
        "the namespace controller to finish deleting the namespace",
        Duration::from_secs(60),
        || async {
            match namespaces.get_opt(&name).await {
                Ok(None) => Ok(()),
                Ok(Some(ns)) => Err(format!("still there: {:?}", ns.status)),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
}
