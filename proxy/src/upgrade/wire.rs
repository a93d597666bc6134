//! The hand-over between a running msrd and its successor (upgrade), I/O-free.
//!
//! The two processes talk over a `SOCK_SEQPACKET` socketpair: one packet is one
//! message, and the sockets a message carries travel with it as `SCM_RIGHTS`
//! ([`super::fdpass`]). A packet is
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `ITUP` |
//! | 4 | format version, big endian ([`VERSION`]) |
//! | 4 | length of the JSON message, big endian |
//! | n | the message, JSON ([`Msg`]) |
//! | rest | raw payload (bytes in transit of a relay, [`Msg::Pending`]) |
//!
//! The conversation:
//!
//! ```text
//! new → old   Ready | Failed                     configuration loaded (or not)
//! old → new   Header, Mh*, Socket*, MhListener*, (Conn, Pending*)*, End
//! new → old   Adopted | Failed
//! old → new   Commit                             the new one serves, the old one exits
//! ```
//!
//! [`split`] turns what the old process hands over into packets; [`Assembler`] checks
//! and reassembles them in the new one (fds are a type parameter, so tests use
//! integers). Bad input is an error that says what was wrong, never a panic.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use itcp_proto::control::{Kind, Stats};
use itcp_proto::greeting::GreetReply;
use serde::{Deserialize, Serialize};

pub const MAGIC: [u8; 4] = *b"ITUP";
/// Bumped on any incompatible change: an msrd refuses a hand-over in another version
/// (the operator then restarts instead).
pub const VERSION: u32 = 1;
/// Largest packet either side sends or accepts.
pub const MAX_PACKET: usize = 64 * 1024;
/// Bytes in transit are sent in chunks of at most this.
pub const CHUNK: usize = 32 * 1024;
/// Most fds one packet carries (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 192;
const HEAD: usize = 12;

/// What a handed-over listening socket serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The request port (`[msr] gateway`, `socks_port`).
    Socks,
    /// The TPROXY port (`[transparent] listen_port`).
    Transparent,
    /// The control socket (`[msr] control_socket`).
    Control,
    /// `[metrics] listen`.
    Metrics,
    /// The MSR⇄MSR channel (`[handoff] listen`).
    Channel,
    /// A greeting socket (UDP, one per cell interface).
    Greeting,
}

/// The first message of the old process: everything that is not a socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub old_pid: u32,
    pub msr: String,
    /// What the old process installed on the router (nftables table, policy route,
    /// LAN interface): the new one must want exactly the same, since it neither
    /// re-installs nor removes it.
    pub footprint: String,
    pub stats: Stats,
    /// The last session id given out (ids carry on).
    pub last_session_id: u64,
    /// The handoff duration histograms and the status page's recent handoffs, so that
    /// an upgrade does not empty them while the counters carry on. Absent from an
    /// older msrd's hand-over: they then start empty, as they used to.
    #[serde(default)]
    pub handoffs: HandoffHistory,
}

/// One duration histogram: per-bucket counts (not cumulative, the last +Inf) and the
/// sum, as `metrics::Histogram` keeps them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistogramState {
    pub counts: Vec<u64>,
    pub sum_us: u64,
}

/// What `metrics::HandoffMetrics` holds: the histograms by role and the recent
/// records, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HandoffHistory {
    pub new: HistogramState,
    pub old: HistogramState,
    pub recent: Vec<itcp_handoff::log::Record>,
}

/// What the MSR knows about one MH (tokens, replay state, holds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MhRecord {
    pub mh: IpAddr,
    /// The session token, hex.
    pub token: Option<String>,
    pub last_greeting_ts: u64,
    pub hold_gen: u64,
    pub last_nonce: Option<String>,
    pub last_reply: Option<GreetReply>,
    pub claimed: bool,
    /// The link-layer address bound to the MH (network detection), `xx:xx:…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// A hold after a handoff out, due for release in this many ms.
    pub release_hold_in_ms: Option<u64>,
    /// The peers the MH's connections last left for and came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub came_from: Option<String>,
}

