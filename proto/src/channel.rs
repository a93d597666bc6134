//! MSR⇄MSR channel frames, sans-IO: authenticated before anything is parsed.
//!
//! A channel is one TCP connection; its peers share a pre-shared key (configured per
//! peer pair). It opens with a challenge-response, so a frame is bound to the
//! connection it was sent on and nothing recorded can be replayed:
//!
//! | step | bytes | size |
//! |---|---|---|
//! | acceptor → connector: challenge | `"ITC3"` · nonce_a (16) | 20 |
//! | connector → acceptor: hello | `"ITC3"` · len · from · len · to · nonce_c (16) · tag (32) | ≤ 182 |
//! | either way: frame | header · envelope (JSON) · attachment · body tag (32) | ≤ caps |
//!
//! The hello's tag is HMAC-SHA256(key(from), "itcp-hello" · nonce_a · from · to · nonce_c):
//! only a peer holding the pair's key can make it, and it covers the acceptor's fresh
//! nonce. A frame header is `"ITF3"` · seq (u64) · envelope length (u32) · attachment
//! length (u32) · header tag (32), with the tag over the receiver's nonce, the sender's
//! id, the sequence number and both lengths: the receiver checks it *before* it
//! allocates or reads a byte of the body, so an unauthenticated peer can make it hold
//! at most one header (52 bytes), and one that knows no key never gets past the 182
//! bytes of a hello. The body tag covers the header and the whole body. Sequence
//! numbers count up from 1 in each direction of each channel: a frame replayed,
//! dropped or reordered within a channel fails, and one from another channel fails its
//! tag (other nonce).
//!
//! The envelope is JSON ([`Message`]); socket images' bytes travel as the attachment
//! (megabytes of queued data as they are, not as hex in JSON).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::greeting::Greeting;

type HmacSha256 = Hmac<Sha256>;

/// Opens the challenge and the hello.
pub const HELLO_MAGIC: &[u8; 4] = b"ITC3";
/// Opens every frame header.
pub const FRAME_MAGIC: &[u8; 4] = b"ITF3";
/// Size of a nonce.
pub const NONCE: usize = 16;
/// Size of a tag (HMAC-SHA256).
pub const TAG: usize = 32;
/// The challenge's size.
pub const CHALLENGE: usize = 4 + NONCE;
/// Longest MSR id in a hello.
pub const MAX_ID: usize = 64;
/// Largest hello.
pub const MAX_HELLO: usize = 4 + 1 + MAX_ID + 1 + MAX_ID + NONCE + TAG;
/// A frame header's size.
pub const HEADER: usize = 4 + 8 + 4 + 4 + TAG;
/// Largest envelope accepted (JSON without the images' bytes: ~100 bytes per
/// connection, so 16 MiB is far beyond 100k connections).
pub const MAX_ENVELOPE: usize = 16 << 20;
/// Largest attachment accepted (the images' bytes), from an authenticated peer.
pub const MAX_ATTACHMENT: usize = (1 << 31) - 1;

