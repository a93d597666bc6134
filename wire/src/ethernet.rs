//! Ethernet II frames (without the FCS, as packet sockets carry them).

use crate::{Error, Result};

/// Where each field is.
mod field {
    use core::ops::Range;
    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const PAYLOAD: usize = 14;
}

/// The header's length.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// The EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;

/// An Ethernet frame in a byte buffer.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// A frame: the header present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(EthernetFrame { buffer })
    }

    pub fn dst_addr(&self) -> [u8; 6] {
        mac(&self.buffer.as_ref()[field::DESTINATION])
    }

    /// Everything after the header (padding included: a frame says not where its
    /// payload ends).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Writes the header of a frame from `src` to `dst` carrying `ethertype` into
    /// `buffer` (the header's length at least).
    pub fn emit(mut buffer: T, dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Result<Self> {
        let b = buffer.as_mut();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        b[field::DESTINATION].copy_from_slice(&dst);
        b[field::SOURCE].copy_from_slice(&src);
        b[field::ETHERTYPE].copy_from_slice(&ethertype.to_be_bytes());
        Ok(EthernetFrame { buffer })
    }

    /// Everything after the header, to write.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD..]
    }
}

pub(crate) fn mac(b: &[u8]) -> [u8; 6] {
    let mut a = [0u8; 6];
    a.copy_from_slice(b);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_written_reads_back() {
        let mut f = [0u8; 20];
        let mut e =
            EthernetFrame::emit(&mut f[..], [0xff; 6], [2, 0, 0, 0, 0, 1], ETHERTYPE_ARP).unwrap();
        e.payload_mut().fill(7);
        assert_eq!(
            &f[..14],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 8, 6]
        );
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!((e.dst_addr(), e.payload()), ([0xff; 6], &[7u8; 6][..]));
    }

    #[test]
    fn short_frames_are_refused() {
        let mut f = [0u8; 13];
        assert_eq!(
            EthernetFrame::new_checked(&f[..]).err(),
            Some(Error::Truncated)
        );
        assert_eq!(
            EthernetFrame::emit(&mut f[..], [0; 6], [0; 6], 0).err(),
            Some(Error::Truncated)
        );
    }
}
