//! Measuring what a move costs the MH: association with the new cell (the emulator's
//! history) → the first byte its application reads after it, and where that time went
//! (the new MSR's handoff record). Shared by the mobility and network tests.

use std::io::Read;

use itcp_handoff::log::{Record, Role};

use crate::emu::AssocEvent;
use crate::lab::Lab;
use crate::stream::StreamCheck;
use crate::sys::mono_ns;

/// Reads `s` to its end, verifying the seeded stream and timestamping every read
/// (CLOCK_MONOTONIC ns): (bytes, read times).
pub fn read_timestamped(mut s: impl Read, seed: u64) -> Result<(u64, Vec<u64>), String> {
    let mut check = StreamCheck::new(seed);
    let mut buf = vec![0u8; 64 * 1024];
    let (mut total, mut reads) = (0u64, Vec::new());
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok((total, reads)),
            Ok(n) => {
                reads.push(mono_ns());
                check.check(&buf[..n]).map_err(|m| m.to_string())?;
                total += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read at byte {total}: {e}")),
        }
    }
}

/// The instants (CLOCK_MONOTONIC ns) the MH joined a cell right after a blackout.
pub fn joins(events: &[AssocEvent]) -> Vec<u64> {
    events
        .windows(2)
        .filter(|w| w[0].cells.is_empty() && !w[1].cells.is_empty())
        .map(|w| w[1].t_ns)
        .collect()
}

/// Per join: ms to the first read after it (None: nothing was read after it).
pub fn to_first_byte(joins: &[u64], reads: &[u64]) -> Vec<Option<f64>> {
    joins
        .iter()
        .map(|&t| {
            reads
                .iter()
                .find(|&&r| r > t)
                .map(|&r| (r - t) as f64 / 1e6)
        })
        .collect()
}

/// Median and p95 of `v`.
pub fn median_p95(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let p95 = s[((s.len() as f64 * 0.95).ceil() as usize).clamp(1, s.len()) - 1];
    (crate::report::median(&s), p95)
}

/// Where one move's time went, in ms from the join: the new MSR's handoff record
/// (greeting or detection there, restored, resumed; NaN when absent).
#[derive(Debug, Clone, Copy)]
pub struct MovePhases {
    pub greeting: f64,
    pub restored: f64,
    pub resumed: f64,
    pub bytes_moved: u64,
}

/// Per join, the phases of the new MSR's handoff record for it: the first record
/// whose greeting (or detection) came at most 1 ms before the join or after it.
pub fn phases(lab: &Lab, joins: &[u64]) -> Vec<MovePhases> {
    let wall_minus_mono_us = crate::scenario::wall_minus_mono_us();
    let news: Vec<Record> = (1..=lab.msrs())
        .flat_map(|k| lab.handoff_records(k))
        .filter(|r| r.role == Role::New)
        .collect();
    joins
        .iter()
        .map(|&t| {
            let join_us = (t / 1000) as i64 + wall_minus_mono_us;
            let rec = news
                .iter()
                .filter(|r| {
                    r.phases
                        .greeting
                        .is_some_and(|g| g as i64 >= join_us - 1000)
                })
                .min_by_key(|r| r.phases.greeting);
            let since = |p: Option<u64>| p.map_or(f64::NAN, |p| (p as i64 - join_us) as f64 / 1e3);
            let p = rec.map(|r| r.phases.clone()).unwrap_or_default();
            MovePhases {
                greeting: since(p.greeting),
                restored: since(p.restored),
                resumed: since(p.resumed),
                bytes_moved: rec.and_then(|r| r.bytes_moved).unwrap_or(0),
            }
        })
        .collect()
}

/// Prints, per join, where the time to the first byte went (see [`phases`]).
pub fn print_phases(lab: &Lab, joins: &[u64], first: &[f64]) {
    for (i, (p, m)) in phases(lab, joins).iter().zip(first).enumerate() {
        eprintln!(
            "move {}: from the join, ms: greeting/detection at the new MSR {:.1}, restored {:.1}, resumed {:.1}, first byte {m:.1} ({} KiB moved)",
            i + 1,
            p.greeting,
            p.restored,
            p.resumed,
            p.bytes_moved / 1024,
        );
    }
}

