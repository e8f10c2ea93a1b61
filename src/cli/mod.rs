//! Command-line parsing, `trellis run`, and the offline commands. `main.rs`
//! only dispatches; this module holds what the commands share (loading a
//! rule set, printing diagnostics and output).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::crd::offline::OfflineCrds;
use crate::render::Limits;
use crate::rules::{Diagnostic, RuleSet, Severity};

/// `eprintln!` that never panics: a closed stderr (`2>&1 | head`) is no
/// reason to crash with a panic message.
macro_rules! stderr {
    ($($arg:tt)*) => {{
        let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("{}\n", format_args!($($arg)*)));
    }};
}

mod args;
mod check;
mod commands;
mod rbac;
mod render;
mod rollout;
mod test;
pub mod tree;

pub use args::{
    Cli, Command, GraphOutput, LeaderElection, ListenAddr, LogFormat, Output, RenderLimits,
    RolloutAction, RolloutOutput,
};
pub use check::{CheckInputs, check, lsp};
pub use commands::{convert, crd, crd_against_cluster, crd_documents, diff, graph, schema};
pub use rbac::{RbacRoles, rbac};
pub use render::render;
pub use rollout::{Action as RolloutDecision, rollout};
pub use test::test;
pub use tree::tree;

/// Logs to stderr; `RUST_LOG` overrides the default level (`info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// `trellis run`.
pub fn run(options: crate::operator::Options, log_format: LogFormat) -> ExitCode {
    init_logging(log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            stderr!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        let shutdown = tokio_util::sync::CancellationToken::new();
        tokio::spawn(crate::operator::cancel_on_signal(shutdown.clone()));
        match crate::operator::run(options, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e:#}");
                ExitCode::from(1)
            }
        }
    })
}

/// Prints diagnostics; returns whether the set has errors.
fn report(diags: &[Diagnostic]) -> bool {
    let mut stderr = std::io::stderr().lock();
    for d in diags {
        let _ = writeln!(stderr, "{d}");
    }
    diags.iter().any(|d| d.severity == Severity::Error)
}

fn load(dirs: &[PathBuf], limits: Limits) -> Result<RuleSet, ExitCode> {
    load_settled(dirs, limits, |_| Vec::new())
}

/// [`load`], with `settle` turning warnings into errors (or taking them
/// away) before anything is printed.
fn load_settled(
    dirs: &[PathBuf],
    limits: Limits,
    settle: impl FnOnce(&mut RuleSet) -> Vec<Diagnostic>,
) -> Result<RuleSet, ExitCode> {
    let diags = match RuleSet::load(dirs, limits) {
        Ok(mut set) => {
            let errors = settle(&mut set);
            if errors.is_empty() {
                report(&set.warnings);
                return Ok(set);
            }
            let mut diags = set.warnings;
            diags.extend(errors);
            diags
        }
        Err(diags) => diags,
    };
    report(&diags);
    let errors = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    stderr!("{errors} error(s); the rule set is rejected");
    Err(ExitCode::from(1))
}

/// Reads `--crds`, or says why not.
fn load_crds(path: Option<&Path>) -> Result<Option<OfflineCrds>, ExitCode> {
    path.map(OfflineCrds::load).transpose().map_err(|e| {
        eprintln!("error: --crds: {e}");
        ExitCode::from(1)
    })
}

/// Warns about status fields the parents' CRDs would drop: those of
/// `--crds` when given, else the ones trellis generates from `crd:` blocks.
fn warn_dropped(set: &RuleSet, crds: Option<&OfflineCrds>) -> usize {
    let generated;
    let crds = match crds {
        Some(crds) => crds,
        None => {
            generated = OfflineCrds::generated(set.rules.iter().map(|r| r.as_ref()));
            &generated
        }
    };
    let mut n = 0;
    for rule in &set.rules {
        if let Some((crd, version)) = crds.find(&rule.parent) {
            let warnings = crate::crd::offline::dropped_status_fields(rule, crd, version);
            n += warnings.len();
            report(&warnings);
        }
    }
    n
}

/// Runs `work` on a runtime of its own with a client of the cluster
/// KUBECONFIG (or the in-cluster config) names: the commands that read a
/// live cluster (`diff --live`, `rollout`, `rbac --from-cluster`). `Err` is
/// the message to print.
fn with_cluster<T, F, E>(work: impl FnOnce(kube::Client) -> F) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| {
            format!("cannot build a Kubernetes client (KUBECONFIG or in-cluster config): {e}")
        })?;
        work(client).await.map_err(|e| e.to_string())
    })
}

/// Writes `text` to stdout. A reader that went away (`trellis rbac | head`)
/// only means the rest is not wanted: the command ends quietly with success,
/// as Unix tools do. `Err` carries the exit code to end with.
fn print_out(text: &str) -> Result<(), ExitCode> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ExitCode::SUCCESS),
        Err(e) => {
            stderr!("error: cannot write the output: {e}");
            Err(ExitCode::from(1))
        }
    }
}
