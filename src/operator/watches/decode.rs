//! Parents as the watch decodes them: an object that cannot be decoded is
//! kept as its metadata and the reason, never an error of the whole list.
//!
//! A parent author controls everything under `spec`. Under
//! `x-kubernetes-preserve-unknown-fields` the API server stores a spec
//! nested 200 deep, which serde_json refuses (its recursion limit is 128).
//! Decoded as one `DynamicObject`, such a parent fails the whole LIST of its
//! kind, and with it every other parent of the rule, on every relist. Here
//! each object is first taken as raw JSON (a scan with no recursion), then
//! decoded on its own; if that fails, its metadata (and status, when it
//! decodes) are kept with the reason, so the object can be reported on and
//! skipped while its kind's watch goes on.

use std::sync::Arc;

use kube::api::{ApiResource, DynamicObject};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::compact::{CompactObject, RawMap};

/// A parent (or a related object) from a watch or a response, kept as the
/// children are (see `compact`): typed metadata and the text of the rest,
/// parsed when a pass reads it. `status` is apart, so that what wakes a
/// parent (anything but its status) is one string to hash. Unless
/// `undecodable` says why, the text holds the whole object; then it holds
/// nothing but, if it decoded, the status.
#[derive(Debug, Clone)]
pub struct ParentObject {
    /// Types, metadata and every field but `status`.
    pub object: CompactObject,
    status: Option<Box<RawValue>>,
    pub undecodable: Option<String>,
}

impl ParentObject {
    /// Decodes one object's JSON text, keeping what it can: the top level
    /// and `metadata` are split into raw values by a scan that does not
    /// recurse; `managedFields` (which mirror the spec's depth) are dropped,
    /// as the caches drop them anyway; every other field is decoded on its
    /// own (and the value dropped: the text is kept), so only the fields
    /// too deep to decode are lost.
    pub fn from_json(text: &str) -> Result<ParentObject, serde_json::Error> {
        let mut top: RawMap = serde_json::from_str(text)?;
        let mut undecodable = None;
        let mut bad = Vec::new();
        for (key, raw) in &top {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            // A Value, not `IgnoredAny`: serde_json skips ignored values
            // without its recursion limit, and a pass parses this text again.
            if let Err(err) = serde_json::from_str::<Value>(raw.get()) {
                undecodable = Some(describe(key, &err));
                bad.push(key.clone());
            }
        }
        for key in bad {
            top.remove(&key);
        }
        let status = top.remove("status");
        if undecodable.is_some() {
            // Without the whole spec nothing may be rendered from it.
            top.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
        }
        Ok(ParentObject {
            object: CompactObject::from_fields_whole(top)?,
            status,
            undecodable,
        })
    }

    /// The object whole (what of it decoded), as a pass reads it.
    pub fn to_value(&self) -> Value {
        let mut value = self.object.to_value();
        if let (Some(status), Value::Object(map)) = (self.status_value(), &mut value) {
            map.insert("status".into(), status);
        }
        value
    }

    /// The object whole, typed as the clients take it.
    pub fn to_object(&self) -> DynamicObject {
        let mut data = Map::new();
        // Text validated when it was decoded: it parses again.
        if let Ok(Value::Object(rest)) = serde_json::from_str(self.object.rest_text()) {
            data = rest;
        }
        if let Some(status) = self.status_value() {
            data.insert("status".into(), status);
        }
        DynamicObject {
            types: self.object.types.as_deref().cloned(),
            metadata: self.object.full_metadata(),
            data: Value::Object(data),
        }
    }

    /// `status`, if the object has one.
    pub fn status_value(&self) -> Option<Value> {
        self.status
            .as_ref()
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
    }

    /// The text of every field but types, metadata and status: what a
    /// change of the parent (other than of its status) changes.
    pub fn outside_status_text(&self) -> &str {
        self.object.rest_text()
    }
}

/// serde_json's message, in the words a parent author needs.
fn describe(field: &str, err: &serde_json::Error) -> String {
    let text = err.to_string();
    if text.contains("recursion limit") {
        format!("{field} nests deeper than trellis decodes (128 levels): {text}")
    } else {
        format!("{field} does not decode: {text}")
    }
}

/// A kind's `ApiResource` shared, as the dynamic type of the cache object
/// types: kube copies the dynamic type into every cache key and every
/// queue and scheduler entry (`ObjectRef`), and `ApiResource` is five
/// strings, about 250 bytes each copy; 40,000 keys at 10,000 parents held
/// about 10 MiB of copies. This is one pointer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SharedResource(Arc<ApiResource>);

impl From<ApiResource> for SharedResource {
    fn from(resource: ApiResource) -> Self {
        SharedResource(Arc::new(resource))
    }
}

/// The dynamic type of `DynamicObject` ([`Resolved::api`](super::discovery::Resolved::api)).
impl AsRef<ApiResource> for SharedResource {
    fn as_ref(&self) -> &ApiResource {
        &self.0
    }
}

/// The dynamic type of the cache object types.
impl AsRef<SharedResource> for SharedResource {
    fn as_ref(&self) -> &SharedResource {
        self
    }
}

impl std::ops::Deref for SharedResource {
    type Target = ApiResource;
    fn deref(&self) -> &ApiResource {
        &self.0
    }
}

