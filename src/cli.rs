//! Command-line parsing and the offline commands. `main.rs` only dispatches.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::crd::offline::OfflineCrds;
use crate::kinds::{self, Gvk};
use crate::plan::{self, Input, LABEL_CHILD, LABEL_RULE, ObjectKey, Observed};
use crate::render::Limits;
use crate::rules::model::Scope;
use crate::rules::{CompiledRule, Diagnostic, RuleSet, Severity};
use crate::yaml;

/// `eprintln!` that never panics: a closed stderr (`2>&1 | head`) is no
/// reason to crash with a panic message.
macro_rules! stderr {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

#[derive(Debug, Parser)]
#[command(
    name = "trellis",
    version,
    about = "A Kubernetes operator programmed with YAML rules",
    long_about = "trellis keeps child objects in existence for every object of a parent kind, \
                  as declared by rule files (trellis.dev/v1alpha1 Rule), and writes the children's \
                  state back into the parent's status."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RenderLimits {
    /// minijinja fuel per render (roughly: instructions executed)
    #[arg(long, default_value_t = Limits::default().fuel, env = "TRELLIS_RENDER_FUEL")]
    pub render_fuel: u64,
    /// Deepest nesting a render may reach
    #[arg(long, default_value_t = Limits::default().recursion, env = "TRELLIS_RENDER_RECURSION")]
    pub render_recursion: usize,
    /// Most bytes one template may produce
    #[arg(long, default_value_t = Limits::default().max_bytes, env = "TRELLIS_RENDER_MAX_BYTES")]
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

/// `trellis run --leader-elect` and its timings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Leader election")]
pub struct LeaderElection {
    /// Run as one of several replicas: only the holder of a coordination.k8s.io Lease writes;
    /// the others keep warm caches, write nothing, and take over when the leader goes
    /// (SIGTERM releases the Lease, so a successor takes over at once)
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
}

impl LeaderElection {
    /// The election's settings; `None` without `--leader-elect`; an error
    /// naming the flag when a value cannot work.
    pub fn settings(&self) -> Result<Option<crate::operator::leader::Settings>, String> {
        use crate::operator::leader;
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
            ..leader::Settings::new(
                &self.leader_elect_lease_name,
                &namespace,
                &leader::identity(),
            )
        };
        settings.validate()?;
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

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Output {
    Yaml,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The operator: reconcile every rule's kind on the cluster (KUBECONFIG or in-cluster)
    Run {
        /// Rules directory (repeatable)
        #[arg(
            long = "rules",
            required = true,
            value_name = "DIR",
            env = "TRELLIS_RULES",
            value_delimiter = ','
        )]
        rules: Vec<PathBuf>,
        /// Watch only this namespace (repeatable; default: all namespaces)
        #[arg(
            long = "namespace",
            short = 'n',
            value_name = "NS",
            env = "TRELLIS_NAMESPACES",
            value_delimiter = ','
        )]
        namespaces: Vec<String>,
        /// Most reconciles in flight at once, across all rules
        #[arg(long, default_value_t = 32, env = "TRELLIS_CONCURRENCY")]
        concurrency: usize,
        /// Log format
        #[arg(long, value_enum, default_value = "text", env = "TRELLIS_LOG_FORMAT")]
        log_format: LogFormat,
        /// Address of /metrics, /healthz, /readyz and /status ("off" to disable)
        #[arg(long, default_value = "0.0.0.0:8080", value_parser = parse_listen_addr, env = "TRELLIS_METRICS_ADDR")]
        metrics_addr: ListenAddr,
        /// Re-read the rules at least this often, events or not
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, env = "TRELLIS_RELOAD_POLL")]
        reload_poll: std::time::Duration,
        /// Apply the CRDs generated from rules with `crd:` (server-side apply,
        /// at start and on every reload; never deleted)
        #[arg(long, env = "TRELLIS_MANAGE_CRDS")]
        manage_crds: bool,
        #[command(flatten)]
        limits: RenderLimits,
        #[command(flatten)]
        leader: LeaderElection,
    },
    /// Lint a rule set; exit 1 with file:line messages on any error
    Check {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// CRD manifests (a file or a directory): warn about status fields they would drop
        #[arg(long, value_name = "PATH")]
        crds: Option<PathBuf>,
        #[command(flatten)]
        limits: RenderLimits,
    },
    /// Offline: what one reconcile pass would do for PARENT (no cluster needed)
    Render {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// The parent object (YAML)
        parent: PathBuf,
        /// Live children (YAML stream), matched by kind and name
        #[arg(long)]
        observed: Option<PathBuf>,
        /// CRD manifests (a file or a directory): the parent's scope and schema come from them
        #[arg(long, value_name = "PATH")]
        crds: Option<PathBuf>,
        /// Output format
        #[arg(short = 'o', long, value_enum, default_value = "yaml")]
        output: Output,
        /// Timestamp for new condition transitions (default: now)
        #[arg(long, value_name = "RFC3339")]
        now: Option<String>,
        #[command(flatten)]
        limits: RenderLimits,
    },
    /// Print the least-privilege ClusterRole the rule set needs
    Rbac {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// Name of the ClusterRole
        #[arg(long, default_value = "trellis")]
        name: String,
        /// Also grant what `trellis run --manage-crds` needs (create and patch
        /// on the generated CRDs, by name)
        #[arg(long)]
        manage_crds: bool,
    },
    /// Print the JSON Schema of the rule format
    Schema,
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
        /// Only this rule
        rule: Option<String>,
        /// Output format
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
    /// held back, and changes to the parent's status. Run it with the edited
    /// rules before shipping them (the operator can keep running).
    ///
    /// Exit code: 0 nothing would change, 1 something would, 2 a pass would
    /// fail or the cluster could not be asked. Needs get/list on the parent,
    /// child and related kinds, and patch (dry-run) on children and the
    /// parent's status.
    Diff {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
        /// A manifest naming the parent (apiVersion, kind, metadata.namespace
        /// and name); the live object of that name is diffed
        #[arg(
            required_unless_present = "all",
            conflicts_with = "all",
            value_name = "PARENT.yaml"
        )]
        parent: Option<PathBuf>,
        /// Every parent of every rule
        #[arg(long)]
        all: bool,
        /// With --all: only parents in this namespace
        #[arg(short = 'n', long, requires = "all", value_name = "NS")]
        namespace: Option<String>,
        /// With --all: only this rule's parents
        #[arg(long, requires = "all", value_name = "RULE")]
        rule: Option<String>,
        #[command(flatten)]
        limits: RenderLimits,
    },
    /// Print the CustomResourceDefinitions of the rules that set `crd:`
    Crd {
        /// Rules directory (repeatable)
        #[arg(long = "rules", required = true, value_name = "DIR")]
        rules: Vec<PathBuf>,
    },
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

