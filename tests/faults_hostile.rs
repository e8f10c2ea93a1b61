//! Hostile parents: whatever a parent author writes, it ends in a clear
//! condition on that parent and an Event — never a stalled kind, a hot
//! loop, an injected object or a crash — and every other parent of the
//! rule is reconciled as usual.
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;
#[path = "support/reloading.rs"]
mod reloading;

use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use configmap_dir::ConfigMapDir;
use reloading::Reloading;
use support::hostile::{ECHO_RULE, nested};
use support::operator::{
    Operator, QUIET, TestKind, WAIT, condition, install_kind, wait_condition_reason, wait_exists,
    wait_finalizer, wait_finalizer_released, wait_gone, wait_ready_and_synced,
};

/// The raw JSON text of a parent.
async fn get_raw(ns: &support::TestNamespace, kind: &TestKind, name: &str) -> String {
    let url = format!(
        "/apis/{}/v1/namespaces/{}/{}",
        kind.group,
        ns.name(),
        kind.plural
    );
    let req = kube::core::Request::new(url)
        .get(name, &Default::default())
        .expect("request");
    ns.client.request_text(req).await.expect("get parent")
}

fn start(ns: &support::TestNamespace, kind: &TestKind) -> Operator {
    Operator::start(&ns.client, ns.name(), &[&kind.rule(ECHO_RULE)])
}