/// `Deserialize` (through the type's `from_json`, from the raw text) and
/// `Resource` (a kind found at run time: its dynamic type is the
/// kind's `ApiResource`, as for `DynamicObject`, but shared) for a cache object type whose
/// `ObjectMeta` is at `$meta`.
macro_rules! raw_decoded_resource {
    ($t:ty, $($meta:ident).+) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let raw = <Box<serde_json::value::RawValue> as serde::Deserialize>::deserialize(
                    deserializer,
                )?;
                <$t>::from_json(raw.get()).map_err(serde::de::Error::custom)
            }
        }

        impl kube::Resource for $t {
            type DynamicType = $crate::operator::watches::decode::SharedResource;
            type Scope = kube::core::DynamicResourceScope;

            fn group(dt: &$crate::operator::watches::decode::SharedResource) -> std::borrow::Cow<'_, str> {
                <kube::api::DynamicObject as kube::Resource>::group(dt)
            }
            fn version(dt: &$crate::operator::watches::decode::SharedResource) -> std::borrow::Cow<'_, str> {
                <kube::api::DynamicObject as kube::Resource>::version(dt)
            }
            fn kind(dt: &$crate::operator::watches::decode::SharedResource) -> std::borrow::Cow<'_, str> {
                <kube::api::DynamicObject as kube::Resource>::kind(dt)
            }
            fn api_version(dt: &$crate::operator::watches::decode::SharedResource) -> std::borrow::Cow<'_, str> {
                <kube::api::DynamicObject as kube::Resource>::api_version(dt)
            }
            fn plural(dt: &$crate::operator::watches::decode::SharedResource) -> std::borrow::Cow<'_, str> {
                <kube::api::DynamicObject as kube::Resource>::plural(dt)
            }
            fn meta(&self) -> &kube::api::ObjectMeta {
                &self.$($meta).+
            }
            fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
                &mut self.$($meta).+
            }
        }
    };
}
pub(in crate::operator) use raw_decoded_resource;

raw_decoded_resource!(ParentObject, object.metadata);

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    }

    fn object(name: &str, spec: &str) -> String {
        format!(
            r#"{{"apiVersion":"demo/v1","kind":"App","metadata":{{"name":"{name}","namespace":"ns","uid":"u-{name}"}},"spec":{spec},"status":{{"x":1}}}}"#
        )
    }

    #[test]
    fn a_plain_object_decodes_whole() {
        let p = ParentObject::from_json(&object("a", r#"{"image":"nginx"}"#)).expect("decodes");
        assert_eq!(p.undecodable, None);
        assert_eq!(p.to_value()["spec"]["image"], "nginx");
    }

    #[test]
    fn a_deep_object_keeps_its_metadata_and_status_and_says_why() {
        let p = ParentObject::from_json(&object("deep", &nested(200))).expect("skeleton");
        let why = p.undecodable.clone().expect("undecodable");
        assert!(why.contains("128 levels"), "{why}");
        assert_eq!(p.object.metadata.name.as_deref(), Some("deep"));
        assert_eq!(p.object.metadata.uid.as_deref(), Some("u-deep"));
        assert_eq!(p.to_value()["status"]["x"], 1);
        assert!(p.to_value().get("spec").is_none());
        assert!(p.to_object().data.get("spec").is_none());
    }

    #[test]
    fn one_deep_object_does_not_fail_a_list_of_many() {
        let list = format!(
            "[{},{},{}]",
            object("a", "{}"),
            object("deep", &nested(5000)),
            object("b", "{}")
        );
        let items: Vec<ParentObject> = serde_json::from_str(&list).expect("list decodes");
        let bad: Vec<_> = items.iter().filter(|p| p.undecodable.is_some()).collect();
        assert_eq!(items.len(), 3);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].object.metadata.name.as_deref(), Some("deep"));
    }

    #[test]
    fn malformed_metadata_is_still_an_error() {
        assert!(ParentObject::from_json(r#"{"metadata": 5}"#).is_err());
        assert!(ParentObject::from_json("[]").is_err());
    }

    #[test]
    fn deep_managed_fields_are_dropped_not_fatal() {
        let fields = nested(300);
        let text = format!(
            r#"{{"apiVersion":"demo/v1","kind":"App","metadata":{{"name":"a","managedFields":[{{"manager":"m","fieldsV1":{fields}}}]}},"spec":{{"x":1}}}}"#
        );
        let p = ParentObject::from_json(&text).expect("decodes");
        assert_eq!(p.undecodable, None);
        assert_eq!(p.to_object().data["spec"]["x"], 1);
        assert_eq!(p.object.metadata.managed_fields, None);
    }

    #[test]
    fn a_parent_reads_back_whole_and_its_status_is_kept_apart() {
        let text = object("a", r#"{"image":"nginx"}"#);
        let p = ParentObject::from_json(&text).expect("decodes");
        let whole: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(p.to_value(), whole);
        assert_eq!(serde_json::to_value(p.to_object()).expect("json"), whole);
        assert_eq!(p.status_value(), Some(serde_json::json!({"x": 1})));
        assert!(!p.outside_status_text().contains("status"));
        let restatused =
            ParentObject::from_json(&text.replace(r#"{"x":1}"#, r#"{"x":2}"#)).expect("decodes");
        assert_eq!(p.outside_status_text(), restatused.outside_status_text());
        let edited =
            ParentObject::from_json(&object("a", r#"{"image":"httpd"}"#)).expect("decodes");
        assert_ne!(p.outside_status_text(), edited.outside_status_text());
    }
}
