//! Generated CRDs on a real API server: the CRD `trellis crd` makes from a
//! rule is accepted, the API server then refuses an invalid parent with the
//! schema's own message, stores the rule's defaults on the object, and keeps
//! exactly the status fields the rule writes.

mod support;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use support::operator::{Cleanup, rule_set};

/// A rule in a group of this test's own, with bounds, an enum, a CEL rule,
/// nested defaults and status fields.
fn gadget_rule(group: &str) -> String {
    format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: gadget
spec:
  parent:
    apiVersion: {group}/v1
    kind: Gadget
  crd:
    shortNames: [gdg]
  schema:
    type: object
    required: [image]
    additionalProperties: false
    properties:
      image: {{type: string, minLength: 1}}
      replicas: {{type: integer, minimum: 0, maximum: 5}}
      mode: {{enum: [small, big]}}
      quota:
        type: object
        required: [cpu]
        properties:
          cpu: {{type: [string, integer]}}
          pods: {{type: integer, exclusiveMinimum: 0}}
      hosts:
        type: array
        uniqueItems: true
        items: {{type: string}}
    x-kubernetes-validations:
      - rule: "self.replicas <= 3 || self.mode == 'big'"
        message: more than 3 replicas need mode big
  defaults:
    replicas: 1
    mode: small
    quota: {{cpu: 500m, pods: 10}}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name }}}}
  status:
    fields:
      - path: replicas.ready
        value: "1"
      - path: url
        value: "'x'"
"#
    )
}

struct Installed {
    api_resource: ApiResource,
    _cleanup: Cleanup,
}

/// Generates the rule's CRD, installs it and waits until it is Established.
async fn install_generated(client: &kube::Client, group: &str) -> Installed {
    let set = rule_set(&[&gadget_rule(group)]);
    let generated = set.rules[0].crd.clone().expect("the rule sets crd:");
    let crd: CustomResourceDefinition =
        serde_json::from_value(generated).expect("the generated CRD is a CustomResourceDefinition");
    let mut cleanup = Cleanup::default();
    cleanup.add::<CustomResourceDefinition>(&format!("gadgets.{group}"));
    support::apply_crd(client, &crd).await;
    let gvk = GroupVersionKind::gvk(group, "v1", "Gadget");
    Installed {
        api_resource: ApiResource::from_gvk_with_plural(&gvk, "gadgets"),
        _cleanup: cleanup,
    }
}

fn gadget(group: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"),
        "kind": "Gadget",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a Gadget")
}

/// The API server's refusal of `spec`, as its message.
async fn refusal(api: &Api<DynamicObject>, group: &str, spec: Value) -> String {
    match api
        .create(
            &PostParams::default(),
            &gadget(group, "refused", spec.clone()),
        )
        .await
    {
        Ok(_) => panic!("the API server accepted an invalid Gadget: {spec}"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            status.message
        }
        Err(e) => panic!("creating a Gadget: {e}"),
    }
}

#[tokio::test]
async fn api_server_refuses_invalid_parents_and_stores_defaults_of_a_generated_crd() {
    let ns = support::namespace().await;
    let group = format!("{}.trellis.test", support::unique_name("crd"));
    let installed = install_generated(&ns.client, &group).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), ns.name(), &installed.api_resource);

    let message = refusal(&api, &group, json!({"image": "nginx", "replicas": 9})).await;
    assert!(
        message.contains("spec.replicas") && message.contains("less than or equal to 5"),
        "{message}"
    );
    let message = refusal(&api, &group, json!({"image": "nginx", "replicas": 4})).await;
    assert!(
        message.contains("more than 3 replicas need mode big"),
        "{message}"
    );
    let message = refusal(&api, &group, json!({"replicas": 1})).await;
    assert!(
        message.contains("spec.image") && message.contains("Required"),
        "{message}"
    );
    let message = refusal(&api, &group, json!({"image": "x", "mode": "huge"})).await;
    assert!(message.contains("spec.mode"), "{message}");
    let message = refusal(&api, &group, json!({"image": "x", "quota": {"pods": 0}})).await;
    assert!(
        message.contains("spec.quota.pods") && message.contains("greater than 0"),
        "{message}"
    );
    let message = refusal(&api, &group, json!({"image": "x", "hosts": ["a", "a"]})).await;
    assert!(
        message.contains("spec.hosts") && message.contains("Duplicate"),
        "{message}"
    );

    let created = api
        .create(
            &PostParams::default(),
            &gadget(
                &group,
                "plain",
                json!({"image": "nginx", "quota": {"cpu": 2}}),
            ),
        )
        .await
        .expect("a valid Gadget is accepted");
    assert_eq!(
        created.data["spec"],
        json!({"image": "nginx", "replicas": 1, "mode": "small", "quota": {"cpu": 2, "pods": 10}}),
        "the rule's defaults are stored on the object"
    );
    let created = api
        .create(
            &PostParams::default(),
            &gadget(&group, "bare", json!({"image": "nginx"})),
        )
        .await
        .expect("a valid Gadget is accepted");
    assert_eq!(
        created.data["spec"]["quota"],
        json!({"cpu": "500m", "pods": 10}),
        "an absent object with a required field is created from the defaults"
    );
}

#[tokio::test]
async fn status_of_a_generated_crd_keeps_the_rules_fields_and_conditions_only() {
    let ns = support::namespace().await;
    let group = format!("{}.trellis.test", support::unique_name("crd"));
    let installed = install_generated(&ns.client, &group).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), ns.name(), &installed.api_resource);
    api.create(
        &PostParams::default(),
        &gadget(&group, "s", json!({"image": "nginx"})),
    )
    .await
    .expect("create");
    let status = json!({
        "observedGeneration": 1,
        "replicas": {"ready": 1},
        "url": "https://x",
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "Ready", "message": "ok",
            "lastTransitionTime": "2026-11-29T00:00:00Z", "observedGeneration": 1,
        }],
        "unknown": "pruned",
    });
    let patched = api
        .patch_status(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .expect("status goes through the /status subresource");
    let mut expected = status.clone();
    expected.as_object_mut().expect("object").remove("unknown");
    assert_eq!(patched.data["status"], expected);
}

#[tokio::test]
async fn every_example_crd_is_accepted_by_the_api_server() {
    let client = support::client().await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/crds")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        for doc in
            trellis::yaml::parse_documents(&text, &trellis::yaml::Limits::FILES).expect("YAML")
        {
            let crd: CustomResourceDefinition = serde_json::from_value(doc.value)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            // Idempotent: an identical manifest applied again changes nothing.
            support::apply_crd(&client, &crd).await;
        }
    }
}
