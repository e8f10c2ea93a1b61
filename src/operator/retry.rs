//! When to try again: per-parent backoff that holds whatever wakes the
//! parent, the Warning Events worth writing, and the watches' reconnect
//! backoff.
//!
//! A failing parent is woken by many things besides its own retry timer:
//! child events, its own status write, a resync. Without a hold, each wake
//! is another failing pass with another write, a hot loop against a server
//! that is already failing. So a failure holds the parent until its backoff
//! ends, unless its spec changed (the user may have fixed it) or the rule
//! was reloaded, which forget every hold.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;

/// Consecutive failures of one parent.
#[derive(Debug, Clone)]
struct Failure {
    count: u32,
    until: Instant,
    /// The parent's `metadata.generation` when it failed: an edit lifts the hold.
    generation: Option<i64>,
    /// The last Warning written, so that identical failures write one Event.
    warned: Option<String>,
}

/// Failures by parent key (`namespace/name`).
#[derive(Debug, Default)]
pub struct Failures {
    map: Mutex<HashMap<String, Failure>>,
}

/// Exponential backoff from 200 ms doubling to 5 min, with up to 20% jitter
/// so that parents failing together do not retry together.
pub fn delay(failures: u32, jitter: f64) -> Duration {
    let ms = 200u64.saturating_mul(1u64 << failures.saturating_sub(1).min(20));
    let ms = ms.min(300_000) as f64 * (1.0 + 0.2 * jitter.clamp(0.0, 1.0));
    Duration::from_millis(ms as u64)
}

impl Failures {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failure>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long `key` must still wait, if it is held back by a failure of
    /// the same generation.
    pub fn held(&self, key: &str, generation: Option<i64>, now: Instant) -> Option<Duration> {
        let map = self.lock();
        let f = map.get(key)?;
        (f.generation == generation && f.until > now).then(|| f.until - now)
    }

    /// Records a failure; returns how long to wait before the next try.
    pub fn record(&self, key: &str, generation: Option<i64>, now: Instant) -> Duration {
        let mut map = self.lock();
        let f = map.entry(key.to_owned()).or_insert(Failure {
            count: 0,
            until: now,
            generation,
            warned: None,
        });
        if f.generation != generation {
            f.count = 0;
            f.generation = generation;
        }
        f.count += 1;
        let wait = delay(f.count, rand::random::<f64>());
        f.until = now + wait;
        wait
    }

    /// Whether a Warning with `message` should be written for `key`: only
    /// when it differs from the last one written during this run of failures.
    pub fn should_warn(&self, key: &str, message: &str) -> bool {
        let mut map = self.lock();
        match map.get_mut(key) {
            Some(f) if f.warned.as_deref() == Some(message) => false,
            Some(f) => {
                f.warned = Some(message.to_owned());
                true
            }
            None => {
                map.insert(
                    key.to_owned(),
                    Failure {
                        count: 0,
                        until: Instant::now(),
                        generation: None,
                        warned: Some(message.to_owned()),
                    },
                );
                true
            }
        }
    }

    /// A clean pass: forget `key`'s failures.
    pub fn clear(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Lifts every hold (a reload, a watch reconnected after an outage),
    /// keeping what was warned about.
    pub fn release_all(&self) {
        let now = Instant::now();
        for f in self.lock().values_mut() {
            f.count = 0;
            f.until = now;
        }
    }

    /// Lifts the hold of `key` and restarts its count: its failures were
    /// the server's ([`Outage`]).
    pub fn release(&self, key: &str) {
        if let Some(f) = self.lock().get_mut(key) {
            f.count = 0;
            f.until = Instant::now();
        }
    }

    /// Parents currently held back.
    pub fn holding(&self, now: Instant) -> usize {
        self.lock().values().filter(|f| f.until > now).count()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Forgets parents for which `keep` is false.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }
}

/// Parents whose pass failed because the API server could not serve it (no
/// answer, or a 5xx: its etcd gone): the server's fault, not theirs. Their
/// backoff grew while it was away, and a watch that resumes after the
/// outage (no relist) brings them no event, so without this each would wait
/// out its own backoff, up to the outage's length again, after the server
/// is back. Instead one probe follows the server at the watches' reconnect
/// cadence ([`WatchBackoff`]) and, once it answers, hands these parents back
/// to be reconciled at once.
pub struct Outage<T> {
    /// A set: at 10,000 parents failing at once, a list's duplicate check
    /// alone would be 50 million comparisons.
    failed: Mutex<HashSet<T>>,
    wake: tokio::sync::Notify,
}

impl<T> Default for Outage<T> {
    fn default() -> Self {
        Outage {
            failed: Mutex::new(HashSet::new()),
            wake: tokio::sync::Notify::new(),
        }
    }
}

impl<T: Eq + Hash> Outage<T> {
    /// A pass of `parent` failed for want of the server.
    pub fn failed(&self, parent: T) {
        super::lock(&self.failed).insert(parent);
        self.wake.notify_one();
    }

