//! `trellis tree`: one live parent and everything its rule keeps for it,
//! nested by dependency (the core's [`crate::offline::tree`] builds and
//! prints it). This side reads: the parent (GET), then the pass exactly as
//! `trellis diff` plans it ([`crate::diff::live::plan_live`]: discovery,
//! the children by label, the related objects and patch targets the pass
//! reads, the version a staged rollout runs). Nothing is written.
//!
//! `--watch` keeps a watch on the parent, on its children (by label), and
//! on every object the pass read, and prints the tree again whenever what
//! it shows changes.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

use super::{load, print_out};
use crate::diff::live::{Kinds, LiveError, Planned, Spokes, plan_live, to_value, versions_of};
use crate::kinds::Gvk;
use crate::offline::tree::{self, Tree, target};
use crate::plan::{LABEL_PARENT_UID, LABEL_RULE, RelatedTarget};
use crate::rules::{CompiledRule, RuleSet};

/// `trellis tree -o`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TreeOutput {
    Text,
    Json,
}

/// Against the live cluster (KUBECONFIG or in-cluster): one parent and
/// everything its rule keeps for it, nested by dependency
///
/// The parent's conditions, then one row per related entry, child object
/// and patch target, in dependency order, nested under what it depends
/// on: id, kind, namespace/name, READY, SYNCED (the live object holds
/// this pass's rendering) and why one is held back, not ready, missing,
/// excluded (includeWhen false) or failed. Planned as `trellis diff`
/// plans it; nothing is written. KIND: the kind, its plural or a short
/// name, any case, optionally `.group` (webapp/shop, deployments.apps/api).
///
/// Exit code: 0 the parent is Ready (a built-in kind, which gets no
/// status: its own conditions and every included entry ready), 1 it is
/// not, 2 an error (no rule for the kind, no such parent). Needs
/// get/list/watch on the rule's kinds: `trellis rbac --viewer`.
#[derive(Debug, clap::Args)]
pub struct TreeArgs {
    /// Rules directory (repeatable)
    #[arg(long = "rules", required = true, value_name = "DIR")]
    pub rules: Vec<std::path::PathBuf>,
    /// The parent: KIND/NAME, e.g. webapp/shop
    #[arg(value_name = "KIND/NAME")]
    pub target: String,
    /// The parent's namespace [default: the kubeconfig context's namespace; ignored for a
    /// cluster-scoped kind]
    #[arg(short = 'n', long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Output format: text (a table, nested) or json (`{ready, trees}`; under --watch, one
    /// document per line)
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: TreeOutput,
    /// Keep watching the parent, its children and what its rule reads, and print the tree
    /// again on every change, until interrupted [default: off]
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Where the revision ConfigMaps of staged rollouts and the cluster Secrets of spokes
    /// live: a parent is shown under the version it is due to run, its children in spokes
    /// read there [default: as `trellis run` resolves it]
    #[arg(long, value_name = "NS", env = "TRELLIS_OPERATOR_NAMESPACE")]
    pub operator_namespace: Option<String>,
    #[command(flatten)]
    pub limits: super::RenderLimits,
}

const ERROR: u8 = 2;

