//! Beacons: every interval the MSR broadcasts an advertisement ([`Beacon`], JSON over
//! UDP) on each cell interface, so MHs learn which MSR serves them and notice when they
//! hear a new one (paper §5.4 step 1).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use itcp_config::BeaconSection;
use itcp_proto::beacon::Beacon;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::sockopt;

/// One cell to advertise on: a broadcast socket bound to its interface, and its MAC.
struct Cell {
    ifname: String,
    mac: String,
    sock: UdpSocket,
}

fn open_cell(ifname: &str) -> io::Result<Cell> {
    let mac = sockopt::interface_mac(ifname)?;
    let sock = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
    sock.set_broadcast(true)?;
    sockopt::bind_to_device(sock.as_raw_fd(), ifname)?;
    Ok(Cell {
        ifname: ifname.into(),
        mac,
        sock,
    })
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

/// Sends beacons until draining starts. Interfaces that cannot be opened are reported
/// and skipped; the others keep advertising.
pub async fn run(
    cfg: BeaconSection,
    msr: String,
    interfaces: Vec<String>,
    mut drain: watch::Receiver<bool>,
) {
    let cells: Vec<Cell> = interfaces
        .iter()
        .filter_map(|i| match open_cell(i) {
            Ok(c) => Some(c),
            Err(e) => {
                warn!(interface = %i, error = %e, "cannot send beacons on this interface");
                None
            }
        })
        .collect();
    if cells.is_empty() {
        warn!("beacons enabled but no cell interface to send them on: add [[cell]] or [beacon] interfaces");
        return;
    }
    let dst = SocketAddr::from(([255, 255, 255, 255], cfg.port));
    let period = Duration::from_millis(cfg.interval_ms);
    let first = match cfg.offset_ms {
        Some(off) => tokio::time::Instant::now() + until_aligned(cfg.interval_ms, off),
        None => tokio::time::Instant::now(),
    };
    let mut tick = tokio::time::interval_at(first, period);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = drain.wait_for(|&d| d) => return,
        }
        seq += 1;
        for c in &cells {
            let b = Beacon {
                msr: msr.clone(),
                mac: c.mac.clone(),
                lifetime_ms: cfg.lifetime_ms,
                seq,
            };
            let msg = serde_json::to_vec(&b).expect("beacons serialize");
            if let Err(e) = c.sock.send_to(&msg, dst) {
                debug!(interface = %c.ifname, error = %e, "beacon not sent");
            }
        }
    }
}
