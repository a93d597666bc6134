//! ARP packets (RFC 826) of the one kind msrd reads: Ethernet hardware, IPv4 protocol.

use std::net::Ipv4Addr;

use crate::ethernet::mac;
use crate::{be16, Error, Result};

/// Where each field is, for Ethernet/IPv4 (6-byte hardware, 4-byte protocol addresses).
mod field {
    use core::ops::Range;
    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// The packet's length.
pub const PACKET_LEN: usize = field::TPA.end;

const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;

/// Operations.
pub const REQUEST: u16 = 1;
pub const REPLY: u16 = 2;

/// An Ethernet/IPv4 ARP packet in a byte buffer.
#[derive(Debug, Clone)]
pub struct ArpPacket<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// An Ethernet/IPv4 ARP packet: hardware type 1, protocol type IPv4, address
    /// lengths 6 and 4, all 28 bytes present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < PACKET_LEN {
            return Err(Error::Truncated);
        }
        let kind = (be16(b, field::HTYPE.start), be16(b, field::PTYPE.start));
        if kind != (HTYPE_ETHERNET, PTYPE_IPV4) || (b[field::HLEN], b[field::PLEN]) != (6, 4) {
            return Err(Error::Malformed);
        }
        Ok(ArpPacket { buffer })
    }

    /// [`REQUEST`], [`REPLY`], …
    pub fn operation(&self) -> u16 {
        be16(self.buffer.as_ref(), field::OPER.start)
    }

    /// The sender's hardware address.
    pub fn sender_hw_addr(&self) -> [u8; 6] {
        mac(&self.buffer.as_ref()[field::SHA])
    }

    /// The sender's protocol address.
    pub fn sender_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SPA];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    /// Writes an Ethernet/IPv4 ARP packet of operation `op` from `sender` (hardware
    /// and protocol address) to `target` into `buffer` (28 bytes at least; the rest is
    /// left as it is).
    pub fn emit(
        mut buffer: T,
        op: u16,
        sender: ([u8; 6], Ipv4Addr),
        target: ([u8; 6], Ipv4Addr),
    ) -> Result<Self> {
        let b = buffer.as_mut();
        if b.len() < PACKET_LEN {
            return Err(Error::Truncated);
        }
        b[field::HTYPE].copy_from_slice(&HTYPE_ETHERNET.to_be_bytes());
        b[field::PTYPE].copy_from_slice(&PTYPE_IPV4.to_be_bytes());
        (b[field::HLEN], b[field::PLEN]) = (6, 4);
        b[field::OPER].copy_from_slice(&op.to_be_bytes());
        b[field::SHA].copy_from_slice(&sender.0);
        b[field::SPA].copy_from_slice(&sender.1.octets());
        b[field::THA].copy_from_slice(&target.0);
        b[field::TPA].copy_from_slice(&target.1.octets());
        Ok(ArpPacket { buffer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Vec<u8> {
        let mut p = vec![0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 0x66, 10, 2, 0, 102];
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 2, 0, 1]);
        p
    }

    #[test]
    fn sender_of_a_request() {
        let p = request();
        let v = ArpPacket::new_checked(&p[..]).unwrap();
        assert_eq!(v.sender_hw_addr(), [2, 0, 0, 0, 0, 0x66]);
        assert_eq!(v.sender_addr(), Ipv4Addr::new(10, 2, 0, 102));
    }

    #[test]
    fn a_packet_written_reads_back() {
        let mut b = [0xaa; 30];
        let ip = Ipv4Addr::new(10, 2, 0, 102);
        let target = ([0; 6], Ipv4Addr::new(10, 2, 0, 1));
        ArpPacket::emit(&mut b[..], REQUEST, ([2, 0, 0, 0, 0, 0x66], ip), target).unwrap();
        assert_eq!(&b[..28], &request()[..]);
        assert_eq!(&b[28..], &[0xaa; 2], "past the packet: untouched");
        assert_eq!(ArpPacket::new_checked(&b[..]).unwrap().operation(), REQUEST);
        let short = ArpPacket::emit(&mut b[..27], REPLY, ([0; 6], ip), target);
        assert_eq!(short.err(), Some(Error::Truncated));
    }

    #[test]
    fn short_and_other_kinds_are_refused() {
        let p = request();
        for n in 0..28 {
            assert_eq!(
                ArpPacket::new_checked(&p[..n]).err(),
                Some(Error::Truncated)
            );
        }
        for (at, v) in [(1, 6), (2, 0x86), (4, 8), (5, 16)] {
            let mut q = p.clone();
            q[at] = v;
            assert_eq!(ArpPacket::new_checked(&q[..]).err(), Some(Error::Malformed));
        }
    }
}
