//! Hot reload in the running operator: the rules directories watched, each
//! change partitioned into the rules that validate (put in force) and those
//! that keep their last good version, and, under `--manage-crds`, the rules
//! whose CRD change is breaking held back.

use std::collections::BTreeMap;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Options, Shared, crds, lock, supervisor};
use crate::rules::RuleSet;

/// Watches the rules directories and swaps in every rule that validates.
pub(super) async fn reload_loop(
    options: &Options,
    shared: &Shared,
    supervisor: &mut supervisor::Supervisor,
    shutdown: &CancellationToken,
) {
    let mut wake =
        crate::reload::watch(&options.rules, options.reload_debounce, options.reload_poll);
    // Empty, so the first pass re-reads the rules once: they may have changed
    // between the initial load and the start of the watch, and a partly
    // broken initial set is reported from here.
    let mut seen = String::new();
    let mut first = true;
    {
        let mut status = lock(&shared.reload);
        status.rules = supervisor.current().rules.len();
    }
    loop {
        if !std::mem::take(&mut first) {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                woke = wake.recv() => if woke.is_none() { return },
            }
        }
        let now = crate::reload::fingerprint(&options.rules);
        if now == seen {
            continue;
        }
        let initial = seen.is_empty();
        seen = now;
        let started = std::time::Instant::now();
        let loaded = load(options);
        let partition = crate::reload::partition(supervisor.current(), loaded);
        let rejected = partition.has_errors();
        if initial
            && !rejected
            && crate::reload::diff(supervisor.current(), &partition.set).is_empty()
        {
            continue;
        }
        for w in &partition.set.warnings {
            warn!("{w}");
        }
        if rejected {
            for d in partition
                .diagnostics
                .iter()
                .filter(|d| d.severity == crate::rules::Severity::Error)
            {
                tracing::error!("{d}");
            }
            for name in partition.rejected.keys() {
                if supervisor.current().get(name).is_some() {
                    warn!(rule = %name, "rule change rejected: the rule keeps its last good version");
                } else {
                    warn!(rule = %name, "rule rejected: not started");
                }
            }
        }
        let rejected_rules: BTreeMap<String, Vec<String>> = partition
            .rejected
            .iter()
            .map(|(name, diags)| (name.clone(), diags.iter().map(|d| d.to_string()).collect()))
            .collect();
        let unattributed: Vec<String> = partition
            .unattributed
            .iter()
            .map(|d| d.to_string())
            .collect();
        let error_text = rejected.then(|| {
            partition
                .diagnostics
                .iter()
                .filter(|d| d.severity == crate::rules::Severity::Error)
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        });
        let set = hold_breaking(options, shared, supervisor.current(), partition.set).await;
        let count = set.rules.len();
        shared.put_in_force(&set);
        supervisor.apply(set).await;
        let mut status = lock(&shared.reload);
        for gone in status
            .rejected
            .keys()
            .filter(|n| !rejected_rules.contains_key(*n))
        {
            shared
                .metrics
                .rule_rejected
                .remove(&crate::telemetry::RuleLabel { rule: gone.clone() });
        }
        for name in rejected_rules.keys() {
            shared
                .metrics
                .rule_rejected
                .get_or_create(&crate::telemetry::RuleLabel { rule: name.clone() })
                .set(1);
        }
        status.at = Some(crate::clock::now_rfc3339());
        status.rules = count;
        status.rejected = rejected_rules;
        status.unattributed = unattributed;
        status.error = error_text;
        let result = if rejected {
            status.failures += 1;
            shared.metrics.reload_ok.set(0);
            warn!(
                rejected = status.rejected.len(),
                unattributed = status.unattributed.len(),
                rules = count,
                took = ?started.elapsed(),
                "rule change partly rejected: every rule that validates is in force"
            );
            "failure"
        } else {
            status.successes += 1;
            shared.metrics.reload_ok.set(1);
            info!(rules = count, took = ?started.elapsed(), "rules reloaded");
            "success"
        };
        shared
            .metrics
            .reloads
            .get_or_create(&crate::telemetry::OutcomeLabel {
                result: result.into(),
            })
            .inc();
    }
}

/// Under `--manage-crds`, `set` without the rule versions whose CRD change
/// is breaking (each keeps its version in `last_good`), recorded for
/// `/status` and the rule-state gauge.
pub(super) async fn hold_breaking(
    options: &Options,
    shared: &Shared,
    last_good: &RuleSet,
    set: RuleSet,
) -> RuleSet {
    if !options.manage_crds {
        return set;
    }
    let (set, held) = crds::hold::hold_breaking(&shared.client, last_good, set).await;
    shared.set_held(held);
    set
}

/// Reads the rules directories, a rule without an account counting as
/// broken under `--require-service-account`.
pub(super) fn load(options: &Options) -> crate::rules::Loaded {
    let mut loaded = crate::rules::Loaded::read(&options.rules, options.limits);
    if options.require_service_account {
        loaded.require_service_account();
    }
    loaded
}
