//! Socket images: the complete state of one connected TCP socket, captured at one host
//! with TCP_REPAIR and restored at another without the peer's cooperation.
//!
//! # Lifecycle
//!
//! ```text
//!  old MSR                                  new MSR
//!  block the flow (netfilter)               hold the flow (netfilter, ingress)
//!  capture(fd)  ── image ─────────────────▶ restore(&image, &opts) -> fd (repair mode)
//!  delete(fd)   (nothing sent)              restart(fd, &image, &opts) (live again)
//!                                           release the hold
//!  rollback instead: unfreeze(fd, mark)
//! ```
//!
//! # What an image holds and how it is put back
//!
//! * **Receive side**: the unread bytes (`recv.data`), the sequence number of the first
//!   of them (`recv.seq`, the kernel's `copied_seq`), and whether the peer's FIN had
//!   arrived (`recv.fin`). Restored with `TCP_QUEUE_SEQ` = `recv.seq`, then the bytes are
//!   written into the receive queue. A received FIN cannot be restored through
//!   TCP_REPAIR; it is *replayed*: a [`crate::packet::Segment`] is sent from the peer's
//!   address to the restored socket over loopback, which moves it to CLOSE_WAIT so its
//!   reader gets EOF after the queued bytes.
//! * **Send side**: `send.una` (the kernel's `snd_una`, the first byte the peer has not
//!   acknowledged), the bytes sent but not acknowledged (`send.unacked`), the bytes not
//!   yet sent (`send.unsent`), and our FIN's fate (`send.fin`). Restored with
//!   `TCP_QUEUE_SEQ` = `send.una` (minus one when our FIN had already been acknowledged,
//!   see [`SendFin::Acked`]): the queue is rebuilt from the acknowledged point, so every
//!   byte keeps its original sequence number whichever way it is put back:
//!   - [`UnackedRestore::AsNew`] (docs/architecture.md §4): the unacknowledged bytes are written
//!     with plain `send()` after repair mode is left, together with the unsent ones. They
//!     leave at once: the peer held 8 kB of them 0.13–0.16 ms after `restart` here.
//!     Safe only if the restored socket's first flight (its initial congestion window,
//!     10 segments) covers them all: until it has re-sent up to the original `snd_nxt`,
//!     any segment from the peer that acknowledges more than that — the peer may well
//!     have received bytes whose ACKs the freeze dropped — is discarded by the kernel as
//!     "ACK of unsent data" (answered by a challenge ACK), and if the first flight cannot
//!     reach that point the connection stalls for good (measured: 274 segments in flight
//!     whose ACKs were lost, forced `AsNew`: cwnd 1, RTO backed off to 96 s, no
//!     progress after 2 minutes).
//!   - [`UnackedRestore::AsSent`] (CRIU's way): written in repair mode into the send
//!     queue, which marks them sent without transmitting them; `snd_nxt` is the original
//!     one, so every ACK the peer can send is acceptable. Bytes the peer has are
//!     acknowledged within one RTT (the window probe at `restart` asks for the ACK), but
//!     lost ones wait: the restored socket has no RTT sample, so the tail-loss probe
//!     comes after 1 s and its SACK does not mark the rest lost; the 3 s RTO does
//!     (measured: 8 kB lost, nothing else queued, 4.0–4.2 s). Unsent bytes written
//!     behind them get SACKed and trigger fast recovery sooner.
//!   - [`UnackedRestore::Auto`] (default) picks `AsNew` when the whole send queue fits
//!     in the restored socket's congestion window ([`first_flight`]: bytes counted
//!     unsent may be ones the peer has) and the bytes in flight fit in the peer's
//!     window, `AsSent` otherwise. The rest of the queue need not fit the window: the
//!     peer holds nothing beyond the window's right edge (it never moves back), which a
//!     window-limited first flight reaches.
//! * **Window** (`TCP_REPAIR_WINDOW`), **negotiated options** (MSS, window scale, SACK,
//!   timestamps: `TCP_REPAIR_OPTIONS`), the **timestamp clock** (`TCP_TIMESTAMP`: our
//!   TSval continues from where it was, so the peer's PAWS check passes), and the
//!   **socket options** we set (buffers, congestion control, NODELAY, keepalive, mark,
//!   transparency, NOTSENT_LOWAT, user timeout, window clamp, bound device).
//!
//! # States
//!
//! ESTABLISHED, FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT, LAST_ACK and CLOSING can be captured
//! (CLOSING is restored as LAST_ACK: both wait for the ACK of our FIN, CLOSING would
//! then have gone through TIME_WAIT). LISTEN (TCP_REPAIR refuses it: re-create
//! listeners), SYN_SENT/SYN_RECV (no connection yet), TIME_WAIT and CLOSED (nothing to
//! move) are refused with an error that says so.
//!
//! # Limits
//!
//! Out-of-order data the socket had received beyond a hole is not captured (the kernel
//! offers no way to read it); if the socket had SACKed it, the peer's retransmission
//! timeout recovers it (Linux treats it as SACK reneging). ECN state, the congestion
//! state (cwnd, ssthresh, RTT estimates) and urgency are not carried: the restored
//! socket starts with a fresh congestion state, and an urgent byte still in the receive
//! queue is left out of the image (the bytes around it are kept, as a reader that takes
//! urgent bytes out of band reads them; see `peek_received`). Restoring sets SO_SNDBUF/SO_RCVBUF
//! explicitly (Linux cannot tell whether the original values were set or autotuned), so
//! buffer autotuning is off on the restored socket.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::packet::Segment;
use crate::repair::{self, state as st, Queue, RawRepairWindow, RepairOff, RepairOptions};

/// The TCP state of a captured connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpState {
    Established,
    /// We sent (or queued) our FIN; it is not acknowledged yet.
    FinWait1,
    /// Our FIN is acknowledged; the peer may still send.
    FinWait2,
    /// The peer's FIN arrived; we may still send.
    CloseWait,
    /// Both FINs; ours not acknowledged yet (peer closed first).
    LastAck,
    /// Both FINs; ours not acknowledged yet (we closed first). Restored as LAST_ACK.
    Closing,
}

impl TcpState {
    fn from_kernel(s: u8) -> io::Result<Self> {
        Ok(match s {
            st::ESTABLISHED => TcpState::Established,
            st::FIN_WAIT1 => TcpState::FinWait1,
            st::FIN_WAIT2 => TcpState::FinWait2,
            st::CLOSE_WAIT => TcpState::CloseWait,
            st::LAST_ACK => TcpState::LastAck,
            st::CLOSING => TcpState::Closing,
            other => {
                let (name, why) = match other {
                    st::LISTEN => (
                        "LISTEN",
                        "TCP_REPAIR refuses listening sockets: re-create the listener at the new host instead",
                    ),
                    st::SYN_SENT | st::SYN_RECV => (
                        if other == st::SYN_SENT { "SYN_SENT" } else { "SYN_RECV" },
                        "the handshake has not finished: let it complete (or fail) and capture it then",
                    ),
                    st::TIME_WAIT => ("TIME_WAIT", "the connection is over: nothing to move"),
                    st::CLOSE => ("CLOSED", "the connection is over (or was never connected): nothing to move"),
                    _ => ("unknown", "not a state a connected socket can be captured in"),
                };
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "cannot capture a TCP socket in state {name} ({other}): {why}. \
                         Capturable: ESTABLISHED, FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT, LAST_ACK, CLOSING"
                    ),
                ));
            }
        })
    }

    /// The peer's FIN has been received.
    pub fn fin_received(self) -> bool {
        matches!(
            self,
            TcpState::CloseWait | TcpState::LastAck | TcpState::Closing
        )
    }

    /// We have shut down our direction (FIN queued, sent or acknowledged).
    pub fn fin_sent(self) -> bool {
        matches!(
            self,
            TcpState::FinWait1 | TcpState::FinWait2 | TcpState::LastAck | TcpState::Closing
        )
    }

    fn code(self) -> u8 {
        match self {
            TcpState::Established => st::ESTABLISHED,
            TcpState::FinWait1 => st::FIN_WAIT1,
            TcpState::FinWait2 => st::FIN_WAIT2,
            TcpState::CloseWait => st::CLOSE_WAIT,
            TcpState::LastAck => st::LAST_ACK,
            TcpState::Closing => st::CLOSING,
        }
    }
}

/// What had become of our FIN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SendFin {
    /// We have not shut down.
    None,
    /// Shut down, but the FIN is still queued behind unsent bytes (or the window).
    Queued,
    /// The FIN was transmitted and is not acknowledged.
    Sent,
    /// The FIN was acknowledged (FIN_WAIT2); `send.una` is one past it. It is restored
    /// by re-queueing it as sent at `send.una - 1`.
    Acked,
}

/// Send side of an image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendImage {
    /// `snd_una`: sequence number of the first unacknowledged byte (of `unacked`, or of
    /// `unsent` when nothing is in flight, or of the FIN).
    pub una: u32,
    /// Sent, not yet acknowledged: sequence numbers `una ..`.
    #[serde(with = "hex_bytes")]
    pub unacked: Vec<u8>,
    /// Written by the application, not yet sent: they follow `unacked`.
    #[serde(with = "hex_bytes")]
    pub unsent: Vec<u8>,
    pub fin: SendFin,
}

/// Receive side of an image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecvImage {
    /// Sequence number of the first unread byte (`copied_seq`).
    pub seq: u32,
    /// Received in order, not yet read by the application.
    #[serde(with = "hex_bytes")]
    pub data: Vec<u8>,
    /// The peer's FIN arrived after `data`.
    pub fin: bool,
}

/// `TCP_REPAIR_WINDOW`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowImage {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

/// Window scale shifts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowScale {
    /// Applied to the windows the peer advertises.
    pub snd: u8,
    /// Applied to the windows we advertise.
    pub rcv: u8,
}

/// Options negotiated in the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpOptionsImage {
    /// The peer's MSS (`mss_clamp`, from `TCP_MAXSEG` in repair mode).
    pub mss: u32,
    pub wscale: Option<WindowScale>,
    pub sack: bool,
    pub timestamps: bool,
}

/// Keepalive settings (present when SO_KEEPALIVE is on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keepalive {
    pub idle_s: u32,
    pub interval_s: u32,
    pub count: u32,
}

