//! TCP segments (RFC 9293) and their options.

use core::ops::Range;
use std::net::IpAddr;

use crate::{be16, be32, checksum, Error, Result};

/// Where each field is: the fixed header; options follow up to the data offset.
mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ_NUM: Range<usize> = 4..8;
    pub const ACK_NUM: Range<usize> = 8..12;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const OPTIONS: usize = 20;
}

/// The fixed header's length.
pub const HEADER_LEN: usize = field::OPTIONS;

/// The IP protocol number.
pub const PROTOCOL: u8 = 6;

/// Flag bits of [`TcpSegment::flags`].
pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

/// Option kinds.
pub const OPT_END: u8 = 0;
pub const OPT_NOP: u8 = 1;
pub const OPT_WINDOW_SCALE: u8 = 3;
pub const OPT_SACK: u8 = 5;
pub const OPT_TIMESTAMPS: u8 = 8;

/// A TCP segment in a byte buffer.
#[derive(Debug, Clone)]
pub struct TcpSegment<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpSegment<T> {
    /// A whole segment: the fixed header, a data offset of at least 5 words, the
    /// header with its options within the buffer.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let s = Self::new_head(buffer)?;
        if s.header_len() > s.buffer.as_ref().len() {
            return Err(Error::Truncated);
        }
        Ok(s)
    }

    /// A segment's head, as a capture cut it: the fixed header and a data offset of at
    /// least 5 words; the options may be cut ([`Self::options`] says so).
    pub fn new_head(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let s = TcpSegment { buffer };
        if s.header_len() < HEADER_LEN {
            return Err(Error::Malformed);
        }
        Ok(s)
    }

    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SRC_PORT.start)
    }

    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DST_PORT.start)
    }

    pub fn seq_number(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SEQ_NUM.start)
    }

    pub fn ack_number(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ACK_NUM.start)
    }

    /// The header's length in bytes (the data offset), options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::DATA_OFF] >> 4) * 4
    }

    /// The flag bits ([`FIN`], [`SYN`], [`RST`], [`ACK`], …).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// The options, in order, up to the end of the header or an End option. An option
    /// cut short (by the header's end or the capture's) or of length below 2 is an
    /// error, and the last item.
    pub fn options(&self) -> Options<'_> {
        let b = self.buffer.as_ref();
        let end = self.header_len();
        match b.get(field::OPTIONS..end) {
            Some(bytes) => Options {
                bytes,
                at: 0,
                failed: None,
            },
            None => Options {
                bytes: &[],
                at: 0,
                failed: Some(Error::Truncated),
            },
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpSegment<T> {
    pub fn set_ack_number(&mut self, ack: u32) {
        self.buffer.as_mut()[field::ACK_NUM].copy_from_slice(&ack.to_be_bytes());
    }

    /// The option bytes in the buffer, to rewrite in place (offsets as in
    /// [`TcpOption::at`]).
    pub fn options_mut(&mut self) -> &mut [u8] {
        let end = self.header_len().min(self.buffer.as_ref().len());
        &mut self.buffer.as_mut()[field::OPTIONS..end]
    }

    /// Computes the checksum anew, the buffer being the whole segment from `src` to
    /// `dst`.
    pub fn fill_checksum(&mut self, src: IpAddr, dst: IpAddr) {
        let b = self.buffer.as_mut();
        b[field::CHECKSUM].fill(0);
        let acc = checksum::pseudo_header(src, dst, PROTOCOL, b.len() as u32);
        let c = checksum::fold(checksum::sum(acc, b));
        b[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }
}

/// One option: its kind, its data (after kind and length), where it lies among the
/// option bytes (kind to end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOption<'a> {
    pub kind: u8,
    pub data: &'a [u8],
    pub at: Range<usize>,
}

/// The options of a segment ([`TcpSegment::options`]).
pub struct Options<'a> {
    bytes: &'a [u8],
    at: usize,
    failed: Option<Error>,
}

impl<'a> Iterator for Options<'a> {
    type Item = Result<TcpOption<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            self.at = self.bytes.len();
            return Some(Err(e));
        }
        let start = self.at;
        let kind = *self.bytes.get(start)?;
        let len = match kind {
            OPT_END => {
                self.at = self.bytes.len();
                return None;
            }
            OPT_NOP => 1,
            _ => match self.bytes.get(start + 1) {
                None => return self.fail(Error::Truncated),
                Some(&l) if l < 2 => return self.fail(Error::Malformed),
                Some(&l) => usize::from(l),
            },
        };
        let Some(option) = self.bytes.get(start..start + len) else {
            return self.fail(Error::Truncated);
        };
        self.at = start + len;
        Some(Ok(TcpOption {
            kind,
            data: option.get(2..).unwrap_or_default(),
            at: start..start + len,
        }))
    }
}

