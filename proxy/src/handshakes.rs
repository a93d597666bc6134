//! Handshakes caught between MSRs. A TCP handshake still half-open here (SYN_RECV)
//! when its MH moves on cannot be captured: the kernel keeps request sockets out of
//! reach of accept and TCP_REPAIR. When the MH left the cell after our SYN-ACK reached
//! it but before its ACK got out (a gap between cells), that ACK never comes here, and
//! the MH's next segment would meet the new MSR with no socket for it: a reset.
//!
//! msrd's rules report every SYN-ACK sent to an MH on an NFLOG group
//! (`[interception] nflog_group` + 1); [`Recent`] keeps them for a request socket's
//! lifetime. A handoff that still finds handshakes of its MH half-open replays, for
//! each, the ACK the MH sent ([`ack_of`]: the sequence numbers the SYN-ACK named, the
//! timestamps it carried) to the request socket over the loopback path. The kernel
//! completes the handshake with the options the MH's SYN negotiated, as if the MH's
//! own ACK had come; msrd takes the connection and it moves like any other in setup.
//! The MH, which took its handshake for complete, never sees a difference.
//! (Pure here: packets and the table. The daemon's side is
//! `crate::handoff::handshakes`.)
//!
//! Unless our SYN-ACK was lost instead (the MH left before it arrived): the MH then
//! retransmits its SYN, to the new MSR, where the connection is established already
//! and would only draw a challenge ACK, which a host in SYN_SENT drops. So the image
//! of a connection completed this way carries that SYN-ACK, and the new MSR answers
//! the MH's SYNs on its flow with it, as the request socket would have ([`Recent::expect`],
//! the `resyn` sets).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use itcp_handoff::packet::Segment;
use itcp_wire::tcp::{self, TcpSegment, ACK, SYN};
use itcp_wire::tcp_in_head;

/// Bytes of each SYN-ACK copied: an IPv6 header and a TCP header with every option.
pub const COPY: u32 = 40 + 60;

/// How long a SYN-ACK is remembered: a request socket's lifetime with Linux's default
/// five SYN-ACK retransmissions (each one reported again) is about a minute.
pub const KEEP: Duration = Duration::from_secs(64);

/// At most this many are remembered (a few MiB); over it, the older half goes at once.
const CAP: usize = 65536;

/// What a SYN-ACK sent to an MH tells of its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynAck {
    /// Our end (the address the MH connected to).
    pub local: SocketAddr,
    /// The MH's end.
    pub remote: SocketAddr,
    /// Our initial sequence number.
    pub isn: u32,
    /// The MH's initial sequence number + 1.
    pub ack: u32,
    /// Window scaling was negotiated (the MH's shift is not in the SYN-ACK).
    pub wscale: bool,
    /// Our TSval and the MH's (echoed as TSecr), when timestamps were negotiated.
    pub ts: Option<(u32, u32)>,
}

/// Reads an IPv4 or IPv6 packet carrying a TCP SYN-ACK (anything else: `None`).
/// Extension headers are not looked through: the kernel sends none on a handshake.
pub fn parse(p: &[u8]) -> Option<SynAck> {
    let (ip, seg) = tcp_in_head(p).ok()?;
    if seg.flags() & (SYN | ACK) != SYN | ACK {
        return None;
    }
    let (wscale, ts) = tcp_options(&seg)?;
    Some(SynAck {
        local: SocketAddr::new(ip.src_addr(), seg.src_port()),
        remote: SocketAddr::new(ip.dst_addr(), seg.dst_port()),
        isn: seg.seq_number(),
        ack: seg.ack_number(),
        wscale,
        ts,
    })
}

/// Of a TCP header's options: whether it has window scaling, and its timestamps
/// (TSval, TSecr). `None` when the options are cut short or malformed.
pub(crate) fn tcp_options(seg: &TcpSegment<&[u8]>) -> Option<(bool, Option<(u32, u32)>)> {
    let (mut wscale, mut ts) = (false, None);
    for o in seg.options() {
        let o = o.ok()?;
        match (o.kind, o.data) {
            (tcp::OPT_WINDOW_SCALE, [_]) => wscale = true,
            (tcp::OPT_TIMESTAMPS, &[a, b, c, d, e, f, g, h]) => {
                ts = Some((
                    u32::from_be_bytes([a, b, c, d]),
                    u32::from_be_bytes([e, f, g, h]),
                ));
            }
            _ => {}
        }
    }
    Some((wscale, ts))
}

