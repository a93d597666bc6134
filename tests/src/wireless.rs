//! `itcp-lab bench wireless`: the wireless side against its cell. For each cell of a
//! grid (rate, one-way delay, random or bursty loss, queue) behind a WAN, a verified
//! download from the FH to an MH that runs nothing of ours, with and without moves,
//! through four peers in the same run:
//!
//! * msrd with its defaults (`[wireless] sizing = "cell"`),
//! * msrd with the kernel's defaults (`sizing = "kernel"`),
//! * end-to-end cubic and end-to-end bbr (the MSRs as plain routers).
//!
//! Per run: goodput over the cell's rate, packets the cells' downlink queues dropped
//! per second, the bytes queued in the MSRs' TCP sockets (median of 200 ms samples;
//! what sits in msrd's splice pipes is not seen), the bytes each handoff moved, an
//! interactive echo's median round trip beside the download over the path's, and per
//! move the share of packets the new cell's downlink queue dropped in its first second
//! and how long after the MH's association the new cell carried 90 % of its rate.

use std::io;
use std::time::Duration;

use crate::baseline::MobileIpOpts;
use crate::emu::{AssocEvent, CountersReply};
use crate::emu::{LinkParams, Loss};
use crate::lab;
use crate::scenario::{self, Cells, Mode, Net, Observe, Run, Traffic};

/// One cell of the grid, with the WAN it sits behind.
#[derive(Debug, Clone)]
pub struct CellSpec {
    pub rate_bps: u64,
    pub delay_ms: f64,
    /// Average loss; `burst`: Gilbert–Elliott with bursts of 4 packets on average.
    pub loss: f64,
    pub burst: bool,
    pub queue_bytes: u64,
    /// The WAN's one-way delay.
    pub wan_ms: f64,
}

impl CellSpec {
    pub fn name(&self) -> String {
        format!(
            "{} Mbit/s {} ms {:.1} % {} q{} KB wan {} ms",
            self.rate_bps as f64 / 1e6,
            self.delay_ms,
            self.loss * 100.0,
            if self.burst { "bursty" } else { "random" },
            self.queue_bytes / 1000,
            self.wan_ms
        )
    }

    /// The path's round trip without queueing: the WAN's and the cell's delays, twice.
    pub fn path_rtt_ms(&self) -> f64 {
        2.0 * (self.wan_ms + self.delay_ms)
    }

    fn net(&self) -> Net {
        let loss = match (self.loss > 0.0, self.burst) {
            (false, _) => Loss::None,
            (true, false) => Loss::Bernoulli { p: self.loss },
            // Bad state: every packet lost, left after 4 packets on average; entered so
            // that the long-run loss is `loss`.
            (true, true) => {
                let p_bg = 0.25;
                Loss::GilbertElliott {
                    p_gb: self.loss * p_bg / (1.0 - self.loss),
                    p_bg,
                    loss_good: 0.0,
                    loss_bad: 1.0,
                }
            }
        };
        let cell = LinkParams {
            loss,
            queue_bytes: self.queue_bytes,
            ..lab::link(self.rate_bps, self.delay_ms, 0.0)
        };
        let wan = LinkParams {
            queue_bytes: 256_000,
            ..lab::link(100_000_000, self.wan_ms, 0.0)
        };
        Net {
            name: self.name(),
            wan,
            cell,
        }
    }
}

/// The grid: `quick` keeps four cells spanning the ranges.
pub fn grid(quick: bool) -> Vec<CellSpec> {
    let c = |mbit: f64, delay_ms, loss, burst, kb: u64, wan_ms| CellSpec {
        rate_bps: (mbit * 1e6) as u64,
        delay_ms,
        loss,
        burst,
        queue_bytes: kb * 1000,
        wan_ms,
    };
    let mut g = vec![
        c(2.0, 10.0, 0.01, false, 32, 40.0),
        c(10.0, 5.0, 0.005, true, 64, 40.0),
        c(20.0, 20.0, 0.015, false, 128, 10.0),
        c(5.0, 50.0, 0.02, true, 256, 75.0),
    ];
    if !quick {
        g.extend([
            c(1.0, 5.0, 0.0, false, 16, 20.0),
            c(20.0, 5.0, 0.03, true, 64, 75.0),
            c(5.0, 20.0, 0.005, false, 128, 10.0),
            c(10.0, 50.0, 0.01, false, 256, 40.0),
        ]);
    }
    g
}

/// The four ways across the MSRs compared in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    MsrdDefaults,
    MsrdKernel,
    E2eCubic,
    E2eBbr,
}

