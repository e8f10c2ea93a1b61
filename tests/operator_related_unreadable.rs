//! Related reads the caches cannot answer, against the real control plane:
//! a kind that is not served, a namespace outside the operator's
//! `--namespace`, an object too deep to decode. Each holds back only the
//! children that read it, with its own reason — never "does not exist".
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

use support::faults::metric;
use support::operator::{
    Cleanup, Operator, TestKind, assert_absent, condition, config_data, wait_condition_reason,
    wait_data, wait_event, wait_exists,
};

/// A child that reads `gadget` (a kind installed later), one that reads an
/// optional entry of the same kind, and one that reads nothing.
const GADGET_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: gadget-reader
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: gadget
      apiVersion: @GADGET_API_VERSION@
      kind: Gadget
      name: "{{ spec.gadget }}"
    - id: extra
      apiVersion: @GADGET_API_VERSION@
      kind: Gadget
      name: "{{ spec.gadget ~ '-extra' }}"
      optional: true
  children:
    - id: plain
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-plain' }}
        data:
          extra: {{ "yes" if related.extra is defined else "no" }}
    - id: uses
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-uses' }}
        data:
          size: {{ related.gadget.spec.size | string }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unserved_related_kind_holds_only_its_readers_until_its_crd_is_installed() {
    let ns = support::namespace().await;
    let owner = TestKind::new("GadgetOwner");
    let gadget = owner.sibling("Gadget");
    let _cleanup = Cleanup::crds(&[&owner, &gadget]);
    owner.install(&ns.client).await;
    let rule = owner
        .rule(GADGET_RULE)
        .replace("@GADGET_API_VERSION@", &gadget.api_version());
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    owner.create(&ns, "a", json!({"gadget": "g1"}), &[]).await;

    // The rule runs: what reads nothing unserved is applied, the optional
    // entry of the unserved kind is absent, the reader waits.
    let cms: Api<ConfigMap> = ns.api();
    wait_data(&cms, "a-plain", "the child reading nothing", "extra", "no").await;
    wait_condition_reason(
        &owner.api(&ns),
        "a",
        "Ready",
        "False",
        "RelatedKindNotServed",
    )
    .await;
    let parent = owner.api(&ns).get("a").await.expect("GET parent");
    let message = condition(&parent, "Ready")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("related \"gadget\"") && message.contains("Gadget"),
        "Ready names the entry and the kind: {message}"
    );
    assert_absent(&cms, "a-uses", "its related kind is not served").await;

    // The CRD appears: the rule picks it up without a restart.
    gadget.install(&ns.client).await;
    gadget.create(&ns, "g1", json!({"size": 3}), &[]).await;
    wait_data(
        &cms,
        "a-uses",
        "the reader, once Gadget is served",
        "size",
        "3",
    )
    .await;
    let plain = wait_exists(&cms, "a-plain").await;
    assert_eq!(config_data(&plain, "extra").as_deref(), Some("no"));
    operator.stop().await;
}

/// Reads the ConfigMap `spec.from` in namespace `spec.ns` (allowed).
const ELSEWHERE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: elsewhere
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: source
      apiVersion: v1
      kind: ConfigMap
      namespace: "{{ spec.ns }}"
      name: "{{ spec.from }}"
      allowCrossNamespace: true
  children:
    - id: marker
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-marker' }}
        data: {}
    - id: copy
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-copy' }}
        data: {{ related.source.data }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_outside_the_operators_namespaces_is_out_of_scope_not_missing() {
    let ns = support::namespace().await;
    let other = support::namespace().await;
    let kind = TestKind::new("Elsewhere");
    let _cleanup = Cleanup::crds(&[&kind]);
    kind.install(&ns.client).await;
    let source: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "source"},
        "data": {"k": "v"},
    }))
    .expect("a ConfigMap");
    other
        .api::<ConfigMap>()
        .create(&PostParams::default(), &source)
        .await
        .expect("create the source ConfigMap");
    let rule = kind.rule(ELSEWHERE_RULE);
    kind.create(&ns, "p", json!({"ns": other.name(), "from": "source"}), &[])
        .await;

    // Watching only the parent's namespace: the source exists, but not
    // where trellis looks; the reason says so and names both.
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "p-marker").await;
    wait_condition_reason(&kind.api(&ns), "p", "Ready", "False", "RelatedOutOfScope").await;
    let parent = kind.api(&ns).get("p").await.expect("GET parent");
    let message = condition(&parent, "Ready")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains(other.name()) && message.contains(ns.name()),
        "Ready names the namespace read and the operator's: {message}"
    );
    assert_absent(
        &cms,
        "p-copy",
        "its source is outside the watched namespaces",
    )
    .await;
    operator.stop().await;

    // Watching both: the same read is served.
    let mut options = trellis::operator::Options::new(
        vec![],
        vec![ns.name().to_owned(), other.name().to_owned()],
    );
    options.concurrency = 16;
    options.instance = "test".into();
    let operator = Operator::spawn(options, support::operator::rule_set(&[&rule]), &ns.client);
    wait_data(&cms, "p-copy", "the copy, once both are watched", "k", "v").await;
    operator.stop().await;
}

