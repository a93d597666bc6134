//! An MSR's advertisement on its cell (paper §5.2) and an MH's solicitation of one
//! (docs/architecture.md §7): UDP broadcast, JSON.

use serde::{Deserialize, Serialize};

/// Largest beacon datagram accepted.
pub const MAX_DATAGRAM: usize = 1500;

/// An MSR's advertisement, as broadcast on its cell (UDP, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beacon {
    /// The MSR's id (as in its config and the handoff log).
    pub msr: String,
    /// Its cell MAC, which the MH's agent points the shared gateway address at.
    pub mac: String,
    /// How long this advertisement is valid.
    pub lifetime_ms: u64,
    /// Increases with every beacon of this MSR.
    pub seq: u64,
}

impl Beacon {
    /// Decodes a beacon datagram; errors say what is wrong.
    pub fn parse(b: &[u8]) -> Result<Beacon, String> {
        if b.len() > MAX_DATAGRAM {
            return Err(format!(
                "beacon of {} bytes exceeds {MAX_DATAGRAM}",
                b.len()
            ));
        }
        serde_json::from_slice(b).map_err(|e| e.to_string())
    }

    /// The datagram.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("beacons serialize")
    }
}

/// A mobile host's request for an advertisement (as Mobile IP agent solicitation or an
/// IPv6 router solicitation): broadcast on the cell to the MSRs' greeting port when the
/// MH's link comes up, so that it need not wait up to a beacon interval. Every MSR
/// that hears it broadcasts its [`Beacon`] on that cell at once (rate-limited per
/// source). It proves nothing and asks for nothing but public information.
///
/// On the wire: `{"solicit":{"seq":3}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Solicitation {
    pub solicit: SolicitBody,
}

/// The body of a [`Solicitation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SolicitBody {
    /// Counts the MH's solicitations (retransmissions included), for logs and captures.
    pub seq: u64,
}

/// Largest solicitation datagram accepted (one is ~25 bytes).
pub const MAX_SOLICITATION: usize = 256;

impl Solicitation {
    pub fn new(seq: u64) -> Solicitation {
        Solicitation {
            solicit: SolicitBody { seq },
        }
    }

    /// Decodes a solicitation datagram; errors say what is wrong. Anything but exactly
    /// `{"solicit":{"seq":N}}` (whitespace aside) is an error, so a greeting or junk on
    /// the same port is never taken for one.
    pub fn parse(b: &[u8]) -> Result<Solicitation, String> {
        if b.len() > MAX_SOLICITATION {
            return Err(format!(
                "solicitation of {} bytes exceeds {MAX_SOLICITATION}",
                b.len()
            ));
        }
        serde_json::from_slice(b).map_err(|e| format!("not a solicitation: {e}"))
    }

    /// The datagram.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("solicitations serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solicitations_round_trip() {
        let s = Solicitation::new(3);
        assert_eq!(s.to_bytes(), br#"{"solicit":{"seq":3}}"#);
        assert_eq!(Solicitation::parse(&s.to_bytes()), Ok(s));
        assert_eq!(
            Solicitation::parse(b" { \"solicit\" : { \"seq\" : 0 } }\n"),
            Ok(Solicitation::new(0))
        );
    }

    #[test]
    fn junk_and_other_messages_are_not_solicitations() {
        for bad in [
            &b""[..],
            b"solicit",
            b"{}",
            b"{\"solicit\":{}}",
            b"{\"solicit\":{\"seq\":-1}}",
            b"{\"solicit\":{\"seq\":1,\"mh\":\"10.2.0.100\"}}",
            b"{\"solicit\":{\"seq\":1},\"x\":1}",
            b"{\"solicit\":1}",
            b"{\"greeting\":{\"mh\":\"10.2.0.100\"}}",
            br#"{"msr":"msr1","mac":"02:00:00:00:01:01","lifetime_ms":3000,"seq":1}"#,
            b"\xff\xfe",
        ] {
            let e = Solicitation::parse(bad).unwrap_err();
            assert!(e.starts_with("not a solicitation: "), "{bad:?}: {e}");
        }
        let long = format!("{{\"solicit\":{{\"seq\":1}}}}{}", " ".repeat(300));
        assert!(Solicitation::parse(long.as_bytes())
            .unwrap_err()
            .contains("exceeds 256"));
    }

    #[test]
    fn beacons_are_not_solicitations_and_back() {
        let b = Beacon {
            msr: "msr1".into(),
            mac: "02:00:00:00:01:01".into(),
            lifetime_ms: 3000,
            seq: 1,
        };
        assert_eq!(Beacon::parse(&b.to_bytes()), Ok(b.clone()));
        assert!(Beacon::parse(&Solicitation::new(1).to_bytes()).is_err());
    }
}
