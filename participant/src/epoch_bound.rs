//! How far above the highest epoch it holds a participant lets a coordinator's epoch jump.
//!
//! An epoch only ever rises, and everything below the highest is refused for ever: one message
//! with `epoch = u64::MAX` would fence the real coordinator out permanently. A real coordinator
//! raises its epoch by one per start, so a jump of more than a bound is refused (409
//! `epoch_too_high`) unless the caller proved it is a peer: with a peer token configured every
//! message that reaches the engine carried it, and the bound is off (docs/security.md).
//!
//! Pure: used by the engine and by the PostgreSQL backend alike.

/// The default bound: a coordinator restarted once every ten seconds for 115 days without
/// reaching this participant would still be let in.
pub const EPOCH_JUMP_MAX_DEFAULT: u64 = 1_000_000;

/// The bound to apply: none when authentication is on, since then only callers with the peer
/// token reach the protocol routes (`protocol::auth`).
pub fn in_force(max_jump: u64, keys: &protocol::auth::KeyRing) -> Option<u64> {
    (!keys.current().enabled()).then_some(max_jump)
}

/// Whether `epoch` is further above `highest` (0 when none is held) than `max_jump` allows.
/// `None`: no bound (peers authenticate).
pub fn jumps_too_far(highest: Option<u64>, epoch: u64, max_jump: Option<u64>) -> bool {
    max_jump.is_some_and(|max_jump| epoch > highest.unwrap_or(0).saturating_add(max_jump))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_over_the_bound_is_refused_and_no_bound_lets_anything_in() {
        assert!(!jumps_too_far(None, 1, Some(10)));
        assert!(!jumps_too_far(None, 10, Some(10)));
        assert!(jumps_too_far(None, 11, Some(10)));
        assert!(!jumps_too_far(Some(5), 15, Some(10)));
        assert!(jumps_too_far(Some(5), 16, Some(10)));
        assert!(jumps_too_far(Some(5), u64::MAX, Some(10)));
        assert!(!jumps_too_far(Some(u64::MAX - 1), u64::MAX, Some(10)));
        assert!(!jumps_too_far(Some(5), u64::MAX, None));
        // Lower epochs are not this rule's business (they are stale).
        assert!(!jumps_too_far(Some(5), 1, Some(0)));
    }
}
