//! Turning a rendered mapping into the object trellis applies: the static
//! apiVersion/kind, a name, the namespace rules, trellis's labels and the
//! controller ownerReference.

use serde_json::{Map, Value, json};

use super::*;
use crate::render::RenderError;
use crate::rules::CompiledChild;
use crate::rules::model::DeletionPolicy;

/// Enforces kind, name, namespace rules, labels and ownerReference. A child
/// placed in a spoke (`cluster`) gets no ownerReference (none can point
/// across clusters) but the hub's name as `trellis.dev/hub`: the cleanup
/// finalizer on the parent deletes it, and no other hub takes it.
pub(super) fn finish_object(
    rule: &CompiledRule,
    child: &CompiledChild,
    object: Value,
    info: &ParentInfo,
    input: &Input,
    cluster: Option<&str>,
    what: &str,
) -> Result<Apply, RenderError> {
    let fail = |message: String| RenderError {
        what: what.to_owned(),
        message,
    };
    let (mut obj, name, set_ns) = identity(&child.gvk, object, "children").map_err(fail)?;
    let Some(Value::Object(meta)) = obj.get_mut("metadata") else {
        return Err(fail("metadata must be a mapping".into()));
    };
    let namespace = namespace_for(
        &child.gvk,
        child.spec.allow_cross_namespace,
        "child",
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

    // Before trellis's own labels, which win over the parent's.
    if let Some(p) = &rule.rule.spec.propagate {
        super::propagate::propagate(p, input.parent, meta).map_err(fail)?;
    }
    let labels = meta
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(labels) = labels else {
        return Err(fail("metadata.labels must be a mapping".into()));
    };
    labels.insert(LABEL_MANAGED_BY.into(), json!(MANAGED_BY));
    labels.insert(LABEL_RULE.into(), json!(rule.name));
    labels.insert(LABEL_CHILD.into(), json!(child.spec.id));
    labels.insert(LABEL_PARENT_UID.into(), json!(info.uid));
    // Always, so that turning `--shards` on costs no write: each replica
    // selects its buckets' children by this label.
    labels.insert(
        crate::labels::LABEL_BUCKET.into(),
        json!(crate::labels::bucket_of(&info.uid).to_string()),
    );
    if child.spec.deletion_policy == DeletionPolicy::Retain {
        labels.insert(LABEL_DELETION_POLICY.into(), json!(RETAIN));
    }
    if cluster.is_some() {
        labels.insert(crate::labels::LABEL_HUB.into(), json!(input.clusters.hub));
    }

    // Kubernetes allows an owner in the same namespace, or a cluster-scoped
    // owner, in the same cluster.
    let owned = cluster.is_none() && (info.namespace.is_none() || info.namespace == namespace);
    if owned {
        let refs = meta
            .entry("ownerReferences")
            .or_insert_with(|| Value::Array(Vec::new()));
        let Value::Array(refs) = refs else {
            return Err(fail("metadata.ownerReferences must be a list".into()));
        };
        if refs
            .iter()
            .any(|r| r.get("controller") == Some(&Value::Bool(true)))
        {
            return Err(fail(
                "sets a controller ownerReference; trellis must be the child's controller".into(),
            ));
        }
        refs.push(json!({
            "apiVersion": info.api_version,
            "kind": info.kind,
            "name": info.name,
            "uid": info.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }));
    }
    let key = ObjectKey {
        group: child.gvk.group.clone(),
        kind: child.gvk.kind.clone(),
        namespace,
        name,
        cluster: cluster.map(str::to_owned),
    };
    // The hash of the content, without the revision that rendered it
    // (labelled below): a rule edit that leaves this child's rendering as it
    // was must neither re-apply it nor (`recreate`) replace it.
    let hash = object_hash(&obj);
    if let Some(labels) = obj
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .and_then(|m| m.get_mut("labels"))
        .and_then(Value::as_object_mut)
    {
        labels.insert(LABEL_REVISION.into(), json!(rule.revision));
    }
    // A createOnly child is never updated (and its rendering may hold a
    // random secret): it needs no record of its rendering.
    if child.spec.policy != Policy::CreateOnly {
        // The live object tells which rendering it came from: what `recreate`
        // compares, and what lets a restarted operator find its children
        // as it left them without applying them again.
        let meta = obj.get_mut("metadata").and_then(Value::as_object_mut);
        if let Some(meta) = meta {
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(a) = annotations {
                a.insert(ANNOTATION_RENDER_HASH.into(), json!(hash));
            }
        }
    }
    Ok(Apply {
        id: child.spec.id.clone(),
        policy: child.spec.policy,
        key,
        object: Value::Object(obj),
        owned,
        hash,
        hand_off: child.hand_off.clone(),
    })
}

/// A rendered object, its name, and the namespace its template set.
pub(super) type Identified = (Map<String, Value>, String, Option<String>);

/// A rendered mapping with its static apiVersion and kind first, its name,
/// and the namespace its template set (`None`: none). `what` (children,
/// patches) is what needs stable names.
pub(super) fn identity(gvk: &Gvk, object: Value, what: &str) -> Result<Identified, String> {
    let Value::Object(mut obj) = object else {
        return Err("must render a YAML mapping (an object)".into());
    };
    let api_version = gvk.api_version();
    for (field, want) in [
        ("apiVersion", api_version.as_str()),
        ("kind", gvk.kind.as_str()),
    ] {
        match obj.get(field) {
            None => {}
            Some(Value::String(s)) if s == want => {}
            Some(other) => {
                return Err(format!(
                    "sets {field} to {other}, but the rule declares `{want}`"
                ));
            }
        }
    }
    let mut ordered = Map::new();
    ordered.insert("apiVersion".into(), json!(api_version));
    ordered.insert("kind".into(), json!(gvk.kind));
    obj.remove("apiVersion");
    obj.remove("kind");
    ordered.extend(obj);
    let mut obj = ordered;

    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(meta) = meta else {
        return Err("metadata must be a mapping".into());
    };
    let name = match meta.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => return Err("metadata.name must be set to a non-empty string".into()),
    };
    if meta.contains_key("generateName") {
        return Err(format!(
            "metadata.generateName is not supported: {what} need stable names"
        ));
    }
    let set_ns = match meta.get("namespace") {
        None | Some(Value::Null) => None,
        Some(Value::String(ns)) => Some(ns.clone()),
        Some(other) => {
            return Err(format!("metadata.namespace must be a string, got {other}"));
        }
    };
    Ok((obj, name, set_ns))
}

