//! `trellis test` on the real binary, no cluster: the shipped suites
//! (`tests/rules/*.test.yaml`) pass against the example rules, a broken rule
//! makes its suite fail with the diff, a wrong test file is refused with
//! its file and line (exit 2), and the JUnit and JSON reports have their
//! shape. `trellis check --tests` refuses the same files.
//!
//! The files meant to fail live in `tests/fixtures/ruletests/` as
//! `*.case.yaml`, which the recursive search from `tests/` never finds.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The cases in `tests/rules/*.test.yaml`; a case added there is counted here.
const SHIPPED_CASES: usize = 34;

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `trellis ARGS` run in `dir`.
fn trellis(dir: &Path, args: &[&str]) -> Ran {
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run trellis");
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn fixture(name: &str) -> String {
    format!("tests/fixtures/ruletests/{name}")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn the_shipped_suites_pass_and_cover_every_example_rule() {
    let ran = trellis(&root(), &["test", "--rules", "rules"]);
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let files = std::fs::read_dir(root().join("tests/rules"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".test.yaml")
        })
        .count();
    let summary = ran.stdout.lines().last().unwrap_or_default();
    assert_eq!(
        summary,
        format!(
            "test result: ok. {SHIPPED_CASES} passed; 0 failed; {SHIPPED_CASES} case(s) in {files} file(s)"
        ),
        "{}",
        ran.stdout
    );
    assert_eq!(ran.stdout.lines().count(), SHIPPED_CASES + 1);
    // Only the intended suites are found: no fixture under tests/ runs.
    assert!(!ran.stdout.contains("fixtures"), "{}", ran.stdout);

    let json = trellis(&root(), &["test", "--rules", "rules", "-o", "json"]);
    let report: Value = serde_json::from_str(&json.stdout).expect("JSON report");
    let tested: std::collections::BTreeSet<&str> = report["suites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["rule"].as_str().unwrap())
        .collect();
    let set = trellis::rules::RuleSet::load(&[root().join("rules")], Default::default())
        .expect("the example rules load");
    for rule in &set.rules {
        assert!(
            tested.contains(rule.name.as_str()),
            "rule {} has no RuleTest in tests/rules/",
            rule.name
        );
    }
}

#[test]
fn a_broken_rule_makes_its_suite_fail_with_the_diff() {
    let dir = tempfile::tempdir().unwrap();
    for sub in [
        "rules",
        "tests/rules",
        "examples/parents",
        "examples/observed",
    ] {
        copy_dir(&root().join(sub), &dir.path().join(sub));
    }
    // The Ingresses now come when the webapp is *not* exposed.
    let webapp = dir.path().join("rules/webapp.yaml");
    let text = std::fs::read_to_string(&webapp).unwrap();
    assert!(text.contains("includeWhen: \"spec.expose\""));
    std::fs::write(
        &webapp,
        text.replace(
            "includeWhen: \"spec.expose\"",
            "includeWhen: \"not spec.expose\"",
        ),
    )
    .unwrap();
    let ran = trellis(dir.path(), &["test", "--rules", "rules"]);
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let failed: Vec<&str> = ran
        .stdout
        .lines()
        .filter(|l| l.starts_with("FAILED"))
        .collect();
    assert_eq!(failed.len(), 2, "{}", ran.stdout);
    assert!(
        failed[0].starts_with("FAILED tests/rules/webapp.test.yaml:8 [webapp] a public webapp"),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains(
            "children.route: expected \"2 object(s)\", got \"no object: not rendered in this pass\""
        ),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout
            .contains("absent.route: expected \"no object\", got \"rendered: Ingress team-a/api-a-example-com\""),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.ends_with(&format!(
            "test result: FAILED. {} passed; 2 failed; {SHIPPED_CASES} case(s) in 9 file(s)\n",
            SHIPPED_CASES - 2
        )),
        "{}",
        ran.stdout
    );
}

#[test]
fn a_failing_case_prints_every_mismatching_path_with_expected_and_actual() {
    let ran = trellis(
        &root(),
        &["test", "--rules", "rules", &fixture("failing.case.yaml")],
    );
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "ok     tests/fixtures/ruletests/failing.case.yaml:9 [webapp] passes",
            "FAILED tests/fixtures/ruletests/failing.case.yaml:13 [webapp] fails on two paths",
            "         children.config.metadata.name: expected \"a-cfg\", got \"a-config\"",
            "         status.replicas.desired: expected 2, got 1",
            "test result: FAILED. 1 passed; 1 failed; 2 case(s) in 1 file(s)",
        ]
    );
}

