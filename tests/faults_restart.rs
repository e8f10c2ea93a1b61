//! Faults around the operator's own life: parents that exist before it
//! starts, a restart with everything in place, a kill mid-convergence.
//! Each test counts what was lost or duplicated, not only that things
//! converged.
mod support;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams};
use std::time::Duration;

use serde_json::json;

use support::operator::{Operator, TestKind, install_kind, wait_ready_and_synced};

/// Two children of two kinds per parent, so several caches must list first.
const PAIR_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: pair
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
    - id: secret
      apiVersion: v1
      kind: Secret
      policy: createOnly
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-secret" }}
        stringData:
          password: {{ rand_alnum(24) }}
"#;

async fn create_parents(kind: &TestKind, ns: &support::TestNamespace, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("p{i}");
        kind.create(ns, &name, json!({ "greeting": format!("hi {i}") }), &[])
            .await;
        names.push(name);
    }
    names
}

fn start(ns: &support::TestNamespace, kind: &TestKind, concurrency: usize) -> Operator {
    start_with(ns, kind, concurrency, None)
}

/// The operator with its `/metrics` on a free port; the port's address.
fn start_measured(ns: &support::TestNamespace, kind: &TestKind) -> (Operator, String) {
    let metrics = support::faults::free_address();
    (start_with(ns, kind, 16, Some(metrics)), metrics.to_string())
}

fn start_with(
    ns: &support::TestNamespace,
    kind: &TestKind,
    concurrency: usize,
    metrics: Option<std::net::SocketAddr>,
) -> Operator {
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.concurrency = concurrency;
    options.instance = "test".into();
    options.metrics_addr = metrics;
    Operator::spawn(
        options,
        support::operator::rule_set(&[&kind.rule(PAIR_RULE)]),
        &ns.client,
    )
}

/// `n` parents, and an operator that has made all of them Ready.
async fn converged(
    ns: &support::TestNamespace,
    kind: &TestKind,
    n: usize,
) -> (Vec<String>, Operator) {
    let names = create_parents(kind, ns, n).await;
    let operator = start(ns, kind, 16);
    let parents = kind.api(ns);
    for name in &names {
        wait_ready_and_synced(&parents, name).await;
    }
    (names, operator)
}

/// Asserts that every Secret in `before` still holds its password.
fn assert_secrets_kept(before: &[(String, String)], after: &[(String, String)]) {
    for (name, password) in before {
        let now = after.iter().find(|(n, _)| n == name).map(|(_, p)| p);
        assert_eq!(now, Some(password), "secret {name} re-rolled or lost");
    }
}

