//! What a new rule set means for each running rule: start, stop, restart
//! (new watches and preflight) or update (re-reconcile its parents).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::rules::{CompiledRule, RuleSet};

/// What a new rule set means for one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// New rule: start its watches.
    Start,
    /// Gone: stop its watches and apply its `onRuleRemoved`.
    Stop,
    /// Parent kind, namespaces, selector, child kinds or the permissions
    /// the rule needs changed: new watches (and a new preflight).
    Restart,
    /// Templates, children, status or settings changed: keep watches,
    /// re-reconcile every parent.
    Update,
}

/// Rule name → change; unchanged rules are absent.
pub fn diff(old: &RuleSet, new: &RuleSet) -> BTreeMap<String, Change> {
    let mut changes = BTreeMap::new();
    for rule in &old.rules {
        if new.get(&rule.name).is_none() {
            changes.insert(rule.name.clone(), Change::Stop);
        }
    }
    for rule in &new.rules {
        let change = match old.get(&rule.name) {
            None => Some(Change::Start),
            Some(before) if watches_differ(before, rule) => Some(Change::Restart),
            Some(before) if before.rule != rule.rule || before.templates != rule.templates => {
                Some(Change::Update)
            }
            Some(_) => None,
        };
        if let Some(change) = change {
            changes.insert(rule.name.clone(), change);
        }
    }
    changes
}

/// Whether the watches a rule needs (related watches included: a selector
/// made static, a new cross-namespace entry), or the permissions it needs
/// (a policy change can add a verb, `rollout:` the revision ConfigMaps'
/// verbs, which only a new preflight checks), changed.
fn watches_differ(a: &Arc<CompiledRule>, b: &Arc<CompiledRule>) -> bool {
    let permissions = |r: &CompiledRule| {
        let mut p: Vec<String> = crate::rbac::rule_permissions(r)
            .iter()
            .chain(&crate::rbac::revision_permissions(r))
            .map(|p| p.to_string())
            .collect();
        p.sort();
        p
    };
    let child_kinds = |r: &CompiledRule| {
        let mut kinds: Vec<(String, bool)> = r
            .children
            .iter()
            .map(|c| (c.gvk.to_string(), c.spec.allow_cross_namespace))
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    };
    // A new account: its client and its read preflight (see
    // `operator::identity`) are set when the rule starts.
    a.rule.spec.parent != b.rule.spec.parent
        || a.rule.spec.service_account_name != b.rule.spec.service_account_name
        || child_kinds(a) != child_kinds(b)
        || permissions(a) != permissions(b)
        || crate::related_watches::watch_specs(a) != crate::related_watches::watch_specs(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    use crate::reload::{RULE, fingerprint};
    use crate::rules::load_dir;

    /// The test rule `name` on parent kind `kind`, its ConfigMap holding `text`.
    fn rule(name: &str, kind: &str, text: &str) -> String {
        RULE.replace("NAME", name)
            .replace("KIND", kind)
            .replace("TEXT", text)
    }

    fn set(rules: &[(&str, &str, &str)]) -> RuleSet {
        let dir = tempfile::tempdir().unwrap();
        for (name, kind, text) in rules {
            fs::write(
                dir.path().join(format!("{name}.yaml")),
                rule(name, kind, text),
            )
            .unwrap();
        }
        load_dir(dir.path()).unwrap()
    }

    /// A rule set of the one rule file `r.yaml` holding `body`.
    fn one(body: &str) -> RuleSet {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("r.yaml"), body).unwrap();
        load_dir(dir.path()).unwrap()
    }

    #[test]
    fn diff_starts_stops_restarts_and_updates() {
        let old = set(&[
            ("keep", "A", "x"),
            ("gone", "B", "x"),
            ("edit", "C", "x"),
            ("move", "D", "x"),
        ]);
        let new = set(&[
            ("keep", "A", "x"),
            ("edit", "C", "y"),
            ("move", "E", "x"),
            ("fresh", "F", "x"),
        ]);
        let changes = diff(&old, &new);
        assert_eq!(
            changes.get("keep"),
            None,
            "unchanged rules are not disturbed"
        );
        assert_eq!(changes["gone"], Change::Stop);
        assert_eq!(changes["edit"], Change::Update);
        assert_eq!(changes["move"], Change::Restart);
        assert_eq!(changes["fresh"], Change::Start);
        assert_eq!(changes.len(), 4);
    }

    #[test]
    fn new_child_kind_restarts_watches() {
        let old = set(&[("r", "A", "x")]);
        let new = one(&(rule("r", "A", "x")
            + "    - id: s\n      apiVersion: v1\n      kind: Secret\n      template: 'metadata: {name: s}'\n"));
        assert_eq!(diff(&old, &new)["r"], Change::Restart);
    }

    #[test]
    fn a_policy_change_that_needs_new_verbs_restarts() {
        let old = set(&[("r", "A", "x")]);
        let new = one(&rule("r", "A", "x").replace(
            "      kind: ConfigMap\n",
            "      kind: ConfigMap\n      policy: createOnly\n",
        ));
        // createOnly needs no `patch`: the preflight must run again.
        assert_eq!(diff(&old, &new)["r"], Change::Restart);
    }

    #[test]
    fn adding_rollout_restarts_so_the_preflight_asks_for_the_revision_configmaps() {
        let old = set(&[("r", "A", "x")]);
        let rollout = "  rollout:\n    steps:\n      - percent: 50\n";
        let new = one(&(rule("r", "A", "x") + rollout));
        assert!(new.rules[0].rollout.is_some());
        assert_eq!(diff(&old, &new)["r"], Change::Restart);
        // An edit that keeps `rollout:` needs nothing new.
        let edited = one(&(rule("r", "A", "y") + rollout));
        assert_eq!(diff(&new, &edited)["r"], Change::Update);
    }

    #[test]
    fn template_file_edit_is_an_update() {
        let dir = tempfile::tempdir().unwrap();
        let body = rule("r", "A", "TEXT")
            .replace("      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n        data: {v: TEXT}\n", "      templateFile: cm.j2\n");
        fs::write(dir.path().join("r.yaml"), body).unwrap();
        fs::write(dir.path().join("cm.j2"), "metadata: {name: a}\n").unwrap();
        let old = load_dir(dir.path()).unwrap();
        let before = fingerprint(&[dir.path().to_path_buf()]);
        fs::write(dir.path().join("cm.j2"), "metadata: {name: b}\n").unwrap();
        assert_ne!(before, fingerprint(&[dir.path().to_path_buf()]));
        let new = load_dir(dir.path()).unwrap();
        assert_eq!(diff(&old, &new)["r"], Change::Update);
    }
}
