//! A rule file over a YAML budget: the diagnostic `check` prints names the
//! file, the line when known, the limit and its value — never the parser
//! library's own wording.

use super::*;

/// The one diagnostic loading `text` as `a.yaml` gives, as printed, with the
/// temporary directory cut off.
fn the_error(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), text).unwrap();
    let diags = load_dir(dir.path()).expect_err("over budget");
    assert_eq!(diags.len(), 1, "{diags:#?}");
    assert_eq!(diags[0].severity, Severity::Error);
    let printed = diags[0].to_string();
    let prefix = format!("{}/", dir.path().display());
    printed
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("names the file: {printed}"))
        .to_owned()
}

#[test]
fn more_documents_than_the_limit_names_the_limit_and_the_line() {
    let text = "---\na: 1\n".repeat(1001);
    assert_eq!(
        the_error(&text),
        "a.yaml:2001: error: more than 1000 YAML documents in one file (the limit)"
    );
}

#[test]
fn nesting_deeper_than_the_limit_names_the_limit_in_block_and_flow_style() {
    let block: String = (0..60)
        .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
        .collect();
    assert_eq!(
        the_error(&block),
        "a.yaml:49: error: YAML nested more than 48 levels deep (the limit)"
    );
    let flow = format!("a: {}{}\n", "[".repeat(60), "]".repeat(60));
    assert_eq!(
        the_error(&flow),
        "a.yaml:1: error: YAML nested more than 48 levels deep (the limit)"
    );
}

#[test]
fn more_nodes_than_the_limit_names_the_limit() {
    let text = format!("a: [{}]\n", vec!["1"; 200_001].join(","));
    assert_eq!(
        the_error(&text),
        "a.yaml:1: error: more than 200000 YAML nodes (scalars, lists and maps) \
         in one file (the limit)"
    );
}

#[test]
fn more_aliases_or_anchors_than_the_limit_names_the_limit() {
    let anchors: Vec<String> = (0..101).map(|i| format!("&x{i} {i}")).collect();
    let aliases: Vec<String> = (0..1001).map(|i| format!("*x{}", i % 101)).collect();
    let text = format!("a: [{}]\nb: [{}]\n", anchors.join(","), aliases.join(","));
    assert_eq!(
        the_error(&text),
        "a.yaml:2: error: more than 1000 YAML aliases (`*name`) in one file (the limit)"
    );

    let anchors: Vec<String> = (0..1001).map(|i| format!("&x{i} {i}")).collect();
    let text = format!("a: [{}]\n", anchors.join(","));
    assert_eq!(
        the_error(&text),
        "a.yaml:1: error: more than 1000 YAML anchors (`&name`) in one file (the limit)"
    );
}

#[test]
fn many_aliases_of_few_anchors_names_the_ratio() {
    let text = format!("a: &x [1, 2]\nb: [{}]\n", vec!["*x"; 200].join(","));
    let printed = the_error(&text);
    assert!(
        printed.contains("200 YAML aliases for 1 anchor(s) in one file, more than 10 per anchor"),
        "{printed}"
    );
}

#[test]
fn a_file_larger_than_the_limit_names_the_limit() {
    let text = format!("a: \"{}\"\n", "x".repeat(1024 * 1024));
    assert_eq!(
        the_error(&text),
        format!(
            "a.yaml: error: file is {} bytes, more than the limit of 1048576 bytes (1 MiB)",
            text.len()
        )
    );
}

#[test]
fn the_byte_budget_of_a_stream_names_the_limit() {
    // Rule files stop at 1 MiB before the parser's budget; other YAML
    // (`--observed`, `fromyaml`) meets the parser's own.
    let limits = crate::yaml::Limits {
        max_bytes: 10,
        ..crate::yaml::Limits::FILES
    };
    let err = crate::yaml::parse_documents("a: 12345678901234567890", &limits).unwrap_err();
    assert!(err.over_budget, "{err}");
    assert_eq!(
        err.message,
        "input is 23 bytes, more than the limit of 10 bytes"
    );
}
