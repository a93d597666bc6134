//! IPv6 packets (RFC 8200). Extension headers are not walked: no caller meets them
//! (the kernel sends none on the segments msrd reads, nor does an MH's stack), so the
//! next header is the payload's protocol or nothing msrd reads.

use core::ops::Range;
use std::net::Ipv6Addr;

use crate::{be16, Error, Result};

/// Where each field is: the fixed header.
mod field {
    use core::ops::Range;
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Range<usize> = 8..24;
    pub const DST_ADDR: Range<usize> = 24..40;
}

/// The fixed header's length.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

/// An IPv6 packet in a byte buffer.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// A whole packet: version 6, the fixed header and the payload length within the
    /// buffer (bytes past it are no part of the packet).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_head(buffer)?;
        if HEADER_LEN + p.payload_len() > p.buffer.as_ref().len() {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    /// A packet's head, as a capture cut it: the fixed header, the payload possibly
    /// short of what the payload length says.
    pub fn new_head(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[field::VER_TC_FLOW] >> 4 != 6 {
            return Err(Error::Malformed);
        }
        Ok(Ipv6Packet { buffer })
    }

    /// The payload's length as the header gives it (a head may hold less of it).
    pub fn payload_len(&self) -> usize {
        usize::from(be16(self.buffer.as_ref(), field::PAYLOAD_LEN.start))
    }

    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NXT_HDR]
    }

    pub fn src_addr(&self) -> Ipv6Addr {
        addr(&self.buffer.as_ref()[field::SRC_ADDR])
    }

    pub fn dst_addr(&self) -> Ipv6Addr {
        addr(&self.buffer.as_ref()[field::DST_ADDR])
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The payload in the buffer: up to the payload length, or to the end of a cut head.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.payload_range()]
    }

    pub(crate) fn payload_range(&self) -> Range<usize> {
        let end = (HEADER_LEN + self.payload_len()).min(self.buffer.as_ref().len());
        HEADER_LEN..end
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// The payload in the buffer, to rewrite ([`Self::payload`]).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let r = self.payload_range();
        &mut self.buffer.as_mut()[r]
    }
}

/// The fixed header of a packet from `src` to `dst` carrying `payload_len` bytes of
/// `next_header`: traffic class and flow label 0, hop limit 64. Malformed if the
/// payload is longer than 65535 bytes (jumbograms are not written).
pub fn header(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next_header: u8,
    payload_len: usize,
) -> Result<[u8; HEADER_LEN]> {
    let len = u16::try_from(payload_len).map_err(|_| Error::Malformed)?;
    let mut h = [0u8; HEADER_LEN];
    h[field::VER_TC_FLOW] = 0x60;
    h[field::PAYLOAD_LEN].copy_from_slice(&len.to_be_bytes());
    h[field::NXT_HDR] = next_header;
    h[field::HOP_LIMIT] = 64;
    h[field::SRC_ADDR].copy_from_slice(&src.octets());
    h[field::DST_ADDR].copy_from_slice(&dst.octets());
    Ok(h)
}

fn addr(b: &[u8]) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a.copy_from_slice(b);
    Ipv6Addr::from(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fd00::1 → fd00::2, TCP, 8 bytes of payload.
    fn packet() -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 8, 6, 64];
        p.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(b"payload!");
        p
    }

    #[test]
    fn fields_of_a_packet() {
        let p = packet();
        let v = Ipv6Packet::new_checked(&p[..]).unwrap();
        assert_eq!(v.next_header(), 6);
        assert_eq!(v.src_addr(), "fd00::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(v.dst_addr(), "fd00::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!((v.payload(), v.payload_len()), (&b"payload!"[..], 8));
    }

    #[test]
    fn short_and_inconsistent_packets_are_refused() {
        let p = packet();
        for n in 0..40 {
            assert_eq!(Ipv6Packet::new_head(&p[..n]).err(), Some(Error::Truncated));
        }
        let mut v4 = p.clone();
        v4[0] = 0x45;
        assert_eq!(Ipv6Packet::new_head(&v4[..]).err(), Some(Error::Malformed));
        let mut long = p.clone();
        long[5] = 9;
        assert_eq!(
            Ipv6Packet::new_checked(&long[..]).err(),
            Some(Error::Truncated)
        );
    }

    #[test]
    fn a_header_written_reads_back() {
        let (s, d) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let mut p = header(s, d, 6, 8).unwrap().to_vec();
        p.extend_from_slice(b"payload!");
        assert_eq!(p, packet());
        assert_eq!(header(s, d, 6, 65536).err(), Some(Error::Malformed));
    }

    #[test]
    fn a_head_may_be_cut_and_a_whole_packet_padded() {
        let p = packet();
        let head = Ipv6Packet::new_head(&p[..42]).unwrap();
        assert_eq!((head.payload(), head.payload_len()), (&b"pa"[..], 8));
        assert!(Ipv6Packet::new_checked(&p[..42]).is_err());
        let mut padded = p.clone();
        padded.extend_from_slice(&[0; 6]);
        let mut v = Ipv6Packet::new_checked(&mut padded[..]).unwrap();
        assert_eq!(v.payload_mut(), b"payload!");
    }
}
