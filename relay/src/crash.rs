//! The relay's named crash point. Compiled in only with the `failpoints` feature; armed with
//! `FAILPOINTS=<name>=return`, the process aborts there (like a SIGKILL: no cleanup).

/// The receiver answered for an intent; the `delivered` report is not yet sent. A restarted
/// relay finds the intent still pending and delivers it again under the same `event_id`: the
/// receiver must answer the repeat without a second effect.
pub const AFTER_DELIVERY_BEFORE_MARK: &str = "relay::after_delivery_before_mark";

pub(crate) fn crash_point(name: &'static str) {
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
    fail::fail_point!(name, |_| std::process::abort());
}
