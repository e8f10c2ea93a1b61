//! `cluster:` on children: where each object goes, what it carries there
//! (no ownerReference; the hub's name), and what a spoke that cannot be
//! reached holds back (its own children, never a prune there).

use std::collections::BTreeMap;

use super::*;
use crate::clusters::{Clusters, Reach};

/// `cm` at home and `remote` in the spoke named by `spec.region`.
fn two_places() -> Arc<CompiledRule> {
    let remote = "    - id: remote\n      apiVersion: v1\n      kind: ConfigMap\n      cluster: spec.region\n      template: |\n        metadata:\n          name: {{ parent.metadata.name ~ '-remote' }}\n        data:\n          v: {{ spec.v | default('x') }}\n";
    rule(&format!(
        "{PARENT_KIND}  status:\n    fields:\n      - path: remoteV\n        from: remote\n        jsonPath: $.data.v\n  children:\n{CM}{remote}"
    ))
}

fn hub_named(name: &str, spokes: &[(&str, Reach)]) -> Clusters {
    Clusters {
        unread: None,
        hub: name.into(),
        spokes: Some(
            spokes
                .iter()
                .map(|(n, r)| (n.to_string(), r.clone()))
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}

fn run_in(rule: &CompiledRule, parent: &Value, observed: Vec<Value>, clusters: &Clusters) -> Plan {
    plan(
        rule,
        &Input {
            parent,
            observed: &Observed::from_objects(observed),
            now: NOW,
            scope_of: &kinds::scope,
            clusters,
        },
    )
}

/// The remote child as the spoke holds it, placed by the annotation the
/// operator (and `render --observed`) reads.
fn remote_live(cluster: &str, v: &str) -> Value {
    let mut obj = live("ConfigMap", "a-remote", "remote", json!({"data": {"v": v}}));
    obj["metadata"]["annotations"] = json!({"trellis.dev/cluster": cluster});
    obj["metadata"]["labels"]["trellis.dev/hub"] = json!("hub-1");
    obj
}

#[test]
fn spoke_child_has_hub_label_and_parent_uid_and_no_owner_reference() {
    let r = two_places();
    let clusters = hub_named("hub-1", &[("eu-1", Reach::Ready)]);
    let p = run_in(&r, &parent(json!({"region": "eu-1"})), vec![], &clusters);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let remote = p.apply.iter().find(|a| a.id == "remote").unwrap();
    assert_eq!(remote.key.cluster.as_deref(), Some("eu-1"));
    assert!(!remote.owned);
    let meta = &remote.object["metadata"];
    assert!(meta.get("ownerReferences").is_none(), "{meta}");
    assert_eq!(meta["labels"][LABEL_PARENT_UID], UID);
    assert_eq!(meta["labels"][LABEL_RULE], "app");
    assert_eq!(meta["labels"][LABEL_CHILD], "remote");
    assert_eq!(meta["labels"]["trellis.dev/hub"], "hub-1");
    assert_eq!(meta["namespace"], "ns");
    assert!(
        p.needs_finalizer,
        "spoke children are taken away by the finalizer"
    );
    assert_eq!(
        remote.key.to_string(),
        "ConfigMap ns/a-remote in cluster eu-1"
    );

    // The local child is as before: owned, no hub label, no cluster.
    let local = p.apply.iter().find(|a| a.id == "cm").unwrap();
    assert!(local.owned && local.key.cluster.is_none());
    assert!(
        local.object["metadata"]["labels"]
            .get("trellis.dev/hub")
            .is_none()
    );
}

#[test]
fn local_is_the_hub_and_a_bad_value_is_a_render_error_naming_the_child() {
    let r = two_places();
    let clusters = hub_named("hub", &[]);
    let p = run_in(&r, &parent(json!({"region": "local"})), vec![], &clusters);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let remote = p.apply.iter().find(|a| a.id == "remote").unwrap();
    assert!(remote.owned && remote.key.cluster.is_none());

    let p = run_in(&r, &parent(json!({"region": "EU 1"})), vec![], &clusters);
    assert_eq!(p.failure_reason, Some(FailureReason::RenderError));
    assert!(
        p.errors[0].contains("cluster of child \"remote\"")
            && p.errors[0].contains("not a cluster name"),
        "{:?}",
        p.errors
    );
    let p = run_in(&r, &parent(json!({"region": 3})), vec![], &clusters);
    assert!(
        p.errors[0].contains("must be a cluster name (a string)"),
        "{:?}",
        p.errors
    );
}

#[test]
fn observed_spoke_child_is_read_back_for_status_and_kept_apart_from_a_local_namesake() {
    let r = two_places();
    let clusters = hub_named("hub-1", &[("eu-1", Reach::Ready)]);
    // Same kind, namespace and name at home: another object altogether.
    let namesake = live(
        "ConfigMap",
        "a-remote",
        "remote",
        json!({"data": {"v": "home"}}),
    );
    let p = run_in(
        &r,
        &parent(json!({"region": "eu-1"})),
        vec![remote_live("eu-1", "seen"), namesake],
        &clusters,
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.status.as_ref().unwrap()["remoteV"], "seen");
    // The home namesake is no longer rendered: pruned at home only.
    assert_eq!(p.delete.len(), 1, "{:?}", p.delete);
    assert_eq!(p.delete[0].key.cluster, None);
}

#[test]
fn unreachable_spoke_holds_back_only_its_children_and_prunes_nothing_there() {
    let r = two_places();
    let down = Reach::Unreachable("connection refused".into());
    let clusters = hub_named("hub-1", &[("eu-1", down.clone()), ("us-1", Reach::Ready)]);
    // The parent moved its child from eu-1 (down) to us-1: eu-1's object
    // would be pruned, but eu-1 cannot be asked.
    let p = run_in(
        &r,
        &parent(json!({"region": "eu-1", "v": "2"})),
        vec![remote_live("eu-1", "1")],
        &clusters,
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply.len(), 1, "the local child goes on");
    assert_eq!(p.apply[0].id, "cm");
    assert_eq!(p.pending[0].reason, "ClusterUnreachable");
    let synced = condition(&p, "Synced");
    assert_eq!(synced["status"], "False");
    assert_eq!(synced["reason"], "ClusterUnreachable");
    assert!(
        synced["message"].as_str().unwrap().contains("\"eu-1\""),
        "{synced}"
    );
    assert!(p.delete.is_empty() && p.retain.is_empty());

    let moved = run_in(
        &r,
        &parent(json!({"region": "us-1"})),
        vec![remote_live("eu-1", "1")],
        &clusters,
    );
    assert!(
        moved
            .apply
            .iter()
            .any(|a| a.key.cluster.as_deref() == Some("us-1"))
    );
    assert!(
        moved.delete.is_empty(),
        "nothing deleted in an unreachable spoke: {:?}",
        moved.delete
    );

    let back = hub_named("hub-1", &[("eu-1", Reach::Ready), ("us-1", Reach::Ready)]);
    let moved = run_in(
        &r,
        &parent(json!({"region": "us-1"})),
        vec![remote_live("eu-1", "1")],
        &back,
    );
    assert_eq!(moved.delete.len(), 1);
    assert_eq!(moved.delete[0].key.cluster.as_deref(), Some("eu-1"));
}

#[test]
fn unknown_spoke_is_cluster_unknown() {
    let r = two_places();
    let clusters = hub_named("hub", &[]);
    let p = run_in(
        &r,
        &parent(json!({"region": "nowhere"})),
        vec![remote_live("nowhere", "1")],
        &clusters,
    );
    assert_eq!(p.pending[0].reason, "ClusterUnknown");
    assert_eq!(condition(&p, "Synced")["reason"], "ClusterUnknown");
    assert!(p.delete.is_empty());
}

#[test]
fn excluded_child_needs_no_cluster() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}",
        CM.replace(
            "      kind: ConfigMap\n",
            "      kind: ConfigMap\n      includeWhen: \"false\"\n      cluster: spec.missing.region\n"
        )
    ));
    let p = run_in(&r, &parent(json!({})), vec![], &hub_named("hub", &[]));
    assert!(
        p.errors.is_empty() && p.pending.is_empty(),
        "{:?} {:?}",
        p.errors,
        p.pending
    );
}

