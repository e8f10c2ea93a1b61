//! The documentation in the repository holds: `docs/rules.md` describes
//! every field of the rule format (as `trellis schema` prints it), and every
//! relative link in README.md, docs/*.md and the chart's README points at a file that exists
//! (and, with `#anchor`, at a heading in it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every property name anywhere in a JSON Schema.
fn property_names(schema: &Value, out: &mut BTreeSet<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get("properties") {
                out.extend(props.keys().cloned());
            }
            for v in map.values() {
                property_names(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| property_names(v, out)),
        _ => {}
    }
}

/// Words written in `code` spans of a Markdown text.
fn code_words(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| {
            span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn every_field_of_the_rule_format_is_documented_in_docs_rules_md() {
    let mut fields = BTreeSet::new();
    property_names(&trellis::rules::model::json_schema(), &mut fields);
    assert!(fields.contains("includeWhen"), "{fields:?}");
    let documented = code_words(&read(&root().join("docs/rules.md")));
    let missing: Vec<&String> = fields.iter().filter(|f| !documented.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "docs/rules.md does not describe these fields of `trellis schema`: {missing:?}"
    );
}

/// GitHub's anchor for a heading: lowercase; letters, digits, `-` and `_`
/// kept, spaces become `-`, everything else dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// `](target)` links outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    for page in [
        "rules.md",
        "operations.md",
        "coming-from.md",
        "cli.md",
        "benchmarks.md",
    ] {
        assert!(
            docs.contains(&root().join("docs").join(page)),
            "docs/{page} is missing"
        );
    }
    pages.extend(docs);
    pages.push(root().join("charts/trellis/README.md"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = read(page);
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("dir").join(file)
            };
            let inside = target
                .canonicalize()
                .is_ok_and(|t| t.starts_with(root().canonicalize().expect("root")));
            if !inside {
                broken.push(format!(
                    "{}: {link} (no such file in the repository)",
                    page.display()
                ));
                continue;
            }
            if !fragment.is_empty()
                && target.extension().is_some_and(|x| x == "md")
                && !anchors(&read(&target)).contains(fragment)
            {
                broken.push(format!(
                    "{}: {link} (no heading #{fragment})",
                    page.display()
                ));
            }
        }
    }
    assert!(checked > 3, "found only {checked} relative links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