/// What one MSR says to another.
///
/// Fields a peer does not know are ignored, so MSRs can be upgraded one at a time: a
/// newer msrd's optional fields (absent, they mean what an older msrd does) do not
/// make an older one refuse its messages, which only an authenticated peer can send.
/// An unknown message `type` is still refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// New MSR → old MSR (paper step 4–5): the MH is here; send me its connections.
    /// `parts`: the new MSR takes the images in parts ([`Message::ImagesPart`]), so
    /// the old MSR may send each as soon as it is captured (an older peer leaves the
    /// field out and gets them in one message).
    HandoffRequest {
        handoff_id: u64,
        greeting: Greeting,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        parts: bool,
    },
    /// New MSR → each peer (network detection, no greeting): MH `mh` appeared in my
    /// cell sending from link-layer address `mac` (`xx:xx:…`). The peer serving it
    /// hands its connections over (`Accepted`, as for a greeting) only if `mac` is the
    /// address bound to `mh` there; one that serves nothing of it answers `NotHere`.
    Detected {
        handoff_id: u64,
        mh: IpAddr,
        mac: String,
        /// As in `HandoffRequest`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        parts: bool,
    },
    /// New MSR → each peer (network detection): a station with link-layer address
    /// `mac` appeared in my cell sending from no address it proves (an IPv6
    /// link-local or unspecified source, DHCP, an ARP probe), as a host's OS does
    /// at once on link-up. The peer answers `Addresses`; the new MSR then asks for
    /// each address with `Detected`. An older peer refuses the message: it is asked
    /// only by the address the MH sends from next, as before.
    Station { handoff_id: u64, mac: String },
    /// Peer → new MSR, answering `Station`: the MH addresses it serves that are bound
    /// to that link-layer address (none if it serves no such MH).
    Addresses { handoff_id: u64, mhs: Vec<IpAddr> },
    /// Peer → new MSR: no connection of that MH here (an idle MH's presence here,
    /// if any, ends: it is in the other cell now).
    NotHere { handoff_id: u64 },
    /// Old MSR → new MSR, answering a greeting: nothing of the MH is here any more,
    /// its connections left for peer `to` after this greeting's MH had moved on (a
    /// pull a channel outage held up). Nothing changes here; the new MSR asks `to`
    /// with the same greeting, which `to` accepts although it names this MSR.
    MovedOn { handoff_id: u64, to: String },
    /// Old MSR → new MSR: the greeting's proof verified; the old MSR freezes now, so
    /// the new MSR may hold the MH's flows and let it send (nothing is held for an
    /// unproven greeting). `token` is the MH's session token (hex), so the new MSR can
    /// tag its replies to the MH from the start. `also_at`: the MH's other
    /// connections left here for that peer after the MH had moved on (a pull the
    /// channel held up): the new MSR pulls them from there next, with the same
    /// greeting.
    Accepted {
        handoff_id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        also_at: Option<String>,
    },
    /// New MSR → old MSR, after `Accepted`: the MH's flows are held here now, so the
    /// old MSR may send on the packets it holds of the frozen connections at once:
    /// they wait here and reach the sockets when they restart, before anything the
    /// FH sends here after the takeover.
    Holding { handoff_id: u64 },
    /// Old MSR → new MSR, before `Images`, only if the request said `parts`: some of
    /// the frozen connections, sent while the rest are still being captured, so the
    /// new MSR restores them (in repair mode: nothing is sent) while they come. They
    /// belong to the handoff's `Images`, which follows with the rest; a handoff called
    /// off before it discards them with the others.
    ImagesPart {
        handoff_id: u64,
        images: Vec<ConnImage>,
    },
    /// Old MSR → new MSR (step 8): the frozen connections (those not sent ahead in
    /// `ImagesPart`s).
    Images {
        handoff_id: u64,
        images: Vec<ConnImage>,
        /// The MH's session token (hex), so the new MSR can check its next greeting.
        #[serde(default)]
        token: Option<String>,
        /// The MH's connections that closed here lately: their TIME_WAIT and closing
        /// states stay here, so the new MSR drops their stray segments silently.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        closed: Vec<ClosedFlow>,
        /// Flows of the MH's connections that stay here (they could not be captured):
        /// the new MSR drops their segments silently, answering none (each `age_ms` 0).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        staying: Vec<ClosedFlow>,
        /// The link-layer address bound to the MH at the old MSR (network detection),
        /// so a later detected move is checked against it at the new MSR.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<String>,
    },
    /// New MSR → old MSR (step 10): `restored` are running here (restored *and*
    /// restarted): delete your copies; `failed` did not resume here (with the reason):
    /// keep them.
    Ack {
        handoff_id: u64,
        restored: Vec<u64>,
        failed: Vec<(u64, String)>,
    },
    /// Either side: the handoff is off; the old MSR keeps (or resumes) serving.
    Abort { handoff_id: u64, reason: String },
}

/// A TCP flow of the MH that closed at the old MSR `age_ms` ago: `mh` is the MH's end
/// (its address as the FH or the MSR sees it), `peer` the other end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedFlow {
    pub mh: SocketAddr,
    pub peer: SocketAddr,
    pub age_ms: u64,
}

/// One I-TCP connection's state, as shipped: its identity and the two socket images
/// (opaque bytes here; see [`crate::image`]), which travel in the frame's attachment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// For a request handshake (`handshake`) whose MSR sent its key share: the share's
    /// X25519 secret (hex), so the new MSR's replay sends the same share and opens the
    /// MH's sealed token. A secret: it travels only inside the channel's encryption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kx: Option<String>,
    /// For a connection whose handshake the old MSR completed by replaying the MH's
    /// ACK: the SYN-ACK it had sent (hex, IP header on), which the new MSR sends again
    /// if the MH retransmits its SYN (that SYN-ACK was lost instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synack: Option<String>,
    /// Milliseconds since an MSR last received data from the MH on this connection, at
    /// its capture: how long the MH's TCP may have been retransmitting into the move
    /// (the new MSR tells it they were lost: `itcp_handoff::backoff`). Carried across
    /// moves: a connection that reached the old MSR in a move and got no data there
    /// since counts from the data its previous MSR last saw. None when no MSR has seen
    /// data from the MH on it: its socket may not even be connected (a handshake the
    /// MSR completed by replaying the MH's ACK), and an ICMP unreachable aborts a
    /// connecting socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_idle_ms: Option<u32>,
    /// When the connection was opened, µs since the UNIX epoch, and the bytes relayed
    /// so far each way: the new MSR's session table continues them (an operator sees
    /// the connection's age and totals, not the time since its last move). Zero from
    /// an msrd that does not send them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub started_us: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_up: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_down: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why a channel's bytes were rejected. Each says who and what, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    BadMagic,
    TooLarge(usize),
    Malformed(String),
    UnknownPeer(String),
    /// A tag does not verify: forged, corrupted, replayed from another channel.
    BadTag {
        from: String,
    },
    WrongRecipient {
        from: String,
        to: String,
    },
    /// A frame out of order within its channel (replayed or dropped).
    OutOfOrder {
        from: String,
        seq: u64,
        expected: u64,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic => f.write_str("not an I-TCP channel (bad magic)"),
            WireError::TooLarge(n) => write!(f, "frame of {n} bytes exceeds the limit"),
            WireError::Malformed(e) => write!(f, "malformed: {e}"),
            WireError::UnknownPeer(p) => write!(f, "hello from unknown peer {p:?}"),
            WireError::BadTag { from } => write!(
                f,
                "bytes claiming to be from {from:?} fail authentication (forged or replayed?)"
            ),
            WireError::WrongRecipient { from, to } => {
                write!(f, "hello from {from:?} is addressed to {to:?}, not us")
            }
            WireError::OutOfOrder {
                from,
                seq,
                expected,
            } => write!(
                f,
                "frame from {from:?} out of order: sequence {seq}, expected {expected} (replayed?)"
            ),
        }
    }
}