/// One relayed connection (or a listener's control connection, or a waiting ACCEPT).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnMeta {
    pub id: u64,
    pub kind: Kind,
    pub mh: SocketAddr,
    pub fh: SocketAddr,
    pub wireless_local: SocketAddr,
    /// Opened at, µs since the UNIX epoch.
    pub started_us: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub moved_in: bool,
    /// See `Session::up_idle_at_move` and `Session::before`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_idle_at_move: Option<u32>,
    #[serde(default)]
    pub before: (u64, u64),
    /// The MH listener it belongs to (LISTEN, waiting ACCEPT).
    pub listen: Option<SocketAddr>,
    /// Counted by admission.
    pub admitted: bool,
    /// Carries a fixed-side socket (second fd).
    pub fixed: bool,
    /// Bytes in transit inside the relay, MH → FH and FH → MH ([`Msg::Pending`]).
    pub up_pending: usize,
    pub down_pending: usize,
    /// A request handshake's key-share secret (over the Unix socket to our own
    /// successor, never the network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kx: Option<[u8; 32]>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Msg {
    /// New → old: configuration loaded, ready to adopt.
    Ready {
        pid: u32,
    },
    /// New → old: it cannot take over, and why (then it exits).
    Failed {
        error: String,
    },
    Header(Header),
    Mh(MhRecord),
    /// A listening socket (1 fd). `name`: its address, the control socket's path, or
    /// the greeting socket's interface.
    Socket {
        role: Role,
        name: String,
    },
    /// An MH listener (1 fd) and the fixed-side connections it accepted that no
    /// ACCEPT took yet (1 fd each, in order).
    MhListener {
        addr: SocketAddr,
        queued: Vec<SocketAddr>,
    },
    /// A connection: the wireless socket, then the fixed one if `fixed`.
    Conn(ConnMeta),
    /// Bytes in transit of the connection just sent (payload), in order.
    Pending {
        id: u64,
        up: bool,
    },
    /// The end of the state, with counts.
    End {
        mhs: usize,
        sockets: usize,
        mh_listeners: usize,
        conns: usize,
    },
    /// New → old: everything adopted, nothing served yet; waiting for `Commit`.
    Adopted {
        pid: u32,
    },
    /// Old → new: serve. The old process exits.
    Commit,
}

impl Msg {
    /// How many fds travel with this message.
    pub fn fds(&self) -> usize {
        match self {
            Msg::Socket { .. } => 1,
            Msg::MhListener { queued, .. } => 1 + queued.len(),
            Msg::Conn(c) => 1 + usize::from(c.fixed),
            _ => 0,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Msg::Ready { .. } => "ready",
            Msg::Failed { .. } => "failed",
            Msg::Header(_) => "header",
            Msg::Mh(_) => "mh",
            Msg::Socket { .. } => "socket",
            Msg::MhListener { .. } => "mh_listener",
            Msg::Conn(_) => "conn",
            Msg::Pending { .. } => "pending",
            Msg::End { .. } => "end",
            Msg::Adopted { .. } => "adopted",
            Msg::Commit => "commit",
        }
    }
}

/// What is wrong with a packet or with the order of messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    Short(usize),
    Magic,
    Version(u32),
    Length {
        said: usize,
        have: usize,
    },
    TooLarge(usize),
    Json(String),
    Fds {
        msg: &'static str,
        want: usize,
        got: usize,
    },
    Order(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Short(n) => write!(f, "hand-over packet of {n} bytes: shorter than its header"),
            WireError::Magic => f.write_str("not a hand-over packet (bad magic)"),
            WireError::Version(v) => write!(
                f,
                "hand-over format {v}, this msrd speaks {VERSION}: restart msrd instead of upgrading"
            ),
            WireError::Length { said, have } => {
                write!(f, "hand-over message says {said} bytes of JSON, the packet has {have}")
            }
            WireError::TooLarge(n) => write!(f, "hand-over packet of {n} bytes (at most {MAX_PACKET})"),
            WireError::Json(e) => write!(f, "hand-over message: {e}"),
            WireError::Fds { msg, want, got } => {
                write!(f, "hand-over message {msg} carries {got} sockets, expected {want}")
            }
            WireError::Order(e) => write!(f, "hand-over out of order: {e}"),
        }
    }
}

impl std::error::Error for WireError {}

