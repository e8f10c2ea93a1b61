//! Every write earns its place, counted from the operator's own
//! `trellis_api_requests_total` (each request its client sends, by verb and
//! resource), `trellis_status_writes_total` and `trellis_events_total`: a
//! parent whose children are ready at once costs one write per child, one
//! status write and one Event, and no read; an object someone else made is
//! never written, even when nothing it holds collides with the rendering;
//! a child trellis created loses a field the rendering stops setting.
mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use support::faults::{free_address, metric, try_metric};
use support::operator::{Operator, QUIET, TestKind, install_kind, wait_condition};

/// Three children ready as soon as they exist; `extra` waits for `config`,
/// so a pass that makes `config` makes `extra` too only if it reads its own
/// writes.
const READY_AT_ONCE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: writes
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
        data:
          greeting: {{ spec.greeting | default("hello") }}
    - id: svc
      apiVersion: v1
      kind: Service
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        spec:
          clusterIP: None
          selector: {app: {{ parent.metadata.name }}}
          ports:
            - port: 80
    - id: extra
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [config]
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-extra" }}
        data:
          config: {{ children.config.metadata.name }}
"#;

async fn start(ns: &support::TestNamespace, kind: &TestKind, rule: &str) -> (Operator, String) {
    let addr = free_address();
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    options.metrics_addr = Some(addr);
    let operator = Operator::spawn(
        options,
        support::operator::rule_set(&[&kind.rule(rule)]),
        &ns.client,
    );
    let addr = addr.to_string();
    // Once it leads, the operator reads its record of spoke cleanups under
    // way, a ConfigMap in its own namespace (`supervisor/pending.rs`): one
    // GET, waited for here so that [`child_configmap_reads`] counts only
    // the rule's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let record_reads = || {
        try_metric(
            &addr,
            "trellis_api_requests",
            &["verb=\"get\"", "resource=\"configmaps\""],
        )
    };
    // `None` until the metrics endpoint answers.
    while record_reads().await.unwrap_or(0.0) < OWN_RECORD_READS {
        assert!(
            std::time::Instant::now() < deadline,
            "the operator never read its record of spoke cleanups"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    (operator, addr)
}

/// ConfigMap reads the operator sends for itself, not for a rule.
const OWN_RECORD_READS: f64 = 1.0;

/// Reads of ConfigMaps sent for the rule's children.
async fn child_configmap_reads(addr: &str) -> f64 {
    requests(addr, "get", "configmaps").await - OWN_RECORD_READS
}

async fn requests(addr: &str, verb: &str, resource: &str) -> f64 {
    metric(
        addr,
        "trellis_api_requests",
        &[
            &format!("verb=\"{verb}\""),
            &format!("resource=\"{resource}\""),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_whose_children_are_ready_at_once_costs_one_write_each_one_status_one_event() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Quick").await;
    let (operator, addr) = start(&ns, &kind, READY_AT_ONCE).await;
    let names: Vec<String> = (0..6).map(|i| format!("q{i}")).collect();
    for name in &names {
        kind.create(&ns, name, json!({}), &[]).await;
    }
    let parents = kind.api(&ns);
    for name in &names {
        wait_condition(&parents, name, "Ready", "True").await;
    }
    tokio::time::sleep(QUIET).await;
    let n = names.len() as f64;
    let status = metric(&addr, "trellis_status_writes", &[]).await;
    let events = metric(&addr, "trellis_events", &[]).await;
    let created = metric(&addr, "trellis_events", &["reason=\"Created\""]).await;
    let cm_applies = requests(&addr, "apply", "configmaps").await;
    let svc_applies = requests(&addr, "apply", "services").await;
    let reads = child_configmap_reads(&addr).await + requests(&addr, "get", "services").await;
    eprintln!(
        "[writes] {n} parents: {status} status writes, {events} events, {cm_applies} ConfigMap applies, {svc_applies} Service applies, {reads} child reads"
    );
    assert_eq!(reads, 0.0, "no read before a create");
    assert_eq!(
        (cm_applies, svc_applies),
        (2.0 * n, n),
        "one write per child"
    );
    assert_eq!(status, n, "one status write per parent");
    assert_eq!((events, created), (n, n), "one Event per parent");
    // The watch events of the pass's own writes (the versions it read in
    // the API server's answers) wake no pass, but an event that beats its
    // write's answer back to the pass still does (a debug build decodes
    // answers slowly: 10 passes for 6 parents measured), so the count is
    // printed, not asserted; `pass::own_writes`'s unit test holds the rule.
    let passes = metric(&addr, "trellis_reconciles", &[]).await;
    eprintln!("[writes] {passes} passes for {n} parents");

    // The Event names every child, and the parent's readiness.
    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    let list = events.list(&Default::default()).await.expect("events");
    let note = list
        .items
        .iter()
        .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("q0"))
        .and_then(|e| e.note.clone())
        .unwrap_or_default();
    assert_eq!(
        note,
        format!(
            "created 3 children: ConfigMap {ns}/q0-config, Service {ns}/q0, ConfigMap {ns}/q0-extra; Ready",
            ns = ns.name()
        )
    );

    // A spec edit: the one child it touches is applied, the status is not
    // rewritten (nothing in it changed), and an update alone is no Event.
    kind.patch(&ns, "q0", json!({"spec": {"greeting": "edited"}}))
        .await;
    let cms: Api<ConfigMap> = ns.api();
    support::operator::wait_data(&cms, "q0-config", "the edit", "greeting", "edited").await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        requests(&addr, "apply", "configmaps").await,
        2.0 * n + 1.0,
        "only the edited child is applied again"
    );
    assert_eq!(child_configmap_reads(&addr).await, 0.0);
    assert_eq!(metric(&addr, "trellis_events", &[]).await, n);
    operator.stop().await;
}

const GRAB_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: grab
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ spec.name }}
        data:
          owner: {{ parent.metadata.name }}
