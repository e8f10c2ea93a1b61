//! Per-rule identity (`serviceAccountName:`) on the real control plane, with
//! trellis running as a non-admin identity: a ServiceAccount of the test's
//! namespace (which is also the operator's namespace, where the rules'
//! accounts live), bound only to the operator role `trellis rbac` prints,
//! and authenticating with its own token (TokenRequest API), so that it can
//! impersonate — an impersonated client cannot impersonate again.

mod support;

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use support::TestNamespace;
use support::operator::{
    Cleanup, Operator, QUIET, TestKind, WAIT, assert_absent, install_kind, rule_set,
    wait_condition_reason, wait_exists,
};

/// A rule `name` for `kind` acting as `account`: one ConfigMap child in the
/// parent's namespace.
fn rule(kind: &TestKind, name: &str, account: Option<&str>) -> String {
    rule_with(kind, name, account, false)
}

/// Like [`rule`], with a second ConfigMap child in `spec.elsewhere` when
/// the parent names it (so the rule reads ConfigMaps in every namespace).
fn rule_with(kind: &TestKind, name: &str, account: Option<&str>, away: bool) -> String {
    let away = if away {
        AWAY.replace("{name}", name)
    } else {
        String::new()
    };
    let account = account
        .map(|a| format!("  serviceAccountName: {a}\n"))
        .unwrap_or_default();
    kind.rule(&format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {{name: {name}}}
spec:
{account}  parent: {{apiVersion: "@API_VERSION@", kind: "@KIND@"}}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-{name}" }}}}
        data:
          by: {name}
{away}"#
    ))
}

const AWAY: &str = r#"    - id: away
      apiVersion: v1
      kind: ConfigMap
      allowCrossNamespace: true
      includeWhen: "spec.elsewhere is defined"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-{name}-away" }}
          namespace: {{ spec.elsewhere }}
        data:
          by: {name}
"#;

/// Creates the ServiceAccount `name` in `ns`.
async fn service_account(ns: &TestNamespace, name: &str) {
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("ServiceAccount");
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await
        .unwrap_or_else(|e| panic!("creating ServiceAccount {name}: {e}"));
}

/// A client authenticating as the ServiceAccount `ns/name` with a token of
/// its own, made by the TokenRequest API.
async fn token_client(ns: &TestNamespace, name: &str) -> Client {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = ns
        .api::<ServiceAccount>()
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {name}: {e}"))
        .status
        .expect("the token request's status")
        .token;
    let admin = &support::cluster().kubeconfig;
    let context = admin
        .current_context
        .as_ref()
        .and_then(|c| admin.contexts.iter().find(|n| &n.name == c))
        .and_then(|c| c.context.as_ref())
        .expect("the admin kubeconfig's context");
    let cluster = admin
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .expect("the admin kubeconfig's cluster");
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [serde_json::to_value(cluster).expect("cluster")],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": cluster.name, "user": name}}],
        "current-context": name,
    });
    let kubeconfig = Kubeconfig::from_yaml(&kubeconfig.to_string()).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// Creates the ClusterRole `role` and binds it cluster-wide to `ns/account`.
async fn bind_cluster_role(
    ns: &TestNamespace,
    role: &Value,
    account: &str,
    cleanup: &mut Cleanup,
) -> String {
    let role: ClusterRole = serde_json::from_value(role.clone()).expect("ClusterRole");
    let name = role.metadata.name.clone().expect("a name");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns.name()}],
    }))
    .expect("ClusterRoleBinding");
    cleanup.add::<ClusterRole>(&name);
    cleanup.add::<ClusterRoleBinding>(&name);
    Api::<ClusterRole>::all(ns.client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create ClusterRole");
    Api::<ClusterRoleBinding>::all(ns.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create ClusterRoleBinding");
    name
}

/// Binds the ClusterRole `role` to `ns/account` in namespace `within` only.
async fn role_binding(ns: &TestNamespace, within: &str, role: &str, account: &str) -> String {
    let name = format!("{role}-{account}");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": within},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns.name()}],
    }))
    .expect("RoleBinding");
    Api::<RoleBinding>::namespaced(ns.client.clone(), within)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create RoleBinding");
    name
}

