//! The files the language server checks: the rule directories found under
//! the workspace (every directory holding a `trellis.dev/v1alpha1` Rule
//! document), the editor's open buffers (their unsaved text wins over the
//! disk), and the diagnostics `check` gives each directory, by file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::offline::check::{Inputs, diagnostics};
use crate::render::Limits;
use crate::rules::Diagnostic;
use crate::rules::load::Read;

/// Directories not searched for rules.
const SKIP: &[&str] = &["target", "node_modules", "vendor"];
/// Most directories visited under one workspace folder.
const MAX_DIRS: usize = 5_000;

/// Open buffers by path: shared with the reader `check` is given.
pub type Buffers = Arc<RwLock<HashMap<PathBuf, String>>>;

#[derive(Default)]
pub struct Workspace {
    pub roots: Vec<PathBuf>,
    /// Rule directories, each checked as one set (as `check --rules DIR`).
    pub dirs: BTreeSet<PathBuf>,
    pub buffers: Buffers,
    pub inputs: Inputs,
    /// Rule test files (`*.test.yaml`), found or opened; canonical paths.
    pub tests: BTreeSet<PathBuf>,
}

impl Workspace {
    /// Looks for rule directories under every root.
    pub fn scan(&mut self) {
        for root in self.roots.clone() {
            let mut visited = 0;
            self.scan_dir(&root, &mut visited);
        }
    }

    fn scan_dir(&mut self, dir: &Path, visited: &mut usize) {
        *visited += 1;
        if *visited > MAX_DIRS {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut subdirs = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if !SKIP.contains(&name.as_ref()) {
                    subdirs.push(path);
                }
            } else if super::ruletests::is_test_file(&path) {
                self.tests.insert(canonical(&path));
            } else if is_yaml(&path)
                && !self.dirs.contains(dir)
                && std::fs::read_to_string(&path).is_ok_and(|text| holds_rule(&text))
            {
                self.dirs.insert(dir.to_path_buf());
            }
        }
        subdirs.sort();
        for sub in subdirs {
            self.scan_dir(&sub, visited);
        }
    }

    /// An opened or changed buffer: its directory becomes a rule directory
    /// when the text holds a rule.
    pub fn note(&mut self, path: &Path, text: &str) {
        if super::ruletests::is_test_file(path) {
            self.tests.insert(path.to_path_buf());
            return;
        }
        if is_yaml(path)
            && holds_rule(text)
            && let Some(dir) = path.parent()
        {
            self.dirs.insert(dir.to_path_buf());
        }
    }

    /// The text of `path`: its open buffer, else the file.
    pub fn text(&self, path: &Path) -> Option<String> {
        if let Some(text) = self.buffers.read().ok()?.get(path) {
            return Some(text.clone());
        }
        std::fs::read_to_string(path).ok()
    }

    /// The rule directories a change to `path` concerns: those holding it
    /// (a rule file, or a template file in a subdirectory).
    pub fn dirs_of(&self, path: &Path) -> BTreeSet<PathBuf> {
        self.dirs
            .iter()
            .filter(|d| path.starts_with(d))
            .cloned()
            .collect()
    }

    /// Reads files as the editor has them: an open buffer, else the disk.
    pub fn reader(&self) -> Read {
        let buffers = self.buffers.clone();
        let disk = crate::rules::load::disk();
        Arc::new(move |path: &Path| {
            let open = buffers
                .read()
                .ok()
                .and_then(|b| b.get(path).or_else(|| b.get(&canonical(path))).cloned());
            match open {
                Some(text) => Ok(text),
                None => disk(path),
            }
        })
    }

    /// Every diagnostic of each of `dirs`, by file.
    pub fn check(&self, dirs: &BTreeSet<PathBuf>) -> BTreeMap<PathBuf, Vec<Diagnostic>> {
        let read = self.reader();
        let mut by_file: BTreeMap<PathBuf, Vec<Diagnostic>> = BTreeMap::new();
        for dir in dirs {
            let checked = diagnostics(
                std::slice::from_ref(dir),
                Limits::default(),
                &read,
                &self.inputs,
            );
            for d in checked.diagnostics {
                by_file.entry(canonical(&d.file)).or_default().push(d);
            }
        }
        by_file
    }
}

fn is_yaml(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "yaml" || x == "yml")
}

/// Whether the text holds a `trellis.dev/v1alpha1` Rule document (a
/// `RuleTest` has the same apiVersion and is not one).
pub fn holds_rule(text: &str) -> bool {
    // Cheap first: most YAML files are not rules.
    if !text.contains(crate::rules::model::API_VERSION) {
        return false;
    }
    let test_kind = crate::offline::ruletest::file::KIND;
    match crate::yaml::parse_documents(text, &crate::yaml::Limits::FILES) {
        Ok(docs) => docs.iter().any(|d| {
            d.value.get("apiVersion").and_then(|v| v.as_str())
                == Some(crate::rules::model::API_VERSION)
                && d.value.get("kind").and_then(|v| v.as_str()) != Some(test_kind)
        }),
        // Being edited: a rule file that does not parse now still is one.
        Err(_) => {
            !text.contains(&format!("kind: {test_kind}"))
                && text.lines().any(|l| {
                    l.trim_start().starts_with("apiVersion:")
                        && l.contains(crate::rules::model::API_VERSION)
                })
        }
    }
}

/// The path with symlinks resolved, when it exists (editors and the
/// loader may name one file two ways).
pub fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// `file:///a%20b/c.yaml` → `/a b/c.yaml`.
pub fn uri_to_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    // `file://localhost/...` and `file:///...`.
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(PathBuf::from)
}

/// `/a b/c.yaml` → `file:///a%20b/c.yaml`.
pub fn path_to_uri(path: &Path) -> String {
    let mut out = String::from("file://");
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_and_paths_round_trip() {
        let path = Path::new("/tmp/a b/ü.yaml");
        let uri = path_to_uri(path);
        assert_eq!(uri, "file:///tmp/a%20b/%C3%BC.yaml");
        assert_eq!(uri_to_path(&uri).as_deref(), Some(path));
        assert_eq!(uri_to_path("untitled:1"), None);
    }

    #[test]
    fn rule_directories_are_found_below_the_root() {
        let root = tempfile::tempdir().expect("temp dir");
        let deep = root.path().join("deploy/trellis");
        std::fs::create_dir_all(&deep).expect("mkdir");
        std::fs::write(
            deep.join("r.yaml"),
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\n",
        )
        .expect("write");
        std::fs::write(
            root.path().join("other.yaml"),
            "apiVersion: v1\nkind: ConfigMap\n",
        )
        .expect("write");
        let mut ws = Workspace {
            roots: vec![root.path().to_path_buf()],
            ..Workspace::default()
        };
        ws.scan();
        assert_eq!(ws.dirs, BTreeSet::from([deep]));
    }
}