"#;

/// Made by someone else with fields that do not collide with the
/// rendering: an unforced apply would be accepted, so the operator's first
/// write is a create-only apply (a `resourceVersion` no stored object has),
/// which the API server refuses because the object exists. The object is
/// never written, not even for a moment: its resourceVersion is unchanged.
/// The refusal is read once per attempt to name the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_someone_else_made_without_colliding_fields_is_never_written() {
    let ns = support::namespace().await;
    let cms: Api<ConfigMap> = ns.api();
    let theirs = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "theirs", "labels": {"team": "payroll"}},
        "data": {"ledger": "42"},
    });
    let before = cms
        .patch(
            "theirs",
            &PatchParams::apply("payroll-tool"),
            &Patch::Apply(&theirs),
        )
        .await
        .expect("someone else's ConfigMap");
    let (kind, _cleanup) = install_kind(&ns, "Grab").await;
    let (operator, addr) = start(&ns, &kind, GRAB_RULE).await;
    kind.create(&ns, "thief", json!({"name": "theirs"}), &[])
        .await;
    let parents = kind.api(&ns);
    let message = support::operator::wait_refused(&parents, "thief").await;
    assert!(
        message.contains("theirs") && message.contains("managed by payroll-tool"),
        "{message}"
    );
    tokio::time::sleep(QUIET).await;
    let now = cms.get("theirs").await.expect("theirs");
    assert_eq!(
        now.metadata.resource_version, before.metadata.resource_version,
        "never written: {now:?}"
    );
    assert_eq!(
        now.labels().clone(),
        [("team".to_owned(), "payroll".to_owned())].into(),
        "no trellis label on it"
    );
    assert!(now.owner_references().is_empty(), "{now:?}");
    let applies = requests(&addr, "apply", "configmaps").await;
    let reads = child_configmap_reads(&addr).await;
    assert!(applies >= 1.0, "the create-only apply was sent");
    assert_eq!(
        reads, applies,
        "each refusal is read once, to name the owner"
    );
    operator.stop().await;
}

