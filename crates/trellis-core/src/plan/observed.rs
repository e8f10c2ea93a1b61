//! What the cluster holds for a parent: [`Observed`], the objects trellis
//! manages for it (keyed by [`ObjectKey`]) and where related objects are
//! read from ([`RelatedSource`]), and the noise (managed fields, the
//! last-applied annotation) that rules never read.
//!
//! It does not decide anything: `children` turns these objects into what
//! templates see, readiness and pruning read them as they are.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::{LABEL_CHILD, LABEL_PARENT_UID, LABEL_RULE, RelatedRead, Unreadable};
use crate::kinds::Gvk;

/// Identity of an object regardless of the API version it is read at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The spoke the object lives in; `None`: the hub.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

impl ObjectKey {
    /// Key of an object value; `None` without kind or name.
    pub fn of(obj: &Value) -> Option<ObjectKey> {
        let gvk = Gvk::new(obj.get("apiVersion")?.as_str()?, obj.get("kind")?.as_str()?);
        Some(ObjectKey {
            group: gvk.group,
            kind: gvk.kind,
            namespace: obj
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_owned),
            name: obj.pointer("/metadata/name")?.as_str()?.to_owned(),
            cluster: None,
        })
    }

    /// Key of an observed object, placed in the cluster its
    /// `trellis.dev/cluster` annotation names (`render --observed`, and
    /// the operator's spoke caches); none, or `local`: the hub.
    pub fn placed(obj: &Value) -> Option<ObjectKey> {
        let mut key = ObjectKey::of(obj)?;
        key.cluster = obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(crate::labels::LABEL_CLUSTER))
            .and_then(Value::as_str)
            .filter(|c| *c != crate::clusters::LOCAL)
            .map(str::to_owned);
        Some(key)
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " {ns}/{}", self.name)?,
            None => write!(f, " {}", self.name)?,
        }
        match &self.cluster {
            Some(cluster) => write!(f, " in cluster {cluster}"),
            None => Ok(()),
        }
    }
}

/// What the cluster holds that this parent's plan may read: every object
/// trellis manages for it (found through the `trellis.dev/*` labels), and
/// where `related:` entries are looked up.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub objects: BTreeMap<ObjectKey, Value>,
    /// Where related objects come from. `None` (offline): from `objects`,
    /// which then hold them next to the children.
    pub related: Option<Arc<dyn RelatedSource>>,
}

/// A store of related objects the planner asks per read, so that only what
/// a read names or selects is handed over, never a whole cache (the
/// operator's watch caches implement it).
pub trait RelatedSource: Send + Sync {
    /// The objects of `gvk` that `read` covers: the one it names (or none),
    /// or every one its selector matches, in any order; or why the source
    /// cannot tell (outside what it watches, an object it cannot decode).
    fn find(&self, gvk: &Gvk, read: &RelatedRead) -> Result<Vec<(ObjectKey, Value)>, Unreadable>;

    /// Whether `gvk` is served at all. Asked before anything else of an
    /// entry, since an unserved kind's scope is unknown.
    fn served(&self, _gvk: &Gvk) -> Result<(), Unreadable> {
        Ok(())
    }

    /// [`RelatedSource::find`] in the spoke `cluster` (a related entry
    /// with `cluster:`); a source that reads no spoke says so.
    fn find_in(
        &self,
        cluster: &str,
        _gvk: &Gvk,
        _read: &RelatedRead,
    ) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
        Err(Unreadable {
            reason: Unreadable::CLUSTER_NOT_READ,
            message: format!(
                "related objects are not read from other clusters here (cluster \"{cluster}\")"
            ),
        })
    }

    /// The objects whose `managedFields` name `manager` (a parent's patch
    /// contributions, `trellis/<rule>/<parent uid>`), with their
    /// `managedFields`.
    fn managed_by(&self, _manager: &str) -> Vec<(ObjectKey, Value)> {
        Vec::new()
    }
}

impl std::fmt::Debug for dyn RelatedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelatedSource")
    }
}

impl Observed {
    pub fn from_objects(objects: impl IntoIterator<Item = Value>) -> Observed {
        Observed {
            objects: objects
                .into_iter()
                .filter_map(|o| ObjectKey::placed(&o).map(|k| (k, o)))
                .collect(),
            related: None,
        }
    }

    /// The same children, with related objects read from `source`.
    pub fn with_related(mut self, source: Arc<dyn RelatedSource>) -> Observed {
        self.related = Some(source);
        self
    }

    /// Observed children of `rule` for the parent with `uid`, by child id.
    pub fn children_of(
        &self,
        rule: &str,
        uid: &str,
    ) -> BTreeMap<String, Vec<(&ObjectKey, &Value)>> {
        let mut by_id: BTreeMap<String, Vec<(&ObjectKey, &Value)>> = BTreeMap::new();
        for (key, obj) in &self.objects {
            let label = |name: &str| {
                obj.pointer("/metadata/labels")
                    .and_then(|l| l.get(name))
                    .and_then(Value::as_str)
            };
            if label(LABEL_RULE) == Some(rule)
                && label(LABEL_PARENT_UID).is_none_or(|u| u == uid)
                && let Some(id) = label(LABEL_CHILD)
            {
                by_id.entry(id.to_owned()).or_default().push((key, obj));
            }
        }
        by_id
    }
}

/// Managed fields and the last-applied annotation are never read by rules:
/// keep them out of the evaluation context (and its cost).
pub(super) fn strip_noise(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata") {
        if let Some(fields) = meta.as_object_mut() {
            fields.remove("managedFields");
        }
        strip_noise_annotations(meta);
    }
}

/// A copy of the parent's `metadata` without noise, which is never copied.
pub(super) fn metadata_without_noise(meta: &Value) -> Value {
    let Some(fields) = meta.as_object() else {
        return meta.clone();
    };
    let out = fields
        .iter()
        .filter(|(k, _)| k.as_str() != "managedFields")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut out = Value::Object(out);
    strip_noise_annotations(&mut out);
    out
}

fn strip_noise_annotations(meta: &mut Value) {
    if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
        ann.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}
