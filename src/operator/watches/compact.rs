//! Children as the caches keep them: typed metadata, and everything else as
//! the JSON text the API server sent.
//!
//! A cached child is read by a pass of its own parent only, while every
//! child of every parent stays in memory. As a `serde_json::Value` (with
//! `preserve_order`) a 1.9 KB Deployment takes 14.4 KB of heap; as text it
//! takes what it weighs. So the caches hold text, and a pass parses the few
//! objects it reads. Metadata stays typed: the trigger mapper and the label
//! checks read it on every event.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kube::api::ObjectMeta;
use kube::core::TypeMeta;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::plan::LABEL_PARENT_UID;

/// One cached child.
#[derive(Debug, Clone)]
pub struct CompactObject {
    /// Shared by every object of a cache (see [`super::trim`]): two
    /// strings per object otherwise.
    pub types: Option<Arc<TypeMeta>>,
    /// For a child, only what the caches and the trigger mapper read
    /// (name, namespace, uid, resourceVersion, generation, ownerReferences):
    /// labels and annotations are in `meta`. For a parent, all but its
    /// labels and annotations (see [`CompactObject::from_fields_whole`]).
    pub metadata: ObjectMeta,
    /// The rest of `metadata` (less `managedFields` and kubectl's
    /// last-applied annotation, and less what `metadata` holds typed) as
    /// text; a parent's labels and annotations. Two small label and
    /// annotation maps take over a kilobyte of heap typed (a B-tree node
    /// each), a few hundred bytes as text; the typed fields are not
    /// repeated in it (about 300 bytes a child, its ownerReference most).
    meta: Option<Box<RawValue>>,
    /// The `trellis.dev/parent-uid` label, read on every event.
    parent_uid: Option<String>,
    /// The top-level fields besides `apiVersion`, `kind` and `metadata`
    /// (`spec`, `data`, `status`, ...), as one JSON object's text.
    rest: Box<RawValue>,
}

pub(in crate::operator) type RawMap = BTreeMap<String, Box<RawValue>>;

