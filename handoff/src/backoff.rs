//! After a handoff, telling the MH's TCP that its retransmissions were lost to the move
//! and not to congestion, so that an upload resumes at once instead of at the MH's next
//! backed-off retransmission timeout.
//!
//! An MH uploading when it loses its cell keeps retransmitting into the blackout, and
//! its TCP doubles the retransmission timeout each time (200 ms, 400 ms, 800 ms, …):
//! after a 0.5–1.5 s gap its next try may be seconds away, long after the new MSR has
//! restored the connection. Duplicate ACKs cannot cut that short (a sender in RTO
//! recovery ignores them, and a SACK sender does not count them). What can is TCP-LD
//! (RFC 6069, Linux since 2.6.36, IPv6 since 5.7): an ICMP "destination unreachable"
//! (IPv4 host unreachable; IPv6 no route) that quotes the segment at the sender's
//! `snd_una`, arriving while its retransmission timer is backed off, undoes one
//! doubling; when the undone timeout has already run out the sender retransmits at
//! once. The router of a connectivity disruption is exactly what RFC 6069 expects such
//! messages from; the new MSR sends one per doubling the MH may have taken, right after
//! the connection runs again (so the retransmission meets a live socket).
//!
//! An MH that is not backing off ignores them (the revert needs a pending
//! retransmission of exactly that sequence number), as does one whose retransmission
//! got through meanwhile (its `snd_una` moved on). For TCP they are soft errors: the
//! connection is not affected unless it times out later, when the error it reports is
//! "no route to host" instead of "timed out". An application that sets IP_RECVERR on
//! a TCP socket (rare) would see the error reported once; `[handoff] revert_backoff =
//! false` turns them off.
//!
//! Pure code: the rule for how many to send and the packet bytes; msrd sends them.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use itcp_wire::checksum::{self, internet};
use itcp_wire::{ipv4, ipv6, tcp};

/// IP protocol numbers.
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

/// The smallest retransmission timeout a sender may use (Linux's `TCP_RTO_MIN`; RFC
/// 6298 asks for 1 s, which only makes fewer doublings in the same time).
const MIN_RTO: Duration = Duration::from_millis(200);

/// Never more than this many per connection: 8 doublings of 200 ms is 51 s.
pub const MAX_REVERTS: u32 = 8;

/// How long the MH may have been silent and still be asked to retransmit: beyond it a
/// connection is more likely idle than backing off, and not worth the packets.
pub const MAX_SILENCE: Duration = Duration::from_secs(10);

/// How many ICMP unreachables to send for a connection whose MH has sent nothing for
/// `silent` (since the old MSR last received data from it): one per doubling its
/// retransmission timeout may have taken meanwhile. A sender that starts at the
/// minimum timeout `r` has doubled it `b` times once `r·(2^b − 1)` has passed; one more
/// for the doubling in flight. Zero when it cannot have timed out yet, or has been
/// silent too long ([`MAX_SILENCE`]) for an upload to be likely.
pub fn reverts(silent: Duration) -> u32 {
    if silent < MIN_RTO || silent > MAX_SILENCE {
        return 0;
    }
    // Doublings b with r·(2^b − 1) ≤ silent, in whole milliseconds.
    let (t, r) = (silent.as_millis(), MIN_RTO.as_millis());
    let mut b = 0;
    while b < MAX_REVERTS && r * ((1u128 << (b + 1)) - 1) <= t {
        b += 1;
    }
    (b + 1).min(MAX_REVERTS)
}

