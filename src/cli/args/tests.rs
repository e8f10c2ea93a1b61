//! The command line's flags, parsed as a user types them.

mod leader_flags {
    use clap::Parser;

    use super::super::{Cli, Command};

    fn settings(
        args: &[&str],
    ) -> Result<Option<crate::operator::leadership::leader::Settings>, String> {
        let argv = ["trellis", "run", "--rules", "rules"].iter().chain(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Run { leader, .. } => leader.settings(),
            _ => Err("not run".into()),
        }
    }

    #[test]
    fn run_takes_several_rules_directories_after_one_flag_as_rules_md_writes_it() {
        let dirs = |argv: &[&str]| match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Run { rules, .. }) => rules,
            other => panic!("{other:?}"),
        };
        let want = [std::path::PathBuf::from("a"), std::path::PathBuf::from("b")];
        assert_eq!(dirs(&["trellis", "run", "--rules", "a", "b"]), want);
        assert_eq!(
            dirs(&["trellis", "run", "--rules", "a", "--rules", "b"]),
            want
        );
        assert_eq!(dirs(&["trellis", "run", "--rules", "a,b", "-n", "x"]), want);
    }

    #[test]
    fn leader_election_is_off_unless_asked_for_and_takes_its_timings_from_flags() {
        assert_eq!(settings(&[]), Ok(None));
        let s = settings(&[
            "--leader-elect",
            "--leader-elect-namespace=ops",
            "--leader-elect-lease-name=mine",
            "--leader-elect-lease-duration=20s",
        ])
        .expect("valid")
        .expect("enabled");
        assert_eq!(
            (s.namespace.as_str(), s.lease_name.as_str()),
            ("ops", "mine")
        );
        assert_eq!(s.lease_duration, std::time::Duration::from_secs(20));
        assert_eq!(s.renew_deadline, std::time::Duration::from_secs(10));
        assert_eq!(s.retry_period, std::time::Duration::from_secs(2));
        assert!(!s.identity.is_empty());
        let err = settings(&[
            "--leader-elect",
            "--leader-elect-namespace=ops",
            "--leader-elect-renew-deadline=1s",
        ])
        .expect_err("a renew deadline below the retry period");
        assert!(err.contains("--leader-elect-retry-period"), "{err}");
    }

    #[test]
    fn member_leases_are_shorter_than_the_leaders_unless_set_and_checked_only_under_shards() {
        use std::time::Duration;
        let base = ["--leader-elect", "--leader-elect-namespace=ops"];
        let with = |extra: &[&str]| {
            settings(&[&base[..], extra].concat())
                .map(|s| s.expect("enabled").member())
                .map(|m| (m.lease_duration, m.renew_deadline, m.retry_period))
        };
        let secs = Duration::from_secs;
        assert_eq!(with(&["--shards"]), Ok((secs(6), secs(4), secs(2))));
        // Short leader timings (as the tests use) are never lengthened.
        assert_eq!(
            with(&[
                "--shards",
                "--leader-elect-lease-duration=4s",
                "--leader-elect-renew-deadline=3s",
                "--leader-elect-retry-period=1s",
            ]),
            Ok((secs(4), secs(3), secs(1)))
        );
        assert_eq!(
            with(&[
                "--shards",
                "--shards-member-lease-duration=10s",
                "--shards-member-renew-deadline=7s",
            ]),
            Ok((secs(10), secs(7), secs(2)))
        );
        let err = with(&["--shards", "--shards-member-renew-deadline=6s"])
            .expect_err("a renew deadline as long as the lease");
        assert!(err.contains("--shards-member-renew-deadline (6s)"), "{err}");
        // A retry period the derived deadline cannot hold: named, and said
        // to be the default.
        let slow = [
            "--leader-elect-lease-duration=30s",
            "--leader-elect-renew-deadline=20s",
            "--leader-elect-retry-period=5s",
        ];
        let err = with(&[&slow[..], &["--shards"]].concat()).expect_err("5s retry, 4s deadline");
        assert!(err.contains("its default"), "{err}");
        // Without --shards no member Lease is held: nothing to check.
        assert!(with(&slow).is_ok());
        assert!(
            with(&["--shards-member-lease-duration=10s"]).is_err(),
            "needs --shards"
        );
    }
}

mod help {
    use clap::{ArgAction, CommandFactory};

    use super::super::Cli;

    /// Every flag of every command says what it does in its help line, and
    /// what happens without it: a default clap prints, or `[default: ...]`
    /// in the text, `[default: off]` for a switch (required arguments and
    /// `diff`'s PARENT.yaml, the alternative to `--all`, have none).
    #[test]
    fn every_flag_has_a_description_and_its_default() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        for cmd in cli.get_subcommands() {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(arg.get_action(), ArgAction::Help | ArgAction::Version) {
                    continue;
                }
                let help = arg
                    .get_long_help()
                    .or(arg.get_help())
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                let what = format!("{} {id}", cmd.get_name());
                if help.trim().len() < 10 {
                    missing.push(format!("{what}: no description"));
                }
                // A switch's clap default (false) is not printed: say "off".
                let switch = matches!(arg.get_action(), ArgAction::SetTrue);
                let has_default = (!switch && !arg.get_default_values().is_empty())
                    || help.contains("[default: ")
                    || arg.is_required_set()
                    || (cmd.get_name(), id) == ("diff", "parent");
                if !has_default {
                    missing.push(format!("{what}: no default"));
                }
            }
        }
        assert!(missing.is_empty(), "{missing:#?}");
    }

    #[test]
    fn run_help_says_where_rules_come_from_and_what_it_serves() {
        let mut cli = Cli::command();
        let run = cli.find_subcommand_mut("run").expect("run");
        let help = run.render_long_help().to_string();
        for needle in [
            "mounted as a volume",
            "ConfigMap",
            "/metrics",
            "/healthz",
            "/readyz",
            "/status",
            "--metrics-addr",
        ] {
            assert!(
                help.contains(needle),
                "run --help lacks {needle:?}:\n{help}"
            );
        }
    }
}
