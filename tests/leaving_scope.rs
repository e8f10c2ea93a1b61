//! A parent that stops matching its rule, against the real control plane:
//! its labels leave `parent.selector` (live, with `--shards` too, and while
//! trellis is down), or a reload narrows the selector or the namespaces.
//! Each time it is finalized like a deleted parent: its child deleted, its
//! patch contribution released, trellis's finalizer removed (so a delete
//! of it does not hang), a `Released` Event; and a parent that comes back
//! into scope is served again.
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use configmap_dir::ConfigMapDir;
use support::TestNamespace;
use support::operator::{Operator, TestKind, WAIT, install_kind, rule_set, wait_for, wait_gone};

/// One child and one contribution (a label on the parent's Namespace) per
/// parent, for parents the selector `@SELECTOR@` and namespaces
/// `@NAMESPACES@` pick.
const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: @RULE@
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
    selector: @SELECTOR@
    namespaces: @NAMESPACES@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
        data:
          greeting: hi
  patches:
    - id: team
      apiVersion: v1
      kind: Namespace
      allowCrossNamespace: true
      template: |
        metadata:
          name: {{ parent.metadata.namespace }}
          labels:
            {{ 'example.com/' ~ parent.metadata.name }}: served
"#;

const MANAGED: &str = "{matchLabels: {managed: \"yes\"}}";

fn rule(kind: &TestKind, name: &str, selector: &str, namespaces: &[&str]) -> String {
    kind.rule(RULE)
        .replace("@RULE@", name)
        .replace("@SELECTOR@", selector)
        .replace("@NAMESPACES@", &format!("[{}]", namespaces.join(", ")))
}

/// Creates the parent `name` in `ns` with `labels`.
async fn create(kind: &TestKind, client: &Client, ns: &str, name: &str, labels: &[(&str, &str)]) {
    let mut obj = DynamicObject::new(name, &kind.resource)
        .within(ns)
        .data(json!({"spec": {}}));
    obj.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind.resource);
    api.create(&Default::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// Sets (or, with `None`, removes) one label of a parent.
async fn relabel(api: &Api<DynamicObject>, name: &str, key: &str, value: Option<&str>) {
    let patch = json!({"metadata": {"labels": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("relabel {name}: {e}"));
}

/// Waits until the parent `name` in `ns` is served: its child exists, its
/// contribution is on the Namespace and it carries trellis's finalizer.
async fn wait_served(kind: &TestKind, client: &Client, ns: &str, name: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    wait_for(&cms, &format!("{name}-config"), "the child", |_| Ok(())).await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let key = format!("example.com/{name}");
    wait_for(&nss, ns, "the contribution", |n| {
        n.labels()
            .get(&key)
            .map(|_| ())
            .ok_or_else(|| format!("no {key}"))
    })
    .await;
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind.resource);
    wait_for(&parents, name, "the finalizer", |p| {
        if p.finalizers().iter().any(|f| f == "trellis.dev/cleanup") {
            Ok(())
        } else {
            Err(format!("finalizers {:?}", p.finalizers()))
        }
    })
    .await;
}

/// Waits until nothing of the rule is left for the parent `name` in `ns`:
/// no child, no contribution, no finalizer; and a `Released` Event on it.
async fn wait_released(kind: &TestKind, client: &Client, ns: &str, name: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    wait_gone(&cms, &format!("{name}-config"), WAIT).await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let key = format!("example.com/{name}");
    wait_for(&nss, ns, "the contribution released", |n| {
        match n.labels().get(&key) {
            None => Ok(()),
            Some(v) => Err(format!("{key}={v} still there")),
        }
    })
    .await;
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind.resource);
    wait_for(&parents, name, "the finalizer removed", |p| {
        if p.finalizers().is_empty() {
            Ok(())
        } else {
            Err(format!("finalizers {:?}", p.finalizers()))
        }
    })
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    support::eventually("a Released Event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|e| {
                e.reason.as_deref() == Some("Released")
                    && e.involved_object.name.as_deref() == Some(name)
            })
            .map(|_| ())
            .ok_or_else(|| "no Released Event yet".to_owned())
    })
    .await;
}

/// The parent's delete finishes (trellis's finalizer does not hold it).
async fn delete_does_not_hang(api: &Api<DynamicObject>, name: &str) {
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    wait_gone(api, name, WAIT).await;
}