/// The metadata fields a child keeps typed.
const IDENTITY: [&str; 6] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "ownerReferences",
];
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl CompactObject {
    /// Splits one child's JSON text; `managedFields` are dropped before
    /// they are decoded, as every cache drops them.
    pub fn from_json(text: &str) -> Result<CompactObject, serde_json::Error> {
        let mut top: RawMap = serde_json::from_str(text)?;
        let mut fields = metadata_fields(&mut top)?;
        if let Some(raw) = fields.get_mut("annotations")
            && raw.get().contains(LAST_APPLIED)
        {
            let mut annotations: RawMap = serde_json::from_str(raw.get())?;
            annotations.remove(LAST_APPLIED);
            *raw = serde_json::value::to_raw_value(&annotations)?;
        }
        let parent_uid = match fields.get("labels") {
            Some(raw) => serde_json::from_str::<BTreeMap<String, String>>(raw.get())?
                .remove(LABEL_PARENT_UID),
            None => None,
        };
        let (identity, rest): (RawMap, RawMap) = fields
            .into_iter()
            .partition(|(k, _)| IDENTITY.contains(&k.as_str()));
        let meta = serde_json::value::to_raw_value(&rest)?;
        let metadata = serde_json::from_str(&serde_json::to_string(&identity)?)?;
        let (types, rest) = types_and_rest(top)?;
        Ok(CompactObject {
            types,
            metadata,
            meta: Some(meta),
            parent_uid,
            rest,
        })
    }

    /// An object (a parent, a related object) from its top-level fields,
    /// each still raw, with its metadata typed but for its labels and
    /// annotations, kept as text as a child's are (read them with
    /// [`CompactObject::labels`]): typed, the two maps took a B-tree node
    /// each, 544 bytes for a parent whose one label is its bucket's, the
    /// largest part of a cached parent under `--shards`.
    pub(in crate::operator) fn from_fields_whole(
        mut top: RawMap,
    ) -> Result<CompactObject, serde_json::Error> {
        let mut fields = metadata_fields(&mut top)?;
        let maps: RawMap = ["labels", "annotations"]
            .into_iter()
            .filter_map(|k| fields.remove_entry(k))
            .collect();
        let metadata: ObjectMeta = serde_json::from_str(&serde_json::to_string(&fields)?)?;
        let (types, rest) = types_and_rest(top)?;
        let meta = serde_json::value::to_raw_value(&maps)?;
        Ok(CompactObject {
            types,
            parent_uid: labels_in(meta.get()).remove(LABEL_PARENT_UID),
            metadata,
            meta: Some(meta),
            rest,
        })
    }

    /// The object's labels (kept as text: see [`CompactObject::from_fields_whole`]).
    pub fn labels(&self) -> BTreeMap<String, String> {
        match &self.meta {
            Some(meta) => labels_in(meta.get()),
            None => self.metadata.labels.clone().unwrap_or_default(),
        }
    }

    /// The metadata typed, whole again: with its labels and annotations.
    pub fn full_metadata(&self) -> ObjectMeta {
        let mut metadata = self.metadata.clone();
        if let Some(meta) = &self.meta
            // Text this process wrote from a parse: it parses again.
            && let Ok(maps) = serde_json::from_str::<Maps>(meta.get())
        {
            metadata.labels = maps.labels.or(metadata.labels);
            metadata.annotations = maps.annotations.or(metadata.annotations);
        }
        metadata
    }

    /// The metadata kept as text (labels and annotations among it): what
    /// changes when they do.
    pub fn meta_text(&self) -> &str {
        self.meta.as_ref().map_or("", |m| m.get())
    }

    /// The `trellis.dev/parent-uid` label.
    pub fn parent_uid(&self) -> Option<&str> {
        self.parent_uid.as_deref()
    }

    /// The text of the fields besides types and metadata (one JSON object).
    pub(in crate::operator) fn rest_text(&self) -> &str {
        self.rest.get()
    }

    /// The whole object, as a pass reads it.
    pub fn to_value(&self) -> Value {
        let mut out = Map::new();
        if let Some(types) = &self.types {
            out.insert("apiVersion".into(), types.api_version.clone().into());
            out.insert("kind".into(), types.kind.clone().into());
        }
        let mut metadata = serde_json::to_value(&self.metadata).unwrap_or_default();
        if let (Some(meta), Value::Object(typed)) = (&self.meta, &mut metadata)
            // Text this process wrote from a parse: it parses again.
            && let Ok(Value::Object(rest)) = serde_json::from_str(meta.get())
        {
            typed.extend(rest);
        }
        out.insert("metadata".into(), metadata);
        // Text this process wrote from a parse: it parses again.
        if let Ok(Value::Object(rest)) = serde_json::from_str(self.rest.get()) {
            out.extend(rest);
        }
        Value::Object(out)
    }
}

/// The labels and annotations of a metadata text.
#[derive(serde::Deserialize)]
struct Maps {
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

/// The labels in a metadata text (none if it does not parse: this
/// process wrote it from a parse).
fn labels_in(meta: &str) -> BTreeMap<String, String> {
    serde_json::from_str::<Maps>(meta)
        .ok()
        .and_then(|m| m.labels)
        .unwrap_or_default()
}

/// Takes `metadata` out of the top-level fields, as raw fields without
/// `managedFields` (which mirror the spec's depth), except the names of
/// patch managers ([`crate::operator::pass::patch_writes::managers_of_patches`]).
fn metadata_fields(top: &mut RawMap) -> Result<RawMap, serde_json::Error> {
    let mut fields: RawMap = match top.remove("metadata") {
        Some(raw) => serde_json::from_str(raw.get())?,
        None => RawMap::new(),
    };
    if let Some(managed) = fields.remove("managedFields")
        && let Some(kept) = crate::operator::pass::patch_writes::managers_of_patches(managed.get())
    {
        fields.insert("managedFields".into(), kept);
    }
    Ok(fields)
}

/// The types, and the fields left (less the types) as one text.
fn types_and_rest(
    mut top: RawMap,
) -> Result<(Option<Arc<TypeMeta>>, Box<RawValue>), serde_json::Error> {
    let text_of = |raw: Option<Box<RawValue>>| -> Option<String> {
        raw.and_then(|r| serde_json::from_str::<String>(r.get()).ok())
    };
    let types = match (
        text_of(top.remove("apiVersion")),
        text_of(top.remove("kind")),
    ) {
        (Some(api_version), Some(kind)) => Some(Arc::new(TypeMeta { api_version, kind })),
        _ => None,
    };
    Ok((types, serde_json::value::to_raw_value(&top)?))
}

/// One child cache's objects by the parent uid on their label, kept from
/// the cache's own watch events: a pass visits its own children, not every
/// child of the rule (which made each pass O(N), each convergence O(N²)).
/// Entries may be stale (a relisted cache reports no deletions, a label may
/// change): a reader looks each one up in the cache and checks the label.
#[derive(Default)]
pub struct ByParent {
    state: std::sync::Mutex<super::relisted::Relisted<Index>>,
}

/// A child's namespace and name.
pub type ChildName = (Option<String>, String);
/// A parent has one child or a few of each kind: a `Vec` sized to them.
/// A `HashSet` of one name took a table of four slots (about 220 bytes)
/// per parent and kind, a third of the index at 1,000 parents (heaptrack).
type Index = HashMap<String, Vec<ChildName>>;

impl ByParent {
    /// Follows one event of the cache's watch (before the store takes it,
    /// so that a pass the store's readiness wakes finds the index filled).
    pub fn observe(&self, event: &kube::runtime::watcher::Event<CompactObject>) {
        crate::operator::lock(&self.state).follow(event, add, |index, o| {
            if let Some(uid) = o.parent_uid()
                && let Some(names) = index.get_mut(uid)
            {
                let name = name_of(o);
                names.retain(|n| *n != name);
                if names.is_empty() {
                    index.remove(uid);
                }
            }
        });
    }

