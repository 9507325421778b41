//! How long a client may keep a server's connection without using it, and how many
//! connections a server keeps open: the bounds every twopc listener (HTTP and TLS) serves
//! under, their documented defaults (docs/operations.md, "Slow and idle clients") and their
//! checked ranges. Owns no sockets.

use std::time::Duration;

/// Defaults, documented in docs/operations.md.
pub mod defaults {
    /// From accept (TLS handshake included) to the end of the first request's head, and from
    /// the first byte of any later head to its end. A real client sends a head in one write;
    /// 10 s is room for a slow link, and what the TLS handshake had before.
    pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
    /// A kept-alive connection with no request in flight and no byte of the next one is closed
    /// after this. Longer than the 90 s that the reqwest clients of twopc (and most others)
    /// keep an idle pooled connection, so that the client drops it first and a server close
    /// never races a request sent on a reused connection.
    pub const IDLE_TIMEOUT_MS: u64 = 120_000;
    /// Most connections open at once. Below the soft descriptor limit most systems start a
    /// service with (1024), leaving room for the log, the outcome index, outbound connections
    /// to peers and a PostgreSQL pool; far above what the callers of a coordinator or a
    /// participant hold (a pooled connection per concurrent request).
    pub const CONNECTIONS_MAX: usize = 512;
}

/// Shortest timeout accepted: a server that cuts every client off at once is a mistake.
pub const TIMEOUT_MS_MIN: u64 = 10;
/// Longest timeout accepted (one hour).
pub const TIMEOUT_MS_MAX: u64 = 3_600_000;
/// Most connections accepted as a cap (each costs a descriptor; no system gives a million).
pub const CONNECTIONS_MAX_LIMIT: usize = 1_000_000;

/// The bounds a server holds its clients to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Longest a connection may take from accept to its first request's head (TLS handshake
    /// included), and from the first byte of a later head to its last; past it the connection
    /// is closed.
    pub header_read_timeout: Duration,
    /// Longest a connection may sit with no request in flight and no byte of a new one.
    pub idle_timeout: Duration,
    /// Most connections open at once; at the cap the server stops accepting (the kernel's
    /// backlog holds new ones) until one closes.
    pub connections_max: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_millis(defaults::HEADER_READ_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(defaults::IDLE_TIMEOUT_MS),
            connections_max: defaults::CONNECTIONS_MAX,
        }
    }
}

/// A flag out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag} is {value}; it must be between {min} and {max}")]
pub struct ServeLimitsError {
    pub flag: &'static str,
    pub value: u64,
    pub min: u64,
    pub max: u64,
}

impl ServeLimits {
    /// The limits of `--header-read-timeout-ms`, `--idle-timeout-ms` and `--connections-max`;
    /// a flag not given takes its default.
    pub fn from_flags(
        header_read_timeout_ms: Option<u64>,
        idle_timeout_ms: Option<u64>,
        connections_max: Option<usize>,
    ) -> Result<Self, ServeLimitsError> {
        let header = header_read_timeout_ms.unwrap_or(defaults::HEADER_READ_TIMEOUT_MS);
        let idle = idle_timeout_ms.unwrap_or(defaults::IDLE_TIMEOUT_MS);
        let connections = connections_max.unwrap_or(defaults::CONNECTIONS_MAX);
        range(
            "header-read-timeout-ms",
            header,
            TIMEOUT_MS_MIN,
            TIMEOUT_MS_MAX,
        )?;
        range("idle-timeout-ms", idle, TIMEOUT_MS_MIN, TIMEOUT_MS_MAX)?;
        range(
            "connections-max",
            connections as u64,
            1,
            CONNECTIONS_MAX_LIMIT as u64,
        )?;
        Ok(Self {
            header_read_timeout: Duration::from_millis(header),
            idle_timeout: Duration::from_millis(idle),
            connections_max: connections,
        })
    }
}

fn range(flag: &'static str, value: u64, min: u64, max: u64) -> Result<(), ServeLimitsError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ServeLimitsError {
            flag,
            value,
            min,
            max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_not_given_take_the_defaults_and_out_of_range_ones_are_named() {
        assert_eq!(
            ServeLimits::from_flags(None, None, None),
            Ok(ServeLimits::default())
        );
        let given = ServeLimits::from_flags(Some(500), Some(1_000), Some(3)).unwrap();
        assert_eq!(given.header_read_timeout, Duration::from_millis(500));
        assert_eq!(given.idle_timeout, Duration::from_millis(1_000));
        assert_eq!(given.connections_max, 3);
        let error = ServeLimits::from_flags(Some(0), None, None).unwrap_err();
        assert!(error.to_string().contains("--header-read-timeout-ms is 0"));
        let error = ServeLimits::from_flags(None, Some(TIMEOUT_MS_MAX + 1), None).unwrap_err();
        assert_eq!(error.flag, "idle-timeout-ms");
        let error = ServeLimits::from_flags(None, None, Some(0)).unwrap_err();
        assert_eq!(error.flag, "connections-max");
    }
}
