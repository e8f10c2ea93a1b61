//! The election itself: [`Elector`] runs the campaign, a loop around the
//! Lease crate and a watch on the Lease that opens and closes the
//! [`Gate`]. Apart from the gate and the settings because this is the part
//! that talks to the API server.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Gate, Settings};
use crate::operator::lock;
use crate::telemetry::{LeaderStatus, Metrics};

/// Until when the Lease, as seen, lets `identity` write: its own last
/// renewal plus the renew deadline; `None` when it names someone else, has
/// no renewal, or that time has passed.
fn fenced_until(
    now: SystemTime,
    identity: &str,
    spec: Option<&LeaseSpec>,
    renew_deadline: Duration,
) -> Option<SystemTime> {
    let spec = spec?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed: SystemTime = spec.renew_time.as_ref()?.0.into();
    let until = renewed.checked_add(renew_deadline)?;
    (now < until).then_some(until)
}

/// Whether a Lease has no holder (released, or never taken).
fn is_free(lease: &Lease) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .is_none_or(str::is_empty)
}

/// A running election; [`Elector::release`] after shutdown hands the Lease on.
pub struct Elector {
    task: JoinHandle<()>,
    release: CancellationToken,
}

impl Elector {
    /// Starts campaigning; the gate opens while this replica leads. On
    /// `shutdown` the gate closes at once; the Lease is released when
    /// [`Elector::release`] is called (once in-flight writes are done), or
    /// a few seconds later at the latest.
    pub fn start(
        client: Client,
        settings: Settings,
        gate: Gate,
        metrics: Arc<Metrics>,
        status: Arc<Mutex<LeaderStatus>>,
        shutdown: CancellationToken,
    ) -> Elector {
        {
            let mut s = lock(&status);
            *s = LeaderStatus {
                enabled: true,
                identity: settings.identity.clone(),
                lease: settings.lease(),
                ..LeaderStatus::default()
            };
        }
        metrics.leader.set(0);
        gate.set(None);
        let release = CancellationToken::new();
        let campaign = Campaign {
            client,
            settings: Arc::new(settings),
            gate,
            metrics,
            status,
        };
        let task = tokio::spawn(campaign.run(shutdown, release.clone()));
        Elector { task, release }
    }

    /// Releases the Lease (if held) and waits for that, a few seconds at most.
    pub async fn release(self) {
        self.release.cancel();
        if tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .is_err()
        {
            warn!("releasing the Lease took too long; the next leader waits for it to expire");
        }
    }
}

/// The outcome of one attempt of the crate's `changed()`.
enum Step {
    /// The crate's view of whether we hold the Lease changed to this.
    Changed(Arc<LeaseManager>, bool),
    Failed(Option<Arc<LeaseManager>>, String),
}

type Attempt = Pin<Box<dyn Future<Output = Step> + Send>>;

struct Campaign {
    client: Client,
    settings: Arc<Settings>,
    gate: Gate,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<LeaderStatus>>,
}

async fn build_manager(client: Client, s: &Settings) -> Result<LeaseManager, String> {
    LeaseManagerBuilder::new(client, &s.lease_name)
        .with_namespace(&s.namespace)
        .with_identity(&s.identity)
        .with_duration(s.lease_duration.as_secs())
        .with_grace(s.grace_seconds())
        .build()
        .await
        .map_err(|e| format!("Lease {}: {e}", s.lease()))
}

