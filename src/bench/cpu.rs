//! CPU time of the processes a cell runs on (the bench's own client and every server of the
//! cluster under test), read from `/proc`, so a cell can print CPU per committed transaction:
//! a figure that a noisy shared machine disturbs far less than throughput (issue 28).

use std::time::Duration;

/// Linux reports `utime` and `stime` in clock ticks of `USER_HZ`, which the kernel's ABI fixes
/// at 100 on every architecture it runs on (`getconf CLK_TCK`).
const TICKS_PER_SECOND: u64 = 100;

/// User plus system time of one process (all its threads, waited-for children not included),
/// or `None` where `/proc` does not have it (not Linux, or the process is gone).
fn cpu_of(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count fields from
    // after its closing one. utime and stime are fields 14 and 15, so the 12th and 13th after.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis(
        (user + system) * 1000 / TICKS_PER_SECOND,
    ))
}

/// The summed CPU time of `pids`, or `None` if any of them cannot be read (a figure missing a
/// process would understate the cost).
pub fn cpu_of_all(pids: &[u32]) -> Option<Duration> {
    pids.iter().map(|&pid| cpu_of(pid)).sum()
}

/// CPU microseconds per committed transaction between two readings.
pub fn micros_per_tx(
    before: Option<Duration>,
    after: Option<Duration>,
    committed: u64,
) -> Option<f64> {
    match (before, after) {
        (Some(before), Some(after)) if committed > 0 && after >= before => {
            Some((after - before).as_secs_f64() * 1e6 / committed as f64)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_that_grows_with_work() {
        let me = std::process::id();
        let before = cpu_of(me).expect("/proc/self/stat is readable on Linux");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = cpu_of(me).expect("still readable");
        // 200 ms of spinning is at least 100 ms of CPU even on a busy machine.
        assert!(
            after - before >= Duration::from_millis(100),
            "{before:?} -> {after:?}"
        );
    }

    #[test]
    fn a_process_that_cannot_be_read_gives_no_figure() {
        assert_eq!(cpu_of_all(&[std::process::id(), u32::MAX]), None);
        assert_eq!(micros_per_tx(Some(Duration::ZERO), None, 5), None);
        assert_eq!(
            micros_per_tx(Some(Duration::ZERO), Some(Duration::from_millis(1)), 0),
            None
        );
        assert_eq!(
            micros_per_tx(Some(Duration::ZERO), Some(Duration::from_millis(1)), 10),
            Some(100.0)
        );
    }
}