/// Socket options carried over. Zero means "not set / kernel default" where noted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SockOpts {
    /// SO_SNDBUF as the kernel reports it (twice the value that was set).
    pub sndbuf: u32,
    /// SO_RCVBUF as the kernel reports it.
    pub rcvbuf: u32,
    /// TCP_CONGESTION; `None` leaves the new host's default.
    pub congestion: Option<String>,
    pub nodelay: bool,
    pub keepalive: Option<Keepalive>,
    /// SO_MARK (0: none).
    pub mark: u32,
    /// IP_TRANSPARENT / IPV6_TRANSPARENT.
    pub transparent: bool,
    /// TCP_NOTSENT_LOWAT (0: not set).
    pub notsent_lowat: u32,
    /// TCP_USER_TIMEOUT in ms (0: not set).
    pub user_timeout_ms: u32,
    /// TCP_WINDOW_CLAMP.
    pub window_clamp: u32,
    /// SO_BINDTODEVICE. Edit it before `restore` if the new host names the interface
    /// differently.
    pub bind_device: Option<String>,
}

/// Everything needed to recreate one connected TCP socket elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketImage {
    /// Format version; [`SocketImage::CURRENT`]. Deserializing another one fails.
    #[serde(deserialize_with = "de_version")]
    pub version: u32,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: TcpState,
    pub send: SendImage,
    pub recv: RecvImage,
    pub window: WindowImage,
    pub options: TcpOptionsImage,
    /// `TCP_TIMESTAMP`: our TSval clock at capture (low bit: microsecond clock).
    pub timestamp: u32,
    pub sockopts: SockOpts,
}

/// How [`restore`] puts back the bytes that were sent but not acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnackedRestore {
    /// `AsNew` when the restored socket's first flight covers them, else `AsSent`.
    #[default]
    Auto,
    /// Re-send them as new data at [`restart`]: they reach the peer at once.
    AsNew,
    /// Restore them as sent (repair mode); lost ones wait for a probe or RTO.
    AsSent,
}

/// Options of [`restore`], and of [`restart`] (which uses `inject_mark`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreOptions {
    /// Set IP_TRANSPARENT even if the original socket did not have it (needed to bind
    /// a local address this host does not own).
    pub transparent: bool,
    pub unacked: UnackedRestore,
    /// Return the socket with O_NONBLOCK set.
    pub nonblocking: bool,
    /// SO_MARK of the packets replayed to the socket from the peer's address (0: none):
    /// the peer's FIN at restore, an old ACK at restart. It lets a flow hold let them
    /// through, and routes them to this host when the socket's local address is not
    /// one of its own (a transparent socket). They arrive on `lo`; a hold that matches
    /// only packets from outside (`iifname != "lo"`) needs no mark.
    pub inject_mark: u32,
    /// How long the connection may have been frozen since its capture (an upper
    /// bound). The socket's TCP timestamp clock is moved on by it: it stood still in
    /// the image, and a peer's segment that echoes a timestamp from before the freeze
    /// (one held during the move) would give an RTT sample short by the freeze, down
    /// to near zero: a minimum RTT kept for minutes and loss probes that fire before
    /// any answer can come. Too much is harmless (peers only check that timestamps
    /// do not go back), too little is what happened before.
    pub frozen_for: Duration,
}

/// A TCP_TIMESTAMP value moved on by `d`, in the connection's unit: microseconds if
/// `usec` (Linux ≥ 6.7 can negotiate them per route; the value's low bit then says
/// so), else milliseconds, rounded up. The low bit is kept either way.
pub fn advance_timestamp(ts: u32, d: Duration, usec: bool) -> u32 {
    let ticks = if usec {
        d.as_micros()
    } else {
        d.as_micros().div_ceil(1000)
    };
    // Even, so the unit bit stays; at most 2^30 ticks (12 days in ms), far below the
    // 2^31 after which a peer would take the value for an old one.
    let step = (ticks.min(1 << 30) as u32 + 1) & !1;
    ts.wrapping_add(step)
}

/// Format errors of [`SocketImage::from_bytes`] and image validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageError {
    BadMagic,
    UnsupportedVersion {
        found: u32,
    },
    Truncated {
        field: &'static str,
        offset: usize,
        needed: usize,
        available: usize,
    },
    TrailingBytes {
        count: usize,
    },
    Invalid(String),
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::BadMagic => write!(
                f,
                "not a socket image (bad magic; expected {:?})",
                String::from_utf8_lossy(MAGIC)
            ),
            ImageError::UnsupportedVersion { found } => write!(
                f,
                "socket image version {found} is not supported (this build reads version {}): \
                 run the same itcp-handoff version on both MSRs",
                SocketImage::CURRENT
            ),
            ImageError::Truncated {
                field,
                offset,
                needed,
                available,
            } => write!(
                f,
                "socket image truncated: {field} at offset {offset} needs {needed} bytes, {available} left"
            ),
            ImageError::TrailingBytes { count } => {
                write!(f, "socket image has {count} unexpected bytes after its end")
            }
            ImageError::Invalid(why) => write!(f, "invalid socket image: {why}"),
        }
    }
}

impl std::error::Error for ImageError {}

impl From<ImageError> for io::Error {
    fn from(e: ImageError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Binary encoding magic.
pub const MAGIC: &[u8; 4] = b"ISIM";

fn de_version<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    if v != SocketImage::CURRENT {
        return Err(serde::de::Error::custom(ImageError::UnsupportedVersion {
            found: v,
        }));
    }
    Ok(v)
}

impl SocketImage {
    /// Nothing of ours unacknowledged or unsent (no FIN either), and the peer's window
    /// open: a restart need not hear from the peer before the application writes.
    pub fn nothing_to_send(&self) -> bool {
        self.send.unacked.is_empty()
            && self.send.unsent.is_empty()
            && matches!(self.send.fin, SendFin::None | SendFin::Acked)
            && self.window.snd_wnd > 0
    }

    /// The image format this build writes and reads.
    pub const CURRENT: u32 = 1;

    /// Bytes queued in both directions (for logs).
    pub fn queued_bytes(&self) -> usize {
        self.send.unacked.len() + self.send.unsent.len() + self.recv.data.len()
    }

    /// Takes in an ACK from the peer that the original socket never saw (it arrived
    /// during the freeze and was held): the bytes it acknowledges leave `unacked` and
    /// `una` moves on, as if it had come before the capture; the right edge of the
    /// peer's window stays. Returns how many bytes went. An ACK at or behind `una`, or
    /// beyond what was sent, changes nothing. Our FIN stays in flight even if the ACK
    /// covers it (the bytes before it go): the restored socket takes that ACK itself.
    ///
    /// Why: bytes in flight are re-sent as new data at [`restart`] (`AsNew`), and a held
    /// ACK of their first copy, delivered after, would be taken for an ACK of the new
    /// one: an RTT sample of a fraction of a millisecond (Karn's rule cannot apply, the
    /// kernel does not know they are retransmissions), which sets the restored
    /// socket's RTT estimate and its minimum RTT for minutes, and its loss probe then
    /// fires before any answer can come. Taken in here, those bytes are not re-sent.
    pub fn take_peer_ack(&mut self, ack: u32) -> usize {
        let n = ack.wrapping_sub(self.send.una) as usize;
        let fin = usize::from(self.send.fin == SendFin::Sent);
        // Serial arithmetic: an old ACK is "behind" (a huge forward distance).
        if n > self.send.unacked.len() + fin {
            return 0;
        }
        let n = n.min(self.send.unacked.len());
        if n == 0 {
            return 0;
        }
        self.send.unacked.drain(..n);
        self.send.una = self.send.una.wrapping_add(n as u32);
        self.window.snd_wnd = self.window.snd_wnd.saturating_sub(n as u32);
        n
    }

    /// Whether ACK `ack` from the peer completes this connection's close: the peer's
    /// FIN arrived, all it sent was read, and `ack` acknowledges everything this
    /// socket sent, its FIN included (LAST_ACK, or CLOSING, ended by that ACK).
    pub fn closed_by(&self, ack: u32) -> bool {
        self.recv.fin
            && self.recv.data.is_empty()
            && self.send.fin == SendFin::Sent
            && self.send.unsent.is_empty()
            && ack
                == self
                    .send
                    .una
                    .wrapping_add(self.send.unacked.len() as u32 + 1)
    }

    /// The send sequence number the restored queue starts at: `una`, or the
    /// acknowledged FIN's own number when it is re-queued.
    fn send_base(&self) -> u32 {
        match self.send.fin {
            SendFin::Acked => self.send.una.wrapping_sub(1),
            _ => self.send.una,
        }
    }

    /// `snd_nxt` of the original socket.
    pub fn snd_nxt(&self) -> u32 {
        let fin = u32::from(self.send.fin == SendFin::Sent);
        self.send
            .una
            .wrapping_add(self.send.unacked.len() as u32)
            .wrapping_add(fin)
    }

    /// `rcv_nxt` of the original socket.
    pub fn rcv_nxt(&self) -> u32 {
        self.recv
            .seq
            .wrapping_add(self.recv.data.len() as u32)
            .wrapping_add(u32::from(self.recv.fin))
    }

    /// Checks the invariants restore relies on.
    pub fn validate(&self) -> Result<(), ImageError> {
        let bad = |s: String| Err(ImageError::Invalid(s));
        if self.version != Self::CURRENT {
            return Err(ImageError::UnsupportedVersion {
                found: self.version,
            });
        }
        if self.local.is_ipv4() != self.remote.is_ipv4() {
            return bad(format!(
                "local {} and remote {} are of different address families",
                self.local, self.remote
            ));
        }
        if self.local.port() == 0 || self.remote.port() == 0 {
            return bad("a port is 0".into());
        }
        if self.state.fin_received() != self.recv.fin {
            return bad(format!(
                "state {:?} disagrees with recv.fin = {}",
                self.state, self.recv.fin
            ));
        }
        if self.state.fin_sent() != (self.send.fin != SendFin::None) {
            return bad(format!(
                "state {:?} disagrees with send.fin = {:?}",
                self.state, self.send.fin
            ));
        }
        if (self.state == TcpState::FinWait2) != (self.send.fin == SendFin::Acked) {
            return bad(format!(
                "send.fin = {:?} is only possible in FIN_WAIT2 (state {:?})",
                SendFin::Acked,
                self.state
            ));
        }
        match self.send.fin {
            SendFin::Acked if !self.send.unacked.is_empty() || !self.send.unsent.is_empty() => {
                return bad("our FIN is acknowledged but bytes are still queued before it".into());
            }
            SendFin::Sent if !self.send.unsent.is_empty() => {
                return bad("our FIN was sent but unsent bytes are queued before it".into());
            }
            _ => {}
        }
        if self.options.mss == 0 || self.options.mss > 65535 {
            return bad(format!("MSS {} out of range", self.options.mss));
        }
        if let Some(w) = self.options.wscale {
            if w.snd > 14 || w.rcv > 14 {
                return bad(format!("window scale {}/{} above 14", w.snd, w.rcv));
            }
        }
        if self.window.max_window < self.window.snd_wnd {
            return bad("max_window below snd_wnd".into());
        }
        let send_len = self.send.unacked.len() as u64 + self.send.unsent.len() as u64;
        if send_len > u64::from(u32::MAX / 2)
            || self.recv.data.len() as u64 > u64::from(u32::MAX / 2)
        {
            return bad("queues larger than 2 GiB".into());
        }
        Ok(())
    }

