//! The conformance cases of the whole stack on the real control plane.

use crate::plane_support::harness::Case;

/// This module's cases.
pub fn cases() -> Vec<Case> {
    vec![]
}