/// Why `trellis tree` shows nothing (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error(transparent)]
    Target(#[from] target::TargetError),
    #[error(transparent)]
    Live(#[from] LiveError),
    #[error("{0} does not exist")]
    ParentMissing(String),
    /// Every rule of the kind leaves the parent out (selector, namespaces).
    #[error("{parent}: {why}")]
    NotSelected { parent: String, why: String },
}

/// `trellis tree`: exit 0 when the parent is Ready, 1 when it is not, 2 on
/// an error (no rule for the kind, no such parent, the cluster not
/// answering). With `--watch`, runs until interrupted.
pub fn tree(request: TreeArgs) -> ExitCode {
    let Ok(set) = load(&request.rules, request.limits.limits()) else {
        return ExitCode::from(ERROR);
    };
    let result = super::with_cluster(|client| async move {
        let viewer = Viewer::new(&client, &set, &request).await?;
        let seen = viewer.look(&client).await?;
        let code = match show(&seen, request.output, false) {
            Ok(()) => exit_code(&seen.trees),
            Err(code) => return Ok::<_, TreeError>(code),
        };
        if !request.watch {
            return Ok(code);
        }
        Ok(viewer.watch(&client, seen, request.output).await)
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            stderr!("error: {e}");
            ExitCode::from(ERROR)
        }
    }
}

fn exit_code(trees: &[Tree]) -> ExitCode {
    ExitCode::from(if trees.iter().all(Tree::ready) { 0 } else { 1 })
}

/// The parent named on the command line and the rules that serve it.
struct Viewer {
    /// The rules of the parent's kind, each with the kinds it touches.
    rules: Vec<(Arc<CompiledRule>, Kinds)>,
    gvk: Gvk,
    /// The parent's kind and every kind its rules touch.
    kinds: Kinds,
    name: String,
    /// `None` for a cluster-scoped kind.
    namespace: Option<String>,
    operator_namespace: String,
    /// The spokes the rules place children in (or read from), through
    /// the cluster Secrets in the operator's namespace.
    spokes: Spokes,
}

/// One look at the cluster: the trees, and what to watch for the next.
struct Seen {
    trees: Vec<Tree>,
    watches: Vec<WatchSpec>,
}

/// One watch `--watch` keeps: a kind, where, and which objects.
#[derive(Debug, Clone, PartialEq)]
struct WatchSpec {
    group: String,
    kind: String,
    namespace: Option<String>,
    labels: Option<String>,
    fields: Option<String>,
}

impl Viewer {
    async fn new(client: &Client, set: &RuleSet, request: &TreeArgs) -> Result<Viewer, TreeError> {
        let (gvk, rules, name) = target::resolve(set, &request.target)?;
        // Each rule's kinds (resolved once), and every kind any of them
        // touches, for the watches.
        let mut resolved = Vec::new();
        let mut kinds: Option<Kinds> = None;
        for rule in rules {
            let own = Kinds::of(client, rule).await?;
            let all = kinds.get_or_insert_with(|| Kinds {
                parent: own.parent.clone(),
                others: Vec::new(),
                unserved: Vec::new(),
            });
            for kind in &own.others {
                if all.find(&kind.gvk.group, &kind.gvk.kind).is_none() {
                    all.others.push(kind.clone());
                }
            }
            resolved.push((rule.clone(), own));
        }
        // `resolve` names at least one rule; none would be no rule at all.
        let kinds = kinds.ok_or_else(|| target::TargetError::NoRule {
            kind: request.target.clone(),
            known: String::new(),
        })?;
        let namespace = kinds.parent.namespaced.then(|| {
            request
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned())
        });
        let operator_namespace =
            crate::operator::home::operator_namespace(request.operator_namespace.as_deref());
        let spokes = Spokes::read(
            client,
            &operator_namespace,
            resolved.iter().map(|(r, _)| r.as_ref()),
        )
        .await;
        Ok(Viewer {
            rules: resolved,
            gvk,
            kinds,
            name,
            namespace,
            operator_namespace,
            spokes,
        })
    }

    fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.gvk.kind, self.name),
            None => format!("{} {}", self.gvk.kind, self.name),
        }
    }

    /// Reads the parent and plans each of its rules' passes.
    async fn look(&self, client: &Client) -> Result<Seen, TreeError> {
        let api: Api<DynamicObject> = self
            .kinds
            .parent
            .api(client.clone(), self.namespace.as_deref());
        let parent = api
            .get_opt(&self.name)
            .await
            .map_err(|source| LiveError::Api {
                what: self.describe(),
                source,
            })?
            .ok_or_else(|| TreeError::ParentMissing(self.describe()))?;
        let parent = to_value(parent, &self.kinds.parent);
        let serving: Vec<&(Arc<CompiledRule>, Kinds)> = self
            .rules
            .iter()
            .filter(|(r, _)| crate::plan::parent_matches(r, &parent))
            .collect();
        if serving.is_empty() {
            let why: Vec<String> = self
                .rules
                .iter()
                .filter_map(|(r, _)| {
                    crate::plan::why_not_selected(r, &parent)
                        .map(|why| format!("rule {} does not select it: {why}", r.name))
                })
                .collect();
            return Err(TreeError::NotSelected {
                parent: self.describe(),
                why: why.join("; "),
            });
        }
        let mut seen = Seen {
            trees: Vec::new(),
            watches: vec![WatchSpec {
                group: self.gvk.group.clone(),
                kind: self.gvk.kind.clone(),
                namespace: self.namespace.clone(),
                labels: None,
                fields: Some(format!("metadata.name={}", self.name)),
            }],
        };
        let uid = parent
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for (rule, kinds) in serving {
            let mut notes = Vec::new();
            let versions = versions_of(client, &self.operator_namespace, rule, &mut notes).await;
            for note in notes {
                stderr!("note: {note}");
            }
            let planned = plan_live(
                client,
                rule,
                versions.as_ref(),
                kinds,
                &parent,
                &self.spokes,
            )
            .await?;
            let tree = match planned {
                Planned::Skipped(why) => {
                    let none = crate::plan::Observed::default();
                    let plan = crate::plan::Plan::default();
                    tree::build(rule, &parent, &none, &plan, Some(why))
                }
                Planned::Pass {
                    rule,
                    observed,
                    plan,
                } => {
                    seen.watches.extend(watches_of(&rule, uid, &plan));
                    tree::build(&rule, &parent, &observed, &plan, None)
                }
            };
            seen.trees.push(tree);
        }
        Ok(seen)
    }

    /// `--watch`: prints the tree again whenever what it shows changes,
    /// until interrupted; a failed look is said and watched past.
    async fn watch(&self, client: &Client, mut seen: Seen, output: TreeOutput) -> ExitCode {
        let mut last = rendering(&seen.trees, output);
        let mut watches = seen.watches.clone();
        let mut events = self.events(client, &watches);
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return exit_code(&seen.trees),
                event = events.next() => if event.is_none() {
                    // Every watch ended (they retry by themselves): start again.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    events = self.events(client, &watches);
                    continue;
                },
            }
            // Let a burst of changes (an apply, then its status) settle.
            let settle = tokio::time::sleep(Duration::from_millis(300));
            tokio::pin!(settle);
            loop {
                tokio::select! {
                    _ = &mut settle => break,
                    _ = events.next() => {}
                }
            }
            match self.look(client).await {
                Ok(now) => {
                    let text = rendering(&now.trees, output);
                    if text != last {
                        if let Err(code) = show(&now, output, true) {
                            return code;
                        }
                        last = text;
                    }
                    if now.watches != watches {
                        watches = now.watches.clone();
                        events = self.events(client, &watches);
                    }
                    seen = now;
                }
                Err(e) => {
                    let text = format!("error: {e}");
                    if text != last {
                        stderr!("{text}");
                        last = text;
                    }
                }
            }
        }
    }

    /// One stream of "something changed" over every watch.
    fn events(&self, client: &Client, specs: &[WatchSpec]) -> BoxStream<'static, ()> {
        let mut streams = Vec::new();
        for spec in specs {
            let Some(kind) = self.kinds.find(&spec.group, &spec.kind) else {
                continue;
            };
            let api: Api<DynamicObject> = kind.api(client.clone(), spec.namespace.as_deref());
            let mut config = watcher::Config::default();
            if let Some(labels) = &spec.labels {
                config = config.labels(labels);
            }
            if let Some(fields) = &spec.fields {
                config = config.fields(fields);
            }
            // Only changes matter: the first list of each watch is what
            // was just shown.
            let changes = watcher(api, config)
                .default_backoff()
                .filter_map(|event| async move {
                    match event {
                        Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => Some(()),
                        _ => None,
                    }
                });
            streams.push(changes.boxed());
        }
        stream::select_all(streams).boxed()
    }
}

