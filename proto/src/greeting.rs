//! MH ⇄ MSR greetings (paper step 2), sans-IO: UDP datagrams of JSON on the cell.
//!
//! The MH's greeting carries its own proof: an HMAC under the MH's session token (the
//! secret the MH presented when it opened its connections), which only an MSR holding
//! that token can check. Nobody can take another host's connections by greeting an MSR.

use std::net::IpAddr;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::hex::{hex, unhex};

type HmacSha256 = Hmac<Sha256>;

/// Largest greeting datagram msrd reads (a greeting is ~300 bytes).
pub const MAX_DATAGRAM: usize = 4096;

/// The MH's greeting to its new MSR (paper step 2), with proof of ownership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Greeting {
    pub mh: IpAddr,
    pub prev_msr: String,
    pub new_msr: String,
    pub ts_ms: u64,
    /// 16 random bytes, hex.
    pub nonce: String,
    /// HMAC-SHA256(token, "itcp-greeting" · mh · prev · new · ts · nonce), hex.
    pub proof: String,
}

fn greeting_mac(
    token: &[u8],
    mh: IpAddr,
    prev: &str,
    new: &str,
    ts_ms: u64,
    nonce: &str,
) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(token).expect("HMAC takes any key length");
    for part in [
        b"itcp-greeting".as_slice(),
        mh.to_string().as_bytes(),
        prev.as_bytes(),
        new.as_bytes(),
        &ts_ms.to_be_bytes(),
        nonce.as_bytes(),
    ] {
        m.update(&(part.len() as u32).to_be_bytes());
        m.update(part);
    }
    m
}

impl Greeting {
    /// Builds a greeting proven with the MH's session `token`.
    pub fn new(
        token: &[u8],
        mh: IpAddr,
        prev_msr: &str,
        new_msr: &str,
        ts_ms: u64,
        nonce: [u8; 16],
    ) -> Greeting {
        let nonce = hex(&nonce);
        let proof = hex(&greeting_mac(token, mh, prev_msr, new_msr, ts_ms, &nonce)
            .finalize()
            .into_bytes());
        Greeting {
            mh,
            prev_msr: prev_msr.into(),
            new_msr: new_msr.into(),
            ts_ms,
            nonce,
            proof,
        }
    }

    /// True if the proof was made with `token` (constant-time comparison).
    pub fn verify(&self, token: &[u8]) -> bool {
        let Some(proof) = unhex(&self.proof) else {
            return false;
        };
        greeting_mac(
            token,
            self.mh,
            &self.prev_msr,
            &self.new_msr,
            self.ts_ms,
            &self.nonce,
        )
        .verify_slice(&proof)
        .is_ok()
    }
}

/// MH → MSR, UDP to the greeting port (broadcast on the cell): "I am here now".
/// `greeting.new_msr` names the MSR meant; others ignore it. `token` is accepted for
/// compatibility with older agents and ignored: an MSR never takes a token from a
/// greeting (anyone can send one), and a token must not cross the air in clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GreetMsg {
    pub greeting: Greeting,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Where a greeting stands, as the MSR tells the MH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GreetStatus {
    /// The MSR holds the MH's flows and is fetching its connections: the MH may send
    /// through this MSR now.
    Holding,
    /// Attached with nothing to move (first contact, or coming back to the MSR that
    /// still holds the connections).
    Attached,
    /// The connections are here and running.
    Moved,
    /// The handoff failed; the connections stayed at the previous MSR.
    Failed,
    /// Refused (bad proof, unknown previous MSR, malformed): see the reason.
    Refused,
}

/// MSR → MH, UDP, answering a greeting (repeated for duplicate greetings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GreetReply {
    pub msr: String,
    /// The greeting's nonce.
    pub nonce: String,
    pub status: GreetStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub connections: usize,
    /// The MSR's MAC on the MH's cell: the MH points its gateway address at it. An MH
    /// takes it from a tagged reply rather than from a beacon (anyone can beacon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// HMAC-SHA256(token, "itcp-greet-reply" · msr · nonce · status · reason ·
    /// connections · mac), hex, under the MH's session token: present when the MSR
    /// holds that token, so the MH can tell its MSRs' answers from anyone's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

