//! The Dockerfile builds from a clean checkout. No container engine runs
//! here, so the build stage is replayed: its COPY lines copy from the
//! repository, filtered by `.dockerignore` as the engine filters the build
//! context, into an empty directory, and `cargo metadata --locked --offline`
//! resolves the build there (manifest, lockfile, path patches, declared
//! targets). Then every repository file that the compiler read for the
//! trellis binary and the core crate it links (their dep-info, written by
//! this very `cargo test` build) must be in the replay. A file the build needs and the Dockerfile or
//! `.dockerignore` leaves out fails here, not in a user's `docker build`.
//! (The final stage is compared with the packed image in tests/node.rs.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One instruction of a Dockerfile stage: keyword (upper case) and the rest.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && pending.is_empty()) {
            continue;
        }
        // A trailing backslash continues the instruction on the next line.
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let (word, rest) = pending.split_once(' ').unwrap_or((&pending, ""));
        out.push((word.to_ascii_uppercase(), rest.trim().to_string()));
        pending.clear();
    }
    out
}

/// The build stage (`FROM ... AS build`): its WORKDIR, its COPY lines as
/// (sources, destination), and its RUN commands.
struct BuildStage {
    workdir: String,
    copies: Vec<(Vec<String>, String)>,
    runs: Vec<String>,
}

fn build_stage() -> BuildStage {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let mut stage = None;
    for (word, rest) in instructions(&text) {
        if word == "FROM" {
            if stage.is_some() {
                break;
            }
            if rest.to_ascii_lowercase().ends_with(" as build") {
                stage = Some(BuildStage {
                    workdir: "/".into(),
                    copies: vec![],
                    runs: vec![],
                });
            }
            continue;
        }
        let Some(stage) = stage.as_mut() else {
            continue;
        };
        match word.as_str() {
            "WORKDIR" => stage.workdir = rest,
            "COPY" => {
                assert!(
                    !rest.starts_with("--"),
                    "the build stage's COPY takes no flags here ({rest}); teach tests/docker.rs"
                );
                let mut parts: Vec<String> = rest.split_whitespace().map(String::from).collect();
                let dest = parts.pop().expect("COPY SRC... DEST");
                stage.copies.push((parts, dest));
            }
            "RUN" => stage.runs.push(rest),
            "ENV" | "ARG" => {}
            other => panic!("Dockerfile build stage: no replay for {other} {rest}; add one"),
        }
    }
    stage.expect("a `FROM ... AS build` stage in the Dockerfile")
}

/// `.dockerignore` as the engine reads it: patterns in order, the last one
/// matching a path (or one of its parent directories) decides; `!` re-includes.
struct Ignore(Vec<(bool, String)>);

impl Ignore {
    fn load() -> Ignore {
        let text = std::fs::read_to_string(repo().join(".dockerignore"))
            .expect("a .dockerignore next to the Dockerfile");
        Ignore(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| match l.strip_prefix('!') {
                    Some(p) => (false, p.trim_matches('/').to_string()),
                    None => (true, l.trim_matches('/').to_string()),
                })
                .collect(),
        )
    }

    /// Whether the context leaves out `rel` (a path relative to the root).
    fn excludes(&self, rel: &str) -> bool {
        let parts: Vec<&str> = rel.split('/').collect();
        let mut excluded = false;
        for (exclude, pattern) in &self.0 {
            let pat: Vec<&str> = pattern.split('/').collect();
            if (1..=parts.len()).any(|n| glob(&pat, &parts[..n])) {
                excluded = *exclude;
            }
        }
        excluded
    }
}

/// Path-segment glob: `*` and `?` within a segment, `**` for any segments.
fn glob(pat: &[&str], path: &[&str]) -> bool {
    match (pat.first(), path.first()) {
        (None, None) => true,
        (Some(&"**"), _) => glob(&pat[1..], path) || (!path.is_empty() && glob(pat, &path[1..])),
        (Some(p), Some(s)) => segment(p.as_bytes(), s.as_bytes()) && glob(&pat[1..], &path[1..]),
        _ => false,
    }
}

fn segment(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => segment(&p[1..], s) || (!s.is_empty() && segment(p, &s[1..])),
        (Some(b'?'), Some(_)) => segment(&p[1..], &s[1..]),
        (Some(a), Some(b)) => a == b && segment(&p[1..], &s[1..]),
        _ => false,
    }
}

/// Copy `rel` (file or directory, relative to the repository) to `dest`,
/// leaving out what `.dockerignore` leaves out of the context.
fn copy_filtered(ignore: &Ignore, rel: &str, dest: &Path) {
    let src = repo().join(rel);
    if ignore.excludes(rel) {
        return;
    }
    if src.is_dir() {
        std::fs::create_dir_all(dest).unwrap();
        for entry in std::fs::read_dir(&src).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            copy_filtered(ignore, &format!("{rel}/{name}"), &dest.join(&name));
        }
    } else {
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&src, dest).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    }
}

