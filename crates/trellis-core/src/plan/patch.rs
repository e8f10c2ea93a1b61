//! Patches in a pass: fields contributed to objects the rule does not own.
//!
//! ```text
//!  for each patch in dependency order (after every child)
//!  related entry missing? ── yes ─▶ pending (RelatedNotFound, …)
//!  includeWhen / deps / forEach / render          (as a child: `child`)
//!     ▼ per rendered mapping
//!  kind, name, namespace rules; no ownerReference, uid, trellis label
//!     ▼
//!  target observed? ── no ──▶ pending TargetNotFound (nothing is sent:
//!     │                       nothing is ever created)
//!     ▼ yes
//!  the body carries the target's uid ─▶ apply with `trellis/<rule>/<uid>`
//!  readiness: `readyWhen` (self: the target), else the target holds the fields
//! ```
//!
//! Targets are read as related objects are (a [`RelatedRead`] by name per
//! target, so the operator's read index re-reconciles the parents that
//! patch an object when it changes). What a parent contributed before is
//! found by its field manager on the observed objects ([`managed_by`]);
//! what it no longer renders is released on a clean pass.

use std::collections::{BTreeMap, BTreeSet};

use minijinja::context;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::child::{ChildResult, Item, Outcome, plan_entry, waiting_for};
use super::object::{identity, namespace_for};
use super::observed::strip_noise;
use super::related::{RelatedState, holding_back};
use super::vars::Vars;
use super::*;
use crate::render::RenderError;
use crate::rules::CompiledChild;

/// Why a patch is pending when its target does not exist.
pub const TARGET_NOT_FOUND: &str = "TargetNotFound";

/// The field manager of one parent's contributions.
pub fn field_manager(rule: &str, parent_uid: &str) -> String {
    format!("trellis/{rule}/{parent_uid}")
}

/// One contribution to one target.
#[derive(Debug, Clone, Serialize)]
pub struct PatchApply {
    pub id: String,
    pub key: ObjectKey,
    /// The body sent: only the contributed fields, the target's identity and
    /// (when observed) its uid.
    pub object: Value,
    /// The observed target's uid; `None`: the target does not exist, and
    /// nothing is sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// A forced apply (`force: true`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// The observed target holds every contributed field already.
    #[serde(skip)]
    pub held: bool,
    /// SHA-256 of the body (uid included): the operator sends an unchanged
    /// contribution only when the target drifted.
    pub hash: String,
}

/// A contribution to take back: an empty apply with the same field manager.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Release {
    pub key: ObjectKey,
    pub api_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl Release {
    /// The release of an observed object `obj` at `key`.
    pub fn of(key: ObjectKey, obj: &Value) -> Release {
        Release {
            key,
            api_version: obj
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            uid: obj
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }
    }

    /// The empty apply that removes every field the manager owns: the
    /// target's identity and uid only (a target gone or replaced refuses it).
    pub fn body(&self) -> Value {
        let mut meta = Map::new();
        meta.insert("name".into(), json!(self.key.name));
        if let Some(ns) = &self.key.namespace {
            meta.insert("namespace".into(), json!(ns));
        }
        if let Some(uid) = &self.uid {
            meta.insert("uid".into(), json!(uid));
        }
        json!({"apiVersion": self.api_version, "kind": self.key.kind, "metadata": meta})
    }
}

/// What the patches came to in a pass.
#[derive(Default)]
pub(super) struct Patched {
    pub apply: Vec<PatchApply>,
    pub pending: Vec<Pending>,
    pub errors: Vec<String>,
    pub reads: Vec<RelatedRead>,
    /// By index into `rule.patches`.
    pub outcome: BTreeMap<usize, Outcome>,
    /// `patches` in the evaluation context: each patch's observed targets.
    pub context: BTreeMap<String, minijinja::Value>,
    /// Targets rendered so far: one target is contributed to once per rule
    /// and parent (two bodies under one manager would undo each other).
    pub keys: BTreeSet<ObjectKey>,
    /// A patch is held back (or failed) for a reason other than a missing
    /// target: what it contributed before cannot be told from what it
    /// dropped, so nothing is released in this pass.
    pub holding: bool,
}

