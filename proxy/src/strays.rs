//! The flows of each MH that closed here lately. Their TIME_WAIT and closing states
//! stay in this MSR's kernel, so after a handoff their stray segments (a retransmitted
//! FIN, a last ACK) reach the new MSR, which would answer them with RST (or forward
//! them to a host that does). The old MSR hands these flows over with the images and
//! the new MSR drops their segments silently for what is left of the window.
//!
//! All but a FIN: a TIME_WAIT socket answers a retransmitted FIN with an ACK, and one
//! is retransmitted when that ACK was lost, often on the air as the MH left the cell.
//! Dropped at the new MSR, the MH's FIN would go unanswered until the window ended and
//! an RST answered it. The rules report those FINs and msrd answers each with the ACK
//! the TIME_WAIT socket would send ([`time_wait_ack`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use itcp_handoff::packet::Segment;
use itcp_proto::channel::ClosedFlow;
use itcp_wire::tcp::{ACK, FIN, RST, SYN};
use itcp_wire::tcp_in_head;

use crate::handshakes::tcp_options;

/// Flows kept per MH at most (the oldest go first).
const PER_MH: usize = 4096;

/// When a flow closed, the MH's end, the other end.
type Closed = (Instant, SocketAddr, SocketAddr);

#[derive(Default)]
pub struct Strays {
    map: Mutex<HashMap<IpAddr, VecDeque<Closed>>>,
    /// Records since the last sweep of MHs gone quiet.
    since_prune: std::sync::atomic::AtomicU64,
}

impl Strays {
    /// Records flows of `mh` that just closed: each the MH's end and the other end.
    pub fn closed(&self, mh: IpAddr, flows: &[(SocketAddr, SocketAddr)], window: Duration) {
        if window.is_zero() || flows.is_empty() {
            return;
        }
        use std::sync::atomic::Ordering;
        if self.since_prune.fetch_add(1, Ordering::Relaxed) >= 4096 {
            self.since_prune.store(0, Ordering::Relaxed);
            self.prune(window);
        }
        let now = Instant::now();
        let mut m = self.map.lock().unwrap();
        let q = m.entry(mh).or_default();
        while q
            .front()
            .is_some_and(|(t, ..)| now.duration_since(*t) > window)
        {
            q.pop_front();
        }
        for &(a, z) in flows {
            if q.len() >= PER_MH {
                q.pop_front();
            }
            q.push_back((now, a, z));
        }
    }

    /// Keeps flows of `mh` that closed at another MSR (received with its images, less
    /// those of live connections: see [`to_drop`]), each as old as it was there: they
    /// go on with the MH's next handoff while their window lasts, so the MSR after
    /// this one drops their strays too (the first MSR's socket may still re-send its
    /// FIN, and the FH's answer goes wherever the MH is).
    pub fn adopt(&self, mh: IpAddr, flows: &[ClosedFlow], window: Duration) {
        let now = Instant::now();
        let mut m = self.map.lock().unwrap();
        let q = m.entry(mh).or_default();
        for f in flows
            .iter()
            .filter(|f| f.age_ms < window.as_millis() as u64)
        {
            let Some(t) = now.checked_sub(Duration::from_millis(f.age_ms)) else {
                continue;
            };
            if !q.iter().any(|&(_, a, z)| (a, z) == (f.mh, f.peer)) {
                q.push_back((t, f.mh, f.peer));
            }
        }
        // Oldest first, as `closed` keeps them; the oldest go when the share is full.
        q.make_contiguous().sort_by_key(|&(t, ..)| t);
        while q.len() > PER_MH {
            q.pop_front();
        }
    }

    /// Takes the flows of `mh` still within `window` (the MH is leaving).
    pub fn take(&self, mh: IpAddr, window: Duration) -> Vec<ClosedFlow> {
        let now = Instant::now();
        let q = self.map.lock().unwrap().remove(&mh).unwrap_or_default();
        q.into_iter()
            .map(|(t, mh, peer)| (now.duration_since(t), mh, peer))
            .filter(|(age, ..)| *age < window)
            .map(|(age, mh, peer)| ClosedFlow {
                mh,
                peer,
                age_ms: age.as_millis() as u64,
            })
            .collect()
    }

