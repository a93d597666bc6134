//! IPv4 packets (RFC 791).

use core::ops::Range;
use std::net::Ipv4Addr;

use crate::{be16, checksum, Error, Result};

/// Where each field is: the fixed header.
mod field {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const LENGTH: Range<usize> = 2..4;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC_ADDR: Range<usize> = 12..16;
    pub const DST_ADDR: Range<usize> = 16..20;
}

/// The fixed header's length.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

const DONT_FRAG: u16 = 0x4000;
const MORE_FRAGS: u16 = 0x2000;
const FRAG_OFFSET: u16 = 0x1fff;

/// An IPv4 packet in a byte buffer.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// A whole packet: version 4, a header of at least 5 words in the buffer, the total
    /// length at least the header's and at most the buffer's (bytes past it, such as
    /// Ethernet padding, are no part of the packet).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_head(buffer)?;
        if usize::from(p.total_len()) > p.buffer.as_ref().len() {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    /// A packet's head, as a capture cut it: the header checked as for
    /// [`Self::new_checked`], the payload possibly short of what the total length says.
    pub fn new_head(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[field::VER_IHL] >> 4 != 4 {
            return Err(Error::Malformed);
        }
        let p = Ipv4Packet { buffer };
        let hlen = p.header_len();
        if hlen < HEADER_LEN || usize::from(p.total_len()) < hlen {
            return Err(Error::Malformed);
        }
        if p.buffer.as_ref().len() < hlen {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    /// The header's length in bytes, options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// The packet's length as its header gives it.
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Whether more fragments follow.
    pub fn more_frags(&self) -> bool {
        be16(self.buffer.as_ref(), field::FLG_OFF.start) & MORE_FRAGS != 0
    }

    /// The fragment's offset, in 8-byte units (0: the first fragment, or no fragment).
    pub fn frag_offset(&self) -> u16 {
        be16(self.buffer.as_ref(), field::FLG_OFF.start) & FRAG_OFFSET
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    pub fn src_addr(&self) -> Ipv4Addr {
        addr(&self.buffer.as_ref()[field::SRC_ADDR])
    }

    pub fn dst_addr(&self) -> Ipv4Addr {
        addr(&self.buffer.as_ref()[field::DST_ADDR])
    }

    /// The payload's length as the header gives it (a head may hold less of it).
    pub fn payload_len(&self) -> usize {
        usize::from(self.total_len()) - self.header_len()
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The payload in the buffer: up to the total length, or to the end of a cut head.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.payload_range()]
    }

    pub(crate) fn payload_range(&self) -> Range<usize> {
        let end = usize::from(self.total_len()).min(self.buffer.as_ref().len());
        self.header_len()..end
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Computes the header checksum anew.
    pub fn fill_checksum(&mut self) {
        let hlen = self.header_len();
        let b = self.buffer.as_mut();
        b[field::CHECKSUM].fill(0);
        let c = checksum::internet(&b[..hlen]);
        b[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }

    /// The payload in the buffer, to rewrite ([`Self::payload`]).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let r = self.payload_range();
        &mut self.buffer.as_mut()[r]
    }
}

/// The header, without options, of a packet from `src` to `dst` carrying
/// `payload_len` bytes of `protocol`: TTL 64, identification 0, the DF flag as
/// `dont_frag` says, the checksum filled in. Malformed if the packet would be longer
/// than 65535 bytes.
pub fn header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: u8,
    payload_len: usize,
    dont_frag: bool,
) -> Result<[u8; HEADER_LEN]> {
    let total = u16::try_from(HEADER_LEN + payload_len).map_err(|_| Error::Malformed)?;
    let mut h = [0u8; HEADER_LEN];
    h[field::VER_IHL] = 0x45;
    h[field::LENGTH].copy_from_slice(&total.to_be_bytes());
    let flags = if dont_frag { DONT_FRAG } else { 0 };
    h[field::FLG_OFF].copy_from_slice(&flags.to_be_bytes());
    h[field::TTL] = 64;
    h[field::PROTOCOL] = protocol;
    h[field::SRC_ADDR].copy_from_slice(&src.octets());
    h[field::DST_ADDR].copy_from_slice(&dst.octets());
    let c = checksum::internet(&h);
    h[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    Ok(h)
}

fn addr(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10.0.0.1 → 10.0.0.2, TCP, `extra` bytes of options, 8 bytes of payload.
    fn packet(extra: usize) -> Vec<u8> {
        let hlen = HEADER_LEN + extra;
        let total = hlen + 8;
        let mut p = vec![0u8; total];
        p[0] = 0x40 | (hlen / 4) as u8;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40; // DF
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[hlen..].copy_from_slice(b"payload!");
        p
    }

    #[test]
    fn fields_of_a_packet_with_and_without_options() {
        for extra in [0, 4, 40] {
            let p = packet(extra);
            let v = Ipv4Packet::new_checked(&p[..]).unwrap();
            assert_eq!(v.header_len(), 20 + extra);
            assert_eq!(v.protocol(), 6);
            assert_eq!(v.src_addr(), Ipv4Addr::new(10, 0, 0, 1));
            assert_eq!(v.dst_addr(), Ipv4Addr::new(10, 0, 0, 2));
            assert_eq!((v.payload(), v.payload_len()), (&b"payload!"[..], 8));
            assert!(!v.more_frags() && v.frag_offset() == 0);
        }
    }

    #[test]
    fn short_and_inconsistent_headers_are_refused() {
        let p = packet(0);
        for n in 0..20 {
            assert_eq!(Ipv4Packet::new_head(&p[..n]).err(), Some(Error::Truncated));
        }
        for ihl in 0..5 {
            let mut q = p.clone();
            q[0] = 0x40 | ihl;
            assert_eq!(
                Ipv4Packet::new_head(&q[..]).err(),
                Some(Error::Malformed),
                "ihl {ihl}"
            );
        }
        let mut v6 = p.clone();
        v6[0] = 0x65;
        assert_eq!(Ipv4Packet::new_head(&v6[..]).err(), Some(Error::Malformed));
        // Options past the buffer; a total length short of the header.
        let mut q = p.clone();
        q[0] = 0x4f;
        q[3] = 60;
        assert_eq!(Ipv4Packet::new_head(&q[..]).err(), Some(Error::Truncated));
        let mut q = p.clone();
        q[3] = 19;
        assert_eq!(Ipv4Packet::new_head(&q[..]).err(), Some(Error::Malformed));
    }

    #[test]
    fn a_head_may_be_cut_and_a_whole_packet_padded() {
        let p = packet(4);
        let cut = &p[..26];
        assert_eq!(Ipv4Packet::new_checked(cut).err(), Some(Error::Truncated));
        let head = Ipv4Packet::new_head(cut).unwrap();
        assert_eq!((head.payload(), head.payload_len()), (&b"pa"[..], 8));
        let mut padded = p.clone();
        padded.extend_from_slice(&[0; 6]);
        let v = Ipv4Packet::new_checked(&padded[..]).unwrap();
        assert_eq!(v.payload(), b"payload!");
    }

    #[test]
    fn fragments_are_told() {
        let mut p = packet(0);
        p[6] = 0x20; // MF, offset 0: the first fragment
        let v = Ipv4Packet::new_checked(&p[..]).unwrap();
        assert!(v.more_frags() && v.frag_offset() == 0);
        p[6..8].copy_from_slice(&0x0101u16.to_be_bytes());
        let v = Ipv4Packet::new_checked(&p[..]).unwrap();
        assert!(!v.more_frags() && v.frag_offset() == 0x101);
    }

    #[test]
    fn a_header_written_reads_back() {
        let (s, d) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut p = header(s, d, 6, 8, true).unwrap().to_vec();
        p.extend_from_slice(b"payload!");
        assert_eq!(p, {
            let mut q = packet(0);
            q[8] = 64;
            Ipv4Packet::new_checked(&mut q[..]).unwrap().fill_checksum();
            q
        });
        assert_eq!(checksum::internet(&p[..20]), 0);
        let h = header(s, d, 1, 0, false).unwrap();
        assert_eq!((h[6], h[9], h[8]), (0, 1, 64));
        assert_eq!(header(s, d, 6, 65515, false).unwrap()[2..4], [0xff, 0xff]);
        assert_eq!(header(s, d, 6, 65516, false).err(), Some(Error::Malformed));
    }

    #[test]
    fn the_header_checksum_is_filled_in() {
        let mut p = packet(4);
        p[10] = 0x55;
        let mut v = Ipv4Packet::new_checked(&mut p[..]).unwrap();
        v.fill_checksum();
        v.payload_mut()[0] = b'P';
        assert_eq!(checksum::internet(&p[..24]), 0);
        assert_eq!(&p[24..], b"Payload!");
    }
}