    // ---------------------------------------------------------------- binary format

    /// Binary encoding, little-endian, length-prefixed:
    ///
    /// ```text
    /// "ISIM" version:u32 state:u8 local:addr remote:addr
    /// send: una:u32 fin:u8 unacked:bytes unsent:bytes
    /// recv: seq:u32 fin:u8 data:bytes
    /// window: snd_wl1 snd_wnd max_window rcv_wnd rcv_wup (u32 each)
    /// options: mss:u32 wscale:(u8 present, u8 snd, u8 rcv) sack:u8 timestamps:u8
    /// timestamp:u32
    /// sockopts: sndbuf:u32 rcvbuf:u32 congestion:optstr nodelay:u8
    ///           keepalive:(u8 present, idle u32, interval u32, count u32)
    ///           mark:u32 transparent:u8 notsent_lowat:u32 user_timeout_ms:u32
    ///           window_clamp:u32 bind_device:optstr
    /// addr   = family:u8 (4|6) ip (4|16 bytes) port:u16 [v6: flowinfo:u32 scope_id:u32]
    /// bytes  = len:u32 then the bytes
    /// optstr = present:u8 [len:u16 then UTF-8]
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(160 + self.queued_bytes()));
        w.0.extend_from_slice(MAGIC);
        w.u32(Self::CURRENT);
        w.u8(self.state.code());
        w.addr(&self.local);
        w.addr(&self.remote);
        w.u32(self.send.una);
        w.u8(match self.send.fin {
            SendFin::None => 0,
            SendFin::Queued => 1,
            SendFin::Sent => 2,
            SendFin::Acked => 3,
        });
        w.bytes(&self.send.unacked);
        w.bytes(&self.send.unsent);
        w.u32(self.recv.seq);
        w.u8(u8::from(self.recv.fin));
        w.bytes(&self.recv.data);
        let win = &self.window;
        for v in [
            win.snd_wl1,
            win.snd_wnd,
            win.max_window,
            win.rcv_wnd,
            win.rcv_wup,
        ] {
            w.u32(v);
        }
        w.u32(self.options.mss);
        match self.options.wscale {
            Some(s) => {
                w.u8(1);
                w.u8(s.snd);
                w.u8(s.rcv);
            }
            None => {
                w.u8(0);
                w.u8(0);
                w.u8(0);
            }
        }
        w.u8(u8::from(self.options.sack));
        w.u8(u8::from(self.options.timestamps));
        w.u32(self.timestamp);
        let o = &self.sockopts;
        w.u32(o.sndbuf);
        w.u32(o.rcvbuf);
        w.optstr(o.congestion.as_deref());
        w.u8(u8::from(o.nodelay));
        match o.keepalive {
            Some(k) => {
                w.u8(1);
                w.u32(k.idle_s);
                w.u32(k.interval_s);
                w.u32(k.count);
            }
            None => {
                w.u8(0);
                w.u32(0);
                w.u32(0);
                w.u32(0);
            }
        }
        w.u32(o.mark);
        w.u8(u8::from(o.transparent));
        w.u32(o.notsent_lowat);
        w.u32(o.user_timeout_ms);
        w.u32(o.window_clamp);
        w.optstr(o.bind_device.as_deref());
        w.0
    }

    /// Decodes [`SocketImage::to_bytes`] output, rejecting other versions, truncated
    /// input, trailing bytes and images that fail [`SocketImage::validate`].
    pub fn from_bytes(b: &[u8]) -> Result<Self, ImageError> {
        let mut r = Reader { b, off: 0 };
        if r.take(4, "magic")? != MAGIC {
            return Err(ImageError::BadMagic);
        }
        let version = r.u32("version")?;
        if version != Self::CURRENT {
            return Err(ImageError::UnsupportedVersion { found: version });
        }
        let state_code = r.u8("state")?;
        let state = TcpState::from_kernel(state_code)
            .map_err(|_| ImageError::Invalid(format!("unknown TCP state code {state_code}")))?;
        let local = r.addr("local address")?;
        let remote = r.addr("remote address")?;
        let una = r.u32("send.una")?;
        let fin = match r.u8("send.fin")? {
            0 => SendFin::None,
            1 => SendFin::Queued,
            2 => SendFin::Sent,
            3 => SendFin::Acked,
            x => return Err(ImageError::Invalid(format!("unknown send.fin code {x}"))),
        };
        let unacked = r.bytes("send.unacked")?;
        let unsent = r.bytes("send.unsent")?;
        let rseq = r.u32("recv.seq")?;
        let rfin = r.bool("recv.fin")?;
        let data = r.bytes("recv.data")?;
        let window = WindowImage {
            snd_wl1: r.u32("window.snd_wl1")?,
            snd_wnd: r.u32("window.snd_wnd")?,
            max_window: r.u32("window.max_window")?,
            rcv_wnd: r.u32("window.rcv_wnd")?,
            rcv_wup: r.u32("window.rcv_wup")?,
        };
        let mss = r.u32("options.mss")?;
        let ws_present = r.bool("options.wscale")?;
        let ws_snd = r.u8("options.wscale.snd")?;
        let ws_rcv = r.u8("options.wscale.rcv")?;
        let sack = r.bool("options.sack")?;
        let timestamps = r.bool("options.timestamps")?;
        let timestamp = r.u32("timestamp")?;
        let sndbuf = r.u32("sockopts.sndbuf")?;
        let rcvbuf = r.u32("sockopts.rcvbuf")?;
        let congestion = r.optstr("sockopts.congestion")?;
        let nodelay = r.bool("sockopts.nodelay")?;
        let ka_present = r.bool("sockopts.keepalive")?;
        let ka = Keepalive {
            idle_s: r.u32("sockopts.keepalive.idle")?,
            interval_s: r.u32("sockopts.keepalive.interval")?,
            count: r.u32("sockopts.keepalive.count")?,
        };
        let mark = r.u32("sockopts.mark")?;
        let transparent = r.bool("sockopts.transparent")?;
        let notsent_lowat = r.u32("sockopts.notsent_lowat")?;
        let user_timeout_ms = r.u32("sockopts.user_timeout_ms")?;
        let window_clamp = r.u32("sockopts.window_clamp")?;
        let bind_device = r.optstr("sockopts.bind_device")?;
        if r.off != b.len() {
            return Err(ImageError::TrailingBytes {
                count: b.len() - r.off,
            });
        }
        let img = SocketImage {
            version,
            local,
            remote,
            state,
            send: SendImage {
                una,
                unacked,
                unsent,
                fin,
            },
            recv: RecvImage {
                seq: rseq,
                data,
                fin: rfin,
            },
            window,
            options: TcpOptionsImage {
                mss,
                wscale: ws_present.then_some(WindowScale {
                    snd: ws_snd,
                    rcv: ws_rcv,
                }),
                sack,
                timestamps,
            },
            timestamp,
            sockopts: SockOpts {
                sndbuf,
                rcvbuf,
                congestion,
                nodelay,
                keepalive: ka_present.then_some(ka),
                mark,
                transparent,
                notsent_lowat,
                user_timeout_ms,
                window_clamp,
                bind_device,
            },
        };
        img.validate()?;
        Ok(img)
    }
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn optstr(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
                self.u8(1);
                self.u16(s.len() as u16);
                self.0.extend_from_slice(s);
            }
            None => self.u8(0),
        }
    }
    fn addr(&mut self, a: &SocketAddr) {
        match a {
            SocketAddr::V4(a) => {
                self.u8(4);
                self.0.extend_from_slice(&a.ip().octets());
                self.u16(a.port());
            }
            SocketAddr::V6(a) => {
                self.u8(6);
                self.0.extend_from_slice(&a.ip().octets());
                self.u16(a.port());
                self.u32(a.flowinfo());
                self.u32(a.scope_id());
            }
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    off: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], ImageError> {
        let available = self.b.len() - self.off;
        if n > available {
            return Err(ImageError::Truncated {
                field,
                offset: self.off,
                needed: n,
                available,
            });
        }
        let s = &self.b[self.off..self.off + n];
        self.off += n;
        Ok(s)
    }
    fn u8(&mut self, f: &'static str) -> Result<u8, ImageError> {
        Ok(self.take(1, f)?[0])
    }
    fn bool(&mut self, f: &'static str) -> Result<bool, ImageError> {
        match self.u8(f)? {
            0 => Ok(false),
            1 => Ok(true),
            x => Err(ImageError::Invalid(format!("{f}: {x} is not a boolean"))),
        }
    }
    fn u16(&mut self, f: &'static str) -> Result<u16, ImageError> {
        let s = self.take(2, f)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, f: &'static str) -> Result<u32, ImageError> {
        let s = self.take(4, f)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn bytes(&mut self, f: &'static str) -> Result<Vec<u8>, ImageError> {
        let n = self.u32(f)? as usize;
        Ok(self.take(n, f)?.to_vec())
    }
    fn optstr(&mut self, f: &'static str) -> Result<Option<String>, ImageError> {
        if !self.bool(f)? {
            return Ok(None);
        }
        let n = self.u16(f)? as usize;
        let s = self.take(n, f)?;
        String::from_utf8(s.to_vec())
            .map(Some)
            .map_err(|_| ImageError::Invalid(format!("{f} is not UTF-8")))
    }
    fn addr(&mut self, f: &'static str) -> Result<SocketAddr, ImageError> {
        match self.u8(f)? {
            4 => {
                let ip = self.take(4, f)?;
                let ip = Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]);
                Ok(SocketAddr::V4(SocketAddrV4::new(ip, self.u16(f)?)))
            }
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(self.take(16, f)?);
                let port = self.u16(f)?;
                let flow = self.u32(f)?;
                let scope = self.u32(f)?;
                Ok(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(o),
                    port,
                    flow,
                    scope,
                )))
            }
            x => Err(ImageError::Invalid(format!(
                "{f}: unknown address family {x}"
            ))),
        }
    }
}