/// The parent leaves the selector while trellis runs, comes back, leaves
/// again, and is deleted.
async fn leaves_and_comes_back(ns: &TestNamespace, kind: &TestKind, operator: Operator) {
    let client = &ns.client;
    let parents = kind.api(ns);
    create(kind, client, ns.name(), "box", &[("managed", "yes")]).await;
    wait_served(kind, client, ns.name(), "box").await;

    relabel(&parents, "box", "managed", None).await;
    wait_released(kind, client, ns.name(), "box").await;

    // Back in scope: served again.
    relabel(&parents, "box", "managed", Some("yes")).await;
    wait_served(kind, client, ns.name(), "box").await;

    relabel(&parents, "box", "managed", Some("no")).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_gone(&cms, "box-config", WAIT).await;
    delete_does_not_hang(&parents, "box").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_whose_labels_leave_the_selector_is_released_and_its_delete_does_not_hang() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Box").await;
    let name = support::unique_name("leave");
    let operator = Operator::start(&ns.client, ns.name(), &[&rule(&kind, &name, MANAGED, &[])]);
    leaves_and_comes_back(&ns, &kind, operator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_shards_a_parent_that_leaves_the_selector_is_released_by_its_buckets_owner() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Box").await;
    let name = support::unique_name("shard");
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    options.operator_namespace = ns.name().to_owned();
    options.shards = true;
    let mut election = trellis::operator::leadership::leader::Settings::new(
        &support::unique_name("lease"),
        ns.name(),
        "only-replica",
    );
    election.lease_duration = Duration::from_secs(4);
    election.renew_deadline = Duration::from_secs(3);
    election.retry_period = Duration::from_secs(1);
    options.leader_election = Some(election);
    let operator = Operator::spawn(
        options,
        rule_set(&[&rule(&kind, &name, MANAGED, &[])]),
        &ns.client,
    );
    leaves_and_comes_back(&ns, &kind, operator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_that_left_the_selector_while_trellis_was_down_is_released_at_start() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Box").await;
    let name = support::unique_name("down");
    let text = rule(&kind, &name, MANAGED, &[]);
    let operator = Operator::start(&ns.client, ns.name(), &[&text]);
    create(&kind, &ns.client, ns.name(), "box", &[("managed", "yes")]).await;
    create(&kind, &ns.client, ns.name(), "kept", &[("managed", "yes")]).await;
    wait_served(&kind, &ns.client, ns.name(), "box").await;
    wait_served(&kind, &ns.client, ns.name(), "kept").await;
    operator.stop().await;

    let parents = kind.api(&ns);
    relabel(&parents, "box", "managed", None).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&text]);
    wait_released(&kind, &ns.client, ns.name(), "box").await;
    // The parent still selected keeps everything.
    wait_served(&kind, &ns.client, ns.name(), "kept").await;
    delete_does_not_hang(&parents, "box").await;
    delete_does_not_hang(&parents, "kept").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_narrows_the_selector_or_the_namespaces_releases_the_parents_left_outside() {
    let ns = support::namespace().await;
    let other = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Box").await;
    let name = support::unique_name("narrow");
    let both = [ns.name(), other.name()];
    let wide = rule(
        &kind,
        &name,
        "{matchExpressions: [{key: tier, operator: In, values: [web, db]}]}",
        &both,
    );
    let narrow = rule(&kind, &name, "{matchLabels: {tier: web}}", &[ns.name()]);
    let mut rules = ConfigMapDir::new(&[("box.yaml", &wide)]);
    let mut options = trellis::operator::Options::new(
        vec![rules.path()],
        both.iter().map(|n| (*n).to_owned()).collect(),
    );
    options.instance = "test".into();
    options.reload_debounce = Duration::from_millis(200);
    options.reload_poll = Duration::from_secs(2);
    let set = trellis::rules::RuleSet::load(&[rules.path()], Default::default())
        .unwrap_or_else(|d| panic!("rules do not load: {d:?}"));
    let operator = Operator::spawn(options, set, &ns.client);
    let client = &ns.client;
    create(&kind, client, ns.name(), "web", &[("tier", "web")]).await;
    create(&kind, client, ns.name(), "db", &[("tier", "db")]).await;
    create(&kind, client, other.name(), "far", &[("tier", "web")]).await;
    for (namespace, parent) in [(ns.name(), "web"), (ns.name(), "db"), (other.name(), "far")] {
        wait_served(&kind, client, namespace, parent).await;
    }

    rules.update(&[("box.yaml", &narrow)]);
    // Outside the new selector, and outside the new namespaces.
    wait_released(&kind, client, ns.name(), "db").await;
    wait_released(&kind, client, other.name(), "far").await;
    wait_served(&kind, client, ns.name(), "web").await;
    for (namespace, parent) in [(ns.name(), "web"), (ns.name(), "db"), (other.name(), "far")] {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &kind.resource);
        delete_does_not_hang(&api, parent).await;
    }
    operator.stop().await;
}
