//! CustomResourceDefinitions as trellis meets them outside the rule
//! compiler: the ones the offline commands read from disk (`--crds`,
//! [`offline`]) and the field manager the operator applies generated ones
//! with. Generating a rule's CRD is part of compiling the rule
//! (`crate::rules::crd`).

pub mod breaking;
pub mod offline;

/// Field manager of the CRDs `trellis run --manage-crds` applies.
pub const FIELD_MANAGER: &str = "trellis";
