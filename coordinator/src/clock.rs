//! The wall clock, read in one place: Unix time in milliseconds. Only shells read it; the
//! engines take time as an argument.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
