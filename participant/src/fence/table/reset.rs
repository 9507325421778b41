//! The only way a highest token falls: an operator's reset, checked compare-and-set against
//! the highest the operator saw, logged with who and why, and kept in the table's audit trail.

use protocol::lease::FenceReset;

use super::Fences;

/// Most resets kept in the table's audit trail (the oldest go first; each is also in the log
/// until a checkpoint drops its segment).
pub const RESETS_KEPT_MAX: usize = 1_000;

/// An operator's reset of one resource's highest token: `POST /v1/fences/{resource}/reset`
/// with a [`protocol::lease::FenceResetBody`], the operator's name from their token when
/// authentication is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceResetRequest {
    pub resource: String,
    /// The highest token the operator saw: the reset applies only if it still is the highest.
    pub from: u64,
    /// The new highest: below `from`.
    pub to: u64,
    pub operator: String,
    pub reason: String,
}

/// Why a reset is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetRefused {
    #[error("no token was ever accepted for {resource:?} here; there is nothing to reset")]
    Unknown { resource: String },
    #[error(
        "the highest token for {resource:?} is {highest}, not {expected}: it changed since it \
         was read; read it again and decide again"
    )]
    Changed {
        resource: String,
        expected: u64,
        highest: u64,
    },
    #[error("a reset lowers the highest token: to ({to}) must be below from ({from})")]
    NotLower { from: u64, to: u64 },
}

impl Fences {
    /// Checks an operator's reset against the table as it stands.
    pub fn check_reset(&self, request: &FenceResetRequest) -> Result<(), ResetRefused> {
        let resource = &request.resource;
        let Some(highest) = self.effective_highest(resource) else {
            return Err(ResetRefused::Unknown {
                resource: resource.clone(),
            });
        };
        if highest != request.from {
            return Err(ResetRefused::Changed {
                resource: resource.clone(),
                expected: request.from,
                highest,
            });
        }
        if request.to >= request.from {
            return Err(ResetRefused::NotLower {
                from: request.from,
                to: request.to,
            });
        }
        Ok(())
    }

    /// Lowers a resource's highest token (live, once checked, and at replay, in log order).
    pub fn apply_reset(&mut self, reset: FenceReset) {
        self.highest.insert(reset.resource.clone(), reset.to);
        self.stamp_written(&reset.resource, reset.at_ms);
        self.recompute_ceiling();
        self.resets.push(reset);
        if self.resets.len() > RESETS_KEPT_MAX {
            let excess = self.resets.len() - RESETS_KEPT_MAX;
            self.resets.drain(..excess);
        }
    }
}
