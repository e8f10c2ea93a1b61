//! `related:` entries, `vars:` and implicit dependencies in a pass.

use super::*;

fn object(kind: &str, ns: Option<&str>, name: &str, labels: Value, extra: Value) -> Value {
    let mut obj = json!({
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": name, "labels": labels},
    });
    if let Some(ns) = ns {
        obj["metadata"]["namespace"] = json!(ns);
    }
    if let (Value::Object(o), Value::Object(e)) = (&mut obj, extra) {
        o.extend(e);
    }
    obj
}

const SETTINGS: &str = "  related:\n    - id: settings\n      apiVersion: v1\n      kind: ConfigMap\n      name: \"{{ spec.from }}\"\n";
const COPY: &str = "    - id: copy\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: {{ parent.metadata.name ~ '-copy' }}\n        data: {{ related.settings.data }}\n";

#[test]
fn related_by_name_is_read_into_the_context() {
    let r = rule(&format!("{PARENT_KIND}{SETTINGS}  children:\n{COPY}"));
    let src = object(
        "ConfigMap",
        Some("ns"),
        "src",
        json!({}),
        json!({"data": {"k": "v"}}),
    );
    let p = run(&r, &parent(json!({"from": "src"})), vec![src]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply[0].object["data"], json!({"k": "v"}));
    assert_eq!(p.reads.len(), 1);
    assert_eq!(p.reads[0].namespace.as_deref(), Some("ns"));
    assert_eq!(p.reads[0].target, RelatedTarget::Name("src".into()));
}

#[test]
fn missing_required_related_holds_back_its_readers_and_prunes_nothing() {
    let r = rule(&format!("{PARENT_KIND}{SETTINGS}  children:\n{CM}{COPY}"));
    let old_copy = live("ConfigMap", "a-copy", "copy", json!({}));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &parent(json!({"from": "src"})), vec![old_copy, cm]);
    assert!(
        p.errors.is_empty(),
        "pending is not an error: {:?}",
        p.errors
    );
    assert_eq!(
        p.apply.len(),
        1,
        "the child that does not read it is applied"
    );
    assert_eq!(p.apply[0].id, "cm");
    assert_eq!(p.pending.len(), 1);
    assert_eq!(p.pending[0].id, "copy");
    assert_eq!(p.pending[0].reason, "RelatedNotFound");
    assert!(p.delete.is_empty(), "nothing pruned: {:?}", p.delete);
    let ready = condition(&p, "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "RelatedNotFound");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("related \"settings\""),
        "{ready}"
    );
}

