//! What msrd has measured of each cell: the rate its wireless sockets deliver at
//! together and the cell's round trip, forgotten when no sample has confirmed them for
//! [`MEMORY`].
//!
//! A connection that moves in starts from nothing: the kernel restores its sequence
//! numbers, not its congestion control's model, and BBR's startup paces at many times
//! the rate of a cell it has never measured. The profile is what the new MSR knows of
//! the new cell: a restored socket's pacing is capped at [`pacing_cap`] of the cell's
//! rate until its own model stands ([`cap_for`]).
//!
//! Pure code; the relay feeds it (`crate::relay`), the handoff reads it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a measurement stands without a new one as high (rate) or as low (RTT).
pub const MEMORY: Duration = Duration::from_secs(30);

/// How long a connection's latest rate counts in its cell's sum: a few of the relay's
/// samples (every 100 ms), so that a connection that ended or left drops out.
const CURRENT: Duration = Duration::from_millis(300);

/// One wireless socket's TCP_INFO, as the relay samples it.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Delivery rate, bytes/s.
    pub rate: u64,
    /// The rate was limited by what the socket had to send, not by the cell.
    pub app_limited: bool,
    pub min_rtt: Option<Duration>,
}

/// One cell's measurements.
#[derive(Debug, Default, Clone)]
struct CellProfile {
    /// The highest rate the cell's connections delivered at together while one of them
    /// was limited by the cell (bytes/s), and when.
    rate: Option<(u64, Instant)>,
    /// The lowest round trip, and when.
    min_rtt: Option<(Duration, Instant)>,
    /// Each connection's latest rate, whether its sender limited it, and when: several
    /// connections share a cell, and the cell's rate is their sum, not the fastest one's.
    current: HashMap<u64, (u64, bool, Instant)>,
}

impl CellProfile {
    /// Takes connection `conn`'s sample in. The sum of the connections' rates is the
    /// cell's when one of them was limited by the cell; when every sender limited its
    /// own, it says only how fast they were fed, and counts only when nothing better
    /// stands.
    fn observe(&mut self, conn: u64, now: Instant, s: Sample) {
        let fresh = |at: Instant| now.duration_since(at) < MEMORY;
        self.current.insert(conn, (s.rate, s.app_limited, now));
        self.current
            .retain(|_, &mut (_, _, at)| now.duration_since(at) < CURRENT);
        let sum = self.current.values().map(|&(r, _, _)| r).sum::<u64>();
        let by_senders = self.current.values().all(|&(_, limited, _)| limited);
        if sum > 0 {
            match self.rate {
                Some((r, at)) if fresh(at) && (r >= sum || by_senders) => {}
                _ => self.rate = Some((sum, now)),
            }
        }
        if let Some(m) = s.min_rtt.filter(|m| !m.is_zero()) {
            match self.min_rtt {
                Some((r, at)) if fresh(at) && r <= m => {}
                _ => self.min_rtt = Some((m, now)),
            }
        }
    }

    fn rate(&self, now: Instant) -> Option<u64> {
        self.rate
            .filter(|&(_, at)| now.duration_since(at) < MEMORY)
            .map(|(r, _)| r)
    }

    fn min_rtt(&self, now: Instant) -> Option<Duration> {
        self.min_rtt
            .filter(|&(_, at)| now.duration_since(at) < MEMORY)
            .map(|(r, _)| r)
    }
}

/// The profiles of every cell, by interface.
#[derive(Debug, Default)]
pub struct Profiles {
    cells: Mutex<HashMap<String, CellProfile>>,
}

impl Profiles {
    fn cells(&self) -> std::sync::MutexGuard<'_, HashMap<String, CellProfile>> {
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes connection `conn`'s sample of `cell` in.
    pub fn observe(&self, cell: &str, conn: u64, now: Instant, s: Sample) {
        let mut cells = self.cells();
        match cells.get_mut(cell) {
            Some(p) => p.observe(conn, now, s),
            None => {
                let mut p = CellProfile::default();
                p.observe(conn, now, s);
                cells.insert(cell.to_string(), p);
            }
        }
    }

    /// `cell`'s rate (bytes/s), if measured within [`MEMORY`].
    pub fn rate(&self, cell: &str, now: Instant) -> Option<u64> {
        self.cells().get(cell).and_then(|p| p.rate(now))
    }

    /// `cell`'s round trip, if measured within [`MEMORY`].
    pub fn min_rtt(&self, cell: &str, now: Instant) -> Option<Duration> {
        self.cells().get(cell).and_then(|p| p.min_rtt(now))
    }