/// Plans every patch after the children (`children`: what became of them;
/// `vars`: the pass's, a patch reading one without a value fails).
pub(super) fn plan_patches(
    rule: &CompiledRule,
    base: &minijinja::Value,
    info: &ParentInfo,
    input: &Input,
    children: &BTreeMap<usize, Outcome>,
    related: &[RelatedState],
    vars: &Vars,
) -> Patched {
    let mut out = Patched::default();
    for &i in &rule.patch_order {
        let patch = &rule.patches[i];
        let id = &patch.spec.id;
        if let Some(pending) = holding_back(rule, patch, related) {
            out.pending.push(pending);
            out.outcome.insert(i, Outcome::Pending);
            out.holding = true;
            continue;
        }
        if let Some(err) = vars.withheld(&patch.reads_vars, &format!("patch \"{id}\"")) {
            out.errors.push(err.to_string());
            out.outcome.insert(i, Outcome::Failed);
            out.holding = true;
            continue;
        }
        let ctx =
            context! { patches => minijinja::Value::from(out.context.clone()), ..base.clone() };
        let waiting = || {
            patch
                .depends_on_patches
                .iter()
                .find_map(|&d| waiting_for(out.outcome.get(&d), "patch", &rule.patches[d].spec.id))
        };
        let finish = |object, what: &str| finish_patch(patch, object, info, input, what);
        let result = plan_entry(rule, patch, "patch", &ctx, children, &waiting, &finish);
        let rendered = match result {
            Err(err) => {
                out.errors.push(err.to_string());
                out.outcome.insert(i, Outcome::Failed);
                out.holding = true;
                continue;
            }
            Ok(ChildResult::Excluded) => {
                out.outcome.insert(i, Outcome::Excluded);
                continue;
            }
            Ok(ChildResult::Pending { reason, message }) => {
                out.pending.push(Pending {
                    id: id.clone(),
                    reason,
                    message,
                });
                out.outcome.insert(i, Outcome::Pending);
                out.holding = true;
                continue;
            }
            Ok(ChildResult::Rendered(rendered)) => rendered,
        };
        let state = targets(rule, patch, &ctx, input, rendered, &mut out);
        out.outcome.insert(i, state);
    }
    out
}

/// A rendered patch body and its target's key.
type Target = (Map<String, Value>, ObjectKey);

