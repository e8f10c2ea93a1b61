//! A rule with `rollout:` keeps its revision ConfigMaps in the operator's
//! namespace; the operator's preflight asks for exactly the verbs `trellis
//! rbac` grants there, so a Role without one keeps the rule Inactive,
//! naming it, instead of running with a revision watch that fails forever.
//!
//! The operator runs in-process as a ServiceAccount bound to what `trellis
//! rbac` prints: the ClusterRole cluster-wide and the Role in the operator's
//! namespace, which is a namespace of its own here (not the one watched),
//! so only that Role grants ConfigMaps there. The rule's child is a Secret,
//! so the ClusterRole grants no ConfigMaps at all. A rule without
//! `rollout:` runs under a Role that grants no ConfigMaps, without a 403.
mod support;

use std::net::SocketAddr;

use k8s_openapi::api::authorization::v1::ResourceAttributes;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use trellis::operator::Options;

use support::TestNamespace;
use support::operator::{
    Cleanup, LogCapture, Operator, QUIET, TestKind, WAIT, assert_absent, install_kind, rule_set,
    service_account_with_role, wait_allowed, wait_exists,
};

/// One Secret per parent, staged by `rollout:`.
const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: @RULE@
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: secret
      apiVersion: v1
      kind: Secret
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-secret" }}
        stringData:
          greeting: hello
  rollout:
    steps:
      - percent: 50
"#;

/// The operator, watching `ns`, with `home` as its own namespace.
struct Running {
    operator: Operator,
    addr: SocketAddr,
}

impl Running {
    /// Binds what `trellis rbac` prints for `rule` to a ServiceAccount —
    /// the Role in `home` without `drop_verb` on ConfigMaps — and starts
    /// the operator as it.
    async fn start(
        ns: &TestNamespace,
        home: &TestNamespace,
        rule: &str,
        drop_verb: Option<&str>,
        cleanup: &mut Cleanup,
    ) -> Running {
        let set = rule_set(&[rule]);
        let name = support::unique_name("trellis-rollout-rbac");
        let mut role = trellis::rbac::namespaced_role(&set, &name, home.name());
        let granted = role["rules"]
            .as_array_mut()
            .expect("rules")
            .iter_mut()
            .find(|r| r["resources"] == json!(["configmaps"]))
            .expect("the Role grants the revision ConfigMaps");
        if let Some(verb) = drop_verb {
            let verbs = granted["verbs"].as_array_mut().expect("verbs");
            let before = verbs.len();
            verbs.retain(|v| v != verb);
            assert_eq!(verbs.len(), before - 1, "the Role granted {verb}");
        }
        bind_role(home, ns, role).await;
        let cluster_role = trellis::rbac::cluster_role(&set, &name);
        assert!(
            !cluster_role.to_string().contains("\"configmaps\""),
            "only the Role grants ConfigMaps: {cluster_role}"
        );
        let secrets = ResourceAttributes {
            resource: Some("secrets".into()),
            verb: Some("list".into()),
            namespace: Some(ns.name().to_owned()),
            ..Default::default()
        };
        let client = service_account_with_role(ns, cluster_role, secrets, cleanup).await;
        // The Role's binding takes effect on its own time: wait for a verb
        // it still grants.
        let kept = if drop_verb == Some("create") {
            "patch"
        } else {
            "create"
        };
        wait_allowed(
            &client,
            ResourceAttributes {
                resource: Some("configmaps".into()),
                verb: Some(kept.into()),
                namespace: Some(home.name().to_owned()),
                ..Default::default()
            },
        )
        .await;
        Running::spawn(ns, home, &client, set)
    }

    fn spawn(
        ns: &TestNamespace,
        home: &TestNamespace,
        client: &Client,
        set: trellis::rules::RuleSet,
    ) -> Running {
        let addr = free_local_addr();
        let options = Options {
            instance: "test".into(),
            metrics_addr: Some(addr),
            operator_namespace: home.name().to_owned(),
            ..Options::new(vec![], vec![ns.name().to_owned()])
        };
        Running {
            operator: Operator::spawn(options, set, client),
            addr,
        }
    }

    /// `rules.<rule>` of `/status` once its state is `state`.
    async fn wait_state(&self, rule: &str, state: &str) -> Value {
        support::eventually(&format!("rule {rule} {state}"), WAIT, || async {
            let body = support::http_get(self.addr, "/status").await?;
            let status: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
            let entry = status["rules"][rule].clone();
            if entry["state"] == state {
                Ok(entry)
            } else {
                Err(format!("rules.{rule} = {entry}"))
            }
        })
        .await
    }
}

/// Creates `role` (a Role manifest in `home`) and binds it to the
/// ServiceAccount `trellis` of `ns`, the one the operator runs as. Both go
/// with `home`.
async fn bind_role(home: &TestNamespace, ns: &TestNamespace, role: Value) {
    let role: Role = serde_json::from_value(role).expect("Role");
    let name = role.metadata.name.clone().expect("the Role has a name");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": home.name()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "trellis", "namespace": ns.name()}],
    }))
    .expect("RoleBinding");
    home.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .expect("create Role");
    home.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .expect("create RoleBinding");
}

/// The operator's namespace, the watched one, a fresh parent kind, and
/// [`RULE`] for it: its text and its name.
struct Setup {
    home: TestNamespace,
    ns: TestNamespace,
    kind: TestKind,
    cleanup: Cleanup,
    rule: String,
    name: String,
}

async fn setup(test: &str) -> Setup {
    let home = support::namespace_for(&format!("{test}-home")).await;
    let ns = support::namespace_for(test).await;
    let (kind, cleanup) = install_kind(&ns, "Site").await;
    let name = support::unique_name("staged");
    let rule = kind.rule(RULE).replace("@RULE@", &name);
    Setup {
        home,
        ns,
        kind,
        cleanup,
        rule,
        name,
    }
}

