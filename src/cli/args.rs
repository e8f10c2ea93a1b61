//! The command line: every subcommand, flag and environment variable.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::render::Limits;

#[derive(Debug, Parser)]
#[command(
    name = "trellis",
    version,
    about = "A Kubernetes operator programmed with YAML rules",
    long_about = "trellis keeps child objects in existence for every object of a parent kind, \
                  as declared by rule files (trellis.dev/v1alpha1 Rule), and writes the children's \
                  state back into the parent's status.",
    after_help = "Start offline: `trellis check --rules DIR`, then `trellis render --rules DIR \
                  parent.yaml`. `trellis schema` prints the rule format; `trellis <command> --help` \
                  says more."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RenderLimits {
    /// Template fuel per render (roughly: instructions executed); a render
    /// that runs out fails that parent only
    #[arg(
        long,
        value_name = "N",
        default_value_t = Limits::default().fuel,
        env = "TRELLIS_RENDER_FUEL"
    )]
    pub render_fuel: u64,
    /// Deepest nesting (macro calls, loops, blocks) a render may reach; one
    /// past it fails that parent only
    #[arg(
        long,
        value_name = "DEPTH",
        default_value_t = Limits::default().recursion,
        env = "TRELLIS_RENDER_RECURSION"
    )]
    pub render_recursion: usize,
    /// Most bytes one template may produce; more fails that parent only
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = Limits::default().max_bytes,
        env = "TRELLIS_RENDER_MAX_BYTES"
    )]
    pub render_max_bytes: usize,
}

impl RenderLimits {
    pub fn limits(&self) -> Limits {
        Limits {
            fuel: self.render_fuel,
            recursion: self.render_recursion,
            max_bytes: self.render_max_bytes,
        }
    }
}

/// The conversion webhook's flags (served once a rule has `versions:`).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Conversion webhook")]
pub struct Webhook {
    /// HOST:PORT where every replica serves the conversion webhook (TLS,
    /// POST /convert) while a rule has `versions:`
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "0.0.0.0:9443",
        env = "TRELLIS_WEBHOOK_ADDR"
    )]
    pub webhook_addr: std::net::SocketAddr,
    /// A directory with tls.crt, tls.key (and ca.crt, written into each
    /// managed CRD's caBundle) from cert-manager or your own CA, re-read every
    /// 10 s [default: trellis makes a CA and certificate and keeps them in the
    /// Secret trellis-webhook-tls in its namespace]
    #[arg(long, value_name = "DIR", env = "TRELLIS_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,
    /// The Service in front of the replicas, NAMESPACE/NAME, that managed CRDs
    /// send ConversionReviews to (port 443) [default: <operator namespace>/trellis-webhook]
    #[arg(long, value_name = "NS/NAME", env = "TRELLIS_WEBHOOK_SERVICE")]
    pub webhook_service: Option<String>,
    /// Instead of a Service, the URL the API server calls, https://HOST:PORT
    /// (trellis run outside the cluster); the made certificate names HOST
    /// [default: none: the Service]
    #[arg(
        long,
        value_name = "URL",
        env = "TRELLIS_WEBHOOK_URL",
        conflicts_with = "webhook_service"
    )]
    pub webhook_url: Option<String>,
}

impl Webhook {
    /// The operator's webhook settings, for an operator in `namespace`.
    pub fn settings(&self, namespace: &str) -> Result<crate::operator::webhook::Settings, String> {
        let mut settings = crate::operator::webhook::Settings::new(namespace);
        settings.addr = self.webhook_addr;
        settings.cert_dir = self.webhook_cert_dir.clone();
        if let Some(service) = &self.webhook_service {
            let Some((ns, name)) = service
                .split_once('/')
                .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
            else {
                return Err(format!(
                    "--webhook-service {service}: expected NAMESPACE/NAME"
                ));
            };
            settings.service = (ns.to_owned(), name.to_owned());
        }
        if let Some(url) = &self.webhook_url {
            if !url.starts_with("https://") {
                return Err(format!(
                    "--webhook-url {url}: the API server calls webhooks over https://"
                ));
            }
            settings.url = Some(url.clone());
        }
        Ok(settings)
    }
}