impl std::error::Error for WireError {}

/// The images' bytes, in order: per image, four length-prefixed fields.
/// The images' byte fields in attachment order (each goes length-prefixed).
fn attached_fields(body: &Message) -> impl Iterator<Item = &[u8]> {
    let images = match body {
        Message::Images { images, .. } | Message::ImagesPart { images, .. } => &images[..],
        _ => &[],
    };
    images
        .iter()
        .flat_map(|i| [&i.wireless, &i.fixed, &i.up_pending, &i.down_pending].map(|f| &f[..]))
}

fn attachment_len(body: &Message) -> usize {
    attached_fields(body).map(|f| 4 + f.len()).sum()
}

fn attachment(body: &Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(attachment_len(body));
    for f in attached_fields(body) {
        out.extend_from_slice(&(f.len() as u32).to_be_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// Image fields at least this long are written from where they are, not copied into
/// the frame ([`Session::seal_pieces`]).
const BORROW_MIN: usize = 16 << 10;

/// A piece of a frame: bytes made for it, or an image's bytes as they are.
pub enum Piece<'a> {
    Owned(Vec<u8>),
    Borrowed(&'a [u8]),
}

impl Piece<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Piece::Owned(v) => v,
            Piece::Borrowed(b) => b,
        }
    }
}

/// Puts the attachment's bytes back into the images.
fn distribute(body: &mut Message, mut att: &[u8]) -> Result<(), WireError> {
    let bad = |what: &str| WireError::Malformed(format!("attachment: {what}"));
    if let Message::Images { images, .. } | Message::ImagesPart { images, .. } = body {
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

fn mac(key: &[u8], label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(label);
    for p in parts {
        m.update(&(p.len() as u32).to_be_bytes());
        m.update(p);
    }
    m
}

/// The body tag's MAC: over the receiver's nonce, the header and the body, without
/// copying megabytes of images into one buffer first.
fn body_mac(key: &[u8], nonce: &[u8; NONCE], header: &[u8], body: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(b"itcp-body");
    m.update(nonce);
    m.update(header);
    m.update(body);
    m
}

/// Pre-shared-key channels: encrypts (or decrypts) a frame's body, envelope and
/// attachment, with ChaCha20 under a key of its own, HMAC(key, "itcp-body-key" · nonce ·
/// seq): each frame of each channel has its own nonce and sequence number, so no key is
/// used twice and the cipher's nonce can be zero.
fn body_keystream(key: &[u8], nonce: &[u8; NONCE], seq: u64, buf: &mut [u8]) {
    use chacha20::cipher::{KeyIvInit, StreamCipher};
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(b"itcp-body-key");
    m.update(nonce);
    m.update(&seq.to_be_bytes());
    let k = m.finalize().into_bytes();
    chacha20::ChaCha20::new(&k, &[0u8; 12].into()).apply_keystream(buf);
}

/// The acceptor's first bytes on a new channel.
pub fn challenge(nonce: &[u8; NONCE]) -> [u8; CHALLENGE] {
    let mut out = [0u8; CHALLENGE];
    out[..4].copy_from_slice(HELLO_MAGIC);
    out[4..].copy_from_slice(nonce);
    out
}

/// The acceptor's nonce from a complete challenge.
pub fn parse_challenge(b: &[u8; CHALLENGE]) -> Result<[u8; NONCE], WireError> {
    if &b[..4] != HELLO_MAGIC {
        return Err(WireError::BadMagic);
    }
    Ok(b[4..].try_into().expect("16 bytes"))
}

/// One authenticated channel's state: who the peer is, the key, both nonces and both
/// sequence counters.
#[derive(Clone)]
pub struct Session {
    me: String,
    peer: String,
    /// None when the transport authenticates, encrypts and orders the frames (mutual
    /// TLS): frames then carry zero tags, which nobody checks.
    key: Option<Vec<u8>>,
    /// The nonce our frames are bound to (the peer's).
    send_nonce: [u8; NONCE],
    /// The nonce the peer's frames are bound to (ours).
    recv_nonce: [u8; NONCE],
    send_seq: u64,
    recv_seq: u64,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Session({} ⇄ {})", self.me, self.peer)
    }
}

/// The connector's side: the hello to send and the session it opens.
pub fn hello(
    me: &str,
    peer: &str,
    key: &[u8],
    challenge_nonce: &[u8; NONCE],
    my_nonce: &[u8; NONCE],
) -> (Vec<u8>, Session) {
    assert!(
        me.len() <= MAX_ID && peer.len() <= MAX_ID,
        "MSR ids are at most 64 bytes"
    );
    let mut out = Vec::with_capacity(MAX_HELLO);
    out.extend_from_slice(HELLO_MAGIC);
    out.push(me.len() as u8);
    out.extend_from_slice(me.as_bytes());
    out.push(peer.len() as u8);
    out.extend_from_slice(peer.as_bytes());
    out.extend_from_slice(my_nonce);
    let tag = mac(
        key,
        b"itcp-hello",
        &[challenge_nonce, me.as_bytes(), peer.as_bytes(), my_nonce],
    )
    .finalize()
    .into_bytes();
    out.extend_from_slice(&tag);
    let s = Session {
        me: me.into(),
        peer: peer.into(),
        key: Some(key.to_vec()),
        send_nonce: *challenge_nonce,
        recv_nonce: *my_nonce,
        send_seq: 0,
        recv_seq: 0,
    };
    (out, s)
}

/// The start of a hello: magic, sender and recipient ids; Ok(None): need more bytes.
fn hello_ids(buf: &[u8]) -> Result<Option<(String, String, usize)>, WireError> {
    let take = |at: usize, n: usize| buf.get(at..at + n);
    let Some(magic) = take(0, 4) else {
        return if HELLO_MAGIC.starts_with(buf) {
            Ok(None)
        } else {
            Err(WireError::BadMagic)
        };
    };
    if magic != HELLO_MAGIC {
        return Err(WireError::BadMagic);
    }
    let id = |at: usize| -> Result<Option<(String, usize)>, WireError> {
        let Some(&n) = buf.get(at) else {
            return Ok(None);
        };
        let n = n as usize;
        if n == 0 || n > MAX_ID {
            return Err(WireError::Malformed(format!("MSR id of {n} bytes")));
        }
        let Some(b) = take(at + 1, n) else {
            return Ok(None);
        };
        let s = std::str::from_utf8(b)
            .map_err(|_| WireError::Malformed("MSR id is not UTF-8".into()))?;
        Ok(Some((s.to_string(), at + 1 + n)))
    };
    let Some((from, at)) = id(4)? else {
        return Ok(None);
    };
    let Some((to, at)) = id(at)? else {
        return Ok(None);
    };
    Ok(Some((from, to, at)))
}

/// Over mutual TLS the connector only says who it is and whom it wants, `"ITC3"` · len
/// · from · len · to (the acceptor checks the certificate names `from`).
pub fn tls_hello(me: &str, peer: &str) -> Vec<u8> {
    assert!(
        me.len() <= MAX_ID && peer.len() <= MAX_ID,
        "MSR ids are at most 64 bytes"
    );
    let mut out = Vec::with_capacity(4 + 2 + me.len() + peer.len());
    out.extend_from_slice(HELLO_MAGIC);
    out.push(me.len() as u8);
    out.extend_from_slice(me.as_bytes());
    out.push(peer.len() as u8);
    out.extend_from_slice(peer.as_bytes());
    out
}

/// The acceptor's side of [`tls_hello`]: the sender's claimed id and the hello's
/// length (Ok(None): need more; never more than [`MAX_HELLO`] bytes). The caller must
/// check the peer's certificate for that id before it trusts it.
pub fn open_tls_hello(buf: &[u8], me: &str) -> Result<Option<(String, usize)>, WireError> {
    let Some((from, to, at)) = hello_ids(buf)? else {
        return Ok(None);
    };
    if to != me {
        return Err(WireError::WrongRecipient { from, to });
    }
    Ok(Some((from, at)))
}

/// The acceptor's side: checks the hello at the start of `buf` (Ok(None): need more;
/// never more than [`MAX_HELLO`] bytes) against our challenge `nonce`, and opens the
/// session with the peer it authenticates. `key_of` gives a peer's key.
pub fn open_hello(
    buf: &[u8],
    me: &str,
    key_of: impl Fn(&str) -> Option<Vec<u8>>,
    nonce: &[u8; NONCE],
) -> Result<Option<(Session, usize)>, WireError> {
    let take = |at: usize, n: usize| buf.get(at..at + n);
    let Some((from, to, at)) = hello_ids(buf)? else {
        return Ok(None);
    };
    let (Some(theirs), Some(tag)) = (take(at, NONCE), take(at + NONCE, TAG)) else {
        return Ok(None);
    };
    let key = key_of(&from).ok_or_else(|| WireError::UnknownPeer(from.clone()))?;
    mac(
        &key,
        b"itcp-hello",
        &[nonce, from.as_bytes(), to.as_bytes(), theirs],
    )
    .verify_slice(tag)
    .map_err(|_| WireError::BadTag { from: from.clone() })?;
    if to != me {
        return Err(WireError::WrongRecipient { from, to });
    }
    let s = Session {
        me: me.into(),
        peer: from,
        key: Some(key),
        send_nonce: theirs.try_into().expect("16 bytes"),
        recv_nonce: *nonce,
        send_seq: 0,
        recv_seq: 0,
    };
    Ok(Some((s, at + NONCE + TAG)))
}

/// What a checked header announces: how many body bytes follow (tag included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announced {
    seq: u64,
    envelope: usize,
    attachment: usize,
}

