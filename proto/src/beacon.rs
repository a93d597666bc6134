//! An MSR's advertisement on its cell (paper §5.2): UDP broadcast, JSON.

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
