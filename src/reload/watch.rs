//! Noticing that the rules directories may have changed: a fingerprint of
//! their contents, and a channel that wakes on a filesystem event or a poll.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::RecursiveMode;
use notify_debouncer_full::new_debouncer;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::warn;

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

#[cfg(test)]
mod tests {
    use super::*;

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
