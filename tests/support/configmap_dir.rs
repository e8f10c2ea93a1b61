//! A rules directory laid out exactly as the kubelet lays out a ConfigMap
//! volume, and updated exactly as the kubelet updates one.
//!
//! ```text
//!  rules/
//!    ..2026_11_29_09_00_00.2/   every key's file, written in full per update
//!    ..data -> ..2026_11_29_09_00_00.2
//!    app.yaml -> ..data/app.yaml
//! ```
//!
//! An update writes a new timestamped directory holding all keys, points a
//! fresh `..data_tmp` link at it, renames that link onto `..data` (the atomic
//! swap), then adds links for new keys, removes links of removed keys and
//! deletes the old timestamped directory — the kubelet's `AtomicWriter` order.
//!
//! Not declared by `support/mod.rs`: include it with
//! `#[path = "support/configmap_dir.rs"] mod configmap_dir;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A ConfigMap volume on disk: key → content.
pub struct ConfigMapDir {
    root: tempfile::TempDir,
    generation: u32,
    keys: BTreeMap<String, String>,
}

impl ConfigMapDir {
    /// A volume holding `files` (key, content), as a fresh mount shows it.
    pub fn new(files: &[(&str, &str)]) -> ConfigMapDir {
        let root = tempfile::tempdir().expect("temp dir for the ConfigMap volume");
        let mut dir = ConfigMapDir {
            root,
            generation: 0,
            keys: BTreeMap::new(),
        };
        dir.update(files);
        dir
    }

    /// The mount point: what `--rules` names.
    pub fn path(&self) -> PathBuf {
        self.root.path().to_path_buf()
    }

    /// The keys the volume holds now.
    pub fn keys(&self) -> Vec<String> {
        self.keys.keys().cloned().collect()
    }

    /// Replaces the whole content with `files`, as the kubelet does after the
    /// ConfigMap changed. Returns the moment of the atomic `..data` swap.
    pub fn update(&mut self, files: &[(&str, &str)]) -> Instant {
        let root = self.root.path();
        let new: BTreeMap<String, String> = files
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let old_dir = self.data_dir_name();
        self.generation += 1;
        let new_dir = self.data_dir_name();
        fs::create_dir(root.join(&new_dir)).expect("create the timestamped directory");
        for (key, content) in &new {
            fs::write(root.join(&new_dir).join(key), content).expect("write a key");
        }
        symlink(&new_dir, root.join("..data_tmp")).expect("link ..data_tmp");
        fs::rename(root.join("..data_tmp"), root.join("..data")).expect("swap ..data");
        let swapped = Instant::now();
        for key in new.keys().filter(|k| !self.keys.contains_key(*k)) {
            symlink(Path::new("..data").join(key), root.join(key)).expect("link a new key");
        }
        for key in self.keys.keys().filter(|k| !new.contains_key(*k)) {
            fs::remove_file(root.join(key)).expect("unlink a removed key");
        }
        if self.generation > 1 {
            fs::remove_dir_all(root.join(&old_dir)).expect("remove the old timestamped directory");
        }
        self.keys = new;
        swapped
    }

    fn data_dir_name(&self) -> String {
        format!("..2026_11_29_09_00_00.{}", self.generation)
    }
}
