//! What `trellis run` is told: the operator's settings, with the defaults
//! tests and the command line start from.

use std::path::PathBuf;
use std::time::Duration;

use super::{leader, webhook};
use crate::render::Limits;

/// How `trellis run` was asked to behave.
#[derive(Debug, Clone)]
pub struct Options {
    pub rules: Vec<PathBuf>,
    /// Watch only these namespaces; empty: all.
    pub namespaces: Vec<String>,
    /// Most reconciles in flight at once, across all rules.
    pub concurrency: usize,
    pub limits: Limits,
    /// Reported as the Event source instance.
    pub instance: String,
    /// Quiet time after a filesystem event before the rules are re-read.
    pub reload_debounce: Duration,
    /// Re-read interval when no event arrives (missed events, no inotify).
    pub reload_poll: Duration,
    /// Where `/metrics`, `/healthz`, `/readyz` and `/status` are served.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `--leader-elect`: only the Lease holder writes. `None`: always writes.
    pub leader_election: Option<leader::Settings>,
    /// Apply the CRDs generated from rules (`crd:`) at start and on reload.
    pub manage_crds: bool,
    /// `--shards` (with leader election): every replica writes the parents
    /// of its buckets.
    pub shards: bool,
    /// The operator's own namespace ([`home::operator_namespace`]).
    pub operator_namespace: String,
    /// `--require-service-account`: a rule without `serviceAccountName` is
    /// rejected like a broken rule.
    pub require_service_account: bool,
    /// How often a running rule's account is checked again (10 minutes;
    /// shorter in tests).
    pub account_recheck: Duration,
    /// The conversion webhook (started once a rule has `versions:`).
    pub webhook: webhook::Settings,
    /// `--cluster-name`: this hub's name, the `trellis.dev/hub` label of
    /// its children in other clusters.
    pub cluster_name: String,
}

impl Options {
    /// Defaults for everything but the rules directories and namespaces.
    pub fn new(rules: Vec<PathBuf>, namespaces: Vec<String>) -> Options {
        Options {
            rules,
            namespaces,
            concurrency: 32,
            limits: Limits::default(),
            instance: "trellis".into(),
            reload_debounce: Duration::from_millis(500),
            reload_poll: Duration::from_secs(30),
            metrics_addr: None,
            leader_election: None,
            manage_crds: false,
            shards: false,
            operator_namespace: "default".into(),
            require_service_account: false,
            account_recheck: Duration::from_secs(600),
            webhook: webhook::Settings::new("default"),
            cluster_name: crate::clusters::DEFAULT_HUB.into(),
        }
    }
}
