//! `related:` reads in `trellis run` against the real control plane: reads
//! come from watch-backed caches, and a related object's change re-reconciles
//! exactly the parents that read it. The example rules `db-user` and
//! `config-propagation` run here as shipped.
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;

use support::logs::Logs;
use support::operator::{
    Cleanup, Operator, QUIET, TestKind, WAIT, assert_absent, condition, config_data, install_kind,
    rule_set, wait_condition_reason, wait_data, wait_event, wait_exists, wait_gone,
};

/// Reads the ConfigMap `spec.from` and copies its data.
const COPY_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: copier
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: settings
      apiVersion: v1
      kind: ConfigMap
      name: "{{ spec.from }}"
  children:
    - id: copy
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-copy' }}
        data: {{ related.settings.data }}
"#;

async fn config_map(ns: &support::TestNamespace, name: &str, data: &[(&str, &str)]) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name},
        "data": data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
    }))
    .expect("a ConfigMap");
    ns.api::<ConfigMap>()
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("creating ConfigMap {name}: {e}"));
}

/// Every log line of this test binary, from one global subscriber
/// ([`support::logs`]): a thread-local one
/// ([`support::operator::LogCapture`]) misses events whose callsites other
/// tests' operators registered first. Lines name their parent with its
/// (unique) namespace, so tests tell theirs apart.
fn logs() -> &'static Logs {
    Logs::get().expect("the only global subscriber of this test binary")
}

/// Passes the operator logged for the parent `ns/name` so far.
fn passes(logs: &Logs, ns: &str, name: &str) -> usize {
    let field = format!("parent={ns}/{name} ");
    logs.lines()
        .iter()
        .filter(|l| l.contains("planned") && l.contains(&field))
        .count()
}

/// Waits until no parent of `names` has had a pass for `quiet`.
async fn settle(logs: &Logs, ns: &str, names: &[&str], quiet: Duration) -> Vec<usize> {
    let count = || {
        names
            .iter()
            .map(|n| passes(logs, ns, n))
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + WAIT;
    let mut last = count();
    let mut since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = count();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return last;
        }
    }
    panic!("the parents {names:?} never settled: passes {last:?}");
}

fn versions<K: kube::Resource>(objects: &[K]) -> Vec<String> {
    objects
        .iter()
        .map(|o| o.meta().resource_version.clone().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_related_object_re_reconciles_exactly_its_readers_and_a_restart_writes_nothing() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Reader").await;
    config_map(&ns, "src-1", &[("v", "one")]).await;
    config_map(&ns, "src-2", &[("v", "two")]).await;
    let logs = logs();
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(COPY_RULE)]);
    app.create(&ns, "reader-a", json!({"from": "src-1"}), &[])
        .await;
    app.create(&ns, "reader-b", json!({"from": "src-1"}), &[])
        .await;
    app.create(&ns, "other", json!({"from": "src-2"}), &[])
        .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_data(&cms, "reader-a-copy", "reader-a's copy", "v", "one").await;
    wait_data(&cms, "reader-b-copy", "reader-b's copy", "v", "one").await;
    wait_data(&cms, "other-copy", "other's copy", "v", "two").await;
    let names = ["reader-a", "reader-b", "other"];
    let before = settle(logs, ns.name(), &names, Duration::from_secs(2)).await;
    let lines = logs.lines();
    assert!(
        before.iter().all(|n| *n > 0),
        "no pass logged: {before:?}; {} lines captured: {:?}",
        lines.len(),
        lines.iter().take(5).collect::<Vec<_>>()
    );

    let edited = Instant::now();
    cms.patch(
        "src-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "uno"}})),
    )
    .await
    .expect("edit src-1");
    wait_data(&cms, "reader-a-copy", "reader-a's copy updated", "v", "uno").await;
    wait_data(&cms, "reader-b-copy", "reader-b's copy updated", "v", "uno").await;
    let latency = edited.elapsed();
    eprintln!(
        "[related] an edit of a related ConfigMap reached both readers' children in {latency:?}"
    );
    assert!(
        latency < Duration::from_secs(3),
        "readers re-reconciled only after {latency:?}"
    );
    let after = settle(logs, ns.name(), &names, Duration::from_secs(2)).await;
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "{before:?} → {after:?}"
    );
    assert_eq!(
        after[2], before[2],
        "the parent reading src-2 had a pass: {before:?} → {after:?}"
    );
    // An edit of a ConfigMap nobody reads wakes nobody.
    config_map(&ns, "unread", &[("v", "x")]).await;
    let quiet = settle(logs, ns.name(), &names, QUIET).await;
    assert_eq!(quiet, after, "an unread ConfigMap woke a parent");

    // Restart with everything in place: every parent has a pass, nothing is written.
    operator.stop().await;
    let parents = app.api(&ns);
    let snapshot = async || {
        let mut p = Vec::new();
        let mut c = Vec::new();
        for n in names {
            p.push(parents.get(n).await.expect("parent"));
            c.push(cms.get(&format!("{n}-copy")).await.expect("child"));
        }
        (versions(&p), versions(&c))
    };
    let stopped = snapshot().await;
    let restarted_at = names.map(|n| passes(logs, ns.name(), n));
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(COPY_RULE)]);
    let settled = settle(logs, ns.name(), &names, Duration::from_secs(2)).await;
    for (i, n) in names.iter().enumerate() {
        assert!(
            settled[i] > restarted_at[i],
            "{n} had no pass after the restart"
        );
    }
    assert_eq!(
        snapshot().await,
        stopped,
        "the restarted operator wrote to parents or children"
    );
    operator.stop().await;
}