/// Reads the `Blob` named `spec.from` (a kind anyone may fill).
const BLOB_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: blob-reader
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: blob
      apiVersion: @BLOB_API_VERSION@
      kind: Blob
      name: "{{ spec.from }}"
  children:
    - id: seen
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-seen' }}
        data:
          blob: {{ related.blob.metadata.name }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_related_object_too_deep_to_decode_holds_its_readers_with_a_warning_and_a_metric() {
    let ns = support::namespace().await;
    let reader = TestKind::new("BlobReader");
    let blob = reader.sibling("Blob");
    let _cleanup = Cleanup::crds(&[&reader, &blob]);
    reader.install(&ns.client).await;
    blob.install(&ns.client).await;
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!({ "a": deep });
    }
    blob.create_raw(&ns.client, ns.name(), "deep", json!({"blob": deep}), &[])
        .await;
    blob.create_raw(&ns.client, ns.name(), "fine", json!({"blob": 1}), &[])
        .await;
    let rule = reader
        .rule(BLOB_RULE)
        .replace("@BLOB_API_VERSION@", &blob.api_version());
    let addr = support::faults::free_address();
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.concurrency = 16;
    options.instance = "test".into();
    options.metrics_addr = Some(addr);
    let operator = Operator::spawn(options, support::operator::rule_set(&[&rule]), &ns.client);
    reader.create(&ns, "a", json!({"from": "fine"}), &[]).await;
    reader.create(&ns, "b", json!({"from": "deep"}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    // Its kind's watch goes on serving the others.
    wait_data(&cms, "a-seen", "the readable Blob read", "blob", "fine").await;
    wait_condition_reason(
        &reader.api(&ns),
        "b",
        "Ready",
        "False",
        "RelatedUndecodable",
    )
    .await;
    let parent = reader.api(&ns).get("b").await.expect("GET parent");
    let message = condition(&parent, "Ready")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("related \"blob\"")
            && message.contains("Blob")
            && message.contains("deep"),
        "Ready names the entry and the object: {message}"
    );
    assert_absent(&cms, "b-seen", "its Blob cannot be decoded").await;
    wait_event(&ns, "a RelatedUndecodable Warning on b", |e| {
        e.reason.as_deref() == Some("RelatedUndecodable")
            && e.type_.as_deref() == Some("Warning")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("b")
    })
    .await;
    // Counted once as it arrived; warned once though the pending parent is
    // passed again (its safety-net requeue is 10 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let addr = addr.to_string();
    let kind_label = format!("kind=\"{}/{}\"", blob.api_version(), blob.kind);
    let undecodable = metric(&addr, "trellis_undecodable_objects_total", &[&kind_label]).await;
    assert!(undecodable >= 1.0, "the undecodable Blob is counted");
    let warnings = metric(&addr, "trellis_events", &["reason=\"RelatedUndecodable\""]).await;
    assert_eq!(warnings, 1.0, "one Warning, not one per pass");
    operator.stop().await;
}
