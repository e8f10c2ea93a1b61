//! The labels and annotations trellis writes on the children it manages,
//! and the one label value it computes: the bucket of the parent's uid.
//! Every module that writes or reads them — the planner, drift detection,
//! the shards, the operator's watches — takes the names from here, so they
//! agree without depending on one another.

use sha2::{Digest, Sha256};

pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Every label and annotation of trellis's own starts with this.
pub const LABEL_PREFIX: &str = "trellis.dev/";
pub const LABEL_RULE: &str = "trellis.dev/rule";
pub const LABEL_CHILD: &str = "trellis.dev/child";
pub const LABEL_PARENT_UID: &str = "trellis.dev/parent-uid";
/// The revision of the rule version that rendered the child.
pub const LABEL_REVISION: &str = "trellis.dev/revision";
pub const MANAGED_BY: &str = "trellis";
/// Every label and annotation trellis writes under its own name starts so;
/// `propagate:` never copies one from a parent.
pub const TRELLIS_PREFIX: &str = "trellis.dev/";
/// On children with `deletionPolicy: retain`: released, never deleted, by
/// whichever rule version or cleanup finds them.
pub const LABEL_DELETION_POLICY: &str = "trellis.dev/deletion-policy";
pub const RETAIN: &str = "retain";
/// On `recreate` children: the hash of the rendering the object came from.
pub const ANNOTATION_RENDER_HASH: &str = "trellis.dev/render-hash";

/// On a child in another cluster (a spoke): the `--cluster-name` of the
/// hub that keeps it, so two hubs sharing a spoke never take each
/// other's objects.
pub const LABEL_HUB: &str = "trellis.dev/hub";
/// On a Secret in the operator's namespace: the name of the spoke whose
/// kubeconfig it holds. On an object of `render --observed`: the cluster
/// it was read from.
pub const LABEL_CLUSTER: &str = "trellis.dev/cluster";

/// How many buckets parents are cut into.
pub const BUCKETS: usize = 256;

/// Label carried by every child: the bucket of its parent's uid.
pub const LABEL_BUCKET: &str = "trellis.dev/bucket";

/// One of the [`BUCKETS`] buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket(pub u8);

/// The bucket of a parent: the first byte of the sha256 of its uid. A uid
/// is random, so buckets fill evenly; sha256 is the same on every
/// architecture and in every release, so a bucket never moves by itself.
pub fn bucket_of(uid: &str) -> Bucket {
    Bucket(Sha256::digest(uid.as_bytes())[0])
}

impl std::fmt::Display for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
