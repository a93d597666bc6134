//! An IPv4 or IPv6 packet, whichever the version nibble names, and the TCP segment one
//! carries.

use core::ops::Range;
use std::net::IpAddr;

use crate::{tcp, Error, Ipv4Packet, Ipv6Packet, Result, TcpSegment};

/// An IPv4 or IPv6 packet in a byte buffer.
#[derive(Debug, Clone)]
pub enum IpPacket<T> {
    V4(Ipv4Packet<T>),
    V6(Ipv6Packet<T>),
}

impl<T: AsRef<[u8]>> IpPacket<T> {
    /// A whole packet ([`Ipv4Packet::new_checked`], [`Ipv6Packet::new_checked`]).
    pub fn new_checked(buffer: T) -> Result<Self> {
        match version(&buffer)? {
            4 => Ipv4Packet::new_checked(buffer).map(IpPacket::V4),
            _ => Ipv6Packet::new_checked(buffer).map(IpPacket::V6),
        }
    }

    /// A packet's head ([`Ipv4Packet::new_head`], [`Ipv6Packet::new_head`]).
    pub fn new_head(buffer: T) -> Result<Self> {
        match version(&buffer)? {
            4 => Ipv4Packet::new_head(buffer).map(IpPacket::V4),
            _ => Ipv6Packet::new_head(buffer).map(IpPacket::V6),
        }
    }

    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpPacket::V4(p) => p.src_addr().into(),
            IpPacket::V6(p) => p.src_addr().into(),
        }
    }

    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpPacket::V4(p) => p.dst_addr().into(),
            IpPacket::V6(p) => p.dst_addr().into(),
        }
    }

    /// The payload's protocol (IPv6: the next header).
    pub fn protocol(&self) -> u8 {
        match self {
            IpPacket::V4(p) => p.protocol(),
            IpPacket::V6(p) => p.next_header(),
        }
    }

    /// Whether this is a fragment (IPv4's MF flag or offset; IPv6 fragment headers
    /// are not looked for).
    pub fn is_fragment(&self) -> bool {
        match self {
            IpPacket::V4(p) => p.more_frags() || p.frag_offset() != 0,
            IpPacket::V6(_) => false,
        }
    }

    /// Whether the payload starts here: not a fragment other than the first (only the
    /// first carries the upper-layer header).
    pub fn starts_payload(&self) -> bool {
        match self {
            IpPacket::V4(p) => p.frag_offset() == 0,
            IpPacket::V6(_) => true,
        }
    }

    /// The payload's length as the header gives it (a head may hold less of it).
    pub fn payload_len(&self) -> usize {
        match self {
            IpPacket::V4(p) => p.payload_len(),
            IpPacket::V6(p) => p.payload_len(),
        }
    }

    /// The payload in the buffer.
    pub fn payload(&self) -> &[u8] {
        match self {
            IpPacket::V4(p) => p.payload(),
            IpPacket::V6(p) => p.payload(),
        }
    }

    fn payload_range(&self) -> Range<usize> {
        match self {
            IpPacket::V4(p) => p.payload_range(),
            IpPacket::V6(p) => p.payload_range(),
        }
    }
}

impl<'a> IpPacket<&'a [u8]> {
    /// The payload, borrowed from the buffer rather than the view.
    pub fn into_payload(self) -> &'a [u8] {
        let r = self.payload_range();
        match self {
            IpPacket::V4(p) => &p.into_inner()[r],
            IpPacket::V6(p) => &p.into_inner()[r],
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IpPacket<T> {
    /// The payload in the buffer, to rewrite.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        match self {
            IpPacket::V4(p) => p.payload_mut(),
            IpPacket::V6(p) => p.payload_mut(),
        }
    }

    /// Computes the header checksum anew (IPv6 has none).
    pub fn fill_checksum(&mut self) {
        if let IpPacket::V4(p) = self {
            p.fill_checksum();
        }
    }
}

fn version(buffer: &impl AsRef<[u8]>) -> Result<u8> {
    match buffer.as_ref().first().map(|b| b >> 4) {
        None => Err(Error::Truncated),
        Some(v @ (4 | 6)) => Ok(v),
        Some(_) => Err(Error::Malformed),
    }
}

