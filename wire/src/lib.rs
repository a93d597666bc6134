//! Checked, zero-copy views of the packets msrd reads, rewrites and writes: IPv4, IPv6,
//! TCP, UDP, Ethernet and Ethernet/IPv4 ARP, after smoltcp's `wire` module. Each view's constructor
//! checks once that every field its accessors read lies in the buffer and that the
//! length fields agree with one another, so the accessors index without further checks
//! and no input makes them panic.
//!
//! Two constructors where captures are cut: `new_checked` takes a whole packet (its
//! length fields within the buffer); `new_head` takes a packet's head as NFLOG copies
//! it, the headers present but the payload possibly cut short.

#![forbid(unsafe_code)]

pub mod arp;
pub mod checksum;
pub mod ethernet;
#[doc(hidden)]
pub mod fuzzing;
pub mod ip;
pub mod ipv4;
pub mod ipv6;
pub mod tcp;
pub mod udp;

pub use ip::{tcp_in_head, IpPacket};
pub use ipv4::Ipv4Packet;
pub use ipv6::Ipv6Packet;
pub use tcp::TcpSegment;
pub use udp::UdpDatagram;

/// Why a buffer is no packet of the kind asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Shorter than its headers or its length fields say.
    Truncated,
    /// A field out of range or inconsistent with another (version, header length,
    /// option length), or a protocol other than the one asked for.
    Malformed,
}

pub type Result<T> = core::result::Result<T, Error>;

/// Field readers shared by the views (callers have checked the bounds).
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