/// What to watch for the next change of one rule's tree: its children by
/// label, each object the pass read (related entries, patch targets).
fn watches_of(rule: &CompiledRule, uid: &str, plan: &crate::plan::Plan) -> Vec<WatchSpec> {
    let mut out: Vec<WatchSpec> = Vec::new();
    let selector = format!("{LABEL_RULE}={},{LABEL_PARENT_UID}={uid}", rule.name);
    for child in &rule.children {
        out.push(WatchSpec {
            group: child.gvk.group.clone(),
            kind: child.gvk.kind.clone(),
            namespace: None,
            labels: Some(selector.clone()),
            fields: None,
        });
    }
    for read in &plan.reads {
        let gvk = Gvk::new(&read.api_version, &read.kind);
        out.push(WatchSpec {
            group: gvk.group,
            kind: gvk.kind,
            namespace: read.namespace.clone(),
            labels: None,
            fields: match &read.target {
                RelatedTarget::Name(name) => Some(format!("metadata.name={name}")),
                RelatedTarget::Selector(_) => None,
            },
        });
    }
    let mut unique = Vec::new();
    for spec in out {
        if !unique.contains(&spec) {
            unique.push(spec);
        }
    }
    unique
}

/// The text or JSON of a look. JSON: one object `{ready, trees}` (one line
/// per look under `--watch`).
fn rendering(trees: &[Tree], output: TreeOutput) -> String {
    match output {
        TreeOutput::Text => tree::text::print(trees),
        TreeOutput::Json => format!("{}\n", tree::to_json(trees)),
    }
}

/// Prints a look; `again`: a redraw under `--watch` (a terminal is cleared
/// first, anything else gets a separating line).
fn show(seen: &Seen, output: TreeOutput, again: bool) -> Result<(), ExitCode> {
    use std::io::IsTerminal;
    let mut text = rendering(&seen.trees, output);
    if again && matches!(output, TreeOutput::Text) {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        text = if std::io::stdout().is_terminal() {
            format!("\x1b[H\x1b[2J{stamp}\n{text}")
        } else {
            format!("\n--- {stamp}\n{text}")
        };
    }
    print_out(&text)
}
