//! Drift: does a live object still hold what trellis rendered for it?
//!
//! A child needs an apply only when a field trellis sets differs from the
//! live object, not when anything else changed: the controller manager
//! annotates Deployments, the API server defaults fields, controllers write
//! status. So the rendered object is compared as a *subset* of the live one,
//! after normalizing what the API server normalizes (numbers, quantities,
//! int-or-string values, empty values it drops, a Secret's `stringData`).
//!
//! A field removed from the template is not visible this way (the live
//! object still has it); that is what the render-hash annotation is for:
//! the caller applies whenever the hash recorded on the live object is not
//! the hash of this rendering. Where this comparison cannot tell, it says
//! "drifted": one apply too many is the safe side.

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::render::parse_quantity as quantity;

/// True when `live` no longer holds every field of `rendered`.
pub fn drifted(rendered: &Value, live: &Value) -> bool {
    let mut rendered = secret_string_data_as_data(rendered);
    // Which version last wrote the child is bookkeeping, not its content:
    // a rule edit that leaves a child's rendering as it was writes nothing
    // to it (the parent's `status.ruleRevision` says which version it runs).
    if let Some(labels) = rendered
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.shift_remove(crate::labels::LABEL_REVISION);
    }
    !holds(live, &rendered)
}

/// Whether `live` holds `want`: every key of a map, every element of a list
/// (in order, each held in turn), every scalar equal after normalization.
fn holds(live: &Value, want: &Value) -> bool {
    match (want, live) {
        (Value::Object(w), Value::Object(l)) => w.iter().all(|(k, wv)| match l.get(k) {
            Some(lv) => holds(lv, wv),
            None => absent_is_fine(wv),
        }),
        (Value::Object(w), Value::Null) => w.values().all(absent_is_fine),
        (Value::Array(w), Value::Array(l)) => {
            w.len() == l.len() && w.iter().zip(l).all(|(wv, lv)| holds(lv, wv))
        }
        (Value::Array(w), Value::Null) => w.is_empty(),
        (Value::Null, Value::Null) => true,
        (w, l) => scalar_eq(w, l),
    }
}

/// A rendered value the API server stores as nothing: `null` (SSA: unset),
/// an empty map, an empty list, maps of only such values.
fn absent_is_fine(want: &Value) -> bool {
    match want {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.values().all(absent_is_fine),
        _ => false,
    }
}

fn scalar_eq(want: &Value, live: &Value) -> bool {
    if want == live {
        return true;
    }
    match (want, live) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        // int-or-string fields (ports, maxSurge): "80" and 80 are one value.
        (Value::String(s), Value::Number(n)) | (Value::Number(n), Value::String(s)) => {
            s.parse::<f64>().ok() == n.as_f64()
        }
        // "1000m" is stored as "1", "1024Mi" as "1Gi". Two plain numbers
        // are left to string equality ("007" is not "7" in a label).
        (Value::String(a), Value::String(b)) if suffixed(a) || suffixed(b) => {
            match (quantity(a), quantity(b)) {
                (Some(x), Some(y)) => (x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()),
                _ => false,
            }
        }
        _ => false,
    }
}

fn suffixed(s: &str) -> bool {
    s.ends_with(|c: char| c.is_ascii_alphabetic())
}

/// A Secret's `stringData` is write-only: the live object has it base64
/// encoded under `data`. Compare it there.
fn secret_string_data_as_data(rendered: &Value) -> Value {
    let mut out = rendered.clone();
    let Some(obj) = out.as_object_mut() else {
        return out;
    };
    if obj.get("kind").and_then(Value::as_str) != Some("Secret") {
        return out;
    }
    let Some(Value::Object(strings)) = obj.shift_remove("stringData") else {
        return out;
    };
    let data = obj
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(data) = data {
        for (k, v) in strings {
            if let Some(s) = v.as_str() {
                let encoded = base64::engine::general_purpose::STANDARD.encode(s);
                data.insert(k, Value::String(encoded));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "labels": {"app": "web"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "app", "image": "nginx", "ports": [{"containerPort": 80}],
                 "resources": {"limits": {"cpu": "1000m", "memory": "1024Mi"}}}
            ]}}}
        })
    }

    #[test]
    fn foreign_changes_are_not_drift() {
        let mut live = deployment();
        live["metadata"]["annotations"] = json!({"deployment.kubernetes.io/revision": "1"});
        live["metadata"]["resourceVersion"] = json!("42");
        live["status"] = json!({"availableReplicas": 2});
        live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!("Always");
        live["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] = json!("TCP");
        live["spec"]["strategy"] = json!({"type": "RollingUpdate"});
        assert!(!drifted(&deployment(), &live));
    }

    #[test]
    fn a_changed_managed_field_is_drift() {
        let mut live = deployment();
        live["spec"]["replicas"] = json!(5);
        assert!(drifted(&deployment(), &live));
        let mut live = deployment();
        live["metadata"]["labels"]["app"] = json!("other");
        assert!(drifted(&deployment(), &live));
        let mut live = deployment();
        live["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil");
        assert!(drifted(&deployment(), &live));
    }

    #[test]
    fn a_managed_field_removed_from_the_live_object_is_drift() {
        let mut live = deployment();
        live["metadata"]["labels"]
            .as_object_mut()
            .expect("labels")
            .remove("app");
        assert!(drifted(&deployment(), &live));
        let mut live = deployment();
        live["spec"]["template"]["spec"]["containers"] = json!([]);
        assert!(drifted(&deployment(), &live));
    }

    #[test]
    fn quantities_are_compared_as_the_api_server_normalizes_them() {
        let mut live = deployment();
        live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] =
            json!({"cpu": "1", "memory": "1Gi"});
        assert!(!drifted(&deployment(), &live));
        live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] =
            json!("2");
        assert!(drifted(&deployment(), &live));
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("1Gi"), Some(1_073_741_824.0));
        assert_eq!(quantity("web"), None);
        assert_eq!(quantity("m"), None);
    }

    #[test]
    fn int_or_string_and_number_forms_are_one_value() {
        let want = json!({"spec": {"ports": [{"port": 80, "targetPort": "8080"}], "x": 1.0}});
        let live = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}], "x": 1}});
        assert!(!drifted(&want, &live));
        let live = json!({"spec": {"ports": [{"port": 80, "targetPort": "http"}], "x": 1}});
        assert!(drifted(&want, &live));
    }

    #[test]
    fn empty_and_null_values_the_api_server_drops_are_not_drift() {
        let want = json!({"metadata": {"annotations": {}, "labels": {"a": "b"}}, "data": null, "items": []});
        let live = json!({"metadata": {"labels": {"a": "b"}}});
        assert!(!drifted(&want, &live));
    }

    #[test]
    fn a_secret_string_data_is_compared_with_its_data() {
        let want = json!({"kind": "Secret", "stringData": {"password": "hunter2"}});
        let live =
            json!({"kind": "Secret", "data": {"password": "aHVudGVyMg=="}, "type": "Opaque"});
        assert!(!drifted(&want, &live));
        let live = json!({"kind": "Secret", "data": {"password": "b3RoZXI="}});
        assert!(drifted(&want, &live));
    }

    #[test]
    fn strings_that_only_look_alike_are_different() {
        assert!(drifted(&json!({"a": "007"}), &json!({"a": "7"})));
        assert!(drifted(&json!({"a": "true"}), &json!({"a": true})));
    }
}
