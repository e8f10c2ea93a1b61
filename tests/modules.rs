//! The top-level modules of each crate — the binary's (`cli`, `diff`,
//! `lsp`, `operator`, `reload`, `telemetry`) and the core's (`rules`,
//! `render`, `plan`, `pass`, ...) — import one another in one direction
//! only: a newcomer can read them bottom-up, and a change low down never
//! has to know about one above it.
//!
//! The graph is built from the files, as text: every `crate::m` path (in a
//! `use`, a `use crate::{m, ...}` group, or inline) and every `super::`
//! chain that climbs out to the crate root names top-level module `m`.
//! Comments, doc links and string literals do not count (they import
//! nothing); `#[cfg(test)]` code does, since a test module that imports
//! upwards is as much a knot for a reader as any other code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the modules it names → the first file naming it.
type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

/// `src/lib.rs`'s own modules (`mod x;` / `pub mod x;`), not the core's
/// re-exports: those live in another crate and cannot import back.
fn top_level_modules(lib: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(lib).expect("read lib.rs");
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))?;
            Some(rest.strip_suffix(';')?.to_owned())
        })
        .collect()
}

/// The text with comments and string and char literals blanked out, so
/// that only code is searched.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            i = end;
        } else if c == b'r'
            && matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
            && !ident_byte(prev(b, i))
        {
            // Raw string: r"…", r#"…"#, ….
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            i = text[j + 1..]
                .find(&close)
                .map_or(b.len(), |e| j + 1 + e + close.len());
            out.push(' ');
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c == b'\'' && (b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\')) {
            // A char literal ('"', '\"', '\n'); lifetimes ('a) stay.
            let end = text[i + 1..].find('\'').map_or(b.len(), |e| i + 1 + e + 1);
            let end = if b.get(i + 1) == Some(&b'\\') && b.get(i + 2) == Some(&b'\'') {
                i + 4
            } else {
                end
            };
            i = end;
            out.push(' ');
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn prev(b: &[u8], i: usize) -> u8 {
    if i == 0 { b' ' } else { b[i - 1] }
}

fn ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s.bytes().position(|c| !ident_byte(c)).unwrap_or(s.len());
    &s[..end]
}

/// The first segment of every item of a `{…}` group that starts `s`.
fn group_heads(s: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => {
                depth += 1;
                expect_head = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect_head = true,
            c if expect_head && depth == 1 && !c.is_whitespace() => {
                heads.push(ident(&s[i..]));
                expect_head = false;
            }
            _ => {}
        }
    }
    heads
}

/// The top-level modules a file names, given how deep its module is below
/// the crate root (`src/cli/args.rs`: 2).
fn named_modules(code: &str, depth: usize) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = code.as_bytes();
    let mut at_root = |rest: &str| {
        if rest.starts_with('{') {
            out.extend(group_heads(rest).into_iter().map(str::to_owned));
        } else {
            out.insert(ident(rest).to_owned());
        }
    };
    for (i, _) in code.match_indices("crate::") {
        if !ident_byte(prev(b, i)) && prev(b, i) != b'$' {
            at_root(&code[i + "crate::".len()..]);
        }
    }
    for (i, _) in code.match_indices("super::") {
        if ident_byte(prev(b, i)) || code[..i].ends_with("super::") {
            continue;
        }
        let mut rest = &code[i..];
        let mut climbs = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = r;
        }
        if climbs >= depth {
            at_root(rest);
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The import graph between the top-level modules of the crate in `src`.
fn module_graph(src: &Path) -> Graph {
    let modules = top_level_modules(&src.join("lib.rs"));
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        let Some(top) = parts.first().filter(|t| modules.contains(*t)) else {
            continue; // lib.rs, main.rs
        };
        // `a/mod.rs` is module `a`, one level less deep than `a/b.rs`.
        let depth = parts.len() - usize::from(parts.last().is_some_and(|p| p == "mod"));
        let text = std::fs::read_to_string(&file).expect("read source");
        for named in named_modules(&code_only(&text), depth) {
            if &named != top && modules.contains(&named) {
                graph
                    .entry(top.clone())
                    .or_default()
                    .entry(named)
                    .or_insert_with(|| rel.to_owned());
            }
        }
    }
    graph
}

/// A cycle through `start`, if there is one, as the modules along it.
fn cycle_through(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &Graph,
        at: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flat_map(|m| m.keys()) {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_owned()];
    walk(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

/// Every cycle of `graph`, one line each: the modules along it and, per
/// step, the first file that makes it.
fn cycles(graph: &Graph) -> Vec<String> {
    graph
        .keys()
        .filter_map(|m| cycle_through(graph, m))
        .map(|path| {
            let mut steps = Vec::new();
            for (i, from) in path.iter().enumerate() {
                let to = &path[(i + 1) % path.len()];
                steps.push(format!("{from} → {to} ({})", graph[from][to].display()));
            }
            // One line per cycle, whichever module it was found from.
            let mut key = path.clone();
            key.sort();
            (key.join(" "), steps.join(", "))
        })
        .collect::<BTreeMap<_, _>>()
        .into_values()
        .collect()
}

#[test]
fn top_level_modules_of_the_binary_crate_import_without_a_cycle() {
    let cycles = cycles(&module_graph(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    ));
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn top_level_modules_of_the_core_crate_import_without_a_cycle() {
    let cycles = cycles(&module_graph(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/trellis-core/src"),
    ));
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_graph_sees_groups_inline_paths_and_climbing_supers_but_not_comments() {
    let code = code_only(
        "use crate::{a::X, b};\nfn f() { crate::c::g(); super::super::d::h(); }\n// crate::e\n\"crate::f\"\nlet q = '\"'; crate::g::x();",
    );
    let named = named_modules(&code, 2);
    assert_eq!(named, ["a", "b", "c", "d", "g"].map(String::from).into());
    assert!(
        named_modules("super::x::y()", 2).is_empty(),
        "one level up is still inside"
    );
}