async fn secret_data(ns: &support::TestNamespace) -> Vec<(String, String)> {
    let secrets: Api<Secret> = ns.api();
    let list = secrets
        .list(&ListParams::default().labels("trellis.dev/rule=pair"))
        .await
        .expect("list secrets");
    let mut out: Vec<(String, String)> = list
        .items
        .iter()
        .map(|s| {
            let name = s.metadata.name.clone().unwrap_or_default();
            let data = s
                .data
                .as_ref()
                .and_then(|d| d.get("password"))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .unwrap_or_default();
            (name, data)
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_made_before_the_operator_starts_are_all_reconciled_and_it_stops_promptly() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Pair").await;
    let names = create_parents(&kind, &ns, 12).await;
    // More parents than permits and than one: the case a restart meets.
    let operator = start(&ns, &kind, 4);
    let parents = kind.api(&ns);
    for name in &names {
        wait_ready_and_synced(&parents, name).await;
    }
    let cms: Api<ConfigMap> = ns.api();
    let list = cms
        .list(&ListParams::default().labels("trellis.dev/rule=pair"))
        .await
        .expect("list");
    assert_eq!(list.items.len(), names.len(), "one ConfigMap per parent");
    assert_eq!(
        secret_data(&ns).await.len(),
        names.len(),
        "one Secret per parent"
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_keeps_every_child_and_never_rerolls_a_create_only_secret() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Pair").await;
    let (names, operator) = converged(&ns, &kind, 6).await;
    let parents = kind.api(&ns);
    let before = secret_data(&ns).await;
    assert_eq!(before.len(), names.len());
    operator.stop().await;

    // Parents edited and added while no operator runs.
    kind.patch(&ns, "p0", json!({"spec": {"greeting": "edited"}}))
        .await;
    kind.create(&ns, "late", json!({}), &[]).await;
    let operator = start(&ns, &kind, 16);
    wait_ready_and_synced(&parents, "late").await;
    let cms: Api<ConfigMap> = ns.api();
    support::operator::wait_data(&cms, "p0-config", "the edit", "greeting", "edited").await;
    let after = secret_data(&ns).await;
    assert_eq!(after.len(), names.len() + 1, "{after:?}");
    assert_secrets_kept(&before, &after);
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_finds_everything_as_it_was_left_sends_no_write() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Pair").await;
    let (names, operator) = converged(&ns, &kind, 8).await;
    operator.stop().await;
    let statuses = || async {
        let list = kind
            .api(&ns)
            .list(&ListParams::default())
            .await
            .expect("list parents");
        list.items
            .into_iter()
            .map(|p| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    p.data["status"].clone(),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let left = statuses().await;

    let (operator, addr) = start_measured(&ns, &kind);
    let count = names.len() as f64;
    support::eventually(
        "every parent reconciled after the restart",
        support::operator::WAIT,
        || {
            let addr = addr.clone();
            async move {
                match support::faults::try_metric(&addr, "trellis_reconciles", &["result=\"ok\""])
                    .await
                {
                    Some(n) if n >= count => Ok(n),
                    other => Err(other),
                }
            }
        },
    )
    .await;
    tokio::time::sleep(support::operator::QUIET).await;
    let writes = support::faults::metric(&addr, "trellis_status_writes", &[]).await;
    let created =
        support::faults::metric(&addr, "trellis_child_operations", &["op=\"create\""]).await;
    let updated =
        support::faults::metric(&addr, "trellis_child_operations", &["op=\"update\""]).await;
    let unchanged =
        support::faults::metric(&addr, "trellis_child_operations", &["op=\"unchanged\""]).await;
    eprintln!(
        "[faults] restart with nothing changed: {writes} status writes, {created} creates, {updated} updates, {unchanged} unchanged"
    );
    if (writes, created, updated) != (0.0, 0.0, 0.0) {
        // Which statuses the restarted operator rewrote, and how.
        let now = statuses().await;
        let changed: Vec<String> = now
            .iter()
            .filter(|(name, status)| left.get(*name) != Some(status))
            .map(|(name, status)| {
                format!("{name}:\n  left: {:?}\n  now:  {status}", left.get(name))
            })
            .collect();
        panic!(
            "a restart with nothing changed wrote: {writes} statuses, {created} creates, \
             {updated} updates; statuses changed:\n{}{}",
            changed.join("\n"),
            support::logs::tail(Some(ns.name()), 40)
        );
    }
    assert!(unchanged >= 2.0 * names.len() as f64, "{unchanged}");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trellis_killed_mid_convergence_and_started_again_loses_and_duplicates_nothing() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Pair").await;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
    std::fs::write(dir.path().join("rules/pair.yaml"), kind.rule(PAIR_RULE)).expect("rule");
    let names = create_parents(&kind, &ns, 40).await;
    let mut first = support::process::Replica::start("first", &ns, dir.path(), &[]);
    // Kill it with SIGKILL once some, not all, children exist.
    let before = support::eventually("some Secrets created", support::operator::WAIT, || async {
        let s = secret_data(&ns).await;
        if s.len() >= 5 { Ok(s) } else { Err(s.len()) }
    })
    .await;
    first.signal("-KILL");
    first.exited(Duration::from_secs(10)).await;
    let at_kill = secret_data(&ns).await;
    eprintln!(
        "[faults] SIGKILL with {} of {} Secrets created",
        at_kill.len(),
        names.len()
    );
    let second = support::process::Replica::start("second", &ns, dir.path(), &[]);
    let started = std::time::Instant::now();
    let parents = kind.api(&ns);
    for name in &names {
        wait_ready_and_synced(&parents, name).await;
    }
    eprintln!(
        "[faults] restart after SIGKILL -> all {} parents converged in {:.2?}",
        names.len(),
        started.elapsed()
    );
    let after = secret_data(&ns).await;
    assert_eq!(after.len(), names.len(), "one Secret per parent");
    assert_secrets_kept(&before, &after);
    assert_secrets_kept(&at_kill, &after);
    let cms: Api<ConfigMap> = ns.api();
    let list = cms
        .list(&ListParams::default().labels("trellis.dev/rule=pair"))
        .await
        .expect("list");
    assert_eq!(list.items.len(), names.len(), "one ConfigMap per parent");
    eprintln!(
        "[faults] writes by the restarted process: {}",
        second.writes().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_on_an_owned_field_is_answered_with_one_write_per_foreign_write() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Pair").await;
    kind.create(&ns, "fought", json!({"greeting": "ours"}), &[])
        .await;
    let (operator, addr) = start_measured(&ns, &kind);
    let parents = kind.api(&ns);
    wait_ready_and_synced(&parents, "fought").await;
    let updates = |addr: String| async move {
        support::faults::metric(&addr, "trellis_child_operations", &["op=\"update\""]).await
    };
    let before = updates(addr.clone()).await;
    let cms: Api<ConfigMap> = ns.api();
    let foreign = 10;
    let started = std::time::Instant::now();
    for i in 0..foreign {
        let patch = json!({"data": {"greeting": format!("theirs {i}")}});
        cms.patch(
            "fought-config",
            &kube::api::PatchParams::apply("someone-else").force(),
            &kube::api::Patch::Apply(&json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "fought-config"},
                "data": patch["data"],
            })),
        )
        .await
        .expect("foreign write");
        support::operator::wait_data(&cms, "fought-config", "restored", "greeting", "ours").await;
    }
    let per_write = started.elapsed() / foreign;
    tokio::time::sleep(support::operator::QUIET).await;
    let answered = updates(addr).await - before;
    eprintln!(
        "[faults] second writer: {foreign} foreign writes answered by {answered} writes, restored in {per_write:.2?} each on average"
    );
    assert!(
        answered >= foreign as f64 && answered <= foreign as f64 + 1.0,
        "{answered} writes for {foreign} foreign writes"
    );
    operator.stop().await;
}
