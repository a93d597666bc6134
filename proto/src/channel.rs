//! MSR⇄MSR handoff messages on the wire, sans-IO.
//!
//! A frame is `"ITH2"` · u32 JSON length · u32 attachment length · JSON envelope ·
//! attachment · HMAC-SHA256 tag (32 bytes) over everything before it. The attachment
//! carries the socket images' bytes (megabytes of queued data travel as they are, not
//! as hex in JSON); the rest is the JSON envelope, keyed with the pre-shared key of the sending peer (peers are
//! listed in the config, each with its key). The envelope carries the sender, the
//! intended recipient, a per-sender sequence number and a timestamp: a receiver rejects
//! a frame whose tag does not verify (forged), whose sender it does not know, that is
//! addressed to someone else, whose sequence number it has already seen from that
//! sender (replayed) or whose timestamp is too far from its own clock (stale).
//!
//! The MH's greeting ([`crate::greeting`]) travels inside a handoff request.

use std::collections::HashMap;
use std::fmt;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::greeting::Greeting;

type HmacSha256 = Hmac<Sha256>;

pub const MAGIC: &[u8; 4] = b"ITH2";
/// Largest attachment accepted (the images' bytes).
pub const MAX_ATTACHMENT: usize = 1 << 31;
const TAG: usize = 32;
/// Largest envelope accepted (socket images carry queued bytes).
pub const MAX_ENVELOPE: usize = 256 << 20;

/// What one MSR says to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// New MSR → old MSR (paper step 4–5): the MH is here; send me its connections.
    HandoffRequest { handoff_id: u64, greeting: Greeting },
    /// Old MSR → new MSR (step 8): the frozen connections.
    Images {
        handoff_id: u64,
        images: Vec<ConnImage>,
        /// The MH's session token (hex), so the new MSR can check its next greeting.
        #[serde(default)]
        token: Option<String>,
    },
    /// New MSR → old MSR (step 10): restored and running; delete your copies.
    Ack {
        handoff_id: u64,
        restored: Vec<u64>,
        failed: Vec<(u64, String)>,
    },
    /// Either side: the handoff is off; the old MSR keeps (or resumes) serving.
    Abort { handoff_id: u64, reason: String },
}

/// One I-TCP connection's state, as shipped: its identity and the two socket images
/// (opaque bytes here; see [`crate::image`]), which travel in the frame's attachment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnImage {
    pub id: u64,
    pub kind: String,
    #[serde(skip)]
    pub wireless: Vec<u8>,
    /// Empty for a listener's control connection or a waiting ACCEPT.
    #[serde(skip)]
    pub fixed: Vec<u8>,
    /// Bytes the old MSR's relay had read from the wireless side and not yet written
    /// to the fixed side; the new MSR writes them first.
    #[serde(skip)]
    pub up_pending: Vec<u8>,
    /// The same, fixed side to wireless side.
    #[serde(skip)]
    pub down_pending: Vec<u8>,
    /// For a listener's control connection or a waiting ACCEPT (no fixed side): the
    /// MH's listening address, re-created at the new MSR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

/// The signed envelope of every MSR⇄MSR message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub from: String,
    pub to: String,
    pub seq: u64,
    pub ts_ms: u64,
    pub body: Message,
}