/// Installs the CRD an example rule generates; it stays (as in `tests/crd.rs`).
async fn install_example_crd(client: &Client, rule_text: &str) {
    let set = rule_set(&[rule_text]);
    let crd: CustomResourceDefinition =
        serde_json::from_value(set.rules[0].crd.clone().expect("the example sets crd:"))
            .expect("a CRD");
    support::apply_crd(client, &crd).await;
}

fn example_rule(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("rules/{name}.yaml"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn demo(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("demo.trellis.dev", "v1", kind),
        plural,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_password_secret_holds_the_db_user_back_until_it_is_created() {
    let ns = support::namespace().await;
    let rule = example_rule("db-user");
    install_example_crd(&ns.client, &rule).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    let users: Api<DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        ns.name(),
        &demo("DatabaseUser", "databaseusers"),
    );
    let user: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v1",
        "kind": "DatabaseUser",
        "metadata": {"name": "reporting"},
        "spec": {"database": "orders", "user": "reporting", "passwordSecret": "reporting-password"},
    }))
    .expect("a DatabaseUser");
    users
        .create(&PostParams::default(), &user)
        .await
        .expect("create DatabaseUser");

    let held =
        wait_condition_reason(&users, "reporting", "Ready", "False", "RelatedNotFound").await;
    let message = condition(&held, "Ready").expect("Ready")["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("related \"password\""), "{message}");
    let secrets: Api<Secret> = ns.api();
    let jobs: Api<Job> = ns.api();
    assert_absent(&secrets, "reporting-login", "its password is missing").await;
    assert_absent(&jobs, "reporting-grant", "it waits for the login").await;

    let created = Instant::now();
    let password = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("reporting-password".into()),
            ..Default::default()
        },
        data: Some([("password".to_owned(), ByteString(b"s3cret".to_vec()))].into()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &password)
        .await
        .expect("create the password Secret");
    let login = wait_exists(&secrets, "reporting-login").await;
    eprintln!(
        "[related] the login Secret followed its password in {:?}",
        created.elapsed()
    );
    assert!(
        created.elapsed() < Duration::from_secs(5),
        "{:?}",
        created.elapsed()
    );
    assert_eq!(
        login.data.as_ref().and_then(|d| d.get("password")),
        Some(&ByteString(b"s3cret".to_vec())),
        "the login carries the related Secret's password"
    );
    wait_exists(&jobs, "reporting-grant").await;

    // Gone again: held back, and nothing already applied is pruned.
    secrets
        .delete("reporting-password", &DeleteParams::default())
        .await
        .expect("delete the password Secret");
    wait_condition_reason(&users, "reporting", "Ready", "False", "RelatedNotFound").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_exists(&secrets, "reporting-login").await;
    wait_exists(&jobs, "reporting-grant").await;
    users
        .delete("reporting", &DeleteParams::default())
        .await
        .expect("delete DatabaseUser");
    operator.stop().await;
}

