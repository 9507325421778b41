//! CPU time of the processes a cell runs on (the bench's own client and every server of the
//! cluster under test), read from `/proc`, so a cell can print CPU per committed transaction:
//! a figure that a noisy shared machine disturbs far less than throughput (issue 28).

use std::time::Duration;

/// Linux reports `utime` and `stime` in clock ticks of `USER_HZ`, which the kernel's ABI fixes
/// at 100 on every architecture it runs on (`getconf CLK_TCK`).
const TICKS_PER_SECOND: u64 = 100;

/// What `/proc/<pid>/stat` says about one process's CPU time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The parent's pid.
    pub parent: u32,
    /// User plus system time of the process itself (all its threads).
    pub own: Duration,
    /// User plus system time of its children that exited and were waited for.
    pub reaped_children: Duration,
}

/// One process's [`ProcStat`], or `None` where `/proc` does not have it (not Linux, or the
/// process is gone).
pub fn stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count fields from
    // after its closing one. ppid is field 4, utime, stime, cutime and cstime fields 14 to 17.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<i64>().ok();
    let ticks = |n: i64| Duration::from_millis(n.max(0) as u64 * 1000 / TICKS_PER_SECOND);
    Some(ProcStat {
        parent: u32::try_from(number(1)?).ok()?,
        own: ticks(number(11)? + number(12)?),
        reaped_children: ticks(number(13)? + number(14)?),
    })
}

/// User plus system time of one process (all its threads, waited-for children not included).
fn cpu_of(pid: u32) -> Option<Duration> {
    stat(pid).map(|s| s.own)
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
        // Spin until the reading shows 100 ms more, bounded: a loaded machine gives this thread
        // less of the wall clock, not a reading that fails to grow.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        let mut after = before;
        while after - before < Duration::from_millis(100)
            && started.elapsed() < Duration::from_secs(60)
        {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            after = cpu_of(me).expect("still readable");
        }
        assert!(
            after - before >= Duration::from_millis(100),
            "{before:?} -> {after:?}"
        );
    }

    #[test]
    fn a_child_is_seen_alive_under_its_parent_then_in_its_reaped_time() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .spawn()
            .expect("sh runs");
        let seen = stat(child.id()).expect("the child is alive until waited for");
        assert_eq!(seen.parent, me);
        let before = stat(me).expect("readable").reaped_children;
        child.wait().expect("the child exits");
        let after = stat(me).expect("readable").reaped_children;
        // Counting to 200000 in sh takes well over 10 ms of CPU anywhere.
        assert!(
            after >= before + Duration::from_millis(10),
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
