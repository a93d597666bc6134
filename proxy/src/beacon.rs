//! Beacons: every interval the MSR broadcasts an advertisement ([`Beacon`], JSON over
//! UDP) on each cell interface, so MHs learn which MSR serves them and notice when they
//! hear a new one (paper §5.4 step 1).
//!
//! An MH whose link has just come up need not wait for the next one: its agent
//! broadcasts a [`Solicitation`] to the greeting port, and the MSR answers with its
//! beacon on that cell at once ([`Advertiser::solicited`], docs/architecture.md §7). Answers are
//! rate-limited per source address and per cell.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use itcp_config::BeaconSection;
use itcp_handoff::greet::{PerAddr, RateLimit};
use itcp_proto::beacon::{Beacon, Solicitation};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::sockopt;

/// Solicited beacons per source address: 4 at once, then 2 per second.
const PER_SOURCE: (u32, f64) = (4, 2.0);
/// Solicited beacons per cell: 20 at once, then 20 per second.
const PER_CELL: (u32, f64) = (20, 20.0);
/// Sources tracked at once; beyond them (a spoofing flood) solicitations get nothing.
const MAX_SOURCES: usize = 4096;

/// One cell to advertise on: a broadcast socket bound to its interface, and its MAC.
struct Cell {
    ifname: String,
    mac: String,
    sock: UdpSocket,
}

fn open_cell(ifname: &str, gateway_mac: Option<[u8; 6]>) -> io::Result<Cell> {
    let mac = cell_mac(ifname, gateway_mac)?;
    let sock = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
    sock.set_broadcast(true)?;
    sockopt::bind_to_device(&sock, ifname)?;
    Ok(Cell {
        ifname: ifname.into(),
        mac,
        sock,
    })
}

/// The MAC an MH on cell `ifname` sends to: `[msr] gateway_mac` when set (msrd gives
/// it to every cell, possibly after this is read), else the interface's own.
pub fn cell_mac(ifname: &str, gateway_mac: Option<[u8; 6]>) -> io::Result<String> {
    let mac = match gateway_mac {
        Some(m) => m,
        None => crate::netlink::link_mac(ifname)?,
    };
    Ok(itcp_proto::hex::mac(&mac))
}

/// Time from now until the next wall-clock instant ≡ `offset_ms` (mod `interval_ms`).
pub fn until_aligned(interval_ms: u64, offset_ms: u64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (iv, off) = (
        interval_ms as u128 * 1_000_000,
        offset_ms as u128 * 1_000_000,
    );
    let now_ns = now.as_nanos();
    let wait = (off + iv - now_ns % iv) % iv;
    Duration::from_nanos(wait as u64)
}

/// What became of a solicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Solicited {
    /// The beacon went out on the cell.
    Sent,
    /// Over the rate limit of its source or of the cell: nothing sent.
    Limited,
    /// Heard on an interface beacons are not sent on.
    NotAdvertised,
}

/// The MSR's beacons on its cells: the periodic ones ([`run`]) and the ones answering
/// solicitations.
pub struct Advertiser {
    msr: String,
    lifetime_ms: u64,
    port: u16,
    cells: Vec<Cell>,
    seq: AtomicU64,
    limits: Mutex<(PerAddr, RateLimit<usize>)>,
    t0: Instant,
}

impl Advertiser {
    /// Opens a broadcast socket on each interface. Interfaces that cannot be opened are
    /// reported and skipped; None when none could.
    pub fn open(
        cfg: &BeaconSection,
        msr: &str,
        gateway_mac: Option<[u8; 6]>,
        interfaces: &[String],
    ) -> Option<Advertiser> {
        let cells: Vec<Cell> = interfaces
            .iter()
            .filter_map(|i| match open_cell(i, gateway_mac) {
                Ok(c) => Some(c),
                Err(e) => {
                    warn!(interface = %i, error = %e, "cannot send beacons on this interface");
                    None
                }
            })
            .collect();
        if cells.is_empty() {
            warn!("beacons enabled but no cell interface to send them on: add [[cell]] or [beacon] interfaces");
            return None;
        }
        Some(Advertiser {
            msr: msr.into(),
            lifetime_ms: cfg.lifetime_ms,
            port: cfg.port,
            cells,
            seq: AtomicU64::new(0),
            limits: Mutex::new((
                PerAddr::new(PER_SOURCE.0, PER_SOURCE.1, MAX_SOURCES),
                RateLimit::new(PER_CELL.0, PER_CELL.1, 1024),
            )),
            t0: Instant::now(),
        })
    }

    fn send(&self, c: &Cell, seq: u64) {
        let b = Beacon {
            msr: self.msr.clone(),
            mac: c.mac.clone(),
            lifetime_ms: self.lifetime_ms,
            seq,
        };
        let dst = SocketAddr::from(([255, 255, 255, 255], self.port));
        if let Err(e) = c.sock.send_to(&b.to_bytes(), dst) {
            debug!(interface = %c.ifname, error = %e, "beacon not sent");
        }
    }

    /// One beacon on every cell.
    fn send_all(&self) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        for c in &self.cells {
            self.send(c, seq);
        }
    }

    /// A solicitation from `from` arrived on interface `ifname`: the beacon goes out on
    /// that cell at once, unless its source or the cell is over its rate limit.
    pub fn solicited(&self, ifname: &str, from: IpAddr) -> Solicited {
        let Some(i) = self.cells.iter().position(|c| c.ifname == ifname) else {
            return Solicited::NotAdvertised;
        };
        let now_ms = self.t0.elapsed().as_millis() as u64;
        {
            let mut l = self.limits.lock().unwrap();
            // The source's bucket first: a flooding source does not drain the cell's.
            if !l.0.allow(&from, now_ms) || !l.1.allow(&i, now_ms) {
                return Solicited::Limited;
            }
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        self.send(&self.cells[i], seq);
        Solicited::Sent
    }
}

/// A solicitation heard on cell interface `ifname` (the greeting socket's): answer it
/// if beacons are on.
pub fn on_solicitation(adv: Option<&Advertiser>, ifname: &str, from: SocketAddr, s: Solicitation) {
    let Some(adv) = adv else {
        debug!(%from, interface = ifname, "solicitation ignored: beacons are off");
        return;
    };
    let r = adv.solicited(ifname, from.ip());
    debug!(%from, interface = ifname, seq = s.solicit.seq, outcome = ?r, "solicitation");
}

/// Sends beacons every interval until draining starts.
pub async fn run(cfg: BeaconSection, adv: Arc<Advertiser>, mut drain: watch::Receiver<bool>) {
    let period = Duration::from_millis(cfg.interval_ms);
    let first = match cfg.offset_ms {
        Some(off) => tokio::time::Instant::now() + until_aligned(cfg.interval_ms, off),
        None => tokio::time::Instant::now(),
    };
    let mut tick = tokio::time::interval_at(first, period);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = drain.wait_for(|&d| d) => return,
        }
        adv.send_all();
    }
}