/// `#[serde(with)]` for byte queues: a hex string in human-readable formats (JSON),
/// raw bytes in binary ones.
mod hex_bytes {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};
    use std::fmt;

    const DIGITS: &[u8; 16] = b"0123456789abcdef";

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            let mut out = String::with_capacity(v.len() * 2);
            for b in v {
                out.push(DIGITS[usize::from(b >> 4)] as char);
                out.push(DIGITS[usize::from(b & 15)] as char);
            }
            s.serialize_str(&out)
        } else {
            s.serialize_bytes(v)
        }
    }

    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }

    pub fn decode(s: &str) -> Result<Vec<u8>, String> {
        let b = s.as_bytes();
        if b.len() % 2 != 0 {
            return Err(format!("hex string of odd length {}", b.len()));
        }
        b.chunks_exact(2)
            .enumerate()
            .map(|(i, p)| match (nibble(p[0]), nibble(p[1])) {
                (Some(h), Some(l)) => Ok(h << 4 | l),
                _ => Err(format!("not a hex digit at position {}", 2 * i)),
            })
            .collect()
    }

    struct V;

    impl<'de> Visitor<'de> for V {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a hex string or bytes")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Vec<u8>, E> {
            decode(s).map_err(E::custom)
        }
        fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<Vec<u8>, E> {
            Ok(b.to_vec())
        }
        fn visit_byte_buf<E: de::Error>(self, b: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(b)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Vec<u8>, A::Error> {
            let mut v = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1 << 20));
            while let Some(b) = a.next_element::<u8>()? {
                v.push(b);
            }
            Ok(v)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        if d.is_human_readable() {
            d.deserialize_any(V)
        } else {
            d.deserialize_byte_buf(V)
        }
    }
}

// -------------------------------------------------------------------- capture

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Sequence numbers and queue lengths read twice: a change means the flow was live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Snapshot {
    rcv_nxt: u32,
    inq: u32,
    write_seq: u32,
    outq: u32,
    notsent: u32,
}

fn snapshot(fd: BorrowedFd<'_>) -> io::Result<Snapshot> {
    repair::select_queue(fd, Queue::Recv)?;
    let rcv_nxt = repair::queue_seq(fd)?;
    repair::select_queue(fd, Queue::Send)?;
    let write_seq = repair::queue_seq(fd)?;
    Ok(Snapshot {
        rcv_nxt,
        inq: repair::inq(fd)?,
        write_seq,
        outq: repair::outq(fd)?,
        notsent: repair::outq_notsent(fd)?,
    })
}

/// Captures the state of a connected TCP socket and leaves it in repair mode.
///
/// **Precondition:** the caller has already blocked the connection's flow (netfilter
/// drop or queue of its 4-tuple, both directions). Repair mode does not freeze a socket:
/// it still acknowledges what arrives and its timers still retransmit, so an unblocked
/// flow changes the state while it is being read. Capture reads the sequence numbers and
/// queue lengths again at the end and fails if anything moved.
///
/// The application must not use the socket meanwhile (reads and writes fail with
/// EPERM/EINVAL in repair mode). Afterwards either [`delete`] it (the handoff went
/// through) or [`unfreeze`] it (rollback).
///
/// On error the socket is left in the repair mode it was found in.
pub fn capture(fd: BorrowedFd<'_>) -> io::Result<SocketImage> {
    let ty = repair::get_int(fd, libc::SOL_SOCKET, libc::SO_TYPE, "getsockopt SO_TYPE")?;
    let proto = repair::get_int(
        fd,
        libc::SOL_SOCKET,
        libc::SO_PROTOCOL,
        "getsockopt SO_PROTOCOL",
    )?;
    if ty != libc::SOCK_STREAM || proto != libc::IPPROTO_TCP {
        return Err(invalid(format!(
            "not a plain TCP socket (type {ty}, protocol {proto}; MPTCP is not supported)"
        )));
    }
    // A first look, for a clear error before touching repair mode.
    TcpState::from_kernel(repair::tcp_info(fd)?.state)?;
    let ulp = repair::get_string(fd, libc::IPPROTO_TCP, libc::TCP_ULP, "getsockopt TCP_ULP")
        .unwrap_or_default();
    if !ulp.is_empty() {
        return Err(invalid(format!(
            "the socket runs the {ulp:?} upper-layer protocol, which cannot be captured"
        )));
    }
    let was_repair = repair::in_repair(fd)?;
    repair::repair_on(fd)?;
    let r = capture_in_repair(fd);
    if r.is_err() && !was_repair {
        let _ = repair::select_queue(fd, Queue::None);
        let _ = repair::repair_off(fd, RepairOff::NoProbe);
    }
    r
}

/// The receive queue as the application would read it (the queue selected). Urgent
/// data changes that: SIOCINQ then counts only the bytes before the urgent mark
/// (unless the socket keeps urgent bytes inline), a peek stops at the mark, and a
/// reader that does not keep them inline skips the urgent byte. The queue is read in
/// two parts, the second from the mark on (SO_PEEK_OFF); the urgent byte is left out
/// unless the socket keeps it inline: its urgency cannot be restored, and kept inline
/// it would show up in the stream of a reader that takes urgent bytes out of band.
fn peek_received(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let inline = repair::get_int(fd, libc::SOL_SOCKET, libc::SO_OOBINLINE, "SO_OOBINLINE")? != 0;
    let inq_with = |on: bool| -> io::Result<u32> {
        if on == inline {
            return repair::inq(fd);
        }
        let set = |v| repair::set_int(fd, libc::SOL_SOCKET, libc::SO_OOBINLINE, v, "SO_OOBINLINE");
        set(i32::from(on))?;
        let n = repair::inq(fd);
        set(i32::from(inline))?;
        n
    };
    let whole = inq_with(true)?;
    if whole == 0 {
        // Nothing queued, so no urgent mark to look for (three calls a socket saved).
        return Ok(Vec::new());
    }
    let mark = inq_with(false)?;
    let peek = |buf: &mut [u8]| -> io::Result<()> {
        let n = repair::peek(fd, buf).map_err(|e| repair::ctx(e, "peek receive queue"))?;
        if n != buf.len() {
            return Err(io::Error::other(format!(
                "receive queue: peek returned {n} bytes, not {} ({whole} queued, urgent mark at {mark})",
                buf.len()
            )));
        }
        Ok(())
    };
    if mark >= whole {
        let mut data = vec![0u8; whole as usize];
        if !data.is_empty() {
            peek(&mut data)?;
        }
        return Ok(data);
    }
    // After the mark: everything, less the urgent byte unless it is kept inline.
    let after = whole - mark - u32::from(!inline);
    let mut data = vec![0u8; (mark + after) as usize];
    let (head, tail) = data.split_at_mut(mark as usize);
    if !head.is_empty() {
        peek(head)?;
    }
    if !tail.is_empty() {
        let off = |v| repair::set_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, v, "SO_PEEK_OFF");
        off(mark as i32).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "urgent data in the receive queue: reading past it needs SO_PEEK_OFF \
                     on TCP sockets (Linux 6.10 or later): {e}"
                ),
            )
        })?;
        let r = peek(tail);
        off(-1)?;
        r?;
    }
    Ok(data)
}

/// The send queue's data from `snd_una` on, `buf.len()` bytes (SIOCOUTQ less a FIN).
/// A peek returns every byte of every queued segment (its total even when the buffer
/// is shorter), but the kernel trims a partly acknowledged segment only when it spans
/// several MSS: a one-MSS segment keeps its acknowledged head (a peer that had more of
/// a restored segment than its image said acknowledges into it). Those surplus bytes
/// sit at the front of the queue, so the wanted bytes are the peek's tail.
fn peek_unacked(fd: BorrowedFd<'_>, mut buf: Vec<u8>) -> io::Result<Vec<u8>> {
    let want = buf.len();
    let n = repair::peek(fd, &mut buf).map_err(|e| repair::ctx(e, "peek send queue"))?;
    if n == want {
        return Ok(buf);
    }
    if n < want {
        return Err(io::Error::other(format!(
            "send queue: SIOCOUTQ says {want} data bytes, peek returned {n}"
        )));
    }
    let mut all = vec![0u8; n];
    let again = repair::peek(fd, &mut all).map_err(|e| repair::ctx(e, "peek send queue"))?;
    if again != n {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("send queue changed while it was peeked ({n} then {again} bytes)"),
        ));
    }
    Ok(all.split_off(n - want))
}