fn message(parent: &kube::api::DynamicObject, type_: &str) -> String {
    condition(parent, type_)
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Warning Events about `name`, counting repeats of one Event.
async fn warnings(ns: &support::TestNamespace, name: &str) -> i32 {
    let events: Api<Event> = ns.api();
    let list = events.list(&ListParams::default()).await.expect("events");
    list.items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            e.series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1)
                .max(1)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_nested_too_deep_is_reported_and_skipped_while_its_kind_goes_on() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Echo").await;
    // Made before the operator starts: the initial LIST holds it.
    kind.create(&ns, "good", json!({"text": "hi"}), &[]).await;
    kind.create_raw(
        &ns.client,
        ns.name(),
        "deep",
        json!({"text": "x", "blob": nested(200)}),
        &[],
    )
    .await;
    let operator = start(&ns, &kind);
    let parents = kind.api(&ns);
    wait_ready_and_synced(&parents, "good").await;
    let raw = support::eventually(
        "Synced=False/Undecodable on the deep parent",
        support::operator::WAIT,
        || async {
            let raw = get_raw(&ns, &kind, "deep").await;
            if raw.contains(r#""reason":"Undecodable""#) {
                Ok(raw)
            } else {
                Err("not yet")
            }
        },
    )
    .await;
    assert!(raw.contains("128 levels"), "the condition names the limit");
    support::operator::wait_event(&ns, "an Undecodable Event", |e| {
        e.reason.as_deref() == Some("Undecodable")
    })
    .await;
    let cms: Api<ConfigMap> = ns.api();
    assert!(
        cms.get_opt("deep-config").await.expect("get").is_none(),
        "nothing is rendered for the deep parent"
    );
    // The watch goes on: new parents and edits are still served.
    kind.create(&ns, "later", json!({"text": "still"}), &[])
        .await;
    wait_ready_and_synced(&parents, "later").await;
    operator.stop().await;

    // And across a restart, with the deep parent in the initial LIST again.
    kind.create(&ns, "after-restart", json!({}), &[]).await;
    let operator = start(&ns, &kind);
    wait_ready_and_synced(&parents, "after-restart").await;
    // An edit that makes it decodable heals it.
    let req = kube::core::Request::new(format!(
        "/apis/{}/v1/namespaces/{}/{}",
        kind.group,
        ns.name(),
        kind.plural
    ))
    .patch(
        "deep",
        &Default::default(),
        &kube::api::Patch::Merge(json!({"spec": {"blob": null}})),
    )
    .expect("request");
    ns.client
        .request_text(req)
        .await
        .expect("patch deep parent");
    wait_ready_and_synced(&parents, "deep").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_render_error_backs_off_and_writes_one_warning_not_one_per_retry() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Echo").await;
    let operator = start(&ns, &kind);
    // `"x" + 1` fails in every pass.
    kind.create(&ns, "broken", json!({"n": "x"}), &[]).await;
    let parents = kind.api(&ns);
    wait_condition_reason(&parents, "broken", "Synced", "False", "RenderError").await;
    let rv = parents
        .get("broken")
        .await
        .expect("parent")
        .metadata
        .resource_version;
    // Child events, resyncs and the retry timer all wake it; none may write.
    kind.create(&ns, "neighbour", json!({}), &[]).await;
    tokio::time::sleep(QUIET * 3).await;
    let now = parents.get("broken").await.expect("parent");
    assert_eq!(
        now.metadata.resource_version, rv,
        "an unchanged failure rewrote the status"
    );
    let n = warnings(&ns, "broken").await;
    assert!(n <= 2, "{n} Warning Events for one unchanged failure");
    wait_ready_and_synced(&parents, "neighbour").await;
    // The fix is tried at once, not after the backoff.
    kind.patch(&ns, "broken", json!({"spec": {"n": 4}})).await;
    wait_ready_and_synced(&parents, "broken").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_values_long_lists_and_template_syntax_in_values_end_in_clear_conditions() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Echo").await;
    let operator = start(&ns, &kind);
    let parents = kind.api(&ns);
    let cms: Api<ConfigMap> = ns.api();

    // A 1 MiB string: the rendered object passes the byte limit.
    let huge = "y".repeat(1024 * 1024);
    kind.create(&ns, "huge", json!({"text": huge}), &[]).await;
    let p = wait_condition_reason(&parents, "huge", "Synced", "False", "RenderError").await;
    let m = message(&p, "Synced");
    assert!(m.contains("limit") || m.contains("bytes"), "{m}");

    // 5,000 forEach items: more than the limit, and nothing is created.
    let items: Vec<Value> = (0..5000).map(|i| json!(format!("i{i}"))).collect();
    kind.create(&ns, "many", json!({"items": items}), &[]).await;
    let p = wait_condition_reason(&parents, "many", "Synced", "False", "RenderError").await;
    let m = message(&p, "Synced");
    assert!(m.contains("limit of 1000"), "{m}");
    let made = cms
        .list(&ListParams::default().labels("trellis.dev/child=items"))
        .await
        .expect("list");
    assert!(made.items.is_empty(), "{} items created", made.items.len());

    // Template and YAML syntax in values stays data.
    let sneaky =
        "{{ 7*7 }} {% if true %}x{% endif %}\n---\napiVersion: v1\nkind: Secret\n\"quoted\": 'yes'";
    kind.create(
        &ns,
        "sneaky",
        json!({"text": sneaky, "items": [sneaky]}),
        &[],
    )
    .await;
    wait_ready_and_synced(&parents, "sneaky").await;
    let cm = cms.get("sneaky-config").await.expect("child");
    assert_eq!(
        cm.data
            .as_ref()
            .and_then(|d| d.get("text"))
            .map(String::as_str),
        Some(sneaky),
        "the value is copied verbatim, never evaluated"
    );
    let item = cms.get("sneaky-item-0").await.expect("item child");
    assert_eq!(
        item.data
            .as_ref()
            .and_then(|d| d.get("item"))
            .map(String::as_str),
        Some(sneaky)
    );
    let all = cms
        .list(&ListParams::default().labels("trellis.dev/rule=echo"))
        .await
        .expect("list");
    let names: Vec<String> = all
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .filter(|n| n.starts_with("sneaky"))
        .collect();
    assert_eq!(
        names.len(),
        2,
        "only the sneaky parent's two children exist: {names:?}"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = ns.api();
    let injected = secrets
        .list(&ListParams::default().labels("trellis.dev/rule=echo"))
        .await
        .expect("list");
    assert!(injected.items.is_empty(), "a value injected a Secret");
    operator.stop().await;
}

/// Waits until `text`, the raw JSON of a parent, satisfies `check`.
async fn wait_raw(
    ns: &support::TestNamespace,
    kind: &TestKind,
    name: &str,
    what: &str,
    check: impl Fn(&str) -> bool,
) {
    support::eventually(what, WAIT, || async {
        let raw = get_raw(ns, kind, name).await;
        if check(&raw) {
            Ok(())
        } else {
            Err(raw.chars().take(400).collect::<String>())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_rule_cleans_up_after_its_parents_even_with_one_nested_too_deep() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Echo").await;
    // Behind trellis's finalizer, and children deleted with the rule.
    let rule = format!(
        "{}  deletion:\n    order: reverse\n  onRuleRemoved: delete\n",
        kind.rule(ECHO_RULE)
    );
    let mut rules = ConfigMapDir::new(&[("echo.yaml", &rule)]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    let parents = kind.api(&ns);
    let cms: Api<ConfigMap> = ns.api();
    kind.create(&ns, "good", json!({"text": "hi"}), &[]).await;
    wait_exists(&cms, "good-config").await;
    wait_finalizer(&parents, "good").await;
    // A parent that was decodable when it got the finalizer, then nested
    // 200 deep: the LIST of parents holds it, and so does every response
    // to a write on it.
    kind.create_raw(
        &ns.client,
        ns.name(),
        "deep",
        json!({"blob": nested(200)}),
        &[trellis::operator::FINALIZER],
    )
    .await;
    wait_raw(
        &ns,
        &kind,
        "deep",
        "Undecodable on the deep parent",
        |raw| raw.contains(r#""reason":"Undecodable""#),
    )
    .await;

    rules.update(&[]);
    operator
        .wait_reload("the rule's removal", |r| r["successes"] == 1)
        .await;
    // The good parent's child goes and both finalizers are released.
    wait_gone(&cms, "good-config", WAIT).await;
    wait_finalizer_released(&parents, "good").await;
    wait_raw(
        &ns,
        &kind,
        "deep",
        "the deep parent's finalizer released",
        |raw| !raw.contains(trellis::operator::FINALIZER),
    )
    .await;
    operator.stop().await;
}
