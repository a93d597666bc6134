//! Which link-layer address carried each greeting. A UDP socket does not say, and on
//! an MH's first visit the new MSR has no neighbour entry for it: its first answer and
//! the restored connections' first segments would wait for an ARP (or NDP) round
//! trip on the handoff's path. A packet socket beside each greeting socket sees the
//! same datagrams with their source MAC; once a greeting is proven, msrd enters that
//! address in the neighbour table (`crate::netlink::neigh_learn`, which never
//! overrides a valid entry).
//!
//! The packet socket listens on every protocol (`ETH_P_ALL`): the kernel hands a frame
//! to such taps before IP sees it, so the frame of a greeting is always queued here by
//! the time the greeting is read from its UDP socket. A classic BPF filter keeps only
//! inbound UDP datagrams to the greeting port of one family.

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use itcp_wire::{udp, IpPacket, UdpDatagram};
use socket2::{Domain, SockFilter, Socket, Type};

use crate::daemon::Daemon;

/// Frames remembered: a greeting is looked up right after its frame was queued, so
/// a few are plenty; a flood of other datagrams to the port only pushes old ones out.
const KEEP: usize = 32;
/// Largest frame read (greetings are far smaller: `MAX_DATAGRAM`).
const SNAP: usize = 2048;

/// A datagram seen on the cell: its source, a digest of its UDP payload, the MAC.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Seen {
    src: IpAddr,
    digest: u64,
    mac: [u8; 6],
}

/// The frames of greeting-port datagrams on one cell interface, for one family.
pub struct GreetFrames {
    sock: OwnedFd,
    seen: VecDeque<Seen>,
}

impl GreetFrames {
    /// Opens the packet socket on `ifname` for datagrams to UDP `port` (IPv6 or IPv4).
    pub fn open(ifname: &str, port: u16, ipv6: bool) -> io::Result<GreetFrames> {
        let what = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("packet socket for greeting frames on {ifname}: {e}"),
            )
        };
        let idx = nix::net::if_::if_nametoindex(ifname).map_err(|e| what(e.into()))?;
        // Protocol 0 until bound: no frame is queued before the filter is on.
        let sock = Socket::new(Domain::PACKET, Type::DGRAM, None).map_err(what)?;
        let prog: Vec<SockFilter> = filter(port, ipv6)
            .iter()
            .map(|i| SockFilter::new(i.code, i.jt, i.jf, i.k))
            .collect();
        sock.attach_filter(&prog).map_err(what)?;
        // Our own answers and beacons are not greetings (kernels ≥ 4.20; the packet
        // type is checked on each frame too).
        let one: libc::c_int = 1;
        // SAFETY: a c_int option value, its size passed along.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_IGNORE_OUTGOING,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        crate::netlink::bind_packet(sock.as_raw_fd(), idx, libc::ETH_P_ALL as u16).map_err(what)?;
        Ok(GreetFrames {
            sock: sock.into(),
            seen: VecDeque::with_capacity(KEEP),
        })
    }

    /// The MAC that carried the datagram `payload` from `src`, if exactly one did.
    /// Reads the frames queued since the last call first (never blocks).
    pub fn mac_of(&mut self, src: IpAddr, payload: &[u8]) -> Option<[u8; 6]> {
        self.drain();
        lookup(&self.seen, src, digest(payload))
    }

    /// Moves every queued frame into `seen` (the oldest fall out).
    pub fn drain(&mut self) {
        let mut buf = [0u8; SNAP];
        loop {
            // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
            let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
            let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buf and sll are live and their sizes are passed along.
            let n = unsafe {
                libc::recvfrom(
                    self.sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut sll as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                return; // EAGAIN: nothing more queued (other errors: try next time).
            }
            if sll.sll_pkttype == libc::PACKET_OUTGOING || sll.sll_halen != 6 {
                continue;
            }
            let Some((src, payload)) = udp_of(&buf[..n as usize]) else {
                continue;
            };
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&sll.sll_addr[..6]);
            if self.seen.len() == KEEP {
                self.seen.pop_front();
            }
            self.seen.push_back(Seen {
                src,
                digest: digest(payload),
                mac,
            });
        }
    }
}

/// Enters the MH's link-layer address (`link`: the cell interface and the MAC) in
/// the neighbour table; without it the kernel resolves the address when it first
/// sends to the MH, as before. Then asks the MH for its address from the gateway's
/// (a unicast ARP request or neighbour solicitation), which enters the gateway in the
/// MH's table: an MH's OS flushes its neighbour entries when its carrier drops, and
/// otherwise its first ACKs after a move wait for a resolution whose reply queues
/// behind the restored connections' first flight (~290 ms on a 2 Mbit/s cell).
pub fn learn_link(d: &Daemon, mh: IpAddr, link: &Option<(String, [u8; 6])>) {
    let Some((ifname, mac)) = link else { return };
    if let Err(e) = crate::netlink::neigh_learn(ifname, mh, *mac) {
        tracing::debug!(%mh, error = %e, "MH's link-layer address not entered");
    }
    let Some(gw) = d.cell_gateway(ifname, mh) else {
        tracing::debug!(%mh, %ifname, "no address of ours in the MH's prefix: not asked");
        return;
    };
    if let Err(e) = crate::netlink::ask_neighbour(ifname, gw, mh, *mac) {
        tracing::debug!(%mh, error = %e, "MH not asked for its address");
    }
}

fn digest(payload: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    payload.hash(&mut h);
    h.finish()
}

