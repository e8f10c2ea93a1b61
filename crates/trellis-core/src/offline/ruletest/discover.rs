//! Which files are test files: `*.test.yaml` under the paths given,
//! searched recursively (dot entries skipped, symlinked directories not
//! followed, so a loop cannot hold the search); a file named outright is
//! taken whatever its name, so a suite meant to fail can live outside the
//! search under another suffix and still be run on purpose.

use std::path::{Path, PathBuf};

use crate::rules::Diagnostic;

/// The suffix of a test file found by searching.
pub const SUFFIX: &str = ".test.yaml";
/// Most test files one run reads.
const MAX_FILES: usize = 10_000;

/// The default test directory of a rules directory: `DIR/../tests`,
/// written without the `..` when the directory names its parent
/// (`rules` → `tests`), so reports name files as a reader would.
pub fn default_dir(rules_dir: &Path) -> PathBuf {
    match (rules_dir.file_name(), rules_dir.parent()) {
        (Some(_), Some(parent)) => parent.join("tests"),
        _ => rules_dir.join("..").join("tests"),
    }
}

/// Every test file under `paths`, sorted, each once.
pub fn test_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Diagnostic> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path)
            .map_err(|e| Diagnostic::error(path, None, "", format!("cannot read: {e}")))?;
        if meta.is_dir() {
            walk(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    files.sort();
    files.dedup();
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), Diagnostic> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Diagnostic::error(dir, None, "", format!("cannot read directory: {e}")))?;
    for entry in entries {
        let entry =
            entry.map_err(|e| Diagnostic::error(dir, None, "", format!("cannot read: {e}")))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            walk(&path, files)?;
        } else if name.ends_with(SUFFIX) && path.is_file() {
            files.push(path);
            if files.len() > MAX_FILES {
                return Err(Diagnostic::error(
                    dir,
                    None,
                    "",
                    format!("more than {MAX_FILES} test files"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_directory_sits_beside_the_rules_directory() {
        assert_eq!(default_dir(Path::new("rules")), Path::new("tests"));
        assert_eq!(default_dir(Path::new("/x/rules/")), Path::new("/x/tests"));
        assert_eq!(default_dir(Path::new(".")), Path::new("./../tests"));
        assert_eq!(default_dir(Path::new("..")), Path::new("../../tests"));
    }

    #[test]
    fn finds_test_files_recursively_and_takes_named_files_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join(".hidden")).unwrap();
        for f in [
            "one.test.yaml",
            "a/b/two.test.yaml",
            "a/fixture.yaml",
            ".hidden/three.test.yaml",
            "a/b/failing.case.yaml",
        ] {
            std::fs::write(root.join(f), "").unwrap();
        }
        let found = test_files(&[root.to_owned()]).unwrap();
        assert_eq!(
            found,
            vec![root.join("a/b/two.test.yaml"), root.join("one.test.yaml")]
        );
        let named = test_files(&[root.join("a/b/failing.case.yaml")]).unwrap();
        assert_eq!(named, vec![root.join("a/b/failing.case.yaml")]);
        let missing = test_files(&[root.join("nope")]).unwrap_err();
        assert!(missing.to_string().contains("cannot read"), "{missing}");
    }
}
