//! The seeded byte stream `ttcp` sends and verifies.
//!
//! The stream is counter based, so the byte at any offset can be computed directly:
//! word `k` (8 bytes, little-endian) is a splitmix64-style mix of `(seed, k)`, and byte
//! `i` of the stream is byte `i % 8` of word `i / 8`. A lost, duplicated, reordered or
//! altered byte therefore shows up as a mismatch at a precise offset.
//!
//! [`StreamGen`] produces the stream, [`StreamCheck`] verifies it; both work a whole
//! 64-bit word at a time and only fall back to bytes at unaligned edges (several GB/s
//! in a release build).

use std::fmt;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The splitmix64 finaliser.
#[inline(always)]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Per-seed key, computed once so that seeds `s` and `s + 1` give unrelated streams.
#[inline]
fn seed_key(seed: u64) -> u64 {
    mix64(seed ^ 0x5851_f42d_4c95_7f2d)
}

/// Word `k` of the stream for the given seed key.
#[inline(always)]
fn word(key: u64, k: u64) -> u64 {
    mix64(key.wrapping_add(k.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// The stream byte at `offset` for `seed` (slow path; for tests and error messages).
pub fn byte_at(seed: u64, offset: u64) -> u8 {
    word(seed_key(seed), offset / 8).to_le_bytes()[(offset % 8) as usize]
}

/// Produces the seeded stream from offset 0 on.
#[derive(Debug, Clone)]
pub struct StreamGen {
    seed: u64,
    key: u64,
    offset: u64,
}

impl StreamGen {
    pub fn new(seed: u64) -> Self {
        StreamGen {
            seed,
            key: seed_key(seed),
            offset: 0,
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Offset of the next byte [`fill`](Self::fill) will produce.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Fills `buf` with the next `buf.len()` bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut rest: &mut [u8] = buf;
        if rest.is_empty() {
            return;
        }
        // Head: finish a partially consumed word.
        let skip = (self.offset % 8) as usize;
        if skip != 0 && !rest.is_empty() {
            let w = word(self.key, self.offset / 8).to_le_bytes();
            let n = (8 - skip).min(rest.len());
            rest[..n].copy_from_slice(&w[skip..skip + n]);
            self.offset += n as u64;
            rest = &mut rest[n..];
            if rest.is_empty() {
                return;
            }
        }
        // Body: whole words.
        let mut k = self.offset / 8;
        let mut chunks = rest.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&word(self.key, k).to_le_bytes());
            k += 1;
        }
        let tail = chunks.into_remainder();
        self.offset = k * 8;
        // Tail: start of a word.
        if !tail.is_empty() {
            let w = word(self.key, k).to_le_bytes();
            let n = tail.len();
            tail.copy_from_slice(&w[..n]);
            self.offset += n as u64;
        }
    }
}

/// A verification failure: the first byte that differs from the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub offset: u64,
    pub expected: u8,
    pub got: u8,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream mismatch at byte offset {}: expected {:#04x}, got {:#04x}",
            self.offset, self.expected, self.got
        )
    }
}

impl std::error::Error for Mismatch {}

/// Verifies received data against the seeded stream.
#[derive(Debug, Clone)]
pub struct StreamCheck {
    seed: u64,
    key: u64,
    offset: u64,
}