/// Why a frame was rejected. Each says who and what, for the handoff log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    BadMagic,
    TooLarge(usize),
    Malformed(String),
    UnknownPeer(String),
    /// The tag does not verify: forged or corrupted.
    BadTag {
        from: String,
    },
    WrongRecipient {
        from: String,
        to: String,
    },
    Replayed {
        from: String,
        seq: u64,
        last: u64,
    },
    Stale {
        from: String,
        skew_ms: i64,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic => f.write_str("not a handoff frame (bad magic)"),
            WireError::TooLarge(n) => write!(f, "frame of {n} bytes exceeds the limit"),
            WireError::Malformed(e) => write!(f, "malformed envelope: {e}"),
            WireError::UnknownPeer(p) => write!(f, "message from unknown peer {p:?}"),
            WireError::BadTag { from } => write!(
                f,
                "message claiming to be from {from:?} fails authentication (forged?)"
            ),
            WireError::WrongRecipient { from, to } => {
                write!(f, "message from {from:?} is addressed to {to:?}, not us")
            }
            WireError::Replayed { from, seq, last } => {
                write!(
                    f,
                    "replayed message from {from:?}: sequence {seq}, already saw {last}"
                )
            }
            WireError::Stale { from, skew_ms } => {
                write!(
                    f,
                    "message from {from:?} is {skew_ms} ms off our clock (stale or replayed)"
                )
            }
        }
    }
}

impl std::error::Error for WireError {}

/// The images' bytes, in order: per image, four length-prefixed fields.
fn attachment(body: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    if let Message::Images { images, .. } = body {
        let n: usize = images
            .iter()
            .map(|i| {
                16 + i.wireless.len() + i.fixed.len() + i.up_pending.len() + i.down_pending.len()
            })
            .sum();
        out.reserve(n);
        for i in images {
            for f in [&i.wireless, &i.fixed, &i.up_pending, &i.down_pending] {
                out.extend_from_slice(&(f.len() as u32).to_be_bytes());
                out.extend_from_slice(f);
            }
        }
    }
    out
}

/// Puts the attachment's bytes back into the images.
fn distribute(body: &mut Message, mut att: &[u8]) -> Result<(), WireError> {
    let bad = |what: &str| WireError::Malformed(format!("attachment: {what}"));
    if let Message::Images { images, .. } = body {
        for i in images.iter_mut() {
            for f in [
                &mut i.wireless,
                &mut i.fixed,
                &mut i.up_pending,
                &mut i.down_pending,
            ] {
                if att.len() < 4 {
                    return Err(bad("truncated"));
                }
                let n = u32::from_be_bytes(att[..4].try_into().unwrap()) as usize;
                att = &att[4..];
                if att.len() < n {
                    return Err(bad("truncated"));
                }
                *f = att[..n].to_vec();
                att = &att[n..];
            }
        }
    }
    if !att.is_empty() {
        return Err(bad("bytes left over"));
    }
    Ok(())
}

/// Seals an envelope with `key` into a frame.
pub fn seal(env: &Envelope, key: &[u8]) -> Vec<u8> {
    let body = serde_json::to_vec(env).expect("envelopes serialize");
    let att = attachment(&env.body);
    let mut out = Vec::with_capacity(12 + body.len() + att.len() + TAG);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&(att.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&att);
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(&out);
    out.extend_from_slice(&m.finalize().into_bytes());
    out
}

/// Length of the complete frame at the start of `buf`, once its header is in.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, WireError> {
    if buf.len() < 12 {
        return Ok(None);
    }
    if &buf[..4] != MAGIC {
        return Err(WireError::BadMagic);
    }
    let n = u32::from_be_bytes(buf[4..8].try_into().unwrap()) as usize;
    let a = u32::from_be_bytes(buf[8..12].try_into().unwrap()) as usize;
    if n > MAX_ENVELOPE || a > MAX_ATTACHMENT {
        return Err(WireError::TooLarge(n + a));
    }
    Ok(Some(12 + n + a + TAG))
}

/// Replay protection of a receiver: the last sequence number seen per sender, and how
/// far a sender's clock may be from ours.
#[derive(Debug, Clone)]
pub struct ReplayGuard {
    me: String,
    last: HashMap<String, u64>,
    pub max_skew_ms: u64,
}

impl ReplayGuard {
    pub fn new(me: &str) -> Self {
        Self {
            me: me.into(),
            last: HashMap::new(),
            max_skew_ms: 30_000,
        }
    }
}

