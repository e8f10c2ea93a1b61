//! `trellis rollout status|promote|abort`: a staged rollout as the cluster
//! keeps it (the revision ConfigMaps in the operator's namespace). `status`
//! only reads; `promote` and `abort` record a decision on the target's
//! ConfigMap, which the leader acts on at its next tick (within seconds).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use super::print_out;
use crate::operator::rollout::versions::{LABEL_REVISION_OF, Stored};
use crate::rollout::{Pause, Phase, Settings};
use crate::rules::model::RolloutSpec;

/// What `trellis rollout` was asked.
#[derive(Debug, Clone)]
pub enum Action {
    Status { rule: Option<String>, json: bool },
    Promote(String),
    Abort(String),
}

pub fn rollout(action: Action, operator_namespace: Option<String>) -> ExitCode {
    let error = ExitCode::from(2);
    let home = crate::operator::home::operator_namespace(operator_namespace.as_deref());
    let result = super::with_cluster(|client| async move {
        match &action {
            Action::Status { rule, json } => {
                let rollouts = read(&client, &home, rule.as_deref()).await?;
                if let Some(rule) = rule
                    && rollouts.is_empty()
                {
                    return Err(format!(
                        "rule {rule} has no rollout recorded in namespace {home} (is it the operator's namespace? --operator-namespace)"
                    ));
                }
                Ok(if *json {
                    serde_json::to_string_pretty(&Value::Array(rollouts)).unwrap_or_default() + "\n"
                } else {
                    table(&rollouts, &home)
                })
            }
            Action::Promote(rule) | Action::Abort(rule) => {
                let what = if matches!(action, Action::Promote(_)) {
                    "promote"
                } else {
                    "abort"
                };
                let name =
                    crate::operator::rollout::versions::decide(&client, &home, rule, what).await?;
                Ok(format!(
                    "{what} of rule {rule} recorded on ConfigMap {home}/{name}; the leader acts on it within seconds\n"
                ))
            }
        }
    });
    match result {
        Ok(text) => match print_out(&text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(code) => code,
        },
        Err(e) => {
            stderr!("error: {e}");
            error
        }
    }
}

/// Each rule's rollout (or only `rule`'s), as `/status` shows it, plus what
/// comes next.
async fn read(
    client: &kube::Client,
    namespace: &str,
    rule: Option<&str>,
) -> Result<Vec<Value>, String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let selector = match rule {
        Some(rule) => format!("{LABEL_REVISION_OF}={rule}"),
        None => LABEL_REVISION_OF.to_owned(),
    };
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("cannot list revision ConfigMaps in namespace {namespace}: {e}"))?;
    let mut by_rule: BTreeMap<String, Vec<Stored>> = BTreeMap::new();
    for cm in &list.items {
        let Some(name) = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_REVISION_OF))
        else {
            continue;
        };
        if let Some(stored) = Stored::decode(cm) {
            by_rule.entry(name.clone()).or_default().push(stored);
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(by_rule
        .iter()
        .filter_map(|(rule, stored)| summary(rule, stored, now))
        .collect())
}

/// One rule's rollout: the record begun last.
fn summary(rule: &str, stored: &[Stored], now: u64) -> Option<Value> {
    let target = stored
        .iter()
        .filter(|s| s.record.is_some())
        .max_by_key(|s| s.record.as_ref().map(|r| r.state.since))?;
    let state = &target.record.as_ref()?.state;
    let settings = target
        .document
        .pointer("/spec/rollout")
        .and_then(|r| serde_json::from_value::<RolloutSpec>(r.clone()).ok())
        .and_then(|r| Settings::compile(&r).ok());
    let steps = settings.as_ref().map(|s| s.steps.len());
    let next = match (state.phase, &settings) {
        (Phase::Complete, _) => "-".to_owned(),
        (Phase::RolledBack, _) => format!("{} failed: edit the rule to try again", state.to),
        (Phase::Halted, _) => "promote (resume) or abort".to_owned(),
        (Phase::Paused, Some(s)) => match s.steps.get(state.step).map(|st| st.pause) {
            Some(Pause::Manual) => "on promote".to_owned(),
            _ => match state.resume_at(s) {
                Some(at) => format!(
                    "in {}",
                    humantime::format_duration(Duration::from_secs(at.saturating_sub(now)))
                ),
                None => "soon".to_owned(),
            },
        },
        (Phase::Progressing, _) => "once the step's parents are healthy".to_owned(),
        (Phase::Paused, None) => "?".to_owned(),
    };
    let since = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(state.since));
    Some(json!({
        "rule": rule,
        "from": state.from,
        "to": state.to,
        "between": state.between,
        "step": state.step + 1,
        "steps": steps,
        "moved": state.moved.len(),
        "total": state.total,
        "failed": state.failed.len(),
        "state": state.phase.as_str(),
        "since": since.to_string(),
        "next": next,
    }))
}

/// The readable table.
fn table(rollouts: &[Value], namespace: &str) -> String {
    if rollouts.is_empty() {
        return format!("no rollout recorded in namespace {namespace}\n");
    }
    let header = [
        "RULE",
        "FROM → TO",
        "STEP",
        "MOVED/TOTAL",
        "FAILED",
        "STATE",
        "SINCE",
        "NEXT",
    ];
    let rows: Vec<[String; 8]> = rollouts
        .iter()
        .map(|r| {
            let s = |k: &str| match &r[k] {
                Value::String(s) => s.clone(),
                Value::Null => "?".to_owned(),
                other => other.to_string(),
            };
            [
                s("rule"),
                format!("{} → {}", s("from"), s("to")),
                format!("{}/{}", s("step"), s("steps")),
                format!("{}/{}", s("moved"), s("total")),
                s("failed"),
                s("state"),
                s("since"),
                s("next"),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            out.push_str(cell);
            if i + 1 < cells.len() {
                out.push_str(&" ".repeat(w - cell.chars().count() + 2));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lines_up_and_says_what_comes_next() {
        let rows = vec![json!({
            "rule": "webapp", "from": "aaaaaaaaaa", "to": "bbbbbbbbbb", "step": 1, "steps": 3,
            "moved": 2, "total": 7, "failed": 0, "state": "Paused",
            "since": "2026-12-02T08:00:00Z", "next": "on promote",
        })];
        let text = table(&rows, "trellis");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("RULE    FROM → TO"), "{text}");
        assert!(lines[1].contains("aaaaaaaaaa → bbbbbbbbbb  1/3"), "{text}");
        assert!(lines[1].contains("2/7"), "{text}");
        assert!(lines[1].ends_with("on promote"), "{text}");
        assert_eq!(
            lines[0].find("STATE"),
            lines[1].find("Paused"),
            "columns line up:\n{text}"
        );
    }
}
