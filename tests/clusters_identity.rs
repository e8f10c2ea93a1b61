//! A rule's account (`serviceAccountName`) in a spoke, end to end with two
//! real control planes (see `tests/clusters.rs`): the spoke's Secret holds
//! credentials that may impersonate, and the rule's child writes there are
//! sent as `system:serviceaccount:<operator namespace>:<account>`. Without
//! RBAC for that account in the spoke the child is refused, naming the
//! account and the cluster; with the role `trellis rbac --cluster` prints
//! bound to it, the child is made.
mod support;

#[path = "clusters/hub.rs"]
mod hub;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

use hub::{SPOKE, setup};
use support::eventually;
use support::operator::{Operator, WAIT, rule_set};

const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: placed
spec:
  serviceAccountName: writer
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: remote
      apiVersion: v1
      kind: ConfigMap
      cluster: "'spoke-1'"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-remote" }}
        data:
          v: "1"
"#;

/// Creates `role` with `client` and binds it to the ServiceAccount
/// `namespace/account`.
async fn bind(client: &kube::Client, role: &Value, namespace: &str, account: &str) -> String {
    let role: ClusterRole = serde_json::from_value(role.clone()).expect("ClusterRole");
    let name = role.name_any();
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create ClusterRole");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }))
    .expect("ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create ClusterRoleBinding");
    name
}

#[tokio::test]
async fn a_rules_account_writes_in_the_spoke_as_itself() {
    let mut s = setup("clusters-account").await;
    let ns = s.ns.name().to_owned();
    let text = s.kind.rule(RULE);
    let set = rule_set(&[&text]);
    let rules: Vec<&trellis::rules::CompiledRule> = set.rules.iter().map(|r| r.as_ref()).collect();
    let prefix = format!("t-{ns}");

    // At home: the account exists and may read what the rule reads (the
    // preflight), as `trellis rbac` prints it.
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "writer"}})).expect("sa");
    Api::<ServiceAccount>::namespaced(s.ns.client.clone(), &ns)
        .create(&PostParams::default(), &account)
        .await
        .expect("account at home");
    let home_roles = trellis::rbac::cluster_roles(&set, &prefix, false);
    let home_role = home_roles
        .iter()
        .find(|r| r["metadata"]["annotations"]["trellis.dev/rule"] == "placed")
        .expect("the rule's account role");
    let name = bind(&s.ns.client, home_role, &ns, "writer").await;
    s.cleanup.add::<ClusterRole>(&name);
    s.cleanup.add::<ClusterRoleBinding>(&name);

    // The spoke's Secret: its admin, who may impersonate anyone.
    s.register(&s.spoke.kubeconfig).await;
    let mut options = trellis::operator::Options::new(vec![], vec![ns.clone()]);
    options.instance = "clusters-account".into();
    options.operator_namespace = ns.clone();
    let operator = Operator::spawn(options, set.clone(), &s.ns.client);
    let parent = DynamicObject::new("p", &s.kind.resource)
        .within(&ns)
        .data(json!({"spec": {}}));
    s.parents()
        .create(&PostParams::default(), &parent)
        .await
        .expect("create parent");

    // No RBAC for the account in the spoke: refused, naming the account
    // and the cluster, and nothing made there.
    let user = format!("system:serviceaccount:{ns}:writer");
    eventually("the spoke write refused to the account", WAIT, || async {
        let synced = s.condition("p", "Synced").await;
        let message = synced["message"].as_str().unwrap_or_default();
        (synced["status"] == "False"
            && message.contains(&user)
            && message.contains(&format!("in cluster {SPOKE}")))
        .then_some(())
        .ok_or(synced.to_string())
    })
    .await;
    assert!(
        s.events_about("p").await.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&user) && n.contains(SPOKE))),
        "a Warning on the parent names the account and the cluster"
    );
    assert!(
        s.spoke_configmaps()
            .get_opt("p-remote")
            .await
            .expect("get")
            .is_none(),
        "the Secret's admin credentials were not used for the write"
    );

    // `trellis rbac --cluster spoke-1`: the rule's role there, bound to
    // the account (of the operator's namespace, as at home).
    let spoke_roles = trellis::rbac::spoke_roles(&rules, &prefix, SPOKE);
    let rule_role = spoke_roles
        .iter()
        .find(|r| r["metadata"]["annotations"]["trellis.dev/rule"] == "placed")
        .expect("the rule's role in the spoke");
    bind(&s.spoke_client, rule_role, &ns, "writer").await;
    eventually(
        "the child made in the spoke as the account",
        WAIT,
        || async {
            let cm = s
                .spoke_configmaps()
                .get_opt("p-remote")
                .await
                .map_err(|e| e.to_string())?;
            let synced = s.condition("p", "Synced").await;
            match cm {
                Some(cm) if synced["status"] == "True" => Ok(cm),
                other => Err(format!("made: {}, Synced {synced}", other.is_some())),
            }
        },
    )
    .await;
    let managers: Vec<String> = s
        .spoke_configmaps()
        .get("p-remote")
        .await
        .expect("child")
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.iter().any(|m| m.starts_with("trellis/")),
        "{managers:?}"
    );
    operator.stop().await;
}