impl StreamCheck {
    pub fn new(seed: u64) -> Self {
        StreamCheck {
            seed,
            key: seed_key(seed),
            offset: 0,
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Offset of the next byte [`check`](Self::check) expects.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Verifies that `data` are the next bytes of the stream. On success the offset
    /// advances by `data.len()`; on a mismatch the offset stays at the bad byte.
    pub fn check(&mut self, data: &[u8]) -> Result<(), Mismatch> {
        let mut rest = data;
        if rest.is_empty() {
            return Ok(());
        }
        let skip = (self.offset % 8) as usize;
        if skip != 0 && !rest.is_empty() {
            let w = word(self.key, self.offset / 8).to_le_bytes();
            let n = (8 - skip).min(rest.len());
            self.check_bytes(&w[skip..skip + n], &rest[..n])?;
            rest = &rest[n..];
            if rest.is_empty() {
                return Ok(());
            }
        }
        let mut k = self.offset / 8;
        let mut chunks = rest.chunks_exact(8);
        for c in &mut chunks {
            let got = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            let exp = word(self.key, k);
            if got != exp {
                let i = ((got ^ exp).trailing_zeros() / 8) as usize;
                self.offset = k * 8 + i as u64;
                return Err(Mismatch {
                    offset: k * 8 + i as u64,
                    expected: exp.to_le_bytes()[i],
                    got: c[i],
                });
            }
            k += 1;
        }
        self.offset = k * 8;
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let w = word(self.key, k).to_le_bytes();
            self.check_bytes(&w[..tail.len()], tail)?;
        }
        Ok(())
    }

    fn check_bytes(&mut self, expected: &[u8], got: &[u8]) -> Result<(), Mismatch> {
        for (i, (&e, &g)) in expected.iter().zip(got).enumerate() {
            if e != g {
                return Err(Mismatch {
                    offset: self.offset + i as u64,
                    expected: e,
                    got: g,
                });
            }
        }
        self.offset += got.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn big(seed: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        StreamGen::new(seed).fill(&mut v);
        v
    }

    #[test]
    fn odd_pieces_equal_one_fill() {
        let whole = big(7, 100_003);
        let mut g = StreamGen::new(7);
        let mut pieces = Vec::new();
        let sizes = [1usize, 3, 0, 5, 7, 8, 9, 13, 1000, 4097, 2, 65_536, 6];
        let mut i = 0;
        while pieces.len() < whole.len() {
            let n = sizes[i % sizes.len()].min(whole.len() - pieces.len());
            let mut b = vec![0u8; n];
            g.fill(&mut b);
            pieces.extend_from_slice(&b);
            i += 1;
            assert_eq!(g.offset(), pieces.len() as u64);
        }
        assert_eq!(pieces, whole);
        for off in [0u64, 1, 7, 8, 9, 12_345, 100_002] {
            assert_eq!(byte_at(7, off), whole[off as usize]);
        }
    }

    #[test]
    fn check_accepts_stream_in_odd_pieces() {
        let whole = big(3, 50_000);
        let mut c = StreamCheck::new(3);
        let mut pos = 0;
        let mut n = 1;
        while pos < whole.len() {
            let end = (pos + n).min(whole.len());
            c.check(&whole[pos..end]).unwrap();
            pos = end;
            n = n * 3 % 1031 + 1;
        }
        assert_eq!(c.offset(), whole.len() as u64);
    }

    #[test]
    fn check_finds_flipped_byte_at_exact_offset() {
        for bad in [0usize, 1, 5, 7, 8, 15, 16, 1_000_003, 1_048_575] {
            let mut data = big(42, 1 << 20);
            let orig = data[bad];
            data[bad] ^= 0x5a;
            // Whole buffer, and in unaligned pieces.
            let e = StreamCheck::new(42).check(&data).unwrap_err();
            assert_eq!(
                e,
                Mismatch {
                    offset: bad as u64,
                    expected: orig,
                    got: orig ^ 0x5a
                }
            );
            let mut c = StreamCheck::new(42);
            let mut pos = 0;
            let err = loop {
                let end = (pos + 4099).min(data.len());
                if let Err(e) = c.check(&data[pos..end]) {
                    break e;
                }
                pos = end;
            };
            assert_eq!(err.offset, bad as u64);
            assert_eq!(c.offset(), bad as u64);
        }
    }

    #[test]
    fn mismatch_display() {
        let m = Mismatch {
            offset: 123_456,
            expected: 0x3a,
            got: 0xc5,
        };
        assert_eq!(
            m.to_string(),
            "stream mismatch at byte offset 123456: expected 0x3a, got 0xc5"
        );
        let m = Mismatch {
            offset: 1,
            expected: 0x0,
            got: 0xff,
        };
        assert_eq!(
            m.to_string(),
            "stream mismatch at byte offset 1: expected 0x00, got 0xff"
        );
    }

    #[test]
    fn different_seeds_differ() {
        let a = big(1, 4096);
        let b = big(2, 4096);
        let c = big(1, 4096);
        assert_eq!(a, c);
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        // Unrelated streams agree on about 1/256 of the bytes.
        assert!(same < 64, "{same} equal bytes");
        assert!(StreamCheck::new(2).check(&a).is_err());
    }

    #[test]
    fn throughput_smoke() {
        // Not a benchmark; just makes sure large buffers round-trip.
        let mut buf = vec![0u8; 1 << 22];
        let mut g = StreamGen::new(9);
        let mut c = StreamCheck::new(9);
        for _ in 0..4 {
            g.fill(&mut buf);
            c.check(&buf).unwrap();
        }
        assert_eq!(c.offset(), 4 << 22);
    }
}