impl Campaign {
    /// One wait for the crate to report a change (acquired or lost); a
    /// `manager` of `None` starts from a fresh read of the Lease.
    fn attempt(&self, manager: Option<Arc<LeaseManager>>, delay: Duration) -> Attempt {
        let client = self.client.clone();
        let settings = self.settings.clone();
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            let manager = match manager {
                Some(m) => m,
                None => match build_manager(client, &settings).await {
                    Ok(m) => Arc::new(m),
                    Err(e) => return Step::Failed(None, e),
                },
            };
            match manager.changed().await {
                Ok(held) => Step::Changed(manager, held),
                Err(e) => Step::Failed(Some(manager), format!("Lease {}: {e}", settings.lease())),
            }
        })
    }

    /// Opens the gate until `until` (or closes it) and reports it (log,
    /// gauge, `/status`).
    fn publish(&self, until: Option<SystemTime>, holder: Option<String>) {
        let open = until.is_some();
        let changed = self.gate.set(until);
        self.metrics.leader.set(i64::from(open));
        let mut status = lock(&self.status);
        status.leader = open;
        status.holder = holder;
        if changed {
            status.since = Some(crate::clock::now_rfc3339());
            if open {
                status.terms += 1;
                info!(identity = %self.settings.identity, lease = %self.settings.lease(), "leading: this replica writes");
            } else {
                info!(
                    identity = %self.settings.identity,
                    holder = status.holder.as_deref().unwrap_or("nobody"),
                    "standing by: this replica writes nothing"
                );
            }
        }
    }

    async fn run(self, shutdown: CancellationToken, release: CancellationToken) {
        let s = self.settings.clone();
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &s.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", s.lease_name));
        let mut lease_events = watcher(api.clone(), config)
            .backoff(QuickBackoff::new(s.retry_period))
            .boxed();
        let mut observed: Option<Lease> = None;
        // When `observed` was last refreshed, by the watch or a read.
        let mut observed_at = Instant::now();
        let mut manager: Option<Arc<LeaseManager>> = None;
        // The crate's view: it renews while this is true.
        let mut held = false;
        let mut failures = 0u32;
        // resourceVersion of the free Lease a standby last restarted on.
        let mut woken_for: Option<String> = None;
        let mut attempt = self.attempt(None, Duration::ZERO);
        info!(identity = %s.identity, lease = %s.lease(), "leader election: standing by until this replica holds the Lease");
        loop {
            let spec = observed.as_ref().and_then(|l| l.spec.as_ref());
            let until = if held {
                fenced_until(SystemTime::now(), &s.identity, spec, s.renew_deadline)
            } else {
                None
            };
            let holder = spec.and_then(|l| l.holder_identity.clone());
            self.publish(until, holder);
            // Close the gate the moment the renew deadline passes.
            let close_in = until
                .and_then(|u| u.duration_since(SystemTime::now()).ok())
                .unwrap_or(Duration::MAX);
            // The watch may have gone quiet: read the Lease while leading.
            let read_in =
                (observed_at + 2 * s.retry_period).saturating_duration_since(Instant::now());
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                step = &mut attempt => {
                    attempt = match step {
                        Step::Changed(m, now_held) => {
                            failures = 0;
                            if now_held != held {
                                held = now_held;
                                if held {
                                    debug!(identity = %s.identity, "the crate holds the Lease");
                                } else {
                                    warn!(identity = %s.identity, "lost the Lease");
                                }
                            }
                            manager = Some(m.clone());
                            self.attempt(Some(m), Duration::ZERO)
                        }
                        Step::Failed(m, err) => {
                            failures += 1;
                            warn!(identity = %s.identity, "leader election: {err}");
                            let delay = s.retry_period * 2u32.pow(failures.min(4) - 1);
                            if m.is_some() {
                                manager = m.clone();
                            }
                            // Failing again and again (the Lease deleted, say,
                            // which only a new manager re-creates): start over
                            // from a fresh read; the gate stays fenced meanwhile.
                            let m = if failures >= 2 {
                                held = false;
                                None
                            } else {
                                m
                            };
                            self.attempt(m, delay)
                        }
                    };
                }
                event = lease_events.next() => match event {
                    Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                        observed_at = Instant::now();
                        // A standby's crate sleeps until the lease it saw
                        // expires: restart it the moment the Lease is free.
                        if !held && is_free(&lease) && woken_for != lease.resource_version() {
                            woken_for = lease.resource_version();
                            debug!(identity = %s.identity, "the Lease is free: trying to take it");
                            attempt = self.attempt(None, Duration::ZERO);
                        }
                        observed = Some(lease);
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        observed = None;
                        // Re-created by a fresh manager.
                        held = false;
                        attempt = self.attempt(None, s.retry_period);
                    }
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                    Some(Err(err)) => debug!("watching Lease {}: {err}", s.lease()),
                    None => lease_events = futures::stream::pending().boxed(),
                },
                _ = tokio::time::sleep(close_in), if until.is_some() => {}
                _ = tokio::time::sleep(read_in), if held => {
                    observed_at = Instant::now();
                    match api.get_opt(&s.lease_name).await {
                        Ok(lease) => observed = lease,
                        Err(err) => debug!("reading Lease {}: {err}", s.lease()),
                    }
                }
            }
        }
        // Stop writing at once; stop renewing; hand the Lease on once the
        // operator has finished its in-flight writes.
        self.publish(None, None);
        drop(attempt);
        let ours = held
            || observed
                .as_ref()
                .and_then(|l| l.spec.as_ref())
                .and_then(|l| l.holder_identity.as_deref())
                == Some(s.identity.as_str());
        if !ours {
            return;
        }
        tokio::select! {
            _ = release.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(3)) => {}
        }
        let manager = match manager {
            Some(m) => m,
            None => match build_manager(self.client.clone(), &s).await {
                Ok(m) => Arc::new(m),
                Err(err) => {
                    warn!("cannot release the Lease: {err}");
                    return;
                }
            },
        };
        match manager.release().await {
            Ok(()) => {
                info!(identity = %s.identity, lease = %s.lease(), "Lease released: another replica can take over at once")
            }
            Err(err) => warn!("cannot release Lease {}: {err}", s.lease()),
        }
    }
}

