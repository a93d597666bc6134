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
//! what sits in msrd's splice pipes is not seen), and the bytes each handoff moved.

use std::io;
use std::time::Duration;

use crate::baseline::MobileIpOpts;
use crate::emu::{LinkParams, Loss};
use crate::lab;
use crate::scenario::{self, Cells, Mode, Net, Run, Traffic};

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
}

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
    let (o, queued) = scenario::run_observed(&r, &[], true)?;
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
    })
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
