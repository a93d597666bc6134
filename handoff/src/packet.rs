//! The packets a restore has to forge, addressed from the peer to the restored socket
//! through a raw socket so that they arrive over the loopback path (the real peer never
//! sees them):
//!
//! * **The peer's FIN.** TCP_REPAIR can put bytes in a receive queue but cannot mark it
//!   "FIN received". A connection whose peer had already closed its direction
//!   (CLOSE_WAIT, LAST_ACK, CLOSING) is therefore restored one sequence number short,
//!   and this FIN moves it to CLOSE_WAIT exactly as the original FIN did. The real peer
//!   only sees (at most) a duplicate ACK of a FIN it already knows was acknowledged.
//! * **An old duplicate ACK** (below the receive window), which TCP must answer with
//!   its current ACK (RFC 793, p. 69): the way to make a restored socket send the peer
//!   an *acceptable* ACK at restart (see [`crate::image::restart`]).
//!
//! Pure code: builds bytes, checksums included, so it is unit-tested without sockets.

use std::net::{IpAddr, SocketAddr};

use itcp_wire::ip::ipv6_octets as v6_octets;
use itcp_wire::{self as wire, tcp, IpPacket, TcpSegment};

/// An ACK (or FIN|ACK) segment without data from `src` (the peer) to `dst` (the
/// restored socket).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// Sequence number (of the FIN: the restored socket's `rcv_nxt`).
    pub seq: u32,
    /// Acknowledgement: the restored socket's `snd_una` (acknowledges nothing new).
    pub ack: u32,
    /// Window field, already scaled down by the peer's window scale.
    pub window: u16,
    /// FIN|ACK rather than a plain ACK.
    pub fin: bool,
    /// TSval and TSecr, when the segment carries the timestamp option.
    pub timestamps: Option<(u32, u32)>,
}

impl Segment {
    /// The TCP header (with options), checksum filled in.
    fn tcp_header(&self) -> Vec<u8> {
        let opt_len = if self.timestamps.is_some() { 12 } else { 0 };
        let hlen = 20 + opt_len;
        let mut t = Vec::with_capacity(hlen);
        t.extend_from_slice(&self.src.port().to_be_bytes());
        t.extend_from_slice(&self.dst.port().to_be_bytes());
        t.extend_from_slice(&self.seq.to_be_bytes());
        t.extend_from_slice(&self.ack.to_be_bytes());
        t.push(((hlen / 4) as u8) << 4);
        t.push(if self.fin {
            tcp::FIN | tcp::ACK
        } else {
            tcp::ACK
        });
        t.extend_from_slice(&self.window.to_be_bytes());
        t.extend_from_slice(&[0, 0]); // checksum
        t.extend_from_slice(&[0, 0]); // urgent pointer
        if let Some((tsval, tsecr)) = self.timestamps {
            t.extend_from_slice(&[1, 1, 8, 10]); // NOP NOP TS len=10
            t.extend_from_slice(&tsval.to_be_bytes());
            t.extend_from_slice(&tsecr.to_be_bytes());
        }
        let c = tcp_checksum(self.src.ip(), self.dst.ip(), &t);
        t[16..18].copy_from_slice(&c.to_be_bytes());
        t
    }

    /// The whole IP packet (IPv4 if both addresses are IPv4, IPv6 otherwise).
    pub fn to_ip_packet(&self) -> Vec<u8> {
        let tcp = self.tcp_header();
        let mut p = match (self.src.ip(), self.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                wire::ipv4::header(s, d, tcp::PROTOCOL, tcp.len(), true).map(Vec::from)
            }
            (s, d) => {
                let (s, d) = (v6_octets(s).into(), v6_octets(d).into());
                wire::ipv6::header(s, d, tcp::PROTOCOL, tcp.len()).map(Vec::from)
            }
        }
        .expect("a bare TCP header fits any IP packet");
        p.extend_from_slice(&tcp);
        p
    }
}

/// The checksum of TCP segment `tcp` (its checksum field zero) from `src` to `dst`.
fn tcp_checksum(src: IpAddr, dst: IpAddr, tcp: &[u8]) -> u16 {
    let acc = wire::checksum::pseudo_header(src, dst, tcp::PROTOCOL, tcp.len() as u32);
    wire::checksum::fold(wire::checksum::sum(acc, tcp))
}