/// Per move seen in a capture of the MH's TCP (`tcpdump -i any -nn -tt`, as
/// [`Lab::watch_tcp`] writes it): how long the MH withheld its first segment after
/// the move, ms. A move is a data segment in after `gap_ms` or more with none in (the
/// MH was in no cell); the wait runs from it to the MH's next segment out. An MH
/// that ACKs at once shows a few ms (delayed ACK at most); one whose ACKs wait in its
/// stack (for its gateway's address, say) shows the whole wait.
pub fn ack_waits(capture: &str, gap_ms: f64) -> Vec<f64> {
    let (mut last_in, mut pending, mut waits) = (None::<f64>, None::<f64>, Vec::new());
    for line in capture.lines() {
        let mut words = line.split_whitespace();
        let Some(t) = words.next().and_then(|w| w.parse::<f64>().ok()) else {
            continue;
        };
        let words: Vec<&str> = words.collect();
        let dir = words.iter().find(|w| **w == "In" || **w == "Out");
        let data = words
            .windows(2)
            .rev()
            .find(|w| w[0] == "length")
            .and_then(|w| w[1].trim_end_matches([',', ':']).parse::<u64>().ok())
            .is_some_and(|n| n > 0);
        match dir {
            Some(&"In") if data => {
                if last_in.is_some_and(|l| (t - l) * 1e3 >= gap_ms) && pending.is_none() {
                    pending = Some(t);
                }
                last_in = Some(t);
            }
            Some(&"Out") => {
                if let Some(p) = pending.take() {
                    waits.push((t - p) * 1e3);
                }
            }
            _ => {}
        }
    }
    waits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_and_first_bytes() {
        let ev = |t: u64, cells: Vec<usize>| AssocEvent { t_ns: t, cells };
        let events = [
            ev(0, vec![1]),
            ev(10, vec![]),
            ev(20, vec![2]),
            ev(30, vec![2, 1]),
            ev(40, vec![]),
            ev(2_000_050, vec![1]),
        ];
        assert_eq!(joins(&events), [20, 2_000_050]);
        let reads = [5, 1_000_020, 3_000_050];
        assert_eq!(
            to_first_byte(&[20, 2_000_050], &reads),
            [Some(1.0), Some(1.0)]
        );
        assert_eq!(to_first_byte(&[4_000_000], &reads), [None]);
        let (m, p) = median_p95(&[3.0, 1.0, 2.0, 100.0]);
        assert_eq!((m, p), (2.5, 100.0));
    }

    /// Lines of a real capture (`bench firstbyte`, network detection, LAN profile; TCP
    /// options cut): a move whose first ACK waited 294 ms for the gateway's address,
    /// then one answered at once.
    #[test]
    fn ack_waits_after_moves() {
        let cap = "\
1795821695.797764 ifb0  In  IP 10.0.0.1.5001 > 10.2.0.100.60932: Flags [.], seq 1703499:1704947, ack 1, win 32580, length 1448
1795821695.803782 ifb0  Out IP 10.2.0.100.60932 > 10.0.0.1.5001: Flags [.], ack 1706395, win 769, length 0
1795821696.124988 ifb0  In  IP 10.0.0.1.5001 > 10.2.0.100.60932: Flags [.], seq 1706395:1707843, ack 1, win 32580, length 1448
1795821696.130986 ifb0  In  IP 10.0.0.1.5001 > 10.2.0.100.60932: Flags [.], seq 1707843:1709291, ack 1, win 32580, length 1448
1795821696.136994 ifb0  In  IP 10.0.0.1.5001 > 10.2.0.100.60932: Flags [.], seq 1709291:1710739, ack 1, win 32580, length 1448
1795821696.419097 ifb0  Out IP 10.2.0.100.60932 > 10.0.0.1.5001: Flags [.], ack 1707843, win 769, length 0
1795821697.100000 ifb0  Out IP 10.2.0.100.60932 > 10.0.0.1.5001: Flags [.], ack 1710739, win 769, length 0
1795821697.100100 ifb0  Out IP 10.2.0.100.60932 > 10.0.0.1.5001: Flags [.], ack 1710739, win 769, length 0
1795821697.500000 ifb0  In  IP 10.0.0.1.5001 > 10.2.0.100.60932: Flags [.], seq 1710739:1712187, ack 1, win 32580, length 1448
1795821697.500020 ifb0  Out IP 10.2.0.100.60932 > 10.0.0.1.5001: Flags [.], ack 1712187, win 769, length 0
";
        let w = ack_waits(cap, 250.0);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!((w[0] - 294.109).abs() < 0.01, "{w:?}");
        assert!((w[1] - 0.02).abs() < 0.01, "{w:?}");
        // Closer gaps are no moves; pure ACKs in are not data.
        assert!(ack_waits(cap, 2000.0).is_empty());
        let acks_in = "1.0 x In IP a > b: Flags [.], ack 1, length 0\n2.0 x In IP a > b: Flags [.], ack 2, length 0\n2.1 x Out IP b > a: Flags [.], ack 1, length 0\n";
        assert!(ack_waits(acks_in, 250.0).is_empty());
    }
}
