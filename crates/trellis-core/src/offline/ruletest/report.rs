//! What a run of rule tests found, and its three forms: the text
//! `trellis test` prints (a line per case, the mismatches of a failure, a
//! summary), a JSON report, and JUnit XML (a testsuite per file, a testcase
//! per case) for CI systems that draw test results.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use super::matcher::Mismatch;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub suites: Vec<SuiteResult>,
}

/// The cases of one `RuleTest` document.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteResult {
    pub file: PathBuf,
    pub name: String,
    pub rule: String,
    pub cases: Vec<CaseResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub name: String,
    pub line: Option<u64>,
    /// Empty: the case passes.
    pub mismatches: Vec<Mismatch>,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }

    /// The mismatches, one per line.
    pub fn failure_text(&self) -> String {
        self.mismatches.iter().map(|m| format!("{m}\n")).collect()
    }
}

impl SuiteResult {
    fn failed(&self) -> usize {
        self.cases.iter().filter(|c| !c.passed()).count()
    }

    /// `file:line` of a case.
    fn place(&self, case: &CaseResult) -> String {
        match case.line {
            Some(line) => format!("{}:{line}", self.file.display()),
            None => self.file.display().to_string(),
        }
    }
}

impl Report {
    pub fn total(&self) -> usize {
        self.suites.iter().map(|s| s.cases.len()).sum()
    }

    pub fn failed(&self) -> usize {
        self.suites.iter().map(SuiteResult::failed).sum()
    }

    pub fn passed(&self) -> bool {
        self.failed() == 0
    }

    /// A line per case, the mismatches under a failure, a summary line.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for suite in &self.suites {
            for case in &suite.cases {
                let verdict = if case.passed() { "ok    " } else { "FAILED" };
                let _ = writeln!(
                    out,
                    "{verdict} {} [{}] {}",
                    suite.place(case),
                    suite.rule,
                    case.name
                );
                for m in &case.mismatches {
                    let _ = writeln!(out, "         {m}");
                }
            }
        }
        let _ = writeln!(out, "{}", self.summary());
        out
    }

    /// `test result: ok. 12 passed; 0 failed; 12 cases in 3 files`.
    pub fn summary(&self) -> String {
        let failed = self.failed();
        let files: std::collections::BTreeSet<_> = self.suites.iter().map(|s| &s.file).collect();
        format!(
            "test result: {}. {} passed; {failed} failed; {} case(s) in {} file(s)",
            if failed == 0 { "ok" } else { "FAILED" },
            self.total() - failed,
            self.total(),
            files.len()
        )
    }

    /// The machine-readable report (`-o json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "passed": self.total() - self.failed(),
            "failed": self.failed(),
            "total": self.total(),
            "suites": self.suites.iter().map(|s| serde_json::json!({
                "file": s.file,
                "name": s.name,
                "rule": s.rule,
                "cases": s.cases.iter().map(|c| serde_json::json!({
                    "name": c.name,
                    "line": c.line,
                    "passed": c.passed(),
                    "mismatches": c.mismatches,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }

    /// JUnit XML: a `testsuite` per test file, a `testcase` per case, a
    /// `failure` (message: the first mismatch; text: all of them) per
    /// failed case.
    pub fn to_junit(&self) -> String {
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            out,
            "<testsuites name=\"trellis test\" tests=\"{}\" failures=\"{}\">",
            self.total(),
            self.failed()
        );
        // Several RuleTest documents in one file make one testsuite.
        let mut files: Vec<&PathBuf> = Vec::new();
        for s in &self.suites {
            if !files.contains(&&s.file) {
                files.push(&s.file);
            }
        }
        for file in files {
            let suites: Vec<&SuiteResult> =
                self.suites.iter().filter(|s| &s.file == file).collect();
            let tests: usize = suites.iter().map(|s| s.cases.len()).sum();
            let failures: usize = suites.iter().map(|s| s.failed()).sum();
            let _ = writeln!(
                out,
                "  <testsuite name=\"{}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\">",
                xml(&file.display().to_string())
            );
            for suite in suites {
                for case in &suite.cases {
                    let _ = write!(
                        out,
                        "    <testcase name=\"{}\" classname=\"{}\" file=\"{}\"",
                        xml(&case.name),
                        xml(&format!("{}.{}", suite.rule, suite.name)),
                        xml(&file.display().to_string()),
                    );
                    if let Some(line) = case.line {
                        let _ = write!(out, " line=\"{line}\"");
                    }
                    match case.mismatches.first() {
                        None => out.push_str("/>\n"),
                        Some(first) => {
                            let _ = writeln!(
                                out,
                                ">\n      <failure message=\"{}\" type=\"mismatch\">{}</failure>\n    </testcase>",
                                xml(&first.to_string()),
                                xml(&case.failure_text()).replace("&#10;", "\n")
                            );
                        }
                    }
                }
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }
}

/// Text escaped for an XML attribute (newlines as `&#10;`, which an
/// attribute would otherwise fold into spaces); characters XML 1.0 cannot
/// hold at all (control characters) become U+FFFD.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn report() -> Report {
        Report {
            suites: vec![SuiteResult {
                file: "tests/rules/web<app>.test.yaml".into(),
                name: "webapp".into(),
                rule: "webapp".into(),
                cases: vec![
                    CaseResult {
                        name: "passes".into(),
                        line: Some(7),
                        mismatches: vec![],
                    },
                    CaseResult {
                        name: "fails \"here\"".into(),
                        line: Some(20),
                        mismatches: vec![Mismatch {
                            path: "children.web.spec.replicas".into(),
                            expected: json!(2),
                            actual: Some(json!(1)),
                        }],
                    },
                ],
            }],
        }
    }

    #[test]
    fn text_has_a_line_per_case_the_mismatch_and_a_summary() {
        let text = report().to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("ok     tests/rules/web<app>.test.yaml:7 [webapp] passes"));
        assert!(lines[1].starts_with("FAILED tests/rules/web<app>.test.yaml:20"));
        assert_eq!(
            lines[2].trim(),
            "children.web.spec.replicas: expected 2, got 1"
        );
        assert_eq!(
            lines[3],
            "test result: FAILED. 1 passed; 1 failed; 2 case(s) in 1 file(s)"
        );
    }

    #[test]
    fn junit_has_a_testsuite_per_file_and_a_failure_per_failed_case() {
        let xml = report().to_junit();
        assert!(xml.starts_with("<?xml version=\"1.0\""), "{xml}");
        assert!(xml.contains("<testsuites name=\"trellis test\" tests=\"2\" failures=\"1\">"));
        assert!(xml.contains(
            "<testsuite name=\"tests/rules/web&lt;app&gt;.test.yaml\" tests=\"2\" failures=\"1\""
        ));
        assert_eq!(xml.matches("<testcase ").count(), 2, "{xml}");
        assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
        assert!(xml.contains("name=\"fails &quot;here&quot;\""), "{xml}");
        assert!(
            xml.contains("message=\"children.web.spec.replicas: expected 2, got 1\""),
            "{xml}"
        );
        assert!(xml.contains(" line=\"20\""));
    }

    #[test]
    fn json_counts_and_lists_every_case() {
        let doc = report().to_json();
        assert_eq!(
            (doc["passed"].clone(), doc["failed"].clone()),
            (json!(1), json!(1))
        );
        let cases = &doc["suites"][0]["cases"];
        assert_eq!(cases[1]["passed"], false);
        assert_eq!(
            cases[1]["mismatches"][0]["path"],
            "children.web.spec.replicas"
        );
        assert_eq!(cases[1]["mismatches"][0]["actual"], 1);
    }
}