/// One packet: `msg` and its payload.
pub fn encode(msg: &Msg, payload: &[u8]) -> Result<Vec<u8>, WireError> {
    let json = serde_json::to_vec(msg).map_err(|e| WireError::Json(e.to_string()))?;
    let n = HEAD + json.len() + payload.len();
    if n > MAX_PACKET {
        return Err(WireError::TooLarge(n));
    }
    let mut out = Vec::with_capacity(n);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Parses one packet into its message and payload.
pub fn decode(packet: &[u8]) -> Result<(Msg, &[u8]), WireError> {
    if packet.len() > MAX_PACKET {
        return Err(WireError::TooLarge(packet.len()));
    }
    if packet.len() < HEAD {
        return Err(WireError::Short(packet.len()));
    }
    if packet[..4] != MAGIC {
        return Err(WireError::Magic);
    }
    let v = u32::from_be_bytes(packet[4..8].try_into().unwrap());
    if v != VERSION {
        return Err(WireError::Version(v));
    }
    let said = u32::from_be_bytes(packet[8..12].try_into().unwrap()) as usize;
    let have = packet.len() - HEAD;
    if said > have {
        return Err(WireError::Length { said, have });
    }
    let msg = serde_json::from_slice(&packet[HEAD..HEAD + said])
        .map_err(|e| WireError::Json(e.to_string()))?;
    Ok((msg, &packet[HEAD + said..]))
}

/// Checks that a received message came with the fds it should.
pub fn check_fds(msg: &Msg, got: usize) -> Result<(), WireError> {
    let want = msg.fds();
    if want != got {
        return Err(WireError::Fds {
            msg: msg.name(),
            want,
            got,
        });
    }
    Ok(())
}

/// A connection in the hand-over.
#[derive(Debug, Clone, PartialEq)]
pub struct Conn<F> {
    pub meta: ConnMeta,
    pub wireless: F,
    pub fixed: Option<F>,
    pub up: Vec<u8>,
    pub down: Vec<u8>,
}

/// An MH listener in the hand-over: its socket and its queue.
#[derive(Debug, Clone, PartialEq)]
pub struct MhListener<F> {
    pub addr: SocketAddr,
    pub fd: F,
    pub queued: Vec<(SocketAddr, F)>,
}

/// Everything the old process hands over.
#[derive(Debug, Clone, PartialEq)]
pub struct Handover<F> {
    pub header: Header,
    pub mhs: Vec<MhRecord>,
    pub sockets: Vec<(Role, String, F)>,
    pub mh_listeners: Vec<MhListener<F>>,
    pub conns: Vec<Conn<F>>,
}

/// One packet's bytes and the fds that go with it.
pub type Packet<F> = (Vec<u8>, Vec<F>);

/// The packets that carry `h`, in order, `End` last.
pub fn split<F: Copy>(h: &Handover<F>) -> Result<Vec<Packet<F>>, WireError> {
    let mut out = vec![(encode(&Msg::Header(h.header.clone()), &[])?, vec![])];
    for m in &h.mhs {
        out.push((encode(&Msg::Mh(m.clone()), &[])?, vec![]));
    }
    for (role, name, fd) in &h.sockets {
        let m = Msg::Socket {
            role: *role,
            name: name.clone(),
        };
        out.push((encode(&m, &[])?, vec![*fd]));
    }
    for l in &h.mh_listeners {
        if 1 + l.queued.len() > MAX_FDS {
            return Err(WireError::TooLarge(1 + l.queued.len()));
        }
        let m = Msg::MhListener {
            addr: l.addr,
            queued: l.queued.iter().map(|(a, _)| *a).collect(),
        };
        let mut fds = vec![l.fd];
        fds.extend(l.queued.iter().map(|(_, f)| *f));
        out.push((encode(&m, &[])?, fds));
    }
    for c in &h.conns {
        let mut meta = c.meta.clone();
        meta.fixed = c.fixed.is_some();
        meta.up_pending = c.up.len();
        meta.down_pending = c.down.len();
        let mut fds = vec![c.wireless];
        fds.extend(c.fixed);
        out.push((encode(&Msg::Conn(meta), &[])?, fds));
        for (up, bytes) in [(true, &c.up), (false, &c.down)] {
            for chunk in bytes.chunks(CHUNK) {
                let m = Msg::Pending { id: c.meta.id, up };
                out.push((encode(&m, chunk)?, vec![]));
            }
        }
    }
    let end = Msg::End {
        mhs: h.mhs.len(),
        sockets: h.sockets.len(),
        mh_listeners: h.mh_listeners.len(),
        conns: h.conns.len(),
    };
    out.push((encode(&end, &[])?, vec![]));
    Ok(out)
}

/// Reassembles a [`Handover`] from the old process's messages, checking each.
#[derive(Debug)]
pub struct Assembler<F> {
    h: Option<Handover<F>>,
    done: bool,
}

impl<F> Default for Assembler<F> {
    fn default() -> Self {
        Assembler {
            h: None,
            done: false,
        }
    }
}

impl<F> Assembler<F> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next message with its payload and fds. Returns true once `End` came
    /// and everything adds up.
    pub fn push(&mut self, msg: Msg, payload: &[u8], fds: Vec<F>) -> Result<bool, WireError> {
        check_fds(&msg, fds.len())?;
        if self.done {
            return Err(WireError::Order(format!("{} after end", msg.name())));
        }
        if !payload.is_empty() && !matches!(msg, Msg::Pending { .. }) {
            return Err(WireError::Order(format!(
                "payload on a {} message",
                msg.name()
            )));
        }
        let Some(h) = self.h.as_mut() else {
            let Msg::Header(header) = msg else {
                return Err(WireError::Order(format!(
                    "{} before the header",
                    msg.name()
                )));
            };
            self.h = Some(Handover {
                header,
                mhs: Vec::new(),
                sockets: Vec::new(),
                mh_listeners: Vec::new(),
                conns: Vec::new(),
            });
            return Ok(false);
        };
        // Pending bytes of the previous connection must be complete before anything else.
        let open = h.conns.last().and_then(|c| {
            (c.up.len() < c.meta.up_pending || c.down.len() < c.meta.down_pending)
                .then_some(c.meta.id)
        });
        if let (Some(id), false) = (open, matches!(msg, Msg::Pending { .. })) {
            return Err(WireError::Order(format!(
                "{} while bytes of connection {id} are still due",
                msg.name()
            )));
        }
        let mut fds = fds.into_iter();
        match msg {
            Msg::Mh(m) => h.mhs.push(m),
            Msg::Socket { role, name } => h.sockets.push((role, name, fds.next().unwrap())),
            Msg::MhListener { addr, queued } => {
                let fd = fds.next().unwrap();
                let queued = queued.into_iter().zip(fds).collect();
                h.mh_listeners.push(MhListener { addr, fd, queued });
            }
            Msg::Conn(meta) => {
                let wireless = fds.next().unwrap();
                let fixed = fds.next();
                let relays = meta.kind.relays();
                if relays != fixed.is_some() || relays == meta.listen.is_some() {
                    return Err(WireError::Order(format!(
                        "connection {} of kind {} with{} a fixed side and with{} a listener",
                        meta.id,
                        meta.kind.as_str(),
                        if fixed.is_some() { "" } else { "out" },
                        if meta.listen.is_some() { "" } else { "out" },
                    )));
                }
                if h.conns.iter().any(|c| c.meta.id == meta.id) {
                    return Err(WireError::Order(format!("connection {} twice", meta.id)));
                }
                h.conns.push(Conn {
                    meta,
                    wireless,
                    fixed,
                    up: Vec::new(),
                    down: Vec::new(),
                });
            }
            Msg::Pending { id, up } => {
                let Some(c) = h.conns.last_mut().filter(|c| c.meta.id == id) else {
                    return Err(WireError::Order(format!(
                        "bytes for connection {id}, which is not the last one sent"
                    )));
                };
                let (buf, due) = if up {
                    (&mut c.up, c.meta.up_pending)
                } else {
                    (&mut c.down, c.meta.down_pending)
                };
                if buf.len() + payload.len() > due {
                    return Err(WireError::Order(format!(
                        "connection {id}: more bytes in transit than announced ({due})"
                    )));
                }
                buf.extend_from_slice(payload);
            }
            Msg::End {
                mhs,
                sockets,
                mh_listeners,
                conns,
            } => {
                let have = (
                    h.mhs.len(),
                    h.sockets.len(),
                    h.mh_listeners.len(),
                    h.conns.len(),
                );
                if have != (mhs, sockets, mh_listeners, conns) {
                    return Err(WireError::Order(format!(
                        "end says {mhs} MHs, {sockets} sockets, {mh_listeners} MH listeners, \
                         {conns} connections; received {}, {}, {}, {}",
                        have.0, have.1, have.2, have.3
                    )));
                }
                self.done = true;
                return Ok(true);
            }
            other => {
                return Err(WireError::Order(format!(
                    "{} inside the state",
                    other.name()
                )))
            }
        }
        Ok(false)
    }

    /// The hand-over, once `push` returned true.
    pub fn finish(self) -> Option<Handover<F>> {
        self.h.filter(|_| self.done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Handover<i32> {
        let conn = |id, kind: Kind, fixed: Option<i32>, listen: Option<&str>, up: usize| Conn {
            meta: ConnMeta {
                id,
                kind,
                mh: "10.2.0.100:4000".parse().unwrap(),
                fh: "10.0.0.1:80".parse().unwrap(),
                wireless_local: "10.2.0.1:1080".parse().unwrap(),
                started_us: 1_700_000_000_000_000,
                bytes_up: 5,
                bytes_down: 7,
                moved_in: id == 3,
                up_idle_at_move: (id == 3).then_some(700),
                before: (id, 0),
                listen: listen.map(|a| a.parse().unwrap()),
                admitted: kind != Kind::Listen,
                fixed: false,
                up_pending: 0,
                down_pending: 0,
                kx: (kind == Kind::Handshake).then_some([4; 32]),
            },
            wireless: id as i32 * 10,
            fixed,
            up: (0..up).map(|i| i as u8).collect(),
            down: vec![9; 3],
        };
        Handover {
            header: Header {
                old_pid: 42,
                msr: "msr1".into(),
                footprint: "table inet itcp_msrd".into(),
                stats: Stats {
                    connections_total: 9,
                    ..Default::default()
                },
                last_session_id: 12,
                handoffs: HandoffHistory {
                    new: HistogramState {
                        counts: vec![0, 2, 1],
                        sum_us: 31_000,
                    },
                    ..Default::default()
                },
            },
            mhs: vec![MhRecord {
                mh: "10.2.0.100".parse().unwrap(),
                token: Some("00ff".into()),
                last_greeting_ts: 5,
                hold_gen: 2,
                last_nonce: None,
                last_reply: None,
                claimed: true,
                mac: Some("02:00:00:00:00:64".into()),
                release_hold_in_ms: Some(1500),
                moved_to: Some("msr2".into()),
                came_from: None,
            }],
            sockets: vec![
                (Role::Socks, "10.2.0.1:1080".into(), 3),
                (Role::Greeting, "cell0".into(), 4),
            ],
            mh_listeners: vec![MhListener {
                addr: "10.2.0.100:5003".parse().unwrap(),
                fd: 5,
                queued: vec![("10.0.0.1:40000".parse().unwrap(), 6)],
            }],
            conns: vec![
                // More bytes in transit than one chunk: they span packets.
                conn(1, Kind::Connect, Some(11), None, CHUNK * 2 + 17),
                conn(2, Kind::Listen, None, Some("10.2.0.100:5003"), 0),
                conn(3, Kind::Transparent, Some(31), None, 0),
            ],
        }
    }

    fn assemble(packets: Vec<Packet<i32>>) -> Result<Handover<i32>, WireError> {
        let mut a = Assembler::new();
        let n = packets.len();
        for (i, (p, fds)) in packets.into_iter().enumerate() {
            let (m, payload) = decode(&p)?;
            let done = a.push(m, payload, fds)?;
            assert_eq!(done, i == n - 1, "end only at the end");
        }
        a.finish().ok_or(WireError::Order("no end".into()))
    }

    #[test]
    fn a_handover_survives_the_round_trip() {
        let h = sample();
        let packets = split(&h).unwrap();
        assert!(packets
            .iter()
            .all(|(p, f)| p.len() <= MAX_PACKET && f.len() <= MAX_FDS));
        let got = assemble(packets).unwrap();
        assert_eq!(got.conns[0].up.len(), CHUNK * 2 + 17);
        assert_eq!(got.conns[0].meta.up_pending, CHUNK * 2 + 17);
        assert!(got.conns[0].meta.fixed && !got.conns[1].meta.fixed);
        let mut want = h;
        for c in &mut want.conns {
            c.meta.fixed = c.fixed.is_some();
            c.meta.up_pending = c.up.len();
            c.meta.down_pending = c.down.len();
        }
        assert_eq!(got, want);
    }

    #[test]
    fn packets_keep_their_wire_form() {
        let p = encode(&Msg::Commit, b"").unwrap();
        assert_eq!(&p[..12], b"ITUP\0\0\0\x01\0\0\0\x10");
        assert_eq!(&p[12..], br#"{"msg":"commit"}"#);
        let p = encode(&Msg::Ready { pid: 7 }, b"").unwrap();
        assert_eq!(decode(&p).unwrap(), (Msg::Ready { pid: 7 }, &b""[..]));
    }

    #[test]
    fn bad_packets_say_what_is_wrong() {
        let good = encode(&Msg::Adopted { pid: 1 }, b"").unwrap();
        assert_eq!(decode(&good[..5]), Err(WireError::Short(5)));
        let mut p = good.clone();
        p[0] = b'X';
        assert_eq!(decode(&p), Err(WireError::Magic));
        let mut p = good.clone();
        p[7] = 2;
        let e = decode(&p).unwrap_err();
        assert_eq!(e, WireError::Version(2));
        assert!(e.to_string().contains("restart msrd"), "{e}");
        let mut p = good.clone();
        p[11] = 200;
        assert!(matches!(
            decode(&p),
            Err(WireError::Length { said: 200, .. })
        ));
        let mut p = good[..12].to_vec();
        p[11] = 5;
        p.extend_from_slice(b"{nope");
        let e = decode(&p).unwrap_err().to_string();
        assert!(e.starts_with("hand-over message: "), "{e}");
        assert!(decode(&vec![0; MAX_PACKET + 1]).is_err());
        assert!(matches!(
            encode(&Msg::Pending { id: 1, up: true }, &vec![0; MAX_PACKET]),
            Err(WireError::TooLarge(_))
        ));
        let e = decode(&encode(&Msg::Commit, b"").unwrap()[..12]).unwrap_err();
        assert!(matches!(e, WireError::Length { said: 16, have: 0 }), "{e}");
    }

    #[test]
    fn out_of_order_or_inconsistent_state_is_refused() {
        let packets = split(&sample()).unwrap();
        let msgs: Vec<(Msg, Vec<u8>, Vec<i32>)> = packets
            .iter()
            .map(|(p, f)| {
                let (m, pl) = decode(p).unwrap();
                (m, pl.to_vec(), f.clone())
            })
            .collect();
        let run = |v: Vec<(Msg, Vec<u8>, Vec<i32>)>| -> Result<bool, WireError> {
            let mut a = Assembler::new();
            let mut last = Ok(false);
            for (m, p, f) in v {
                last = a.push(m, &p, f);
                last.as_ref().map_err(|e| e.clone())?;
            }
            last
        };
        assert_eq!(run(msgs.clone()), Ok(true));
        // The header first.
        let e = run(msgs[1..].to_vec()).unwrap_err();
        assert!(e.to_string().contains("before the header"), "{e}");
        // Missing fds.
        let mut v = msgs.clone();
        let i = v
            .iter()
            .position(|(m, ..)| matches!(m, Msg::Conn(_)))
            .unwrap();
        v[i].2.pop();
        let e = run(v).unwrap_err();
        assert_eq!(
            e,
            WireError::Fds {
                msg: "conn",
                want: 2,
                got: 1
            }
        );
        // A connection before the previous one's bytes are all there.
        let mut v = msgs.clone();
        let j = v
            .iter()
            .position(|(m, ..)| matches!(m, Msg::Pending { .. }))
            .unwrap();
        v.remove(j);
        let e = run(v).unwrap_err();
        assert!(e.to_string().contains("still due"), "{e}");
        // Counts that do not add up.
        let mut v = msgs.clone();
        v.retain(|(m, ..)| !matches!(m, Msg::Mh(_)));
        let e = run(v).unwrap_err();
        assert!(e.to_string().contains("end says 1 MHs"), "{e}");
        // Nothing after the end; no conversation messages inside the state.
        let mut v = msgs.clone();
        v.push((Msg::Commit, vec![], vec![]));
        assert!(run(v).unwrap_err().to_string().contains("after end"));
        let mut v = msgs.clone();
        v.insert(1, (Msg::Commit, vec![], vec![]));
        assert!(run(v).unwrap_err().to_string().contains("inside the state"));
        // A relayed kind without its fixed side.
        let mut v = msgs.clone();
        if let Msg::Conn(c) = &mut v[i].0 {
            c.fixed = false;
        }
        v[i].2.pop();
        let e = run(v).unwrap_err();
        assert!(e.to_string().contains("without a fixed side"), "{e}");
        // Payload only on pending bytes.
        let mut v = msgs;
        v[0].1 = b"x".to_vec();
        assert!(run(v).unwrap_err().to_string().contains("payload"));
    }
}
