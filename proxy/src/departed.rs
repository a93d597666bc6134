//! Whether a frame from an MH this MSR has just handed to another MSR shows the MH
//! back in this cell, or only left the MH before it moved.
//!
//! A cell's uplink queue goes on delivering, after the handoff, what the MH sent
//! before it: taken for an arrival, each such frame would pull the MH's connections
//! back, and the MSR it moved to would pull them again (ping-pong). Only a new arrival
//! can acknowledge data that another MSR sent the MH after this one let go: a TCP
//! segment of a connection that moved, whose ACK lies beyond what this MSR had sent
//! on it (`snd_nxt` at capture), left the MH after the move. Such a segment counts at
//! once. Any other frame (a stale ACK, a new connection's SYN, ARP, UDP) proves
//! nothing, and counts only once the uplink has had `window` to drain.
//!
//! No I/O: the detection task feeds it the head of each reported frame.

use std::collections::HashMap;
use std::net::SocketAddr;

/// A connection as the MH's segments name it: (MH's end, other end).
pub type Flow = (SocketAddr, SocketAddr);

/// What an MSR keeps of an MH it handed away.
#[derive(Debug, Clone)]
pub struct Departure {
    /// When the connections left (µs, any monotonic or wall clock used consistently).
    at_us: u64,
    /// Per connection that moved: the sequence number up to which this MSR had sent
    /// data to the MH.
    sent: HashMap<Flow, u32>,
}

/// What a frame says about the MH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// It acknowledges data this MSR never sent: the MH is back.
    Returned,
    /// It may have left the MH before the move, and the window has not passed.
    Stale,
    /// The window has passed: every frame counts again.
    Expired,
}

impl Departure {
    pub fn new(at_us: u64, sent: impl IntoIterator<Item = (Flow, u32)>) -> Self {
        Departure {
            at_us,
            sent: sent.into_iter().collect(),
        }
    }

    /// Judges `packet` (an IPv4 or IPv6 packet's head, as NFLOG copies it; anything
    /// else proves nothing) arriving at `now_us`.
    pub fn judge(&self, packet: &[u8], now_us: u64, window_us: u64) -> Evidence {
        if now_us.saturating_sub(self.at_us) >= window_us {
            return Evidence::Expired;
        }
        let beyond = tcp_ack(packet).and_then(|(flow, ack)| {
            let sent = *self.sent.get(&flow)?;
            // Sequence space wraps: "beyond" is ahead by less than half of it.
            Some(ack != sent && ack.wrapping_sub(sent) < 1 << 31)
        });
        if beyond == Some(true) {
            Evidence::Returned
        } else {
            Evidence::Stale
        }
    }
}

