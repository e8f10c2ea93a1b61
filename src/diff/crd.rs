//! The CRD part of `trellis diff`: what `--manage-crds` would change in
//! each rule's generated CRD, and whether it would refuse the change as
//! breaking (the rule then keeps its last good version).

use std::fmt::Write;

use super::{FieldChange, write_fields};

/// What applying one rule's generated CRD would do.
#[derive(Debug, Clone, PartialEq)]
pub struct CrdDiff {
    pub rule: String,
    /// The CRD's name (`widgets.example.com`).
    pub name: String,
    pub change: CrdChange,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CrdChange {
    /// Not on the cluster: it would be created.
    Create,
    /// These fields would change; `breaking` lists (one line each, naming
    /// version and path) what would break stored parents or clients, which
    /// `--manage-crds` refuses unless `allowed` (`crd: {allowBreaking: true}`).
    Update {
        fields: Vec<FieldChange>,
        breaking: Vec<String>,
        allowed: bool,
    },
    Unchanged,
}

impl CrdDiff {
    /// Whether `--manage-crds` would refuse the change.
    pub fn refused(&self) -> bool {
        matches!(&self.change, CrdChange::Update { breaking, allowed: false, .. } if !breaking.is_empty())
    }
}

/// Exit code contribution of the CRDs: 0 unchanged, 1 a change would be
/// applied, 2 a change would be refused as breaking.
pub fn exit_code(crds: &[CrdDiff]) -> u8 {
    if crds.iter().any(CrdDiff::refused) {
        2
    } else if crds.iter().any(|c| c.change != CrdChange::Unchanged) {
        1
    } else {
        0
    }
}

/// One block per CRD that would change; nothing for unchanged ones.
pub fn print(crds: &[CrdDiff]) -> String {
    let mut out = String::new();
    for crd in crds {
        let head = format!("CustomResourceDefinition {} (rule {})", crd.name, crd.rule);
        match &crd.change {
            CrdChange::Unchanged => {}
            CrdChange::Create => {
                let _ = writeln!(out, "{head}\n  + (create)");
            }
            CrdChange::Update {
                fields,
                breaking,
                allowed,
            } => {
                let _ = writeln!(out, "{head}");
                if !fields.is_empty() {
                    out.push_str("  ~ the CRD\n");
                    write_fields(&mut out, fields);
                }
                if breaking.is_empty() {
                    out.push_str("  safe to apply\n");
                    continue;
                }
                let _ = writeln!(
                    out,
                    "  breaking: {}",
                    if *allowed {
                        "applied anyway (crd: {allowBreaking: true})"
                    } else {
                        "not applied by --manage-crds; the rule keeps its last good version"
                    }
                );
                for line in breaking {
                    let _ = writeln!(out, "    {line}");
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn update(breaking: &[&str], allowed: bool) -> CrdDiff {
        CrdDiff {
            rule: "widget".into(),
            name: "widgets.x.io".into(),
            change: CrdChange::Update {
                fields: vec![FieldChange {
                    path: "spec.versions[name=v1].served".into(),
                    before: Some(json!(true)),
                    after: Some(json!(false)),
                }],
                breaking: breaking.iter().map(|s| s.to_string()).collect(),
                allowed,
            },
        }
    }

    #[test]
    fn a_breaking_change_is_named_and_exits_two_unless_allowed() {
        let refused = update(
            &["version v1: un-served while objects are stored in it"],
            false,
        );
        assert_eq!(exit_code(std::slice::from_ref(&refused)), 2);
        let text = print(&[refused]);
        assert!(
            text.starts_with("CustomResourceDefinition widgets.x.io (rule widget)\n  ~ the CRD\n"),
            "{text}"
        );
        assert!(text.ends_with("  breaking: not applied by --manage-crds; the rule keeps its last good version\n    version v1: un-served while objects are stored in it\n"), "{text}");
        let allowed = update(&["version v1: x"], true);
        assert_eq!(exit_code(std::slice::from_ref(&allowed)), 1);
        assert!(print(&[allowed]).contains("breaking: applied anyway"));
    }

    #[test]
    fn a_safe_change_exits_one_and_an_unchanged_crd_prints_nothing() {
        let safe = update(&[], false);
        assert_eq!(exit_code(std::slice::from_ref(&safe)), 1);
        assert!(print(&[safe]).ends_with("  safe to apply\n"));
        let same = CrdDiff {
            rule: "widget".into(),
            name: "widgets.x.io".into(),
            change: CrdChange::Unchanged,
        };
        assert_eq!(exit_code(std::slice::from_ref(&same)), 0);
        assert_eq!(print(&[same]), "");
    }
}
