//! Related objects in a pass: which objects each `related:` entry names,
//! whether they are there and ready, and what the pass read (so the operator
//! can index related object → parents that read it).
//!
//! Everything is read from [`Observed`]: offline from `--observed`, live
//! from watch-backed caches. An entry that would read outside what the rule
//! allows fails the whole pass before anything is read or written.

use serde::Serialize;
use serde_json::{Map, Value};

use super::observed::strip_noise;
use super::*;
use crate::render::RenderError;
use crate::rules::model::{LabelSelector, LabelSelectorRequirement, SelectorOperator};
use crate::rules::{CompiledChild, CompiledRelated, Templated};
use crate::yaml;

/// Most objects one `selector:` entry may yield.
pub const MAX_RELATED_ITEMS: usize = 1_000;

/// What one related entry read in this pass: the operator watches and
/// indexes exactly this.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelatedRead {
    pub id: String,
    pub api_version: String,
    pub kind: String,
    /// `None`: cluster-scoped kind, or every namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub target: RelatedTarget,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RelatedTarget {
    Name(String),
    Selector(LabelSelector),
}

impl RelatedRead {
    /// Whether an object of this entry's kind is one this read covers
    /// (the same name, or labels matching the selector).
    pub fn covers(
        &self,
        namespace: Option<&str>,
        name: &str,
        labels: Option<&Map<String, Value>>,
    ) -> bool {
        self.covers_with(namespace, name, |k| {
            labels.and_then(|l| l.get(k)).and_then(Value::as_str)
        })
    }

    /// Whether `object` (at `key`, of kind `gvk`) is one this read covers.
    pub fn covers_object(&self, gvk: &Gvk, key: &ObjectKey, object: &Value) -> bool {
        key.group == gvk.group
            && key.kind == gvk.kind
            && self.covers(
                key.namespace.as_deref(),
                &key.name,
                object
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object),
            )
    }

    /// [`covers`](Self::covers), with labels read through `label` (so a
    /// cache's typed objects need no conversion to JSON first).
    pub fn covers_with<'a>(
        &self,
        namespace: Option<&str>,
        name: &str,
        label: impl Fn(&str) -> Option<&'a str>,
    ) -> bool {
        if self.namespace.is_some() && self.namespace.as_deref() != namespace {
            return false;
        }
        match &self.target {
            RelatedTarget::Name(n) => n == name,
            RelatedTarget::Selector(sel) => selector_matches_with(sel, label),
        }
    }
}

/// Why a related source could not answer a read: the entry's readers are
/// pending with `reason` (it is never taken for "does not exist").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// `RelatedKindNotServed`, `RelatedOutOfScope` or `RelatedUndecodable`.
    pub reason: &'static str,
    pub message: String,
}

impl Unreadable {
    pub const KIND_NOT_SERVED: &'static str = "RelatedKindNotServed";
    pub const OUT_OF_SCOPE: &'static str = "RelatedOutOfScope";
    pub const UNDECODABLE: &'static str = "RelatedUndecodable";
    /// A related entry placed in a spoke, which the operator does not
    /// read yet.
    pub const CLUSTER_NOT_READ: &'static str = "RelatedClusterNotRead";
}

/// How one entry came out.
#[derive(Debug, Clone)]
pub(super) enum RelatedState {
    Ready,
    /// Required and missing: holds back its readers.
    Missing(String),
    /// There, but its `readyWhen` is false, or failed (then also an error
    /// of the pass, in [`Resolved::errors`]).
    NotReady(String),
    /// Optional and missing: absent from the context; holds nothing back.
    Absent,
    /// The source could not tell: holds back its readers, optional or not
    /// (except an unserved kind, of which nothing exists).
    Unreadable(Unreadable),
}

/// Whether `labels` satisfy a label selector.
pub fn selector_matches(selector: &LabelSelector, labels: Option<&Map<String, Value>>) -> bool {
    selector_matches_with(selector, |k| {
        labels.and_then(|l| l.get(k)).and_then(Value::as_str)
    })
}

