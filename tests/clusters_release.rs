//! Children in other clusters taken away by the cleanup path rather than
//! by a parent's deletion, end to end with two real control planes (see
//! `tests/clusters.rs`): a parent leaving its rule's selector, a rule
//! removed by a reload, and a rule edit moving the spoke child home. Either way nothing is done in a spoke that does not
//! answer: the parent keeps its finalizer, told why; once the spoke answers,
//! the children there are deleted, retained ones released.
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;
#[path = "clusters/hub.rs"]
mod hub;

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use configmap_dir::ConfigMapDir;
use hub::{SPOKE, Setup, setup, spoke_status};
use support::eventually;
use support::faults::free_address;
use support::operator::{Operator, WAIT};

/// A child in the spoke (more with [`KEPT`]); parents labelled
/// `managed: "yes"` only.
const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: placed
spec:
  onRuleRemoved: delete
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
    selector: {matchLabels: {managed: "yes"}}
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

/// A retained child in the spoke, appended to [`RULE`]'s children. Without
/// it (or anything else behind the finalizer) only the spoke children make
/// the rule finalize its parents.
const KEPT: &str = r#"    - id: kept
      apiVersion: v1
      kind: ConfigMap
      cluster: "'spoke-1'"
      deletionPolicy: retain
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-kept" }}
        data:
          v: "1"
"#;

impl Setup {
    /// The operator on `rules` (a rules directory it reloads), this hub
    /// named `hub-a`.
    fn start_reloading(&self, rules: &ConfigMapDir, metrics: SocketAddr) -> Operator {
        let dir = rules.path();
        let set = trellis::rules::RuleSet::load(std::slice::from_ref(&dir), Default::default())
            .unwrap_or_else(|diags| panic!("test rules do not load: {diags:?}"));
        let mut options = trellis::operator::Options {
            reload_debounce: Duration::from_millis(200),
            reload_poll: Duration::from_secs(2),
            ..trellis::operator::Options::new(vec![dir], vec![self.ns.name().to_owned()])
        };
        options.instance = "clusters-release".into();
        options.operator_namespace = self.ns.name().to_owned();
        options.cluster_name = "hub-a".into();
        options.metrics_addr = Some(metrics);
        Operator::spawn(options, set, &self.ns.client)
    }

    /// Creates the parent `name`, selected by the rule, and waits for its
    /// `children` in the spoke.
    async fn served_parent(&self, name: &str, children: &[&str]) {
        let mut parent = DynamicObject::new(name, &self.kind.resource)
            .within(self.ns.name())
            .data(json!({"spec": {}}));
        parent.metadata.labels = Some([("managed".to_owned(), "yes".to_owned())].into());
        self.parents()
            .create(&PostParams::default(), &parent)
            .await
            .expect("create parent");
        for child in children {
            let child = format!("{name}-{child}");
            eventually(&format!("{child} made in the spoke"), WAIT, || async {
                self.spoke_configmaps()
                    .get(&child)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await;
        }
    }

    /// Stops the spoke's API server and waits until the operator sees it.
    async fn spoke_down(&self, metrics: SocketAddr) {
        self.spoke.kill("kube-apiserver", "KILL").await;
        eventually("the spoke seen unreachable", WAIT, || async {
            let status = spoke_status(metrics).await;
            (status["reachable"] == false)
                .then_some(())
                .ok_or(status.to_string())
        })
        .await;
    }

    /// A Warning on the parent `name` with reason ClusterUnreachable whose
    /// note holds `says`.
    async fn told_waiting(&self, name: &str, says: &str) {
        eventually(
            "a Warning that the parent waits for the spoke",
            WAIT,
            || async {
                let events = self.events_about(name).await;
                events
                    .iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("ClusterUnreachable")
                            && e.note
                                .as_deref()
                                .is_some_and(|n| n.contains(SPOKE) && n.contains(says))
                    })
                    .map(|_| ())
                    .ok_or(format!(
                        "{:?}",
                        events
                            .iter()
                            .map(|e| (&e.reason, &e.note))
                            .collect::<Vec<_>>()
                    ))
            },
        )
        .await;
    }

