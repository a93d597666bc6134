//! UDP datagrams (RFC 768).

use crate::{be16, Error, Result};

/// Where each field is.
mod field {
    use core::ops::Range;
    pub const LENGTH: Range<usize> = 4..6;
    pub const PAYLOAD: usize = 8;
}

/// The header's length.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// The IP protocol number.
pub const PROTOCOL: u8 = 17;

/// A UDP datagram in a byte buffer.
#[derive(Debug, Clone)]
pub struct UdpDatagram<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpDatagram<T> {
    /// A whole datagram: the header, its length at least the header's and at most the
    /// buffer's.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let len = usize::from(be16(b, field::LENGTH.start));
        if len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len > b.len() {
            return Err(Error::Truncated);
        }
        Ok(UdpDatagram { buffer })
    }

    /// The datagram's length, header included.
    fn length(&self) -> usize {
        usize::from(be16(self.buffer.as_ref(), field::LENGTH.start))
    }

    /// The payload, up to the datagram's length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..self.length()]
    }
}

impl<'a> UdpDatagram<&'a [u8]> {
    /// The payload, borrowed from the buffer rather than the view.
    pub fn into_payload(self) -> &'a [u8] {
        &self.buffer[field::PAYLOAD..self.length()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_ends_at_the_length() {
        let d = [
            0x9c, 0x40, 0x1f, 0x90, 0, 13, 0, 0, b'h', b'e', b'l', b'l', b'o', 0, 0,
        ];
        let v = UdpDatagram::new_checked(&d[..]).unwrap();
        assert_eq!((v.length(), v.payload()), (13, &b"hello"[..]));
        assert_eq!(v.into_payload(), b"hello");
    }

    #[test]
    fn short_and_inconsistent_datagrams_are_refused() {
        let d = [
            0x9c, 0x40, 0x1f, 0x90, 0, 13, 0, 0, b'h', b'e', b'l', b'l', b'o',
        ];
        for n in 0..13 {
            assert_eq!(
                UdpDatagram::new_checked(&d[..n]).err(),
                Some(Error::Truncated),
                "{n}"
            );
        }
        let mut q = d;
        q[5] = 7;
        assert_eq!(
            UdpDatagram::new_checked(&q[..]).err(),
            Some(Error::Malformed)
        );
    }
}
