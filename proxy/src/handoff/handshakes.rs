//! The daemon's side of [`crate::handshakes`]: reading the SYN-ACK reports, completing
//! an MH's half-open handshakes at a handoff (old MSR), carrying their SYN-ACKs in the
//! images, and answering the MH's SYNs on those flows with them (new MSR). The same
//! group reports FINs on flows closed at the MH's previous MSR, answered with the ACK
//! their TIME_WAIT socket would send ([`crate::strays::time_wait_ack`]).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};

use crate::daemon::Daemon;
use crate::handshakes::{parse, parse_syn, replay, COPY, KEEP};
use crate::netlink::{read_reports, Reports};
use crate::sockdiag::HalfOpen;

/// Reads the rules' SYN-ACK reports until the daemon ends. The group is retried while
/// another process holds it (an msrd being upgraded still runs).
pub async fn run(d: Arc<Daemon>, group: u16) {
    let fd = crate::netlink::open_reports(
        || crate::nflog::open(group, COPY),
        "SYN-ACK reports",
        "SYN-ACK reports wait for their NFLOG group",
    )
    .await;
    info!(group, "SYN-ACK reports up");
    let mut buf = vec![0u8; 65536];
    loop {
        match read_reports(&fd, &mut buf, "NFLOG").await {
            Reports::Read(n) => {
                let now = Instant::now();
                for p in crate::nflog::payloads(&buf[..n]) {
                    if let Some(s) = parse(p) {
                        d.handshakes.record(s, p, now);
                    } else if let Some((from, to)) = parse_syn(p) {
                        syn_again(&d, from, to, now);
                    } else if let Some(ack) = crate::strays::time_wait_ack(p) {
                        time_wait_ack(&ack);
                    }
                }
            }
            // A burst: handshakes not recorded stay half-open at a handoff, as before.
            Reports::Overrun => debug!("SYN-ACK reports overran"),
            Reports::Closed => return,
        }
    }
}

/// The MH retransmitted the SYN of a connection that moved in completed (the rules
/// report only those, and drop them): the SYN-ACK it missed goes to it again.
fn syn_again(d: &Daemon, from: SocketAddr, to: SocketAddr, now: Instant) {
    let Some(p) = d.handshakes.again(to, from, now) else {
        return;
    };
    let sent = socket2::Socket::new(
        socket2::Domain::for_address(from),
        socket2::Type::DGRAM,
        None,
    )
    .and_then(|here| itcp_handoff::repair::send_raw_ip_to(here.as_fd(), &from, &p, 0));
    match sent {
        Ok(()) => {
            debug!(mh = %from, local = %to, "SYN-ACK sent again for a handshake completed before it moved")
        }
        Err(e) => warn!(mh = %from, local = %to, error = %e, "SYN-ACK not sent again"),
    }
}

/// A FIN on a flow that closed at the MH's previous MSR (the rules report those and
/// drop them): its ACK, as the TIME_WAIT socket there would have sent it.
fn time_wait_ack(ack: &itcp_handoff::packet::Segment) {
    let sent = socket2::Socket::new(
        socket2::Domain::for_address(ack.dst),
        socket2::Type::DGRAM,
        None,
    )
    .and_then(|here| {
        itcp_handoff::repair::send_raw_ip_to(here.as_fd(), &ack.dst, &ack.to_ip_packet(), 0)
    });
    match sent {
        Ok(()) => {
            debug!(to = %ack.dst, from = %ack.src, "FIN of a flow closed elsewhere acknowledged")
        }
        Err(e) => {
            warn!(to = %ack.dst, from = %ack.src, error = %e, "FIN of a flow closed elsewhere not acknowledged")
        }
    }
}

/// Old MSR: the images of `mh`'s connections completed here by a replayed ACK carry
/// the SYN-ACK sent (rare: the images are decoded only then).
pub fn attach(d: &Daemon, mh: IpAddr, images: &mut [itcp_proto::channel::ConnImage]) {
    attach_from(&d.handshakes.take_replayed(mh), images)
}

/// [`attach`] with the replayed handshakes given (`Handshakes::replayed`), for the
/// images' parts sent ahead of the last message: those are left for it.
pub fn attach_from(
    replayed: &[(SocketAddr, SocketAddr, Vec<u8>)],
    images: &mut [itcp_proto::channel::ConnImage],
) {
    for (local, remote, packet) in replayed {
        let (local, remote) = (*local, *remote);
        let found = images.iter_mut().find(|c| {
            itcp_handoff::SocketImage::from_bytes(&c.wireless)
                .is_ok_and(|w| w.local == local && w.remote == remote)
        });
        if let Some(c) = found {
            c.synack = Some(itcp_proto::hex::hex(packet));
        }
    }
}

/// New MSR: the MH's SYNs on the flows of `images` that carry a SYN-ACK are answered
/// with it (reported by the `resyn` sets' rule, and dropped).
pub fn expect(d: &Daemon, images: &[itcp_proto::channel::ConnImage]) {
    let now = Instant::now();
    let flows: Vec<_> = images
        .iter()
        .filter_map(|c| itcp_proto::hex::unhex(c.synack.as_deref()?))
        .filter_map(|p| d.handshakes.expect(&p, now))
        .map(|s| (s.remote, s.local, KEEP))
        .collect();
    if flows.is_empty() {
        return;
    }
    if let Err(e) = d.rules.answer_syns(&flows) {
        warn!(error = %e, "the MH's SYNs on connections completed before they moved are not answered");
    }
}

/// Completes the handshakes in `open` (of one MH, half-open here) whose SYN-ACK is
/// known, by replaying the MH's ACK to each (see the module). Returns the flows
/// replayed (local, remote); the others are logged and stay half-open for now.
pub fn complete(d: &Daemon, open: &[HalfOpen]) -> Vec<(SocketAddr, SocketAddr)> {
    let now = Instant::now();
    let mut done = Vec::new();
    for h in open {
        let Some(s) = d.handshakes.get(h.local, h.remote, now) else {
            debug!(local = %h.local, mh = %h.remote,
                "TCP handshake of the MH half-open and its SYN-ACK not known yet");
            continue;
        };
        match replay(&s, d.cfg.interception.fwmark) {
            Ok(()) => {
                d.handshakes.mark_replayed(h.local, h.remote);
                done.push((h.local, h.remote));
            }
            Err(e) => warn!(local = %h.local, mh = %h.remote, error = %e,
                "the MH's ACK could not be replayed: its half-open handshake stays here"),
        }
    }
    done
}
