//! Loopback ports for nodes that are killed and restarted on the same address.
//!
//! A port handed out by `bind(127.0.0.1:0)` lies in the kernel's ephemeral range, and while its
//! node is down any outbound connection on the machine (a proxy dialling a participant, a
//! participant asking the coordinator) may be given it as its local port, or another
//! `bind(0)` may take it; the restarted node then fails with "address already in use" or, worse,
//! its peers reach some other server there. So node ports come from *below* the ephemeral range,
//! where the kernel never hands out ports on its own, and each one is reserved with a lock file
//! that this process holds until it exits, so that parallel test processes never share one.

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

/// How many ports below the ephemeral range the pool spans.
const POOL_SIZE: u16 = 8192;
/// The lowest port the pool ever uses (below it live well-known services).
const POOL_FLOOR: u16 = 10_000;

/// Lock files of the ports this process reserved: held until it exits.
static RESERVED: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A loopback port that no other process using this function holds, that nothing listens on
/// now, and that the kernel will not give to an outbound connection or a `bind(0)` later.
pub fn free_port() -> u16 {
    let (low, high) = pool();
    let span = u32::from(high - low);
    let start = fastrand::u32(0..span);
    let dir = lock_dir();
    for offset in 0..span {
        let port = low + ((start + offset) % span) as u16;
        let Ok(lock) = File::create(dir.join(format!("{port}.lock"))) else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        RESERVED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(lock);
        return port;
    }
    panic!(
        "no free loopback port in {low}..{high} (lock files in {})",
        dir.display()
    );
}

/// `[low, high)`: the ports just below the kernel's ephemeral range.
fn pool() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    assert!(
        ephemeral_low > POOL_FLOOR + 1024,
        "the ephemeral port range starts at {ephemeral_low}: no room below it for test ports"
    );
    let low = ephemeral_low.saturating_sub(POOL_SIZE).max(POOL_FLOOR);
    (low, ephemeral_low)
}

fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("twopc-test-ports");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("cannot create {}: {e}", dir.display());
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_below_the_ephemeral_range_and_are_never_handed_out_twice() {
        let (low, high) = pool();
        let ports: Vec<u16> = (0..64).map(|_| free_port()).collect();
        for port in &ports {
            assert!((low..high).contains(port), "{port} outside {low}..{high}");
        }
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ports.len(),
            "a port was handed out twice: {ports:?}"
        );
    }
}