const SHRINKING_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: shrink
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
          {% if spec.label %}labels: {tier: {{ spec.label }}}{% endif %}
        data:
          always: "yes"
          {% if spec.extra %}extra: {{ spec.extra }}{% endif %}
"#;

/// A child made by the create-only apply is owned through `Apply`, not a
/// POST's `Update` entry: a field (and a label) the template stops setting
/// is removed from the live object by the next apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_removed_from_the_rendering_is_removed_from_a_child_trellis_created() {
    let ns = support::namespace().await;
    let cms: Api<ConfigMap> = ns.api();
    let (kind, _cleanup) = install_kind(&ns, "Shrink").await;
    let (operator, _addr) = start(&ns, &kind, SHRINKING_RULE).await;
    kind.create(&ns, "s", json!({"extra": "here", "label": "gold"}), &[])
        .await;
    support::operator::wait_data(&cms, "s", "the first rendering", "extra", "here").await;
    let made = cms.get("s").await.expect("s");
    assert!(
        made.managed_fields()
            .iter()
            .all(|m| m.operation.as_deref() == Some("Apply")),
        "created by an apply: {:?}",
        made.managed_fields()
    );
    assert_eq!(made.labels().get("tier").map(String::as_str), Some("gold"));
    kind.patch(&ns, "s", json!({"spec": {"extra": null, "label": null}}))
        .await;
    let parents = kind.api(&ns);
    let start = std::time::Instant::now();
    let now = loop {
        let now = cms.get("s").await.expect("s");
        let data = now.data.clone().unwrap_or_default();
        if !data.contains_key("extra") {
            break now;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "`extra` is still there: {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        now.data,
        Some([("always".to_owned(), "yes".to_owned())].into()),
        "{now:?}"
    );
    assert!(!now.labels().contains_key("tier"), "{:?}", now.labels());
    wait_condition(&parents, "s", "Synced", "True").await;
    operator.stop().await;
}

const TWO_NAMES_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: grab2
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: first
      apiVersion: v1
      kind: ConfigMap
      adopt: true
      template: |
        metadata:
          name: {{ spec.first }}
        data:
          owner: {{ parent.metadata.name }}
    - id: second
      apiVersion: v1
      kind: ConfigMap
      adopt: true
      template: |
        metadata:
          name: {{ spec.second }}
        data:
          owner: {{ parent.metadata.name }}
"#;

/// What the API server refuses an unforced apply — a label another rule's
/// manager owns (409), a second controller reference (422) — is read once,
/// to name the owner, and never written; `adopt: true` does not change it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_rules_object_and_another_controllers_object_are_refused_by_the_api_server() {
    let ns = support::namespace().await;
    let cms: Api<ConfigMap> = ns.api();
    let apply = |name: &str, manager: &str, body: serde_json::Value| {
        let cms = cms.clone();
        let (name, manager) = (name.to_owned(), manager.to_owned());
        async move {
            cms.patch(&name, &PatchParams::apply(&manager), &Patch::Apply(&body))
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    };
    let boss = apply(
        "boss",
        "someone",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "boss"}}),
    )
    .await;
    let ruled = apply(
        "ruled",
        "trellis/other",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "ruled", "labels": {"trellis.dev/rule": "other"}},
               "data": {"mine": "yes"}}),
    )
    .await;
    let controlled = apply(
        "controlled",
        "someone",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "controlled", "ownerReferences": [{
                   "apiVersion": "v1", "kind": "ConfigMap", "name": "boss",
                   "uid": boss.uid().expect("uid"), "controller": true}]},
               "data": {"mine": "yes"}}),
    )
    .await;
    let (kind, _cleanup) = install_kind(&ns, "Grab2").await;
    let (operator, addr) = start(&ns, &kind, TWO_NAMES_RULE).await;
    kind.create(
        &ns,
        "thief",
        json!({"first": "ruled", "second": "controlled"}),
        &[],
    )
    .await;
    let parents = kind.api(&ns);
    let message = support::operator::wait_refused(&parents, "thief").await;
    assert!(
        message.contains("ruled") && message.contains("rule other"),
        "{message}"
    );
    assert!(
        message.contains("controlled") && message.contains("ConfigMap boss"),
        "{message}"
    );
    tokio::time::sleep(QUIET).await;
    for before in [&ruled, &controlled] {
        let name = before.name_any();
        let now = cms.get(&name).await.expect("still there");
        assert_eq!(
            now.metadata.resource_version, before.metadata.resource_version,
            "{name} was written: {now:?}"
        );
    }
    assert!(
        child_configmap_reads(&addr).await >= 2.0,
        "each refusal is followed by a read naming the owner"
    );
    operator.stop().await;
}