impl Peer {
    pub const ALL: [Peer; 4] = [
        Peer::MsrdDefaults,
        Peer::MsrdKernel,
        Peer::E2eCubic,
        Peer::E2eBbr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Peer::MsrdDefaults => "msrd defaults",
            Peer::MsrdKernel => "msrd kernel",
            Peer::E2eCubic => "e2e cubic",
            Peer::E2eBbr => "e2e bbr",
        }
    }

    fn mode(self, msrd_extra: &str) -> Mode {
        let msrd = |extra: &str| Mode::ItcpNetwork {
            msrd_extra: extra.into(),
        };
        match self {
            Peer::MsrdDefaults => msrd(msrd_extra),
            Peer::MsrdKernel => msrd("[wireless]\nsizing = \"kernel\"\n"),
            Peer::E2eCubic | Peer::E2eBbr => Mode::RegularTcp(MobileIpOpts::default()),
        }
    }

    /// The FH's congestion control (and the MH's): a stock server's for msrd's peers.
    fn cc(self) -> &'static str {
        match self {
            Peer::E2eBbr => "bbr",
            _ => "cubic",
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Figures {
    /// Goodput at the MH over the cell's rate.
    pub goodput: f64,
    /// Packets the cells' downlink queues dropped, per second of transfer.
    pub drops_per_s: f64,
    /// Median of the bytes queued in the MSRs' sockets (0 end to end).
    pub held_bytes: u64,
    /// Mean bytes moved per handoff (None without handoffs).
    pub moved_per_handoff: Option<u64>,
    /// The echo's median round trip over the path's (propagation only, both ways).
    pub echo_over_path: Option<f64>,
    /// Of the packets offered to a new cell's downlink in the first second after the
    /// MH associated, the share its queue dropped (all moves; None without moves).
    pub move_drops: Option<f64>,
    /// Median over moves of the time from association until a [`RAMP_WINDOW`] in which
    /// the new cell carried at least 90 % of its rate began, in the cell's round trips
    /// (None without moves; a move whose cell never got there counts as the time it had).
    pub ramp_rtts: Option<f64>,
}

/// The window over which [`Figures::ramp_rtts`] judges a cell full.
pub const RAMP_WINDOW: Duration = Duration::from_millis(60);

/// One download of `secs` seconds of the cell's rate across `peer`, moving every 5 s
/// (0.5 s without a cell) when `moves`. Errors on a setup failure or a byte lost.
pub fn run(cell: &CellSpec, peer: Peer, moves: bool, secs: u64, seed: u64) -> io::Result<Figures> {
    run_with(cell, peer, moves, secs, seed, "")
}

/// [`run`] with `msrd_extra` appended to the config of [`Peer::MsrdDefaults`]'s msrds
/// (a variant of the defaults to compare).
pub fn run_with(
    cell: &CellSpec,
    peer: Peer,
    moves: bool,
    secs: u64,
    seed: u64,
    msrd_extra: &str,
) -> io::Result<Figures> {
    let net = cell.net();
    let cells = if moves {
        Cells::NonOverlapped {
            period_s: 5.0,
            gap_s: 0.5,
        }
    } else {
        Cells::NoMoves
    };
    let r = Run {
        net,
        cells,
        mode: peer.mode(msrd_extra),
        traffic: Traffic {
            bytes: cell.rate_bps / 8 * secs,
            buf: None,
            cc: Some(peer.cc().into()),
            mh_opens: true,
        },
        seed,
        msrs: 2,
        timeout: Duration::from_secs(secs * 20 + 60),
    };
    let echo_count = (secs * 18) as u32; // 50 ms apart, inside the download
    let observe = Observe {
        queues: true,
        counters: moves,
        echo: Some(echo_count),
    };
    let seen = scenario::run_observed(&r, &[], observe)?;
    let (o, queued) = (seen.outcome, seen.queued);
    if !o.recv.ok {
        return Err(io::Error::other(format!(
            "{} {}: {}",
            cell.name(),
            peer.name(),
            o.recv.error.unwrap_or_default()
        )));
    }
    let drops: u64 = o
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with("cell"))
        .map(|(_, c)| c.down.drop_queue)
        .sum();
    let mut queued = queued;
    queued.sort_unstable();
    let moved: Vec<u64> = o.handoffs.iter().filter_map(|h| h.bytes_moved).collect();
    Ok(Figures {
        goodput: o.recv.goodput_bps / cell.rate_bps as f64,
        drops_per_s: drops as f64 / o.recv.duration_s.max(1e-3),
        held_bytes: if peer.is_msrd() {
            queued.get(queued.len() / 2).copied().unwrap_or(0)
        } else {
            0
        },
        moved_per_handoff: (!moved.is_empty())
            .then(|| moved.iter().sum::<u64>() / moved.len() as u64),
        echo_over_path: seen
            .echo
            .filter(|e| e.count > 0)
            .map(|e| e.p50_us / 1000.0 / cell.path_rtt_ms()),
        move_drops: move_drops(&o.events, &seen.counters),
        ramp_rtts: ramp(&o.events, &seen.counters, cell.rate_bps)
            .map(|d| d.as_secs_f64() * 1000.0 / (2.0 * cell.delay_ms)),
    })
}

