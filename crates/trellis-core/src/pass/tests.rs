//! The pass stepped through its rounds with no cluster: the caller's part
//! (sending, the server's answers) is played by hand.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::plan::{self, Input, Observed};

/// `config`, then `web` reading it (so `web` waits for `config` to exist).
const RULE: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App, selector: {matchLabels: {tier: web}}}\n  children:\n    - id: config\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {name: '{{ parent.metadata.name }}-config'}\n        data: {k: v}\n    - id: web\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {name: '{{ parent.metadata.name }}-web'}\n        data: {from: '{{ children.config.metadata.name }}'}\n";

fn rule() -> Arc<CompiledRule> {
    crate::rules::testing::rule_with_spec(RULE)
}

fn parent(metadata: Value) -> Value {
    let mut meta = json!({"name": "p", "namespace": "ns", "uid": "u1", "generation": 1, "labels": {"tier": "web"}});
    if let (Some(m), Some(extra)) = (meta.as_object_mut(), metadata.as_object()) {
        for (k, v) in extra {
            m.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "demo.trellis.dev/v1", "kind": "App", "metadata": meta, "spec": {}})
}

fn plan_with(rule: &CompiledRule, parent: &Value, observed: &[Value]) -> Plan {
    let observed = Observed::from_objects(observed.iter().cloned());
    plan::plan(
        rule,
        &Input {
            parent,
            observed: &observed,
            now: "2026-12-05T00:00:00Z",
            scope_of: &crate::kinds::scope,
            clusters: &crate::clusters::Clusters::offline(),
        },
    )
}

#[test]
fn entry_checks_run_in_one_order_deletion_and_scope_before_pause() {
    let r = rule();
    assert_eq!(entry(&r, &parent(json!({})), None), Entry::Proceed);
    let paused = json!({"annotations": {PAUSED_ANNOTATION: "true"}});
    assert_eq!(entry(&r, &parent(paused.clone()), None), Entry::Paused);
    // Being deleted wins over paused: the delete must not hang.
    let mut deleting = paused.clone();
    deleting["deletionTimestamp"] = json!("2026-12-05T00:00:00Z");
    assert_eq!(entry(&r, &parent(deleting), None), Entry::Deleting);
    // Out of scope wins over paused: it is released like a deleted one.
    let mut left = paused;
    left["labels"] = json!({"tier": "db"});
    assert!(
        matches!(entry(&r, &parent(left), None), Entry::OutOfScope(why) if why.contains("parent.selector"))
    );
    // Undecodable before anything.
    assert_eq!(
        entry(&r, &parent(json!({})), Some("too deep")),
        Entry::Undecodable("too deep".into())
    );
    assert_eq!(Entry::Proceed.skipped(), None);
    assert_eq!(
        Entry::Paused.skipped().as_deref(),
        Some("paused (trellis.dev/paused=true)")
    );
}

/// The ids of the children a round sends, in order.
fn to_send_ids(rounds: &Rounds, plan: &Plan) -> Vec<String> {
    rounds.to_send(plan).iter().map(|a| a.id.clone()).collect()
}

#[test]
fn a_child_whose_dependency_the_pass_made_is_sent_in_the_next_round_of_the_same_pass() {
    let r = rule();
    let p = parent(json!({}));
    let mut rounds = Rounds::new(&r);
    let mut observed: Vec<Value> = Vec::new();

    // Round 1: only `config` can render; `web` reads it and waits.
    assert!(rounds.begin_round());
    let first = plan_with(&r, &p, &observed);
    let send = to_send_ids(&rounds, &first);
    assert_eq!(send, ["config"]);
    let config = first.apply[0].clone();
    let got = rounds.record(&config, Sent::Created);
    assert_eq!(
        got,
        Recorded {
            count: true,
            observe: true
        }
    );
    // The server's answer is observed.
    let mut answer = config.object.clone();
    answer["metadata"]["uid"] = json!("c1");
    observed.push(answer);
    assert!(rounds.round_done(true), "it wrote: plan again");

    // Round 2: `web` renders now; `config` is not sent again.
    assert!(rounds.begin_round());
    let second = plan_with(&r, &p, &observed);
    let send = to_send_ids(&rounds, &second);
    assert_eq!(send, ["web"]);
    let web = second.apply.iter().find(|a| a.id == "web").unwrap().clone();
    rounds.record(&web, Sent::Created);
    assert!(rounds.may_prune());
    assert!(!rounds.withholds_status(&second));
    assert_eq!(rounds.finish(&second, None), Finish::Next(Next::OnChange));
}