/// The octets of `a` as an IPv6 header carries them: an IPv4 address mapped
/// (`::ffff:a.b.c.d`).
pub fn ipv6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A packet's IP head and the TCP head it carries.
pub type TcpHead<'a> = (IpPacket<&'a [u8]>, TcpSegment<&'a [u8]>);

/// The IP head (as a capture cut it) and TCP head of a packet carrying TCP: not a
/// later fragment, TCP right after the IP header (IPv6: no extension headers). The
/// TCP header's options and the data may be cut.
pub fn tcp_in_head(buffer: &[u8]) -> Result<TcpHead<'_>> {
    let ip = IpPacket::new_head(buffer)?;
    if ip.protocol() != tcp::PROTOCOL || !ip.starts_payload() {
        return Err(Error::Malformed);
    }
    let segment = TcpSegment::new_head(&buffer[ip.payload_range()])?;
    Ok((ip, segment))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10.0.0.1:40000 → 10.0.0.2:80, an ACK with `data` bytes of data.
    fn segment4(data: usize) -> Vec<u8> {
        let total = 40 + data;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = tcp::ACK;
        p
    }

    fn segment6(data: usize) -> Vec<u8> {
        let v4 = segment4(data);
        let mut p = vec![0x60, 0, 0, 0];
        p.extend_from_slice(&((20 + data) as u16).to_be_bytes());
        p.extend_from_slice(&[6, 64]);
        p.extend_from_slice(&"fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&v4[20..]);
        p
    }

    #[test]
    fn either_version_by_its_nibble() {
        let p4 = segment4(3);
        let v = IpPacket::new_checked(&p4[..]).unwrap();
        assert!(matches!(v, IpPacket::V4(_)));
        assert_eq!(
            (v.src_addr(), v.protocol(), v.payload_len()),
            ("10.0.0.1".parse().unwrap(), 6, 23)
        );
        let p6 = segment6(3);
        let v = IpPacket::new_checked(&p6[..]).unwrap();
        assert_eq!(
            (v.dst_addr(), v.payload().len()),
            ("fd00::2".parse().unwrap(), 23)
        );
        assert!(!v.is_fragment() && v.starts_payload());
        assert_eq!(IpPacket::new_head(&[][..]).err(), Some(Error::Truncated));
        assert_eq!(
            IpPacket::new_head(&[0x55; 60][..]).err(),
            Some(Error::Malformed)
        );
    }

    #[test]
    fn tcp_of_a_head_in_either_version() {
        for p in [segment4(100), segment6(100)] {
            let cut = &p[..p.len() - 90];
            let (ip, tcp) = tcp_in_head(cut).unwrap();
            assert_eq!((tcp.src_port(), tcp.dst_port()), (40000, 80));
            assert_eq!(ip.payload_len(), 120);
            assert!(tcp_in_head(&p[..p.len() - 101]).is_err(), "TCP header cut");
        }
    }

    #[test]
    fn no_tcp_in_later_fragments_or_other_protocols() {
        let mut p = segment4(0);
        p[6] = 0x20; // MF: the first fragment has the header
        let v = IpPacket::new_checked(&p[..]).unwrap();
        assert!(v.is_fragment() && v.starts_payload());
        assert!(tcp_in_head(&p).is_ok());
        p[7] = 1;
        assert!(!IpPacket::new_checked(&p[..]).unwrap().starts_payload());
        assert_eq!(tcp_in_head(&p).err(), Some(Error::Malformed));
        let mut u = segment6(0);
        u[6] = 17;
        assert_eq!(tcp_in_head(&u).err(), Some(Error::Malformed));
    }

    #[test]
    fn rewriting_through_either_version() {
        let mut p = segment4(0);
        let mut v = IpPacket::new_checked(&mut p[..]).unwrap();
        v.payload_mut()[0] = 0;
        v.fill_checksum();
        assert_eq!(crate::checksum::internet(&p[..20]), 0);
        assert_eq!(p[20], 0);
    }
}