#[test]
fn optional_missing_related_is_absent_and_holds_nothing_back() {
    let optional = SETTINGS.replace("      name:", "      optional: true\n      name:");
    let copy = COPY.replace(
        "{{ related.settings.data }}",
        "{{ related.settings.data if related.settings is defined else {'none': 'yes'} }}",
    );
    let copy = copy.replace(
        "      kind: ConfigMap\n      template",
        "      kind: ConfigMap\n      dependsOn: [settings]\n      template",
    );
    let r = rule(&format!("{PARENT_KIND}{optional}  children:\n{copy}"));
    let p = run(&r, &parent(json!({"from": "src"})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.pending.is_empty());
    assert_eq!(p.apply[0].object["data"], json!({"none": "yes"}));
}

#[test]
fn related_ready_when_false_holds_back_with_related_not_ready() {
    let ready = SETTINGS.replace(
        "      name:",
        "      readyWhen: \"self.data.ready | default('no') == 'yes'\"\n      name:",
    );
    let r = rule(&format!("{PARENT_KIND}{ready}  children:\n{COPY}"));
    let src = object(
        "ConfigMap",
        Some("ns"),
        "src",
        json!({}),
        json!({"data": {"ready": "no"}}),
    );
    let p = run(&r, &parent(json!({"from": "src"})), vec![src.clone()]);
    assert_eq!(p.pending[0].reason, "RelatedNotReady");
    let mut src = src;
    src["data"]["ready"] = json!("yes");
    let p = run(&r, &parent(json!({"from": "src"})), vec![src]);
    assert!(
        p.pending.is_empty() && p.apply.len() == 1,
        "{:?}",
        p.pending
    );
}

#[test]
fn cross_namespace_read_is_refused_unless_the_rule_allows_it() {
    let other = SETTINGS.replace(
        "      name:",
        "      namespace: \"{{ spec.ns }}\"\n      name:",
    );
    let r = rule(&format!("{PARENT_KIND}{other}  children:\n{COPY}"));
    let secret = object(
        "ConfigMap",
        Some("other"),
        "src",
        json!({}),
        json!({"data": {"k": "v"}}),
    );
    let p = run(
        &r,
        &parent(json!({"from": "src", "ns": "other"})),
        vec![secret.clone()],
    );
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::CrossNamespaceRefused)
    );
    assert!(
        p.apply.is_empty() && p.delete.is_empty(),
        "nothing read or written"
    );
    assert!(
        p.errors[0].contains("allowCrossNamespace"),
        "{:?}",
        p.errors
    );

    let allowed = other.replace(
        "      name:",
        "      allowCrossNamespace: true\n      name:",
    );
    let r = rule(&format!("{PARENT_KIND}{allowed}  children:\n{COPY}"));
    let p = run(
        &r,
        &parent(json!({"from": "src", "ns": "other"})),
        vec![secret],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply[0].object["data"], json!({"k": "v"}));
}

#[test]
fn related_by_selector_is_a_sorted_list_and_cluster_scoped_kinds_take_no_namespace() {
    let related = "  related:\n    - id: teams\n      apiVersion: v1\n      kind: Namespace\n      selector:\n        matchLabels: {team: \"{{ spec.team }}\"}\n";
    let each = "    - id: each\n      apiVersion: v1\n      kind: ConfigMap\n      forEach: related.teams\n      template: |\n        metadata:\n          name: {{ 'copy-' ~ item.metadata.name }}\n";
    let r = rule(&format!("{PARENT_KIND}{related}  children:\n{each}"));
    let ns =
        |name: &str, team: &str| object("Namespace", None, name, json!({"team": team}), json!({}));
    let p = run(
        &r,
        &parent(json!({"team": "a"})),
        vec![ns("zeta", "a"), ns("alpha", "a"), ns("other", "b")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let names: Vec<_> = p.apply.iter().map(|a| a.key.name.clone()).collect();
    assert_eq!(names, ["copy-alpha", "copy-zeta"]);
    assert_eq!(p.reads[0].namespace, None);
    assert!(p.pending.is_empty(), "an empty or full list is not missing");
}

#[test]
fn vars_are_computed_in_order_and_templates_yield_values() {
    let vars = "  vars:\n    - name: full\n      value: \"parent.metadata.name ~ '-' ~ spec.env\"\n    - name: hosts\n      template: |\n        {% for h in spec.hosts %}\n        - {{ vars.full ~ '.' ~ h }}\n        {% endfor %}\n";
    let child = "    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: {{ vars.full }}\n        data:\n          hosts: {{ vars.hosts | join(',') }}\n";
    let r = rule(&format!("{PARENT_KIND}{vars}  children:\n{child}"));
    let p = run(
        &r,
        &parent(json!({"env": "prod", "hosts": ["x", "y"]})),
        vec![],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply[0].key.name, "a-prod");
    assert_eq!(p.apply[0].object["data"]["hosts"], "a-prod.x,a-prod.y");
}

#[test]
fn reading_a_sibling_is_an_implicit_dependency() {
    let reader = "    - id: reader\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: reader\n        data:\n          uid: {{ children.cm.metadata.uid | default('none') }}\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{reader}{CM}"));
    let order: Vec<_> = r
        .order
        .iter()
        .map(|&i| r.children[i].spec.id.clone())
        .collect();
    assert_eq!(
        order,
        ["cm", "reader"],
        "implicit edge orders the reader after cm"
    );
    let p = run(&r, &parent(json!({})), vec![]);
    assert_eq!(p.pending.len(), 1, "reader waits for cm to exist");
    assert_eq!(p.pending[0].id, "reader");
}