/// The flow and ACK number of a TCP segment with the ACK flag (neither SYN nor RST),
/// from the head of an IPv4 packet or an IPv6 packet without extension headers.
fn tcp_ack(p: &[u8]) -> Option<(Flow, u32)> {
    let ack = crate::holding::tcp_ack(p)?;
    let e = crate::holding::ends(p)?;
    Some(((e.src, e.dst), ack))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    const TCP: u8 = 6;
    const TCP_ACK: u8 = 0x10;

    const MH: &str = "10.2.0.100:40000";
    const FH: &str = "10.0.0.1:5001";
    const WINDOW: u64 = 1_000_000;

    fn v4_segment(src: &str, dst: &str, ack: u32, flags: u8) -> Vec<u8> {
        let (s, d): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
        let (IpAddr::V4(si), IpAddr::V4(di)) = (s.ip(), d.ip()) else {
            panic!()
        };
        let mut p = vec![0x45, 0, 0, 52, 0, 0, 0x40, 0, 64, TCP, 0, 0];
        p.extend_from_slice(&si.octets());
        p.extend_from_slice(&di.octets());
        p.extend_from_slice(&s.port().to_be_bytes());
        p.extend_from_slice(&d.port().to_be_bytes());
        p.extend_from_slice(&7u32.to_be_bytes());
        p.extend_from_slice(&ack.to_be_bytes());
        p.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        p
    }

    fn v6_segment(src: &str, dst: &str, ack: u32) -> Vec<u8> {
        let (s, d): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
        let (IpAddr::V6(si), IpAddr::V6(di)) = (s.ip(), d.ip()) else {
            panic!()
        };
        let mut p = vec![0x60, 0, 0, 0, 0, 120, TCP, 64];
        p.extend_from_slice(&si.octets());
        p.extend_from_slice(&di.octets());
        p.extend_from_slice(&s.port().to_be_bytes());
        p.extend_from_slice(&d.port().to_be_bytes());
        p.extend_from_slice(&7u32.to_be_bytes());
        p.extend_from_slice(&ack.to_be_bytes());
        p.extend_from_slice(&[0x50, TCP_ACK, 0xff, 0xff, 0, 0, 0, 0]);
        // NFLOG copies 64 bytes: the headers and 4 of the 100 bytes of data.
        p.extend_from_slice(b"data");
        p
    }

    fn left_at(at: u64, sent: u32) -> Departure {
        Departure::new(at, [((MH.parse().unwrap(), FH.parse().unwrap()), sent)])
    }

    #[test]
    fn an_ack_of_data_sent_after_the_move_proves_a_return() {
        let d = left_at(0, 1000);
        let seg = v4_segment(MH, FH, 1001, TCP_ACK);
        assert_eq!(d.judge(&seg, 10, WINDOW), Evidence::Returned);
    }

    #[test]
    fn an_ack_of_what_this_msr_sent_proves_nothing() {
        let d = left_at(0, 1000);
        for ack in [1000, 999, 0u32.wrapping_sub(5)] {
            let seg = v4_segment(MH, FH, ack, TCP_ACK);
            assert_eq!(d.judge(&seg, 10, WINDOW), Evidence::Stale, "ack {ack}");
        }
    }

    #[test]
    fn sequence_numbers_wrap() {
        let d = left_at(0, u32::MAX - 10);
        let seg = v4_segment(MH, FH, 20, TCP_ACK);
        assert_eq!(d.judge(&seg, 10, WINDOW), Evidence::Returned);
        let d = left_at(0, 20);
        let seg = v4_segment(MH, FH, u32::MAX - 10, TCP_ACK);
        assert_eq!(d.judge(&seg, 10, WINDOW), Evidence::Stale);
    }

    #[test]
    fn other_frames_prove_nothing_until_the_window_has_passed() {
        let d = left_at(100, 1000);
        let other_flow = v4_segment("10.2.0.100:40001", FH, 5000, TCP_ACK);
        let syn = v4_segment(MH, FH, 5000, 0x02);
        let arp = [0u8, 1, 8, 0, 6, 4, 0, 1];
        for p in [&other_flow[..], &syn[..], &arp[..], &[][..], &[0x45][..]] {
            assert_eq!(d.judge(p, 100 + WINDOW - 1, WINDOW), Evidence::Stale);
            assert_eq!(d.judge(p, 100 + WINDOW, WINDOW), Evidence::Expired);
        }
    }

    #[test]
    fn ipv6_segments_are_judged_from_the_copied_head() {
        let (mh, fh) = ("[2001:db8:2::100]:40000", "[2001:db8::1]:5001");
        let d = Departure::new(0, [((mh.parse().unwrap(), fh.parse().unwrap()), 1000)]);
        assert_eq!(
            d.judge(&v6_segment(mh, fh, 1500), 1, WINDOW),
            Evidence::Returned
        );
        assert_eq!(
            d.judge(&v6_segment(mh, fh, 900), 1, WINDOW),
            Evidence::Stale
        );
    }

    #[test]
    fn truncated_or_fragmented_packets_prove_nothing() {
        let d = left_at(0, 1000);
        let seg = v4_segment(MH, FH, 2000, TCP_ACK);
        for n in 0..seg.len() {
            let e = d.judge(&seg[..n], 1, WINDOW);
            assert!(n >= 34 || e == Evidence::Stale, "{n} bytes: {e:?}");
        }
        let mut frag = seg.clone();
        frag[7] = 8;
        assert_eq!(d.judge(&frag, 1, WINDOW), Evidence::Stale);
        let mut bad_ihl = seg;
        bad_ihl[0] = 0x44;
        assert_eq!(d.judge(&bad_ihl, 1, WINDOW), Evidence::Stale);
    }
}