    /// Once the spoke answers: `name`'s remote child deleted there, its
    /// retained child (`kept`) kept with nothing of trellis's left, and the
    /// parent let go (no trellis finalizer).
    async fn taken_away(&self, name: &str, kept: bool) {
        let remote = format!("{name}-remote");
        let kept_name = format!("{name}-kept");
        eventually("the spoke children taken away", WAIT, || async {
            let cms: Api<ConfigMap> = self.spoke_configmaps();
            let remote = cms.get_opt(&remote).await.map_err(|e| e.to_string())?;
            let retained = cms.get_opt(&kept_name).await.map_err(|e| e.to_string())?;
            let parent = self.parent(name).await;
            let finalized = parent
                .finalizers()
                .iter()
                .any(|f| f == trellis::operator::FINALIZER);
            let released =
                |k: &ConfigMap| !k.labels().keys().any(|l| l.starts_with("trellis.dev/"));
            match (&remote, &retained) {
                (None, Some(k)) if kept && released(k) && !finalized => Ok(()),
                (None, None) if !kept && !finalized => Ok(()),
                _ => Err(format!(
                    "remote there: {}, kept labels: {:?}, finalizer: {finalized}",
                    remote.is_some(),
                    retained.map(|k| k.labels().clone())
                )),
            }
        })
        .await;
        if !kept {
            return;
        }
        let kept = self.spoke_configmaps().get(&kept_name).await.expect("kept");
        assert_eq!(
            kept.data
                .as_ref()
                .and_then(|d| d.get("v"))
                .map(String::as_str),
            Some("1"),
            "the retained child keeps its values"
        );
    }

    /// Nothing of `name`'s was taken out of the spoke (read once it answers
    /// again, before the operator can have acted: the test reads the spoke
    /// directly as soon as it is up).
    async fn both_still_there(&self, name: &str, children: &[&str]) {
        for child in children {
            let cm = self
                .spoke_configmaps()
                .get(&format!("{name}-{child}"))
                .await
                .expect("still in the spoke");
            assert_eq!(cm.labels()["trellis.dev/hub"], "hub-a", "{child} untouched");
        }
    }
}