impl Announced {
    /// Bytes to read after the header: envelope, attachment and body tag.
    pub fn body_len(&self) -> usize {
        self.envelope + self.attachment + TAG
    }
}

impl Session {
    /// A session inside mutual TLS with `peer`, whose certificate the caller verified:
    /// TLS authenticates, encrypts and orders the frames, so they carry no tags.
    pub fn over_tls(me: &str, peer: &str) -> Session {
        Session {
            me: me.into(),
            peer: peer.into(),
            key: None,
            send_nonce: [0; NONCE],
            recv_nonce: [0; NONCE],
            send_seq: 0,
            recv_seq: 0,
        }
    }

    /// The authenticated peer's MSR id.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    fn header_mac(key: &[u8], nonce: &[u8; NONCE], from: &str, fixed: &[u8]) -> HmacSha256 {
        mac(key, b"itcp-header", &[nonce, from.as_bytes(), fixed])
    }

    /// Seals `body` into a frame for the peer.
    pub fn seal(&mut self, body: &Message) -> Vec<u8> {
        let env = serde_json::to_vec(body).expect("messages serialize");
        let att = attachment(body);
        self.seal_raw(&env, &att)
    }

    /// Seals `body` into pieces to write in order; their concatenation is the frame
    /// [`Session::seal`] makes. Over TLS the images' queues (tens of MB with many
    /// connections) are borrowed, not copied twice into one fresh buffer first (~75 ms
    /// for 47 MB on the lab's 2 cores); with a pre-shared key the body is encrypted, so
    /// it is one piece.
    pub fn seal_pieces<'a>(&mut self, body: &'a Message) -> Vec<Piece<'a>> {
        if self.key.is_some() {
            return vec![Piece::Owned(self.seal(body))];
        }
        let env = serde_json::to_vec(body).expect("messages serialize");
        let mut cur = self.frame_start(env.len(), attachment_len(body));
        cur.extend_from_slice(&[0; TAG]);
        cur.extend_from_slice(&env);
        let mut pieces = Vec::new();
        for f in attached_fields(body) {
            cur.extend_from_slice(&(f.len() as u32).to_be_bytes());
            if f.len() < BORROW_MIN {
                cur.extend_from_slice(f);
            } else {
                pieces.push(Piece::Owned(std::mem::take(&mut cur)));
                pieces.push(Piece::Borrowed(f));
            }
        }
        cur.extend_from_slice(&[0; TAG]);
        pieces.push(Piece::Owned(cur));
        pieces
    }

    /// The next frame's header up to its tag: magic, sequence number, lengths.
    fn frame_start(&mut self, env: usize, att: usize) -> Vec<u8> {
        self.send_seq += 1;
        let mut out = Vec::with_capacity(HEADER + env + att.min(BORROW_MIN) + TAG);
        out.extend_from_slice(FRAME_MAGIC);
        out.extend_from_slice(&self.send_seq.to_be_bytes());
        out.extend_from_slice(&(env as u32).to_be_bytes());
        out.extend_from_slice(&(att as u32).to_be_bytes());
        out
    }

    /// Seals any envelope bytes and attachment (fuzzing reaches the parsers behind the
    /// tags with it). Not part of the API.
    #[doc(hidden)]
    pub fn seal_raw(&mut self, env: &[u8], att: &[u8]) -> Vec<u8> {
        let mut out = self.frame_start(env.len(), att.len());
        out.reserve(env.len() + att.len() + 2 * TAG);
        let Some(key) = &self.key else {
            out.extend_from_slice(&[0; TAG]);
            out.extend_from_slice(env);
            out.extend_from_slice(att);
            out.extend_from_slice(&[0; TAG]);
            return out;
        };
        let htag = Self::header_mac(key, &self.send_nonce, &self.me, &out)
            .finalize()
            .into_bytes();
        out.extend_from_slice(&htag);
        // The envelope carries secrets (the MH's token, handshakes' key-share secrets)
        // and the attachment users' bytes: encrypted, then authenticated.
        let at = out.len();
        out.extend_from_slice(env);
        out.extend_from_slice(att);
        body_keystream(key, &self.send_nonce, self.send_seq, &mut out[at..]);
        let (h, rest) = out.split_at(HEADER);
        let tag = body_mac(key, &self.send_nonce, h, rest)
            .finalize()
            .into_bytes();
        out.extend_from_slice(&tag);
        out
    }

    /// Checks a frame header before any of its body is read: its tag (bound to this
    /// channel), its sequence number and the lengths' caps.
    pub fn check_header(&self, h: &[u8; HEADER]) -> Result<Announced, WireError> {
        if &h[..4] != FRAME_MAGIC {
            return Err(WireError::BadMagic);
        }
        if let Some(key) = &self.key {
            let (fixed, tag) = h.split_at(HEADER - TAG);
            Self::header_mac(key, &self.recv_nonce, &self.peer, fixed)
                .verify_slice(tag)
                .map_err(|_| WireError::BadTag {
                    from: self.peer.clone(),
                })?;
        }
        let seq = u64::from_be_bytes(h[4..12].try_into().unwrap());
        let envelope = u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize;
        let attachment = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        if seq != self.recv_seq + 1 {
            return Err(WireError::OutOfOrder {
                from: self.peer.clone(),
                seq,
                expected: self.recv_seq + 1,
            });
        }
        if envelope > MAX_ENVELOPE || attachment > MAX_ATTACHMENT {
            return Err(WireError::TooLarge(envelope + attachment));
        }
        Ok(Announced {
            seq,
            envelope,
            attachment,
        })
    }

    /// Opens a frame's body (exactly [`Announced::body_len`] bytes) after its header
    /// passed [`Session::check_header`].
    pub fn open_body(
        &mut self,
        h: &[u8; HEADER],
        a: Announced,
        body: &[u8],
    ) -> Result<Message, WireError> {
        if body.len() != a.body_len() {
            return Err(WireError::Malformed(format!(
                "body of {} bytes, header announced {}",
                body.len(),
                a.body_len()
            )));
        }
        let (signed, tag) = body.split_at(body.len() - TAG);
        if let Some(key) = &self.key {
            body_mac(key, &self.recv_nonce, h, signed)
                .verify_slice(tag)
                .map_err(|_| WireError::BadTag {
                    from: self.peer.clone(),
                })?;
        }
        self.recv_seq = a.seq;
        let mut plain;
        let signed = match &self.key {
            Some(key) => {
                plain = signed.to_vec();
                body_keystream(key, &self.recv_nonce, a.seq, &mut plain);
                &plain[..]
            }
            None => signed,
        };
        let mut msg: Message = serde_json::from_slice(&signed[..a.envelope])
            .map_err(|e| WireError::Malformed(e.to_string()))?;
        distribute(&mut msg, &signed[a.envelope..])?;
        Ok(msg)
    }

    /// Opens the frame at the start of `buf` (for callers that hold whole frames):
    /// Ok(None) until it is complete.
    pub fn open(&mut self, buf: &[u8]) -> Result<Option<(Message, usize)>, WireError> {
        let Some(h) = buf.get(..HEADER) else {
            return Ok(None);
        };
        let h: &[u8; HEADER] = h.try_into().unwrap();
        let a = self.check_header(h)?;
        let Some(body) = buf.get(HEADER..HEADER + a.body_len()) else {
            return Ok(None);
        };
        let m = self.open_body(h, a, body)?;
        Ok(Some((m, HEADER + a.body_len())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &[u8] = b"psk shared by msr1 and msr2";

    fn keys(p: &str) -> Option<Vec<u8>> {
        (p == "msr2").then(|| K.to_vec())
    }

    /// A channel msr2 → msr1 (msr2 connects, msr1 accepts).
    fn pair() -> (Session, Session) {
        let na = [1u8; NONCE];
        let ch = challenge(&na);
        let nonce = parse_challenge(&ch).unwrap();
        let (h, client) = hello("msr2", "msr1", K, &nonce, &[2; NONCE]);
        let (server, n) = open_hello(&h, "msr1", keys, &na).unwrap().unwrap();
        assert_eq!(n, h.len());
        assert_eq!(server.peer(), "msr2");
        (client, server)
    }

    fn abort(id: u64) -> Message {
        Message::Abort {
            handoff_id: id,
            reason: "test".into(),
        }
    }

    /// A newer peer's optional fields (the images' `staying` was one: an msrd without
    /// it refused every images message that carried it) are ignored; an unknown message
    /// type is not.
    #[test]
    fn fields_a_peer_does_not_know_are_ignored_and_unknown_types_refused() {
        let json = br#"{"type":"images","handoff_id":3,"images":[{"id":1,"kind":"connect","later":true}],"token":null,"closed":[{"mh":"10.2.0.100:1","peer":"10.0.0.1:2","age_ms":5,"why":"x"}],"from_the_future":[1,2]}"#;
        let m: Message = serde_json::from_slice(json).expect("an images message");
        match m {
            Message::Images {
                handoff_id,
                images,
                closed,
                ..
            } => {
                assert_eq!((handoff_id, images.len(), closed.len()), (3, 1, 1));
                assert_eq!(images[0].id, 1);
            }
            other => panic!("{other:?}"),
        }
        let unknown = br#"{"type":"teleport","handoff_id":3}"#;
        assert!(serde_json::from_slice::<Message>(unknown).is_err());
        let missing = br#"{"type":"abort","handoff_id":3}"#;
        assert!(serde_json::from_slice::<Message>(missing).is_err());
    }

    #[test]
    fn tls_sessions_frame_without_tags_and_hellos_name_both_ends() {
        let h = tls_hello("msr2", "msr1");
        for cut in 0..h.len() {
            assert_eq!(
                open_tls_hello(&h[..cut], "msr1").unwrap(),
                None,
                "cut {cut}"
            );
        }
        assert_eq!(
            open_tls_hello(&h, "msr1").unwrap(),
            Some(("msr2".to_string(), h.len()))
        );
        assert!(matches!(
            open_tls_hello(&h, "msr3"),
            Err(WireError::WrongRecipient { .. })
        ));
        assert!(matches!(
            open_tls_hello(b"ITF3xxxx", "msr1"),
            Err(WireError::BadMagic)
        ));
        let (mut c, mut s) = (
            Session::over_tls("msr2", "msr1"),
            Session::over_tls("msr1", "msr2"),
        );
        let f = c.seal(&abort(7));
        assert!(f[HEADER - TAG..HEADER].iter().all(|&b| b == 0));
        assert_eq!(s.open(&f).unwrap(), Some((abort(7), f.len())));
        // Order is still checked (TLS delivers in order; a bug here must not pass).
        assert!(matches!(s.open(&f), Err(WireError::OutOfOrder { .. })));
        // The caps hold without tags too.
        let mut big = c.seal(&abort(8));
        big[12..16].copy_from_slice(&((MAX_ENVELOPE + 1) as u32).to_be_bytes());
        assert!(matches!(s.open(&big), Err(WireError::TooLarge(_))));
    }

    #[test]
    fn frames_round_trip_both_ways_and_wait_for_more_bytes() {
        let (mut c, mut s) = pair();
        let f = c.seal(&abort(1));
        for cut in [0, 3, HEADER - 1, HEADER, f.len() - 1] {
            assert_eq!(s.clone().open(&f[..cut]).unwrap(), None, "cut {cut}");
        }
        assert_eq!(s.open(&f).unwrap(), Some((abort(1), f.len())));
        let back = s.seal(&abort(2));
        assert_eq!(c.open(&back).unwrap().unwrap().0, abort(2));
        // The next frame in order.
        let f2 = c.seal(&abort(3));
        assert_eq!(s.open(&f2).unwrap().unwrap().0, abort(3));
    }

    #[test]
    fn psk_frames_cross_the_lan_encrypted() {
        let (mut c, mut s) = pair();
        let secret = Message::Abort {
            handoff_id: 9,
            reason: "0123456789abcdef0123456789abcdef".into(),
        };
        let f = c.seal(&secret);
        assert!(
            !f.windows(32)
                .any(|w| w == b"0123456789abcdef0123456789abcdef"),
            "envelope in clear"
        );
        assert!(!f.windows(6).any(|w| w == b"\"type\""), "JSON in clear");
        assert_eq!(s.open(&f).unwrap().unwrap().0, secret);
        // The attachment (users' queued bytes) too.
        let users = b"users' bytes queued in a socket..".repeat(8);
        let f = c.seal_raw(b"{}", &users);
        assert!(
            !f.windows(32).any(|w| w == &users[..32]),
            "attachment in clear"
        );
        // Encrypt-then-MAC: a flipped ciphertext bit fails the tag.
        let (mut c, mut s) = pair();
        let mut f = c.seal(&secret);
        f[HEADER + 3] ^= 1;
        assert!(matches!(s.open(&f), Err(WireError::BadTag { .. })));
    }

    #[test]
    fn hello_needs_the_key_and_this_challenge() {
        let na = [1u8; NONCE];
        // Wrong key.
        let (h, _) = hello("msr2", "msr1", b"guessed", &na, &[2; NONCE]);
        assert!(matches!(
            open_hello(&h, "msr1", keys, &na),
            Err(WireError::BadTag { .. })
        ));
        // Recorded on another channel (other challenge): replay fails.
        let (h, _) = hello("msr2", "msr1", K, &[9; NONCE], &[2; NONCE]);
        assert!(matches!(
            open_hello(&h, "msr1", keys, &na),
            Err(WireError::BadTag { .. })
        ));
        // Unknown peer, other recipient, garbage.
        let (h, _) = hello("mallory", "msr1", K, &na, &[2; NONCE]);
        assert_eq!(
            open_hello(&h, "msr1", keys, &na).unwrap_err(),
            WireError::UnknownPeer("mallory".into())
        );
        let (h, _) = hello("msr2", "msr3", K, &na, &[2; NONCE]);
        assert!(matches!(
            open_hello(&h, "msr1", keys, &na),
            Err(WireError::WrongRecipient { .. })
        ));
        assert_eq!(
            open_hello(b"GET / HTTP/1.1\r\n", "msr1", keys, &na).unwrap_err(),
            WireError::BadMagic
        );
        assert!(open_hello(b"ITC3\x00", "msr1", keys, &na).is_err());
        assert!(open_hello(b"IT", "msr1", keys, &na).unwrap().is_none());
    }

    #[test]
    fn a_forged_header_is_refused_before_its_body_is_read() {
        let (_, s) = pair();
        // Claims a 1 GiB attachment, with a made-up tag: refused from the header alone.
        let mut h = [0u8; HEADER];
        h[..4].copy_from_slice(FRAME_MAGIC);
        h[11] = 1;
        h[16..20].copy_from_slice(&(1u32 << 30).to_be_bytes());
        assert!(matches!(s.check_header(&h), Err(WireError::BadTag { .. })));
    }

    #[test]
    fn replayed_reordered_and_cross_channel_frames_fail() {
        let (mut c, mut s) = pair();
        let f1 = c.seal(&abort(1));
        let f2 = c.seal(&abort(2));
        // Out of order.
        assert!(matches!(s.open(&f2), Err(WireError::OutOfOrder { .. })));
        s.open(&f1).unwrap().unwrap();
        // Replayed.
        assert!(matches!(s.open(&f1), Err(WireError::OutOfOrder { .. })));
        // On another channel between the same peers: other nonces, bad tag.
        let (_, mut s2) = {
            let na = [5u8; NONCE];
            let (h, c2) = hello("msr2", "msr1", K, &na, &[6; NONCE]);
            (c2, open_hello(&h, "msr1", keys, &na).unwrap().unwrap().0)
        };
        assert!(matches!(s2.open(&f1), Err(WireError::BadTag { .. })));
        // A flipped body byte.
        let mut f3 = c.seal(&abort(3));
        s.open(&f2).unwrap().unwrap();
        let n = f3.len();
        f3[n - TAG - 2] ^= 1;
        assert!(matches!(s.open(&f3), Err(WireError::BadTag { .. })));
    }

    #[test]
    fn images_travel_in_the_attachment() {
        let (mut c, mut s) = pair();
        let img = |id: u64, n: usize| ConnImage {
            id,
            kind: "connect".into(),
            wireless: vec![id as u8; n],
            fixed: vec![7; n / 2],
            up_pending: vec![1, 2, 3],
            down_pending: vec![],
            listen: None,
            kx: None,
            synack: (id == 2).then(|| "4500".into()),
            up_idle_ms: Some(700),
            started_us: 1_700_000_000_000_000,
            bytes_up: 5,
            bytes_down: 0,
        };
        let m = Message::Images {
            handoff_id: 3,
            images: vec![img(1, 100_000), img(2, 0)],
            token: None,
            closed: vec![ClosedFlow {
                mh: "10.2.0.100:40000".parse().unwrap(),
                peer: "10.0.0.1:80".parse().unwrap(),
                age_ms: 1500,
            }],
            staying: vec![ClosedFlow {
                mh: "10.2.0.100:40002".parse().unwrap(),
                peer: "10.0.0.1:80".parse().unwrap(),
                age_ms: 0,
            }],
            mac: Some("02:00:00:00:00:64".into()),
        };
        let f = c.clone().seal(&m);
        // Bytes are not hex-encoded into the JSON.
        assert!(f.len() < 160_000, "{}", f.len());
        // In pieces, the same frame; over TLS the large field is borrowed (not copied).
        let joined = |p: Vec<Piece>| {
            p.iter()
                .flat_map(|p| p.bytes())
                .copied()
                .collect::<Vec<u8>>()
        };
        assert_eq!(joined(c.seal_pieces(&m)), f);
        let mut tls = Session::over_tls("msr2", "msr1");
        let whole = tls.clone().seal(&m);
        let pieces = tls.seal_pieces(&m);
        let Message::Images { images, .. } = &m else {
            unreachable!()
        };
        let big = images[0].wireless.as_ptr();
        assert!(pieces
            .iter()
            .any(|p| matches!(p, Piece::Borrowed(b) if b.as_ptr() == big)));
        assert_eq!(joined(pieces), whole);
        let mut rx = Session::over_tls("msr1", "msr2");
        assert_eq!(rx.open(&whole).unwrap().unwrap().0, m);
        assert_eq!(s.open(&f).unwrap().unwrap().0, m);
        // The detection messages travel the same way.
        for m in [
            Message::Detected {
                handoff_id: 4,
                mh: "10.2.0.100".parse().unwrap(),
                mac: "02:00:00:00:00:64".into(),
                parts: true,
            },
            Message::NotHere { handoff_id: 4 },
            Message::MovedOn {
                handoff_id: 4,
                to: "msr3".into(),
            },
            Message::Holding { handoff_id: 4 },
            // A part of the images: its bytes travel in the attachment too.
            Message::ImagesPart {
                handoff_id: 4,
                images: vec![img(5, 40_000), img(6, 3)],
            },
        ] {
            assert_eq!(s.open(&c.seal(&m)).unwrap().unwrap().0, m);
        }
    }

    /// A request from an msrd that does not know parts has no `parts` field: it gets
    /// the images in one message. One that takes parts says so; `false` is not sent.
    #[test]
    fn only_a_request_that_says_so_takes_the_images_in_parts() {
        let d = |parts: bool| Message::Detected {
            handoff_id: 9,
            mh: "10.2.0.100".parse().unwrap(),
            mac: "02:00:00:00:00:64".into(),
            parts,
        };
        let old =
            r#"{"type":"detected","handoff_id":9,"mh":"10.2.0.100","mac":"02:00:00:00:00:64"}"#;
        assert_eq!(serde_json::from_str::<Message>(old).unwrap(), d(false));
        assert_eq!(serde_json::to_string(&d(false)).unwrap(), old);
        let new = serde_json::to_string(&d(true)).unwrap();
        assert!(new.contains(r#""parts":true"#), "{new}");
        assert_eq!(serde_json::from_str::<Message>(&new).unwrap(), d(true));
    }
}
