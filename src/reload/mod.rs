//! Noticing rule changes on disk and deciding what they mean.
//!
//! ```text
//!  notify (debounced) ─┐
//!  30 s poll (hashes) ─┴─▶ content fingerprint changed? ──▶ Loaded::read (the `check` path)
//!                                                              │
//!                               partition(last good, loaded) ◀─┘
//!                                 │ a rule with an error: its last good version (or none)
//!                                 ▼ every other rule: as loaded
//!                       diff(old, new) ──▶ start / stop / restart / update
//! ```
//!
//! One broken rule never holds up the others: each diagnostic is tied to
//! the rules it concerns (its document's rule; every rule a file held at
//! the last good load when the file cannot be read or parsed; every rule of
//! a name used twice), and only those rules stay at their last good version.
//!
//! The kubelet updates a ConfigMap volume by writing a new timestamped
//! directory and renaming `..data` onto it; event kinds are unreliable there,
//! so any event under a rules directory only means "look again", and the
//! decision rests on a fingerprint of the files' contents. Carrying out the
//! diff is the operator's job.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::RecursiveMode;
use notify_debouncer_full::new_debouncer;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::warn;

use crate::rules::{CompiledRule, Diagnostic, Loaded, RuleSet, Severity};

/// Files larger than this are not hashed (the loader refuses them anyway).
const MAX_HASHED_BYTES: u64 = 4 * 1024 * 1024;
/// Deepest directory level hashed below a rules directory.
const MAX_DEPTH: usize = 8;

