//! The MH's session token crosses the air sealed under an X25519 key agreement (method
//! `0x80` sub-negotiation, docs/protocol.md §1), never in clear.
//!
//! The MSR sends a fresh public key with its method choice; the MH answers with its
//! own fresh public key and its token sealed under a key both derive from the shared
//! secret, the MH's address (as the MSR sees the connection's source) and both public
//! keys:
//!
//! * K = HMAC-SHA256(X25519(a, B), "itcp-token-kx" · mh · A · B), parts length-prefixed
//! * sealed = token XOR K[0..16]; tag = HMAC-SHA256(K[16..32], "itcp-token-tag" · sealed)[0..16]
//!
//! An eavesdropper sees A, B and the sealed token only. A recorded exchange replayed
//! to the MSR meets a new B and opens to nothing; a sealed token sent from another
//! address opens to nothing (the tag fails). The MSR is not authenticated to the MH
//! (as with any SOCKS gateway on the cell, an active attacker who can answer for the
//! gateway address can also read what the MH sends it).
//!
//! Pure functions of their inputs: the caller draws the 32-byte secrets (the MSR keeps
//! its secret with a handshake in progress, so a handshake moved by a handoff replays
//! to the same bytes).

use std::net::IpAddr;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::socks::Token;

type HmacSha256 = Hmac<Sha256>;

/// An X25519 secret (32 random bytes).
pub type Secret = [u8; 32];
/// An X25519 public key.
pub type Public = [u8; 32];

/// The public key of `secret`.
pub fn public_key(secret: &Secret) -> Public {
    x25519_dalek::x25519(*secret, x25519_dalek::X25519_BASEPOINT_BYTES)
}

/// The MH's answer: its public key, its token sealed, the tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedToken {
    pub public: Public,
    pub sealed: [u8; 16],
    pub tag: [u8; 16],
}

/// Why a sealed token did not open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// The peer's public key is a low-order point: the shared secret would be zero.
    WeakKey,
    /// The tag does not verify: another address, another exchange, or altered bytes.
    BadTag,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OpenError::WeakKey => "key share is a low-order point",
            OpenError::BadTag => "sealed token does not verify (other address or exchange)",
        })
    }
}

impl std::error::Error for OpenError {}

fn key(shared: &[u8; 32], mh: IpAddr, mh_public: &Public, msr_public: &Public) -> [u8; 32] {
    let mh = match mh {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut m = HmacSha256::new_from_slice(shared).expect("HMAC takes any key length");
    m.update(b"itcp-token-kx");
    for p in [&mh[..], mh_public, msr_public] {
        m.update(&(p.len() as u32).to_be_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn tag(k: &[u8; 32], sealed: &[u8; 16]) -> [u8; 16] {
    let mut m = HmacSha256::new_from_slice(&k[16..]).expect("HMAC takes any key length");
    m.update(b"itcp-token-tag");
    m.update(sealed);
    m.finalize().into_bytes()[..16]
        .try_into()
        .expect("16 bytes")
}

fn shared(secret: &Secret, public: &Public) -> Result<[u8; 32], OpenError> {
    let s = x25519_dalek::x25519(*secret, *public);
    if s == [0; 32] {
        return Err(OpenError::WeakKey);
    }
    Ok(s)
}

impl SealedToken {
    /// The MH's side: seals `token` for the MSR whose key share is `msr_public`, from
    /// the MH's address `mh`, with a fresh `secret`.
    pub fn seal(
        token: &Token,
        secret: &Secret,
        msr_public: &Public,
        mh: IpAddr,
    ) -> Result<SealedToken, OpenError> {
        let public = public_key(secret);
        let k = key(&shared(secret, msr_public)?, mh, &public, msr_public);
        let mut sealed = token.0;
        for (b, p) in sealed.iter_mut().zip(&k[..16]) {
            *b ^= p;
        }
        Ok(SealedToken {
            public,
            sealed,
            tag: tag(&k, &sealed),
        })
    }

    /// The MSR's side: the token, if this was sealed for our key share (`secret`) from
    /// address `mh`.
    pub fn open(&self, secret: &Secret, mh: IpAddr) -> Result<Token, OpenError> {
        let msr_public = public_key(secret);
        let k = key(
            &shared(secret, &self.public)?,
            mh,
            &self.public,
            &msr_public,
        );
        let want = tag(&k, &self.sealed);
        // Constant time: the tag is a secret until it matches.
        if want
            .iter()
            .zip(&self.tag)
            .fold(0u8, |a, (x, y)| a | (x ^ y))
            != 0
        {
            return Err(OpenError::BadTag);
        }
        let mut t = self.sealed;
        for (b, p) in t.iter_mut().zip(&k[..16]) {
            *b ^= p;
        }
        Ok(Token(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MH: &str = "10.2.0.100";

    #[test]
    fn the_msr_opens_what_the_mh_sealed_and_nothing_else() {
        let token = Token(*b"0123456789abcdef");
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let mh: IpAddr = MH.parse().unwrap();
        let s = SealedToken::seal(&token, &a, &public_key(&b), mh).unwrap();
        assert_ne!(s.sealed, token.0, "the token is not sent in clear");
        assert_eq!(s.open(&b, mh), Ok(token));
        // Another address, another MSR key share (a replay to a new handshake), or a
        // flipped bit: nothing opens.
        assert_eq!(
            s.open(&b, "10.2.0.101".parse().unwrap()),
            Err(OpenError::BadTag)
        );
        assert_eq!(s.open(&[3u8; 32], mh), Err(OpenError::BadTag));
        let mut bad = s;
        bad.sealed[0] ^= 1;
        assert_eq!(bad.open(&b, mh), Err(OpenError::BadTag));
        // IPv6 MHs too.
        let mh6: IpAddr = "2001:db8:2::100".parse().unwrap();
        let s6 = SealedToken::seal(&token, &a, &public_key(&b), mh6).unwrap();
        assert_eq!(s6.open(&b, mh6), Ok(token));
    }

    #[test]
    fn low_order_key_shares_are_refused() {
        let token = Token([9; 16]);
        assert_eq!(
            SealedToken::seal(&token, &[1; 32], &[0; 32], MH.parse().unwrap()),
            Err(OpenError::WeakKey)
        );
        let s = SealedToken {
            public: [0; 32],
            sealed: [0; 16],
            tag: [0; 16],
        };
        assert_eq!(
            s.open(&[2; 32], MH.parse().unwrap()),
            Err(OpenError::WeakKey)
        );
    }

    #[test]
    fn public_keys_match_rfc_7748() {
        // RFC 7748 §6.1, Alice's key pair.
        let a =
            crate::hex::unhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
                .unwrap();
        let pa =
            crate::hex::unhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
                .unwrap();
        assert_eq!(public_key(&a.try_into().unwrap()).to_vec(), pa);
    }
}