/// [`selector_matches`], with labels read through `label`.
pub fn selector_matches_with<'a>(
    selector: &LabelSelector,
    label: impl Fn(&str) -> Option<&'a str>,
) -> bool {
    selector
        .match_labels
        .iter()
        .all(|(k, v)| label(k) == Some(v.as_str()))
        && selector.match_expressions.iter().all(|req| {
            let value = label(&req.key);
            match req.operator {
                SelectorOperator::In => value.is_some_and(|v| req.values.iter().any(|x| x == v)),
                SelectorOperator::NotIn => value.is_none_or(|v| !req.values.iter().any(|x| x == v)),
                SelectorOperator::Exists => value.is_some(),
                SelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

/// Failure of one entry that stops the pass.
pub(super) struct RelatedFailure {
    pub reason: FailureReason,
    pub error: RenderError,
}

fn render_text(
    rule: &CompiledRule,
    id: &crate::render::TemplateId,
    ctx: &minijinja::Value,
    what: &str,
) -> Result<String, RelatedFailure> {
    rule.engine
        .render(id, ctx, what)
        .map(|s| s.trim().to_owned())
        .map_err(|error| RelatedFailure {
            reason: FailureReason::RenderError,
            error,
        })
}

fn render_yaml(
    rule: &CompiledRule,
    id: &crate::render::TemplateId,
    ctx: &minijinja::Value,
    what: &str,
) -> Result<Value, RelatedFailure> {
    let text = render_text(rule, id, ctx, what)?;
    let limits = yaml::Limits {
        max_bytes: rule.engine.limits().max_bytes,
        ..yaml::Limits::FILES
    };
    yaml::parse_value(&text, &limits).map_err(|e| RelatedFailure {
        reason: FailureReason::RenderError,
        error: RenderError {
            what: what.to_owned(),
            message: format!("rendered text is not valid YAML: {e}"),
        },
    })
}

fn resolve_selector(
    rule: &CompiledRule,
    entry: &CompiledRelated,
    ctx: &minijinja::Value,
) -> Result<LabelSelector, RelatedFailure> {
    let what = format!("selector of related \"{}\"", entry.spec.id);
    let fail = |message: String| RelatedFailure {
        reason: FailureReason::RenderError,
        error: RenderError {
            what: what.clone(),
            message,
        },
    };
    let mut out = LabelSelector::default();
    let Some(sel) = &entry.selector else {
        return Ok(out);
    };
    match &sel.match_labels {
        None => {}
        Some(Templated::Parts(parts)) => {
            for (k, t) in parts {
                out.match_labels
                    .insert(k.clone(), render_text(rule, t, ctx, &what)?);
            }
        }
        Some(Templated::Whole(t)) => {
            let value = render_yaml(rule, t, ctx, &what)?;
            out.match_labels = serde_json::from_value(value)
                .map_err(|e| fail(format!("matchLabels must be a map of strings: {e}")))?;
        }
    }
    match &sel.match_expressions {
        None => {}
        Some(Templated::Parts(parts)) => {
            for req in parts {
                let values = req
                    .values
                    .iter()
                    .map(|t| render_text(rule, t, ctx, &what))
                    .collect::<Result<Vec<_>, _>>()?;
                out.match_expressions.push(LabelSelectorRequirement {
                    key: req.key.clone(),
                    operator: req.operator,
                    values,
                });
            }
        }
        Some(Templated::Whole(t)) => {
            let value = render_yaml(rule, t, ctx, &what)?;
            out.match_expressions = serde_json::from_value(value).map_err(|e| {
                fail(format!(
                    "matchExpressions must be a list of {{key, operator, values}}: {e}"
                ))
            })?;
        }
    }
    Ok(out)
}

/// The namespace an entry reads in (`None`: cluster-scoped, or all), or why
/// it may not.
fn namespace_of(
    rule: &CompiledRule,
    entry: &CompiledRelated,
    ctx: &minijinja::Value,
    info: &ParentInfo,
    input: &Input,
) -> Result<Option<String>, RelatedFailure> {
    let id = &entry.spec.id;
    let what = format!("namespace of related \"{id}\"");
    let refuse = |reason: FailureReason, message: String| RelatedFailure {
        reason,
        error: RenderError {
            what: format!("related \"{id}\""),
            message,
        },
    };
    let scope = (input.scope_of)(&entry.gvk);
    let named = match &entry.namespace {
        Some(t) => Some(render_text(rule, t, ctx, &what)?).filter(|s| !s.is_empty()),
        None => None,
    };
    let hint = "set allowCrossNamespace: true on the related entry in the rule to allow it";
    match (scope, &info.namespace) {
        (Scope::Cluster, _) => match named {
            Some(ns) => Err(refuse(
                FailureReason::RenderError,
                format!(
                    "{} is cluster-scoped: it takes no namespace (got `{ns}`)",
                    entry.gvk.kind
                ),
            )),
            None => Ok(None),
        },
        (Scope::Namespaced, Some(parent_ns)) => {
            if entry.spec.all_namespaces {
                return if entry.spec.allow_cross_namespace {
                    Ok(None)
                } else {
                    Err(refuse(
                        FailureReason::CrossNamespaceRefused,
                        format!(
                            "reads every namespace, not only the parent's `{parent_ns}`; {hint}"
                        ),
                    ))
                };
            }
            match named {
                None => Ok(Some(parent_ns.clone())),
                Some(ns) if &ns == parent_ns => Ok(Some(ns)),
                Some(ns) if entry.spec.allow_cross_namespace => Ok(Some(ns)),
                Some(ns) => Err(refuse(
                    FailureReason::CrossNamespaceRefused,
                    format!("names namespace `{ns}`, not the parent's `{parent_ns}`; {hint}"),
                )),
            }
        }
        (Scope::Namespaced, None) => match named {
            Some(ns) => Ok(Some(ns)),
            None if entry.spec.all_namespaces => Ok(None),
            None => Err(refuse(
                FailureReason::RenderError,
                format!(
                    "the parent is cluster-scoped: a namespaced {} must name its namespace \
                     (or set allNamespaces: true on a selector entry)",
                    entry.gvk.kind
                ),
            )),
        },
    }
}

/// What the related entries came to in a pass.
pub(super) struct Resolved {
    /// `related` in the evaluation context.
    pub context: Value,
    /// Each entry's state, in the rule's order.
    pub states: Vec<RelatedState>,
    /// What was read.
    pub reads: Vec<RelatedRead>,
    /// Failed `readyWhen`s: errors of the pass, though it goes on (their
    /// readers are held back, as by an entry that is not ready).
    pub errors: Vec<RenderError>,
}

/// Resolves every related entry: the `related` context, each entry's state,
/// and what was read. A failure stops the pass.
pub(super) fn resolve(
    rule: &CompiledRule,
    ctx: &minijinja::Value,
    info: &ParentInfo,
    input: &Input,
) -> Result<Resolved, RelatedFailure> {
    let mut context = Map::new();
    let mut states = Vec::with_capacity(rule.related.len());
    let mut reads = Vec::with_capacity(rule.related.len());
    let mut errors = Vec::new();
    for entry in &rule.related {
        let id = &entry.spec.id;
        let cluster = related_cluster(rule, entry, ctx)?;
        // An unserved kind has no objects, and no known scope: nothing to
        // read, nothing to index (its CRD appearing restarts the rule).
        // What a spoke serves is the spoke's to say (its source's answer).
        if let Some(source) = &input.observed.related
            && cluster.is_none()
            && let Err(why) = source.served(&entry.gvk)
        {
            states.push(
                if entry.spec.optional && why.reason == Unreadable::KIND_NOT_SERVED {
                    RelatedState::Absent
                } else {
                    RelatedState::Unreadable(why)
                },
            );
            continue;
        }
        if let Some(why) = cluster_unreadable(input, cluster.as_deref()) {
            states.push(RelatedState::Unreadable(why));
            continue;
        }
        let namespace = namespace_of(rule, entry, ctx, info, input)?;
        let target = match &entry.name {
            Some(t) => {
                let name = render_text(rule, t, ctx, &format!("name of related \"{id}\""))?;
                if name.is_empty() {
                    return Err(RelatedFailure {
                        reason: FailureReason::RenderError,
                        error: RenderError {
                            what: format!("name of related \"{id}\""),
                            message: "renders an empty name".into(),
                        },
                    });
                }
                RelatedTarget::Name(name)
            }
            None => RelatedTarget::Selector(resolve_selector(rule, entry, ctx)?),
        };
        let read = RelatedRead {
            id: id.clone(),
            api_version: entry.gvk.api_version(),
            kind: entry.gvk.kind.clone(),
            namespace,
            target,
        };
        let found = match lookup(input, entry, &read, cluster) {
            Ok(found) => found,
            Err(why) => {
                states.push(RelatedState::Unreadable(why));
                reads.push(read);
                continue;
            }
        };
        let found: Option<Value> = match &read.target {
            RelatedTarget::Name(_) => found.into_iter().next().map(|(_, o)| o),
            RelatedTarget::Selector(_) => {
                let mut items = found;
                if items.len() > MAX_RELATED_ITEMS {
                    return Err(RelatedFailure {
                        reason: FailureReason::RenderError,
                        error: RenderError {
                            what: format!("related \"{id}\""),
                            message: format!(
                                "the selector matches {} objects, more than the limit of {MAX_RELATED_ITEMS}",
                                items.len()
                            ),
                        },
                    });
                }
                items.sort_by(|a, b| (&a.0.namespace, &a.0.name).cmp(&(&b.0.namespace, &b.0.name)));
                Some(Value::Array(items.into_iter().map(|(_, o)| o).collect()))
            }
        };
        let state = match found {
            None if entry.spec.optional => RelatedState::Absent,
            None => RelatedState::Missing(format!("{} does not exist", describe_read(&read))),
            Some(mut value) => {
                strip_noise(&mut value);
                if let Value::Array(items) = &mut value {
                    items.iter_mut().for_each(strip_noise);
                }
                let state = match entry.ready_when {
                    None => RelatedState::Ready,
                    Some(expr) => {
                        let what = format!("readyWhen of related \"{id}\"");
                        let self_ctx =
                            minijinja::context! { self => render::to_value(&value), ..ctx.clone() };
                        match rule.engine.eval_bool(expr, &self_ctx, &what) {
                            Ok(true) => RelatedState::Ready,
                            Ok(false) => RelatedState::NotReady(format!(
                                "{} is not ready: readyWhen `{}` is false",
                                describe_read(&read),
                                render::one_line(
                                    entry.spec.ready_when.as_deref().unwrap_or_default()
                                )
                            )),
                            Err(err) => {
                                let state = RelatedState::NotReady(err.to_string());
                                errors.push(err);
                                state
                            }
                        }
                    }
                };
                context.insert(id.clone(), value);
                state
            }
        };
        states.push(state);
        reads.push(read);
    }
    Ok(Resolved {
        context: Value::Object(context),
        states,
        reads,
        errors,
    })
}

/// The objects `read` covers: from the related source when there is one
/// (the operator's caches), else from the observed objects (offline).
fn lookup(
    input: &Input,
    entry: &CompiledRelated,
    read: &RelatedRead,
    cluster: Option<String>,
) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
    if let Some(source) = &input.observed.related {
        return match &cluster {
            Some(name) => source.find_in(name, &entry.gvk, read),
            None => source.find(&entry.gvk, read),
        };
    }
    Ok(match &read.target {
        RelatedTarget::Name(name) => {
            let key = ObjectKey {
                group: entry.gvk.group.clone(),
                kind: entry.gvk.kind.clone(),
                namespace: read.namespace.clone(),
                name: name.clone(),
                cluster,
            };
            input
                .observed
                .objects
                .get(&key)
                .map(|o| (key, o.clone()))
                .into_iter()
                .collect()
        }
        RelatedTarget::Selector(_) => input
            .observed
            .objects
            .iter()
            .filter(|(k, o)| {
                k.group == entry.gvk.group
                    && k.kind == entry.gvk.kind
                    && k.cluster == cluster
                    && read.covers(
                        k.namespace.as_deref(),
                        &k.name,
                        o.pointer("/metadata/labels").and_then(Value::as_object),
                    )
            })
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect(),
    })
}

/// The spoke a related entry reads from for this parent (`None`: the hub).
fn related_cluster(
    rule: &CompiledRule,
    entry: &CompiledRelated,
    ctx: &minijinja::Value,
) -> Result<Option<String>, RelatedFailure> {
    let Some(expr) = entry.cluster else {
        return Ok(None);
    };
    let what = format!("cluster of related \"{}\"", entry.spec.id);
    let fail = |error: RenderError| RelatedFailure {
        reason: FailureReason::RenderError,
        error,
    };
    let value = rule.engine.eval(expr, ctx, &what).map_err(fail)?;
    let name = value.as_str().ok_or_else(|| RenderError {
        what: what.clone(),
        message: format!("must be a cluster name (a string), not {}", value.kind()),
    });
    crate::clusters::placement(name.map_err(fail)?)
        .map_err(|message| fail(RenderError { what, message }))
}

/// Why a related entry in `cluster` cannot be read in this pass: a spoke
/// that cannot be reached or is unknown. (Running, the source then says
/// whether the spoke's objects are listed, [`RelatedSource::find_in`];
/// offline, the observed objects placed there are read.)
fn cluster_unreadable(input: &Input, cluster: Option<&str>) -> Option<Unreadable> {
    let held = input.clusters.hold(cluster)?;
    Some(Unreadable {
        reason: held.reason,
        message: held.message,
    })
}

/// `ConfigMap team-a/settings`, `Namespace (selector env=prod)`.
fn describe_read(read: &RelatedRead) -> String {
    let ns = read.namespace.as_deref();
    match &read.target {
        RelatedTarget::Name(name) => match ns {
            Some(ns) => format!("{} {ns}/{name}", read.kind),
            None => format!("{} {name}", read.kind),
        },
        RelatedTarget::Selector(_) => format!("{} (selector)", read.kind),
    }
}

/// The first related dependency of a child that holds it back, if any.
pub(super) fn holding_back(
    rule: &CompiledRule,
    child: &CompiledChild,
    states: &[RelatedState],
) -> Option<Pending> {
    for &r in &child.depends_on_related {
        let rid = &rule.related[r].spec.id;
        let (reason, why) = match states.get(r) {
            Some(RelatedState::Missing(why)) => ("RelatedNotFound", why),
            Some(RelatedState::NotReady(why)) => ("RelatedNotReady", why),
            Some(RelatedState::Unreadable(u)) => (u.reason, &u.message),
            _ => continue,
        };
        return Some(Pending {
            id: child.spec.id.clone(),
            reason: reason.to_owned(),
            message: Some(format!("related \"{rid}\": {why}")),
        });
    }
    None
}
