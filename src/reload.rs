//! Noticing rule changes on disk and deciding what they mean.
//!
//! ```text
//!  notify (debounced) ─┐
//!  30 s poll (hashes) ─┴─▶ content fingerprint changed? ──▶ RuleSet::load (the `check` path)
//!                                                              │ error: keep the running set
//!                                                              ▼ ok
//!                                      diff(old, new) ──▶ start / stop / restart / update
//! ```
//!
//! The kubelet updates a ConfigMap volume by writing a new timestamped
//! directory and renaming `..data` onto it; event kinds are unreliable there,
//! so any event under a rules directory only means "look again", and the
//! decision rests on a fingerprint of the files' contents. Carrying out the
//! diff is the operator's job.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::RecursiveMode;
use notify_debouncer_full::new_debouncer;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::warn;

use crate::rules::{CompiledRule, RuleSet};

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

/// Whether the watches a rule needs, or the permissions it needs (a policy
/// change can add a verb, which only a new preflight checks), changed.
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
    a.rule.spec.parent != b.rule.spec.parent
        || child_kinds(a) != child_kinds(b)
        || permissions(a) != permissions(b)
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