/// Log lines with a 403 in them: none, when the preflight did its job.
fn forbidden_lines(logs: &LogCapture) -> Vec<String> {
    logs.lines()
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
        .collect()
}

/// Runs the operator with the Role lacking `verb` on ConfigMaps: the rule
/// is Inactive naming exactly that, writes nothing and meets no 403.
async fn inactive_without(verb: &str, test: &str) {
    let logs = LogCapture::start();
    let Setup {
        home,
        ns,
        kind,
        mut cleanup,
        rule,
        name,
    } = setup(test).await;
    let running = Running::start(&ns, &home, &rule, Some(verb), &mut cleanup).await;
    kind.create(&ns, "shop", json!({}), &[]).await;

    let entry = running.wait_state(&name, "Inactive").await;
    assert_eq!(
        entry["reason"],
        format!(
            "trellis may not {verb} configmaps in namespace {}; grant what `trellis rbac` prints",
            home.name()
        ),
        "exactly the missing verb, on the revision ConfigMaps, where they live"
    );
    tokio::time::sleep(QUIET).await;
    let secrets: Api<Secret> = ns.api();
    assert_absent(&secrets, "shop-secret", "the rule is inactive").await;
    assert_eq!(
        revision_configmaps(&home, &name).await,
        Vec::<String>::new()
    );
    assert_eq!(forbidden_lines(&logs), Vec::<String>::new());
    running.operator.stop().await;
}

/// Without the preflight's question the rule ran, and its revision watch
/// failed every few seconds while the rollout never moved.
#[tokio::test]
async fn a_role_without_watch_on_configmaps_keeps_a_rollout_rule_inactive_naming_it() {
    inactive_without("watch", "rollout-rbac-no-watch").await;
}

/// The preflight runs before the revision ConfigMaps are first listed:
/// Inactive naming `list`, not Waiting on a 403.
#[tokio::test]
async fn a_role_without_list_on_configmaps_keeps_a_rollout_rule_inactive_naming_it() {
    inactive_without("list", "rollout-rbac-no-list").await;
}

#[tokio::test]
async fn with_the_role_trellis_rbac_prints_a_rollout_rule_runs() {
    let logs = LogCapture::start();
    let Setup {
        home,
        ns,
        kind,
        mut cleanup,
        rule,
        name,
    } = setup("rollout-rbac-granted").await;
    let running = Running::start(&ns, &home, &rule, None, &mut cleanup).await;
    kind.create(&ns, "shop", json!({}), &[]).await;

    running.wait_state(&name, "Running").await;
    let secrets: Api<Secret> = ns.api();
    wait_exists(&secrets, "shop-secret").await;
    // The first version is kept in the operator's namespace.
    support::eventually("the revision ConfigMap", WAIT, || async {
        let names = revision_configmaps(&home, &name).await;
        if names.is_empty() { Err(names) } else { Ok(()) }
    })
    .await;
    // A few rollout ticks: the revision watch and writes are allowed.
    tokio::time::sleep(QUIET).await;
    running.wait_state(&name, "Running").await;
    assert_eq!(forbidden_lines(&logs), Vec::<String>::new());
    running.operator.stop().await;
}

/// The names of `rule`'s revision ConfigMaps in `home`.
async fn revision_configmaps(home: &TestNamespace, rule: &str) -> Vec<String> {
    let cms: Api<ConfigMap> = home.api();
    cms.list(&ListParams::default().labels(&format!("trellis.dev/revision-of={rule}")))
        .await
        .expect("list revision ConfigMaps")
        .items
        .iter()
        .map(|cm| cm.name_any())
        .collect()
}

/// A rule without `rollout:` needs no ConfigMaps in the operator's
/// namespace (the Role grants none then): it runs, and looking for leftover
/// revisions of it once is not a 403 every tick.
#[tokio::test]
async fn a_rule_without_rollout_runs_with_no_configmaps_granted_in_the_operator_namespace() {
    let logs = LogCapture::start();
    let Setup {
        home,
        ns,
        kind,
        mut cleanup,
        rule,
        name,
    } = setup("rollout-rbac-none").await;
    let rule = rule.replace("  rollout:\n    steps:\n      - percent: 50\n", "");
    let set = rule_set(&[&rule]);
    assert!(set.rules[0].rollout.is_none(), "{rule}");
    let role_name = support::unique_name("trellis-no-rollout");
    let role = trellis::rbac::namespaced_role(&set, &role_name, home.name());
    assert!(
        !role.to_string().contains("\"configmaps\""),
        "no ConfigMaps granted: {role}"
    );
    bind_role(&home, &ns, role).await;
    let secrets = ResourceAttributes {
        resource: Some("secrets".into()),
        verb: Some("list".into()),
        namespace: Some(ns.name().to_owned()),
        ..Default::default()
    };
    let cluster_role = trellis::rbac::cluster_role(&set, &role_name);
    let client = service_account_with_role(&ns, cluster_role, secrets, &mut cleanup).await;
    let running = Running::spawn(&ns, &home, &client, set);
    kind.create(&ns, "shop", json!({}), &[]).await;

    running.wait_state(&name, "Running").await;
    let secrets: Api<Secret> = ns.api();
    wait_exists(&secrets, "shop-secret").await;
    // Three of the rollout's 2 s ticks.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(forbidden_lines(&logs), Vec::<String>::new());
    let notices: Vec<String> = logs
        .lines()
        .into_iter()
        .filter(|l| l.contains("not looking for leftover revision ConfigMaps"))
        .collect();
    assert_eq!(notices.len(), 1, "said once: {notices:?}");
    running.operator.stop().await;
}

fn free_local_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}