/// The grid's medians for `peer`, for scripts in exactly this form: `wireless defaults:
/// goodput 93.1 % of cell, echo 1.12x path, held 180 KB per connection, move drops
/// 2.3 %, ramp 2.1 RTT` (`n/a` where no run measured it). Goodput, echo and held come
/// from the runs without moves; move drops and ramp from those with.
pub fn summary(peer: Peer, figures: &[(bool, Peer, Figures)]) -> String {
    let med = |moves: bool, f: &dyn Fn(&Figures) -> Option<f64>| {
        let mut v: Vec<f64> = figures
            .iter()
            .filter(|(m, p, _)| *m == moves && *p == peer)
            .filter_map(|(_, _, x)| f(x))
            .collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    let show = |v: Option<f64>, fmt: &dyn Fn(f64) -> String| v.map_or("n/a".into(), fmt);
    let label = match peer {
        Peer::MsrdDefaults => "defaults",
        Peer::MsrdKernel => "kernel",
        Peer::E2eCubic => "e2e cubic",
        Peer::E2eBbr => "e2e bbr",
    };
    format!(
        "wireless {label}: goodput {} of cell, echo {} path, held {} per connection, \
         move drops {}, ramp {}",
        show(med(false, &|f| Some(f.goodput)), &|g| format!(
            "{:.1} %",
            g * 100.0
        )),
        show(med(false, &|f| f.echo_over_path), &|e| format!("{e:.2}x")),
        show(med(false, &|f| Some(f.held_bytes as f64)), &|h| format!(
            "{:.0} KB",
            h / 1000.0
        )),
        show(med(true, &|f| f.move_drops), &|d| format!(
            "{:.1} %",
            d * 100.0
        )),
        show(med(true, &|f| f.ramp_rtts), &|r| format!("{r:.1} RTT")),
    )
}

/// The moves in `events`: (when, the cell the MH joined), for each association with a
/// cell after a time without one or in another.
fn arrivals(events: &[AssocEvent]) -> Vec<(u64, usize)> {
    let mut last: &[usize] = &[1];
    let mut out = Vec::new();
    for e in events {
        if let Some(&k) = e.cells.iter().find(|k| !last.contains(k)) {
            out.push((e.t_ns, k));
        }
        last = &e.cells;
    }
    out
}

/// The counters of `cellK`'s downlink in the last sample at or before `t_ns`.
fn down_at(
    samples: &[CountersReply],
    cell: usize,
    t_ns: u64,
) -> Option<crate::emu::link::Counters> {
    let s = samples.iter().take_while(|s| s.now_ns <= t_ns).last()?;
    s.links.get(&format!("cell{cell}")).map(|l| l.down)
}

/// See [`Figures::move_drops`].
fn move_drops(events: &[AssocEvent], samples: &[CountersReply]) -> Option<f64> {
    let (mut offered, mut dropped) = (0u64, 0u64);
    for (t, k) in arrivals(events) {
        let (Some(a), Some(b)) = (
            down_at(samples, k, t),
            down_at(samples, k, t + 1_000_000_000),
        ) else {
            continue;
        };
        offered += b.pkts_in - a.pkts_in;
        dropped += b.drop_queue - a.drop_queue;
    }
    (offered > 0).then(|| dropped as f64 / offered as f64)
}

/// See [`Figures::ramp_rtts`]: the median time from association to the start of the
/// first [`RAMP_WINDOW`] in which the new cell delivered 90 % of `rate_bps`.
fn ramp(events: &[AssocEvent], samples: &[CountersReply], rate_bps: u64) -> Option<Duration> {
    let moves = arrivals(events);
    let mut times: Vec<f64> = Vec::new();
    for (i, &(t, k)) in moves.iter().enumerate() {
        let until = moves.get(i + 1).map_or(u64::MAX, |m| m.0);
        let bytes = |s: &CountersReply| s.links.get(&format!("cell{k}")).map(|l| l.down.bytes_out);
        let after: Vec<&CountersReply> = samples
            .iter()
            .filter(|s| s.now_ns >= t && s.now_ns < until)
            .collect();
        let window = RAMP_WINDOW.as_nanos() as u64;
        let full = after.iter().enumerate().find_map(|(j, a)| {
            let b = after[j..].iter().find(|b| b.now_ns >= a.now_ns + window)?;
            let carried = (bytes(b)? - bytes(a)?) as f64 * 8.0;
            let could = rate_bps as f64 * (b.now_ns - a.now_ns) as f64 / 1e9;
            (carried >= 0.9 * could).then_some(a.now_ns)
        });
        match (full, after.last()) {
            (Some(f), _) => times.push((f - t) as f64),
            (None, Some(l)) if l.now_ns > t => times.push((l.now_ns - t) as f64),
            _ => {}
        }
    }
    (!times.is_empty()).then(|| Duration::from_nanos(median(&mut times) as u64))
}

impl Peer {
    fn is_msrd(self) -> bool {
        matches!(self, Peer::MsrdDefaults | Peer::MsrdKernel)
    }
}

/// The median of `v`: the middle value, or the mean of the two (NaN when empty).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::LinkCounters;

    const MS: u64 = 1_000_000;

    fn at(t_ns: u64, cells: &[usize]) -> AssocEvent {
        AssocEvent {
            t_ns,
            cells: cells.to_vec(),
        }
    }

    /// Counters of cell 2's downlink every 20 ms from 1000 ms: `per_tick(i)` gives the
    /// (offered, dropped, delivered bytes) of tick i.
    fn samples(per_tick: impl Fn(u64) -> (u64, u64, u64)) -> Vec<CountersReply> {
        let mut c = LinkCounters::default();
        (0..200)
            .map(|i| {
                let (offered, dropped, bytes) = per_tick(i);
                c.down.pkts_in += offered;
                c.down.drop_queue += dropped;
                c.down.bytes_out += bytes;
                CountersReply {
                    now_ns: 1000 * MS + i * 20 * MS,
                    links: [("cell2".to_string(), c)].into(),
                    mh_unknown_dst: 0,
                    cell_unknown_dst: 0,
                    write_errors: 0,
                }
            })
            .collect()
    }

    #[test]
    fn the_summary_line_has_the_form_scripts_read() {
        let f = |goodput, moves: bool| Figures {
            goodput,
            drops_per_s: 0.0,
            held_bytes: 180_000,
            moved_per_handoff: None,
            echo_over_path: Some(1.12),
            move_drops: moves.then_some(0.023),
            ramp_rtts: moves.then_some(2.1),
        };
        let figs = [
            (false, Peer::MsrdDefaults, f(0.931, false)),
            (true, Peer::MsrdDefaults, f(0.5, true)),
        ];
        assert_eq!(
            summary(Peer::MsrdDefaults, &figs),
            "wireless defaults: goodput 93.1 % of cell, echo 1.12x path, held 180 KB per \
             connection, move drops 2.3 %, ramp 2.1 RTT"
        );
        assert_eq!(
            summary(Peer::E2eBbr, &figs),
            "wireless e2e bbr: goodput n/a of cell, echo n/a path, held n/a per connection, \
             move drops n/a, ramp n/a"
        );
    }

    #[test]
    fn a_move_is_an_association_with_a_cell_the_mh_was_not_in() {
        let ev = [at(5, &[]), at(7, &[2]), at(9, &[1, 2]), at(11, &[1])];
        assert_eq!(arrivals(&ev), vec![(7, 2), (9, 1)]);
    }

    #[test]
    fn move_drops_count_the_new_cells_first_second() {
        let ev = [at(900 * MS, &[]), at(1000 * MS, &[2])];
        // 10 packets offered per tick, 1 dropped in each of the first 10 ticks, then
        // none. A sample counts what came before it: the second after the move is ticks
        // 1..=50, with 9 of the drops.
        let s = samples(|i| (10, u64::from(i < 10), 0));
        let d = move_drops(&ev, &s).unwrap();
        assert!((d - 9.0 / 500.0).abs() < 1e-9, "{d}");
        assert_eq!(move_drops(&[], &s), None);
    }

    #[test]
    fn the_ramp_ends_where_a_full_window_begins() {
        let ev = [at(1000 * MS, &[2])];
        // 10 Mbit/s: 25 000 bytes per 20 ms when full; idle for 80 ms, then full (the
        // sample at 1100 ms is the first with bytes, carried since the one at 1080).
        let s = samples(|i| (0, 0, if i >= 5 { 25_000 } else { 0 }));
        let r = ramp(&ev, &s, 10_000_000).unwrap();
        assert_eq!(r, Duration::from_millis(80));
        // Half the rate throughout: never full; counts the time it had.
        let s = samples(|_| (0, 0, 12_500));
        assert_eq!(
            ramp(&ev, &s, 10_000_000).unwrap(),
            Duration::from_millis(3980)
        );
    }
}