#[test]
fn related_entry_reads_the_spoke_offline_and_is_held_back_when_unreachable() {
    let r = rule(&format!(
        "{PARENT_KIND}  related:\n    - id: cfg\n      apiVersion: v1\n      kind: ConfigMap\n      name: shared\n      cluster: \"'eu-1'\"\n  children:\n{}",
        CM.replace("{{ spec.v | default('x') }}", "{{ related.cfg.data.v }}")
    ));
    let mut shared = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared", "namespace": "ns", "annotations": {"trellis.dev/cluster": "eu-1"}}, "data": {"v": "from-eu"}});
    let p = run_in(
        &r,
        &parent(json!({})),
        vec![shared.clone()],
        &Clusters::offline(),
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply[0].object["data"]["v"], "from-eu");
    // At home it is another object: not found.
    shared["metadata"]["annotations"] = json!({});
    let p = run_in(&r, &parent(json!({})), vec![shared], &Clusters::offline());
    assert_eq!(p.pending[0].reason, "RelatedNotFound");
    let down = hub_named("hub", &[("eu-1", Reach::Unreachable("timeout".into()))]);
    let p = run_in(&r, &parent(json!({})), vec![], &down);
    assert_eq!(p.pending[0].reason, "ClusterUnreachable");
}

#[test]
fn finalizer_only_on_a_parent_with_a_child_in_a_spoke() {
    let r = two_places();
    let clusters = hub_named("hub-1", &[("eu-1", Reach::Ready)]);
    // Every child at home: the garbage collector takes them, no finalizer.
    let home = run_in(&r, &parent(json!({"region": "local"})), vec![], &clusters);
    assert!(home.errors.is_empty(), "{:?}", home.errors);
    assert!(
        !home.needs_finalizer,
        "a parent whose children are all at home needs no finalizer"
    );

    // Moved home from eu-1: the spoke child is still there until pruned,
    // and only the finalizer would take it away.
    let moved = run_in(
        &r,
        &parent(json!({"region": "local"})),
        vec![remote_live("eu-1", "1")],
        &clusters,
    );
    assert!(moved.needs_finalizer, "a spoke child is still there");
    assert_eq!(moved.delete.len(), 1, "{:?}", moved.delete);
    assert_eq!(moved.delete[0].key.cluster.as_deref(), Some("eu-1"));

    // Placed in a spoke that cannot be read (nothing seen of it): what it
    // holds there is not known.
    let down = Reach::Unreachable("connection refused".into());
    for clusters in [
        hub_named("hub-1", &[("eu-1", down)]),
        hub_named("hub-1", &[]),
    ] {
        let held = run_in(&r, &parent(json!({"region": "eu-1"})), vec![], &clusters);
        assert!(!held.pending.is_empty());
        assert!(held.needs_finalizer, "{:?}", held.pending);
    }
}