/// Fills in the TCP checksum of `packet`, an IPv4 (header checksum too) or IPv6 packet
/// carrying a whole TCP segment with no extension headers (not a fragment). A packet
/// logged on its way out of this host has a partial one (the device would finish it).
/// False if it is no such packet.
pub fn fill_checksums(packet: &mut [u8]) -> bool {
    let Some(mut ip) = whole_tcp(packet) else {
        return false;
    };
    ip.fill_checksum();
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    match TcpSegment::new_checked(ip.payload_mut()) {
        Ok(mut seg) => seg.fill_checksum(src, dst),
        Err(_) => return false,
    }
    true
}

/// `packet` as a whole IP packet carrying TCP, not a fragment (a fragment's checksum
/// covers bytes it does not have).
fn whole_tcp(packet: &mut [u8]) -> Option<IpPacket<&mut [u8]>> {
    let ip = IpPacket::new_checked(packet).ok()?;
    (ip.protocol() == tcp::PROTOCOL && !ip.is_fragment()).then_some(ip)
}

/// Makes a held segment from the peer tell a restored socket nothing about our bytes
/// in flight: its ACK goes back to `una` if beyond, and its SACK blocks become NOPs;
/// checksums are filled in again. For a socket that re-sent those bytes as new data
/// at its restart (`AsNew`): an ACK or SACK of their first copy would be taken for one
/// of the new copy, an RTT sample of a fraction of a millisecond. The peer tells again
/// soon enough (the new copy draws its ACKs). Data, window and timestamps stay. False
/// (unchanged) for anything but an IPv4 or IPv6 TCP segment with ACK set, or one that
/// needs no change.
///
/// `past_fin`: one past our FIN, when the socket re-sent one. An ACK of exactly that
/// stays: it acknowledges everything, the FIN included, so the socket sends nothing
/// more and no estimate it would spoil matters, and a peer that closes next (it gets
/// our ACK of its own FIN) may never say it again: rewritten, our FIN went
/// unacknowledged, and its retransmissions met the closed peer's RSTs.
pub fn forget_acks(packet: &mut [u8], una: u32, past_fin: Option<u32>) -> bool {
    let Some(mut ip) = whole_tcp(packet) else {
        return false;
    };
    let Ok(mut seg) = TcpSegment::new_checked(ip.payload_mut()) else {
        return false;
    };
    if seg.flags() & tcp::ACK == 0 {
        return false;
    }
    let mut changed = false;
    let ack = seg.ack_number();
    if (ack.wrapping_sub(una) as i32) > 0 && past_fin != Some(ack) {
        seg.set_ack_number(una);
        changed = true;
    }
    // Up to the first bad option: what follows it cannot be told apart.
    let sacks: Vec<_> = seg
        .options()
        .map_while(Result::ok)
        .filter(|o| o.kind == tcp::OPT_SACK)
        .map(|o| o.at)
        .collect();
    for at in sacks {
        seg.options_mut()[at].fill(tcp::OPT_NOP);
        changed = true;
    }
    changed && fill_checksums(packet)
}

#[cfg(test)]
mod tests {
    use super::*;
    use itcp_wire::checksum::internet as checksum;

    /// An IPv4 ACK from 10.0.0.1:5001 to 10.2.0.100:40000 with timestamps and two
    /// SACK blocks.
    fn sacking_ack(ack: u32) -> Vec<u8> {
        let mut p = seg("10.0.0.1:5001", "10.2.0.100:40000", true).to_ip_packet();
        p[28..32].copy_from_slice(&ack.to_be_bytes());
        // NOP NOP SACK(2 blocks): 2 + 18 bytes, data offset from 8 to 13 words.
        let mut sack = vec![1, 1, 5, 18];
        for v in [100u32, 200, 300, 400] {
            sack.extend_from_slice(&v.to_be_bytes());
        }
        p.extend_from_slice(&sack);
        p[32] = 13 << 4;
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        assert!(fill_checksums(&mut p));
        p
    }

    #[test]
    fn a_held_ack_forgets_what_it_said_of_bytes_in_flight() {
        let mut p = sacking_ack(5000);
        let ts = p[40..52].to_vec();
        assert!(forget_acks(&mut p, 1000, Some(5001)));
        assert_eq!(u32::from_be_bytes(p[28..32].try_into().unwrap()), 1000);
        assert!(p[52..72].iter().all(|b| *b == 1), "SACK blocks are NOPs");
        assert_eq!(p[40..52], ts[..], "timestamps stay");
        // Checksums are right again: computing them anew changes nothing.
        let mut q = p.clone();
        fill_checksums(&mut q);
        assert_eq!(p, q);
        assert!(!forget_acks(&mut p, 1000, None), "nothing left to forget");
        // An ACK behind `una` (across the wrap) stays.
        let mut p = sacking_ack(10);
        forget_acks(&mut p, 0xffff_fff0u32.wrapping_add(100), None);
        assert_eq!(u32::from_be_bytes(p[28..32].try_into().unwrap()), 10);
        // Not TCP with ACK: untouched.
        let mut p = sacking_ack(5000);
        p[33] &= !tcp::ACK;
        let q = p.clone();
        assert!(!forget_acks(&mut p, 1000, None));
        assert_eq!(p, q);
        assert!(!forget_acks(&mut [0x45, 0, 0], 1, None));
    }