/// Backoff of the Lease watch: short and capped (the gate depends on
/// seeing renewals), with jitter.
struct QuickBackoff {
    first: Duration,
    next: Duration,
    max: Duration,
}

impl QuickBackoff {
    fn new(max: Duration) -> QuickBackoff {
        let first = Duration::from_millis(250).min(max);
        QuickBackoff {
            first,
            next: first,
            max,
        }
    }
}

impl Iterator for QuickBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let jitter = rand::random::<f64>() * 0.5 + 0.75;
        Some(base.mul_f64(jitter))
    }
}

impl kube::runtime::utils::Backoff for QuickBackoff {
    fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn spec(holder: Option<&str>, renewed: Option<SystemTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(|t| {
                MicroTime(k8s_openapi::jiff::Timestamp::try_from(t).expect("a valid time"))
            }),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn the_holder_may_write_until_its_renewal_is_a_renew_deadline_old() {
        let deadline = Duration::from_secs(10);
        let renewed = SystemTime::now() - Duration::from_secs(3);
        let me = spec(Some("me"), Some(renewed));
        let until = fenced_until(SystemTime::now(), "me", Some(&me), deadline);
        let until = until.expect("renewed 3 s ago: may write");
        let left = until.duration_since(SystemTime::now()).unwrap_or_default();
        assert!(
            left > Duration::from_secs(6) && left <= Duration::from_secs(7),
            "{left:?}"
        );
        // Renewed 11 s ago: the deadline has passed, even though the lease
        // (15 s) has not expired yet.
        let stale = spec(
            Some("me"),
            Some(SystemTime::now() - Duration::from_secs(11)),
        );
        assert_eq!(
            fenced_until(SystemTime::now(), "me", Some(&stale), deadline),
            None
        );
        let theirs = spec(Some("them"), Some(SystemTime::now()));
        assert_eq!(
            fenced_until(SystemTime::now(), "me", Some(&theirs), deadline),
            None
        );
        let never = spec(Some("me"), None);
        assert_eq!(
            fenced_until(SystemTime::now(), "me", Some(&never), deadline),
            None
        );
        assert_eq!(fenced_until(SystemTime::now(), "me", None, deadline), None);
    }

    #[test]
    fn a_lease_without_holder_is_free() {
        let lease = |holder: Option<&str>| Lease {
            spec: Some(spec(holder, None)),
            ..Lease::default()
        };
        assert!(is_free(&lease(None)));
        assert!(is_free(&lease(Some(""))));
        assert!(!is_free(&lease(Some("x"))));
        assert!(is_free(&Lease::default()));
    }

    #[test]
    fn the_watch_backoff_is_short_and_capped() {
        let mut b = QuickBackoff::new(Duration::from_secs(2));
        let delays: Vec<Duration> = (&mut b).take(6).collect();
        assert!(delays[0] < Duration::from_millis(400), "{delays:?}");
        assert!(
            delays.iter().all(|d| *d <= Duration::from_millis(2500)),
            "{delays:?}"
        );
        kube::runtime::utils::Backoff::reset(&mut b);
        assert!(b.next().unwrap_or_default() < Duration::from_millis(400));
    }
}