    /// The children indexed under the parent with `uid`.
    pub fn of(&self, uid: &str) -> Vec<ChildName> {
        crate::operator::lock(&self.state)
            .live()
            .get(uid)
            .map(|names| names.to_vec())
            .unwrap_or_default()
    }
}

fn name_of(o: &CompactObject) -> ChildName {
    (
        o.metadata.namespace.clone(),
        o.metadata.name.clone().unwrap_or_default(),
    )
}

fn add(index: &mut Index, o: &CompactObject) {
    if let Some(uid) = o.parent_uid() {
        let name = name_of(o);
        let names = index.entry(uid.to_owned()).or_default();
        if names.contains(&name) {
            return;
        }
        // A first push would reserve four slots; most parents have one
        // child of a kind. Past a few, amortized growth again.
        if names.len() == names.capacity() && names.len() < 4 {
            names.reserve_exact(1);
        }
        names.push(name);
    }
}

super::decode::raw_decoded_resource!(CompactObject, metadata);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_reads_back_whole_without_its_managed_fields() {
        let object = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "a", "labels": {"x": "1"},
                         "managedFields": [{"manager": "m", "operation": "Apply"}]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c"}]}}},
            "status": {"availableReplicas": 2},
        });
        let compact = CompactObject::from_json(&object.to_string()).expect("decodes");
        let mut want = object.clone();
        want["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("managedFields");
        assert_eq!(compact.to_value(), want);
        // Typed: what the caches and the mapper read, not the label maps.
        assert_eq!(compact.metadata.name.as_deref(), Some("web"));
        assert_eq!(compact.metadata.labels, None);
    }

    #[test]
    fn a_child_keeps_its_parent_uid_and_loses_kubectls_last_applied_copy() {
        let object = json!({
            "metadata": {"name": "web", "namespace": "a", "uid": "u1", "resourceVersion": "7",
                         "labels": {LABEL_PARENT_UID: "p1", "app": "web"},
                         "annotations": {LAST_APPLIED: "{}", "trellis.dev/hash": "h"},
                         "ownerReferences": [{"apiVersion": "demo/v1", "kind": "App", "name": "p",
                                              "uid": "p1", "controller": true}]},
            "data": {"k": "v"},
        });
        let compact = CompactObject::from_json(&object.to_string()).expect("decodes");
        assert_eq!(compact.parent_uid(), Some("p1"));
        assert_eq!(compact.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(compact.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            compact.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        let value = compact.to_value();
        assert_eq!(
            value["metadata"]["annotations"],
            json!({"trellis.dev/hash": "h"})
        );
        assert_eq!(value["metadata"]["labels"]["app"], "web");
    }

    #[test]
    fn a_parent_keeps_its_labels_and_annotations_as_text_and_reads_them_back() {
        let object = json!({
            "apiVersion": "demo/v1", "kind": "App",
            "metadata": {"name": "p", "namespace": "a", "uid": "u1", "resourceVersion": "7",
                "labels": {"trellis.dev/bucket": "12", "team": "blue"},
                "annotations": {"note": "hello"}},
            "spec": {"x": 1}
        });
        let top: RawMap = serde_json::from_value(object.clone()).expect("fields");
        let parent = CompactObject::from_fields_whole(top).expect("decodes");
        assert_eq!(parent.metadata.labels, None, "not typed");
        assert_eq!(parent.metadata.annotations, None, "not typed");
        assert_eq!(parent.metadata.uid.as_deref(), Some("u1"));
        let labels = parent.labels();
        assert_eq!(labels.get("team").map(String::as_str), Some("blue"));
        assert_eq!(labels.len(), 2);
        let full = parent.full_metadata();
        assert_eq!(full.labels, Some(labels));
        assert_eq!(
            full.annotations
                .and_then(|a| a.get("note").cloned())
                .as_deref(),
            Some("hello")
        );
        assert_eq!(parent.to_value(), object);
        let bare: RawMap =
            serde_json::from_value(json!({"metadata": {"name": "q"}})).expect("fields");
        let bare = CompactObject::from_fields_whole(bare).expect("decodes");
        assert!(bare.labels().is_empty());
        assert_eq!(bare.full_metadata().labels, None);
        assert_ne!(
            parent.meta_text(),
            bare.meta_text(),
            "what a label edit changes"
        );
    }

    #[test]
    fn a_list_item_without_types_has_none_until_the_cache_fills_them_in() {
        let compact = CompactObject::from_json(r#"{"metadata":{"name":"x"},"data":{"k":"v"}}"#)
            .expect("decodes");
        assert!(compact.types.is_none());
        assert_eq!(
            compact.to_value(),
            json!({"metadata": {"name": "x"}, "data": {"k": "v"}})
        );
    }

    fn child(name: &str, uid: &str) -> CompactObject {
        CompactObject::from_json(
            &json!({"metadata": {"name": name, "namespace": "a",
                                 "labels": {LABEL_PARENT_UID: uid}}})
            .to_string(),
        )
        .expect("decodes")
    }

    fn names(index: &ByParent, uid: &str) -> Vec<String> {
        let mut names: Vec<String> = index.of(uid).into_iter().map(|(_, n)| n).collect();
        names.sort();
        names
    }

    #[test]
    fn children_are_indexed_under_their_parent_and_leave_it_when_deleted() {
        use kube::runtime::watcher::Event;
        let index = ByParent::default();
        index.observe(&Event::Apply(child("x-config", "x")));
        index.observe(&Event::Apply(child("x-web", "x")));
        index.observe(&Event::Apply(child("y-web", "y")));
        assert_eq!(names(&index, "x"), ["x-config", "x-web"]);
        assert_eq!(names(&index, "y"), ["y-web"]);
        index.observe(&Event::Delete(child("x-web", "x")));
        assert_eq!(names(&index, "x"), ["x-config"]);
        assert!(names(&index, "z").is_empty());
    }

    #[test]
    fn a_child_seen_again_is_indexed_once_and_its_delete_empties_the_parent() {
        use kube::runtime::watcher::Event;
        let index = ByParent::default();
        index.observe(&Event::Apply(child("x-web", "x")));
        index.observe(&Event::Apply(child("x-web", "x")));
        assert_eq!(names(&index, "x"), ["x-web"]);
        index.observe(&Event::Delete(child("x-web", "x")));
        assert!(names(&index, "x").is_empty());
        assert!(crate::operator::lock(&index.state).live().is_empty());
        for i in 0..10 {
            index.observe(&Event::Apply(child(&format!("y-{i}"), "y")));
        }
        assert_eq!(index.of("y").len(), 10);
    }

    #[test]
    fn a_relist_replaces_the_index_once_it_is_done() {
        use kube::runtime::watcher::Event;
        let index = ByParent::default();
        index.observe(&Event::Apply(child("gone", "x")));
        index.observe(&Event::Init);
        index.observe(&Event::InitApply(child("kept", "x")));
        // Until the relist is done, readers see the old index, as the store does.
        assert_eq!(names(&index, "x"), ["gone"]);
        index.observe(&Event::InitDone);
        assert_eq!(names(&index, "x"), ["kept"]);
    }
}