fn capture_in_repair(fd: BorrowedFd<'_>) -> io::Result<SocketImage> {
    let info = repair::tcp_info(fd)?;
    let state = TcpState::from_kernel(info.state)?;
    let local = repair::local_addr(fd)?;
    let remote = repair::peer_addr(fd)?;

    let before = snapshot(fd)?;

    // Receive side. rcv_nxt counts a received FIN; SIOCINQ does not.
    let fin_in = state.fin_received();
    repair::select_queue(fd, Queue::Recv)?;
    let data = peek_received(fd)?;
    let recv_seq = before
        .rcv_nxt
        .wrapping_sub(data.len() as u32)
        .wrapping_sub(u32::from(fin_in));

    // Send side. write_seq, SIOCOUTQ and SIOCOUTQNSD count a queued FIN.
    let fin = if !state.fin_sent() {
        SendFin::None
    } else if before.outq == 0 {
        SendFin::Acked
    } else if before.notsent > 0 {
        SendFin::Queued
    } else {
        SendFin::Sent
    };
    let fin_unacked = u32::from(matches!(fin, SendFin::Queued | SendFin::Sent));
    let data_len = before.outq.checked_sub(fin_unacked).ok_or_else(|| {
        io::Error::other(format!(
            "send queue: SIOCOUTQ {} with an unacknowledged FIN",
            before.outq
        ))
    })?;
    let unsent_len = before
        .notsent
        .checked_sub(u32::from(fin == SendFin::Queued))
        .filter(|&u| u <= data_len)
        .ok_or_else(|| {
            io::Error::other(format!(
                "send queue: SIOCOUTQNSD {} inconsistent with SIOCOUTQ {}",
                before.notsent, before.outq
            ))
        })?;
    let mut sendq = vec![0u8; data_len as usize];
    if !sendq.is_empty() {
        repair::select_queue(fd, Queue::Send)?;
        sendq = peek_unacked(fd, sendq)?;
    }
    let unsent = sendq.split_off((data_len - unsent_len) as usize);
    let una = before.write_seq.wrapping_sub(before.outq);

    // In repair mode TCP_MAXSEG reports the peer's MSS (mss_clamp).
    let mss = repair::get_int(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_MAXSEG,
        "getsockopt TCP_MAXSEG",
    )? as u32;
    let w = repair::repair_window(fd)?;
    let timestamp = repair::timestamp(fd)?;
    let options = TcpOptionsImage {
        mss,
        wscale: (info.options & repair::TCPI_OPT_WSCALE != 0).then_some(WindowScale {
            snd: info.snd_wscale,
            rcv: info.rcv_wscale,
        }),
        sack: info.options & repair::TCPI_OPT_SACK != 0,
        timestamps: info.options & repair::TCPI_OPT_TIMESTAMPS != 0,
    };
    let sockopts = read_sockopts(fd, &local)?;

    let after = snapshot(fd)?;
    let info_after = repair::tcp_info(fd)?;
    // Repair mode does not stop transmission: a paced socket keeps moving bytes from
    // "unsent" to "sent" into the (dropping) flow hold. That boundary may shift; the
    // peer got none of those segments, so either side of it restores correctly. The
    // queues' contents and sequence numbers must not move.
    let stable = |s: Snapshot| Snapshot { notsent: 0, ..s };
    if stable(after) != stable(before) || info_after.state != info.state {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "the connection {local} -> {remote} changed while it was captured \
                 ({before:?} -> {after:?}, state {} -> {}): block its flow before capturing",
                info.state, info_after.state
            ),
        ));
    }
    repair::select_queue(fd, Queue::None)?;

    let img = SocketImage {
        version: SocketImage::CURRENT,
        local,
        remote,
        state,
        send: SendImage {
            una,
            unacked: sendq,
            unsent,
            fin,
        },
        recv: RecvImage {
            seq: recv_seq,
            data,
            fin: fin_in,
        },
        window: WindowImage {
            snd_wl1: w.snd_wl1,
            snd_wnd: w.snd_wnd,
            max_window: w.max_window,
            rcv_wnd: w.rcv_wnd,
            rcv_wup: w.rcv_wup,
        },
        options,
        timestamp,
        sockopts,
    };
    img.validate().map_err(io::Error::from)?;
    Ok(img)
}

fn read_sockopts(fd: BorrowedFd<'_>, local: &SocketAddr) -> io::Result<SockOpts> {
    use libc::{IPPROTO_TCP as TCP, SOL_SOCKET as SOL};
    let get = |level, name, what| repair::get_int(fd, level, name, what);
    let keepalive = if get(SOL, libc::SO_KEEPALIVE, "getsockopt SO_KEEPALIVE")? != 0 {
        Some(Keepalive {
            idle_s: get(TCP, libc::TCP_KEEPIDLE, "getsockopt TCP_KEEPIDLE")? as u32,
            interval_s: get(TCP, libc::TCP_KEEPINTVL, "getsockopt TCP_KEEPINTVL")? as u32,
            count: get(TCP, libc::TCP_KEEPCNT, "getsockopt TCP_KEEPCNT")? as u32,
        })
    } else {
        None
    };
    let transparent = match local {
        SocketAddr::V4(_) => get(
            libc::SOL_IP,
            libc::IP_TRANSPARENT,
            "getsockopt IP_TRANSPARENT",
        )?,
        SocketAddr::V6(_) => get(
            libc::SOL_IPV6,
            libc::IPV6_TRANSPARENT,
            "getsockopt IPV6_TRANSPARENT",
        )?,
    } != 0;
    let cc = repair::get_string(fd, TCP, libc::TCP_CONGESTION, "getsockopt TCP_CONGESTION")?;
    let dev = repair::get_string(fd, SOL, libc::SO_BINDTODEVICE, "getsockopt SO_BINDTODEVICE")?;
    Ok(SockOpts {
        sndbuf: get(SOL, libc::SO_SNDBUF, "getsockopt SO_SNDBUF")? as u32,
        rcvbuf: get(SOL, libc::SO_RCVBUF, "getsockopt SO_RCVBUF")? as u32,
        congestion: (!cc.is_empty()).then_some(cc),
        nodelay: get(TCP, libc::TCP_NODELAY, "getsockopt TCP_NODELAY")? != 0,
        keepalive,
        mark: get(SOL, libc::SO_MARK, "getsockopt SO_MARK")? as u32,
        transparent,
        notsent_lowat: get(TCP, libc::TCP_NOTSENT_LOWAT, "getsockopt TCP_NOTSENT_LOWAT")? as u32,
        user_timeout_ms: get(TCP, libc::TCP_USER_TIMEOUT, "getsockopt TCP_USER_TIMEOUT")? as u32,
        window_clamp: get(TCP, libc::TCP_WINDOW_CLAMP, "getsockopt TCP_WINDOW_CLAMP")? as u32,
        bind_device: (!dev.is_empty()).then_some(dev),
    })
}

/// Leaves repair mode in place: the rollback path when a handoff fails. As at
/// [`restart`], the socket first sends the peer an acceptable ACK (replaying an old one
/// from the peer, marked `inject_mark`): the peer may hold as unacknowledged bytes this
/// socket acknowledged while their ACKs were lost, and the window probe that leaving
/// repair mode sends (so that the peer's current ACK and window come back at once) has
/// a sequence number the peer ignores the ACK of. If that replay fails, unfreezing goes
/// on without it (the peer's next retransmission draws the ACK). Unblock the flow first;
/// run it in the socket's network namespace.
pub fn unfreeze(fd: BorrowedFd<'_>, inject_mark: u32) -> io::Result<()> {
    repair::select_queue(fd, Queue::None)?;
    if let Ok(img) = capture(fd) {
        let opts = RestoreOptions {
            inject_mark,
            ..RestoreOptions::default()
        };
        let _ = send_current_ack(fd, &img, &opts);
    }
    repair::select_queue(fd, Queue::None)?;
    repair::repair_off(fd, RepairOff::WithProbe)?;
    // Leaving repair mode cleared the socket's address reuse (see `restart`): without
    // it, what the socket leaves behind when it ends (TIME_WAIT) would keep a restarted
    // msrd off the request port it shares for a minute.
    repair::set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1, "SO_REUSEADDR")
}

/// [`delete`] failed; the socket is handed back (still open) so that closing it cannot
/// send anything by accident.
#[derive(Debug)]
pub struct DeleteError {
    pub error: io::Error,
    pub fd: OwnedFd,
}

impl fmt::Display for DeleteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "delete socket: {}", self.error)
    }
}

impl std::error::Error for DeleteError {}

/// Closes a socket without sending anything (no FIN, no RST): puts it in repair mode if
/// it is not already there, then closes it. Its state is gone; the peer only sees the
/// copy restored elsewhere.
pub fn delete(fd: OwnedFd) -> Result<(), DeleteError> {
    let r = repair::in_repair(fd.as_fd()).and_then(|on| {
        if on {
            Ok(())
        } else {
            repair::repair_on(fd.as_fd())
        }
    });
    match r {
        Ok(()) => {
            drop(fd);
            Ok(())
        }
        Err(error) => Err(DeleteError { error, fd }),
    }
}

// -------------------------------------------------------------------- restore

/// Canonical form of an address: IPv4-mapped IPv6 addresses become IPv4.
fn canonical(a: &SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => *a,
        },
        SocketAddr::V4(_) => *a,
    }
}

/// Writes `data` into the selected repair queue, in chunks the kernel accepts.
fn repair_write(fd: BorrowedFd<'_>, mut data: &[u8], what: &str) -> io::Result<()> {
    // A receive-queue write becomes one skb; large ones can fail to allocate, so start
    // at 64 KiB and halve on failure (as CRIU does).
    let mut chunk = 64 * 1024;
    while !data.is_empty() {
        let n = data.len().min(chunk);
        match repair::send(fd, &data[..n], libc::MSG_DONTWAIT) {
            Ok(0) => {
                return Err(io::Error::other(format!(
                    "{what}: the kernel accepted 0 bytes"
                )))
            }
            Ok(k) => data = &data[k..],
            Err(e)
                if chunk > 1024
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::ENOMEM | libc::EMSGSIZE | libc::ENOBUFS)
                    ) =>
            {
                chunk /= 2;
            }
            Err(e) => return Err(repair::ctx(e, what)),
        }
    }
    Ok(())
}

fn set_buffer(
    fd: BorrowedFd<'_>,
    force: libc::c_int,
    plain: libc::c_int,
    v: u32,
    what: &str,
) -> io::Result<()> {
    let v = v.min(i32::MAX as u32 / 2) as libc::c_int;
    // The FORCE variants (CAP_NET_ADMIN) are not capped by net.core.[rw]mem_max.
    repair::set_int(fd, libc::SOL_SOCKET, force, v, what)
        .or_else(|_| repair::set_int(fd, libc::SOL_SOCKET, plain, v, what))
}

