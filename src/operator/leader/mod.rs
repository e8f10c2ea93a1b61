//! Leader election (`trellis run --leader-elect`): which replica may write.
//!
//! ```text
//!  kube-lease-manager ──acquire / renew every retry period / release──▶ Lease
//!                                                                        │ watch
//!  Elector: open only while the crate says "holder" AND the Lease itself ◀┘
//!           shows us as holder, renewed less than the renew deadline ago
//!     │
//!     ▼
//!  Gate (watch<bool>) ──▶ every write checks it; a rising edge re-reconciles every parent
//! ```
//!
//! The crate does the Lease protocol; this module adds what an operator needs
//! on top and the crate does not give:
//! - **Fencing.** The crate keeps believing it leads while it cannot reach the
//!   API server. The gate therefore also requires that the Lease, as last
//!   seen, names us with a `renewTime` (stamped by our own clock) younger than
//!   the renew deadline: a leader cut off stops writing before the lease
//!   duration ends, i.e. before anyone else may take over.
//! - **Prompt handoff.** A standby in the crate sleeps until the lease it saw
//!   expires. The watch on the Lease wakes it the moment the holder releases
//!   it (on SIGTERM), so the successor takes over at once.
//!
//! Without `--leader-elect` the gate is always open.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::telemetry::{LeaderStatus, Metrics};

/// Where a Pod's service account says which namespace it runs in.
pub const SERVICE_ACCOUNT_NAMESPACE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Whether this replica may write: one cheap check before every write.
///
/// Besides open/closed it holds the renew deadline, checked on every call:
/// a process that was paused (stopped, starved) past its deadline finds the
/// gate shut at once, before the elector has had a chance to run.
#[derive(Clone, Debug)]
pub struct Gate {
    tx: Arc<watch::Sender<bool>>,
    /// Milliseconds since the Unix epoch until which an open gate lets writes through.
    until: Arc<AtomicU64>,
}

/// A write refused because this replica does not hold the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "not this replica's to write: writes are left to the replica that holds the Lease (or, under --shards, the parent's bucket)"
)]
pub struct NotLeader;

