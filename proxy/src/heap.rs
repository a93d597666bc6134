//! Gives memory back to the system once a crowd of connections has gone.
//!
//! glibc's allocator keeps the memory freed by closed connections in its arenas (one
//! per thread that allocated, fragmented by the connections' interleaved lifetimes):
//! after 9 900 relayed connections closed, msrd's RSS stayed at its peak (`bench
//! conns`). `malloc_trim` hands the free pages of every arena back. It walks the
//! arenas, so it runs only after the session count has fallen well below its peak
//! since the last trim, at most every [`EVERY`].

use std::sync::Arc;
use std::time::Duration;

use crate::daemon::Daemon;

/// How often the session count is looked at.
const EVERY: Duration = Duration::from_secs(5);

/// Trims when the sessions have fallen to half their peak since the last trim, or
/// fewer, and the peak was at least this many (fewer hold too little to be worth it).
const MIN_PEAK: usize = 256;

/// Whether to trim now, given the sessions now and their peak since the last trim.
pub fn due(now: usize, peak: usize) -> bool {
    peak >= MIN_PEAK && now <= peak / 2
}

/// Runs until msrd exits.
pub async fn run(d: Arc<Daemon>) {
    let mut peak = 0;
    loop {
        tokio::time::sleep(EVERY).await;
        let now = d.sessions.len();
        peak = peak.max(now);
        if due(now, peak) {
            let freed = trim();
            tracing::debug!(sessions = now, peak, freed, "heap trimmed");
            peak = now;
        }
    }
}

/// Returns the allocator's free pages to the system; true if any were.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim only walks the allocator's own arenas; any pad is valid.
    unsafe { libc::malloc_trim(0) != 0 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_after_a_crowd_has_mostly_gone() {
        assert!(!due(0, 0), "nothing was ever there");
        assert!(
            !due(10, 200),
            "too few at the peak to be worth a walk of the arenas"
        );
        assert!(!due(9000, 9900), "most are still open");
        assert!(due(4950, 9900));
        assert!(due(0, 9900));
        assert!(due(0, MIN_PEAK));
    }
}
