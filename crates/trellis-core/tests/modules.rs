//! The core's top-level modules form a DAG: no module reaches, through
//! `crate::` paths, back to one that reaches it. A cycle is how a layer
//! stops being one (the rule format calling the CRD generator that reads
//! the rule format), so this test measures the graph from the files and
//! names every cycle it finds.
//!
//! What counts as an edge: a `crate::<module>` path anywhere in a module's
//! files, test code included (a test that needs a higher module belongs in
//! that module), comments and string literals left out. `super::` paths
//! never leave a top-level module in this crate, so they are not followed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn top_level_modules_have_no_cycle() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let cycles: Vec<Vec<String>> = strongly_connected(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    let edges: Vec<String> = graph
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |t| format!("{from} -> {t}")))
        .collect();
    assert!(
        cycles.is_empty(),
        "modules in a cycle: {}\nedges:\n{}",
        cycles
            .iter()
            .map(|c| c.join(" ↔ "))
            .collect::<Vec<_>>()
            .join("; "),
        edges.join("\n")
    );
}

#[test]
fn the_graph_is_read_from_paths_not_comments() {
    let code =
        "use crate::a::B; // crate::c\n/// see [`crate::d`]\nlet s = \"crate::e\"; crate::f::g();";
    let found: BTreeSet<String> = referenced(code).into_iter().collect();
    assert_eq!(found, ["a", "f"].map(String::from).into());
}

/// Module → the other top-level modules its files name.
fn module_graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_owned())
            .expect("a file name");
        if top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        let to = graph.entry(top.clone()).or_default();
        for module in referenced(&text) {
            if module != top {
                to.insert(module);
            }
        }
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The top-level modules named by `crate::<name>` in code (not in comments
/// or string literals).
fn referenced(text: &str) -> Vec<String> {
    let code = strip_comments_and_strings(text);
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        // `trellis_core::` or `my_crate::` are not this crate's root.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.push(name);
        }
    }
    found
}

/// Blanks out `//` and `/* */` comments and string literals (plain and
/// raw), keeping everything else.
fn strip_comments_and_strings(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if let Some((open, hashes)) = raw_string_start(rest, out.chars().next_back()) {
            let close = format!("\"{}", "#".repeat(hashes));
            i += open
                + rest[open..]
                    .find(&close)
                    .map_or(rest.len() - open, |e| e + close.len());
            out.push_str("\"\"");
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() {
                match rest.as_bytes()[j] {
                    b'\\' => j += 2,
                    b'"' => break,
                    _ => j += 1,
                }
            }
            i += (j + 1).min(rest.len());
            out.push_str("\"\"");
        } else if rest.starts_with("'\"'") {
            // The character literal `'"'` opens no string.
            i += 3;
        } else {
            let c = rest.chars().next().expect("not at the end");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `r"`, `r#"`, `br##"`… starting here (not inside an identifier): the
/// length of the opening and the number of `#`s that close it.
fn raw_string_start(rest: &str, before: Option<char>) -> Option<(usize, usize)> {
    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let body = rest.strip_prefix('b').unwrap_or(rest).strip_prefix('r')?;
    let hashes = body.bytes().take_while(|b| *b == b'#').count();
    let prefix = rest.len() - body.len();
    body[hashes..]
        .starts_with('"')
        .then_some((prefix + hashes + 1, hashes))
}

/// Tarjan's strongly connected components.
fn strongly_connected(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        components: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                self.components.push(component);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.components
}