/// Reads a packet carrying a TCP SYN (no ACK): its source and destination.
pub fn parse_syn(p: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let (ip, seg) = tcp_in_head(p).ok()?;
    (seg.flags() & (SYN | ACK) == SYN).then(|| {
        (
            SocketAddr::new(ip.src_addr(), seg.src_port()),
            SocketAddr::new(ip.dst_addr(), seg.dst_port()),
        )
    })
}

/// The ACK that completes the handshake `s` answered: from the MH, acknowledging our
/// SYN, with the MH's TSval of its SYN (PAWS passes: it equals the request socket's
/// `ts_recent`) and our latest TSval echoed. The window is a guess the MH's next
/// segment corrects: small, so that nothing is sent past what the MH can take (with
/// scaling on, 128 is 16 KiB at Linux's usual shift of 7).
pub fn ack_of(s: &SynAck) -> Segment {
    Segment {
        src: s.remote,
        dst: s.local,
        seq: s.ack,
        ack: s.isn.wrapping_add(1),
        window: if s.wscale { 128 } else { 16384 },
        fin: false,
        timestamps: s.ts.map(|(ours, theirs)| (theirs, ours)),
    }
}

type Flow = (SocketAddr, SocketAddr);

/// A map of at most [`CAP`] entries that forgets the older half at once when full: two
/// generations, the current one replacing the previous when it holds half of `CAP`
/// (O(1) per insert however fast SYN-ACKs come).
struct Generations<V> {
    cur: HashMap<Flow, V>,
    old: HashMap<Flow, V>,
}

impl<V> Default for Generations<V> {
    fn default() -> Self {
        Generations {
            cur: HashMap::new(),
            old: HashMap::new(),
        }
    }
}

impl<V> Generations<V> {
    fn insert(&mut self, k: Flow, v: V) {
        if self.cur.len() >= CAP / 2 {
            self.old = std::mem::take(&mut self.cur);
        }
        self.cur.insert(k, v);
    }

    fn get(&self, k: &Flow) -> Option<&V> {
        self.cur.get(k).or_else(|| self.old.get(k))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.cur.len() + self.old.len()
    }
}

/// Per MH: (our end, the MH's end, the SYN-ACK sent) of each handshake completed here
/// by a replayed ACK.
type Replayed = HashMap<IpAddr, Vec<(SocketAddr, SocketAddr, Vec<u8>)>>;

/// The SYN-ACKs sent to MHs lately (with when), those of handshakes completed here by
/// a replayed ACK, and those of connections completed that way elsewhere that moved
/// in, each by (our end, the MH's end).
#[derive(Default)]
pub struct Recent {
    /// Each as sent (IP header on; read again when needed, which is rare).
    sent: Mutex<Generations<(Vec<u8>, Instant)>>,
    /// Completed here by a replayed ACK, by MH: carried by the MH's next images.
    replayed: Mutex<Replayed>,
    /// Moved in: the SYN-ACK to send again when the MH retransmits its SYN.
    moved_in: Mutex<Generations<(Vec<u8>, Instant)>>,
}

impl Recent {
    /// A SYN-ACK was sent (`packet`, which `s` was read from).
    pub fn record(&self, s: SynAck, packet: &[u8], now: Instant) {
        let e = (packet.to_vec(), now);
        self.sent.lock().unwrap().insert((s.local, s.remote), e);
    }

    /// The last SYN-ACK of the handshake between `local` and `remote`, if recent.
    pub fn get(&self, local: SocketAddr, remote: SocketAddr, now: Instant) -> Option<SynAck> {
        let m = self.sent.lock().unwrap();
        m.get(&(local, remote))
            .filter(|e| now.duration_since(e.1) < KEEP)
            .and_then(|e| parse(&e.0))
    }

    /// The handshake between `local` and `remote` was completed here by a replayed ACK.
    pub fn mark_replayed(&self, local: SocketAddr, remote: SocketAddr) {
        let Some(packet) = self
            .sent
            .lock()
            .unwrap()
            .get(&(local, remote))
            .map(|e| e.0.clone())
        else {
            return;
        };
        let mut r = self.replayed.lock().unwrap();
        let v = r.entry(remote.ip()).or_default();
        if !v.iter().any(|(l, m, _)| (*l, *m) == (local, remote)) {
            v.push((local, remote, packet));
        }
    }