/// The namespace a rendered object (a `noun`: child or patch target) lands
/// in, given the one its template set: the parent's by default; another,
/// or a cluster-scoped kind under a namespaced parent, only with
/// `allowCrossNamespace` (`cross`).
pub(super) fn namespace_for(
    gvk: &Gvk,
    cross: bool,
    noun: &str,
    set_ns: Option<String>,
    info: &ParentInfo,
    input: &Input,
) -> Result<Option<String>, String> {
    let scope = (input.scope_of)(gvk);
    let hint = format!("set allowCrossNamespace: true on the {noun} in the rule to allow it");
    Ok(match (&info.namespace, scope) {
        (Some(parent_ns), Scope::Namespaced) => match set_ns {
            None => Some(parent_ns.clone()),
            Some(ns) if &ns == parent_ns => Some(ns),
            Some(ns) if cross => Some(ns),
            Some(ns) => {
                return Err(format!(
                    "names namespace `{ns}`, not the parent's `{parent_ns}`; {hint}"
                ));
            }
        },
        (Some(_), Scope::Cluster) if !cross => {
            return Err(format!(
                "{} is cluster-scoped and the parent is namespaced; {hint}",
                gvk.kind
            ));
        }
        (_, Scope::Cluster) => {
            if set_ns.is_some() {
                return Err(format!(
                    "{} is cluster-scoped: remove metadata.namespace",
                    gvk.kind
                ));
            }
            None
        }
        (None, Scope::Namespaced) => match set_ns {
            Some(ns) => Some(ns),
            None => {
                return Err(format!(
                    "the parent is cluster-scoped: a namespaced {noun} must set metadata.namespace"
                ));
            }
        },
    })
}

/// Lowercase hex SHA-256 of an object's JSON form (key order as rendered).
pub fn object_hash(obj: &Map<String, Value>) -> String {
    crate::render::sha256_hex(&serde_json::to_vec(obj).unwrap_or_default())
}