pub fn check(dirs: &[PathBuf], limits: Limits, crds_path: Option<&Path>) -> ExitCode {
    let crds = match load_crds(crds_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // The parent kind's CRD settles the scope questions the rules leave open.
    let settle = |set: &mut RuleSet| {
        let Some(crds) = &crds else {
            return Vec::new();
        };
        let mut errors = Vec::new();
        for rule in &set.rules {
            if let Some((crd, _)) = crds.find(&rule.parent) {
                let scope = crate::crd::offline::scope_of(crd);
                errors.extend(crate::rules::scope::settle(rule, scope, &mut set.warnings));
            }
        }
        errors
    };
    match load_settled(dirs, limits, settle) {
        Ok(set) => {
            let dropped = crds.as_ref().map_or(0, |c| warn_dropped(&set, c));
            let warnings = set.warnings.len() + dropped;
            stderr!(
                "{} rule(s) OK{}",
                set.rules.len(),
                if warnings > 0 {
                    format!(", {warnings} warning(s)")
                } else {
                    String::new()
                }
            );
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn read_yaml_stream(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    yaml::parse_documents(&text, &yaml::Limits::FILES)
        .map(|docs| docs.into_iter().map(|d| d.value).collect())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The rule for a parent object: same apiVersion/kind, and its namespaces and
/// selector (if any) match.
pub fn rule_for<'a>(set: &'a RuleSet, parent: &Value) -> Result<&'a CompiledRule, String> {
    let api_version = parent
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = parent
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let gvk = Gvk::new(api_version, kind);
    let candidates: Vec<&CompiledRule> = set
        .for_parent(&gvk)
        .map(|r| r.as_ref())
        .filter(|r| crate::plan::parent_matches(r, parent))
        .collect();
    match candidates.as_slice() {
        [] => Err(format!("no rule matches a parent of kind {gvk}")),
        [one] => Ok(one),
        many => Err(format!(
            "several rules match a parent of kind {gvk}: {}",
            many.iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Scope of a kind offline: for the parent kind, the rule's
/// `spec.parent.scope`, else its generated CRD's (`crd:`); else the built-in
/// table (children may override it per child).
pub fn offline_scope(rule: &CompiledRule) -> impl Fn(&Gvk) -> Scope + '_ {
    let hint = rule.rule.spec.parent.scope.or_else(|| {
        rule.rule
            .spec
            .crd
            .as_ref()
            .map(|_| crate::crd::scope(&rule.rule))
    });
    offline_scope_with(rule, hint)
}

/// Like [`offline_scope`], with the parent kind's scope given.
pub fn offline_scope_with(rule: &CompiledRule, hint: Option<Scope>) -> impl Fn(&Gvk) -> Scope + '_ {
    move |gvk: &Gvk| match hint {
        Some(scope) if gvk.group == rule.parent.group && gvk.kind == rule.parent.kind => scope,
        _ => kinds::scope(gvk),
    }
}

/// Gives unlabelled observed objects the labels trellis would have put on
/// them, by matching kind and name against a render. Hand-written
/// `--observed` files can then omit the labels.
///
/// A child held back by `dependsOn` is only rendered once its dependencies
/// are found ready, so this labels, renders again and labels again until a
/// pass labels nothing new (each pass that does adds at least one child id).
fn label_observed(
    rule: &CompiledRule,
    parent: &Value,
    mut observed: Vec<Value>,
    now: &str,
    scope_of: &dyn Fn(&Gvk) -> Scope,
) -> Observed {
    let uid = parent
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or(plan::PLACEHOLDER_UID)
        .to_owned();
    for _ in 0..=rule.children.len() {
        let labelled = Observed::from_objects(observed.iter().cloned());
        let trial = plan::plan(
            rule,
            &Input {
                parent,
                observed: &labelled,
                now,
                scope_of,
            },
        );
        let mut changed = false;
        for obj in &mut observed {
            let has_label = obj
                .pointer("/metadata/labels")
                .and_then(|l| l.get(LABEL_CHILD))
                .is_some();
            if has_label {
                continue;
            }
            let Some(key) = ObjectKey::of(obj) else {
                continue;
            };
            // The namespace counts when the file gives one: a related
            // object (config-propagation's source ConfigMap) shares its
            // copies' kind and name, and is not one of them.
            let Some(apply) = trial.apply.iter().find(|a| {
                a.key.group == key.group
                    && a.key.kind == key.kind
                    && a.key.name == key.name
                    && (key.namespace.is_none() || key.namespace == a.key.namespace)
            }) else {
                continue;
            };
            let meta = &mut obj["metadata"];
            if meta.get("namespace").is_none()
                && let Some(ns) = &apply.key.namespace
            {
                meta["namespace"] = json!(ns);
            }
            let labels = &mut meta["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            labels[LABEL_RULE] = json!(rule.name);
            labels[LABEL_CHILD] = json!(apply.id);
            labels[plan::LABEL_PARENT_UID] = json!(uid);
            changed = true;
        }
        if !changed {
            break;
        }
    }
    Observed::from_objects(observed)
}

/// The document `trellis render` prints.
pub fn render_document(
    rule: &CompiledRule,
    parent: &Value,
    observed: Vec<Value>,
    now: &str,
) -> Value {
    render_document_with(rule, parent, observed, now, None)
}

/// [`render_document`], with CRD manifests (`--crds`): the parent's scope
/// comes from its CRD, and its spec is checked against the CRD's schema.
pub fn render_document_with(
    rule: &CompiledRule,
    parent: &Value,
    observed: Vec<Value>,
    now: &str,
    crds: Option<&OfflineCrds>,
) -> Value {
    let scope_of = offline_scope_with(rule, crate::crd::offline::parent_scope(rule, parent, crds));
    let observed = label_observed(rule, parent, observed, now, &scope_of);
    let plan = plan::plan(
        rule,
        &Input {
            parent,
            observed: &observed,
            now,
            scope_of: &scope_of,
        },
    );
    // `createOnly` children that exist are never sent again: show them apart.
    let (kept, applied): (Vec<_>, Vec<_>) = plan.apply.iter().partition(|a| {
        a.policy == crate::rules::model::Policy::CreateOnly && observed.objects.contains_key(&a.key)
    });
    let mut doc = json!({
        "children": applied.iter().map(|a| a.object.clone()).collect::<Vec<_>>(),
        "status": plan.status,
        "pending": plan.pending,
        "rule": rule.name,
    });
    if !kept.is_empty() {
        doc["unchanged"] = json!(kept.iter().map(|a| a.key.to_string()).collect::<Vec<_>>());
    }
    if !plan.delete.is_empty() {
        doc["delete"] = json!(
            plan.delete
                .iter()
                .map(|d| d.key.to_string())
                .collect::<Vec<_>>()
        );
    }
    let mut errors = plan.errors.clone();
    if let Some((_, version)) = crds.and_then(|c| c.find(&rule.parent)) {
        errors.extend(crate::crd::offline::validate_parent(version, parent));
    }
    if !errors.is_empty() {
        doc["errors"] = json!(errors);
    }
    doc
}

/// Reads `--crds`, or says why not.
fn load_crds(path: Option<&Path>) -> Result<Option<OfflineCrds>, ExitCode> {
    path.map(OfflineCrds::load).transpose().map_err(|e| {
        eprintln!("error: --crds: {e}");
        ExitCode::from(1)
    })
}

/// Warns about status fields the given CRDs would drop.
fn warn_dropped(set: &RuleSet, crds: &OfflineCrds) -> usize {
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

#[allow(clippy::too_many_arguments)]
pub fn render(
    dirs: &[PathBuf],
    parent_path: &Path,
    observed_path: Option<&Path>,
    output: Output,
    now: Option<String>,
    limits: Limits,
    crds_path: Option<&Path>,
) -> ExitCode {
    let set = match load(dirs, limits) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let crds = match load_crds(crds_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(c) = &crds {
        warn_dropped(&set, c);
    }
    let parents = match read_yaml_stream(parent_path) {
        Ok(p) => p,
        Err(e) => {
            stderr!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let [parent] = parents.as_slice() else {
        stderr!(
            "error: {}: expected exactly one parent object, found {}",
            parent_path.display(),
            parents.len()
        );
        return ExitCode::from(1);
    };
    let observed = match observed_path.map(read_yaml_stream).transpose() {
        Ok(o) => o.unwrap_or_default(),
        Err(e) => {
            stderr!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let rule = match rule_for(&set, parent) {
        Ok(rule) => rule,
        Err(e) => {
            stderr!("error: {}: {e}", parent_path.display());
            return ExitCode::from(1);
        }
    };
    if parent.pointer("/metadata/uid").is_none() {
        stderr!(
            "note: {} has no metadata.uid; using {} in labels and ownerReferences",
            parent_path.display(),
            plan::PLACEHOLDER_UID
        );
    }
    let now = now.unwrap_or_else(crate::clock::now_rfc3339);
    let doc = render_document_with(rule, parent, observed, &now, crds.as_ref());
    let text = match output {
        Output::Json => serde_json::to_string_pretty(&doc).map_err(|e| e.to_string()),
        Output::Yaml => yaml::to_string(&doc),
    };
    match text {
        Ok(text) => {
            if let Err(code) = print_out(&format!("{}\n", text.trim_end())) {
                return code;
            }
            if doc.get("errors").is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            stderr!("error: cannot print the result: {e}");
            ExitCode::from(1)
        }
    }
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

pub fn schema() -> ExitCode {
    match serde_json::to_string_pretty(&crate::rules::model::json_schema()) {
        Ok(text) => print_out(&format!("{text}\n"))
            .err()
            .unwrap_or(ExitCode::SUCCESS),
        Err(e) => {
            stderr!("error: {e}");
            ExitCode::from(1)
        }
    }
}

pub fn rbac(dirs: &[PathBuf], name: &str, manage_crds: bool) -> ExitCode {
    let set = match load(dirs, Limits::default()) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let role = crate::rbac::cluster_role_with(&set, name, manage_crds);
    match yaml::to_string(&role) {
        Ok(text) => print_out(&format!("{}\n", text.trim_end()))
            .err()
            .unwrap_or(ExitCode::SUCCESS),
        Err(e) => {
            stderr!("error: {e}");
            ExitCode::from(1)
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GraphOutput {
    Dot,
    Mermaid,
}

pub fn graph(dirs: &[PathBuf], rule: Option<&str>, output: GraphOutput) -> ExitCode {
    let set = match load(dirs, Limits::default()) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let graphs: Vec<crate::graph::Graph> = set
        .rules
        .iter()
        .filter(|r| rule.is_none_or(|name| r.name == name))
        .map(|r| crate::graph::Graph::of(r))
        .collect();
    if let (Some(name), true) = (rule, graphs.is_empty()) {
        eprintln!(
            "error: no rule named `{name}` (rules: {})",
            set.rules
                .iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return ExitCode::from(1);
    }
    print!(
        "{}",
        match output {
            GraphOutput::Dot => crate::graph::to_dot(&graphs),
            GraphOutput::Mermaid => crate::graph::to_mermaid(&graphs),
        }
    );
    ExitCode::SUCCESS
}

/// `trellis diff` (a PARENT.yaml, or `--all` narrowed by `namespace` and
/// `rule`): exit 0 nothing would change, 1 something would, 2 error.
pub fn diff(
    dirs: &[PathBuf],
    parent_path: Option<&Path>,
    namespace: Option<String>,
    rule: Option<String>,
    limits: Limits,
) -> ExitCode {
    let error = ExitCode::from(2);
    let Ok(set) = load(dirs, limits) else {
        return error;
    };
    let manifest = match parent_path.map(read_yaml_stream).transpose() {
        Ok(None) => None,
        Ok(Some(docs)) => match <[Value; 1]>::try_from(docs) {
            Ok([doc]) => Some(doc),
            Err(docs) => {
                stderr!(
                    "error: the parent file holds {} documents, not one",
                    docs.len()
                );
                return error;
            }
        },
        Err(e) => {
            stderr!("error: {e}");
            return error;
        }
    };
    let target = match &manifest {
        Some(doc) => crate::diff::live::Target::Parent(doc),
        None => crate::diff::live::Target::All { namespace, rule },
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            stderr!("error: cannot start the async runtime: {e}");
            return error;
        }
    };
    let report = runtime.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| {
            format!("cannot build a Kubernetes client (KUBECONFIG or in-cluster config): {e}")
        })?;
        crate::diff::live::diff(&client, &set, &target).await
    });
    match report {
        Ok(report) => {
            for note in &report.notes {
                stderr!("note: {note}");
            }
            if print_out(&crate::diff::print(&report.diffs)).is_err() {
                return error;
            }
            ExitCode::from(crate::diff::exit_code(&report.diffs))
        }
        Err(e) => {
            stderr!("error: {e}");
            error
        }
    }
}

/// The YAML stream `trellis crd` prints: one document per rule with `crd:`,
/// in rule-name order.
pub fn crd_documents(set: &RuleSet) -> Result<String, String> {
    let mut out = String::new();
    for crd in set.rules.iter().filter_map(|r| r.crd.as_ref()) {
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&yaml::to_string(crd)?);
    }
    Ok(out)
}

pub fn crd(dirs: &[PathBuf]) -> ExitCode {
    let set = match load(dirs, Limits::default()) {
        Ok(set) => set,
        Err(code) => return code,
    };
    if !set.rules.iter().any(|r| r.crd.is_some()) {
        stderr!("note: no rule sets `crd:`; nothing to print");
        return ExitCode::SUCCESS;
    }
    match crd_documents(&set) {
        Ok(text) => print_out(&text).err().unwrap_or(ExitCode::SUCCESS),
        Err(e) => {
            stderr!("error: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod leader_flags {
    use clap::Parser;

    use super::{Cli, Command};

    fn settings(args: &[&str]) -> Result<Option<crate::operator::leader::Settings>, String> {
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::render_document;
    use crate::rules::CompiledRule;

    const NOW: &str = "2026-11-29T00:00:00Z";

    fn rule(spec: &str) -> Arc<CompiledRule> {
        crate::rules::testing::rule_with_spec(spec)
    }

    /// ConfigMaps `a-one` ← `a-two` ← `a-three`, each behind the one before.
    const CHAIN: &str = "  children:
    - id: one
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-one' }}}
    - id: two
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [one]
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-two' }}}
    - id: three
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [two]
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-three' }}}
";

    fn parent(namespace: Option<&str>) -> Value {
        let mut p = json!({
            "apiVersion": "demo.trellis.dev/v1",
            "kind": "App",
            "metadata": {"name": "a", "uid": "uid-1", "generation": 1},
        });
        if let Some(ns) = namespace {
            p["metadata"]["namespace"] = json!(ns);
        }
        p
    }

    fn unlabelled(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    }

    fn ready(doc: &Value) -> &Value {
        doc["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()
    }

    #[test]
    fn observed_children_behind_depends_on_are_matched() {
        let r = rule(&format!(
            "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n{CHAIN}"
        ));
        let observed = vec![
            unlabelled("a-three"),
            unlabelled("a-two"),
            unlabelled("a-one"),
        ];
        let doc = render_document(&r, &parent(Some("ns")), observed, NOW);
        assert_eq!(doc["pending"], json!([]), "{doc:#}");
        assert!(doc.get("errors").is_none(), "{doc:#}");
        assert_eq!(doc["children"].as_array().unwrap().len(), 3, "{doc:#}");
        assert_eq!(ready(&doc)["status"], "True", "{doc:#}");
    }

    /// A copy per item into namespace `item`, of the source `src/cfg`.
    const COPIES: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App, scope: Cluster}
  related:
    - id: source
      apiVersion: v1
      kind: ConfigMap
      namespace: src
      name: cfg
  children:
    - id: copy
      apiVersion: v1
      kind: ConfigMap
      forEach: \"['team-a', 'team-b']\"
      template: |
        metadata: {name: cfg, namespace: {{ item }}}
        data: {{ related.source.data }}
  status:
    fields:
      - path: copies
        value: \"children.copy | default([]) | length\"
";

    #[test]
    fn an_observed_related_object_named_like_a_child_elsewhere_is_not_that_child() {
        let r = rule(COPIES);
        let object = |ns: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cfg", "namespace": ns}, "data": {"k": "v"}})
        };
        let doc = render_document(&r, &parent(None), vec![object("src")], NOW);
        assert!(doc.get("errors").is_none(), "{doc:#}");
        assert_eq!(doc["status"]["copies"], 0, "no copy exists yet: {doc:#}");
        assert!(
            doc.get("delete").is_none(),
            "the source is never pruned: {doc:#}"
        );
        assert_eq!(doc["children"].as_array().map(Vec::len), Some(2));
        let doc = render_document(
            &r,
            &parent(None),
            vec![object("src"), object("team-a")],
            NOW,
        );
        assert_eq!(doc["status"]["copies"], 1, "{doc:#}");
        assert!(doc.get("delete").is_none(), "{doc:#}");
    }

    #[test]
    fn parent_scope_comes_from_the_rule_offline() {
        let cluster = rule(&format!(
            "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App, scope: Cluster}}\n{}",
            CHAIN.replace("{name: {{", "{namespace: team, name: {{")
        ));
        let doc = render_document(&cluster, &parent(None), vec![], NOW);
        assert!(doc.get("errors").is_none(), "{doc:#}");
        assert_eq!(doc["children"][0]["metadata"]["namespace"], "team");
        let doc = render_document(&cluster, &parent(Some("ns")), vec![], NOW);
        assert_eq!(
            doc["errors"],
            json!(["App ns/a: cluster-scoped parent must not have metadata.namespace"])
        );

        // Without a hint, a CRD parent written without a namespace is
        // cluster-scoped (so its namespaced children must name one)...
        let unhinted = rule(&format!(
            "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n{CHAIN}"
        ));
        let doc = render_document(&unhinted, &parent(None), vec![], NOW);
        assert_eq!(
            doc["errors"],
            json!(["template of child \"one\": the parent is cluster-scoped: \
                 a namespaced child must set metadata.namespace"])
        );
        // ...and one with a namespace is namespaced.
        let doc = render_document(&unhinted, &parent(Some("ns")), vec![], NOW);
        assert!(doc.get("errors").is_none(), "{doc:#}");
        assert_eq!(doc["children"][0]["metadata"]["namespace"], "ns");

        // A rule's `crd:` block is its parent's CRD: namespaced by default.
        let with_crd = rule(&format!(
            "  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n  crd: {{}}\n{CHAIN}"
        ));
        let doc = render_document(&with_crd, &parent(None), vec![], NOW);
        assert_eq!(
            doc["errors"],
            json!([
                "App a: the parent has no metadata.namespace (App is namespaced; \
                 if it is not, set spec.parent.scope: Cluster in the rule)"
            ])
        );
        assert_eq!(doc["children"], json!([]));
    }
}