/// Hash of everything under the rules directories that a rule could read:
/// every regular file's path and content, following symlinks, skipping the
/// kubelet's dot entries (whose content is reached through the links anyway).
pub fn fingerprint(dirs: &[PathBuf]) -> String {
    let mut hasher = Sha256::new();
    for dir in dirs {
        hasher.update(dir.to_string_lossy().as_bytes());
        hash_dir(dir, dir, 0, &mut hasher);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn hash_dir(root: &Path, dir: &Path, depth: usize, hasher: &mut Sha256) {
    if depth > MAX_DEPTH {
        return;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        hasher.update(b"<unreadable>");
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    paths.sort();
    for path in paths {
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        let rel = path.strip_prefix(root).unwrap_or(&path);
        hasher.update(rel.to_string_lossy().as_bytes());
        if meta.is_dir() {
            hash_dir(root, &path, depth + 1, hasher);
        } else if meta.is_file() && meta.len() <= MAX_HASHED_BYTES {
            match fs::read(&path) {
                Ok(bytes) => hasher.update(&bytes),
                Err(_) => hasher.update(b"<unreadable>"),
            }
        } else {
            hasher.update(meta.len().to_le_bytes());
        }
    }
}

/// Sends `()` whenever something under `dirs` may have changed: on a
/// debounced filesystem event, and every `poll` as a safety net. The
/// receiver compares fingerprints; extra wake-ups are cheap.
pub fn watch(dirs: &[PathBuf], debounce: Duration, poll: Duration) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel(1);
    let notify_tx = tx.clone();
    let handler = move |result: notify_debouncer_full::DebounceEventResult| {
        match result {
            // Opening and closing (inotify watches OPEN) changes nothing, and
            // the reloader's own reads would otherwise wake it forever.
            Ok(events) if events.iter().any(|e| !e.kind.is_access()) => {
                // A full channel already carries a wake-up.
                let _ = notify_tx.try_send(());
            }
            Ok(_) => {}
            Err(errors) => {
                for e in errors {
                    warn!("watching rules: {e}");
                }
                let _ = notify_tx.try_send(());
            }
        }
    };
    match new_debouncer(debounce, None, handler) {
        Ok(mut debouncer) => {
            for dir in dirs {
                if let Err(err) = debouncer.watch(dir, RecursiveMode::Recursive) {
                    warn!(dir = %dir.display(), "cannot watch rules directory (polling only): {err}");
                }
            }
            // The debouncer stops when dropped; it lives as long as the poller.
            tokio::spawn(async move {
                let _keep = debouncer;
                let mut tick = tokio::time::interval(poll);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    if tx.send(()).await.is_err() {
                        return;
                    }
                }
            });
        }
        Err(err) => {
            warn!("cannot start a filesystem watcher (polling only): {err}");
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(poll);
                loop {
                    tick.tick().await;
                    if tx.send(()).await.is_err() {
                        return;
                    }
                }
            });
        }
    }
    rx
}

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
/// (a policy change can add a verb, which only a new preflight checks), changed.
fn watches_differ(a: &Arc<CompiledRule>, b: &Arc<CompiledRule>) -> bool {
    let permissions = |r: &CompiledRule| {
        let mut p: Vec<String> = crate::rbac::rule_permissions(r)
            .iter()
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
        || crate::operator::related::watch_specs(a) != crate::operator::related::watch_specs(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::load_dir;

    const RULE: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: NAME\nspec:\n  parent: {apiVersion: demo.trellis.dev/v1, kind: KIND}\n  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n        data: {v: TEXT}\n";

    fn set(rules: &[(&str, &str, &str)]) -> RuleSet {
        let dir = tempfile::tempdir().unwrap();
        for (name, kind, text) in rules {
            let body = RULE
                .replace("NAME", name)
                .replace("KIND", kind)
                .replace("TEXT", text);
            fs::write(dir.path().join(format!("{name}.yaml")), body).unwrap();
        }
        load_dir(dir.path()).unwrap()
    }

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
        let dir = tempfile::tempdir().unwrap();
        let body = RULE
            .replace("NAME", "r")
            .replace("KIND", "A")
            .replace("TEXT", "x")
            + "    - id: s\n      apiVersion: v1\n      kind: Secret\n      template: 'metadata: {name: s}'\n";
        fs::write(dir.path().join("r.yaml"), body).unwrap();
        let new = load_dir(dir.path()).unwrap();
        assert_eq!(diff(&old, &new)["r"], Change::Restart);
    }

    #[test]
    fn a_policy_change_that_needs_new_verbs_restarts() {
        let old = set(&[("r", "A", "x")]);
        let dir = tempfile::tempdir().unwrap();
        let body = RULE
            .replace("NAME", "r")
            .replace("KIND", "A")
            .replace("TEXT", "x")
            .replace(
                "      kind: ConfigMap\n",
                "      kind: ConfigMap\n      policy: createOnly\n",
            );
        fs::write(dir.path().join("r.yaml"), body).unwrap();
        let new = load_dir(dir.path()).unwrap();
        // createOnly needs no `patch`: the preflight must run again.
        assert_eq!(diff(&old, &new)["r"], Change::Restart);
    }

    #[test]
    fn template_file_edit_is_an_update() {
        let dir = tempfile::tempdir().unwrap();
        let body = RULE
            .replace("NAME", "r")
            .replace("KIND", "A")
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

    #[test]
    fn fingerprint_follows_a_configmap_data_swap() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let v1 = root.join("..2026_11_29_00_00_00.1");
        let v2 = root.join("..2026_11_29_00_00_01.2");
        fs::create_dir(&v1).unwrap();
        fs::create_dir(&v2).unwrap();
        fs::write(v1.join("r.yaml"), "a").unwrap();
        fs::write(v2.join("r.yaml"), "b").unwrap();
        std::os::unix::fs::symlink("..2026_11_29_00_00_00.1", root.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/r.yaml", root.join("r.yaml")).unwrap();
        let before = fingerprint(&[root.to_path_buf()]);
        // The kubelet's atomic swap: a new link renamed over ..data.
        std::os::unix::fs::symlink("..2026_11_29_00_00_01.2", root.join("..data_tmp")).unwrap();
        fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        assert_ne!(before, fingerprint(&[root.to_path_buf()]));
    }

    #[tokio::test]
    async fn reading_the_rules_does_not_wake_the_watch() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        fs::write(root.join("r.yaml"), "a").unwrap();
        let mut rx = watch(
            std::slice::from_ref(&root),
            Duration::from_millis(50),
            Duration::from_secs(3600),
        );
        // Let the watcher settle, then read everything as a reload does.
        tokio::time::sleep(Duration::from_millis(300)).await;
        while rx.try_recv().is_ok() {}
        fingerprint(std::slice::from_ref(&root));
        let woke = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await;
        assert!(woke.is_err(), "reading the rules woke the watch");
    }

    #[tokio::test]
    async fn watch_wakes_on_a_data_swap() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        fs::create_dir(root.join("..v1")).unwrap();
        fs::write(root.join("..v1/r.yaml"), "a").unwrap();
        std::os::unix::fs::symlink("..v1", root.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/r.yaml", root.join("r.yaml")).unwrap();
        let mut rx = watch(
            std::slice::from_ref(&root),
            Duration::from_millis(100),
            Duration::from_secs(3600),
        );
        fs::create_dir(root.join("..v2")).unwrap();
        fs::write(root.join("..v2/r.yaml"), "b").unwrap();
        std::os::unix::fs::symlink("..v2", root.join("..data_tmp")).unwrap();
        fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        let woke = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert!(matches!(woke, Ok(Some(()))), "no wake-up after the swap");
    }
}
