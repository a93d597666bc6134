//! Wall-clock time as the handoff log and the status page record it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the UNIX epoch (handoff log phases).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
