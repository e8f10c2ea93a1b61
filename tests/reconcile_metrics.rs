//! `trellis_reconciles_total` tells passes that decided something from
//! passes that were skipped: a paused parent's passes count as `skipped`,
//! never `ok`, so an error rate over all passes is not diluted by them.
mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::json;

use support::faults::{free_address, metric};
use support::operator::{Operator, install_kind, wait_exists};

const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: counted
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
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_parent_s_passes_count_as_skipped_not_ok() {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Counted").await;
    let addr = free_address();
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    options.metrics_addr = Some(addr);
    let operator = Operator::spawn(
        options,
        support::operator::rule_set(&[&kind.rule(RULE)]),
        &ns.client,
    );
    let addr = addr.to_string();
    kind.create(&ns, "held", json!({}), &[("trellis.dev/paused", "true")])
        .await;
    let count = |result: &'static str| {
        let addr = addr.clone();
        async move {
            metric(
                &addr,
                "trellis_reconciles",
                &["rule=\"counted\"", &format!("result=\"{result}\"")],
            )
            .await
        }
    };
    support::eventually(
        "a skipped pass counted",
        std::time::Duration::from_secs(30),
        || async {
            match count("skipped").await {
                n if n >= 1.0 => Ok(n),
                n => Err(n),
            }
        },
    )
    .await;
    assert_eq!(count("ok").await, 0.0, "a paused parent's pass is not ok");

    kind.patch(
        &ns,
        "held",
        json!({"metadata": {"annotations": {"trellis.dev/paused": null}}}),
    )
    .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "held-config").await;
    support::eventually(
        "an ok pass counted",
        std::time::Duration::from_secs(30),
        || async {
            match count("ok").await {
                n if n >= 1.0 => Ok(n),
                n => Err(n),
            }
        },
    )
    .await;
    operator.stop().await;
}