/// The ICMP "destination unreachable" that `router` sends to the MH about the MH's
/// segment `mh` → `peer` with sequence number `seq`: IPv4 type 3 code 1 (host
/// unreachable) or ICMPv6 type 1 code 0 (no route), each of which Linux takes for a
/// TCP-LD revert. The quoted segment is a bare ACK header (RFC 792 needs the IP header
/// and 8 bytes: the ports and the sequence number). A whole IP packet, checksums
/// filled in, for a raw socket that includes the IP header. None when the addresses
/// are not all of one family.
pub fn unreachable(router: IpAddr, mh: SocketAddr, peer: SocketAddr, seq: u32) -> Option<Vec<u8>> {
    let mut tcp = Vec::with_capacity(20);
    tcp.extend_from_slice(&mh.port().to_be_bytes());
    tcp.extend_from_slice(&peer.port().to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 0]); // ack
    tcp.extend_from_slice(&[5 << 4, 0x10, 0, 0, 0, 0, 0, 0]); // offset, ACK, window, csum, urg
    match (router, mh.ip(), peer.ip()) {
        (IpAddr::V4(r), IpAddr::V4(m), IpAddr::V4(p)) => {
            let quoted = ipv4::header(m, p, tcp::PROTOCOL, tcp.len(), false).ok()?;
            let mut icmp = vec![3, 1, 0, 0, 0, 0, 0, 0];
            icmp.extend_from_slice(&quoted);
            icmp.extend_from_slice(&tcp);
            let c = internet(&icmp);
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut out = ipv4::header(r, m, ICMP, icmp.len(), false).ok()?.to_vec();
            out.extend_from_slice(&icmp);
            Some(out)
        }
        (IpAddr::V6(r), IpAddr::V6(m), IpAddr::V6(p)) => {
            let quoted = ipv6::header(m, p, tcp::PROTOCOL, tcp.len()).ok()?;
            let mut icmp = vec![1, 0, 0, 0, 0, 0, 0, 0];
            icmp.extend_from_slice(&quoted);
            icmp.extend_from_slice(&tcp);
            // ICMPv6 checksums cover a pseudo-header (RFC 4443 §2.3).
            let acc = checksum::pseudo_header(r.into(), m.into(), ICMPV6, icmp.len() as u32);
            let c = checksum::fold(checksum::sum(acc, &icmp));
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut out = ipv6::header(r, m, ICMPV6, icmp.len()).ok()?.to_vec();
            out.extend_from_slice(&icmp);
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn one_revert_per_doubling_the_silence_allows() {
        assert_eq!(reverts(ms(0)), 0);
        assert_eq!(reverts(ms(199)), 0, "no timeout can have fired yet");
        // Timeouts at 0.2, 0.6, 1.4, 3.0 s: b doublings by then, one more in flight.
        assert_eq!(reverts(ms(200)), 2);
        assert_eq!(reverts(ms(599)), 2);
        assert_eq!(reverts(ms(600)), 3);
        assert_eq!(reverts(ms(1400)), 4);
        assert_eq!(reverts(ms(3000)), 5);
        assert_eq!(reverts(MAX_SILENCE), 6);
        assert_eq!(
            reverts(MAX_SILENCE + ms(1)),
            0,
            "more likely idle than backing off"
        );
        for t in (0..10_000).step_by(7) {
            assert!(reverts(ms(t)) <= MAX_REVERTS);
        }
    }

    #[test]
    fn ipv4_unreachable_quotes_the_mhs_segment() {
        let p = unreachable(
            "10.2.0.1".parse().unwrap(),
            "10.2.0.100:40000".parse().unwrap(),
            "10.0.0.1:5001".parse().unwrap(),
            0xdead_beef,
        )
        .unwrap();
        assert_eq!(p.len(), 20 + 8 + 20 + 20);
        assert_eq!(internet(&p[..20]), 0, "outer IP header checksum");
        assert_eq!(p[9], 1, "ICMP");
        assert_eq!(&p[12..16], &[10, 2, 0, 1], "from the router");
        assert_eq!(&p[16..20], &[10, 2, 0, 100], "to the MH");
        let icmp = &p[20..];
        assert_eq!((icmp[0], icmp[1]), (3, 1), "host unreachable");
        assert_eq!(internet(icmp), 0, "ICMP checksum");
        let quoted = &icmp[8..];
        assert_eq!(internet(&quoted[..20]), 0, "quoted IP header checksum");
        assert_eq!(quoted[9], 6, "quotes TCP");
        assert_eq!(&quoted[12..16], &[10, 2, 0, 100], "the MH's segment");
        assert_eq!(&quoted[16..20], &[10, 0, 0, 1]);
        let tcp = &quoted[20..];
        assert_eq!(u16::from_be_bytes([tcp[0], tcp[1]]), 40000);
        assert_eq!(u16::from_be_bytes([tcp[2], tcp[3]]), 5001);
        assert_eq!(&tcp[4..8], &0xdead_beefu32.to_be_bytes());
    }

    #[test]
    fn ipv6_unreachable_checksums_over_its_pseudo_header() {
        let (r, m): (IpAddr, SocketAddr) = (
            "fd02::1".parse().unwrap(),
            "[fd02::64]:40000".parse().unwrap(),
        );
        let p = unreachable(r, m, "[fd00::1]:5001".parse().unwrap(), 7).unwrap();
        assert_eq!(p.len(), 40 + 8 + 40 + 20);
        assert_eq!(p[0] >> 4, 6);
        assert_eq!(p[6], 58, "ICMPv6");
        assert_eq!(usize::from(u16::from_be_bytes([p[4], p[5]])), p.len() - 40);
        let icmp = &p[40..];
        assert_eq!((icmp[0], icmp[1]), (1, 0), "no route to destination");
        let mut pseudo = p[8..40].to_vec();
        pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 58]);
        pseudo.extend_from_slice(icmp);
        assert_eq!(internet(&pseudo), 0, "ICMPv6 checksum");
        let quoted = &icmp[8..];
        assert_eq!(quoted[6], 6, "quotes TCP");
        assert_eq!(&quoted[40 + 4..40 + 8], &7u32.to_be_bytes());
    }

    #[test]
    fn mixed_families_make_no_packet() {
        assert!(unreachable(
            "10.2.0.1".parse().unwrap(),
            "[fd02::64]:1".parse().unwrap(),
            "[fd00::1]:2".parse().unwrap(),
            0
        )
        .is_none());
    }
}
