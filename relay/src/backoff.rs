//! The wait between attempts of one intent (and of one report): exponential from a base, capped,
//! with its upper half spread by a jitter the caller supplies (the planner draws nothing).

/// The wait after the `attempt`th unknown outcome (from 1): `base * 2^(attempt-1)` capped at
/// `max`, of which the upper half is spread by the jitter (so relays that failed together do
/// not retry together, and no wait is shorter than half its step).
pub fn backoff_ms(base_ms: u64, max_ms: u64, attempt: u32, jitter_permille: u16) -> u64 {
    let doublings = attempt.saturating_sub(1).min(32);
    let step = base_ms.saturating_mul(1u64 << doublings).min(max_ms);
    let jitter = u64::from(jitter_permille.min(1000));
    step / 2 + (step - step / 2) * jitter / 1000
}