/// A related source answering one name read, and recording what was asked.
struct OneObject {
    object: Value,
    asked: std::sync::Mutex<Vec<RelatedRead>>,
}

impl RelatedSource for OneObject {
    fn find(&self, _gvk: &Gvk, read: &RelatedRead) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
        self.asked.lock().unwrap().push(read.clone());
        Ok(match &read.target {
            RelatedTarget::Name(n) if n == "src" => {
                vec![(ObjectKey::of(&self.object).unwrap(), self.object.clone())]
            }
            _ => Vec::new(),
        })
    }
}

#[test]
fn with_a_related_source_reads_come_from_it_not_from_the_observed_objects() {
    let r = rule(&format!("{PARENT_KIND}{SETTINGS}  children:\n{COPY}"));
    let cached = object(
        "ConfigMap",
        Some("ns"),
        "src",
        json!({}),
        json!({"data": {"from": "cache"}}),
    );
    let stale = object(
        "ConfigMap",
        Some("ns"),
        "src",
        json!({}),
        json!({"data": {"from": "observed"}}),
    );
    let source = Arc::new(OneObject {
        object: cached,
        asked: Default::default(),
    });
    let observed = Observed::from_objects([stale]).with_related(source.clone());
    let p = plan(
        &r,
        &Input {
            parent: &parent(json!({"from": "src"})),
            observed: &observed,
            now: NOW,
            scope_of: &kinds::scope,
            clusters: &crate::clusters::Clusters::offline(),
        },
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply[0].object["data"], json!({"from": "cache"}));
    let asked = source.asked.lock().unwrap();
    assert_eq!(asked.len(), 1, "one question per read");
    assert_eq!(asked[0].target, RelatedTarget::Name("src".into()));
    assert_eq!(asked[0].namespace.as_deref(), Some("ns"));
}

/// A related source that cannot answer: every kind unserved, or every read
/// refused with `reason`.
struct Cannot {
    reason: &'static str,
}

impl RelatedSource for Cannot {
    fn served(&self, gvk: &Gvk) -> Result<(), Unreadable> {
        if self.reason == Unreadable::KIND_NOT_SERVED {
            return Err(Unreadable {
                reason: self.reason,
                message: format!("{gvk} is not served"),
            });
        }
        Ok(())
    }

    fn find(&self, _gvk: &Gvk, _read: &RelatedRead) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
        Err(Unreadable {
            reason: self.reason,
            message: "cannot tell".into(),
        })
    }
}

fn plan_with_source(r: &CompiledRule, source: Cannot) -> Plan {
    // `cm` exists and is ready: Ready names what the related entry holds.
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let observed = Observed::from_objects([cm]).with_related(Arc::new(source));
    plan(
        r,
        &Input {
            parent: &parent(json!({"from": "src"})),
            observed: &observed,
            now: NOW,
            scope_of: &kinds::scope,
            clusters: &crate::clusters::Clusters::offline(),
        },
    )
}

#[test]
fn an_unreadable_related_entry_holds_back_its_readers_with_its_own_reason() {
    let r = rule(&format!("{PARENT_KIND}{SETTINGS}  children:\n{CM}{COPY}"));
    for reason in [
        Unreadable::KIND_NOT_SERVED,
        Unreadable::OUT_OF_SCOPE,
        Unreadable::UNDECODABLE,
    ] {
        let p = plan_with_source(&r, Cannot { reason });
        assert!(
            p.errors.is_empty(),
            "{reason}: pending, not an error: {:?}",
            p.errors
        );
        assert_eq!(p.apply.len(), 1, "{reason}: the other child is applied");
        assert_eq!(p.apply[0].id, "cm");
        assert_eq!(p.pending.len(), 1, "{reason}");
        assert_eq!(p.pending[0].reason, reason);
        let ready = condition(&p, "Ready");
        assert_eq!(ready["reason"], reason);
        assert!(
            ready["message"]
                .as_str()
                .unwrap()
                .starts_with("related \"settings\": "),
            "{ready}"
        );
        // An unserved kind is not read at all (nothing to index).
        let read = usize::from(reason != Unreadable::KIND_NOT_SERVED);
        assert_eq!(p.reads.len(), read, "{reason}");
    }
}