impl Gate {
    /// Always open: no leader election, this process is the only writer.
    pub fn open() -> Gate {
        Gate {
            tx: Arc::new(watch::channel(true).0),
            until: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// Closed until an [`Elector`] opens it.
    pub fn closed() -> Gate {
        Gate {
            tx: Arc::new(watch::channel(false).0),
            until: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn may_write(&self) -> bool {
        *self.tx.borrow() && epoch_millis(SystemTime::now()) < self.until.load(Ordering::Acquire)
    }

    /// `Ok` when this replica may write now.
    pub fn check(&self) -> Result<(), NotLeader> {
        if self.may_write() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// Opens the gate until `until` (`None`: closes it); returns whether
    /// that opened or closed it.
    pub fn set(&self, until: Option<SystemTime>) -> bool {
        let open = until.is_some();
        let millis = until.map_or(0, epoch_millis);
        self.until.store(millis, Ordering::Release);
        self.tx.send_if_modified(|v| {
            let changed = *v != open;
            *v = open;
            changed
        })
    }

    /// Yields each time the gate opens (not for the state it is in now):
    /// the trigger that re-reconciles every parent on becoming leader.
    pub fn became_leader(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.tx.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            loop {
                rx.changed().await.ok()?;
                if *rx.borrow_and_update() {
                    return Some(((), rx));
                }
            }
        })
    }
}

fn epoch_millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How to take part in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub lease_name: String,
    pub namespace: String,
    /// Unique among the replicas: the Pod name plus a random suffix.
    pub identity: String,
    /// How long a Lease holds without renewal before another replica may take it.
    pub lease_duration: Duration,
    /// A leader whose last renewal is this old stops writing.
    pub renew_deadline: Duration,
    /// How often the leader renews (and a failed attempt is retried).
    pub retry_period: Duration,
}

impl Settings {
    /// The defaults of RULES.md: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(lease_name: &str, namespace: &str, identity: &str) -> Settings {
        Settings {
            lease_name: lease_name.to_owned(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Checks the timings; the message names the flags.
    pub fn validate(&self) -> Result<(), String> {
        let secs = |d: Duration| humantime::format_duration(d).to_string();
        // The Lease stores whole seconds, and so does the crate's renewal period.
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration < Duration::from_secs(2) {
            return Err(format!(
                "--leader-elect-lease-duration must be a whole number of seconds, at least 2s (got {})",
                secs(self.lease_duration)
            ));
        }
        if self.retry_period.subsec_nanos() != 0 || self.retry_period < Duration::from_secs(1) {
            return Err(format!(
                "--leader-elect-retry-period must be a whole number of seconds, at least 1s (got {})",
                secs(self.retry_period)
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "--leader-elect-renew-deadline ({}) must be shorter than --leader-elect-lease-duration ({}): \
                 a leader must stop writing before another may take over",
                secs(self.renew_deadline),
                secs(self.lease_duration)
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(format!(
                "--leader-elect-retry-period ({}) must be shorter than --leader-elect-renew-deadline ({}): \
                 the leader must get to renew before its deadline",
                secs(self.retry_period),
                secs(self.renew_deadline)
            ));
        }
        if self.lease_name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            return Err("--leader-elect needs a lease name, a namespace and an identity".into());
        }
        Ok(())
    }

    /// The crate renews `grace` seconds before expiry: so it renews once per retry period.
    fn grace_seconds(&self) -> u64 {
        self.lease_duration
            .as_secs()
            .saturating_sub(self.retry_period.as_secs())
            .max(1)
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }
}

/// The Lease's namespace when no flag names it: `POD_NAMESPACE`, else the
/// service account's namespace file.
pub fn namespace_from_environment() -> Result<String, String> {
    namespace_from(
        std::env::var("POD_NAMESPACE").ok(),
        Path::new(SERVICE_ACCOUNT_NAMESPACE),
    )
}

fn namespace_from(pod_namespace: Option<String>, service_account: &Path) -> Result<String, String> {
    if let Some(ns) = pod_namespace.map(|n| n.trim().to_owned())
        && !ns.is_empty()
    {
        return Ok(ns);
    }
    match std::fs::read_to_string(service_account) {
        Ok(ns) if !ns.trim().is_empty() => Ok(ns.trim().to_owned()),
        _ => Err(format!(
            "--leader-elect needs a namespace for its Lease: pass --leader-elect-namespace, \
             set POD_NAMESPACE, or run in a Pod ({} not readable)",
            service_account.display()
        )),
    }
}

/// This replica's identity in the Lease: Pod name (or host name) and a
/// random suffix, so that a restarted Pod of the same name is a new holder.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "trellis".to_owned());
    format!("{host}_{:08x}", rand::random::<u32>())
}

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
            let mut s = super::lock(&status);
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
        let mut status = super::lock(&self.status);
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
    fn the_gate_opens_and_closes_and_says_when_it_changed() {
        let gate = Gate::closed();
        assert!(!gate.may_write());
        assert_eq!(gate.check(), Err(NotLeader));
        let soon = SystemTime::now() + Duration::from_secs(60);
        assert!(gate.set(Some(soon)));
        assert!(
            !gate.set(Some(soon)),
            "opening an open gate changes nothing"
        );
        assert!(gate.may_write());
        assert_eq!(gate.check(), Ok(()));
        let other = gate.clone();
        assert!(other.set(None));
        assert!(!gate.may_write(), "clones share one gate");
        assert!(Gate::open().may_write());
    }

    #[test]
    fn an_open_gate_shuts_itself_at_the_deadline() {
        let gate = Gate::closed();
        gate.set(Some(SystemTime::now() + Duration::from_millis(50)));
        assert!(gate.may_write());
        std::thread::sleep(Duration::from_millis(80));
        // Nobody closed it: a paused elector cannot keep it open.
        assert!(!gate.may_write());
        assert_eq!(gate.check(), Err(NotLeader));
    }

    #[tokio::test]
    async fn became_leader_yields_on_each_opening_only() {
        let gate = Gate::closed();
        let mut edges = Box::pin(gate.became_leader());
        let short = Duration::from_millis(200);
        let soon = Some(SystemTime::now() + Duration::from_secs(60));
        assert!(
            tokio::time::timeout(short, edges.next()).await.is_err(),
            "no edge while closed"
        );
        gate.set(soon);
        assert_eq!(
            tokio::time::timeout(short, edges.next()).await,
            Ok(Some(()))
        );
        gate.set(None);
        assert!(
            tokio::time::timeout(short, edges.next()).await.is_err(),
            "closing is no edge"
        );
        gate.set(soon);
        assert_eq!(
            tokio::time::timeout(short, edges.next()).await,
            Ok(Some(()))
        );
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
    fn the_defaults_validate_and_bad_timings_name_the_flags() {
        let ok = Settings::new("trellis", "ops", "pod_1");
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(ok.grace_seconds(), 13, "renews once per retry period");
        let bad = |f: fn(&mut Settings)| {
            let mut s = ok.clone();
            f(&mut s);
            s.validate().expect_err("invalid")
        };
        assert!(
            bad(|s| s.renew_deadline = Duration::from_secs(15))
                .contains("--leader-elect-renew-deadline")
        );
        assert!(
            bad(|s| s.retry_period = Duration::from_secs(10))
                .contains("--leader-elect-retry-period")
        );
        assert!(bad(|s| s.retry_period = Duration::from_millis(1500)).contains("whole number"));
        assert!(
            bad(|s| s.lease_duration = Duration::from_millis(15_500))
                .contains("--leader-elect-lease-duration")
        );
    }

    #[test]
    fn the_namespace_comes_from_pod_namespace_then_the_service_account() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("namespace");
        assert_eq!(namespace_from(Some("ops".into()), &file), Ok("ops".into()));
        let err = namespace_from(None, &file).expect_err("no namespace");
        assert!(
            err.contains("--leader-elect-namespace") && err.contains("POD_NAMESPACE"),
            "{err}"
        );
        std::fs::write(&file, "team-a\n").expect("write");
        assert_eq!(namespace_from(None, &file), Ok("team-a".into()));
        assert_eq!(namespace_from(Some(" ".into()), &file), Ok("team-a".into()));
    }

    #[test]
    fn identities_are_unique_per_process_start() {
        assert_ne!(identity(), identity());
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