impl Options<'_> {
    fn fail<X>(&mut self, e: Error) -> Option<Result<X>> {
        self.at = self.bytes.len();
        Some(Err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 40000 → 80, seq 1000, ack 5000, FIN|ACK, with `opts` (padded to words).
    fn segment(opts: &[u8]) -> Vec<u8> {
        let hlen = HEADER_LEN + opts.len().div_ceil(4) * 4;
        let mut s = vec![0u8; hlen];
        s[0..2].copy_from_slice(&40000u16.to_be_bytes());
        s[2..4].copy_from_slice(&80u16.to_be_bytes());
        s[4..8].copy_from_slice(&1000u32.to_be_bytes());
        s[8..12].copy_from_slice(&5000u32.to_be_bytes());
        s[12] = ((hlen / 4) as u8) << 4;
        s[13] = FIN | ACK;
        s[20..20 + opts.len()].copy_from_slice(opts);
        s.extend_from_slice(b"bye");
        s
    }

    const TS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0, 77, 0, 0, 0, 99];

    #[test]
    fn fields_of_a_segment() {
        let s = segment(&TS);
        let v = TcpSegment::new_checked(&s[..]).unwrap();
        assert_eq!((v.src_port(), v.dst_port()), (40000, 80));
        assert_eq!((v.seq_number(), v.ack_number()), (1000, 5000));
        assert_eq!((v.header_len(), v.flags()), (32, FIN | ACK));
    }

    #[test]
    fn options_are_walked_to_the_end_option() {
        let s = segment(&[2, 4, 5, 0xb4, 1, 3, 3, 7, 0, 8, 10]);
        let v = TcpSegment::new_checked(&s[..]).unwrap();
        let o: Vec<_> = v.options().map(Result::unwrap).collect();
        assert_eq!(o.len(), 3, "{o:?}");
        assert_eq!(
            (o[0].kind, o[0].data, o[0].at.clone()),
            (2, &[5, 0xb4][..], 0..4)
        );
        assert_eq!((o[1].kind, o[1].at.clone()), (OPT_NOP, 4..5));
        assert_eq!((o[2].kind, o[2].data), (OPT_WINDOW_SCALE, &[7][..]));
        let s = segment(&TS);
        let v = TcpSegment::new_checked(&s[..]).unwrap();
        let ts = v
            .options()
            .find_map(|o| o.ok().filter(|o| o.kind == OPT_TIMESTAMPS));
        assert_eq!(ts.unwrap().data, &[0, 0, 0, 77, 0, 0, 0, 99]);
    }

    #[test]
    fn bad_options_end_the_walk_with_an_error() {
        for (opts, e) in [
            (&[8, 10, 0, 0][..], Error::Truncated), // past the header
            (&[1, 1, 1, 8][..], Error::Truncated),  // no length byte
            (&[5, 1, 0, 0][..], Error::Malformed),  // length below 2
            (&[5, 0, 0, 0][..], Error::Malformed),
        ] {
            let s = segment(opts);
            let v = TcpSegment::new_checked(&s[..]).unwrap();
            let last = v.options().last().unwrap();
            assert_eq!(last, Err(e), "{opts:?}");
        }
    }

    #[test]
    fn short_and_inconsistent_headers_are_refused() {
        let s = segment(&TS);
        for n in 0..20 {
            assert_eq!(TcpSegment::new_head(&s[..n]).err(), Some(Error::Truncated));
        }
        // A head may cut the options, which then say so; a whole segment may not.
        let head = TcpSegment::new_head(&s[..24]).unwrap();
        assert_eq!(
            head.options().collect::<Vec<_>>(),
            vec![Err(Error::Truncated)]
        );
        assert_eq!(
            TcpSegment::new_checked(&s[..24]).err(),
            Some(Error::Truncated)
        );
        for off in 0..5 {
            let mut q = s.clone();
            q[12] = off << 4;
            assert_eq!(TcpSegment::new_head(&q[..]).err(), Some(Error::Malformed));
        }
    }

    #[test]
    fn rewrites_and_checksums() {
        let mut s = segment(&[1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
        let (src, dst): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut v = TcpSegment::new_checked(&mut s[..]).unwrap();
        v.set_ack_number(7);
        v.options_mut()[2..].fill(OPT_NOP);
        v.fill_checksum(src, dst);
        assert_eq!(v.ack_number(), 7);
        assert!(v.options().all(|o| o.unwrap().kind == OPT_NOP));
        let acc = checksum::pseudo_header(src, dst, PROTOCOL, s.len() as u32);
        assert_eq!(checksum::fold(checksum::sum(acc, &s)), 0);
    }
}
