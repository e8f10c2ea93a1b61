//! Related objects of a live pass (`trellis diff`, `trellis tree`) whose
//! rule reads a kind the API server does not serve: as in the operator,
//! such an entry holds back only its readers (`RelatedKindNotServed`), never
//! the whole pass.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::kinds::Gvk;
use crate::plan::{ObjectKey, Observed, RelatedRead, RelatedSource, Unreadable};

/// Where a pass whose rule reads a kind the API server does not serve
/// finds its related objects: what was fetched for its reads; the unserved
/// kinds answer as the operator's caches answer for them.
pub(super) struct Fetched {
    objects: BTreeMap<ObjectKey, Value>,
    unserved: Vec<(Gvk, String)>,
}

impl Fetched {
    pub(super) fn new(observed: &Observed, unserved: &[(Gvk, String)]) -> Fetched {
        Fetched {
            objects: observed.objects.clone(),
            unserved: unserved.to_vec(),
        }
    }
}

impl RelatedSource for Fetched {
    fn find(&self, gvk: &Gvk, read: &RelatedRead) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
        self.served(gvk)?;
        Ok(self
            .objects
            .iter()
            .filter(|(k, o)| k.cluster.is_none() && read.covers_object(gvk, k, o))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect())
    }

    /// What was fetched from the spoke `cluster` (see `spokes.rs`).
    fn find_in(
        &self,
        cluster: &str,
        gvk: &Gvk,
        read: &RelatedRead,
    ) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
        Ok(self
            .objects
            .iter()
            .filter(|(k, o)| k.cluster.as_deref() == Some(cluster) && read.covers_object(gvk, k, o))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect())
    }

    fn served(&self, gvk: &Gvk) -> Result<(), Unreadable> {
        match self.unserved.iter().find(|(g, _)| g == gvk) {
            Some((_, why)) => Err(Unreadable {
                reason: Unreadable::KIND_NOT_SERVED,
                message: why.clone(),
            }),
            None => Ok(()),
        }
    }
}