    #[test]
    fn a_held_ack_of_our_re_sent_fin_stays() {
        let mut p = sacking_ack(5000);
        // 5000 is one past our FIN: the ACK stays, its SACK blocks still go.
        assert!(forget_acks(&mut p, 1000, Some(5000)));
        assert_eq!(u32::from_be_bytes(p[28..32].try_into().unwrap()), 5000);
        assert!(p[52..72].iter().all(|b| *b == 1), "SACK blocks are NOPs");
        let mut q = p.clone();
        fill_checksums(&mut q);
        assert_eq!(p, q, "checksums are right");
        // Short of the FIN: forgotten as before.
        let mut p = sacking_ack(4999);
        assert!(forget_acks(&mut p, 1000, Some(5000)));
        assert_eq!(u32::from_be_bytes(p[28..32].try_into().unwrap()), 1000);
    }

    fn seg(src: &str, dst: &str, ts: bool) -> Segment {
        Segment {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            seq: 0x0102_0304,
            ack: 0xa0b0_c0d0,
            window: 512,
            fin: true,
            timestamps: ts.then_some((7, 9)),
        }
    }

    #[test]
    fn ipv4_packet_checksums_verify() {
        let p = seg("10.77.0.1:5000", "10.77.0.2:7000", true).to_ip_packet();
        assert_eq!(p.len(), 20 + 32);
        assert_eq!(checksum(&p[..20]), 0, "IP header checksum");
        // TCP checksum over pseudo-header + segment must fold to zero.
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&p[12..20]);
        pseudo.extend_from_slice(&[0, 6, 0, 32]);
        pseudo.extend_from_slice(&p[20..]);
        assert_eq!(checksum(&pseudo), 0, "TCP checksum");
        assert_eq!(p[20 + 13], 0x11, "FIN|ACK");
        assert_eq!(p[20 + 12] >> 4, 8, "data offset with timestamp option");
        assert_eq!(&p[24..28], &0x0102_0304u32.to_be_bytes());
    }

    #[test]
    fn spoilt_checksums_are_filled_in_again() {
        for (a, b) in [
            ("10.77.0.1:5000", "10.77.0.2:7000"),
            ("[fd77::1]:5000", "[fd77::2]:7000"),
        ] {
            let good = seg(a, b, true).to_ip_packet();
            let mut p = good.clone();
            let at = if p[0] >> 4 == 4 { 20 } else { 40 };
            p[at + 16] ^= 0x5a;
            if at == 20 {
                p[10] ^= 0x11;
            }
            assert!(fill_checksums(&mut p));
            assert_eq!(p, good);
        }
        assert!(!fill_checksums(&mut [0x45, 0, 0]));
        assert!(!fill_checksums(&mut []));
    }

    #[test]
    fn ipv6_packet_checksums_verify() {
        let p = seg("[fd77::1]:5000", "[fd77::2]:7000", false).to_ip_packet();
        assert_eq!(p.len(), 40 + 20);
        assert_eq!(p[0] >> 4, 6);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&p[8..40]);
        pseudo.extend_from_slice(&[0, 0, 0, 20, 0, 0, 0, 6]);
        pseudo.extend_from_slice(&p[40..]);
        assert_eq!(checksum(&pseudo), 0, "TCP checksum");
        assert_eq!(p[40 + 12] >> 4, 5);
        assert_eq!(p[40 + 13], 0x11, "FIN|ACK");
        let ack = Segment {
            fin: false,
            ..seg("[fd77::1]:5000", "[fd77::2]:7000", false)
        };
        let p = ack.to_ip_packet();
        assert_eq!(p[40 + 13], 0x10, "ACK");
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&p[8..40]);
        pseudo.extend_from_slice(&[0, 0, 0, 20, 0, 0, 0, 6]);
        pseudo.extend_from_slice(&p[40..]);
        assert_eq!(checksum(&pseudo), 0, "TCP checksum of the plain ACK");
    }

    #[test]
    fn checksum_of_known_header() {
        // RFC 1071 style example: a classic IPv4 header whose checksum is 0xb861.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0xb861);
    }
}
