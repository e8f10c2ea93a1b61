//! The write gate: one cheap check before every write, open only while
//! this replica leads. Separate from the election (`campaign.rs`) so
//! that the write path depends on this small type alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use futures::Stream;
use tokio::sync::watch;

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

    /// Closed until an [`Elector`](super::Elector) opens it.
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

    /// Whether the gate is open, as it changes (the renew deadline aside:
    /// for work that runs while leading, checked by `may_write` per write).
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
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

pub(crate) fn epoch_millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::time::Duration;

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
}