/// Replay the build stage's COPY lines into `root` (standing for `/`).
fn replay(root: &Path) -> PathBuf {
    let stage = build_stage();
    let ignore = Ignore::load();
    let workdir = root.join(stage.workdir.trim_start_matches('/'));
    std::fs::create_dir_all(&workdir).unwrap();
    for (sources, dest) in &stage.copies {
        let dest_dir = workdir.join(dest);
        for src in sources {
            let rel = src.trim_start_matches("./").trim_end_matches('/');
            assert!(
                repo().join(rel).exists(),
                "the Dockerfile copies {src}, which is not in the repository"
            );
            assert!(
                !ignore.excludes(rel),
                "the Dockerfile copies {src}, which .dockerignore leaves out of the context"
            );
            // `COPY a b ./` puts files into the directory; `COPY dir ./dir`
            // copies the directory's contents to ./dir.
            let target = if dest.ends_with('/') && !repo().join(rel).is_dir() {
                dest_dir.join(Path::new(rel).file_name().unwrap())
            } else {
                dest_dir.clone()
            };
            copy_filtered(&ignore, rel, &target);
        }
    }
    workdir
}

/// The repository files rustc read to compile the trellis crate (library
/// and binary): the dep-info files `deps/trellis-<hash>.d` of the profile
/// that built `bin`, paths made relative to the repository. Files that no
/// longer exist (a stale dep-info of an older build) are left out.
fn files_read_for_trellis(bin: &Path) -> BTreeSet<PathBuf> {
    let root = repo().canonicalize().unwrap();
    let deps = bin.parent().unwrap().join("deps");
    let mut read = BTreeSet::new();
    for entry in std::fs::read_dir(&deps).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        // The binary's crate and the core crate it links (`trellis_core-`).
        let ours = name.starts_with("trellis-") || name.starts_with("trellis_core-");
        if !(ours && name.ends_with(".d")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for line in text.lines() {
            // `TARGET: DEP DEP...` lines; spaces in paths are escaped.
            let Some((_, list)) = line.split_once(": ") else {
                continue;
            };
            for dep in list.replace("\\ ", "\u{0}").split_whitespace() {
                let path = PathBuf::from(dep.replace('\u{0}', " "));
                let rel = match path.strip_prefix(&root) {
                    Ok(rel) => rel.to_path_buf(),
                    Err(_) if path.is_relative() => path,
                    Err(_) => continue,
                };
                if !rel.starts_with("target") && root.join(&rel).is_file() {
                    read.insert(rel);
                }
            }
        }
    }
    read
}

/// The host's target triple, as rustc reports it.
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .unwrap_or_else(|e| panic!("running {rustc} -vV: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("a host line in rustc -vV")
        .to_string()
}

#[test]
fn dockerignore_patterns_match_as_the_engine_matches_them() {
    let ignore = Ignore(vec![
        (true, "*".into()),
        (false, "src".into()),
        (true, "**/target".into()),
        (true, "docs/*.md".into()),
    ]);
    assert!(ignore.excludes("README.md"));
    assert!(ignore.excludes("target/debug/trellis"));
    assert!(!ignore.excludes("src/main.rs"));
    assert!(ignore.excludes("src/target/x"));
    assert!(ignore.excludes("docs/a.md"));
    assert!(
        ignore.excludes("docs/a/b.md"),
        "excluded through its parent `docs`"
    );
}

#[test]
fn the_dockerfile_build_stage_resolves_offline_from_exactly_what_it_copies() {
    let stage = build_stage();
    assert!(
        stage
            .runs
            .iter()
            .any(|r| r.contains("cargo build") && r.contains("--locked")),
        "the build stage must build with `cargo build --locked`: {:?}",
        stage.runs
    );
    let tmp = tempfile::tempdir().unwrap();
    let workdir = replay(tmp.path());

    // Cargo resolves the manifest, the lockfile (unchanged), the path patch
    // and every declared target from the copied files alone.
    // Filtered to this host's platform: the image builds for Linux, and
    // other platforms' crates (Windows consoles, ...) are not downloaded here.
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--offline", "--format-version=1"])
        .args(["--filter-platform", &host_triple()])
        .arg("--manifest-path")
        .arg(workdir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", tmp.path().join("target"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata --locked --offline in the replayed build stage failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let minijinja = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "minijinja")
        .expect("minijinja in the resolved build");
    assert_eq!(
        minijinja["source"],
        serde_json::Value::Null,
        "minijinja resolves to the patched copy in vendor/, not a registry"
    );

    // Every repository file the compiler read for the trellis binary (its
    // dep-info: sources, included files, the vendored crate) was copied.
    let read = files_read_for_trellis(Path::new(env!("CARGO_BIN_EXE_trellis")));
    for must in [
        "src/main.rs",
        "src/lib.rs",
        "crates/trellis-core/src/lib.rs",
        // Read through include_str!: a data file, not a module.
        "crates/trellis-core/src/conform/kubernetes-1.35.json",
    ] {
        assert!(
            read.contains(Path::new(must)),
            "the dep-info of this build lists no {must}: {read:?}"
        );
    }
    let missing: Vec<&PathBuf> = read.iter().filter(|p| !workdir.join(p).is_file()).collect();
    assert!(
        missing.is_empty(),
        "the build reads files the Dockerfile's build stage does not copy: {missing:?}"
    );
}