    /// Every cell measured: (interface, rate in bytes/s, round trip).
    pub fn all(&self, now: Instant) -> Vec<(String, Option<u64>, Option<Duration>)> {
        let mut v: Vec<_> = self
            .cells()
            .iter()
            .map(|(k, p)| (k.clone(), p.rate(now), p.min_rtt(now)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// A restored socket's pacing cap over the cell's rate: BBR's probing gain, so that the
/// socket can find a cell faster than measured, but not flood one it does not know.
pub const PACING_GAIN: (u64, u64) = (5, 4);

/// How long a restored socket stays capped: until BBR's startup, which reads the
/// blackout's ACKs as a path of unknown rate, has ended (a few round trips) and its
/// bandwidth filter (ten round trips) holds only samples taken under the cap.
pub fn cap_for(min_rtt: Option<Duration>) -> Duration {
    let rtt = min_rtt.unwrap_or(Duration::from_millis(100));
    (rtt * 20).clamp(Duration::from_secs(1), Duration::from_secs(5))
}

/// The pacing cap (bytes/s) for a socket restored into a cell measured at `rate`.
pub fn pacing_cap(rate: u64) -> u64 {
    rate.saturating_mul(PACING_GAIN.0) / PACING_GAIN.1
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn s(rate: u64, app_limited: bool, rtt_ms: u32) -> Sample {
        Sample {
            rate,
            app_limited,
            min_rtt: Some(MS * rtt_ms),
        }
    }

    #[test]
    fn the_best_rate_and_round_trip_stand_for_the_memory() {
        let t0 = Instant::now();
        let p = Profiles::default();
        assert_eq!(p.rate("cell0", t0), None);
        p.observe("cell0", 1, t0, s(1_000_000, false, 12));
        p.observe("cell0", 1, t0 + MS * 500, s(800_000, false, 15));
        assert_eq!(p.rate("cell0", t0 + MS * 500), Some(1_000_000));
        assert_eq!(p.min_rtt("cell0", t0 + MS * 500), Some(MS * 12));
        assert_eq!(p.rate("cell1", t0), None);
        // Forgotten after the memory without a sample as good...
        assert_eq!(p.rate("cell0", t0 + MEMORY), None);
        // ...and a lower one then stands.
        p.observe("cell0", 1, t0 + MEMORY, s(600_000, false, 20));
        assert_eq!(p.rate("cell0", t0 + MEMORY), Some(600_000));
        assert_eq!(p.min_rtt("cell0", t0 + MEMORY), Some(MS * 20));
    }

    #[test]
    fn connections_sharing_the_cell_add_up() {
        let t0 = Instant::now();
        let p = Profiles::default();
        p.observe("cell0", 1, t0, s(600_000, false, 10));
        p.observe("cell0", 2, t0 + MS, s(500_000, false, 10));
        p.observe("cell0", 3, t0 + MS * 2, s(100_000, true, 10));
        assert_eq!(p.rate("cell0", t0 + MS * 2), Some(1_200_000));
        // A connection that stopped reporting drops out of the sum (the best stands).
        p.observe("cell0", 1, t0 + MS * 400, s(700_000, false, 10));
        assert_eq!(p.rate("cell0", t0 + MS * 400), Some(1_200_000));
    }

    #[test]
    fn a_sender_limited_sum_counts_only_when_nothing_stands() {
        let t0 = Instant::now();
        let p = Profiles::default();
        p.observe("cell0", 1, t0, s(50_000, true, 10));
        assert_eq!(p.rate("cell0", t0), Some(50_000));
        p.observe("cell0", 1, t0 + MS, s(1_000_000, false, 10));
        p.observe("cell0", 1, t0 + MS * 2, s(2_000_000, true, 10));
        assert_eq!(p.rate("cell0", t0 + MS * 2), Some(1_000_000));
    }

    #[test]
    fn the_cap_is_the_probing_gain_over_the_rate_for_twenty_round_trips() {
        assert_eq!(pacing_cap(1_000_000), 1_250_000);
        assert_eq!(pacing_cap(u64::MAX), u64::MAX / 4);
        assert_eq!(cap_for(Some(MS * 100)), Duration::from_secs(2));
        assert_eq!(cap_for(Some(MS * 5)), Duration::from_secs(1));
        assert_eq!(cap_for(None), Duration::from_secs(2));
        assert_eq!(
            cap_for(Some(Duration::from_secs(1))),
            Duration::from_secs(5)
        );
    }
}
