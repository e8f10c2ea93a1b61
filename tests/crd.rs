//! Generated CRDs on a real API server: the CRD `trellis crd` makes from a
//! rule is accepted, the API server then refuses an invalid parent with the
//! schema's own message, stores the rule's defaults on the object, and keeps
//! exactly the status fields the rule writes.

mod support;

use k8s_openapi::api::authorization::v1::ResourceAttributes;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use support::operator::{
    Cleanup, Operator, WAIT, rule_set, service_account_with_role, wait_exists, wait_for,
    wait_ready_and_synced,
};

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

/// The generated CRD as stored, once `check` says so.
async fn wait_crd<F>(
    client: &kube::Client,
    name: &str,
    what: &str,
    check: F,
) -> CustomResourceDefinition
where
    F: Fn(&CustomResourceDefinition) -> Result<(), String>,
{
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    wait_for(&crds, name, what, |crd| check(crd).map(|_| crd.clone())).await
}

fn established(crd: &CustomResourceDefinition) -> Result<(), String> {
    let ok = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
    if ok {
        Ok(())
    } else {
        Err("not Established".into())
    }
}

/// Runs with exactly the ClusterRole `trellis rbac --manage-crds` prints
/// (bound to a ServiceAccount the operator impersonates): that is enough to
/// create and update the rule's CRD, and not enough to write any other.
#[tokio::test]
async fn manage_crds_with_only_the_rbac_role_installs_and_updates_its_crd_and_no_other() {
    let ns = support::namespace().await;
    let group = format!("{}.trellis.test", support::unique_name("managed"));
    let crd_name = format!("gadgets.{group}");
    let mut cleanup = Cleanup::default();
    cleanup.add::<CustomResourceDefinition>(&crd_name);

    let dir = tempfile::tempdir().expect("rules dir");
    let rule_file = dir.path().join("gadget.yaml");
    let write_rule = |text: &str| {
        // Atomically, as a ConfigMap volume swaps its files.
        let tmp = dir.path().join(".gadget.yaml.tmp");
        std::fs::write(&tmp, text).expect("write rule");
        std::fs::rename(&tmp, &rule_file).expect("rename rule");
    };
    write_rule(&gadget_rule(&group));
    let set = trellis::rules::RuleSet::load(&[dir.path().to_path_buf()], Default::default())
        .unwrap_or_else(|d| panic!("{d:?}"));
    let mut options =
        trellis::operator::Options::new(vec![dir.path().to_path_buf()], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    options.manage_crds = true;
    options.reload_debounce = std::time::Duration::from_millis(200);
    options.reload_poll = std::time::Duration::from_secs(1);
    let role = trellis::rbac::cluster_role_with(&set, &support::unique_name("trellis-crds"), true);
    let probe = ResourceAttributes {
        group: Some("apiextensions.k8s.io".into()),
        resource: Some("customresourcedefinitions".into()),
        verb: Some("patch".into()),
        name: Some(crd_name.clone()),
        ..Default::default()
    };
    let operator_client = service_account_with_role(&ns, role, probe, &mut cleanup).await;
    let _cleanup = cleanup;
    let operator = Operator::spawn(options, set, &operator_client);

    let crd = wait_crd(
        &ns.client,
        &crd_name,
        "the generated CRD Established",
        established,
    )
    .await;
    let managers: Vec<String> = crd
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.iter().any(|m| m == "trellis"), "{managers:?}");

    // The installed CRD serves parents, which the operator reconciles.
    let gvk = GroupVersionKind::gvk(&group, "v1", "Gadget");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "gadgets");
    let parents: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), ns.name(), &resource);
    let created = parents
        .create(
            &PostParams::default(),
            &gadget(&group, "g1", json!({"image": "nginx"})),
        )
        .await
        .expect("the managed CRD serves Gadgets");
    assert_eq!(
        created.data["spec"]["replicas"], 1,
        "defaulted at admission"
    );
    let config: Api<ConfigMap> = ns.api();
    wait_exists(&config, "g1").await;
    wait_ready_and_synced(&parents, "g1").await;
    let message = refusal(
        &parents,
        &group,
        json!({"image": "nginx", "replicas": 7, "mode": "big"}),
    )
    .await;
    assert!(message.contains("less than or equal to 5"), "{message}");

    // Editing the rule's schema updates the CRD on reload.
    write_rule(
        &gadget_rule(&group)
            .replace("maximum: 5", "maximum: 9")
            .replace(
                "      image: {type: string, minLength: 1}",
                "      image: {type: string, minLength: 1}\n      color: {type: string}",
            ),
    );
    wait_crd(&ns.client, &crd_name, "the CRD to gain spec.color", |crd| {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap_or_default();
        match schema.pointer("/openAPIV3Schema/properties/spec/properties/color") {
            Some(_) => established(crd),
            None => Err("no spec.color yet".into()),
        }
    })
    .await;
    let accepted = support::eventually("a Gadget with 7 replicas to be accepted", WAIT, || async {
        parents
            .create(
                &PostParams::default(),
                &gadget(
                    &group,
                    "g2",
                    json!({"image": "nginx", "replicas": 7, "mode": "big", "color": "red"}),
                ),
            )
            .await
    })
    .await;
    assert_eq!(accepted.data["spec"]["color"], "red");

    // The same identity is refused a CRD that no rule names.
    let other_group = format!("{}.trellis.test", support::unique_name("unnamed"));
    let other = rule_set(&[&gadget_rule(&other_group)]).rules[0]
        .crd
        .clone()
        .expect("the rule sets crd:");
    let err = trellis::operator::crds::apply(&operator_client, &other)
        .await
        .expect_err("a CRD not named by the role is refused");
    assert!(err.to_string().contains("forbidden"), "{err}");
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let stored = crds
        .get_opt(&format!("gadgets.{other_group}"))
        .await
        .expect("get CRD");
    assert!(stored.is_none(), "the refused CRD exists");
    operator.stop().await;
}
