//! Reading rule files from disk: directories (including the ConfigMap volume
//! layout), multi-document files, and `templateFile:` references.
//!
//! The loader only reads and parses; it reports problems as [`Diagnostic`]s
//! and leaves every semantic check to `validate`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::model::Rule;
use super::{Diagnostic, Severity};
use crate::yaml::{self, LineIndex};

/// Largest rule file or template file read (the error message says 1 MiB).
const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Most rule files read from one directory.
const MAX_FILES_PER_DIR: usize = 1_000;

/// One rule document as found on disk.
#[derive(Debug, Clone)]
pub struct LoadedRule {
    pub rule: Rule,
    /// The rule file as listed in the rules directory.
    pub file: PathBuf,
    pub lines: LineIndex,
    /// Child id → template text (inline or read from `templateFile`).
    pub templates: BTreeMap<String, String>,
}

/// A rules document that is well-formed YAML but not (yet) typed.
pub(super) struct RawDocument {
    pub file: PathBuf,
    pub root: PathBuf,
    pub value: serde_json::Value,
    pub lines: LineIndex,
    /// The whole file's text (shared by its documents), to place a finding
    /// inside a template on its own line.
    pub source: Arc<str>,
    /// Template files given with the document (a version rebuilt from its
    /// revision ConfigMap), instead of read next to `file`.
    pub files: Option<BTreeMap<String, String>>,
    /// Where its `templateFile`s are read from otherwise.
    pub read: Read,
}

/// Where the text of rule and template files comes from: the disk
/// ([`disk`]), or an editor's unsaved buffers first (`trellis lsp`).
pub type Read = Arc<dyn Fn(&Path) -> Result<String, ReadError> + Send + Sync>;

/// Why a rules directory, a rule file or a template file could not be
/// read; the diagnostic names the file, these say what went wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("file is {0} bytes, more than the limit of {MAX_FILE_BYTES} bytes (1 MiB)")]
    TooLarge(u64),
    #[error("cannot read directory: {0}")]
    Directory(std::io::Error),
    #[error("{0} rule files, more than the limit of {MAX_FILES_PER_DIR}")]
    TooManyFiles(usize),
    #[error("`{0}` is not among the version's template files")]
    NotInVersion(String),
    #[error("`{0}` must be a relative path")]
    Absolute(String),
    #[error("cannot resolve the rules directory: {0}")]
    Root(std::io::Error),
    #[error("`{0}` leaves the rules directory")]
    LeavesRoot(String),
    #[error("`{0}` is not a file")]
    NotAFile(String),
    #[error("cannot read `{rel}`: {source}")]
    Template { rel: String, source: Box<ReadError> },
}

/// Files as they are on disk, at most 1 MiB each.
pub fn disk() -> Read {
    Arc::new(read_limited)
}

impl RawDocument {
    /// The text of `templateFile: rel`: from `files` when given, else read
    /// next to the rule file.
    pub fn template_file(&self, rel: &str) -> Result<String, ReadError> {
        match &self.files {
            Some(files) => files
                .get(rel)
                .cloned()
                .ok_or_else(|| ReadError::NotInVersion(rel.to_owned())),
            None => read_template_file(&self.root, &self.file, rel, &self.read),
        }
    }
}

/// Lists rule files in a directory: `*.yaml`/`*.yml`, symlinks followed, dot
/// entries (`..data`, `..2026_…` and hidden files) skipped, so a ConfigMap
/// volume yields each rule exactly once. Sorted for stable output.
pub fn rule_files(dir: &Path) -> Result<Vec<PathBuf>, ReadError> {
    let entries = fs::read_dir(dir).map_err(ReadError::Directory)?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(ReadError::Directory)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks: a ConfigMap key is a link to a file.
        if fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false) {
            files.push(path);
        }
    }
    if files.len() > MAX_FILES_PER_DIR {
        return Err(ReadError::TooManyFiles(files.len()));
    }
    files.sort();
    Ok(files)
}

pub(super) fn read_limited(path: &Path) -> Result<String, ReadError> {
    let meta = fs::metadata(path)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge(meta.len()));
    }
    Ok(fs::read_to_string(path)?)
}

/// Reads every rule document under `dirs` through `read`, parsing YAML;
/// problems become diagnostics.
pub(super) fn read_documents(
    dirs: &[PathBuf],
    diags: &mut Vec<Diagnostic>,
    read: &Read,
) -> Vec<RawDocument> {
    let mut docs = Vec::new();
    for dir in dirs {
        let files = match rule_files(dir) {
            Ok(files) => files,
            Err(err) => {
                diags.push(Diagnostic::error(dir, None, "", err.to_string()));
                continue;
            }
        };
        for file in files {
            let text = match read(&file) {
                Ok(text) => text,
                Err(err) => {
                    diags.push(Diagnostic::error(&file, None, "", err.to_string()));
                    continue;
                }
            };
            match yaml::parse_documents(&text, &yaml::Limits::FILES) {
                Ok(parsed) => {
                    let source: Arc<str> = text.into();
                    docs.extend(parsed.into_iter().map(|d| RawDocument {
                        file: file.clone(),
                        root: dir.clone(),
                        value: d.value,
                        lines: d.lines,
                        source: source.clone(),
                        files: None,
                        read: read.clone(),
                    }))
                }
                Err(err) => diags.push(Diagnostic::error(
                    &file,
                    err.line,
                    "",
                    // A budget message says what it counted in YAML terms.
                    if err.over_budget {
                        err.message
                    } else {
                        format!("YAML: {}", err.message)
                    },
                )),
            }
        }
    }
    docs
}

/// Resolves `templateFile` relative to the rule file's directory and reads it,
/// refusing paths (symlinks included) that leave the rules directory.
pub(super) fn read_template_file(
    root: &Path,
    rule_file: &Path,
    rel: &str,
    read: &Read,
) -> Result<String, ReadError> {
    let rel_path = Path::new(rel);
    if rel_path.is_absolute() {
        return Err(ReadError::Absolute(rel.to_owned()));
    }
    let base = rule_file.parent().unwrap_or(root);
    let root_real = root.canonicalize().map_err(ReadError::Root)?;
    let unreadable = |source: ReadError| ReadError::Template {
        rel: rel.to_owned(),
        source: Box::new(source),
    };
    let target = base
        .join(rel_path)
        .canonicalize()
        .map_err(|e| unreadable(e.into()))?;
    if !target.starts_with(&root_real) {
        return Err(ReadError::LeavesRoot(rel.to_owned()));
    }
    if !target.is_file() {
        return Err(ReadError::NotAFile(rel.to_owned()));
    }
    read(&target).map_err(unreadable)
}

impl Diagnostic {
    pub fn error(file: &Path, line: Option<u64>, field: &str, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            file: file.to_path_buf(),
            line,
            field: field.to_owned(),
            message: message.into(),
        }
    }

    pub fn warning(
        file: &Path,
        line: Option<u64>,
        field: &str,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(file, line, field, message)
        }
    }
}
