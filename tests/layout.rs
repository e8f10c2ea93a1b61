//! The boundary between the two crates, as the lockfile records it: the
//! core crate (`crates/trellis-core`) reaches no cluster client and no
//! async runtime, not even through a dependency of a dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What the core may never depend on, directly or not.
const FORBIDDEN: &[&str] = &[
    "kube",
    "kube-client",
    "kube-core",
    "kube-runtime",
    "k8s-openapi",
    "tokio",
    "hyper",
    "axum",
];

/// Package name → the names of its dependencies, from `Cargo.lock`.
fn lock_graph() -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"))
        .expect("read Cargo.lock");
    let mut graph = BTreeMap::new();
    for block in text.split("[[package]]").skip(1) {
        let mut name = None;
        let mut deps = Vec::new();
        let mut in_deps = false;
        for line in block.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("name = ") {
                name = Some(rest.trim_matches('"').to_owned());
            } else if line.starts_with("dependencies = [") {
                in_deps = !line.ends_with(']');
            } else if in_deps && line == "]" {
                in_deps = false;
            } else if in_deps {
                // `"name"` or `"name version"` or `"name version (source)"`.
                let dep = line.trim_end_matches(',').trim_matches('"');
                deps.push(dep.split(' ').next().unwrap_or(dep).to_owned());
            }
        }
        if let Some(name) = name {
            graph.entry(name).or_insert_with(Vec::new).extend(deps);
        }
    }
    graph
}

#[test]
fn the_core_crate_reaches_no_cluster_client_and_no_async_runtime() {
    let graph = lock_graph();
    assert!(
        graph.contains_key("trellis-core"),
        "Cargo.lock has no trellis-core"
    );
    let mut seen = BTreeSet::new();
    let mut path: BTreeMap<String, String> = BTreeMap::new();
    let mut todo = vec!["trellis-core".to_owned()];
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        for dep in graph.get(&name).into_iter().flatten() {
            path.entry(dep.clone()).or_insert_with(|| name.clone());
            todo.push(dep.clone());
        }
    }
    let reached: Vec<String> = FORBIDDEN
        .iter()
        .filter(|f| seen.contains(**f))
        .map(|f| {
            // The chain that reaches it, for the message.
            let mut chain = vec![(*f).to_owned()];
            while let Some(up) = path.get(chain.last().unwrap()) {
                chain.push(up.clone());
                if up == "trellis-core" {
                    break;
                }
            }
            chain.reverse();
            chain.join(" -> ")
        })
        .collect();
    assert!(reached.is_empty(), "the core reaches {reached:#?}");
    // Not vacuous: the root crate does reach them.
    assert!(
        graph["trellis"].iter().any(|d| d == "kube"),
        "the lockfile reading is wrong: trellis does not depend on kube"
    );
}
