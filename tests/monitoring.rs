//! The Grafana dashboard and the Prometheus alerts (deploy/monitoring/, and
//! their copies in the Helm chart) name only metrics a running trellis
//! exports: a `trellis run` process is started on the example rules, its
//! `/metrics` scraped, and every `trellis_*` name in a panel query, a
//! template variable or an alert expression must be one of them. Every alert
//! has a runbook section in docs/operations.md.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use regex::Regex;
use serde_json::Value;
use support::process::Replica;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every name a Prometheus query may use for the metrics in an exposition:
/// each sample's name, and for each `# TYPE` the names its samples take
/// (a family with no sample yet is still declared).
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["_sum", "_count", ""],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// The queries of a Grafana dashboard: `expr` of every target, the
/// `query`/`definition` of every template variable. (where, query)
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(map) => {
                let title = map.get("title").and_then(Value::as_str).unwrap_or(at);
                let name = map.get("name").and_then(Value::as_str).unwrap_or(title);
                for (k, child) in map {
                    match (k.as_str(), child) {
                        ("expr" | "definition", Value::String(q)) => {
                            out.push((name.to_string(), q.clone()))
                        }
                        ("query", Value::String(q)) if q.contains('(') => {
                            out.push((name.to_string(), q.clone()))
                        }
                        _ => walk(child, name, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, at, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, "dashboard", &mut out);
    out
}

/// (alert name, expression, runbook) of every alert in a rule file.
fn alerts(text: &str) -> Vec<(String, String, String)> {
    let file: Value = serde_saphyr::from_str(text).expect("alerts.yaml is YAML");
    file["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["alert"].as_str().expect("alert name").to_string(),
                r["expr"].as_str().expect("expr").to_string(),
                r["annotations"]["runbook"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// The metric names (trellis_*) a query mentions.
fn named_metrics(query: &str) -> BTreeSet<String> {
    let re = Regex::new(r"\btrellis_[A-Za-z0-9_]+").unwrap();
    re.find_iter(query)
        .map(|m| m.as_str().to_string())
        .collect()
}

/// A rule whose children are ConfigMaps named by the parent's spec: a good
/// name reconciles, a bad one is refused by the API server (422). With
/// `rollout:`, its first version is kept and its rollout state published.
const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: mon
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  rollout:
    steps: [{percent: 50}]
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ spec.name }}
        data:
          x: "1"
"#;

/// Another kind served as a ServiceAccount that does not exist: Inactive.
const RULE_AS_NOBODY: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: mon-nobody
spec:
  serviceAccountName: nobody
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ spec.name ~ "-nobody" }}
"#;

/// A rule that does not validate (its template does not parse).
const RULE_BROKEN: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: mon-broken
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: "metadata: {name: {{ spec.name"
"#;

/// Every `trellis_*` name the dashboard and the alerts use, with where.
fn referenced() -> (Vec<(String, String)>, Vec<String>) {
    let dashboard: Value = serde_json::from_str(&read(
        &repo().join("deploy/monitoring/trellis-dashboard.json"),
    ))
    .expect("the dashboard is JSON");
    let mut uses = Vec::new();
    let mut blind = Vec::new();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 15, "only {} queries found", queries.len());
    for (at, query) in queries {
        let names = named_metrics(&query);
        if names.is_empty() {
            blind.push(format!("dashboard {at}: {query}"));
        }
        uses.extend(names.into_iter().map(|n| (format!("dashboard {at}"), n)));
    }
    let alerts = alerts(&read(&repo().join("deploy/monitoring/alerts.yaml")));
    assert!(alerts.len() >= 6, "{} alerts", alerts.len());
    for (alert, expr, _) in alerts {
        let names = named_metrics(&expr);
        if names.is_empty() {
            blind.push(format!("alert {alert}: {expr}"));
        }
        uses.extend(names.into_iter().map(|n| (format!("alert {alert}"), n)));
    }
    (uses, blind)
}