const KEEP_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: keep
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: token
      apiVersion: v1
      kind: ConfigMap
      policy: createOnly
      template: |
        metadata:
          name: {{ spec.name }}
        data:
          token: {{ rand_alnum(12) }}
          user: {{ spec.user | default("alice") }}
"#;

/// A `createOnly` child is made as every child is, by the create-only
/// apply (no POST: its fields are owned through `Apply`), is never written
/// again once it exists, whatever its rendering becomes, and is never made
/// over an object of its name that someone else made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_only_child_is_made_by_an_apply_once_and_never_over_someone_elses_object() {
    let ns = support::namespace().await;
    let cms: Api<ConfigMap> = ns.api();
    let theirs = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "theirs"},
        "data": {"ledger": "42"},
    });
    let before = cms
        .patch(
            "theirs",
            &PatchParams::apply("payroll-tool"),
            &Patch::Apply(&theirs),
        )
        .await
        .expect("someone else's ConfigMap");
    let (kind, _cleanup) = install_kind(&ns, "Keep").await;
    let (operator, addr) = start(&ns, &kind, KEEP_RULE).await;
    kind.create(&ns, "keeper", json!({"name": "kept"}), &[])
        .await;
    kind.create(&ns, "thief", json!({"name": "theirs"}), &[])
        .await;
    let parents = kind.api(&ns);
    support::operator::wait_ready_and_synced(&parents, "keeper").await;
    let made = cms.get("kept").await.expect("kept");
    assert!(
        made.managed_fields().iter().all(|m| {
            m.operation.as_deref() == Some("Apply") && m.manager.as_deref() == Some("trellis/keep")
        }),
        "made by trellis's apply: {:?}",
        made.managed_fields()
    );
    assert_eq!(
        requests(&addr, "create", "configmaps").await,
        0.0,
        "no POST"
    );

    let message = support::operator::wait_refused(&parents, "thief").await;
    assert!(
        message.contains("theirs") && message.contains("managed by payroll-tool"),
        "{message}"
    );

    // A new rendering (and every pass it causes) leaves the child as made.
    kind.patch(&ns, "keeper", json!({"spec": {"user": "bob"}}))
        .await;
    support::eventually("keeper's edit observed", support::operator::WAIT, || {
        let parents = parents.clone();
        async move {
            let p = parents.get("keeper").await.map_err(|e| e.to_string())?;
            (support::converge::parent_converged(&p) && p.metadata.generation == Some(2))
                .then_some(())
                .ok_or_else(|| support::converge::describe(&p))
        }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let kept = cms.get("kept").await.expect("kept");
    assert_eq!(
        kept.metadata.resource_version, made.metadata.resource_version,
        "a createOnly child is never written again: {kept:?}"
    );
    let now = cms.get("theirs").await.expect("theirs");
    assert_eq!(
        now.metadata.resource_version, before.metadata.resource_version,
        "someone else's object is never written: {now:?}"
    );
    operator.stop().await;
}