#[test]
fn a_failed_write_stops_the_rounds_holds_pruning_and_fails_the_pass() {
    let r = rule();
    let p = parent(json!({}));
    let mut rounds = Rounds::new(&r);
    assert!(rounds.begin_round());
    let plan = plan_with(&r, &p, &[]);
    let config = plan.apply[0].clone();
    let got = rounds.record(&config, Sent::Failed { unreachable: true });
    assert_eq!(
        got,
        Recorded {
            count: true,
            observe: false
        }
    );
    assert!(!rounds.round_goes_on(), "no API server: the round stops");
    assert!(!rounds.patches_due());
    assert!(!rounds.round_done(true), "no new plan after a failure");
    assert!(!rounds.may_prune());
    assert!(!rounds.withholds_status(&plan), "a failure is reported");
    assert_eq!(rounds.finish(&plan, None), Finish::WriteFailed);
    // A failed child is not sent again in this pass.
    assert!(rounds.to_send(&plan).is_empty());
}

#[test]
fn an_unseen_child_withholds_the_status_and_looks_again_in_a_second() {
    let r = rule();
    let p = parent(json!({}));
    let mut rounds = Rounds::new(&r);
    assert!(rounds.begin_round());
    let plan = plan_with(&r, &p, &[]);
    let config = plan.apply[0].clone();
    // Unchanged children count once per pass in the metrics.
    assert!(rounds.record(&config, Sent::Unseen).count);
    assert!(!rounds.record(&config, Sent::Unseen).count);
    assert!(rounds.withholds_status(&plan));
    let hour = Some(Duration::from_secs(3600));
    assert_eq!(
        rounds.finish(&plan, hour),
        Finish::Next(Next::After(UNSEEN_RECHECK))
    );
}

#[test]
fn rounds_end_after_one_per_child_and_patch_plus_one() {
    let r = rule();
    let mut rounds = Rounds::new(&r);
    let mut n = 0;
    while rounds.begin_round() {
        n += 1;
    }
    assert_eq!(n, r.children.len() + r.patches.len() + 1);
}

#[test]
fn next_pass_prefers_an_unseen_recheck_then_a_pending_one_then_resync() {
    let hour = Some(Duration::from_secs(3600));
    assert_eq!(next_pass(true, true, hour), Next::After(UNSEEN_RECHECK));
    assert_eq!(next_pass(false, true, hour), Next::After(PENDING_RECHECK));
    assert_eq!(
        next_pass(false, false, hour),
        Next::After(Duration::from_secs(3600))
    );
    assert_eq!(next_pass(false, false, None), Next::OnChange);
}

#[test]
fn an_invalid_spec_stops_until_an_edit_and_a_render_error_fails_the_pass() {
    let r = rule();
    let rounds = Rounds::new(&r);
    let mut plan = plan_with(&r, &parent(json!({})), &[]);
    plan.errors = vec!["bad".into()];
    plan.failure_reason = Some(FailureReason::RenderError);
    assert_eq!(rounds.finish(&plan, None), Finish::PlanFailed);
    plan.failure_reason = Some(FailureReason::InvalidSpec);
    assert_eq!(rounds.finish(&plan, None), Finish::Stop);
}

// Moved from the operator's `reconcile` with the decisions they test.

/// The plan for a parent whose ConfigMap the cache does not show: its
/// status says the child "does not exist yet".
fn planned_without_the_child() -> Plan {
    let plan = plan_with(&rule(), &parent(json!({})), &[]);
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    let planned = plan.status.clone().expect("a status");
    assert!(
        planned.to_string().contains("does not exist yet"),
        "{planned}"
    );
    plan
}

#[test]
fn a_pass_that_cannot_see_a_child_it_just_made_writes_no_status_and_looks_again_in_a_second() {
    // What it would write is false: the child exists, the pass that made
    // it wrote the status from the API server's answer.
    let plan = planned_without_the_child();
    let mut rounds = Rounds::new(&rule());
    assert!(rounds.begin_round());
    rounds.record(&plan.apply[0], Sent::Unseen);
    assert!(rounds.withholds_status(&plan));
    let hour = Some(Duration::from_secs(3600));
    for (pending, resync) in [(false, None), (true, None), (false, hour), (true, hour)] {
        assert_eq!(
            next_pass(true, pending, resync),
            Next::After(Duration::from_secs(1)),
            "pending {pending}, resync {resync:?}"
        );
    }
}

#[test]
fn a_pass_that_cannot_see_a_child_it_just_made_still_reports_its_own_errors() {
    let mut plan = planned_without_the_child();
    let mut rounds = Rounds::new(&rule());
    rounds.record(&plan.apply[0], Sent::Unseen);
    plan.errors.push("a render error".into());
    assert!(!rounds.withholds_status(&plan));
    let mut failed = Rounds::new(&rule());
    failed.record(&plan.apply[0], Sent::Unseen);
    failed.failed();
    plan.errors.clear();
    assert!(!failed.withholds_status(&plan));
}

#[test]
fn a_child_never_made_and_not_in_the_cache_is_reported_as_not_existing_yet() {
    let plan = planned_without_the_child();
    let rounds = Rounds::new(&rule());
    assert!(
        !rounds.withholds_status(&plan),
        "the usual status is written"
    );
    assert_eq!(next_pass(false, false, None), Next::OnChange);
    assert_eq!(
        next_pass(false, true, None),
        Next::After(Duration::from_secs(10))
    );
}
