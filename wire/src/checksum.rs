//! The Internet checksum (RFC 1071) and the pseudo-header sums TCP and ICMPv6 add.

use std::net::IpAddr;

use crate::ip::ipv6_octets as v6_octets;

/// Adds `bytes` as 16-bit big-endian words to `acc` (an odd tail padded with zero).
pub fn sum(acc: u32, bytes: &[u8]) -> u32 {
    // In 64 bits: no buffer is long enough to overflow it, as 32 bits would past 128 KiB.
    let mut wide = u64::from(acc);
    let mut words = bytes.chunks_exact(2);
    for w in &mut words {
        wide += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        wide += u64::from(*last) << 8;
    }
    while wide > 0xffff {
        wide = (wide & 0xffff) + (wide >> 16);
    }
    wide as u32
}

fn fold_carries(mut acc: u32) -> u32 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

/// The one's complement of a sum: the value a checksum field takes.
pub fn fold(acc: u32) -> u16 {
    !(fold_carries(acc) as u16)
}

/// The Internet checksum of `bytes`.
pub fn internet(bytes: &[u8]) -> u16 {
    fold(sum(0, bytes))
}

/// The sum of the pseudo-header of an upper-layer packet of `len` bytes and protocol
/// `proto` from `src` to `dst`: IPv4's (RFC 793) when both are IPv4, else IPv6's
/// (RFC 8200 §8.1), an IPv4 address mapped (`::ffff:a.b.c.d`) as an IPv6 packet
/// carrying it would.
pub fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: u32) -> u32 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let acc = sum(sum(0, &s.octets()), &d.octets());
            acc + u32::from(proto) + len
        }
        (s, d) => {
            let acc = sum(sum(0, &v6_octets(s)), &v6_octets(d));
            acc + (len >> 16) + (len & 0xffff) + u32::from(proto)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_known_header() {
        // A classic IPv4 header whose checksum is 0xb861.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(internet(&h), 0xb861);
    }

    #[test]
    fn an_odd_tail_is_padded_and_long_buffers_do_not_overflow() {
        assert_eq!(internet(&[0x12]), !0x1200);
        assert_eq!(internet(&[0x12, 0x00]), internet(&[0x12]));
        assert_eq!(internet(&vec![0xff; 1 << 20]), 0);
    }

    #[test]
    fn mixed_families_sum_as_ipv6() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(
            pseudo_header(v4, v6, 6, 20),
            pseudo_header(mapped, v6, 6, 20)
        );
    }
}
