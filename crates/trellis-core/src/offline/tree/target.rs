//! `trellis tree`'s argument `KIND/NAME`: which rules' parent kind it
//! names, as kubectl reads a resource type — the kind, its plural or a
//! short name the rule's `crd:` declares, in any case, optionally followed
//! by `.group` to tell two groups' kinds of one name apart.

use std::sync::Arc;

use crate::kinds::{self, Gvk};
use crate::rules::{CompiledRule, RuleSet};

/// Why `KIND/NAME` names no parent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("expected KIND/NAME (e.g. webapp/shop), got {0:?}")]
    Malformed(String),
    #[error("no rule has parent kind {kind:?} (the rules' parent kinds: {known})")]
    NoRule { kind: String, known: String },
    #[error("{kind:?} names several parent kinds ({found}): add the group, e.g. {example}/NAME")]
    Ambiguous {
        kind: String,
        found: String,
        example: String,
    },
}

/// `KIND/NAME` split, the kind matched against the rules' parent kinds:
/// the parent kind and every rule of it, in the set's order, and the name.
pub fn resolve<'s>(
    set: &'s RuleSet,
    target: &str,
) -> Result<(Gvk, Vec<&'s Arc<CompiledRule>>, String), TargetError> {
    let malformed = || TargetError::Malformed(target.to_owned());
    let (kind, name) = target.split_once('/').ok_or_else(malformed)?;
    if kind.is_empty() || name.is_empty() || name.contains('/') {
        return Err(malformed());
    }
    let mut kinds_found: Vec<&Gvk> = Vec::new();
    for rule in &set.rules {
        if names(rule, kind) && !kinds_found.contains(&&rule.parent) {
            kinds_found.push(&rule.parent);
        }
    }
    match kinds_found.as_slice() {
        [] => {
            let mut known: Vec<String> = set.rules.iter().map(|r| r.parent.kind.clone()).collect();
            known.sort();
            known.dedup();
            Err(TargetError::NoRule {
                kind: kind.to_owned(),
                known: known.join(", "),
            })
        }
        [gvk] => {
            let rules = set.rules.iter().filter(|r| &r.parent == *gvk).collect();
            Ok(((*gvk).clone(), rules, name.to_owned()))
        }
        several => Err(TargetError::Ambiguous {
            kind: kind.to_owned(),
            found: several
                .iter()
                .map(|g| g.api_version() + " " + &g.kind)
                .collect::<Vec<_>>()
                .join(", "),
            example: format!("{}.{}", several[0].kind.to_lowercase(), several[0].group),
        }),
    }
}

/// Whether `text` names `rule`'s parent kind, kubectl-style.
fn names(rule: &CompiledRule, text: &str) -> bool {
    let gvk = &rule.parent;
    let text = text.to_lowercase();
    let (head, group) = match text.split_once('.') {
        Some((head, group)) => (head, Some(group)),
        None => (text.as_str(), None),
    };
    if group.is_some_and(|g| g != gvk.group.to_lowercase()) {
        return false;
    }
    let plural = rule
        .rule
        .spec
        .parent
        .plural
        .clone()
        .unwrap_or_else(|| kinds::plural(gvk));
    let short = rule
        .rule
        .spec
        .crd
        .as_ref()
        .map(|c| c.short_names.as_slice())
        .unwrap_or_default();
    head == gvk.kind.to_lowercase()
        || head == plural.to_lowercase()
        || short.iter().any(|s| s.to_lowercase() == head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> RuleSet {
        let rule = |name: &str, parent: &str, extra: &str| {
            format!(
                "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata: {{name: {name}}}\nspec:\n  parent: {parent}\n{extra}  children:\n    - id: c\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {{name: x}}\n"
            )
        };
        crate::rules::testing::load_texts(&[
            (
                "a.yaml",
                &rule(
                    "webapp",
                    "{apiVersion: demo.trellis.dev/v1, kind: WebApp}",
                    "  crd: {shortNames: [wa]}\n",
                ),
            ),
            (
                "b.yaml",
                &rule("db-a", "{apiVersion: a.example.com/v1, kind: Database}", ""),
            ),
            (
                "c.yaml",
                &rule("db-b", "{apiVersion: b.example.com/v1, kind: Database}", ""),
            ),
            (
                "d.yaml",
                &rule("expose", "{apiVersion: apps/v1, kind: Deployment}", ""),
            ),
            (
                "e.yaml",
                &rule("scale", "{apiVersion: apps/v1, kind: Deployment}", ""),
            ),
        ])
    }

    fn rule_names(target: &str) -> Result<(String, Vec<String>, String), TargetError> {
        let set = set();
        resolve(&set, target).map(|(gvk, rules, name)| {
            (
                gvk.kind,
                rules.iter().map(|r| r.name.clone()).collect(),
                name,
            )
        })
    }

    #[test]
    fn names_a_parent_kind_by_kind_plural_or_short_name_in_any_case() {
        for kind in [
            "WebApp",
            "webapp",
            "webapps",
            "wa",
            "WA",
            "webapp.demo.trellis.dev",
        ] {
            let (kind_found, rules, name) = rule_names(&format!("{kind}/shop")).expect(kind);
            assert_eq!((kind_found.as_str(), name.as_str()), ("WebApp", "shop"));
            assert_eq!(rules, ["webapp"]);
        }
    }

    #[test]
    fn every_rule_of_the_kind_is_taken() {
        let (_, rules, _) = rule_names("deployment/api").expect("deployment");
        assert_eq!(rules, ["expose", "scale"]);
    }

    #[test]
    fn a_kind_in_two_groups_needs_its_group_and_an_unknown_kind_lists_the_known_ones() {
        let err = rule_names("database/orders").expect_err("ambiguous");
        assert!(
            err.to_string().contains("database.a.example.com/NAME"),
            "{err}"
        );
        let (_, rules, _) = rule_names("databases.b.example.com/orders").expect("grouped");
        assert_eq!(rules, ["db-b"]);
        let err = rule_names("tenant/acme").expect_err("unknown");
        assert_eq!(
            err.to_string(),
            "no rule has parent kind \"tenant\" (the rules' parent kinds: Database, Deployment, WebApp)"
        );
        for bad in ["shop", "webapp/", "/shop", "webapp/a/b"] {
            assert_eq!(rule_names(bad), Err(TargetError::Malformed(bad.into())));
        }
    }
}