    /// What [`Handshakes::take_replayed`] would take, left in place.
    pub fn replayed(&self, mh: IpAddr) -> Vec<(SocketAddr, SocketAddr, Vec<u8>)> {
        let r = self.replayed.lock().unwrap();
        r.get(&mh).cloned().unwrap_or_default()
    }

    /// The handshakes of `mh` completed here by a replayed ACK: (our end, the MH's
    /// end, the SYN-ACK sent). Taken: a handoff carries them once.
    pub fn take_replayed(&self, mh: IpAddr) -> Vec<(SocketAddr, SocketAddr, Vec<u8>)> {
        self.replayed
            .lock()
            .unwrap()
            .remove(&mh)
            .unwrap_or_default()
    }

    /// A connection completed by a replayed ACK at the old MSR moved in: the MH may
    /// still retransmit the SYN that `synack` answers. The SYN-ACK was logged on its
    /// way out of the old MSR, its TCP checksum not computed yet: it is here.
    pub fn expect(&self, synack: &[u8], now: Instant) -> Option<SynAck> {
        let s = parse(synack)?;
        let mut p = synack.to_vec();
        if !itcp_handoff::packet::fill_checksums(&mut p) {
            return None;
        }
        self.moved_in
            .lock()
            .unwrap()
            .insert((s.local, s.remote), (p, now));
        Some(s)
    }

    /// The SYN-ACK to send the MH again for its SYN from `remote` to `local`.
    pub fn again(&self, local: SocketAddr, remote: SocketAddr, now: Instant) -> Option<Vec<u8>> {
        let m = self.moved_in.lock().unwrap();
        m.get(&(local, remote))
            .filter(|(_, at)| now.duration_since(*at) < KEEP)
            .map(|(p, _)| p.clone())
    }
}