async fn labelled_namespace(labels: &[(&str, &str)]) -> support::TestNamespace {
    let ns = support::namespace().await;
    set_labels(&ns.client, ns.name(), labels).await;
    ns
}

async fn set_labels(client: &Client, name: &str, labels: &[(&str, &str)]) {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                if v.is_empty() { json!(null) } else { json!(v) },
            )
        })
        .collect();
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .unwrap_or_else(|e| panic!("labelling namespace {name}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_gaining_the_label_gets_its_copy_and_losing_it_has_the_copy_pruned() {
    let source = support::namespace().await;
    let rule = example_rule("config-propagation");
    install_example_crd(&source.client, &rule).await;
    let key = support::unique_name("propagate");
    config_map(&source, "ca-bundle", &[("ca.crt", "one")]).await;
    let team_a = labelled_namespace(&[(&key, "yes")]).await;
    let team_b = labelled_namespace(&[]).await;

    // Cluster-scoped parents: the operator watches every namespace.
    let mut options = trellis::operator::Options::new(vec![], vec![]);
    options.instance = "test".into();
    let operator = Operator::spawn(options, rule_set(&[&rule]), &source.client);
    let parents: Api<DynamicObject> = Api::all_with(
        source.client.clone(),
        &demo("ConfigPropagation", "configpropagations"),
    );
    let name = support::unique_name("ca");
    let parent: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v1",
        "kind": "ConfigPropagation",
        "metadata": {"name": name},
        "spec": {
            "source": {"namespace": source.name(), "name": "ca-bundle"},
            "namespaceSelector": {key.as_str(): "yes"},
        },
    }))
    .expect("a ConfigPropagation");
    parents
        .create(&PostParams::default(), &parent)
        .await
        .expect("create ConfigPropagation");
    let in_a: Api<ConfigMap> = team_a.api();
    let in_b: Api<ConfigMap> = team_b.api();
    wait_data(
        &in_a,
        "ca-bundle",
        "the copy in the labelled namespace",
        "ca.crt",
        "one",
    )
    .await;
    assert_absent(&in_b, "ca-bundle", "its namespace lacks the label").await;

    let labelled = Instant::now();
    set_labels(&source.client, team_b.name(), &[(&key, "yes")]).await;
    wait_data(
        &in_b,
        "ca-bundle",
        "the copy in the newly labelled namespace",
        "ca.crt",
        "one",
    )
    .await;
    eprintln!(
        "[related] a newly labelled Namespace got its copy in {:?}",
        labelled.elapsed()
    );
    assert!(
        labelled.elapsed() < Duration::from_secs(5),
        "{:?}",
        labelled.elapsed()
    );

    set_labels(&source.client, team_a.name(), &[(&key, "")]).await;
    wait_gone(&in_a, "ca-bundle", WAIT).await;

    // The source edited: the remaining copy follows.
    source
        .api::<ConfigMap>()
        .patch(
            "ca-bundle",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"ca.crt": "two"}})),
        )
        .await
        .expect("edit the source");
    wait_data(&in_b, "ca-bundle", "the copy updated", "ca.crt", "two").await;
    let status = support::eventually("status counts the copies", WAIT, || async {
        let p = parents.get(&name).await.map_err(|e| e.to_string())?;
        let status = p.data["status"].clone();
        (status["copies"] == json!(1))
            .then_some(status.clone())
            .ok_or(status)
    })
    .await;
    assert_eq!(status["namespaces"], json!([team_b.name()]), "{status}");
    assert!(
        config_data(&in_b.get("ca-bundle").await.expect("copy"), "ca.crt").is_some(),
        "the copy is kept"
    );
    parents
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the parent");
    operator.stop().await;
}