    /// Drops the records of MHs with nothing recent (called now and then).
    pub fn prune(&self, window: Duration) {
        let now = Instant::now();
        self.map.lock().unwrap().retain(|_, q| {
            q.back()
                .is_some_and(|(t, ..)| now.duration_since(*t) < window)
        });
    }
}

/// Of the closed flows received with an MH's images, those the new MSR drops, each
/// once with the rest of its window. Not the flows of `live` connections (restored
/// here, or opened here meanwhile): the MH's kernel reuses ports, and a new
/// connection on a closed one's 4-tuple would lose its own segments (soak, seed 29).
pub fn to_drop(
    flows: &[ClosedFlow],
    window: Duration,
    live: &HashSet<(SocketAddr, SocketAddr)>,
) -> Vec<ClosedFlow> {
    let mut youngest: HashMap<(SocketAddr, SocketAddr), u64> = HashMap::new();
    for f in flows.iter().filter(|f| !live.contains(&(f.mh, f.peer))) {
        if Duration::from_millis(f.age_ms) < window {
            let age = youngest.entry((f.mh, f.peer)).or_insert(f.age_ms);
            *age = (*age).min(f.age_ms);
        }
    }
    let mut v: Vec<_> = youngest
        .into_iter()
        .map(|((mh, peer), age_ms)| ClosedFlow { mh, peer, age_ms })
        .collect();
    v.sort_by_key(|f| std::cmp::Reverse(f.age_ms));
    v
}

/// For the nftables set: each flow with what is left of its window.
pub fn timed(flows: &[ClosedFlow], window: Duration) -> Vec<(SocketAddr, SocketAddr, Duration)> {
    flows
        .iter()
        .filter_map(|f| {
            let left = window.checked_sub(Duration::from_millis(f.age_ms))?;
            (!left.is_zero()).then_some((f.mh, f.peer, left))
        })
        .collect()
}

