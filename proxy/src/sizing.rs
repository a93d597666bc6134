//! The wireless side sized for its cell (`[wireless] sizing = "cell"`, the default).
//!
//! msrd sits where the cell's rate becomes visible: its wireless sockets measure it
//! (`TCP_INFO`'s delivery rate). Three choices follow, for every key the operator
//! leaves unset:
//!
//! * **Congestion control chosen by msrd**, never inherited from the router's default:
//!   the first of [`PREFERRED`] the kernel offers. BBR models the path's rate and
//!   round trip instead of reading every loss as congestion, so random loss on a cell
//!   does not halve its rate, and it keeps the cell's queue near empty.
//! * **A small unsent queue** on each wireless socket (`TCP_NOTSENT_LOWAT`,
//!   [`NOTSENT_LOWAT`]): what the wireless side cannot send yet stays on the fixed
//!   side, where the window below bounds it.
//! * **The fixed side's receive buffer follows the wireless side** ([`FixedWindow`]):
//!   twice what the wireless side delivers in one fixed-side round trip. The buffer,
//!   not a window clamp, bounds what waits at the MSR: the window a receiver offers is
//!   its free buffer space, so a clamp caps the bytes in flight but lets unread bytes
//!   pile up to the (autotuned, megabytes) buffer. With the buffer sized so, the FH
//!   can keep the wireless side busy with a round trip of headroom, its bytes wait at
//!   the FH rather than in the MSR's receive queue, interactive data is not stuck
//!   behind megabytes, and a handoff moves little.
//!
//! Pure code: the rules and their numbers. The relay applies them
//! ([`crate::relay`]), the daemon picks the congestion control once at start.

use std::time::{Duration, Instant};

use itcp_config::TcpTuning;
use itcp_handoff::repair::TcpInfo;

/// Congestion controls msrd picks from for the wireless side, in order.
pub(crate) const PREFERRED: [&str; 2] = ["bbr", "cubic"];

/// Unsent bytes a wireless socket may hold (`TCP_NOTSENT_LOWAT`): tens of ms of a fast
/// cell, so the relay refills it well before it runs dry even when it is scheduled
/// late (32 KiB cost a 20 Mbit/s cell a quarter of its goodput across moves in
/// `bench wireless`).
pub(crate) const NOTSENT_LOWAT: u32 = 128 * 1024;

/// The fixed side's buffer never goes below this (the kernel's default start): a
/// connection starts, or its wireless side is idle, and the FH must still be able to
/// send a burst.
pub(crate) const MIN_BUFFER: u32 = 64 * 1024;

/// Nor above this: no cell and fixed path need more (2 × 100 Mbit/s × 2.5 s), and a
/// wrong sample must not let one FH fill the MSR's memory.
pub(crate) const MAX_BUFFER: u32 = 64 << 20;

/// How often the relay resizes a connection's fixed-side window.
pub(crate) const EVERY: Duration = Duration::from_millis(100);

/// How long the highest delivery rate seen stands for the wireless side's rate: a
/// sample that is app-limited or taken while BBR probes its round trip is lower than
/// the cell's rate, and must not shrink the window.
const RATE_MEMORY: Duration = Duration::from_secs(10);

/// Fills in msrd's choices for the wireless keys `t` leaves unset: congestion control
/// `cc` (see [`PREFERRED`]) and the unsent queue.
pub(crate) fn fill_wireless(t: &mut TcpTuning, cc: Option<&str>) {
    if t.congestion_control.is_none() {
        t.congestion_control = cc.map(str::to_string);
    }
    t.notsent_lowat.get_or_insert(NOTSENT_LOWAT);
}

/// The wireless congestion control msrd picks: the first of [`PREFERRED`] that a
/// socket here accepts (the kernel loads its module for a process with
/// CAP_NET_ADMIN); None leaves the kernel's default, with a warning.
pub(crate) fn pick_congestion() -> Option<String> {
    let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    for cc in PREFERRED {
        if probe.set_tcp_congestion(cc.as_bytes()).is_ok() {
            tracing::info!(congestion_control = cc, "wireless side: congestion control chosen for the cells ([wireless] congestion_control overrides)");
            return Some(cc.to_string());
        }
    }
    tracing::warn!(tried = ?PREFERRED, "wireless side: none of msrd's congestion controls is available; the kernel's default stays");
    None
}

