//! Phase-two retry delays: capped exponential backoff with "equal jitter" (half fixed, half
//! random), so that many deliveries to a participant that comes back do not all retry at once.

/// The delay before retry number `failures` (1 after the first failure), in milliseconds.
/// `jitter` is any random number; the same inputs always give the same delay.
pub fn retry_delay_ms(failures: u32, base_ms: u64, max_ms: u64, jitter: u64) -> u64 {
    let shift = failures.saturating_sub(1).min(63);
    let exponential = base_ms.saturating_mul(1u64 << shift).min(max_ms);
    let half = exponential / 2;
    half + jitter % (exponential - half + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        // With jitter 0 the delay is exactly half of the exponential step.
        let steps: Vec<u64> = (1..=8).map(|n| retry_delay_ms(n, 100, 2000, 0)).collect();
        assert_eq!(steps, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(retry_delay_ms(1000, 100, 2000, 0), 1000);
    }

    #[test]
    fn jitter_stays_within_the_step() {
        for jitter in [0, 1, 77, u64::MAX / 3, u64::MAX] {
            let delay = retry_delay_ms(3, 100, 10_000, jitter);
            assert!((200..=400).contains(&delay), "{delay}");
        }
        assert_eq!(retry_delay_ms(3, 100, 10_000, 200), 400);
        assert_eq!(retry_delay_ms(3, 100, 10_000, 201), 200);
    }

    #[test]
    fn huge_attempt_counts_do_not_overflow() {
        assert_eq!(
            retry_delay_ms(u32::MAX, u64::MAX, u64::MAX, 0),
            u64::MAX / 2
        );
    }
}