#[test]
fn a_wrong_test_file_exits_2_naming_file_and_line() {
    for (file, wanted) in [
        (
            "unknown-rule.case.yaml",
            vec!["unknown-rule.case.yaml:5: error: spec.rule: unknown rule `webap`"],
        ),
        (
            "unknown-child.case.yaml",
            vec![
                "unknown-child.case.yaml:12: error: spec.cases[0].expect.children.ingress: \
                 rule `webapp` has no child or patch `ingress`",
                "unknown-child.case.yaml:13: error: spec.cases[0].expect.absent[0]: \
                 rule `webapp` has no child or patch `routes`",
            ],
        ),
        ("bad-yaml.case.yaml", vec!["bad-yaml.case.yaml:9: error: "]),
    ] {
        let ran = trellis(&root(), &["test", "--rules", "rules", &fixture(file)]);
        assert_eq!(ran.code, Some(2), "{file}: {}\n{}", ran.stdout, ran.stderr);
        assert!(ran.stdout.is_empty(), "nothing runs: {}", ran.stdout);
        for want in wanted {
            assert!(
                ran.stderr
                    .contains(&format!("tests/fixtures/ruletests/{want}")),
                "{file}: {want}\n{}",
                ran.stderr
            );
        }

        // `check --tests` refuses the same file with the same words.
        let check = trellis(
            &root(),
            &["check", "--rules", "rules", "--tests", &fixture(file)],
        );
        assert_eq!(check.code, Some(1), "{file}: {}", check.stderr);
        let first = ran.stderr.lines().next().unwrap();
        assert!(check.stderr.contains(first), "{first}\n{}", check.stderr);
    }
}

#[test]
fn check_accepts_the_shipped_suites() {
    let ran = trellis(
        &root(),
        &["check", "--rules", "rules", "--tests", "tests/rules"],
    );
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
}

#[test]
fn junit_has_a_testsuite_per_file_and_a_testcase_per_case() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("junit.xml");
    let ran = trellis(
        &root(),
        &[
            "test",
            "--rules",
            "rules",
            "--junit",
            junit.to_str().unwrap(),
            "tests/rules",
            &fixture("failing.case.yaml"),
        ],
    );
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites "));
    assert!(xml.trim_end().ends_with("</testsuites>"), "{xml}");
    assert_eq!(xml.matches("<testsuite ").count(), 10, "{xml}");
    assert_eq!(xml.matches("</testsuite>").count(), 10, "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), SHIPPED_CASES + 2);
    assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
    assert!(xml.contains(&format!("tests=\"{}\" failures=\"1\"", SHIPPED_CASES + 2)));
    assert!(xml.contains(
        "<testsuite name=\"tests/fixtures/ruletests/failing.case.yaml\" tests=\"2\" failures=\"1\""
    ));
    assert!(xml.contains(
        "<failure message=\"children.config.metadata.name: expected &quot;a-cfg&quot;, got &quot;a-config&quot;\""
    ), "{xml}");
}

#[test]
fn json_reports_counts_and_each_case_with_its_mismatches() {
    let ran = trellis(
        &root(),
        &[
            "test",
            "--rules",
            "rules",
            "-o",
            "json",
            &fixture("failing.case.yaml"),
        ],
    );
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let report: Value = serde_json::from_str(&ran.stdout).expect("one JSON document");
    assert_eq!(report["total"], 2);
    assert_eq!(report["passed"], 1);
    assert_eq!(report["failed"], 1);
    let suite = &report["suites"][0];
    assert_eq!(suite["file"], "tests/fixtures/ruletests/failing.case.yaml");
    assert_eq!(suite["rule"], "webapp");
    let case = &suite["cases"][1];
    assert_eq!(case["name"], "fails on two paths");
    assert_eq!(case["line"], 13);
    assert_eq!(case["passed"], false);
    assert_eq!(
        case["mismatches"][1],
        serde_json::json!({"path": "status.replicas.desired", "expected": 2, "actual": 1})
    );
}

#[test]
fn without_paths_or_a_tests_directory_there_is_nothing_to_run() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&root().join("rules"), &dir.path().join("rules"));
    let ran = trellis(dir.path(), &["test", "--rules", "rules"]);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("no test paths given and no tests/ directory next to rules"),
        "{}",
        ran.stderr
    );
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    let ran = trellis(dir.path(), &["test", "--rules", "rules"]);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("no test files (*.test.yaml) under tests"),
        "{}",
        ran.stderr
    );
}

/// The CI commands the chart's README gives, run as written (comments
/// dropped) in a user's repository laid out as it says: the rules in
/// `my-rules/`, the suites under `tests/`, the parents they name beside
/// them (`examples/`).
#[test]
fn the_charts_readme_ci_commands_run_as_written() {
    let readme = std::fs::read_to_string(root().join("charts/trellis/README.md")).unwrap();
    let after = readme
        .split("Test the rules before they reach the chart")
        .nth(1)
        .expect("the README's CI section");
    let block = after
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its sh block");
    let commands: Vec<Vec<&str>> = block
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(commands.len(), 2, "{block}");
    let repo = tempfile::tempdir().unwrap();
    copy_dir(&root().join("rules"), &repo.path().join("my-rules"));
    copy_dir(
        &root().join("tests/rules"),
        &repo.path().join("tests/rules"),
    );
    copy_dir(&root().join("examples"), &repo.path().join("examples"));
    for command in &commands {
        assert_eq!(command[0], "trellis", "{command:?}");
        let ran = trellis(repo.path(), &command[1..]);
        assert_eq!(
            ran.code,
            Some(0),
            "{command:?}:\n{}{}",
            ran.stdout,
            ran.stderr
        );
    }
    let junit =
        std::fs::read_to_string(repo.path().join("trellis-junit.xml")).expect("the JUnit file");
    assert!(junit.contains("tests=\"34\" failures=\"0\""), "{junit}");
}