fn attributes(verb: &str, resource: &str, namespace: &str) -> ResourceAttributes {
    ResourceAttributes {
        verb: Some(verb.into()),
        resource: Some(resource.into()),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

/// Whether the API server allows `ns/account` `attrs` now.
async fn allowed(ns: &TestNamespace, account: &str, attrs: &ResourceAttributes) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{}:{account}", ns.name())),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", ns.name()),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(attrs.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(ns.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

/// Waits until the authorizer (which learns of bindings through a watch)
/// answers `want` for `ns/account` and `attrs`.
async fn wait_allowed(ns: &TestNamespace, account: &str, attrs: ResourceAttributes, want: bool) {
    let what = format!("{account} allowed={want} for {attrs:?}");
    support::eventually(&what, WAIT, || async {
        (allowed(ns, account, &attrs).await == want)
            .then_some(())
            .ok_or("not yet")
    })
    .await;
}

/// What the test sets up: the operator's account bound to the operator
/// role `trellis rbac` prints for `printed`, each rule's account bound to
/// its rule role in the test's namespace only, and a client acting as the
/// operator.
struct Identity {
    operator_client: Client,
    /// Operator role name (its rule roles are `<name>-rule-<rule>`).
    name: String,
}

async fn set_up(
    ns: &TestNamespace,
    printed: &trellis::rules::RuleSet,
    accounts: &[&str],
    cleanup: &mut Cleanup,
) -> Identity {
    let name = support::unique_name("trellis-id");
    let roles = trellis::rbac::cluster_roles(printed, &name, false);
    service_account(ns, "operator").await;
    bind_cluster_role(ns, &roles[0], "operator", cleanup).await;
    for account in accounts {
        service_account(ns, account).await;
    }
    for role in &roles[1..] {
        let rule = role["metadata"]["annotations"]["trellis.dev/rule"]
            .as_str()
            .expect("the rule a role is for");
        let account = printed
            .get(rule)
            .and_then(|r| r.rule.spec.service_account_name.clone())
            .expect("the rule's account");
        // Created, but bound only within the test's namespace.
        let role: ClusterRole = serde_json::from_value(role.clone()).expect("ClusterRole");
        let role_name = role.metadata.name.clone().expect("a name");
        cleanup.add::<ClusterRole>(&role_name);
        Api::<ClusterRole>::all(ns.client.clone())
            .create(&PostParams::default(), &role)
            .await
            .expect("create the rule's ClusterRole");
        role_binding(ns, ns.name(), &role_name, &account).await;
        wait_allowed(
            ns,
            &account,
            attributes("create", "configmaps", ns.name()),
            true,
        )
        .await;
    }
    wait_allowed(
        ns,
        "operator",
        ResourceAttributes {
            verb: Some("create".into()),
            group: Some("authorization.k8s.io".into()),
            resource: Some("subjectaccessreviews".into()),
            ..Default::default()
        },
        true,
    )
    .await;
    Identity {
        operator_client: token_client(ns, "operator").await,
        name,
    }
}

fn options(ns: &TestNamespace) -> (trellis::operator::Options, std::net::SocketAddr) {
    let addr = support::faults::free_address();
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    options.operator_namespace = ns.name().to_owned();
    options.metrics_addr = Some(addr);
    (options, addr)
}

/// Waits until `/status` shows `rule` in `state`; its entry.
async fn wait_rule_state(addr: std::net::SocketAddr, rule: &str, state: &str) -> Value {
    support::eventually(&format!("rule {rule} {state}"), WAIT, || async {
        let body = support::http_get(addr, "/status").await?;
        let status: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let entry = status["rules"][rule].clone();
        (entry["state"] == state)
            .then_some(entry.clone())
            .ok_or(entry.to_string())
    })
    .await
}

/// The operator's own identity may not write ConfigMaps: what its rules'
/// children are made of comes from their accounts.
async fn assert_operator_may_not_create_configmaps(client: &Client, namespace: &str) {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attributes("create", "configmaps", namespace)),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SelfSubjectAccessReview");
    assert!(
        !answer.status.is_some_and(|s| s.allowed),
        "the operator's role must not let it create ConfigMaps"
    );
}

/// Audit events (metadata level: every write) after byte `offset` of the
/// shared control plane's audit log.
fn audit_events(offset: usize) -> Vec<Value> {
    let path = support::node::state_dir().join("logs/audit.log");
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    String::from_utf8_lossy(text.get(offset..).unwrap_or_default())
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn audit_len() -> usize {
    std::fs::metadata(support::node::state_dir().join("logs/audit.log"))
        .map(|m| m.len() as usize)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_are_written_as_the_rules_account_and_a_namespace_it_may_not_write_is_refused() {
    let ns = support::namespace().await;
    let other = support::namespace_for("identity-other").await;
    let (kind, mut cleanup) = install_kind(&ns, "Site").await;
    let set = rule_set(&[&rule_with(&kind, "site", Some("writer"), true)]);
    let identity = set_up(&ns, &set, &["writer"], &mut cleanup).await;
    // The `away` child lives in another namespace: the account reads
    // ConfigMaps there (the rule's caches must not read what it cannot),
    // but may not write them.
    let reader = bind_cluster_role(
        &ns,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": format!("{}-read", identity.name)},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
        }),
        "writer",
        &mut cleanup,
    )
    .await;
    wait_allowed(
        &ns,
        "writer",
        attributes("list", "configmaps", other.name()),
        true,
    )
    .await;
    assert!(
        !allowed(
            &ns,
            "writer",
            &attributes("create", "configmaps", other.name())
        )
        .await
    );
    assert_operator_may_not_create_configmaps(&identity.operator_client, ns.name()).await;
    assert!(!reader.is_empty());

    let audit_from = audit_len();
    let (options, addr) = options(&ns);
    let operator = Operator::spawn(options, set, &identity.operator_client);
    wait_rule_state(addr, "site", "Running").await;
    kind.create(&ns, "home", json!({}), &[]).await;
    let cms = ns.api::<ConfigMap>();
    let made = wait_exists(&cms, "home-site").await;
    assert_eq!(
        made.data.and_then(|d| d.get("by").cloned()).as_deref(),
        Some("site")
    );

    // The audit log: the create came from the operator's credentials,
    // acting as the rule's account.
    let writer = format!("system:serviceaccount:{}:writer", ns.name());
    let operator_user = format!("system:serviceaccount:{}:operator", ns.name());
    let audited = support::eventually("the child's write in the audit log", WAIT, || async {
        let events = audit_events(audit_from);
        let writes: Vec<Value> = events
            .into_iter()
            .filter(|e| {
                e["stage"] == "ResponseComplete"
                    && e["objectRef"]["resource"] == "configmaps"
                    && e["objectRef"]["namespace"] == ns.name()
                    && e["objectRef"]["name"] == "home-site"
            })
            .collect();
        if writes.is_empty() {
            Err("no write of home-site yet".to_owned())
        } else {
            Ok(writes)
        }
    })
    .await;
    for write in &audited {
        assert_eq!(write["user"]["username"], operator_user.as_str(), "{write}");
        assert_eq!(
            write["impersonatedUser"]["username"],
            writer.as_str(),
            "every write of the child is the rule's account's: {write}"
        );
    }
    assert!(
        audited.iter().any(|w| w["responseStatus"]["code"]
            .as_u64()
            .is_some_and(|c| c < 300)),
        "the create succeeded as the account: {audited:?}"
    );

    // A child in a namespace the account may not write: ApplyError naming
    // the account, the verb and the resource; nothing is written there, and
    // the other child stays.
    kind.create(&ns, "far", json!({"elsewhere": other.name()}), &[])
        .await;
    let parent =
        wait_condition_reason(&kind.api(&ns), "far", "Synced", "False", "ApplyError").await;
    let message = support::operator::condition(&parent, "Synced")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains(&writer), "{message}");
    assert!(message.contains("may not"), "{message}");
    assert!(message.contains("configmaps"), "{message}");
    assert!(message.contains(other.name()), "{message}");
    wait_exists(&cms, "far-site").await;
    tokio::time::sleep(QUIET).await;
    assert_absent(
        &other.api::<ConfigMap>(),
        "far-site-away",
        "the account may not write there",
    )
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_whose_account_may_not_list_a_related_kind_stays_inactive_and_writes_nothing() {
    let ns = support::namespace().await;
    let (kind, mut cleanup) = install_kind(&ns, "Peek").await;
    let text = rule(&kind, "peek", Some("peeker")).replace(
        "  children:\n",
        "  related:\n    - id: creds\n      apiVersion: v1\n      kind: Secret\n      name: creds\n      optional: true\n  children:\n",
    );
    let set = rule_set(&[&text]);
    let identity = set_up(&ns, &set, &["peeker"], &mut cleanup).await;
    // The account loses its reads of Secrets: its role without them.
    let role_name = trellis::rbac::account_role_name(&identity.name, "peek");
    let roles: Api<ClusterRole> = Api::all(ns.client.clone());
    let mut role = roles.get(&role_name).await.expect("the rule's role");
    role.rules.get_or_insert_default().retain(|r| {
        !r.resources
            .as_ref()
            .is_some_and(|rs| rs.iter().any(|x| x == "secrets"))
    });
    roles
        .replace(&role_name, &PostParams::default(), &role)
        .await
        .expect("the role without secrets");
    wait_allowed(
        &ns,
        "peeker",
        attributes("list", "secrets", ns.name()),
        false,
    )
    .await;

    let (options, addr) = options(&ns);
    let operator = Operator::spawn(options, set, &identity.operator_client);
    let state = wait_rule_state(addr, "peek", "Inactive").await;
    let reason = state["reason"].as_str().unwrap_or_default();
    let account = format!("ServiceAccount {}/peeker", ns.name());
    assert!(reason.contains(&account), "{reason}");
    assert!(
        reason.contains(&format!("list secrets in namespace {}", ns.name())),
        "{reason}"
    );
    let metrics = support::http_get(addr, "/metrics").await.expect("metrics");
    assert!(
        metrics.contains("trellis_rule_account_denied{rule=\"peek\"} 1"),
        "{metrics}"
    );
    kind.create(&ns, "p", json!({}), &[]).await;
    tokio::time::sleep(QUIET).await;
    assert_absent(&ns.api::<ConfigMap>(), "p-peek", "the rule is inactive").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_the_operator_may_not_impersonate_keeps_its_rule_inactive_while_others_run() {
    let ns = support::namespace().await;
    let (kind, mut cleanup) = install_kind(&ns, "Pair").await;
    let good = rule(&kind, "good", Some("writer"));
    // The role is printed for `good` alone: `stranger` is not in it.
    let identity = set_up(&ns, &rule_set(&[&good]), &["writer"], &mut cleanup).await;
    service_account(&ns, "stranger").await;
    let sneaky = rule(&kind, "sneaky", Some("stranger"));
    let (options, addr) = options(&ns);
    let operator = Operator::spawn(
        options,
        rule_set(&[&good, &sneaky]),
        &identity.operator_client,
    );
    let state = wait_rule_state(addr, "sneaky", "Inactive").await;
    let reason = state["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("impersonate"), "{reason}");
    assert!(reason.contains("stranger"), "{reason}");
    wait_rule_state(addr, "good", "Running").await;
    kind.create(&ns, "p", json!({}), &[]).await;
    wait_exists(&ns.api::<ConfigMap>(), "p-good").await;
    assert_absent(&ns.api::<ConfigMap>(), "p-sneaky", "its rule is inactive").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_that_does_not_exist_keeps_its_rule_inactive() {
    let ns = support::namespace().await;
    let (kind, mut cleanup) = install_kind(&ns, "Ghost").await;
    let set = rule_set(&[&rule(&kind, "ghost", Some("nobody"))]);
    // The role names `nobody`, but no such ServiceAccount is made.
    let identity = set_up(&ns, &set, &[], &mut cleanup).await;
    let (options, addr) = options(&ns);
    let operator = Operator::spawn(options, set, &identity.operator_client);
    let state = wait_rule_state(addr, "ghost", "Inactive").await;
    let reason = state["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "ServiceAccount {}/nobody does not exist",
            ns.name()
        )),
        "{reason}"
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_accounts_binding_makes_a_running_rule_inactive_at_the_next_check() {
    let ns = support::namespace().await;
    let (kind, mut cleanup) = install_kind(&ns, "Lapse").await;
    let set = rule_set(&[&rule(&kind, "lapse", Some("writer"))]);
    let identity = set_up(&ns, &set, &["writer"], &mut cleanup).await;
    let (mut options, addr) = options(&ns);
    options.account_recheck = Duration::from_secs(1);
    let operator = Operator::spawn(options, set, &identity.operator_client);
    wait_rule_state(addr, "lapse", "Running").await;
    kind.create(&ns, "p", json!({}), &[]).await;
    let cms = ns.api::<ConfigMap>();
    let child = wait_exists(&cms, "p-lapse").await;

    let binding = format!(
        "{}-writer",
        trellis::rbac::account_role_name(&identity.name, "lapse")
    );
    ns.api::<RoleBinding>()
        .delete(&binding, &DeleteParams::default())
        .await
        .expect("revoke the binding");
    let state = wait_rule_state(addr, "lapse", "Inactive").await;
    let reason = state["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("ServiceAccount {}/writer may not", ns.name())),
        "{reason}"
    );
    // Its children are left as they are.
    tokio::time::sleep(QUIET).await;
    let still = cms.get("p-lapse").await.expect("the child stays");
    assert_eq!(still.metadata.uid, child.metadata.uid);
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_service_account_rejects_a_rule_without_one_while_the_others_run() {
    let ns = support::namespace().await;
    let (kind, mut cleanup) = install_kind(&ns, "Strict").await;
    let with = rule(&kind, "with", Some("writer"));
    let without = rule(&kind, "without", None);
    let set = rule_set(&[&with, &without]);
    let identity = set_up(&ns, &set, &["writer"], &mut cleanup).await;
    // The rules come from a directory, through the reload path `trellis
    // run` takes (the in-process start hands over an empty set).
    let dir = tempfile::tempdir().expect("rules dir");
    std::fs::write(dir.path().join("with.yaml"), &with).unwrap();
    std::fs::write(dir.path().join("without.yaml"), &without).unwrap();
    let (mut options, addr) = options(&ns);
    options.rules = vec![dir.path().to_path_buf()];
    options.require_service_account = true;
    let operator = Operator::spawn(
        options,
        trellis::rules::RuleSet::default(),
        &identity.operator_client,
    );
    wait_rule_state(addr, "with", "Running").await;
    let status: Value =
        serde_json::from_str(&support::http_get(addr, "/status").await.expect("/status"))
            .expect("json");
    assert_eq!(status["rules"]["without"]["state"], "Rejected", "{status}");
    let why = status["rules"]["without"]["rejected"].to_string();
    assert!(why.contains("--require-service-account"), "{why}");
    kind.create(&ns, "p", json!({}), &[]).await;
    wait_exists(&ns.api::<ConfigMap>(), "p-with").await;
    tokio::time::sleep(QUIET).await;
    assert_absent(&ns.api::<ConfigMap>(), "p-without", "its rule is rejected").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_dry_runs_each_childs_write_as_the_rules_account() {
    use trellis::diff::ChildChange;
    use trellis::diff::live::{Target, diff_as};
    let ns = support::namespace().await;
    let other = support::namespace_for("identity-diff-other").await;
    let (kind, mut cleanup) = install_kind(&ns, "Dry").await;
    let set = rule_set(&[&rule_with(&kind, "dry", Some("writer"), true)]);
    set_up(&ns, &set, &["writer"], &mut cleanup).await;
    kind.create(&ns, "far", json!({"elsewhere": other.name()}), &[])
        .await;
    let manifest = json!({
        "apiVersion": kind.api_version(),
        "kind": kind.kind,
        "metadata": {"name": "far", "namespace": ns.name()},
    });
    let changes = |report: trellis::diff::live::Report| -> Vec<(String, ChildChange)> {
        report.diffs[0]
            .children
            .iter()
            .map(|c| (c.id.clone(), c.change.clone()))
            .collect()
    };
    // As the account: its own namespace is writable, the other one is not.
    let report = diff_as(&ns.client, &set, &Target::Parent(&manifest), ns.name())
        .await
        .expect("diff");
    let as_account = changes(report);
    let writer = format!("system:serviceaccount:{}:writer", ns.name());
    for (id, change) in &as_account {
        match (id.as_str(), change) {
            ("config", ChildChange::Create { .. }) => {}
            ("away", ChildChange::Refused { why }) => {
                assert!(why.contains(&writer), "{why}");
                assert!(why.contains(other.name()), "{why}");
            }
            other => panic!("unexpected {other:?} in {as_account:?}"),
        }
    }
    assert_eq!(as_account.len(), 2, "{as_account:?}");
    // The same rule without an account dry-runs with the caller's (admin)
    // rights: the other namespace is writable then.
    let plain = rule_set(&[&rule_with(&kind, "dry", None, true)]);
    let report = diff_as(&ns.client, &plain, &Target::Parent(&manifest), ns.name())
        .await
        .expect("diff");
    assert!(
        changes(report)
            .iter()
            .all(|(_, c)| matches!(c, ChildChange::Create { .. })),
        "without an account both children would be created"
    );
    assert_absent(
        &other.api::<ConfigMap>(),
        "far-dry-away",
        "a diff writes nothing",
    )
    .await;
}
