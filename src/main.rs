use std::process::ExitCode;

use clap::Parser;
use trellis::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { rules, limits } => cli::check(&rules, limits.limits()),
        Command::Render {
            rules,
            parent,
            observed,
            output,
            now,
            limits,
        } => cli::render(
            &rules,
            &parent,
            observed.as_deref(),
            output,
            now,
            limits.limits(),
        ),
        Command::Rbac { rules, name } => cli::rbac(&rules, &name),
        Command::Schema => cli::schema(),
    }
}