/// Looks up each rendered target, completes its body and decides the
/// patch's outcome (pending while a target is missing or unreadable).
fn targets(
    rule: &CompiledRule,
    patch: &CompiledChild,
    ctx: &minijinja::Value,
    input: &Input,
    rendered: Vec<(Target, Option<Item>)>,
    out: &mut Patched,
) -> Outcome {
    let id = &patch.spec.id;
    let force = rule
        .rule
        .spec
        .patches
        .iter()
        .any(|p| &p.id == id && p.force);
    let mut seen: Vec<minijinja::Value> = Vec::new();
    let mut waiting: Option<Pending> = None;
    let mut ready: Result<(), String> = Ok(());
    for ((mut obj, key), item) in rendered {
        if !out.keys.insert(key.clone()) {
            out.errors.push(format!(
                "patch \"{id}\": {key} is patched twice in this rule (one body per target and parent)"
            ));
            out.holding = true;
            continue;
        }
        let read = RelatedRead {
            id: id.clone(),
            api_version: patch.gvk.api_version(),
            kind: patch.gvk.kind.clone(),
            namespace: key.namespace.clone(),
            target: RelatedTarget::Name(key.name.clone()),
        };
        let found = lookup(input, &patch.gvk, &key, &read);
        out.reads.push(read);
        let target = match found {
            Err(why) => {
                waiting.get_or_insert(Pending {
                    id: id.clone(),
                    reason: why.reason.to_owned(),
                    message: Some(format!("patch \"{id}\": {}", why.message)),
                });
                out.holding = true;
                None
            }
            Ok(None) => {
                waiting.get_or_insert(Pending {
                    id: id.clone(),
                    reason: TARGET_NOT_FOUND.to_owned(),
                    message: Some(format!(
                        "patch \"{id}\": {key} does not exist (a patch never creates its target)"
                    )),
                });
                None
            }
            Ok(Some(target)) => Some(target),
        };
        let uid = target
            .as_ref()
            .and_then(|t| t.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let (Some(uid), Some(Value::Object(meta))) = (&uid, obj.get_mut("metadata")) {
            meta.insert("uid".into(), json!(uid));
        }
        let object = Value::Object(obj);
        let held = target
            .as_ref()
            .is_some_and(|t| !crate::drift::drifted(&object, t));
        if let Some(mut target) = target {
            match target_ready(rule, patch, ctx, &object, &target, item.as_ref()) {
                Ok(Ok(())) => {}
                Ok(Err(why)) => {
                    if ready.is_ok() {
                        ready = Err(why);
                    }
                }
                Err(err) => {
                    let why = err.to_string();
                    out.errors.push(why.clone());
                    if ready.is_ok() {
                        ready = Err(why);
                    }
                }
            }
            strip_noise(&mut target);
            seen.push(render::to_value(&target));
        }
        let hash = match &object {
            Value::Object(obj) => object_hash(obj),
            _ => String::new(),
        };
        out.apply.push(PatchApply {
            id: id.clone(),
            key,
            object,
            uid,
            force,
            held,
            hash,
        });
    }
    if patch.for_each.is_some() {
        out.context.insert(id.clone(), minijinja::Value::from(seen));
    } else if let Some(one) = seen.into_iter().next() {
        out.context.insert(id.clone(), one);
    }
    match waiting {
        Some(pending) => {
            out.pending.push(pending);
            Outcome::Pending
        }
        None => Outcome::Rendered(ready),
    }
}

/// The target at `key`: one this pass wrote or `--observed` holds, else the
/// related source (the operator's caches).
fn lookup(
    input: &Input,
    gvk: &crate::kinds::Gvk,
    key: &ObjectKey,
    read: &RelatedRead,
) -> Result<Option<Value>, Unreadable> {
    if let Some(obj) = input.observed.objects.get(key) {
        return Ok(Some(obj.clone()));
    }
    match &input.observed.related {
        Some(source) => {
            source.served(gvk)?;
            Ok(source.find(gvk, read)?.into_iter().next().map(|(_, o)| o))
        }
        None => Ok(None),
    }
}

/// Readiness of one contribution: its `readyWhen` with `self` the target,
/// else whether the target holds every contributed field.
fn target_ready(
    rule: &CompiledRule,
    patch: &CompiledChild,
    base: &minijinja::Value,
    object: &Value,
    target: &Value,
    item: Option<&Item>,
) -> Result<Result<(), String>, RenderError> {
    let key = ObjectKey::of(target)
        .map(|k| k.to_string())
        .unwrap_or_default();
    let Some(expr) = patch.ready_when else {
        return Ok(if crate::drift::drifted(object, target) {
            Err(format!("{key} does not hold the contributed fields yet"))
        } else {
            Ok(())
        });
    };
    let ctx = match item {
        None => context! { self => render::to_value(target), ..base.clone() },
        Some((item, index)) => context! {
            self => render::to_value(target),
            item => item.clone(),
            index => *index,
            ..base.clone()
        },
    };
    let id = &patch.spec.id;
    let what = match item {
        None => format!("readyWhen of patch \"{id}\""),
        Some((_, index)) => format!("readyWhen of patch \"{id}\" (item {index})"),
    };
    Ok(if rule.engine.eval_bool(expr, &ctx, &what)? {
        Ok(())
    } else {
        Err(format!(
            "{key} is not ready: readyWhen `{}` is false",
            render::one_line(rule.engine.expression_source(expr))
        ))
    })
}

/// Metadata a patch may not set: the target's identity and ownership are
/// not the rule's to contribute.
const REFUSED_METADATA: [&str; 6] = [
    "uid",
    "resourceVersion",
    "ownerReferences",
    "managedFields",
    "creationTimestamp",
    "deletionTimestamp",
];

/// Enforces kind, name and namespace rules on a rendered patch; it keeps
/// only the contributed fields (no trellis label, no ownerReference).
fn finish_patch(
    patch: &CompiledChild,
    object: Value,
    info: &ParentInfo,
    input: &Input,
    what: &str,
) -> Result<Target, RenderError> {
    let fail = |message: String| RenderError {
        what: what.to_owned(),
        message,
    };
    let (mut obj, name, set_ns) = identity(&patch.gvk, object, "patches").map_err(fail)?;
    let Some(Value::Object(meta)) = obj.get_mut("metadata") else {
        return Err(fail("metadata must be a mapping".into()));
    };
    if let Some(field) = REFUSED_METADATA.iter().find(|f| meta.contains_key(**f)) {
        return Err(fail(format!(
            "sets metadata.{field}: a patch contributes fields, never the target's identity or owners"
        )));
    }
    for map in ["labels", "annotations"] {
        let trellis = meta
            .get(map)
            .and_then(Value::as_object)
            .and_then(|m| m.keys().find(|k| k.starts_with("trellis.dev/")).cloned());
        if let Some(key) = trellis {
            return Err(fail(format!(
                "sets metadata.{map}.{key}: a patch target carries nothing of trellis's"
            )));
        }
    }
    let namespace = namespace_for(
        &patch.gvk,
        patch.spec.allow_cross_namespace,
        "patch",
        set_ns,
        info,
        input,
    )
    .map_err(fail)?;
    match &namespace {
        Some(ns) => {
            meta.insert("namespace".into(), json!(ns));
        }
        None => {
            meta.remove("namespace");
        }
    }
    let key = ObjectKey {
        group: patch.gvk.group.clone(),
        kind: patch.gvk.kind.clone(),
        namespace,
        name,
        cluster: None,
    };
    Ok((obj, key))
}

/// The objects that carry contributions of `manager`: from the related
/// source (the operator's caches of patch kinds) and the observed objects
/// (offline: `--observed` with `managedFields`).
pub(super) fn managed_by(input: &Input, manager: &str) -> BTreeMap<ObjectKey, Value> {
    let mut out: BTreeMap<ObjectKey, Value> = input
        .observed
        .objects
        .iter()
        .filter(|(_, o)| has_manager(o, manager))
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect();
    if let Some(source) = &input.observed.related {
        for (k, o) in source.managed_by(manager) {
            out.entry(k).or_insert(o);
        }
    }
    out
}

/// Whether `obj`'s `managedFields` name `manager`.
pub fn has_manager(obj: &Value, manager: &str) -> bool {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .is_some_and(|m| m.iter().any(|e| e["manager"] == manager))
}

/// The contributions to release: observed under this parent's manager, not
/// rendered in this pass.
pub(super) fn releases(input: &Input, manager: &str, rendered: &[PatchApply]) -> Vec<Release> {
    let keep: BTreeSet<&ObjectKey> = rendered.iter().map(|p| &p.key).collect();
    managed_by(input, manager)
        .into_iter()
        .filter(|(k, _)| !keep.contains(k))
        .map(|(k, o)| Release::of(k, &o))
        .collect()
}
