//! What a member Lease looks like: its name, its label and annotations,
//! and how one reads as a [`MemberLease`] for the handover. Pure; the loop
//! that writes and watches these Leases is in `membership.rs`.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use crate::shard::handover::MemberLease;

/// Label on every member Lease: the leader Lease's name (one ring per Lease).
pub const LABEL_RING: &str = "trellis.dev/ring";
/// On a member Lease: the generation this member acknowledged.
pub const ANNOTATION_ACK: &str = "trellis.dev/shard-ack";
/// On a member Lease: the member's identity (kept after a release, which
/// clears `holderIdentity`).
pub const ANNOTATION_MEMBER: &str = "trellis.dev/shard-member";

/// The member Lease name of `identity` (a DNS subdomain: lower case,
/// `[a-z0-9-.]`).
pub fn member_lease_name(lease: &str, identity: &str) -> String {
    let id: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    let id = id.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut name = format!("{lease}-member-{id}");
    name.truncate(253);
    name
}

/// What the handover needs of a member Lease.
pub(super) fn member_of(lease: &Lease, default_duration: Duration) -> Option<MemberLease> {
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    let name = lease
        .annotations()
        .get(ANNOTATION_MEMBER)
        .cloned()
        .or_else(|| holder.clone())?;
    Some(MemberLease {
        name,
        acked: lease
            .annotations()
            .get(ANNOTATION_ACK)
            .and_then(|a| a.parse().ok())
            .unwrap_or(0),
        renewed: spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| SystemTime::from(t.0)),
        lease_duration: spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|d| u64::try_from(d).ok())
            .map_or(default_duration, Duration::from_secs),
        released: holder.is_none(),
    })
}

/// Holds its Lease now: renewed within its duration and not released.
pub(super) fn is_live(m: &MemberLease, now: SystemTime) -> bool {
    !m.released && m.renewed.is_some_and(|at| at + m.lease_duration > now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;

    fn lease(holder: Option<&str>, member: Option<&str>, ack: &str, renewed_ago: u64) -> Lease {
        let renewed = SystemTime::now() - Duration::from_secs(renewed_ago);
        Lease {
            metadata: ObjectMeta {
                name: Some("trellis-member-x".into()),
                annotations: Some(
                    [
                        (ANNOTATION_ACK.to_owned(), ack.to_owned()),
                        (
                            ANNOTATION_MEMBER.to_owned(),
                            member.unwrap_or_default().to_owned(),
                        ),
                    ]
                    .into_iter()
                    .filter(|(_, v)| !v.is_empty())
                    .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(4),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::try_from(renewed).expect("a valid time"),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn member_lease_names_are_dns_subdomains() {
        assert_eq!(
            member_lease_name("trellis", "trellis-7d9f_0a1b2c3d"),
            "trellis-member-trellis-7d9f-0a1b2c3d"
        );
        assert_eq!(member_lease_name("t", "_Host.Name_"), "t-member-host.name");
        assert!(member_lease_name("t", &"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn a_member_lease_reads_as_its_identity_ack_renewal_and_release() {
        let live = member_of(
            &lease(Some("a_1"), Some("a_1"), "7", 1),
            Duration::from_secs(15),
        )
        .expect("a member");
        assert_eq!(live.name, "a_1");
        assert_eq!(live.acked, 7);
        assert_eq!(
            live.lease_duration,
            Duration::from_secs(4),
            "its own duration"
        );
        assert!(!live.released);
        assert!(is_live(&live, SystemTime::now()));

        // Released on SIGTERM: holderIdentity cleared, the identity kept.
        let gone = member_of(&lease(None, Some("a_1"), "7", 1), Duration::from_secs(15))
            .expect("a member");
        assert_eq!(gone.name, "a_1");
        assert!(gone.released && !is_live(&gone, SystemTime::now()));

        // Not renewed for longer than its duration: not live any more.
        let silent = member_of(&lease(Some("b_2"), None, "x", 5), Duration::from_secs(15))
            .expect("named by its holder");
        assert_eq!((silent.name.as_str(), silent.acked), ("b_2", 0));
        assert!(!is_live(&silent, SystemTime::now()));

        // Neither a holder nor a member annotation: not a member at all.
        assert!(member_of(&lease(None, None, "1", 0), Duration::from_secs(15)).is_none());
    }
}
