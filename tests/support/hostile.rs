//! The hostile-parent fixture shared by `tests/faults_hostile.rs` (which
//! asserts each outcome) and `benches/hostile.rs` (which measures the
//! operator's memory meanwhile): the rule both run and the deep spec.

use serde_json::{Value, json};

/// One ConfigMap per parent, whose data come from the spec.
pub const ECHO_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: echo
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
        data:
          text: {{ spec.text | default("none") }}
          next: {{ ((spec.n | default(1)) + 1) | string }}
    - id: items
      apiVersion: v1
      kind: ConfigMap
      forEach: "spec.items | default([])"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-item-" ~ index }}
        data:
          item: {{ item }}
"#;

/// A spec value nested `depth` objects deep.
pub fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = json!({ "a": v });
    }
    v
}