/// The MAC of the frames that carried (`src`, `digest`): None if none did, or if
/// frames from different MACs did (a station replaying another's datagram).
fn lookup(seen: &VecDeque<Seen>, src: IpAddr, digest: u64) -> Option<[u8; 6]> {
    let mut macs = seen
        .iter()
        .filter(|s| s.src == src && s.digest == digest)
        .map(|s| s.mac);
    let first = macs.next()?;
    macs.all(|m| m == first).then_some(first)
}

/// The source address and UDP payload of a whole IP packet (IPv6: UDP right after the
/// fixed header; fragments are not greetings).
fn udp_of(p: &[u8]) -> Option<(IpAddr, &[u8])> {
    let ip = IpPacket::new_checked(p).ok()?;
    if ip.protocol() != udp::PROTOCOL || ip.is_fragment() {
        return None;
    }
    let src = ip.src_addr();
    let udp = UdpDatagram::new_checked(ip.into_payload()).ok()?;
    Some((src, udp.into_payload()))
}

/// The classic BPF program: inbound UDP to `port`, IPv4 (not a fragment) or IPv6 (UDP
/// as the first header). Offsets are from the network header (SOCK_DGRAM).
fn filter(port: u16, ipv6: bool) -> Vec<libc::sock_filter> {
    const LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const LD_H_IND: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_IND) as u16;
    const LDX_MSH: u16 = (libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    // skb->protocol, in host order (SKF_AD_OFF + SKF_AD_PROTOCOL).
    const PROTOCOL: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_PROTOCOL) as u32;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let port = u32::from(port);
    if ipv6 {
        vec![
            op(LD_H_ABS, 0, 0, PROTOCOL),
            op(JEQ, 0, 5, libc::ETH_P_IPV6 as u32),
            op(LD_B_ABS, 0, 0, 6), // next header
            op(JEQ, 0, 3, 17),
            op(LD_H_ABS, 0, 0, 42), // UDP destination port
            op(JEQ, 0, 1, port),
            op(RET, 0, 0, SNAP as u32),
            op(RET, 0, 0, 0),
        ]
    } else {
        vec![
            op(LD_H_ABS, 0, 0, PROTOCOL),
            op(JEQ, 0, 8, libc::ETH_P_IP as u32),
            op(LD_B_ABS, 0, 0, 9), // protocol
            op(JEQ, 0, 6, 17),
            op(LD_H_ABS, 0, 0, 6), // flags and fragment offset
            op(JSET, 4, 0, 0x1fff),
            op(LDX_MSH, 0, 0, 0),  // X = header length
            op(LD_H_IND, 0, 0, 2), // UDP destination port
            op(JEQ, 0, 1, port),
            op(RET, 0, 0, SNAP as u32),
            op(RET, 0, 0, 0),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    fn v4_udp(src: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0x40,
            0,
            64,
            17,
        ];
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(&src);
        p.extend_from_slice(&[10, 2, 0, 1]);
        p.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90]);
        p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        p.extend_from_slice(&[0; 6]); // Ethernet padding, past the IP length
        p
    }

    #[test]
    fn finds_source_and_payload_of_udp_datagrams() {
        let p = v4_udp([10, 2, 0, 100], b"hello");
        let (src, payload) = udp_of(&p).unwrap();
        assert_eq!(src, IpAddr::from([10, 2, 0, 100]));
        assert_eq!(payload, b"hello");

        let mut v6 = vec![0x60, 0, 0, 0, 0, 13, 17, 64];
        v6.extend_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 100).octets());
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90, 0, 13, 0, 0]);
        v6.extend_from_slice(b"hello");
        let (src, payload) = udp_of(&v6).unwrap();
        assert_eq!(src, "2001:db8:2::64".parse::<IpAddr>().unwrap());
        assert_eq!(payload, b"hello");

        let mut tcp = p.clone();
        tcp[9] = 6;
        assert_eq!(udp_of(&tcp), None);
        assert_eq!(udp_of(&p[..20]), None, "truncated");
        assert_eq!(udp_of(&[]), None);
    }

    #[test]
    fn a_datagram_carried_by_two_macs_names_neither() {
        let (a, b) = ([2, 0, 0, 0, 0, 0x64], [2, 0, 0, 0, 0, 0x66]);
        let mh = IpAddr::from([10, 2, 0, 100]);
        let g = digest(b"greeting");
        let mut seen = VecDeque::new();
        seen.push_back(Seen {
            src: mh,
            digest: digest(b"other"),
            mac: b,
        });
        seen.push_back(Seen {
            src: mh,
            digest: g,
            mac: a,
        });
        assert_eq!(lookup(&seen, mh, g), Some(a));
        assert_eq!(lookup(&seen, IpAddr::from([10, 2, 0, 101]), g), None);
        // The same bytes again from another station (a replay): trust neither.
        seen.push_back(Seen {
            src: mh,
            digest: g,
            mac: b,
        });
        assert_eq!(lookup(&seen, mh, g), None);
    }

    #[test]
    fn the_filter_jumps_stay_inside_the_program() {
        for v6 in [false, true] {
            let prog = filter(8000, v6);
            for (i, ins) in prog.iter().enumerate() {
                if u32::from(ins.code) & 0x07 == libc::BPF_JMP {
                    assert!(i + 1 + (ins.jt as usize) < prog.len());
                    assert!(i + 1 + (ins.jf as usize) < prog.len());
                }
            }
            assert_eq!(prog.last().unwrap().k, 0, "falls through to drop");
        }
    }
}
