use std::process::ExitCode;

use clap::Parser;
use trellis::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        run @ Command::Run { .. } => run_operator(run),
        Command::Check {
            rules,
            crds,
            observed,
            parents,
            strict,
            tests,
            limits,
        } => cli::check(
            &rules,
            limits.limits(),
            cli::CheckInputs {
                crds: crds.as_deref(),
                observed: observed.as_deref(),
                parents: parents.as_deref(),
            },
            strict,
            &tests,
        ),
        Command::Test(args) => cli::test(args),
        Command::Render {
            rules,
            parent,
            observed,
            crds,
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
            crds.as_deref(),
        ),
        Command::Rbac {
            rules,
            name,
            manage_crds,
            shards,
            operator_namespace,
            from_cluster,
            viewer,
            cluster,
        } => cli::rbac(
            &rules,
            &name,
            cli::RbacRoles {
                manage_crds,
                shards,
                viewer,
                cluster,
            },
            &operator_namespace,
            from_cluster,
        ),
        Command::Schema => cli::schema(),
        Command::Lsp { crds, strict } => cli::lsp(crds.as_deref(), strict),
        Command::Crd {
            rules,
            against_cluster: false,
        } => cli::crd(&rules),
        Command::Crd {
            rules,
            against_cluster: true,
        } => cli::crd_against_cluster(&rules),
        Command::Convert { rules, to, parent } => cli::convert(&rules, &parent, &to),
        Command::Diff {
            rules,
            parent,
            all: _,
            namespace,
            rule,
            operator_namespace,
            limits,
        } => cli::diff(
            &rules,
            parent.as_deref(),
            namespace,
            rule,
            operator_namespace,
            limits.limits(),
        ),
        Command::Tree(args) => cli::tree(args),
        Command::Graph {
            rules,
            rule,
            output,
        } => cli::graph(&rules, rule.as_deref(), output),
        Command::Rollout {
            action,
            operator_namespace,
        } => cli::rollout(
            match action {
                cli::RolloutAction::Status { rule, output } => cli::RolloutDecision::Status {
                    rule,
                    json: matches!(output, cli::RolloutOutput::Json),
                },
                cli::RolloutAction::Promote { rule } => cli::RolloutDecision::Promote(rule),
                cli::RolloutAction::Abort { rule } => cli::RolloutDecision::Abort(rule),
            },
            operator_namespace,
        ),
    }
}

/// `trellis run`: the operator, with its settings from the flags.
fn run_operator(command: Command) -> ExitCode {
    // `main` sends only `run` here.
    let Command::Run {
        rules,
        namespaces,
        concurrency,
        log_format,
        metrics_addr,
        reload_poll,
        manage_crds,
        operator_namespace,
        require_service_account,
        cluster_name,
        service_account_recheck,
        limits,
        leader,
        webhook,
    } = command
    else {
        return ExitCode::from(2);
    };
    let operator_namespace =
        trellis::operator::home::operator_namespace(operator_namespace.as_deref());
    let webhook = match webhook.settings(&operator_namespace) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    cli::run(
        trellis::operator::Options {
            leader_election: match leader.settings() {
                Ok(settings) => settings,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            },
            concurrency,
            metrics_addr: metrics_addr.0,
            reload_poll,
            manage_crds,
            shards: leader.shards,
            operator_namespace,
            webhook,
            require_service_account,
            account_recheck: service_account_recheck,
            cluster_name,
            limits: limits.limits(),
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "trellis".into()),
            ..trellis::operator::Options::new(rules, namespaces)
        },
        log_format,
    )
}