/// The fixed side's receive buffer (SO_RCVBUF's value; the kernel doubles it for its
/// own overhead) for a wireless side delivering `rate` bytes/s over a fixed path of
/// round trip `rtt`: twice the bytes that path carries at that rate, at least
/// [`MIN_BUFFER`], at most [`MAX_BUFFER`].
pub(crate) fn buffer_for(rate: u64, rtt: Duration) -> u32 {
    let bdp = rate as u128 * rtt.as_micros() / 1_000_000;
    (2 * bdp).clamp(MIN_BUFFER as u128, MAX_BUFFER as u128) as u32
}

/// The fixed path's round trip as a socket's TCP_INFO gives it: its minimum, else the
/// receiver's estimate, else its smoothed RTT; None while it has no sample. A
/// receiver's smoothed RTT is the handshake's, its minimum the path's. A socket
/// restored by a handoff has no minimum until it has data acknowledged (a download's
/// fixed socket never does): taken as a round trip, the kernel's "no sample"
/// (`u32::MAX` µs, 71 minutes) sized the buffer for gigabytes.
pub(crate) fn path_rtt(i: &TcpInfo) -> Option<Duration> {
    let us = [i.min_rtt_us.unwrap_or(0), i.rcv_rtt_us, i.rtt_us]
        .into_iter()
        .find(|&us| us > 0)?;
    Some(Duration::from_micros(us.into()))
}

/// Whether the relay sizes a connection's fixed side: msrd sizes the wireless side
/// for the cell, and the operator fixed neither `[fixed] recv_buffer` nor
/// `window_clamp`.
pub(crate) fn sizes_fixed(for_cell: bool, fixed: &TcpTuning) -> bool {
    for_cell && fixed.recv_buffer.is_none() && fixed.window_clamp.is_none()
}

/// What the relay samples each [`EVERY`] for [`FixedWindow::next`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// The wireless side's latest delivery rate, bytes/s.
    pub rate: u64,
    /// The fixed path's round trip.
    pub rtt: Duration,
    /// The wireless side ran dry while the FH was sending: its latest rate sample
    /// app-limited, nothing unsent on it, nothing waiting in the fixed socket, and
    /// data from the FH within two round trips. The FH is held back by the window,
    /// not idle.
    pub starved: bool,
}

/// Starved samples in a row before the buffer grows: one alone may be the instant
/// after the relay moved everything across.
const STARVED_IN_A_ROW: u32 = 2;

/// At most this many times [`buffer_for`] the best rate: a wireless side that keeps
/// running dry grows the buffer by half each time, but not without end.
const MAX_GROWTH: u32 = 16;

/// One connection's fixed-side buffer, following its wireless side's delivery rate.
#[derive(Debug, Default)]
pub(crate) struct FixedWindow {
    /// The highest delivery rate seen (bytes/s) and when.
    best: Option<(u64, Instant)>,
    /// A buffer grown because the wireless side ran dry, and when: it stands as a floor
    /// as long as a best rate does.
    grown: Option<(u32, Instant)>,
    /// The buffer last applied.
    applied: Option<u32>,
    /// Starved samples in a row.
    starved: u32,
}

impl FixedWindow {
    /// A window for a socket whose buffer is `current` now (SO_RCVBUF's value): that
    /// stands as a floor for [`RATE_MEMORY`], while the wireless side measures its rate.
    /// A restored socket arrives with the buffer its connection had, and bytes the FH
    /// sent into the window that buffer offered are in flight: a smaller one at once
    /// would drop them.
    pub(crate) fn starting_at(now: Instant, current: u32) -> FixedWindow {
        FixedWindow {
            grown: Some((current, now)),
            applied: Some(current),
            ..FixedWindow::default()
        }
    }