/// The answer of a TIME_WAIT socket to `p`, a retransmitted FIN of a flow that closed
/// (an IPv4 or IPv6 packet, its headers at least): an ACK from the flow's other end
/// that acknowledges the FIN, its sequence number the one `p` acknowledges (our FIN's
/// end), its timestamps `p`'s echoed back (our TSval: the last one `p`'s sender saw
/// from us, so PAWS passes). `None` for anything else.
pub fn time_wait_ack(p: &[u8]) -> Option<Segment> {
    let (ip, seg) = tcp_in_head(p).ok()?;
    if seg.flags() & (FIN | SYN | RST | ACK) != FIN | ACK {
        return None;
    }
    // The segment's data (a FIN may carry some): from the IP header, not the copy.
    let data = ip.payload_len().checked_sub(seg.header_len())?;
    let (_, ts) = tcp_options(&seg)?;
    Some(Segment {
        src: SocketAddr::new(ip.dst_addr(), seg.dst_port()),
        dst: SocketAddr::new(ip.src_addr(), seg.src_port()),
        seq: seg.ack_number(),
        ack: seg.seq_number().wrapping_add(data as u32).wrapping_add(1),
        // What a closed connection's last ACK offers matters little; not zero, which
        // would read as a window closed on the peer.
        window: 1024,
        fin: false,
        timestamps: ts.map(|(tsval, tsecr)| (tsecr, tsval)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MH's FIN|ACK (10.2.0.100:40000 → 10.0.0.1:80, seq 1000, ack 5000, 3 bytes
    /// of data), with timestamps (TSval 77, TSecr 99) unless `ts` is false.
    fn fin4(ts: bool, flags: u8) -> Vec<u8> {
        let opts: &[u8] = if ts {
            &[1, 1, 8, 10, 0, 0, 0, 77, 0, 0, 0, 99]
        } else {
            &[]
        };
        let hlen = 20 + opts.len();
        let total = 20 + hlen + 3;
        let mut p = vec![0x45, 0];
        p.extend_from_slice(&(total as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0, 10, 2, 0, 100, 10, 0, 0, 1]);
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&80u16.to_be_bytes());
        p.extend_from_slice(&1000u32.to_be_bytes());
        p.extend_from_slice(&5000u32.to_be_bytes());
        p.push(((hlen / 4) as u8) << 4);
        p.push(flags);
        p.extend_from_slice(&[0, 100, 0, 0, 0, 0]);
        p.extend_from_slice(opts);
        p.extend_from_slice(b"bye");
        p
    }

    #[test]
    fn a_stray_fin_gets_the_ack_a_time_wait_socket_sends() {
        let a = time_wait_ack(&fin4(true, 0x11)).expect("a FIN|ACK");
        assert_eq!(a.src, "10.0.0.1:80".parse::<SocketAddr>().unwrap());
        assert_eq!(a.dst, "10.2.0.100:40000".parse::<SocketAddr>().unwrap());
        assert_eq!((a.seq, a.ack), (5000, 1000 + 3 + 1));
        assert_eq!(a.timestamps, Some((99, 77)));
        assert!(!a.fin && a.window > 0);
        assert_eq!(time_wait_ack(&fin4(false, 0x19)).unwrap().timestamps, None);
        // Not a FIN, a FIN without ACK, a SYN or RST with it, a header cut short.
        for flags in [0x10, 0x01, 0x13, 0x15] {
            assert_eq!(time_wait_ack(&fin4(true, flags)), None, "flags {flags:#x}");
        }
        assert_eq!(time_wait_ack(&fin4(true, 0x11)[..30]), None);
    }

    #[test]
    fn flows_are_kept_per_mh_within_the_window() {
        let s = Strays::default();
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let a: SocketAddr = "10.2.0.100:40000".parse().unwrap();
        let z: SocketAddr = "10.0.0.1:80".parse().unwrap();
        s.closed(mh, &[(a, z)], Duration::from_secs(60));
        s.closed(mh, &[(a, z)], Duration::ZERO);
        let got = s.take(mh, Duration::from_secs(60));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].mh, got[0].peer), (a, z));
        assert!(s.take(mh, Duration::from_secs(60)).is_empty(), "taken");
        let d = timed(&got, Duration::from_secs(60));
        assert!(d[0].2 <= Duration::from_secs(60) && d[0].2 > Duration::from_secs(59));
        let old = ClosedFlow {
            mh: a,
            peer: z,
            age_ms: 61_000,
        };
        assert!(to_drop(&[old], Duration::from_secs(60), &HashSet::new()).is_empty());
    }

    #[test]
    fn flows_of_live_connections_are_not_dropped_and_each_is_dropped_once() {
        let z: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let a: SocketAddr = "10.2.0.100:40000".parse().unwrap();
        let b: SocketAddr = "10.2.0.100:40001".parse().unwrap();
        let came = |p, age_ms| ClosedFlow {
            mh: p,
            peer: z,
            age_ms,
        };
        // `a` closed twice (its port reused), `b` closed and reused by a live one.
        let flows = [came(a, 30_000), came(b, 5_000), came(a, 2_000)];
        let live = HashSet::from([(b, z)]);
        let d = to_drop(&flows, Duration::from_secs(60), &live);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            (d[0].mh, d[0].age_ms),
            (a, 2_000),
            "the youngest close counts"
        );
    }

    #[test]
    fn adopted_flows_go_on_with_their_age() {
        let s = Strays::default();
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let a: SocketAddr = "10.2.0.100:40000".parse().unwrap();
        let b: SocketAddr = "10.2.0.100:40001".parse().unwrap();
        let z: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let w = Duration::from_secs(60);
        s.closed(mh, &[(b, z)], w);
        let came = |p, age_ms| ClosedFlow {
            mh: p,
            peer: z,
            age_ms,
        };
        // One closed 10 s ago elsewhere, one past the window, one twice.
        s.adopt(mh, &[came(a, 10_000), came(a, 10_000), came(b, 61_000)], w);
        let got = s.take(mh, w);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].mh, a, "oldest first");
        assert!((10_000..11_000).contains(&got[0].age_ms), "{got:?}");
        assert_eq!(got[1].mh, b);
    }

    #[test]
    fn an_mh_keeps_at_most_its_share() {
        let s = Strays::default();
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let z: SocketAddr = "10.0.0.1:80".parse().unwrap();
        for p in 0..(PER_MH as u16 + 10) {
            s.closed(mh, &[(SocketAddr::new(mh, p), z)], Duration::from_secs(60));
        }
        let got = s.take(mh, Duration::from_secs(60));
        assert_eq!(got.len(), PER_MH);
        assert_eq!(got[0].mh.port(), 10, "the oldest went first");
    }
}