#[test]
fn an_optional_entry_of_an_unserved_kind_is_absent_but_an_unreadable_one_still_holds() {
    let optional = SETTINGS.replace("      name:", "      optional: true\n      name:");
    let copy = COPY.replace(
        "{{ related.settings.data }}",
        "{{ related.settings.data if related.settings is defined else {'none': 'yes'} }}",
    );
    let r = rule(&format!("{PARENT_KIND}{optional}  children:\n{copy}"));
    let p = plan_with_source(
        &r,
        Cannot {
            reason: Unreadable::KIND_NOT_SERVED,
        },
    );
    assert!(p.pending.is_empty(), "{:?}", p.pending);
    assert_eq!(p.apply[0].object["data"], json!({"none": "yes"}));
    for reason in [Unreadable::OUT_OF_SCOPE, Unreadable::UNDECODABLE] {
        let p = plan_with_source(&r, Cannot { reason });
        assert_eq!(
            p.pending.len(),
            1,
            "{reason}: it may exist, so it is not absent"
        );
        assert_eq!(p.pending[0].reason, reason);
    }
}

/// `SETTINGS` with `readyWhen: <expr>`, `COPY` reading it.
fn gated_settings(ready_when: &str) -> Arc<CompiledRule> {
    let ready = SETTINGS.replace(
        "      name:",
        &format!("      readyWhen: \"{ready_when}\"\n      name:"),
    );
    rule(&format!("{PARENT_KIND}{ready}  children:\n{CM}{COPY}"))
}

fn settings_source(extra: Value) -> Value {
    object("ConfigMap", Some("ns"), "src", json!({}), extra)
}

#[test]
fn undefined_related_ready_when_is_an_error_naming_entry_and_expression() {
    let r = gated_settings("self.status.ok");
    let old_copy = live("ConfigMap", "a-copy", "copy", json!({}));
    let stale = live("ConfigMap", "stale", "cm", json!({}));
    let p = run(
        &r,
        &parent(json!({"from": "src"})),
        vec![settings_source(json!({})), old_copy, stale],
    );
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    assert!(
        p.errors[0].contains("readyWhen of related \"settings\"")
            && p.errors[0].contains("self.status.ok"),
        "{:?}",
        p.errors
    );
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::RenderError)
    );
    assert_eq!(p.pending.len(), 1, "its reader waits: {:?}", p.pending);
    assert_eq!(p.pending[0].id, "copy");
    assert_eq!(p.apply.len(), 1, "a child that does not read it is applied");
    assert!(
        p.delete.is_empty(),
        "pruned despite an error: {:?}",
        p.delete
    );
    assert_eq!(condition(&p, "Synced")["reason"], "RenderError");
}

#[test]
fn related_ready_when_yielding_the_string_false_is_an_error() {
    let r = gated_settings("self.data.ready");
    let src = settings_source(json!({"data": {"ready": "false"}}));
    let p = run(&r, &parent(json!({"from": "src"})), vec![src]);
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("readyWhen of related \"settings\"") && e.contains("boolean")),
        "{:?}",
        p.errors
    );
    assert_eq!(p.pending[0].id, "copy");
}

#[test]
fn related_ready_when_with_default_is_not_ready_without_error() {
    let r = gated_settings("self.status.x | default(0) > 0");
    let p = run(
        &r,
        &parent(json!({"from": "src"})),
        vec![settings_source(json!({}))],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.pending[0].reason, "RelatedNotReady");
    assert_eq!(condition(&p, "Synced")["reason"], "RelatedNotReady");
}
