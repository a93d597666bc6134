//! Time: wall-clock as the handoff log and the status page record it, and a monotonic
//! clock for deadlines that a clock step must not move.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the UNIX epoch (handoff log phases).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Nanoseconds on a monotonic clock, counted from this process's first call.
pub fn mono_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// [`mono_ns`] in microseconds.
pub fn mono_us() -> u64 {
    mono_ns() / 1000
}
