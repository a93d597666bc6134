//! Network detection (docs/architecture.md §7): an MSR learns that an MH arrived in one of its
//! `detect = "network"` cells from the MH's first frame there, with no greeting, agent
//! or library on the MH.
//!
//! msrd's rules ([`crate::intercept::Detection`]) report the first packet of an MH
//! that is not *present* here on NFLOG and drop its packets (never answer them) for at
//! most `[handoff] detect_hold_ms`. This task asks every peer for the MH's connections
//! ([`crate::handoff::new_side::pull_detected`]); the peer serving the MH hands them
//! over only if the packet's link-layer address is the one bound to the MH there.
//! Once they run here (or no peer serves the MH) the MH is present: no more reports
//! for it until it is seen in another MSR's cell. A frame that proves no address (what
//! a host's OS sends first on link-up) is reported by its link-layer address alone:
//! the peers are asked which MH addresses are bound to it, and each is pulled.
//!
//! Trust: the cell's link layer authenticates stations (WPA2/802.1X); an MH is its
//! MAC and IP address as first seen at the MSR that served it. A station spoofing an
//! MH's IP from another cell moves nothing, and its reports are rate-limited per
//! station; refused ones do not count against the MH's pulls.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::{debug, info, warn};

use crate::daemon::Daemon;
use crate::netlink::{read_reports, Reports};
use crate::nflog::{self, Logged};

/// Reads the rules' reports until the daemon ends. The group is retried while another
/// process holds it (an msrd being upgraded still runs).
pub async fn run(d: Arc<Daemon>, group: u16) {
    let fd = crate::netlink::open_reports(
        || nflog::open(group, nflog::DETECT_COPY),
        "network detection",
        "network detection waits for its NFLOG group",
    )
    .await;
    info!(group, "network detection up");
    let mut buf = vec![0u8; 65536];
    loop {
        match read_reports(&fd, &mut buf, "NFLOG").await {
            Reports::Read(n) => {
                for l in nflog::parse(&buf[..n]) {
                    on_arrival(&d, l);
                }
            }
            // Reports were lost (a burst): the MHs' next packets report again.
            Reports::Overrun => debug!("NFLOG reports overran"),
            Reports::Closed => return,
        }
    }
}

/// A station not present here sent a frame on a detecting cell.
fn on_arrival(d: &Arc<Daemon>, l: Logged) {
    let src = crate::admission::canonical(l.src);
    if proves_no_address(src) {
        if let Some(mac) = l.mac {
            station_seen(d, mac, l.head);
        }
        return;
    }
    let Some(mac) = l.mac else {
        if d.handoff.as_ref().is_some_and(|h| h.may_log(src)) {
            warn!(mh = %src, "arrival without a link-layer address: not an Ethernet cell?");
        }
        return;
    };
    arrived(d, src, mac, &l.head);
}

/// A source address that says nothing of who sends: IPv4's or IPv6's unspecified
/// address (DHCP, an ARP probe, duplicate address detection) or an IPv6 link-local one
/// (router solicitations and MLD reports on link-up).
fn proves_no_address(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_unspecified(),
        std::net::IpAddr::V6(v6) => v6.is_unspecified() || v6.is_unicast_link_local(),
    }
}

/// A station sent a frame that proves no address (what a host's OS sends first on
/// link-up): the peers are asked which MHs it is, and each is pulled as if it had
/// sent from its own address. Nobody's: it is not asked about again for a while.
pub(crate) fn station_seen(d: &Arc<Daemon>, mac: [u8; 6], head: Vec<u8>) {
    let Some(h) = d.handoff.as_ref() else { return };
    let st = &d.sessions.stats;
    if !h.ask_about_station(mac) {
        st.station_questions_limited.fetch_add(1, Ordering::Relaxed);
        return;
    }
    st.station_questions.fetch_add(1, Ordering::Relaxed);
    let d = d.clone();
    tokio::spawn(async move {
        let mhs = crate::handoff::new_side::ask_station(&d, mac).await;
        let h = d.handoff.as_ref().unwrap();
        h.asked_about_station(mac);
        let mine: Vec<_> = mhs.into_iter().filter(|mh| d.is_mh(*mh)).collect();
        debug!(mac = %itcp_proto::hex::mac(&mac), mhs = ?mine, "station arrived");
        if mine.is_empty() {
            if let Err(e) = d.rules.set_station_unknown(mac) {
                debug!(error = %e, "station not marked");
            }
        }
        for mh in mine {
            arrived(&d, mh, mac, &head);
        }
    });
}

/// MH `mh` arrived here, sending from link-layer address `mac` (its frame's first
/// bytes `head`): pull its connections unless the frame is stale or a pull is under
/// way or over budget.
fn arrived(d: &Arc<Daemon>, mh: std::net::IpAddr, mac: [u8; 6], head: &[u8]) {
    let Some(h) = d.handoff.as_ref() else { return };
    if !d.is_mh(mh) {
        return;
    }
    if h.judge_arrival(mh, head) == crate::departed::Evidence::Stale {
        // It may have waited in the uplink since before the MH moved: not an arrival.
        // The next frame is judged too, at once.
        d.sessions
            .stats
            .arrivals_stale
            .fetch_add(1, Ordering::Relaxed);
        if let Err(e) = d.rules.rearm_detection(mh) {
            debug!(%mh, error = %e, "arrival hold not ended");
        }
        return;
    }
    {
        let m = h.mhs.lock().unwrap();
        if m.get(&mh).is_some_and(|s| s.pulling) {
            return;
        }
    }
    if d.sessions
        .of_mh(mh)
        .iter()
        .any(|s| s.frozen.load(Ordering::Relaxed))
    {
        return;
    }
    if !h.pull_allowed(mh, itcp_handoff::greet::Sender::Mac(mac)) {
        d.sessions
            .stats
            .pulls_limited
            .fetch_add(1, Ordering::Relaxed);
        if h.may_log(mh) {
            debug!(%mh, "arrival ignored: pulls for this MH are rate-limited");
        }
        return;
    }
    let Some(busy) = h.try_busy() else {
        return;
    };
    h.set_pulling(mh, true);
    debug!(%mh, mac = %itcp_proto::hex::mac(&mac), "MH arrived");
    let d = d.clone();
    tokio::spawn(async move {
        let _busy = busy;
        crate::handoff::new_side::pull_detected(d.clone(), mh, mac).await;
        d.handoff.as_ref().unwrap().set_pulling(mh, false);
    });
}