#[tokio::test]
async fn a_parent_leaving_its_rules_selector_takes_its_spoke_children_once_the_spoke_answers() {
    let s = setup("clusters-release-scope").await;
    let metrics = free_address();
    s.register(&s.spoke.kubeconfig).await;
    // No retained child: only the spoke child puts the finalizer on.
    let rules = ConfigMapDir::new(&[("placed.yaml", &s.kind.rule(RULE))]);
    let operator = s.start_reloading(&rules, metrics);
    s.served_parent("p", &["remote"]).await;

    // The spoke down, the parent leaves the selector: it waits, saying so.
    s.spoke_down(metrics).await;
    s.parents()
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"managed": "no"}}})),
        )
        .await
        .expect("relabel the parent");
    s.told_waiting("p", "waiting to remove children").await;
    assert!(
        s.parent("p")
            .await
            .finalizers()
            .iter()
            .any(|f| f == trellis::operator::FINALIZER),
        "the parent keeps its finalizer while its spoke does not answer"
    );
    operator.stop().await;
    s.spoke.restart("kube-apiserver").await;
    s.both_still_there("p", &["remote"]).await;

    // Up again (and the operator with it): the children go, the retained
    // one released, the finalizer off, a `Released` Event.
    let operator = s.start_reloading(&rules, metrics);
    s.taken_away("p", false).await;
    eventually("a Released Event", WAIT, || async {
        s.events_about("p")
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("Released"))
            .then_some(())
            .ok_or("no Released Event yet")
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn a_removed_rule_takes_its_spoke_children_once_the_spoke_answers() {
    let s = setup("clusters-release-rule").await;
    let metrics = free_address();
    s.register(&s.spoke.kubeconfig).await;
    let rule = format!("{RULE}{KEPT}");
    let mut rules = ConfigMapDir::new(&[("placed.yaml", &s.kind.rule(&rule))]);
    let operator = s.start_reloading(&rules, metrics);
    s.served_parent("p", &["remote", "kept"]).await;

    // The spoke down, the rule removed: the parent keeps its finalizer,
    // told why.
    s.spoke_down(metrics).await;
    rules.update(&[]);
    s.told_waiting("p", "rule placed removed").await;
    assert!(
        s.parent("p")
            .await
            .finalizers()
            .iter()
            .any(|f| f == trellis::operator::FINALIZER),
        "the parent keeps its finalizer while its spoke does not answer"
    );

    // Up again: onRuleRemoved: delete reaches the spoke.
    s.spoke.restart("kube-apiserver").await;
    s.taken_away("p", true).await;
    operator.stop().await;
}

#[tokio::test]
async fn a_child_moved_home_by_a_rule_edit_is_taken_out_of_the_spoke() {
    let s = setup("clusters-release-moved").await;
    let metrics = free_address();
    s.register(&s.spoke.kubeconfig).await;
    let mut rules = ConfigMapDir::new(&[("placed.yaml", &s.kind.rule(RULE))]);
    let operator = s.start_reloading(&rules, metrics);
    s.served_parent("p", &["remote"]).await;

    // The only spoke child of its kind moved home: the spokes stop
    // watching ConfigMaps, and what is left there is deleted all the same.
    let moved = RULE.replace("      cluster: \"'spoke-1'\"\n", "");
    assert_ne!(moved, RULE);
    rules.update(&[("placed.yaml", &s.kind.rule(&moved))]);
    eventually("made at home, gone from the spoke", WAIT, || async {
        let home = s
            .home_configmaps()
            .get_opt("p-remote")
            .await
            .map_err(|e| e.to_string())?;
        let spoke = s
            .spoke_configmaps()
            .get_opt("p-remote")
            .await
            .map_err(|e| e.to_string())?;
        (home.is_some() && spoke.is_none())
            .then_some(())
            .ok_or(format!(
                "at home: {}, in the spoke: {}",
                home.is_some(),
                spoke.is_some()
            ))
    })
    .await;
    operator.stop().await;
}

/// A home child and a child placed by `spec.region` (home unless it names a
/// spoke), made once the home child is ready: in a later round of the pass
/// than the first, which has no child in a spoke yet.
const PLACED_BY_REGION: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: placed
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: home
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-home" }}
    - id: remote
      apiVersion: v1
      kind: ConfigMap
      cluster: spec.region | default('local')
      dependsOn: [home]
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-remote" }}
"#;

#[tokio::test]
async fn only_a_parent_with_a_spoke_child_carries_the_finalizer() {
    let s = setup("clusters-release-finalizer").await;
    let metrics = free_address();
    s.register(&s.spoke.kubeconfig).await;
    let rules = ConfigMapDir::new(&[("placed.yaml", &s.kind.rule(PLACED_BY_REGION))]);
    let operator = s.start_reloading(&rules, metrics);
    let hub_mark = support::audit::offset();
    let spoke_log = s.spoke.dir.join("logs/audit.log");
    let spoke_mark = support::audit::mark_in(&spoke_log).expect("the spoke's audit log");
    for (name, spec) in [("local", json!({})), ("away", json!({"region": SPOKE}))] {
        let parent = DynamicObject::new(name, &s.kind.resource)
            .within(s.ns.name())
            .data(json!({"spec": spec}));
        s.parents()
            .create(&PostParams::default(), &parent)
            .await
            .expect("create parent");
    }
    let finalized = |p: &DynamicObject| {
        p.finalizers()
            .iter()
            .any(|f| f == trellis::operator::FINALIZER)
    };
    eventually("both parents' children made", WAIT, || async {
        let home = s.home_configmaps();
        let made = [
            home.get_opt("local-home").await,
            home.get_opt("local-remote").await,
            home.get_opt("away-home").await,
            s.spoke_configmaps().get_opt("away-remote").await,
        ];
        made.iter()
            .all(|m| matches!(m, Ok(Some(_))))
            .then_some(())
            .ok_or(format!("{made:?}"))
    })
    .await;
    assert!(
        finalized(&s.parent("away").await),
        "a parent with a spoke child carries the finalizer"
    );
    assert!(
        !finalized(&s.parent("local").await),
        "a parent whose children are all at home carries no finalizer"
    );
    // On before the spoke child was made, though the pass's first round
    // had no child in a spoke (the audit logs of both control planes).
    tokio::time::sleep(support::operator::QUIET).await;
    let hub = support::audit::writes_since(hub_mark, s.ns.name());
    let finalizer = hub
        .iter()
        .find(|w| w.name == "away" && w.verb == "patch" && w.subresource.is_empty())
        .map(|w| w.received);
    let spoke = support::audit::writes_in(&spoke_log, spoke_mark, s.ns.name());
    let made = spoke
        .iter()
        .find(|w| w.name == "away-remote" && w.code < 300)
        .map(|w| w.received);
    assert!(
        matches!((finalizer, made), (Some(f), Some(m)) if f < m),
        "finalizer at {finalizer:?}, spoke child made at {made:?}"
    );

    // With trellis stopped, the garbage collector alone deletes the parent
    // whose children are all at home, children and all.
    operator.stop().await;
    s.parents()
        .delete("local", &Default::default())
        .await
        .expect("delete parent");
    eventually("the parent and its children gone", WAIT, || async {
        let parent = s.parents().get_opt("local").await;
        let home = s.home_configmaps();
        let left = [
            home.get_opt("local-home").await.map(|o| o.is_some()),
            home.get_opt("local-remote").await.map(|o| o.is_some()),
        ];
        (matches!(parent, Ok(None)) && left.iter().all(|l| matches!(l, Ok(false))))
            .then_some(())
            .ok_or(format!("parent: {parent:?}, children left: {left:?}"))
    })
    .await;
}

#[tokio::test]
async fn a_removed_rules_spoke_cleanup_survives_a_restart_while_the_spoke_is_down() {
    let s = setup("clusters-release-restart").await;
    let metrics = free_address();
    s.register(&s.spoke.kubeconfig).await;
    let rule = format!("{RULE}{KEPT}");
    let mut rules = ConfigMapDir::new(&[("placed.yaml", &s.kind.rule(&rule))]);
    let operator = s.start_reloading(&rules, metrics);
    s.served_parent("p", &["remote", "kept"]).await;

    // The spoke down, the rule removed: the cleanup waits for the spoke,
    // recorded in the operator's namespace.
    s.spoke_down(metrics).await;
    rules.update(&[]);
    s.told_waiting("p", "rule placed removed").await;
    let records: Api<ConfigMap> = s.home_configmaps();
    let record = records
        .get("trellis-spoke-cleanup-hub-a")
        .await
        .expect("the cleanup recorded");
    assert!(
        record
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key("removed.placed")),
        "{:?}",
        record.data
    );

    // A restart while the spoke is down: the new process knows of no such
    // rule, only of the record. The spoke back: its children are taken as
    // `onRuleRemoved: delete` says, the parent's finalizer released, the
    // record dropped.
    operator.stop().await;
    let operator = s.start_reloading(&rules, metrics);
    s.spoke.restart("kube-apiserver").await;
    s.taken_away("p", true).await;
    eventually("the record dropped", WAIT, || async {
        let record = records
            .get_opt("trellis-spoke-cleanup-hub-a")
            .await
            .map_err(|e| e.to_string())?;
        let data = record.and_then(|r| r.data).unwrap_or_default();
        data.is_empty().then_some(()).ok_or(format!("{data:?}"))
    })
    .await;
    // Its delete no longer hangs.
    s.parents()
        .delete("p", &Default::default())
        .await
        .expect("delete the parent");
    eventually("the parent gone", WAIT, || async {
        match s.parents().get_opt("p").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn a_kind_moved_home_is_taken_out_of_the_spoke_after_a_restart_while_it_is_down() {
    let s = setup("clusters-release-moved-restart").await;
    let metrics = free_address();
    s.register(&s.spoke.kubeconfig).await;
    let mut rules = ConfigMapDir::new(&[("placed.yaml", &s.kind.rule(RULE))]);
    let operator = s.start_reloading(&rules, metrics);
    s.served_parent("p", &["remote"]).await;

    // The spoke down, the only spoke child moved home: recorded, waiting.
    s.spoke_down(metrics).await;
    let moved = RULE.replace("      cluster: \"'spoke-1'\"\n", "");
    rules.update(&[("placed.yaml", &s.kind.rule(&moved))]);
    let records: Api<ConfigMap> = s.home_configmaps();
    let recorded = |data: &std::collections::BTreeMap<String, String>| {
        data.contains_key("dropped.placed.ConfigMap.")
    };
    eventually("the cleanup recorded", WAIT, || async {
        let record = records
            .get_opt("trellis-spoke-cleanup-hub-a")
            .await
            .map_err(|e| e.to_string())?;
        let data = record.and_then(|r| r.data).unwrap_or_default();
        recorded(&data).then_some(()).ok_or(format!("{data:?}"))
    })
    .await;

    // A restart while it is down: no rule places anything in a spoke now,
    // no pass can see the object there; the record takes it away once the
    // spoke answers.
    operator.stop().await;
    let operator = s.start_reloading(&rules, metrics);
    s.spoke.restart("kube-apiserver").await;
    eventually("gone from the spoke, the record dropped", WAIT, || async {
        let spoke = s
            .spoke_configmaps()
            .get_opt("p-remote")
            .await
            .map_err(|e| e.to_string())?;
        let record = records
            .get_opt("trellis-spoke-cleanup-hub-a")
            .await
            .map_err(|e| e.to_string())?;
        let data = record.and_then(|r| r.data).unwrap_or_default();
        (spoke.is_none() && !recorded(&data))
            .then_some(())
            .ok_or(format!(
                "in the spoke: {}, records: {data:?}",
                spoke.is_some()
            ))
    })
    .await;
    operator.stop().await;
}