impl GreetReply {
    fn mac_under(&self, token: &[u8]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(token).expect("HMAC takes any key length");
        let status = serde_json::to_string(&self.status).expect("statuses serialize");
        let connections = (self.connections as u64).to_be_bytes();
        for part in [
            b"itcp-greet-reply".as_slice(),
            self.msr.as_bytes(),
            self.nonce.as_bytes(),
            status.as_bytes(),
            self.reason.as_deref().unwrap_or("").as_bytes(),
            &connections,
            self.mac.as_deref().unwrap_or("").as_bytes(),
        ] {
            m.update(&(part.len() as u32).to_be_bytes());
            m.update(part);
        }
        m
    }

    /// Tags the reply under the MH's session `token`.
    pub fn seal(&mut self, token: &[u8]) {
        self.tag = Some(hex(&self.mac_under(token).finalize().into_bytes()));
    }

    /// True if the reply carries a tag made with `token` (constant-time comparison).
    pub fn verify(&self, token: &[u8]) -> bool {
        let Some(tag) = self.tag.as_deref().and_then(unhex) else {
            return false;
        };
        self.mac_under(token).verify_slice(&tag).is_ok()
    }
}

/// Decodes a greeting datagram; errors say what is wrong.
pub fn parse_greet_msg(b: &[u8]) -> Result<GreetMsg, String> {
    if b.len() > MAX_DATAGRAM {
        return Err(format!(
            "greeting of {} bytes exceeds {MAX_DATAGRAM}",
            b.len()
        ));
    }
    serde_json::from_slice(b).map_err(|e| e.to_string())
}

/// Decodes a greeting reply datagram.
pub fn parse_greet_reply(b: &[u8]) -> Result<GreetReply, String> {
    if b.len() > MAX_DATAGRAM {
        return Err(format!("reply of {} bytes exceeds {MAX_DATAGRAM}", b.len()));
    }
    serde_json::from_slice(b).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_proof_needs_the_token() {
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let g = Greeting::new(b"0123456789abcdef", mh, "msr1", "msr2", 5, [3; 16]);
        assert!(g.verify(b"0123456789abcdef"));
        assert!(!g.verify(b"another token..."));
        // Changing any field breaks the proof.
        let mut h = g.clone();
        h.mh = "10.2.0.101".parse().unwrap();
        assert!(!h.verify(b"0123456789abcdef"));
        let mut h = g;
        h.new_msr = "msr3".into();
        assert!(!h.verify(b"0123456789abcdef"));
    }

    #[test]
    fn a_reply_tag_needs_the_token_and_covers_every_field() {
        let token = b"0123456789abcdef";
        let mut r = GreetReply {
            msr: "msr2".into(),
            nonce: "00112233445566778899aabbccddeeff".into(),
            status: GreetStatus::Holding,
            reason: None,
            connections: 0,
            mac: Some("02:00:00:00:02:01".into()),
            tag: None,
        };
        assert!(!r.verify(token), "no tag, nothing verifies");
        r.seal(token);
        assert!(r.verify(token));
        assert!(!r.verify(b"another token..."));
        // It survives the wire.
        let wire = parse_greet_reply(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert!(wire.verify(token));
        let changed: [fn(&mut GreetReply); 6] = [
            |r| r.msr = "msr3".into(),
            |r| r.nonce = "ffffffffffffffffffffffffffffffff".into(),
            |r| r.status = GreetStatus::Moved,
            |r| r.reason = Some("x".into()),
            |r| r.connections = 1,
            |r| r.mac = Some("02:66:66:66:66:66".into()),
        ];
        for change in changed {
            let mut f = r.clone();
            change(&mut f);
            assert!(!f.verify(token), "{f:?}");
        }
        // An old MSR's reply (no mac, no tag) still parses.
        let old = br#"{"msr":"msr1","nonce":"ab","status":"attached","connections":2}"#;
        let o = parse_greet_reply(old).unwrap();
        assert_eq!((o.mac, o.tag), (None, None));
    }
}