fn apply_sockopts(fd: BorrowedFd<'_>, img: &SocketImage, opts: &RestoreOptions) -> io::Result<()> {
    use libc::{IPPROTO_TCP as TCP, SOL_SOCKET as SOL};
    let o = &img.sockopts;
    // setsockopt doubles the value; the image holds the doubled one. Large enough for
    // the queues we are about to write (skb overhead fits in the doubling).
    let send_len = (img.send.unacked.len() + img.send.unsent.len()) as u32;
    set_buffer(
        fd,
        libc::SO_SNDBUFFORCE,
        libc::SO_SNDBUF,
        (o.sndbuf / 2).max(send_len),
        "SO_SNDBUF",
    )?;
    set_buffer(
        fd,
        libc::SO_RCVBUFFORCE,
        libc::SO_RCVBUF,
        (o.rcvbuf / 2).max(img.recv.data.len() as u32),
        "SO_RCVBUF",
    )?;
    if o.transparent || opts.transparent {
        match img.local {
            SocketAddr::V4(_) => {
                repair::set_int(fd, libc::SOL_IP, libc::IP_TRANSPARENT, 1, "IP_TRANSPARENT")?
            }
            SocketAddr::V6(_) => repair::set_int(
                fd,
                libc::SOL_IPV6,
                libc::IPV6_TRANSPARENT,
                1,
                "IPV6_TRANSPARENT",
            )?,
        }
    }
    if let Some(cc) = &o.congestion {
        repair::set_string(fd, TCP, libc::TCP_CONGESTION, cc, "TCP_CONGESTION").map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{e}: {cc:?} is not available here (see net.ipv4.tcp_allowed_congestion_control), \
                     or set sockopts.congestion to None to use this host's default"
                ),
            )
        })?;
    }
    if o.mark != 0 {
        repair::set_int(fd, SOL, libc::SO_MARK, o.mark as i32, "SO_MARK")?;
    }
    if let Some(dev) = &o.bind_device {
        repair::set_string(fd, SOL, libc::SO_BINDTODEVICE, dev, "SO_BINDTODEVICE").map_err(|e| {
            if repair::interface_exists(dev) {
                e
            } else {
                io::Error::new(
                    e.kind(),
                    format!("{e}: no interface {dev:?} here; set sockopts.bind_device to this host's name for it"),
                )
            }
        })?;
    }
    repair::set_int(
        fd,
        TCP,
        libc::TCP_NODELAY,
        i32::from(o.nodelay),
        "TCP_NODELAY",
    )?;
    if let Some(k) = o.keepalive {
        repair::set_int(fd, SOL, libc::SO_KEEPALIVE, 1, "SO_KEEPALIVE")?;
        repair::set_int(fd, TCP, libc::TCP_KEEPIDLE, k.idle_s as i32, "TCP_KEEPIDLE")?;
        repair::set_int(
            fd,
            TCP,
            libc::TCP_KEEPINTVL,
            k.interval_s as i32,
            "TCP_KEEPINTVL",
        )?;
        repair::set_int(fd, TCP, libc::TCP_KEEPCNT, k.count as i32, "TCP_KEEPCNT")?;
    }
    if o.user_timeout_ms != 0 {
        repair::set_int(
            fd,
            TCP,
            libc::TCP_USER_TIMEOUT,
            o.user_timeout_ms as i32,
            "TCP_USER_TIMEOUT",
        )?;
    }
    Ok(())
}

/// How many segments of `mss` bytes a socket restored from `img` must be able to send
/// at once, counting from `send.una`: its whole send queue, bytes in flight, bytes
/// not yet sent and our FIN. The restorer's first flight (the initial window its
/// route gives it) must cover them all, not only the bytes in flight: the peer may
/// hold bytes this image counts as unsent, sent by an earlier copy of the connection
/// (an image taken at an earlier MSR that restarted with them in flight), and until
/// the restored socket has sent past them every ACK the peer sends is one of "unsent
/// data", which the kernel drops: the connection would never move again.
pub fn first_flight(img: &SocketImage, mss: usize) -> u64 {
    let mss = mss.max(1);
    let queued = img.send.unacked.len() + img.send.unsent.len();
    queued.div_ceil(mss) as u64 + u64::from(img.send.fin != SendFin::None)
}

/// Whether the unacknowledged bytes should be re-sent as new data.
fn choose_as_new(
    fd: BorrowedFd<'_>,
    img: &SocketImage,
    policy: UnackedRestore,
) -> io::Result<bool> {
    let unacked = img.send.unacked.len() as u64 + u64::from(img.send.fin == SendFin::Sent);
    if unacked == 0 {
        return Ok(true);
    }
    Ok(match policy {
        UnackedRestore::AsNew => true,
        UnackedRestore::AsSent => false,
        UnackedRestore::Auto => {
            let i = repair::tcp_info(fd)?;
            let segs = first_flight(img, i.snd_mss as usize);
            segs <= u64::from(i.snd_cwnd) && unacked <= u64::from(img.window.snd_wnd)
        }
    })
}

/// Replays the peer's FIN to the restored socket and waits until it is in CLOSE_WAIT.
fn replay_fin(fd: BorrowedFd<'_>, img: &SocketImage, opts: &RestoreOptions) -> io::Result<()> {
    let rcv_nxt = img.recv.seq.wrapping_add(img.recv.data.len() as u32);
    let snd_shift = img.options.wscale.map_or(0, |w| w.snd);
    let seg = Segment {
        src: canonical(&img.remote),
        dst: canonical(&img.local),
        seq: rcv_nxt,
        ack: img.send_base(),
        window: (img.window.snd_wnd >> snd_shift).min(65535) as u16,
        fin: true,
        // TSval 0 is what a fresh socket's ts_recent holds, so PAWS always passes and
        // the restored socket echoes 0 (no RTT sample) until the peer's next segment;
        // TSecr is our own clock now.
        timestamps: img
            .options
            .timestamps
            .then(|| (0, repair::timestamp(fd).unwrap_or(img.timestamp))),
    };
    repair::send_raw_ip_to(fd, &seg.dst, &seg.to_ip_packet(), opts.inject_mark)?;
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        let s = repair::tcp_info(fd)?.state;
        if s == st::CLOSE_WAIT {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the replayed FIN from {} did not reach the restored socket (state {s}): \
                     a flow hold must let packets on lo (or marked {}) through",
                    seg.src, opts.inject_mark
                ),
            ));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Makes the restored socket send the peer its current ACK (see [`restart`]): replays
/// a duplicate ACK from the peer whose sequence number is below the receive window,
/// which TCP answers with an ACK of its own (RFC 793 p. 69; Linux:
/// `tcp_validate_incoming` → `tcp_send_dupack`), with the sequence number
/// `tcp_acceptable_seq` gives: `snd_nxt`, which the peer accepts. Waits until the socket
/// has taken the replayed segment.
///
/// Linux answers such segments at most once per `net.ipv4.tcp_invalid_ratelimit`
/// (500 ms) per socket. A restored socket has answered none unless segments from the
/// peer reached it before restart (the hold released first) and drew a duplicate or
/// challenge ACK, which then told the peer the same: the replayed segment arriving
/// without an answer is fine.
fn send_current_ack(
    fd: BorrowedFd<'_>,
    img: &SocketImage,
    opts: &RestoreOptions,
) -> io::Result<()> {
    let before = repair::tcp_info(fd)?;
    let snd_shift = img.options.wscale.map_or(0, |w| w.snd);
    let seg = Segment {
        src: canonical(&img.remote),
        dst: canonical(&img.local),
        // rcv_wup only grows: whatever arrived since restore, this is old.
        seq: img.window.rcv_wup.wrapping_sub(1),
        ack: img.send_base(),
        window: (img.window.snd_wnd >> snd_shift).min(65535) as u16,
        fin: false,
        // No timestamp option: once a real segment from the peer has set ts_recent, a
        // TSval of ours would fail PAWS, and an old pure ACK that fails PAWS is dropped
        // unanswered. Without the option Linux skips PAWS.
        timestamps: None,
    };
    repair::send_raw_ip_to(fd, &seg.dst, &seg.to_ip_packet(), opts.inject_mark)
        .map_err(|e| repair::ctx(e, "restart: replay an old ACK"))?;
    let deadline = Instant::now() + Duration::from_millis(500);
    // Counted in segs_in under the socket lock, which TCP_INFO takes: once the count
    // is seen, the segment has been processed (or is, from the backlog, as the lock is
    // released).
    while repair::tcp_info(fd)?.segs_in == before.segs_in {
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "restart: the old ACK replayed from {} did not reach the restored \
                     socket: a flow hold must let packets on lo (or marked {}) through",
                    seg.src, opts.inject_mark
                ),
            ));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}

/// Creates a socket connected as the image says, without sending a packet, and leaves
/// it in repair mode. Call [`restart`] once the new host may talk to the peer.
///
/// Order (docs/architecture.md §4, refined): socket → buffers, IP_TRANSPARENT, congestion control
/// and other options → TCP_REPAIR on (forced port reuse) → bind → TCP_QUEUE_SEQ (receive:
/// `recv.seq`; send: the acknowledged point `send.una`) → TCP_MAXSEG = mss → connect
/// (repair mode: no SYN) → TCP_REPAIR_OPTIONS → TCP_TIMESTAMP → receive queue bytes →
/// (the peer's FIN replayed, after a provisional TCP_REPAIR_WINDOW that puts it in window)
/// → unacknowledged bytes as sent (only [`UnackedRestore::AsSent`]) → our FIN as sent
/// (if acknowledged, or sent and restored as sent) → TCP_REPAIR_WINDOW →
/// TCP_WINDOW_CLAMP.
///
/// Run it in the network namespace the socket belongs to. Needs CAP_NET_ADMIN (repair,
/// forced buffer sizes, marks) and, for half-closed connections whose peer had sent
/// FIN, CAP_NET_RAW. On error the half-made socket is closed in repair mode: nothing is
/// sent.
pub fn restore(img: &SocketImage, opts: &RestoreOptions) -> io::Result<OwnedFd> {
    img.validate()?;
    let sock = repair::tcp_socket(&img.local)?;
    let fd = sock.as_fd();
    apply_sockopts(fd, img, opts)?;
    // Repair mode sets SK_FORCE_REUSE, which lets the bind share the port with a
    // listener (the MSR's own request port); SO_REUSEADDR after it would downgrade that
    // to plain reuse, which a listening socket refuses.
    repair::repair_on(fd)?;
    repair::bind(fd, &img.local).map_err(|e| {
        if e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
            && !(img.sockopts.transparent || opts.transparent)
        {
            io::Error::new(
                e.kind(),
                format!(
                    "{e}: this host does not own {}; set RestoreOptions::transparent",
                    img.local.ip()
                ),
            )
        } else {
            e
        }
    })?;
    repair::select_queue(fd, Queue::Recv)?;
    repair::set_queue_seq(fd, img.recv.seq)?;
    repair::select_queue(fd, Queue::Send)?;
    repair::set_queue_seq(fd, img.send_base())?;
    // Without this the restored socket computes its MSS from the default 536 and sends
    // 524-byte segments; TCP_REPAIR_OPTIONS alone does not fix mss_cache.
    let mss = img.options.mss.clamp(88, 32767) as i32;
    repair::set_int(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, mss, "TCP_MAXSEG")?;
    repair::connect(fd, &img.remote)?;
    repair::set_repair_options(
        fd,
        &RepairOptions {
            mss: img.options.mss,
            wscale: img.options.wscale.map(|w| (w.snd, w.rcv)),
            sack: img.options.sack,
            timestamps: img.options.timestamps,
        },
    )?;
    repair::set_timestamp(fd, img.timestamp)?;
    if !opts.frozen_for.is_zero() && img.options.timestamps {
        // Linux ≥ 6.7 clears the low bit of a millisecond clock's value; set with it,
        // the kernel says whether the value is in microseconds (older kernels: never).
        let usec =
            img.timestamp & 1 == 1 && repair::tcp_info(fd)?.options & repair::TCPI_OPT_USEC_TS != 0;
        let ts = advance_timestamp(img.timestamp, opts.frozen_for, usec);
        repair::set_timestamp(fd, ts)?;
    }
    if !img.recv.data.is_empty() {
        repair::select_queue(fd, Queue::Recv)?;
        repair_write(fd, &img.recv.data, "restore receive queue")?;
    }
    let final_window = RawRepairWindow {
        snd_wl1: img.window.snd_wl1,
        snd_wnd: img.window.snd_wnd,
        max_window: img.window.max_window,
        rcv_wnd: img.window.rcv_wnd,
        rcv_wup: img.window.rcv_wup,
    };
    if img.recv.fin {
        // The FIN must be inside the receive window: with rcv_wup still at recv.seq, a
        // large restored queue leaves no window and the kernel would drop the FIN.
        let rcv_nxt = img.recv.seq.wrapping_add(img.recv.data.len() as u32);
        let right = img.window.rcv_wup.wrapping_add(img.window.rcv_wnd);
        let provisional = RawRepairWindow {
            rcv_wup: rcv_nxt,
            rcv_wnd: right.wrapping_sub(rcv_nxt).clamp(1, 1 << 30),
            snd_wl1: rcv_nxt.wrapping_sub(1),
            ..final_window
        };
        repair::set_repair_window(fd, &provisional)?;
        replay_fin(fd, img, opts)?;
    }
    let as_new = choose_as_new(fd, img, opts.unacked)?;
    repair::select_queue(fd, Queue::Send)?;
    if !as_new && !img.send.unacked.is_empty() {
        repair_write(
            fd,
            &img.send.unacked,
            "restore unacknowledged bytes as sent",
        )?;
    }
    // Our FIN, put back as sent: always when it was acknowledged (it sits before
    // send.una, and a socket whose snd_nxt is short of the peer's ACK drops everything
    // the peer sends), and when it was sent and the unacked bytes are restored as sent.
    if img.send.fin == SendFin::Acked || (img.send.fin == SendFin::Sent && !as_new) {
        repair::shutdown_write(fd)?;
    }
    repair::select_queue(fd, Queue::None)?;
    repair::set_repair_window(fd, &final_window)?;
    if img.sockopts.window_clamp != 0 {
        repair::set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            img.sockopts.window_clamp.min(i32::MAX as u32) as i32,
            "TCP_WINDOW_CLAMP",
        )?;
    }
    // The receive queue is in: back to the original receive buffer (see restart).
    set_buffer(
        fd,
        libc::SO_RCVBUFFORCE,
        libc::SO_RCVBUF,
        img.sockopts.rcvbuf / 2,
        "SO_RCVBUF",
    )?;
    if opts.nonblocking {
        repair::set_nonblocking(fd, true)?;
    }
    Ok(sock)
}