/// `trellis run --leader-elect` and its timings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Leader election")]
pub struct LeaderElection {
    /// Run as one of several replicas: only the holder of a coordination.k8s.io Lease writes;
    /// the others keep warm caches, write nothing, and take over when the leader goes
    /// (SIGTERM releases the Lease, so a successor takes over at once) [default: off]
    #[arg(long, env = "TRELLIS_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Name of the Lease
    #[arg(
        long,
        default_value = "trellis",
        value_name = "NAME",
        env = "TRELLIS_LEADER_ELECT_LEASE_NAME"
    )]
    pub leader_elect_lease_name: String,
    /// Namespace of the Lease [default: $POD_NAMESPACE, else the Pod's service account namespace]
    #[arg(long, value_name = "NS", env = "TRELLIS_LEADER_ELECT_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// How long the Lease holds without renewal before another replica may take it (whole seconds)
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub leader_elect_lease_duration: std::time::Duration,
    /// A leader that could not renew for this long stops writing (shorter than the lease duration)
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub leader_elect_renew_deadline: std::time::Duration,
    /// How often the leader renews, and a failed attempt is retried (whole seconds)
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub leader_elect_retry_period: std::time::Duration,
    /// Every replica works: parents are cut into 256 buckets by uid, the leader assigns
    /// them to the live replicas (each holds a member Lease, `<lease>-member-…`), and each
    /// replica reconciles, writes and caches the children of its own buckets only; the
    /// leader keeps the cluster-wide duties (CRDs, a removed rule's cleanup, rollout
    /// decisions). Needs --leader-elect [default: off]
    #[arg(long, requires = "leader_elect", env = "TRELLIS_SHARDS")]
    pub shards: bool,
    /// Under --shards, how long a member Lease holds without renewal: a SIGKILLed
    /// replica's buckets move after about twice this (whole seconds) [default: 6s, or
    /// --leader-elect-lease-duration when shorter]
    #[arg(long, requires = "shards", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub shards_member_lease_duration: Option<std::time::Duration>,
    /// Under --shards, a replica that could not renew its member Lease for this long stops
    /// writing (shorter than the member lease duration) [default: 4s, or
    /// --leader-elect-renew-deadline when shorter]
    #[arg(long, requires = "shards", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub shards_member_renew_deadline: Option<std::time::Duration>,
}

impl LeaderElection {
    /// The election's settings; `None` without `--leader-elect`; an error
    /// naming the flag when a value cannot work.
    pub fn settings(
        &self,
    ) -> Result<Option<crate::operator::leadership::leader::Settings>, String> {
        use crate::operator::leadership::leader;
        if !self.leader_elect {
            return Ok(None);
        }
        let namespace = match &self.leader_elect_namespace {
            Some(ns) if !ns.trim().is_empty() => ns.trim().to_owned(),
            _ => leader::namespace_from_environment()?,
        };
        let settings = leader::Settings {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            member_lease_duration: self.shards_member_lease_duration,
            member_renew_deadline: self.shards_member_renew_deadline,
            ..leader::Settings::new(
                &self.leader_elect_lease_name,
                &namespace,
                &leader::identity(),
            )
        };
        settings.validate()?;
        if self.shards {
            settings.validate_member()?;
        }
        Ok(Some(settings))
    }
}

/// A socket address, or none (`off`).
#[derive(Debug, Clone, Copy)]
pub struct ListenAddr(pub Option<std::net::SocketAddr>);