/// Opens the frame at the start of `buf`: Ok(None) until it is complete; otherwise the
/// authenticated envelope and the bytes it took. `key_of` gives a peer's key.
pub fn open(
    buf: &[u8],
    key_of: impl Fn(&str) -> Option<Vec<u8>>,
    guard: &mut ReplayGuard,
    now_ms: u64,
) -> Result<Option<(Envelope, usize)>, WireError> {
    let Some(total) = frame_len(buf)? else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let (signed, tag) = buf[..total].split_at(total - TAG);
    let n = u32::from_be_bytes(signed[4..8].try_into().unwrap()) as usize;
    let mut env: Envelope = serde_json::from_slice(&signed[12..12 + n])
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    let key = key_of(&env.from).ok_or_else(|| WireError::UnknownPeer(env.from.clone()))?;
    let mut m = HmacSha256::new_from_slice(&key).expect("HMAC takes any key length");
    m.update(signed);
    m.verify_slice(tag).map_err(|_| WireError::BadTag {
        from: env.from.clone(),
    })?;
    distribute(&mut env.body, &signed[12 + n..])?;
    if env.to != guard.me {
        return Err(WireError::WrongRecipient {
            from: env.from,
            to: env.to,
        });
    }
    // Fuzzing fix: `ts_ms as i64 - now_ms as i64` overflowed (a panic with overflow
    // checks) and, wrapped, took timestamps 2^64 away from the clock for fresh ones.
    // The difference of two u64s always fits an i128; the message saturates to i64.
    let skew = i128::from(env.ts_ms) - i128::from(now_ms);
    if skew.unsigned_abs() > u128::from(guard.max_skew_ms) {
        let skew = skew.clamp(i64::MIN.into(), i64::MAX.into()) as i64;
        return Err(WireError::Stale {
            from: env.from,
            skew_ms: skew,
        });
    }
    let last = guard.last.get(&env.from).copied().unwrap_or(0);
    if env.seq <= last {
        return Err(WireError::Replayed {
            from: env.from,
            seq: env.seq,
            last,
        });
    }
    guard.last.insert(env.from.clone(), env.seq);
    Ok(Some((env, total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &[u8] = b"psk shared by msr1 and msr2";

    fn env(seq: u64, ts: u64) -> Envelope {
        Envelope {
            from: "msr2".into(),
            to: "msr1".into(),
            seq,
            ts_ms: ts,
            body: Message::Abort {
                handoff_id: 7,
                reason: "test".into(),
            },
        }
    }

    fn keys(p: &str) -> Option<Vec<u8>> {
        (p == "msr2").then(|| K1.to_vec())
    }

    #[test]
    fn seal_open_round_trip_and_incomplete() {
        let f = seal(&env(1, 1000), K1);
        let mut g = ReplayGuard::new("msr1");
        for cut in [0, 3, 8, f.len() - 1] {
            assert_eq!(open(&f[..cut], keys, &mut g, 1000).unwrap(), None);
        }
        let (e, n) = open(&f, keys, &mut g, 1000).unwrap().unwrap();
        assert_eq!((e, n), (env(1, 1000), f.len()));
    }

    #[test]
    fn forged_replayed_stale_and_misaddressed_frames_are_rejected() {
        let mut g = ReplayGuard::new("msr1");
        // Forged: wrong key, or a flipped byte in the body.
        let forged = seal(&env(1, 1000), b"guessed key");
        assert!(matches!(
            open(&forged, keys, &mut g, 1000),
            Err(WireError::BadTag { .. })
        ));
        let mut flipped = seal(&env(1, 1000), K1);
        flipped[20] ^= 1;
        assert!(open(&flipped, keys, &mut g, 1000).is_err());
        // Replayed: the same frame twice.
        let f = seal(&env(5, 1000), K1);
        open(&f, keys, &mut g, 1000).unwrap().unwrap();
        let e = open(&f, keys, &mut g, 1000).unwrap_err();
        assert_eq!(
            e.to_string(),
            "replayed message from \"msr2\": sequence 5, already saw 5"
        );
        // Stale.
        let old = seal(&env(6, 1000), K1);
        assert!(matches!(
            open(&old, keys, &mut g, 100_000),
            Err(WireError::Stale { .. })
        ));
        // Unknown peer and wrong recipient.
        let mut e = env(7, 1000);
        e.from = "mallory".into();
        assert_eq!(
            open(&seal(&e, K1), keys, &mut g, 1000).unwrap_err(),
            WireError::UnknownPeer("mallory".into())
        );
        let mut e = env(8, 1000);
        e.to = "msr3".into();
        assert!(matches!(
            open(&seal(&e, K1), keys, &mut g, 1000),
            Err(WireError::WrongRecipient { .. })
        ));
        assert_eq!(
            open(b"GET / HTTP/1.1\r\n", keys, &mut g, 0).unwrap_err(),
            WireError::BadMagic
        );
    }

    /// Fuzzing finding (`channel_frame`, `fuzz/corpus/channel_frame/regression-*`): the
    /// skew was computed as `ts as i64 - now as i64`, which overflows (a panic with
    /// overflow checks) and, wrapped, accepted timestamps about 2^64 ms away from the
    /// receiver's clock.
    #[test]
    fn skew_at_the_ends_of_the_clock() {
        let mut g = ReplayGuard::new("msr1");
        // ts ≈ -1 as i64 near a clock of 1000: wrapping made it 1001 ms off.
        let f = seal(&env(1, u64::MAX), K1);
        assert!(matches!(
            open(&f, keys, &mut g, 1000),
            Err(WireError::Stale {
                skew_ms: i64::MAX,
                ..
            })
        ));
        // now as i64 = i64::MIN: the subtraction overflowed.
        let f = seal(&env(2, 5), K1);
        assert!(matches!(
            open(&f, keys, &mut g, 1 << 63),
            Err(WireError::Stale { skew_ms, .. }) if skew_ms == i64::MIN + 5
        ));
        let f = seal(&env(3, 0), K1);
        assert!(matches!(
            open(&f, keys, &mut g, u64::MAX),
            Err(WireError::Stale { .. })
        ));
        // Within the skew at both ends of the clock: accepted.
        let f = seal(&env(4, u64::MAX - 5), K1);
        assert!(open(&f, keys, &mut g, u64::MAX).unwrap().is_some());
        let f = seal(&env(5, 29_000), K1);
        assert!(open(&f, keys, &mut g, 0).unwrap().is_some());
    }

    #[test]
    fn images_travel_in_the_attachment() {
        let key = b"0123456789abcdef";
        let img = |id: u64, n: usize| ConnImage {
            id,
            kind: "connect".into(),
            wireless: vec![id as u8; n],
            fixed: vec![7; n / 2],
            up_pending: vec![1, 2, 3],
            down_pending: vec![],
            listen: None,
        };
        let env = Envelope {
            from: "msr1".into(),
            to: "msr2".into(),
            seq: 1,
            ts_ms: 1000,
            body: Message::Images {
                handoff_id: 3,
                images: vec![img(1, 100_000), img(2, 0)],
                token: None,
            },
        };
        let frame = seal(&env, key);
        // Bytes are not hex-encoded into the JSON.
        assert!(frame.len() < 160_000, "{}", frame.len());
        let mut g = ReplayGuard::new("msr2");
        let (got, n) = open(&frame, |_| Some(key.to_vec()), &mut g, 1000)
            .unwrap()
            .unwrap();
        assert_eq!(n, frame.len());
        assert_eq!(got, env);
        // A flipped attachment byte fails authentication.
        let mut bad = frame.clone();
        let mid = bad.len() - 1000;
        bad[mid] ^= 1;
        let mut g = ReplayGuard::new("msr2");
        assert!(matches!(
            open(&bad, |_| Some(key.to_vec()), &mut g, 1000),
            Err(WireError::BadTag { .. })
        ));
    }
}
