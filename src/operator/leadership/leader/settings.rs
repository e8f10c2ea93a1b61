//! How this replica takes part in the election: the Lease's name and
//! namespace, its identity, the timings and their checks. Pure, apart from
//! reading the environment; the loop that uses it is in `campaign.rs`.

use std::path::Path;
use std::time::Duration;

/// Where a Pod's service account says which namespace it runs in.
pub const SERVICE_ACCOUNT_NAMESPACE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

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
    /// Under `--shards`, the member Leases' own duration and renew deadline
    /// (`None`: [`MEMBER_LEASE_DURATION`] / [`MEMBER_RENEW_DEADLINE`], or
    /// the leader's when shorter). Shorter than the leader's so that a lost
    /// replica's buckets move sooner; members renew every retry period
    /// either way, so it costs no request.
    pub member_lease_duration: Option<Duration>,
    pub member_renew_deadline: Option<Duration>,
}

/// A member Lease's duration unless set: a SIGKILLed replica's buckets move
/// after about two of these (expiry, then as long again for its writes in
/// flight), 12 s instead of the leader Lease's 30 s.
pub const MEMBER_LEASE_DURATION: Duration = Duration::from_secs(6);
/// A member's renew deadline unless set (it stops writing when its last
/// renewal is this old).
pub const MEMBER_RENEW_DEADLINE: Duration = Duration::from_secs(4);

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
            member_lease_duration: None,
            member_renew_deadline: None,
        }
    }

    /// The settings a member Lease is held with: the member timings in
    /// place of the leader's (same name, namespace, identity, retry period).
    pub fn member(&self) -> Settings {
        Settings {
            lease_duration: self
                .member_lease_duration
                .unwrap_or(MEMBER_LEASE_DURATION.min(self.lease_duration)),
            renew_deadline: self
                .member_renew_deadline
                .unwrap_or(MEMBER_RENEW_DEADLINE.min(self.renew_deadline)),
            ..self.clone()
        }
    }

    /// Checks the timings; the message names the flags.
    pub fn validate(&self) -> Result<(), String> {
        let secs = |d: Duration| humantime::format_duration(d).to_string();
        if self.retry_period.subsec_nanos() != 0 || self.retry_period < Duration::from_secs(1) {
            return Err(format!(
                "--leader-elect-retry-period must be a whole number of seconds, at least 1s (got {})",
                secs(self.retry_period)
            ));
        }
        check_timings(
            self,
            &Flags {
                lease: "--leader-elect-lease-duration",
                renew: "--leader-elect-renew-deadline",
                renew_default: false,
                stop_before: "a leader must stop writing before another may take over",
            },
        )?;
        if self.lease_name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            return Err("--leader-elect needs a lease name, a namespace and an identity".into());
        }
        Ok(())
    }

    /// The member timings, checked like the leader's; the message names the
    /// `--shards-member-*` flags (and says when a default was derived).
    /// Checked only under `--shards`: without it no member Lease is held.
    pub fn validate_member(&self) -> Result<(), String> {
        check_timings(
            &self.member(),
            &Flags {
                lease: "--shards-member-lease-duration",
                renew: "--shards-member-renew-deadline",
                renew_default: self.member_renew_deadline.is_none(),
                stop_before: "a member must stop writing before its buckets can move",
            },
        )
    }

    /// The crate renews `grace` seconds before expiry: so it renews once per retry period.
    pub(super) fn grace_seconds(&self) -> u64 {
        self.lease_duration
            .as_secs()
            .saturating_sub(self.retry_period.as_secs())
            .max(1)
    }

    pub(super) fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }
}

/// The flags a set of timings came from, for the messages.
struct Flags {
    lease: &'static str,
    renew: &'static str,
    /// The renew deadline was not given but derived (said in the message).
    renew_default: bool,
    /// Why the renew deadline must be shorter than the lease.
    stop_before: &'static str,
}

/// A Lease's duration, renew deadline and the retry period between them.
fn check_timings(timings: &Settings, flags: &Flags) -> Result<(), String> {
    let secs = |d: Duration| humantime::format_duration(d).to_string();
    let (lease, renew) = (timings.lease_duration, timings.renew_deadline);
    // The Lease stores whole seconds, and so does the crate's renewal period.
    if lease.subsec_nanos() != 0 || lease < Duration::from_secs(2) {
        return Err(format!(
            "{} must be a whole number of seconds, at least 2s (got {})",
            flags.lease,
            secs(lease)
        ));
    }
    if renew >= lease {
        return Err(format!(
            "{} ({}) must be shorter than {} ({}): {}",
            flags.renew,
            secs(renew),
            flags.lease,
            secs(lease),
            flags.stop_before
        ));
    }
    if timings.retry_period >= renew {
        return Err(format!(
            "--leader-elect-retry-period ({}) must be shorter than {} ({}{}): \
             a Lease must get renewed before its deadline",
            secs(timings.retry_period),
            flags.renew,
            secs(renew),
            if flags.renew_default {
                ", its default"
            } else {
                ""
            }
        ));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