    /// The parents that failed, once the server serves again after not
    /// serving: after each failure `serving` is asked, after each delay of
    /// a fresh `backoff`, until it says yes. A server that serves at the
    /// first question had no outage: those failures were the parents' own
    /// (a webhook's 500, say), and they keep their backoff.
    pub async fn recovered<I, F, Fut>(&self, backoff: impl Fn() -> I, mut serving: F) -> Vec<T>
    where
        I: Iterator<Item = Duration>,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        loop {
            self.wake.notified().await;
            let mut down = false;
            for delay in backoff() {
                tokio::time::sleep(delay).await;
                if serving().await {
                    break;
                }
                down = true;
            }
            let failed = std::mem::take(&mut *super::lock(&self.failed));
            if down {
                return failed.into_iter().collect();
            }
        }
    }
}

/// Reconnect backoff of one watch: 250 ms doubling to 2 s, plus up to as much jitter. A
/// watch is back within seconds of its server; it never pauses the others.
pub struct WatchBackoff {
    builder: backon::ExponentialBuilder,
    inner: backon::ExponentialBackoff,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        let builder = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(250))
            .with_max_delay(Duration::from_secs(2))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        WatchBackoff {
            inner: builder.build(),
            builder,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        self.inner.next()
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.inner = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_from_200ms_to_5min_with_bounded_jitter() {
        assert_eq!(delay(1, 0.0), Duration::from_millis(200));
        assert_eq!(delay(2, 0.0), Duration::from_millis(400));
        assert_eq!(delay(6, 0.0), Duration::from_millis(6_400));
        assert_eq!(delay(12, 0.0), Duration::from_secs(300));
        assert_eq!(delay(60, 0.0), Duration::from_secs(300));
        assert_eq!(delay(1, 1.0), Duration::from_millis(240));
    }

    #[test]
    fn a_failure_holds_the_parent_until_its_backoff_ends() {
        let f = Failures::default();
        let t0 = Instant::now();
        let wait = f.record("ns/a", Some(1), t0);
        assert!(f.held("ns/a", Some(1), t0).is_some());
        assert_eq!(f.held("ns/a", Some(1), t0 + wait), None);
        assert_eq!(
            f.held("ns/b", Some(1), t0),
            None,
            "other parents are not held"
        );
    }

    #[test]
    fn an_edit_of_the_parent_lifts_the_hold_and_restarts_the_count() {
        let f = Failures::default();
        let t0 = Instant::now();
        for _ in 0..8 {
            f.record("ns/a", Some(1), t0);
        }
        assert_eq!(
            f.held("ns/a", Some(2), t0),
            None,
            "a new generation is tried at once"
        );
        let wait = f.record("ns/a", Some(2), t0);
        assert!(wait <= Duration::from_millis(240), "{wait:?}");
    }

    #[test]
    fn consecutive_failures_back_off_further() {
        let f = Failures::default();
        let t0 = Instant::now();
        let first = f.record("a", None, t0);
        let mut last = first;
        for _ in 0..5 {
            last = f.record("a", None, t0);
        }
        assert!(last >= first * 16, "{first:?} then {last:?}");
    }

    #[test]
    fn an_identical_warning_is_written_once_per_run_of_failures() {
        let f = Failures::default();
        assert!(f.should_warn("a", "boom"));
        assert!(!f.should_warn("a", "boom"));
        assert!(f.should_warn("a", "other"));
        f.clear("a");
        assert!(
            f.should_warn("a", "other"),
            "a new run of failures warns again"
        );
    }

    #[test]
    fn release_all_lifts_every_hold() {
        let f = Failures::default();
        let t0 = Instant::now();
        f.record("a", None, t0);
        f.record("b", None, t0);
        assert_eq!(f.holding(t0), 2);
        f.release_all();
        assert_eq!(f.holding(Instant::now()), 0);
    }

    /// A probe answering in turn from `answers` (then yes), counting the questions.
    fn probe(
        answers: &'static [bool],
    ) -> (
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
        impl FnMut() -> std::future::Ready<bool>,
    ) {
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        let probe = move || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::ready(answers.get(n).copied().unwrap_or(true))
        };
        (asked, probe)
    }

    fn every_10ms() -> std::iter::Repeat<Duration> {
        std::iter::repeat(Duration::from_millis(10))
    }

    #[tokio::test]
    async fn parents_failed_in_an_outage_are_handed_back_once_the_server_serves_again() {
        let outage = Outage::<&str>::default();
        outage.failed("ns/a");
        outage.failed("ns/b");
        outage.failed("ns/a");
        let (asked, serving) = probe(&[false, false]);
        let mut back = outage.recovered(every_10ms, serving).await;
        back.sort();
        assert_eq!(back, vec!["ns/a", "ns/b"], "each parent once");
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn failures_while_the_server_serves_are_not_handed_back() {
        let outage = Outage::<&str>::default();
        outage.failed("ns/webhook-500");
        let (asked, serving) = probe(&[]);
        let waited = tokio::time::timeout(
            Duration::from_millis(200),
            outage.recovered(every_10ms, serving),
        )
        .await;
        assert!(
            waited.is_err(),
            "handed back {waited:?}: there was no outage"
        );
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "asked once"
        );
    }

    #[test]
    fn watch_backoff_stays_within_seconds() {
        let mut b = WatchBackoff::default();
        for _ in 0..50 {
            let d = b.next().expect("unbounded");
            assert!(d <= Duration::from_secs(8), "{d:?}");
        }
    }
}