/// Sends the MH's ACK of `s` to our request socket. The mark routes it to this host
/// when our end is not a local address (an intercepted connection's is the FH's).
pub fn replay(s: &SynAck, mark: u32) -> io::Result<()> {
    let seg = ack_of(s);
    // Any socket of this namespace: the raw socket that sends must be made in it.
    let here = socket2::Socket::new(
        socket2::Domain::for_address(seg.dst),
        socket2::Type::DGRAM,
        None,
    )?;
    itcp_handoff::repair::send_raw_ip_to(here.as_fd(), &seg.dst, &seg.to_ip_packet(), mark)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    /// A SYN-ACK from 10.0.0.1:5009 to 10.2.0.100:40000 as Linux sends it: MSS, SACK
    /// permitted, timestamps, NOP, window scale.
    fn synack4() -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 2, 0, 100,
        ];
        p.extend_from_slice(&5009u16.to_be_bytes());
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&0xfffffff0u32.to_be_bytes());
        p.extend_from_slice(&1001u32.to_be_bytes());
        p.extend_from_slice(&[0xa0, 0x12, 0xfe, 0x88, 0, 0, 0, 0]);
        p.extend_from_slice(&[2, 4, 5, 0xb4, 4, 2, 8, 10]);
        p.extend_from_slice(&7777u32.to_be_bytes());
        p.extend_from_slice(&5555u32.to_be_bytes());
        p.extend_from_slice(&[1, 3, 3, 7]);
        p
    }

    #[test]
    fn a_synack_gives_the_handshake_and_its_ack() {
        let s = parse(&synack4()).unwrap();
        assert_eq!(s.local, "10.0.0.1:5009".parse().unwrap());
        assert_eq!(s.remote, "10.2.0.100:40000".parse().unwrap());
        assert_eq!((s.isn, s.ack), (0xfffffff0, 1001));
        assert!(s.wscale);
        assert_eq!(s.ts, Some((7777, 5555)));
        let a = ack_of(&s);
        assert_eq!((a.src, a.dst), (s.remote, s.local));
        assert_eq!((a.seq, a.ack), (1001, 0xfffffff1));
        assert_eq!(a.timestamps, Some((5555, 7777)));
        assert!(!a.fin);
        assert_eq!(a.window, 128);
    }

    #[test]
    fn anything_but_a_synack_is_ignored() {
        let mut p = synack4();
        p[20 + 13] = 0x10; // a plain ACK
        assert_eq!(parse(&p), None);
        let mut p = synack4();
        p[9] = 17; // UDP
        assert_eq!(parse(&p), None);
        assert_eq!(parse(&synack4()[..30]), None);
        assert_eq!(parse(&[]), None);
        // Options running past the header are cut, not read.
        let mut p = synack4();
        p.truncate(20 + 20 + 10);
        assert_eq!(parse(&p), None);
        // No options at all: no scaling, no timestamps.
        let mut p = synack4();
        p[20 + 12] = 0x50;
        let s = parse(&p).unwrap();
        assert!(!s.wscale && s.ts.is_none());
        assert_eq!(ack_of(&s).window, 16384);
    }

    #[test]
    fn an_ipv6_synack_is_read_too() {
        let mut p = vec![0x60, 0, 0, 0, 0, 40, 6, 64];
        let src: Ipv6Addr = "fd00:1::1".parse().unwrap();
        let dst: Ipv6Addr = "fd00:2::64".parse().unwrap();
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&synack4()[20..]);
        let s = parse(&p).unwrap();
        assert_eq!(s.local, SocketAddr::new(src.into(), 5009));
        assert_eq!(s.remote, SocketAddr::new(dst.into(), 40000));
    }

    #[test]
    fn recent_keeps_the_last_synack_for_a_while() {
        let r = Recent::default();
        let t0 = Instant::now();
        let p = synack4();
        let s = parse(&p).unwrap();
        r.record(s, &p, t0);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(r.get(s.local, s.remote, later), Some(s));
        assert_eq!(r.get(s.remote, s.local, t0), None);
        assert_eq!(r.get(s.local, s.remote, t0 + KEEP), None);
        // Only a replayed one travels, once.
        assert!(r.take_replayed(s.remote.ip()).is_empty());
        r.mark_replayed(s.local, s.remote);
        let taken = r.take_replayed(s.remote.ip());
        assert_eq!(taken, vec![(s.local, s.remote, p.clone())]);
        assert!(r.take_replayed(s.remote.ip()).is_empty());
    }

    #[test]
    fn the_table_forgets_the_older_half_when_full() {
        let mut g = Generations::default();
        let flow = |i: usize| {
            let a = SocketAddr::from(([10, 0, 0, 1], 80));
            let port = 40000 + (i >> 16) as u16;
            let mh = SocketAddr::from(([10, 2, (i >> 8) as u8, i as u8], port));
            (a, mh)
        };
        for i in 0..CAP {
            g.insert(flow(i), i);
        }
        assert_eq!(g.len(), CAP);
        assert_eq!(g.get(&flow(0)), Some(&0));
        g.insert(flow(CAP), CAP);
        assert_eq!(g.len(), CAP / 2 + 1, "the older half went");
        assert_eq!(g.get(&flow(0)), None);
        assert_eq!(g.get(&flow(CAP / 2)), Some(&(CAP / 2)));
        assert_eq!(g.get(&flow(CAP)), Some(&CAP));
    }

    #[test]
    fn a_moved_in_synack_answers_the_mhs_syn() {
        let r = Recent::default();
        let t0 = Instant::now();
        let p = synack4();
        let s = r.expect(&p, t0).unwrap();
        let mut sent = p.clone();
        assert!(itcp_handoff::packet::fill_checksums(&mut sent));
        assert_eq!(r.again(s.local, s.remote, t0), Some(sent));
        assert_eq!(r.again(s.remote, s.local, t0), None);
        assert_eq!(r.again(s.local, s.remote, t0 + KEEP), None);
        assert!(r.expect(b"not a packet", t0).is_none());
    }

    #[test]
    fn a_syn_is_told_from_a_synack() {
        let mut p = synack4();
        assert_eq!(parse_syn(&p), None);
        p[20 + 13] = 0x02;
        let ends = (
            "10.0.0.1:5009".parse().unwrap(),
            "10.2.0.100:40000".parse().unwrap(),
        );
        assert_eq!(parse_syn(&p), Some(ends));
        assert_eq!(parse(&p), None);
    }
}