/// Makes a restored socket live: makes it send the peer its current ACK (see below),
/// leaves repair mode and writes the send queue as new data with `send()` — the
/// unacknowledged bytes too unless [`restore`] put them back as sent — then shuts down
/// writing if the original had sent FIN, and finally sets TCP_NOTSENT_LOWAT (after the
/// queue, which it would otherwise hold back). `opts` are the options the socket was
/// restored with (restart uses `inject_mark`). Returns whether bytes in flight (or
/// our FIN) were re-sent as new data: then an ACK of their first copy that reaches
/// the socket looks like one of the new copy (see [`crate::packet::forget_acks`]).
///
/// **The ACK.** The peer may still hold as unacknowledged bytes the original socket
/// had received and acknowledged: the ACKs were lost (a downlink queue full of other
/// traffic, the freeze). Only an *acceptable* segment from us tells it otherwise, and
/// the window probe that leaving repair mode sends is not one: its sequence number is
/// `snd_una - 1` by design, so that the peer answers it, and the peer ignores its ACK
/// field. Left alone, the peer learns nothing until one of its retransmissions reaches
/// the restored socket; if those are lost too (msrd's network detection consumes the
/// MH's first packet in a new cell, the hold drops what comes before restart) its
/// timer backs off and, with every handoff, the transfer stalls for good. So unless
/// restart re-sends data from the acknowledged point (which carries the ACK and whose
/// last segment the peer accepts), it replays an old duplicate ACK from the peer (a
/// [`Segment`] below the receive window, over the loopback path like the replayed FIN),
/// which the kernel answers, as TCP must, with its current ACK: sequence number
/// `snd_nxt`, `rcv_nxt`, the window. The peer sees one ACK; restart fails with a clear
/// error if the replayed segment does not reach the socket (a hold must let packets on
/// `lo`, or marked `inject_mark`, through).
///
/// Call it once the new host routes the flow and the flow may reach the socket. It is
/// fine to call it before releasing an *ingress* hold, and better: segments the hold
/// kept then find a socket that has already re-sent up to the original `snd_nxt`, so
/// their ACKs are accepted. Works on blocking and non-blocking sockets (waits up to
/// 5 s for send-buffer space, which restore sized for the whole queue). Run it in the
/// network namespace the socket belongs to (checked); needs CAP_NET_RAW for the
/// replayed ACK. On an error before repair mode is left, the socket is still in repair
/// mode: closing it sends nothing.
pub fn restart(fd: BorrowedFd<'_>, img: &SocketImage, opts: &RestoreOptions) -> io::Result<bool> {
    if !repair::in_repair(fd)? {
        return Err(invalid(
            "restart: the socket is not in repair mode (restarted already?)".into(),
        ));
    }
    repair::select_queue(fd, Queue::Send)?;
    let write_seq = repair::queue_seq(fd)?;
    repair::select_queue(fd, Queue::None)?;
    let in_socket = write_seq.wrapping_sub(img.send_base()) as u64;
    let fin_in_socket_new = u64::from(img.send.fin == SendFin::Acked);
    let fin_in_socket_sent = u64::from(matches!(img.send.fin, SendFin::Acked | SendFin::Sent));
    let as_sent_len = img.send.unacked.len() as u64 + fin_in_socket_sent;
    let as_new = if in_socket == fin_in_socket_new {
        true
    } else if in_socket == as_sent_len {
        false
    } else {
        return Err(io::Error::other(format!(
            "restart: the socket holds {in_socket} sequence numbers past the image's base, \
             expected {fin_in_socket_new} or {as_sent_len}: not restored from this image?"
        )));
    };
    let first: &[u8] = if as_new { &img.send.unacked } else { &[] };
    let rest: &[u8] = &img.send.unsent;
    let fin_now = img.send.fin == SendFin::Queued || (img.send.fin == SendFin::Sent && as_new);
    let writes = !first.is_empty() || !rest.is_empty();
    // The window probe makes the peer answer with its ACK and window at once, and the
    // replayed old ACK makes the socket send its own, acceptable, ACK (see above). When
    // we are about to send data from the acknowledged point anyway, that data does
    // both: its last segment ends at or beyond the original snd_nxt, so the peer
    // accepts it.
    let how = if writes && as_new {
        RepairOff::NoProbe
    } else {
        // Still in repair mode (the kernel answers segments all the same), so that a
        // failure leaves a socket that closes silently.
        send_current_ack(fd, img, opts)?;
        if img.nothing_to_send() {
            // The peer's answer to a probe would only say how far it acknowledged and
            // how much it would take; with nothing of ours in flight or queued and its
            // window open, neither matters until we write, and our ACK has told it all
            // it needs. Two packets a socket fewer (a thousand idle connections move
            // with 4000 fewer packets for the hosts' kernels to handle).
            RepairOff::NoProbe
        } else {
            RepairOff::WithProbe
        }
    };
    repair::repair_off(fd, how)?;
    // Leaving repair mode clears the socket's address reuse (SK_NO_REUSE): if the
    // process then dies, what is left of the socket (TIME_WAIT, an orphaned FIN_WAIT)
    // would keep a new listener off the address it shares (an MSR's request port) for
    // a minute. As a socket bound with SO_REUSEADDR, it does not.
    repair::set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1, "SO_REUSEADDR")?;
    // Nagle would hold back the last partial segment until an ACK comes.
    let nagle = !img.sockopts.nodelay;
    if writes && nagle {
        repair::set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1, "TCP_NODELAY")?;
    }
    write_all(fd, first)?;
    write_all(fd, rest)?;
    if fin_now {
        repair::shutdown_write(fd)?;
    }
    if writes && nagle {
        repair::set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 0, "TCP_NODELAY")?;
    }
    if img.sockopts.notsent_lowat != 0 {
        repair::set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            img.sockopts.notsent_lowat.min(i32::MAX as u32) as i32,
            "TCP_NOTSENT_LOWAT",
        )?;
    }
    // Back to the original send buffer: restore enlarged it to hold the whole queue,
    // and an enlarged buffer would be captured and enlarged again at every move.
    set_buffer(
        fd,
        libc::SO_SNDBUFFORCE,
        libc::SO_SNDBUF,
        img.sockopts.sndbuf / 2,
        "SO_SNDBUF",
    )?;
    Ok(as_new && (!img.send.unacked.is_empty() || img.send.fin == SendFin::Sent))
}

fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !data.is_empty() {
        match repair::send(fd, data, libc::MSG_DONTWAIT) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !repair::wait_writable(fd, left.as_millis().max(1) as i32)? {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "restart: send buffer stayed full with {} bytes left to write",
                            data.len()
                        ),
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(repair::ctx(e, "restart: write send queue")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_flight_covers_the_whole_send_queue() {
        let mut img = sample();
        img.send.unacked = vec![0; 3000];
        img.send.unsent = vec![0; 1000];
        img.send.fin = SendFin::None;
        // 4000 bytes in 1448-byte segments: 3, though only 3000 are in flight.
        assert_eq!(first_flight(&img, 1448), 3);
        img.send.fin = SendFin::Queued;
        assert_eq!(first_flight(&img, 1448), 4);
        img.send.unsent.clear();
        assert_eq!(first_flight(&img, 1000), 4);
    }

    #[test]
    fn a_held_ack_takes_acknowledged_bytes_out_of_flight() {
        let mut img = sample();
        img.state = TcpState::Established;
        img.send.fin = SendFin::None;
        img.recv.fin = false;
        let una = img.send.una;
        let (wnd, len) = (img.window.snd_wnd, img.send.unacked.len());
        // Old and duplicate ACKs, and one beyond what was sent, change nothing.
        for ack in [una, una.wrapping_sub(1), una.wrapping_add(len as u32 + 1)] {
            assert_eq!(img.take_peer_ack(ack), 0, "{ack}");
        }
        // Across the sequence space's wrap (una is 0xffff_fff0).
        assert_eq!(img.take_peer_ack(una.wrapping_add(100)), 100);
        assert_eq!(img.send.una, una.wrapping_add(100));
        assert_eq!(img.send.unacked[0], 100);
        assert_eq!(
            img.window.snd_wnd,
            wnd - 100,
            "the window's right edge stays"
        );
        assert_eq!(
            img.take_peer_ack(una.wrapping_add(50)),
            0,
            "behind the new una"
        );
        assert_eq!(img.take_peer_ack(una.wrapping_add(len as u32)), len - 100);
        assert!(img.send.unacked.is_empty());
        img.validate().unwrap();
    }

    #[test]
    fn a_held_ack_of_our_fin_takes_the_bytes_before_it_only() {
        let mut img = sample();
        assert_eq!(img.send.fin, SendFin::Sent);
        let len = img.send.unacked.len();
        let una = img.send.una;
        let fin = una.wrapping_add(len as u32 + 1);
        assert_eq!(img.take_peer_ack(fin.wrapping_add(1)), 0, "beyond our FIN");
        assert_eq!(img.take_peer_ack(fin), len, "the bytes before it go");
        assert_eq!(img.send.una, una.wrapping_add(len as u32));
        assert_eq!(
            (img.state, img.send.fin),
            (TcpState::LastAck, SendFin::Sent)
        );
        assert_eq!(img.take_peer_ack(fin), 0);
        img.validate().unwrap();
    }

    #[test]
    fn an_ack_closes_a_last_ack_image_only_when_it_acknowledges_our_fin() {
        let mut img = sample();
        img.recv.data.clear();
        assert!(img.recv.fin);
        let fin = img.send.una.wrapping_add(img.send.unacked.len() as u32 + 1);
        assert!(img.closed_by(fin));
        assert!(!img.closed_by(fin.wrapping_sub(1)), "the bytes only");
        assert!(!img.closed_by(fin.wrapping_add(1)), "beyond our FIN");
        let mut open = img.clone();
        open.recv.fin = false;
        assert!(!open.closed_by(fin), "the peer has not closed");
        let mut unread = img.clone();
        unread.recv.data = vec![1];
        assert!(!unread.closed_by(fin), "bytes still to relay");
        let mut queued = img.clone();
        queued.send.fin = SendFin::Queued;
        assert!(!queued.closed_by(fin), "our FIN not sent");
    }

    #[test]
    fn a_timestamp_moves_on_in_its_unit_and_keeps_its_unit_bit() {
        let ms = Duration::from_micros(150_200);
        // Milliseconds, rounded up to even: 151 → 152.
        assert_eq!(advance_timestamp(1000, ms, false), 1152);
        assert_eq!(advance_timestamp(1001, ms, true), 1001 + 150_200);
        assert_eq!(advance_timestamp(u32::MAX - 1, ms, false), 150);
        assert_eq!(advance_timestamp(7, Duration::ZERO, true), 7);
        // A frozen clock of days does not wrap into the past.
        let far = advance_timestamp(0, Duration::from_secs(100 * 86_400), false);
        assert!(far < 1 << 31, "{far}");
    }

    fn sample() -> SocketImage {
        SocketImage {
            version: SocketImage::CURRENT,
            local: "10.77.0.2:7000".parse().unwrap(),
            remote: "10.77.0.1:40000".parse().unwrap(),
            state: TcpState::LastAck,
            send: SendImage {
                una: 0xffff_fff0,
                unacked: (0..=255u8).collect(),
                unsent: vec![],
                fin: SendFin::Sent,
            },
            recv: RecvImage {
                seq: 12345,
                data: b"hello".to_vec(),
                fin: true,
            },
            window: WindowImage {
                snd_wl1: 1,
                snd_wnd: 65535,
                max_window: 70000,
                rcv_wnd: 64000,
                rcv_wup: 12340,
            },
            options: TcpOptionsImage {
                mss: 1448,
                wscale: Some(WindowScale { snd: 7, rcv: 9 }),
                sack: true,
                timestamps: true,
            },
            timestamp: 0xdead_beef,
            sockopts: SockOpts {
                sndbuf: 46080,
                rcvbuf: 131072,
                congestion: Some("bbr".into()),
                nodelay: true,
                keepalive: Some(Keepalive {
                    idle_s: 30,
                    interval_s: 5,
                    count: 4,
                }),
                mark: 0x42,
                transparent: true,
                notsent_lowat: 16384,
                user_timeout_ms: 30000,
                window_clamp: 1 << 20,
                bind_device: Some("cell0".into()),
            },
        }
    }

    fn sample_v6() -> SocketImage {
        let mut i = sample();
        i.local = "[fe80::2%3]:7000".parse().unwrap();
        i.remote = SocketAddr::V6(SocketAddrV6::new(
            "fd77::1".parse().unwrap(),
            40000,
            0x12345,
            0,
        ));
        i.state = TcpState::Established;
        i.send.fin = SendFin::None;
        i.send.unsent = vec![7; 3000];
        i.recv.fin = false;
        i.options.wscale = None;
        i.sockopts.congestion = None;
        i.sockopts.keepalive = None;
        i.sockopts.bind_device = None;
        i
    }

    #[test]
    fn binary_round_trip() {
        for img in [sample(), sample_v6()] {
            let b = img.to_bytes();
            assert_eq!(&b[..4], MAGIC);
            assert!(
                SocketImage::from_bytes(&b).unwrap() == img,
                "binary round trip changed the image"
            );
        }
    }

    #[test]
    fn binary_rejects_other_versions() {
        let mut b = sample().to_bytes();
        b[4..8].copy_from_slice(&2u32.to_le_bytes());
        let e = SocketImage::from_bytes(&b).unwrap_err();
        assert_eq!(e, ImageError::UnsupportedVersion { found: 2 });
        let msg = e.to_string();
        assert!(
            msg.contains("version 2") && msg.contains("reads version 1"),
            "{msg}"
        );
        // And through io::Error.
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn binary_rejects_bad_magic_and_trailing_bytes() {
        let mut b = sample().to_bytes();
        b[0] = b'X';
        assert_eq!(
            SocketImage::from_bytes(&b).unwrap_err(),
            ImageError::BadMagic
        );
        let mut b = sample().to_bytes();
        b.push(0);
        assert_eq!(
            SocketImage::from_bytes(&b).unwrap_err(),
            ImageError::TrailingBytes { count: 1 }
        );
    }

    #[test]
    fn binary_truncated_everywhere_is_an_error() {
        let b = sample().to_bytes();
        for cut in 0..b.len() {
            match SocketImage::from_bytes(&b[..cut]) {
                Err(ImageError::Truncated {
                    offset,
                    needed,
                    available,
                    ..
                }) => {
                    assert!(needed > available, "cut {cut}");
                    assert!(offset <= cut, "cut {cut}");
                }
                other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
            }
        }
        let e = SocketImage::from_bytes(&b[..40]).unwrap_err().to_string();
        assert!(e.starts_with("socket image truncated: "), "{e}");
    }

    #[test]
    fn binary_rejects_inconsistent_images() {
        let mut i = sample();
        i.recv.fin = false; // LAST_ACK without the peer's FIN
        let e = SocketImage::from_bytes(&i.to_bytes()).unwrap_err();
        assert!(matches!(e, ImageError::Invalid(_)), "{e:?}");
        let mut i = sample();
        i.send.unsent = vec![1]; // FIN sent but bytes unsent before it
        assert!(matches!(
            SocketImage::from_bytes(&i.to_bytes()),
            Err(ImageError::Invalid(_))
        ));
    }

    #[test]
    fn json_round_trip_uses_hex_and_checks_version() {
        let mut img = sample_v6();
        // JSON writes addresses as strings: the scope id survives, the flow label
        // (meaningless for a restore) does not.
        if let SocketAddr::V6(r) = &mut img.remote {
            r.set_flowinfo(0);
        }
        let j = serde_json::to_string(&img).unwrap();
        assert!(
            j.contains("\"unsent\":\"0707"),
            "queues are hex in JSON: {}",
            &j[..200.min(j.len())]
        );
        let back: SocketImage = serde_json::from_str(&j).unwrap();
        assert!(back == img, "JSON round trip changed the image");
        assert!(matches!(back.local, SocketAddr::V6(a) if a.scope_id() == 3));
        let bad = j.replacen("\"version\":1", "\"version\":9", 1);
        let e = serde_json::from_str::<SocketImage>(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("version 9 is not supported"), "{e}");
        // Byte arrays are accepted too.
        let arr = j.replacen(
            "\"data\":\"68656c6c6f\"",
            "\"data\":[104,101,108,108,111]",
            1,
        );
        assert!(serde_json::from_str::<SocketImage>(&arr).unwrap() == img);
    }

    #[test]
    fn hex_decode_errors() {
        assert!(hex_bytes::decode("abc").is_err());
        assert!(hex_bytes::decode("zz").is_err());
        assert_eq!(hex_bytes::decode("00ffA0").unwrap(), vec![0, 255, 160]);
    }

    #[test]
    fn sequence_helpers() {
        let i = sample();
        // una wraps: 0xfffffff0 + 256 + FIN
        assert_eq!(i.snd_nxt(), 0xffff_fff0u32.wrapping_add(257));
        assert_eq!(i.rcv_nxt(), 12345 + 5 + 1);
        assert_eq!(i.send_base(), i.send.una);
        let mut f2 = sample_v6();
        f2.state = TcpState::FinWait2;
        f2.send.fin = SendFin::Acked;
        f2.send.unacked.clear();
        f2.send.unsent.clear();
        f2.validate().unwrap();
        assert_eq!(f2.send_base(), f2.send.una - 1);
    }

    #[test]
    fn states_refused_with_clear_errors() {
        for (code, word) in [
            (st::LISTEN, "LISTEN"),
            (st::SYN_SENT, "SYN_SENT"),
            (st::SYN_RECV, "SYN_RECV"),
            (st::TIME_WAIT, "TIME_WAIT"),
            (st::CLOSE, "CLOSED"),
        ] {
            let e = TcpState::from_kernel(code).unwrap_err().to_string();
            assert!(e.contains(word) && e.contains("Capturable"), "{e}");
        }
        assert_eq!(
            TcpState::from_kernel(st::CLOSING).unwrap(),
            TcpState::Closing
        );
    }

    #[test]
    fn canonical_unmaps_ipv4() {
        let a: SocketAddr = "[::ffff:10.0.0.1]:80".parse().unwrap();
        assert_eq!(canonical(&a), "10.0.0.1:80".parse::<SocketAddr>().unwrap());
    }
}
