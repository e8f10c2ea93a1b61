//! What of a load runs: every rule that validates as loaded, every
//! rejected rule at its last good version, with the errors tied to the
//! rules they concern.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::rules::{CompiledRule, Diagnostic, Loaded, RuleSet, Severity};

/// What a reload takes up: the set to run and what it kept back.
#[derive(Debug, Default)]
pub struct Partition {
    /// Rules as loaded where they validate; a rejected rule at its last good
    /// version (absent when it had none).
    pub set: RuleSet,
    /// Rejected rule → the errors that concern it.
    pub rejected: BTreeMap<String, Vec<Diagnostic>>,
    /// Errors that concern no rule known by name (a new file that does not
    /// parse, a new document without a name): nothing runs from them.
    pub unattributed: Vec<Diagnostic>,
    /// Every diagnostic, sorted by file and line (what `check` prints).
    pub diagnostics: Vec<Diagnostic>,
}

impl Partition {
    /// Whether any error was found (the set `check` would reject).
    pub fn has_errors(&self) -> bool {
        self.diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error)
    }
}

/// Splits a loaded rule set into what validates and what keeps its last
/// good version. `last_good` is the running set (empty at start).
pub fn partition(last_good: &RuleSet, loaded: Loaded) -> Partition {
    let diagnostics = loaded.diagnostics();
    let errors = |diags: &[Diagnostic]| -> Vec<Diagnostic> {
        diags
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .cloned()
            .collect()
    };
    let mut rejected: BTreeMap<String, Vec<Diagnostic>> = BTreeMap::new();
    let mut unattributed = Vec::new();
    // The rules a file (or everything under a directory) held at the last good load.
    let held_by = |path: &std::path::Path| -> Vec<String> {
        last_good
            .rules
            .iter()
            .filter(|r| r.file.starts_with(path))
            .map(|r| r.name.clone())
            .collect()
    };
    let mut attribute = |names: Vec<String>, diag: Diagnostic| {
        if names.is_empty() {
            unattributed.push(diag);
            return;
        }
        for name in names {
            rejected.entry(name).or_default().push(diag.clone());
        }
    };
    for diag in loaded
        .files
        .iter()
        .filter(|d| d.severity == Severity::Error)
    {
        attribute(held_by(&diag.file), diag.clone());
    }
    for (names, diag) in &loaded.set {
        if diag.severity == Severity::Error {
            attribute(names.iter().cloned().collect(), diag.clone());
        }
    }
    for doc in loaded.docs.iter().filter(|d| d.has_errors()) {
        let names = match &doc.name {
            Some(name) => vec![name.clone()],
            // No name to go by: the rules its file held that no document
            // there names any more (most likely this one, renamed badly).
            None => {
                let named_here: BTreeSet<&str> = loaded
                    .docs
                    .iter()
                    .filter(|d| d.file == doc.file)
                    .filter_map(|d| d.name.as_deref())
                    .collect();
                held_by(&doc.file)
                    .into_iter()
                    .filter(|n| !named_here.contains(n.as_str()))
                    .collect()
            }
        };
        for diag in errors(&doc.diags) {
            attribute(names.clone(), diag);
        }
    }
    let mut rules: Vec<Arc<CompiledRule>> = loaded
        .docs
        .iter()
        .filter_map(|d| d.rule.clone())
        .filter(|r| !rejected.contains_key(&r.name))
        .collect();
    rules.extend(rejected.keys().filter_map(|n| last_good.get(n).cloned()));
    rules.sort_by(|a, b| a.name.cmp(&b.name));
    let warnings = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Warning)
        .cloned()
        .collect();
    Partition {
        set: RuleSet { rules, warnings },
        rejected,
        unattributed,
        diagnostics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    use crate::reload::{Change, RULE, diff};

    /// A directory of rule files: (file name, rule name, kind, text);
    /// a text of `BROKEN` gives a rule with an unknown name in a template.
    fn write(dir: &Path, files: &[(&str, &str, &str, &str)]) {
        for entry in fs::read_dir(dir).unwrap() {
            fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let mut by_file: BTreeMap<&str, String> = BTreeMap::new();
        for (file, name, kind, text) in files {
            let mut body = RULE
                .replace("NAME", name)
                .replace("KIND", kind)
                .replace("TEXT", text);
            if *text == "BROKEN" {
                body = body.replace("parent.metadata.name", "parnet.metadata.name");
            }
            let doc = by_file.entry(file).or_default();
            if !doc.is_empty() {
                doc.push_str("---\n");
            }
            doc.push_str(&body);
        }
        for (file, text) in by_file {
            fs::write(dir.join(file), text).unwrap();
        }
    }

    fn read(dir: &Path) -> Loaded {
        Loaded::read(&[dir.to_path_buf()], Default::default())
    }

    fn text_of(set: &RuleSet, name: &str) -> String {
        set.get(name)
            .map(|r| r.templates["cm"].clone())
            .unwrap_or_default()
    }

    /// Two good rules in two files, loaded as the running set.
    fn two_good() -> (tempfile::TempDir, RuleSet) {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[("a.yaml", "a", "A", "x"), ("b.yaml", "b", "B", "x")],
        );
        let good = partition(&RuleSet::default(), read(dir.path()));
        assert!(!good.has_errors(), "{:?}", good.diagnostics);
        (dir, good.set)
    }

    #[test]
    fn a_broken_rule_keeps_its_last_good_version_and_the_others_update() {
        let (dir, last) = two_good();
        write(
            dir.path(),
            &[("a.yaml", "a", "A", "y"), ("b.yaml", "b", "B", "BROKEN")],
        );
        let p = partition(&last, read(dir.path()));
        assert!(p.has_errors());
        assert!(text_of(&p.set, "a").contains("{v: y}"), "a is updated");
        assert!(
            Arc::ptr_eq(&p.set.rules[1], last.get("b").unwrap()),
            "b runs its last good version"
        );
        assert_eq!(p.rejected.keys().collect::<Vec<_>>(), ["b"]);
        let why = p.rejected["b"][0].to_string();
        assert!(why.contains("b.yaml:") && why.contains("parnet"), "{why}");
        assert!(p.unattributed.is_empty());
        let changes = diff(&last, &p.set);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes["a"], Change::Update);
    }

    #[test]
    fn a_new_broken_rule_is_not_started() {
        let (dir, last) = two_good();
        write(
            dir.path(),
            &[
                ("a.yaml", "a", "A", "x"),
                ("b.yaml", "b", "B", "x"),
                ("c.yaml", "c", "C", "BROKEN"),
            ],
        );
        let p = partition(&last, read(dir.path()));
        assert!(p.set.get("c").is_none());
        assert!(p.rejected.contains_key("c"));
        assert!(diff(&last, &p.set).is_empty(), "nothing else moves");
    }

    #[test]
    fn a_file_that_does_not_parse_keeps_every_rule_it_held() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("a.yaml", "a", "A", "x"),
                ("a.yaml", "a2", "A2", "x"),
                ("b.yaml", "b", "B", "x"),
            ],
        );
        let last = partition(&RuleSet::default(), read(dir.path())).set;
        write(dir.path(), &[("b.yaml", "b", "B", "y")]);
        fs::write(
            dir.path().join("a.yaml"),
            "kind: Rule\nmetadata: {name: [oops\n",
        )
        .unwrap();
        let p = partition(&last, read(dir.path()));
        assert_eq!(p.rejected.keys().collect::<Vec<_>>(), ["a", "a2"]);
        assert!(Arc::ptr_eq(p.set.get("a").unwrap(), last.get("a").unwrap()));
        assert!(Arc::ptr_eq(
            p.set.get("a2").unwrap(),
            last.get("a2").unwrap()
        ));
        assert!(text_of(&p.set, "b").contains("{v: y}"));
        assert!(p.rejected["a"][0].to_string().contains("a.yaml:"));
    }

    #[test]
    fn a_new_file_that_does_not_parse_concerns_no_rule_and_blocks_none() {
        let (dir, last) = two_good();
        write(
            dir.path(),
            &[("a.yaml", "a", "A", "y"), ("b.yaml", "b", "B", "x")],
        );
        fs::write(dir.path().join("new.yaml"), "metadata: {name: [oops\n").unwrap();
        let p = partition(&last, read(dir.path()));
        assert!(p.has_errors(), "check still fails the set");
        assert!(p.rejected.is_empty());
        assert_eq!(p.unattributed.len(), 1);
        assert!(text_of(&p.set, "a").contains("{v: y}"));
    }

    #[test]
    fn one_name_used_twice_keeps_that_rule_at_its_last_good_version() {
        let (dir, last) = two_good();
        write(
            dir.path(),
            &[
                ("a.yaml", "a", "A", "y"),
                ("b.yaml", "b", "B", "y"),
                ("c.yaml", "a", "C", "z"),
            ],
        );
        let p = partition(&last, read(dir.path()));
        assert_eq!(p.rejected.keys().collect::<Vec<_>>(), ["a"]);
        assert!(Arc::ptr_eq(p.set.get("a").unwrap(), last.get("a").unwrap()));
        assert!(text_of(&p.set, "b").contains("{v: y}"));
        assert_eq!(p.set.rules.len(), 2);
    }

    #[test]
    fn a_broken_document_without_a_name_concerns_the_rules_its_file_lost() {
        let (dir, last) = two_good();
        write(dir.path(), &[("a.yaml", "a", "A", "y")]);
        fs::write(
            dir.path().join("b.yaml"),
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata: {}\nspec: {}\n",
        )
        .unwrap();
        let p = partition(&last, read(dir.path()));
        assert_eq!(p.rejected.keys().collect::<Vec<_>>(), ["b"]);
        assert!(Arc::ptr_eq(p.set.get("b").unwrap(), last.get("b").unwrap()));
        assert!(text_of(&p.set, "a").contains("{v: y}"));
    }

    #[test]
    fn a_good_set_is_taken_whole() {
        let (dir, last) = two_good();
        write(dir.path(), &[("a.yaml", "a", "A", "y")]);
        let p = partition(&last, read(dir.path()));
        assert!(!p.has_errors() && p.rejected.is_empty() && p.unattributed.is_empty());
        assert_eq!(diff(&last, &p.set)["b"], Change::Stop);
        let whole = read(dir.path()).into_set().unwrap();
        assert_eq!(whole.rules.len(), p.set.rules.len());
    }
}
