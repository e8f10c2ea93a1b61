//! `trellis test`: reads the rule set and the `RuleTest` files, prints what
//! [`crate::offline::ruletest`] finds. Exit 0: every case passes; 1: a case
//! fails; 2: the tests could not run (a wrong test file, a rule set that
//! does not load, no test files).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::ValueEnum;

use super::{RenderLimits, load, print_out, report};
use crate::offline::ruletest::{self, discover};

/// What cannot be tested: a test file (or the rule set) is itself wrong.
const WRONG: u8 = 2;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Test files are `RuleTest` documents (apiVersion trellis.dev/v1alpha1): a rule by name
and cases, each a parent, the objects the pass observes and what it must produce.
Every case runs through the same pass as `trellis render`. See docs/testing.md.

Exit status: 0 every case passes; 1 a case fails; 2 a test file is wrong (unknown
rule or child id, bad YAML: named with file and line) or the rules do not load.")]
pub struct TestArgs {
    /// Rules directory (repeatable)
    #[arg(long = "rules", required = true, value_name = "DIR")]
    rules: Vec<PathBuf>,
    /// Test files, or directories searched recursively for `*.test.yaml`; a
    /// file named here is read whatever its name [default: DIR/../tests/ of
    /// each rules directory, when it exists]
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Output format of the report on stdout
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: TestOutput,
    /// Also write the results as JUnit XML to FILE (a testsuite per test
    /// file, a testcase per case) [default: none]
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    #[command(flatten)]
    limits: RenderLimits,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TestOutput {
    /// A line per case, the mismatches of a failure, a summary line
    Text,
    /// One JSON document: counts, and every case with its mismatches
    Json,
}

/// The paths searched: those given, else each rules directory's `../tests`.
pub fn test_paths(rules: &[PathBuf], given: &[PathBuf]) -> Vec<PathBuf> {
    if !given.is_empty() {
        return given.to_vec();
    }
    rules
        .iter()
        .map(|dir| discover::default_dir(dir))
        .filter(|dir| dir.is_dir())
        .collect()
}

/// `trellis test`.
pub fn test(args: TestArgs) -> ExitCode {
    let Ok(set) = load(&args.rules, args.limits.limits()) else {
        return ExitCode::from(WRONG);
    };
    let paths = test_paths(&args.rules, &args.paths);
    if paths.is_empty() {
        stderr!(
            "error: no test paths given and no tests/ directory next to {}",
            args.rules
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return ExitCode::from(WRONG);
    }
    let (suites, diags) = ruletest::load_suites(&paths, &set);
    if report(&diags) {
        stderr!(
            "{} error(s) in the test files; nothing was run",
            diags.len()
        );
        return ExitCode::from(WRONG);
    }
    let results = ruletest::run_suites(&suites);
    if let Some(path) = &args.junit
        && let Err(e) = std::fs::write(path, results.to_junit())
    {
        stderr!("error: --junit {}: {e}", path.display());
        return ExitCode::from(WRONG);
    }
    let text = match args.output {
        TestOutput::Text => results.to_text(),
        TestOutput::Json => match serde_json::to_string_pretty(&results.to_json()) {
            Ok(text) => format!("{text}\n"),
            Err(e) => {
                stderr!("error: cannot print the report: {e}");
                return ExitCode::from(WRONG);
            }
        },
    };
    // A reader that went away (`| head`) changes nothing about the verdict.
    let _ = print_out(&text);
    if results.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