fn parse_listen_addr(text: &str) -> Result<ListenAddr, String> {
    match text {
        "off" | "" => Ok(ListenAddr(None)),
        _ => text
            .parse()
            .map(|a| ListenAddr(Some(a)))
            .map_err(|e| format!("{e} (expected HOST:PORT or `off`)")),
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Output {
    Yaml,
    Json,
}

// Parsed once per process: `run`'s many flags cost nothing worth boxing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The operator: reconcile every rule's kind on the cluster (KUBECONFIG or in-cluster)
    ///
    /// Reads the rules from --rules: in production a ConfigMap mounted as a
    /// volume (examples/deploy mounts `trellis-rules` at /etc/trellis/rules).
    /// Edits are reloaded when the files change (the kubelet's `..data`
    /// swap included) and at least every --reload-poll; a rule that fails
    /// validation keeps its last good version running. Serves /metrics
    /// (Prometheus), /healthz (liveness), /readyz (readiness; a standby
    /// under --leader-elect is ready too) and /status (rule states, the last
    /// reload and its error, the leader) on --metrics-addr. SIGTERM stops
    /// writing and exits (releasing the Lease under --leader-elect).
    /// RUST_LOG sets the log level (default: info).
    Run {
        /// Rules directories, e.g. a mounted ConfigMap (`--rules a b`, repeated, or comma-separated)
        #[arg(
            long = "rules",
            required = true,
            value_name = "DIR",
            env = "TRELLIS_RULES",
            value_delimiter = ',',
            num_args = 1..
        )]
        rules: Vec<PathBuf>,
        /// Watch only this namespace (repeatable, or comma-separated) [default: every namespace]
        #[arg(
            long = "namespace",
            short = 'n',
            value_name = "NS",
            env = "TRELLIS_NAMESPACES",
            value_delimiter = ','
        )]
        namespaces: Vec<String>,
        /// Most reconciles in flight at once, across all rules
        #[arg(
            long,
            value_name = "N",
            default_value_t = 32,
            env = "TRELLIS_CONCURRENCY"
        )]
        concurrency: usize,
        /// Log format on stderr: text for people, json (one object a line) for log collectors
        #[arg(long, value_enum, default_value = "text", env = "TRELLIS_LOG_FORMAT")]
        log_format: LogFormat,
        /// HOST:PORT serving /metrics, /healthz, /readyz and /status ("off": none)
        #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080", value_parser = parse_listen_addr, env = "TRELLIS_METRICS_ADDR")]
        metrics_addr: ListenAddr,
        /// Re-read the rules at least this often, file events or not (e.g. 30s, 5m)
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration, env = "TRELLIS_RELOAD_POLL")]
        reload_poll: std::time::Duration,
        /// Apply the CRDs generated from rules with `crd:` (server-side apply,
        /// at start and on every reload; never deleted) [default: off]
        #[arg(long, env = "TRELLIS_MANAGE_CRDS")]
        manage_crds: bool,
        /// The operator's own namespace: where rules' ServiceAccounts and the revision
        /// ConfigMaps of staged rollouts live [default: $POD_NAMESPACE, else the Pod's
        /// service account namespace, else default]
        #[arg(long, value_name = "NS", env = "TRELLIS_OPERATOR_NAMESPACE")]
        operator_namespace: Option<String>,
        /// Reject (like a broken rule) every rule without `serviceAccountName`:
        /// no rule acts with the operator's own rights [default: off]
        #[arg(long, env = "TRELLIS_REQUIRE_SERVICE_ACCOUNT")]
        require_service_account: bool,
        /// This hub's name: the `trellis.dev/hub` label of its children in other
        /// clusters (spokes), so hubs sharing a spoke never touch each other's objects
        #[arg(
            long,
            value_name = "NAME",
            default_value = "hub",
            env = "TRELLIS_CLUSTER_NAME"
        )]
        cluster_name: String,
        /// How often a running rule's ServiceAccount is checked again (tests shorten it)
        #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration, hide = true)]
        service_account_recheck: std::time::Duration,
        #[command(flatten)]
        limits: RenderLimits,
        #[command(flatten)]
        leader: LeaderElection,
        #[command(flatten)]
        webhook: Webhook,
    },
    /// Lint a rule set, and the children it renders for a sample parent against
    /// their kinds' schemas; exit 1 with file:line messages on any error
    Check {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// CRD manifests (a file or a directory): the parent kinds' scope comes from
        /// them, status fields they would drop are warned about, and children of
        /// custom kinds are checked against them [default: the rules' own `crd:`
        /// blocks]
        #[arg(long, value_name = "PATH")]
        crds: Option<PathBuf>,
        /// Objects to render the children with (a YAML stream): one of a rule's parent
        /// kind replaces its sample parent; the others are live children and related
        /// objects, as for `render --observed` [default: a sample parent from each
        /// rule's `schema` and `defaults`, nothing observed]
        #[arg(long, value_name = "FILE")]
        observed: Option<PathBuf>,
        /// Stored parents (a file, or a directory of *.yaml/*.yml/*.json, e.g.
        /// `kubectl get webapps -A -o yaml` output), at any version of their
        /// kind: each is converted to the hub and round-tripped through every
        /// version of its rule's `versions:`; a lost field (not under `lossy:`)
        /// or a failing conversion is an error naming the parent [default: only
        /// the sample parent]
        #[arg(long, value_name = "PATH")]
        parents: Option<PathBuf>,
        /// Treat every warning as an error (exit 1) [default: off]
        #[arg(long)]
        strict: bool,
        /// Also check rule test files (`RuleTest`, as `trellis test` reads them):
        /// a file, or a directory searched for `*.test.yaml` (repeatable) [default:
        /// none]
        #[arg(long = "tests", value_name = "PATH")]
        tests: Vec<PathBuf>,
        #[command(flatten)]
        limits: RenderLimits,
    },
    /// Offline: run the rules' tests (`RuleTest` files) through the pass `render` prints
    Test(super::test::TestArgs),
    /// Offline: what one reconcile pass would do for PARENT (no cluster needed)
    Render {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// The parent object: a YAML file holding one object (a `kubectl get -o yaml`
        /// List of one is fine)
        #[arg(value_name = "PARENT.yaml")]
        parent: PathBuf,
        /// Live children and related objects (a YAML stream; `kubectl get -o yaml`
        /// Lists count as their items), matched by kind and name [default: none exist]
        #[arg(long, value_name = "FILE")]
        observed: Option<PathBuf>,
        /// CRD manifests (a file or a directory): the parent's scope and schema come
        /// from them [default: the rule's own `crd:` block]
        #[arg(long, value_name = "PATH")]
        crds: Option<PathBuf>,
        /// Output format
        #[arg(short = 'o', long, value_enum, default_value = "yaml")]
        output: Output,
        /// Timestamp for new condition transitions [default: the current time]
        #[arg(long, value_name = "RFC3339")]
        now: Option<String>,
        #[command(flatten)]
        limits: RenderLimits,
    },
    /// Print the least-privilege ClusterRole the rule set needs, and the Role
    /// in the operator's namespace (Leases, revision ConfigMaps)
    Rbac {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// Name of the ClusterRole
        #[arg(long, default_value = "trellis")]
        name: String,
        /// Also grant what `trellis run --manage-crds` needs (create and patch
        /// on the generated CRDs, by name) [default: off]
        #[arg(long)]
        manage_crds: bool,
        /// Also grant what `trellis run --shards` needs (patch on each parent
        /// kind, for the `trellis.dev/bucket` label written once on each
        /// parent) [default: off]
        #[arg(long)]
        shards: bool,
        /// The namespace trellis runs in: the Role is printed there, and
        /// --from-cluster reads the revision ConfigMaps there
        #[arg(
            long,
            value_name = "NS",
            env = "TRELLIS_OPERATOR_NAMESPACE",
            default_value = "trellis-system"
        )]
        operator_namespace: String,
        /// Also cover the versions of rules with `rollout:` that a rollout in
        /// progress still runs, read from the revision ConfigMaps in the
        /// cluster (KUBECONFIG or in-cluster config) [default: off: the rules
        /// on disk only, with a note naming the rules this may miss]
        #[arg(long)]
        from_cluster: bool,
        /// Print only the read-only ClusterRole `<name>-viewer` for `trellis tree` [default: off]
        #[arg(long)]
        viewer: bool,
        /// Print only the ClusterRole `<name>-spoke-<NAME>` that the credentials of
        /// spoke NAME need there (the children rules may place in it) [default: none:
        /// the hub's roles]
        #[arg(long, value_name = "NAME", conflicts_with = "viewer")]
        cluster: Option<String>,
    },
    /// Print the JSON Schema of the rule format
    Schema,
    /// A language server over stdio for rule files: `check`'s diagnostics as you
    /// type, hover and completion of rule fields (rule directories are found
    /// anywhere under the workspace)
    Lsp {
        /// CRD manifests (a file or a directory), as for `check --crds` [default: none: each rule's
        /// own `crd:` block]
        #[arg(long, value_name = "PATH")]
        crds: Option<PathBuf>,
        /// Report every warning as an error, as `check --strict` does [default: off]
        #[arg(long)]
        strict: bool,
    },
    /// Print the dependency graph of rules' children and related entries
    /// (all rules, or RULE)
    ///
    /// Nodes are children and related entries (read, never written); edges
    /// point from what must be ready first to what waits for it: solid for
    /// `dependsOn`, dotted for an implicit dependency (the child reads
    /// `children.X` or `related.Y`). forEach, includeWhen, policy, and a
    /// related entry's selector/optional/readyWhen are marked on the node.
    Graph {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// Only this rule [default: every rule]
        rule: Option<String>,
        /// Output format: mermaid (renders in GitHub Markdown) or dot (Graphviz)
        #[arg(short = 'o', long, value_enum, default_value = "mermaid")]
        output: GraphOutput,
    },
    /// Against the live cluster (KUBECONFIG or in-cluster): what one pass of the
    /// operator would change, per child, as a diff
    ///
    /// Plans the pass as `trellis run` would, from the live parent, its live
    /// children and the related objects its rule reads, then asks the API
    /// server what each write would do with server-side dry-run requests:
    /// nothing is written. Lists children that would be created (+), updated
    /// (~, field by field), recreated (!), pruned (-) or refused (x), children
    /// held back, and changes to the parent's status. For a rule with `crd:`,
    /// first what --manage-crds would change in its CRD and whether that is
    /// breaking. Run it with the edited rules before shipping them (the
    /// operator can keep running).
    ///
    /// Exit code: 0 nothing would change, 1 something would, 2 a pass would
    /// fail, a CRD change is breaking (and not allowed), or the cluster could
    /// not be asked. Needs get/list on the parent,
    /// child and related kinds, and patch (dry-run) on children and the
    /// parent's status.
    Diff {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// A manifest naming the parent (apiVersion, kind, metadata.namespace
        /// and name; a `kubectl get -o yaml` List of one is fine); the live
        /// object of that name is diffed
        #[arg(
            required_unless_present = "all",
            conflicts_with = "all",
            value_name = "PARENT.yaml"
        )]
        parent: Option<PathBuf>,
        /// Every parent of every rule, instead of PARENT.yaml [default: off]
        #[arg(long)]
        all: bool,
        /// With --all: only parents in this namespace [default: every namespace]
        #[arg(short = 'n', long, requires = "all", value_name = "NS")]
        namespace: Option<String>,
        /// With --all: only this rule's parents [default: every rule]
        #[arg(long, requires = "all", value_name = "RULE")]
        rule: Option<String>,
        /// Where rules' ServiceAccounts and the cluster Secrets of spokes live: a rule with
        /// `serviceAccountName` dry-runs as that account, children in spokes are read and
        /// dry-run there [default: as `trellis run` resolves it]
        #[arg(long, value_name = "NS", env = "TRELLIS_OPERATOR_NAMESPACE")]
        operator_namespace: Option<String>,
        #[command(flatten)]
        limits: RenderLimits,
    },
    Tree(crate::cli::tree::TreeArgs),
    /// Convert parents to another API version of their kind (`versions:`),
    /// offline, as the operator's conversion webhook would
    ///
    /// Every object in PARENT.yaml (one or more documents, or a List) is
    /// converted A -> hub -> B with its rule's `toHub`/`fromHub` templates and
    /// printed as YAML. Exit 0 when every object converted, 1 when one did
    /// not (its error named), 2 when the rules or the file cannot be read.
    Convert {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// The version to convert to (`v1`, or `group/v1`)
        #[arg(long, value_name = "VERSION")]
        to: String,
        /// Parent manifest(s) to convert
        #[arg(value_name = "PARENT.yaml")]
        parent: PathBuf,
    },
    /// Print the CustomResourceDefinitions of the rules that set `crd:`
    ///
    /// With --against-cluster, print instead whether applying each one over
    /// the live CRD (KUBECONFIG or in-cluster) would break stored parents or
    /// clients, one line per breaking change naming version and path;
    /// nothing is applied. Exit 1 when a change is breaking and its rule
    /// does not set `crd: {allowBreaking: true}`.
    Crd {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// Compare with the live CRDs instead of printing [default: off]
        #[arg(long)]
        against_cluster: bool,
    },
    /// Staged rollouts of rule changes (`rollout:`), as kept in the cluster:
    /// status, promote, abort
    Rollout {
        #[command(subcommand)]
        action: RolloutAction,
        /// Where the revision ConfigMaps live [default: as `trellis run` resolves it:
        /// $POD_NAMESPACE, else the service account's namespace, else default]
        #[arg(
            long,
            global = true,
            value_name = "NS",
            env = "TRELLIS_OPERATOR_NAMESPACE"
        )]
        operator_namespace: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum RolloutAction {
    /// Each rule's rollout: from → to, step, moved/total, failed, state, next step
    Status {
        /// Only this rule [default: every rule with a rollout]
        rule: Option<String>,
        /// table for people, json for scripts
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: RolloutOutput,
    },
    /// End a manual pause, or resume a halted rollout
    Promote {
        /// The rule
        rule: String,
    },
    /// Send every parent back to the previous version; the new one is marked failed
    Abort {
        /// The rule
        rule: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RolloutOutput {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GraphOutput {
    Dot,
    Mermaid,
}

#[cfg(test)]
mod tests;