/// Reads the Secret `spec.secret` in namespace `spec.namespace`.
const PEEK_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: @NAME@
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: token
      apiVersion: v1
      kind: Secret
      namespace: "{{ spec.namespace }}"
      name: "{{ spec.secret }}"
      @ALLOW@
  children:
    - id: seen
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-seen' }}
        data:
          token: {{ related.token.data.token | b64decode }}
"#;

fn peek_rule(kind: &TestKind, name: &str, allow: bool) -> String {
    kind.rule(PEEK_RULE).replace("@NAME@", name).replace(
        "@ALLOW@",
        if allow {
            "allowCrossNamespace: true"
        } else {
            ""
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_another_namespace_is_read_only_where_the_rule_allows_it() {
    let ns = support::namespace().await;
    let other = support::namespace().await;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("shared".into()),
            ..Default::default()
        },
        data: Some([("token".to_owned(), ByteString(b"t0ken".to_vec()))].into()),
        ..Default::default()
    };
    other
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the other team's Secret");
    let refused = TestKind::new("Peek");
    let allowed = refused.sibling("Allowed");
    let _cleanup = Cleanup::crds(&[&refused, &allowed]);
    refused.install(&ns.client).await;
    allowed.install(&ns.client).await;
    let options = trellis::operator::Options::new(
        vec![],
        vec![ns.name().to_owned(), other.name().to_owned()],
    );
    let operator = Operator::spawn(
        options,
        rule_set(&[
            &peek_rule(&refused, "peek", false),
            &peek_rule(&allowed, "peek-allowed", true),
        ]),
        &ns.client,
    );
    let spec = json!({"namespace": other.name(), "secret": "shared"});
    refused.create(&ns, "nosy", spec.clone(), &[]).await;
    allowed.create(&ns, "trusted", spec, &[]).await;

    let cms: Api<ConfigMap> = ns.api();
    wait_data(&cms, "trusted-seen", "the allowed read", "token", "t0ken").await;
    let parent = wait_condition_reason(
        &refused.api(&ns),
        "nosy",
        "Synced",
        "False",
        "CrossNamespaceRefused",
    )
    .await;
    let message = condition(&parent, "Synced").expect("Synced")["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("allowCrossNamespace"), "{message}");
    assert!(!message.contains("t0ken"), "{message}");
    wait_event(&ns, "a CrossNamespaceRefused Warning", |e| {
        e.reason.as_deref() == Some("CrossNamespaceRefused")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("nosy")
    })
    .await;
    assert_absent(&cms, "nosy-seen", "the read was refused").await;
    let nosy = refused.api(&ns).get("nosy").await.expect("nosy");
    assert!(!nosy.data.to_string().contains("t0ken"), "{:?}", nosy.data);
    operator.stop().await;
}

/// `trellis rbac`'s role for `set`, without the rules on `resource`.
fn role_without(set: &trellis::rules::RuleSet, resource: &str) -> serde_json::Value {
    let mut role = trellis::rbac::cluster_role(set, &support::unique_name("trellis-related"));
    let rules = role["rules"].as_array_mut().expect("rules");
    rules.retain(|r| {
        !r["resources"]
            .as_array()
            .is_some_and(|rs| rs.iter().any(|x| x == resource))
    });
    role
}

fn may_list_configmaps(ns: &str) -> k8s_openapi::api::authorization::v1::ResourceAttributes {
    k8s_openapi::api::authorization::v1::ResourceAttributes {
        resource: Some("configmaps".into()),
        verb: Some("list".into()),
        namespace: Some(ns.to_owned()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_list_on_a_related_kind_the_preflight_keeps_the_rule_inactive() {
    let ns = support::namespace().await;
    let (kind, mut cleanup) = install_kind(&ns, "Peek").await;
    let set = rule_set(&[&peek_rule(&kind, "peek", false)]);
    let role = role_without(&set, "secrets");
    assert_ne!(
        role,
        trellis::rbac::cluster_role(&set, "x"),
        "secrets were granted"
    );
    let client = support::operator::service_account_with_role(
        &ns,
        role,
        may_list_configmaps(ns.name()),
        &mut cleanup,
    )
    .await;
    let addr = support::faults::free_address();
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    options.metrics_addr = Some(addr);
    let operator = Operator::spawn(options, set, &client);
    let state = support::eventually("the rule reported inactive", WAIT, || async {
        let body = support::http_get(addr, "/status").await?;
        let status: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let rule = status["rules"]["peek"].clone();
        (rule["state"] == "Inactive")
            .then_some(rule.clone())
            .ok_or(rule.to_string())
    })
    .await;
    let reason = state["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("secrets"), "{reason}");
    kind.create(
        &ns,
        "p",
        json!({"namespace": ns.name(), "secret": "s"}),
        &[],
    )
    .await;
    tokio::time::sleep(QUIET).await;
    assert_absent(&ns.api::<ConfigMap>(), "p-seen", "the rule is inactive").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_trellis_rbac_prints_is_enough_for_related_reads() {
    let ns = support::namespace().await;
    let (kind, mut cleanup) = install_kind(&ns, "Peek").await;
    let set = rule_set(&[&peek_rule(&kind, "peek", false)]);
    let role = trellis::rbac::cluster_role(&set, &support::unique_name("trellis-related"));
    let client = support::operator::service_account_with_role(
        &ns,
        role,
        may_list_configmaps(ns.name()),
        &mut cleanup,
    )
    .await;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        },
        data: Some([("token".to_owned(), ByteString(b"mine".to_vec()))].into()),
        ..Default::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the Secret");
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    let operator = Operator::spawn(options, set, &client);
    kind.create(
        &ns,
        "p",
        json!({"namespace": ns.name(), "secret": "s"}),
        &[],
    )
    .await;
    wait_data(
        &ns.api::<ConfigMap>(),
        "p-seen",
        "the copy",
        "token",
        "mine",
    )
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_service_waits_for_its_certificate_to_be_ready() {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::networking::v1::Ingress;
    let ns = support::namespace().await;
    let rule = example_rule("tls-service");
    install_example_crd(&ns.client, &rule).await;
    // A stand-in for cert-manager's CRD: open schema, status subresource.
    let certificates = TestKind::lasting("cert-manager.io", "Certificate");
    certificates.install(&ns.client).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    let services: Api<DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        ns.name(),
        &demo("TlsService", "tlsservices"),
    );
    let shop: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v1",
        "kind": "TlsService",
        "metadata": {"name": "shop"},
        "spec": {"host": "shop.example.com", "port": 8080, "certificate": "shop-tls"},
    }))
    .expect("a TlsService");
    services
        .create(&PostParams::default(), &shop)
        .await
        .expect("create TlsService");
    wait_exists(&ns.api::<Service>(), "shop").await;
    wait_condition_reason(&services, "shop", "Ready", "False", "RelatedNotFound").await;
    let ingresses: Api<Ingress> = ns.api();
    assert_absent(&ingresses, "shop", "its Certificate does not exist").await;

    certificates
        .create(&ns, "shop-tls", json!({"secretName": "shop-tls-cert"}), &[])
        .await;
    wait_condition_reason(&services, "shop", "Ready", "False", "RelatedNotReady").await;
    assert_absent(&ingresses, "shop", "its Certificate is not ready").await;

    let issued = Instant::now();
    certificates
        .api(&ns)
        .patch_status(
            "shop-tls",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .expect("mark the Certificate Ready");
    let ingress = wait_exists(&ingresses, "shop").await;
    eprintln!(
        "[related] the Ingress followed its Certificate's Ready in {:?}",
        issued.elapsed()
    );
    let tls = ingress.spec.and_then(|s| s.tls).unwrap_or_default();
    assert_eq!(tls[0].secret_name.as_deref(), Some("shop-tls-cert"));
    services
        .delete("shop", &DeleteParams::default())
        .await
        .expect("delete TlsService");
    operator.stop().await;
}