#[tokio::test]
async fn the_dashboard_and_the_alerts_name_only_metrics_a_running_trellis_exports() {
    let (uses, blind) = referenced();
    assert!(
        blind.is_empty(),
        "queries that name no trellis metric:\n{}",
        blind.join("\n")
    );

    // A running trellis, driven through what makes each family appear (a
    // family with no sample yet is not in the exposition at all): a rule
    // waiting for its kind, then running; a parent reconciled, one refused
    // by the API server, a rule whose account does not exist, a rule change
    // that does not validate.
    let ns = support::namespace().await;
    // Mon's CRD comes after the start: the rule waits, then runs.
    let kind = support::operator::TestKind::new("Mon");
    let _cleanup = support::operator::Cleanup::crds(&[&kind]);
    let (other, _cleanup_other) = support::operator::install_kind(&ns, "Other").await;
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("mon.yaml"), kind.rule(RULE)).unwrap();
    std::fs::write(rules.join("nobody.yaml"), other.rule(RULE_AS_NOBODY)).unwrap();
    let replica = Replica::start("monitoring", &ns, dir.path(), &["--reload-poll=1s"]);
    let state_of = |rule: &str, state: &str| {
        format!("trellis_rule_state{{rule=\"{rule}\",state=\"{state}\"}} 1")
    };
    let waiting = state_of("mon", "waiting");
    support::eventually(
        "rule mon waiting for its kind",
        support::operator::WAIT,
        || async {
            let text = support::http_get(replica.addr, "/metrics").await?;
            if text.contains(&waiting) {
                Ok(())
            } else {
                Err(text)
            }
        },
    )
    .await;
    kind.install(&ns.client).await;
    kind.create(&ns, "good", serde_json::json!({"name": "good-config"}), &[])
        .await;
    kind.create(&ns, "bad", serde_json::json!({"name": "Not_A_Name"}), &[])
        .await;
    support::eventually(
        "the good parent's child",
        support::operator::WAIT,
        || async {
            let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = ns.api();
            cms.get("good-config").await.map_err(|e| e.to_string())
        },
    )
    .await;
    std::fs::write(rules.join("broken.yaml"), kind.rule(RULE_BROKEN)).unwrap();

    let wanted: BTreeSet<String> = uses.iter().map(|(_, n)| n.clone()).collect();
    let scrape = || async {
        let text = support::http_get(replica.addr, "/metrics").await?;
        let exported = exported_names(&text);
        let missing: Vec<&(String, String)> =
            uses.iter().filter(|(_, n)| !exported.contains(n)).collect();
        if missing.is_empty() {
            Ok(exported)
        } else {
            Err(format!(
                "named but not exported: {missing:?}\nexported: {exported:?}\n{}",
                replica.log_tail()
            ))
        }
    };
    let exported = support::eventually(
        "every metric the dashboard and the alerts name in /metrics",
        support::operator::WAIT,
        scrape,
    )
    .await;
    assert!(wanted.is_subset(&exported));
    // One state per rule: the waiting series went when mon started running.
    let text = support::http_get(replica.addr, "/metrics").await.unwrap();
    for want in [
        state_of("mon", "running"),
        state_of("mon-nobody", "inactive"),
    ] {
        assert!(text.contains(&want), "no `{want}` in /metrics:\n{text}");
    }
    let states: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("trellis_rule_state{rule=\"mon\""))
        .collect();
    assert_eq!(
        states.len(),
        1,
        "rule mon has several state series: {states:?}"
    );
    assert!(
        wanted.len() >= 12,
        "only {} metrics named: {wanted:?}",
        wanted.len()
    );
}

#[test]
fn every_alert_has_a_runbook_in_docs_operations_md() {
    let operations = read(&repo().join("docs/operations.md"));
    let headings: BTreeSet<String> = operations
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().to_lowercase())
        .collect();
    for (alert, _, runbook) in alerts(&read(&repo().join("deploy/monitoring/alerts.yaml"))) {
        assert_eq!(
            runbook,
            format!("docs/operations.md#{}", alert.to_lowercase()),
            "alert {alert}: its runbook link"
        );
        assert!(
            headings.contains(&alert.to_lowercase()),
            "docs/operations.md has no runbook heading `{alert}`"
        );
    }
}

#[test]
fn the_charts_dashboard_and_alerts_are_deploy_monitorings() {
    for (copy, original) in [
        (
            "charts/trellis/dashboards/trellis.json",
            "deploy/monitoring/trellis-dashboard.json",
        ),
        (
            "charts/trellis/files/alerts.yaml",
            "deploy/monitoring/alerts.yaml",
        ),
    ] {
        assert_eq!(
            read(&repo().join(copy)),
            read(&repo().join(original)),
            "{copy} differs from {original}: regenerate it with `charts/regenerate`"
        );
    }
}

#[test]
fn the_scrape_parser_knows_counters_histograms_and_gauges() {
    let text = "# TYPE trellis_a counter\n# TYPE trellis_h histogram\n\
                # TYPE trellis_g gauge\ntrellis_g 1\ntrellis_x{a=\"b\"} 2\n";
    let names = exported_names(text);
    for want in [
        "trellis_a_total",
        "trellis_h_bucket",
        "trellis_h_sum",
        "trellis_h_count",
        "trellis_g",
        "trellis_x",
    ] {
        assert!(names.contains(want), "{want} in {names:?}");
    }
    assert!(
        !names.contains("trellis_a"),
        "a counter's samples end in _total"
    );
    assert_eq!(
        named_metrics("sum(rate(trellis_a_total[5m])) / trellis_g"),
        BTreeSet::from(["trellis_a_total".to_string(), "trellis_g".to_string()])
    );
}