    /// The buffer to apply at `now` for sample `s`; None when the one applied is
    /// within an eighth of it (no syscall for noise). A rate sample taken while the
    /// wireless side was app-limited is lower than the cell's rate; the highest of the
    /// last [`RATE_MEMORY`] stands for it, and a wireless side that ran dry grows the
    /// buffer by half.
    pub(crate) fn next(&mut self, now: Instant, s: Sample) -> Option<u32> {
        let fresh = |at: Instant| now.duration_since(at) < RATE_MEMORY;
        let best = match self.best {
            Some((r, at)) if r >= s.rate && fresh(at) => r,
            _ => {
                self.best = Some((s.rate, now));
                s.rate
            }
        };
        let by_rate = buffer_for(best, s.rtt);
        if self.grown.is_some_and(|(_, at)| !fresh(at)) {
            self.grown = None;
        }
        self.starved = if s.starved { self.starved + 1 } else { 0 };
        if self.starved >= STARVED_IN_A_ROW {
            self.starved = 0;
            let from = self.applied.unwrap_or(by_rate).max(by_rate);
            let cap = by_rate.saturating_mul(MAX_GROWTH).min(MAX_BUFFER);
            self.grown = Some(((from + from / 2).min(cap), now));
        }
        let mut w = by_rate.max(self.grown.map_or(0, |(g, _)| g));
        // Down by a quarter at most per sample: the FH may have bytes in flight in the
        // window the larger buffer offered (a window is never taken back), and the
        // queue drains meanwhile.
        if let Some(a) = self.applied {
            w = w.max(a - a / 4);
        }
        match self.applied {
            Some(a) if a.abs_diff(w) <= a / 8 => None,
            _ => {
                self.applied = Some(w);
                Some(w)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_buffer_is_two_fixed_path_round_trips_of_the_wireless_rate() {
        // 20 Mbit/s over an 80 ms fixed path: 200 kB in flight, 400 kB of buffer.
        assert_eq!(buffer_for(2_500_000, 80 * MS), 400_000);
        // A slow cell or a short path: the floor.
        assert_eq!(buffer_for(250_000, 10 * MS), MIN_BUFFER);
        assert_eq!(buffer_for(0, 80 * MS), MIN_BUFFER);
        // Never past the bound, whatever the sample.
        assert_eq!(buffer_for(u64::MAX, Duration::from_secs(100)), MAX_BUFFER);
    }

    fn sample(rate: u64, starved: bool) -> Sample {
        Sample {
            rate,
            rtt: 80 * MS,
            starved,
        }
    }

    #[test]
    fn a_socket_without_a_round_trip_sample_has_no_path_rtt() {
        let info = |min_rtt_us, rcv_rtt_us, rtt_us| TcpInfo {
            min_rtt_us,
            rcv_rtt_us,
            rtt_us,
            ..TcpInfo::default()
        };
        assert_eq!(path_rtt(&info(None, 0, 0)), None);
        assert_eq!(path_rtt(&info(Some(0), 0, 0)), None);
        // Restored, receiving only: the receiver's estimate.
        assert_eq!(
            path_rtt(&info(None, 2500, 0)),
            Some(Duration::from_micros(2500))
        );
        assert_eq!(path_rtt(&info(None, 0, 2000)), Some(2 * MS));
        assert_eq!(
            path_rtt(&info(Some(1500), 2500, 9000)),
            Some(Duration::from_micros(1500))
        );
    }

    #[test]
    fn a_lower_sample_does_not_shrink_the_buffer_until_the_best_one_is_old() {
        let t0 = Instant::now();
        let mut w = FixedWindow::default();
        assert_eq!(w.next(t0, sample(2_500_000, false)), Some(400_000));
        // Same rate: nothing to do.
        assert_eq!(w.next(t0 + 100 * MS, sample(2_500_000, false)), None);
        // An app-limited sample: the best one stands.
        assert_eq!(w.next(t0 + 200 * MS, sample(100_000, false)), None);
        // Faster: the buffer grows at once.
        assert_eq!(
            w.next(t0 + 300 * MS, sample(5_000_000, false)),
            Some(800_000)
        );
        // Past RATE_MEMORY the latest sample counts, coming down a quarter at a time.
        let late = t0 + 300 * MS + RATE_MEMORY;
        assert_eq!(w.next(late, sample(1_000_000, false)), Some(600_000));
        assert_eq!(
            w.next(late + 100 * MS, sample(1_000_000, false)),
            Some(450_000)
        );
        for i in 2..20 {
            w.next(late + i * 100 * MS, sample(1_000_000, false));
        }
        assert_eq!(w.applied, Some(160_000));
    }

    #[test]
    fn a_restored_socket_keeps_its_buffer_while_the_rate_is_measured() {
        let t0 = Instant::now();
        let mut w = FixedWindow::starting_at(t0, 500_000);
        // No rate yet (a fresh wireless socket): the buffer stays.
        assert_eq!(w.next(t0, sample(0, false)), None);
        assert_eq!(w.next(t0 + 5_000 * MS, sample(1_000_000, false)), None);
        // Once the floor is old, it comes down to the rate's figure, gently.
        let late = t0 + RATE_MEMORY + 100 * MS;
        assert_eq!(w.next(late, sample(1_000_000, false)), Some(375_000));
    }

    #[test]
    fn a_wireless_side_that_runs_dry_grows_the_buffer_by_half_up_to_a_bound() {
        let t0 = Instant::now();
        let at = |i: u32| t0 + i * 100 * MS;
        let mut w = FixedWindow::default();
        assert_eq!(w.next(at(0), sample(1_000_000, false)), Some(160_000));
        // One starved sample alone changes nothing; two in a row grow it.
        assert_eq!(w.next(at(1), sample(1_000_000, true)), None);
        assert_eq!(w.next(at(2), sample(1_000_000, false)), None);
        assert_eq!(w.next(at(3), sample(1_000_000, true)), None);
        assert_eq!(w.next(at(4), sample(1_000_000, true)), Some(240_000));
        assert_eq!(w.next(at(5), sample(1_000_000, true)), None);
        assert_eq!(w.next(at(6), sample(1_000_000, true)), Some(360_000));
        // Not starved: the grown buffer stands.
        assert_eq!(w.next(at(7), sample(1_000_000, false)), None);
        for i in 8..90 {
            w.next(at(i), sample(1_000_000, true));
        }
        assert_eq!(w.applied, Some(160_000 * MAX_GROWTH));
        // Once it is old, the rate rules again (coming down a quarter at a time).
        assert_eq!(
            w.next(at(90) + RATE_MEMORY, sample(1_000_000, false)),
            Some(1_920_000)
        );
    }

    #[test]
    fn the_operators_fixed_keys_win() {
        let none = TcpTuning::default();
        assert!(sizes_fixed(true, &none));
        assert!(!sizes_fixed(false, &none));
        for t in [
            TcpTuning {
                recv_buffer: Some(65536),
                ..TcpTuning::default()
            },
            TcpTuning {
                window_clamp: Some(98304),
                ..TcpTuning::default()
            },
        ] {
            assert!(!sizes_fixed(true, &t), "{t:?}");
        }
    }

    #[test]
    fn msrd_fills_only_what_the_operator_left_unset() {
        let mut t = TcpTuning::default();
        fill_wireless(&mut t, Some("bbr"));
        assert_eq!(t.congestion_control.as_deref(), Some("bbr"));
        assert_eq!(t.notsent_lowat, Some(NOTSENT_LOWAT));
        let mut t = TcpTuning {
            congestion_control: Some("cubic".into()),
            notsent_lowat: Some(1 << 20),
            ..TcpTuning::default()
        };
        fill_wireless(&mut t, Some("bbr"));
        assert_eq!(t.congestion_control.as_deref(), Some("cubic"));
        assert_eq!(t.notsent_lowat, Some(1 << 20));
    }
}
