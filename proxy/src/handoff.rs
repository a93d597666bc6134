//! msrd's side of handoffs (paper §5.4): it runs the sans-IO machines of
//! `itcp_handoff::machine` against real sockets, nftables holds, ARP and the
//! authenticated MSR⇄MSR channel.
//!
//! * MH greetings arrive on a UDP port of the cell ([`serve_greetings`]). A greeting
//!   naming another MSR as the previous one starts the new side: hold the MH's flows,
//!   tell the MH it may send through us, fetch the connections from the old MSR.
//! * The old MSR serves the channel ([`serve_peers`]): a request whose greeting proves
//!   the MH's session token freezes the MH's relays, captures both sockets of every
//!   connection with TCP_REPAIR and ships them.
//! * The new MSR restores them, takes over the MH's address on the fixed LAN (proxy
//!   ARP + gratuitous ARP), releases the hold, restarts the sockets and acknowledges;
//!   the old MSR deletes its copies silently. Without an acknowledgement in time the
//!   old MSR unfreezes and serves on.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use itcp_config::{HandoffSection, UnackedPolicy};
use itcp_handoff::log::{self as hlog, ConnEntry, Record};
use itcp_handoff::machine::{Action, NewEvent, NewSide, OldEvent, OldSide};
use itcp_handoff::{RestoreOptions, SocketImage, UnackedRestore};
use itcp_proto::channel::{self as wire, ConnImage, Envelope, Message, ReplayGuard, WireError};
use itcp_proto::greeting::{GreetMsg, GreetReply, GreetStatus, Greeting};
use itcp_proto::hex::{hex, unhex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::daemon::{Admitted, Daemon};
use crate::relay::Pending;
use crate::sessions::{Kind, Session};

/// A relay paused for a handoff: its sockets and the bytes it had in transit.
pub struct Frozen {
    pub session: Arc<Session>,
    pub wireless: TcpStream,
    /// None for a listener's control connection or a waiting ACCEPT.
    pub fixed: Option<TcpStream>,
    /// The MH's listening address (listener control connections, waiting ACCEPTs).
    pub listen: Option<SocketAddr>,
    pub pending: Pending,
    /// Counted by admission (not listeners' control connections).
    pub admitted: Option<Admitted>,
}

impl std::fmt::Debug for Frozen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Frozen(session {})", self.session.id)
    }
}

/// What this MSR knows about one MH.
#[derive(Default)]
struct MhState {
    /// The MH's session token, bound at first contact or shipped with its connections.
    token: Option<Vec<u8>>,
    /// Highest greeting timestamp accepted: older ones are replays.
    last_greeting_ts: u64,
    /// Bumped by every hold; a delayed release applies only to its own hold.
    hold_gen: u64,
    /// The last greeting answered and the answer, repeated for retransmissions.
    last_nonce: Option<String>,
    last_reply: Option<GreetReply>,
}

/// Handoff state shared by the daemon's tasks.
pub struct Handoffs {
    pub me: String,
    pub cfg: HandoffSection,
    keys: HashMap<String, Vec<u8>>,
    guard: Mutex<ReplayGuard>,
    last_seq: Mutex<u64>,
    next_id: AtomicU64,
    mhs: Mutex<HashMap<IpAddr, MhState>>,
}

/// Microseconds since the UNIX epoch (handoff log phases).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn now_ms() -> u64 {
    now_us() / 1000
}

impl Handoffs {
    /// Reads the peers' keys; errors name the peer.
    pub fn new(me: &str, cfg: &HandoffSection) -> io::Result<Handoffs> {
        let mut keys = HashMap::new();
        for p in &cfg.peers {
            let k = p
                .key_bytes()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            keys.insert(p.id.clone(), k);
        }
        Ok(Handoffs {
            me: me.into(),
            cfg: cfg.clone(),
            keys,
            guard: Mutex::new(ReplayGuard::new(me)),
            last_seq: Mutex::new(0),
            // Unique across restarts: handoff ids start at the clock.
            next_id: AtomicU64::new(now_us()),
            mhs: Mutex::new(HashMap::new()),
        })
    }

    /// Binds an MH's token when it has none yet (first SOCKS request or attachment).
    pub fn bind_token(&self, mh: IpAddr, token: &[u8]) {
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        if st.token.is_none() {
            st.token = Some(token.to_vec());
        }
    }

    fn token(&self, mh: IpAddr) -> Option<Vec<u8>> {
        self.mhs
            .lock()
            .unwrap()
            .get(&mh)
            .and_then(|s| s.token.clone())
    }

    /// Sequence numbers only grow, across connections and restarts (they start at the
    /// clock), so the receiver's replay guard never mistakes a fresh frame for a replay.
    fn next_seq(&self) -> u64 {
        let mut l = self.last_seq.lock().unwrap();
        *l = (*l + 1).max(now_us());
        *l
    }

    fn seal(&self, to: &str, body: Message) -> io::Result<Vec<u8>> {
        let key = self.keys.get(to).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{to:?} is not a configured [[handoff.peer]]"),
            )
        })?;
        let env = Envelope {
            from: self.me.clone(),
            to: to.into(),
            seq: self.next_seq(),
            ts_ms: now_ms(),
            body,
        };
        Ok(wire::seal(&env, key))
    }

    fn open(&self, buf: &[u8]) -> Result<Option<(Envelope, usize)>, WireError> {
        let mut g = self.guard.lock().unwrap();
        wire::open(buf, |p| self.keys.get(p).cloned(), &mut g, now_ms())
    }

    fn hold_gen_bump(&self, mh: IpAddr) -> u64 {
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        st.hold_gen += 1;
        st.hold_gen
    }

    /// The answer to greeting `g`, remembered so that a retransmitted greeting gets it
    /// again.
    fn answer(
        &self,
        mh: IpAddr,
        g: &Greeting,
        status: GreetStatus,
        reason: Option<String>,
        connections: usize,
    ) -> GreetReply {
        let r = GreetReply {
            msr: self.me.clone(),
            nonce: g.nonce.clone(),
            status,
            reason,
            connections,
        };
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        st.last_nonce = Some(r.nonce.clone());
        st.last_reply = Some(r.clone());
        r
    }

    fn hold_gen(&self, mh: IpAddr) -> u64 {
        self.mhs.lock().unwrap().get(&mh).map_or(0, |s| s.hold_gen)
    }
}

/// Why reading a frame failed.
enum ReadError {
    Io(io::Error),
    Closed,
    Wire(WireError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Closed => f.write_str("peer closed the channel"),
            ReadError::Wire(e) => write!(f, "{e}"),
        }
    }
}

/// One MSR⇄MSR connection: frames in and out.
struct Channel {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Channel {
    async fn send(&mut self, h: &Handoffs, to: &str, body: Message) -> io::Result<()> {
        let frame = h.seal(to, body)?;
        self.s.write_all(&frame).await
    }

    async fn recv(&mut self, h: &Handoffs) -> Result<Envelope, ReadError> {
        loop {
            match h.open(&self.buf) {
                Ok(Some((env, n))) => {
                    self.buf.drain(..n);
                    return Ok(env);
                }
                Ok(None) => {}
                Err(e) => return Err(ReadError::Wire(e)),
            }
            let mut chunk = vec![0u8; 256 << 10];
            let n = self.s.read(&mut chunk).await.map_err(ReadError::Io)?;
            if n == 0 {
                return Err(ReadError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn unacked(p: UnackedPolicy) -> UnackedRestore {
    match p {
        UnackedPolicy::Auto => UnackedRestore::Auto,
        UnackedPolicy::AsNew => UnackedRestore::AsNew,
        UnackedPolicy::AsSent => UnackedRestore::AsSent,
    }
}

// ---------------------------------------------------------------------------------
// Routing and holds.

/// Makes the fixed LAN deliver `mh`'s traffic here: proxy ARP, then a gratuitous ARP
/// that repoints neighbours (the GW) which still have the old MSR's MAC.
fn take_over(d: &Daemon, mh: IpAddr) {
    let Some(lan) = &d.handoff_cfg().lan_interface else {
        return;
    };
    if let Err(e) = crate::netlink::proxy_neigh(lan, mh, true) {
        warn!(%mh, interface = %lan, error = %e, "proxy ARP entry not added");
    }
    if let IpAddr::V4(v4) = mh {
        if let Err(e) = crate::netlink::send_garp(lan, v4) {
            warn!(%mh, interface = %lan, error = %e, "gratuitous ARP not sent");
        }
    }
}

fn give_up_route(d: &Daemon, mh: IpAddr) {
    if let Some(lan) = &d.handoff_cfg().lan_interface {
        if let Err(e) = crate::netlink::proxy_neigh(lan, mh, false) {
            warn!(%mh, interface = %lan, error = %e, "proxy ARP entry not removed");
        }
    }
}

fn hold(d: &Daemon, h: &Handoffs, mh: IpAddr) {
    h.hold_gen_bump(mh);
    if let Err(e) = d.rules.hold(mh) {
        warn!(%mh, error = %e, "flow hold not installed");
    }
}

fn release(d: &Daemon, mh: IpAddr) {
    if let Err(e) = d.rules.release(mh) {
        warn!(%mh, error = %e, "flow hold not released");
    }
}

/// Releases the hold after `after` unless another hold was made meanwhile.
fn release_later(d: &Arc<Daemon>, mh: IpAddr, after: Duration) {
    let h = d.handoff.as_ref().unwrap();
    let gen = h.hold_gen(mh);
    let d = d.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let h = d.handoff.as_ref().unwrap();
        if h.hold_gen(mh) == gen {
            release(&d, mh);
        }
    });
}

fn write_log(d: &Daemon, mut r: Record, conns: &[ConnEntry]) {
    r.connections = conns.to_vec();
    let path = &d.handoff_cfg().log_file;
    if let Err(e) = hlog::append(path, &r) {
        warn!(path = %path.display(), error = %e, "handoff log not written");
    }
    info!(
        handoff = r.handoff_id,
        role = ?r.role,
        mh = %r.mh,
        old = %r.old_msr,
        new = %r.new_msr,
        outcome = ?r.outcome,
        reason = r.reason.as_deref().unwrap_or(""),
        connections = r.connections.len(),
        failed = ?r.failed,
        ms = r.duration_ms().unwrap_or(0.0),
        "handoff"
    );
}

// ---------------------------------------------------------------------------------
// Old MSR: freeze, capture, delete or unfreeze.

/// Pauses every relay of `mh` and collects its sockets.
async fn freeze(d: &Daemon, mh: IpAddr) -> Vec<Frozen> {
    let mut waits = Vec::new();
    for s in d.sessions.of_mh(mh) {
        let (tx, rx) = oneshot::channel();
        *s.frozen_to.lock().unwrap() = Some(tx);
        s.pause.send_replace(true);
        waits.push(rx);
    }
    let mut out = Vec::new();
    for rx in waits {
        // A relay that ended meanwhile drops its sender: nothing to move.
        if let Ok(Ok(f)) = tokio::time::timeout(Duration::from_secs(2), rx).await {
            out.push(f);
        }
    }
    out
}

fn capture_one(f: &Frozen) -> io::Result<(ConnImage, ConnEntry)> {
    let w = itcp_handoff::capture(f.wireless.as_fd())?;
    let x = match &f.fixed {
        Some(x) => Some(itcp_handoff::capture(x.as_fd()).inspect_err(|_| {
            let _ = itcp_handoff::unfreeze(f.wireless.as_fd());
        })?),
        None => None,
    };
    let queued = w.queued_bytes() + x.as_ref().map_or(0, |x| x.queued_bytes()) + f.pending.len();
    let kind = f.session.kind.as_str().to_string();
    let entry = ConnEntry {
        id: f.session.id,
        kind: kind.clone(),
        mh: x.as_ref().map_or(f.session.mh, |x| x.local),
        fh: x.as_ref().map_or(f.session.fh, |x| x.remote),
        queued_bytes: queued as u64,
    };
    Ok((
        ConnImage {
            id: f.session.id,
            kind,
            wireless: w.to_bytes(),
            fixed: x.map(|x| x.to_bytes()).unwrap_or_default(),
            up_pending: f.pending.up.clone(),
            down_pending: f.pending.down.clone(),
            listen: f.listen.map(|a| a.to_string()),
        },
        entry,
    ))
}

/// Restarts a frozen connection's service task here (rollback, or a move in).
fn spawn_service(d: &Arc<Daemon>, f: Frozen) {
    let d2 = d.clone();
    match (f.fixed, f.listen, f.admitted) {
        (Some(x), _, Some(adm)) => {
            tokio::spawn(async move {
                d2.relay_session(f.session, f.wireless, x, f.pending, adm)
                    .await
            });
        }
        (None, Some(addr), None) => {
            tokio::spawn(async move { d2.listen_wait(f.session, f.wireless, addr).await });
        }
        (None, Some(addr), Some(adm)) => {
            tokio::spawn(async move {
                let _ = d2.accept_wait(f.session, f.wireless, addr, adm).await;
            });
        }
        _ => warn!(
            id = f.session.id,
            "frozen connection without a service: dropped"
        ),
    }
}

/// Puts frozen connections back to work here (rollback): the hold is already off.
fn resume(d: &Arc<Daemon>, frozen: Vec<Frozen>) {
    for f in frozen {
        for s in std::iter::once(&f.wireless).chain(f.fixed.as_ref()) {
            if let Ok(true) = itcp_handoff::repair::in_repair(s.as_fd()) {
                if let Err(e) = itcp_handoff::unfreeze(s.as_fd()) {
                    warn!(id = f.session.id, error = %e, "cannot unfreeze a socket");
                }
            }
        }
        f.session.pause.send_replace(false);
        f.session.frozen.store(false, Ordering::Relaxed);
        spawn_service(d, f);
    }
}

/// Deletes the moved copies without a packet, and closes their sessions here.
fn delete(d: &Daemon, frozen: Vec<Frozen>) {
    for f in frozen {
        if let (Kind::Listen, Some(addr)) = (f.session.kind, f.listen) {
            d.listeners.remove(addr);
        }
        for s in std::iter::once(f.wireless).chain(f.fixed) {
            match s.into_std() {
                Ok(std) => {
                    if let Err(e) = itcp_handoff::delete(OwnedFd::from(std)) {
                        // Closing it now could send a FIN: keep the fd (a leak, logged).
                        warn!(id = f.session.id, error = %e.error, "socket not deleted");
                        std::mem::forget(e.fd);
                    }
                }
                Err(e) => warn!(id = f.session.id, error = %e, "socket not deleted"),
            }
        }
        d.sessions
            .stats
            .connections_moved_out
            .fetch_add(1, Ordering::Relaxed);
        d.sessions.close(&f.session);
        drop(f.admitted);
    }
}

/// Serves the MSR⇄MSR channel: each connection carries one handoff, asked by a peer.
pub async fn serve_peers(d: Arc<Daemon>, l: TcpListener) {
    loop {
        match l.accept().await {
            Ok((s, peer)) => {
                let _ = s.set_nodelay(true);
                tokio::spawn(old_side(d.clone(), s, peer));
            }
            Err(e) => {
                warn!(error = %e, "handoff channel accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn rejected(d: &Daemon, peer: SocketAddr, e: &dyn std::fmt::Display) {
    d.sessions
        .stats
        .handoff_messages_rejected
        .fetch_add(1, Ordering::Relaxed);
    warn!(%peer, error = %e, "handoff message rejected");
}

async fn old_side(d: Arc<Daemon>, s: TcpStream, peer: SocketAddr) {
    let h = d.handoff.as_ref().unwrap();
    let mut ch = Channel { s, buf: Vec::new() };
    let env = match tokio::time::timeout(Duration::from_secs(10), ch.recv(h)).await {
        Ok(Ok(env)) => env,
        Ok(Err(ReadError::Wire(e))) => return rejected(&d, peer, &e),
        Ok(Err(e)) => return debug!(%peer, error = %e, "handoff channel closed"),
        Err(_) => return debug!(%peer, "handoff channel idle: closed"),
    };
    let from = env.from.clone();
    let Message::HandoffRequest {
        handoff_id,
        greeting,
    } = env.body
    else {
        return rejected(&d, peer, &format!("{from:?} opened with {:?}", env.body));
    };
    let mh = crate::admission::canonical(greeting.mh);
    // A greeting is good once: an older (or the same) timestamp is a replay.
    let fresh = {
        let mut m = h.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        if greeting.ts_ms > st.last_greeting_ts {
            st.last_greeting_ts = greeting.ts_ms;
            true
        } else {
            false
        }
    };
    let token = if fresh { h.token(mh) } else { None };
    let (mut m, mut acts) = OldSide::start(
        &h.me,
        &from,
        handoff_id,
        &greeting,
        token.as_deref(),
        now_us(),
    );
    if !fresh {
        // Same refusal path as a bad proof, with the true reason.
        acts = vec![
            Action::Send(Message::Abort {
                handoff_id,
                reason: "greeting already used (replayed)".into(),
            }),
            Action::Log(Record {
                reason: Some("greeting already used (replayed)".into()),
                ..match acts.iter().find_map(|a| match a {
                    Action::Log(r) => Some(r.clone()),
                    _ => None,
                }) {
                    Some(r) => r,
                    None => return,
                }
            }),
        ];
    }
    let mut frozen: Vec<Frozen> = Vec::new();
    let mut entries: Vec<ConnEntry> = Vec::new();
    let ack_timeout = Duration::from_millis(h.cfg.ack_timeout_ms);
    loop {
        let mut next: Option<OldEvent> = None;
        for a in acts.drain(..) {
            match a {
                Action::FreezeAndCapture(mh) => {
                    let t0 = std::time::Instant::now();
                    hold(&d, h, mh);
                    let t_hold = t0.elapsed();
                    frozen = freeze(&d, mh).await;
                    let t_freeze = t0.elapsed();
                    let mut images = Vec::new();
                    let mut failure = None;
                    for f in &frozen {
                        f.session.frozen.store(true, Ordering::Relaxed);
                        match capture_one(f) {
                            Ok((img, e)) => {
                                images.push(img);
                                entries.push(e);
                            }
                            Err(e) => {
                                warn!(id = f.session.id, error = %e, "connection cannot be captured: the handoff is off");
                                failure = Some(format!("connection {}: {e}", f.session.id));
                                break;
                            }
                        }
                    }
                    debug!(
                        hold_us = t_hold.as_micros() as u64,
                        pause_us = (t_freeze - t_hold).as_micros() as u64,
                        capture_us = (t0.elapsed() - t_freeze).as_micros() as u64,
                        connections = images.len(),
                        "frozen and captured"
                    );
                    next = Some(match failure {
                        None => OldEvent::Captured(images),
                        // Unfreeze (which follows) resumes every frozen connection here.
                        Some(reason) => OldEvent::CaptureFailed(reason),
                    });
                }
                Action::Send(msg) => {
                    let t0 = std::time::Instant::now();
                    if let Err(e) = ch.send(h, &from, msg).await {
                        warn!(peer = %from, error = %e, "handoff message not sent");
                    }
                    debug!(us = t0.elapsed().as_micros() as u64, "sent to the new MSR");
                }
                Action::Delete(ids) => {
                    let (gone, stay): (Vec<Frozen>, Vec<Frozen>) = std::mem::take(&mut frozen)
                        .into_iter()
                        .partition(|f| ids.contains(&f.session.id));
                    frozen = stay;
                    delete(&d, gone);
                    give_up_route(&d, mh);
                    d.sessions
                        .stats
                        .handoffs_out
                        .fetch_add(1, Ordering::Relaxed);
                    // Stray TCP of the MH that still reaches us is dropped, never
                    // forwarded to the MH nor answered, until the LAN has moved on.
                    release_later(&d, mh, Duration::from_millis(h.cfg.hold_after_ms));
                }
                Action::Unfreeze(mh) => {
                    release(&d, mh);
                    d.sessions
                        .stats
                        .handoffs_failed
                        .fetch_add(1, Ordering::Relaxed);
                    resume(&d, std::mem::take(&mut frozen));
                }
                Action::Log(r) => {
                    if r.outcome == hlog::Outcome::Rejected {
                        d.sessions
                            .stats
                            .handoffs_failed
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    write_log(&d, r, &entries)
                }
                other => debug!(action = ?other, "not an old-side action"),
            }
        }
        if let Some(ev) = next {
            acts = m.handle(ev, now_us());
            continue;
        }
        if m.done() {
            return;
        }
        let ev = match tokio::time::timeout(ack_timeout, ch.recv(h)).await {
            Ok(Ok(env)) if env.from == from => OldEvent::Message(env.body),
            Ok(Ok(env)) => {
                rejected(
                    &d,
                    peer,
                    &format!("{:?} spoke on {from:?}'s channel", env.from),
                );
                continue;
            }
            Ok(Err(ReadError::Wire(e))) => {
                rejected(&d, peer, &e);
                OldEvent::Timeout
            }
            // The new MSR went away (crashed?): nothing was acknowledged, serve on.
            Ok(Err(_)) | Err(_) => OldEvent::Timeout,
        };
        acts = m.handle(ev, now_us());
    }
}

// ---------------------------------------------------------------------------------
// New MSR: greeting, fetch, restore, take over, restart.

/// A restored connection waiting for its restart.
struct Restored {
    id: u64,
    kind: Kind,
    wireless: (OwnedFd, SocketImage),
    fixed: Option<(OwnedFd, SocketImage)>,
    listen: Option<SocketAddr>,
    pending: Pending,
}

fn decode(b: &[u8]) -> io::Result<SocketImage> {
    SocketImage::from_bytes(b)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

fn restore_one(c: &ConnImage, policy: UnackedRestore, fwmark: u32) -> io::Result<Restored> {
    let kind = Kind::parse(&c.kind).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown connection kind {:?}", c.kind),
        )
    })?;
    let listen = match &c.listen {
        Some(a) => Some(a.parse::<SocketAddr>().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad listen address {a:?}"),
            )
        })?),
        None => None,
    };
    if kind.relays() == c.fixed.is_empty() || kind.relays() == listen.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a {:?} image must {}have a fixed side",
                c.kind,
                if kind.relays() { "" } else { "not " }
            ),
        ));
    }
    let w = decode(&c.wireless)?;
    let pending = Pending {
        up: c.up_pending.clone(),
        down: c.down_pending.clone(),
    };
    let opts = RestoreOptions {
        transparent: w.sockopts.transparent,
        unacked: policy,
        nonblocking: true,
        // A peer's FIN is replayed as a raw packet to the socket's own address; for a
        // fixed-side socket that is the MH's address, which without msrd's mark would
        // be routed out to the cell (and dropped by the hold) instead of to us.
        inject_mark: fwmark,
    };
    let wfd = itcp_handoff::restore(&w, &opts)?;
    let xopts = RestoreOptions {
        transparent: true,
        ..opts
    };
    // On failure `wfd` is dropped in repair mode: nothing is sent.
    let fixed = if kind.relays() {
        let x = decode(&c.fixed)?;
        let xfd = itcp_handoff::restore(&x, &xopts)?;
        Some((xfd, x))
    } else {
        None
    };
    Ok(Restored {
        id: c.id,
        kind,
        wireless: (wfd, w),
        fixed,
        listen,
        pending,
    })
}

/// A restored socket starts with the initial window of its route. Bytes that were in
/// flight are re-sent at restart only if that first flight covers all of them (else the
/// MH's ACKs for bytes beyond it are dropped and the connection waits for an RTO,
/// ~4 s): for the restore, the MH gets a host route whose `initcwnd` covers the largest
/// flight. Removed again once the sockets run (they keep their window).
struct FlightRoute {
    mh: IpAddr,
    dev: String,
}

impl FlightRoute {
    fn install(mh: IpAddr, dev: Option<String>, images: &[ConnImage]) -> Option<FlightRoute> {
        let dev = dev?;
        let segs = images
            .iter()
            .filter_map(|c| SocketImage::from_bytes(&c.wireless).ok())
            .map(|w| {
                let mss = w.options.mss.max(536) as usize;
                w.send.unacked.len().div_ceil(mss) + 1
            })
            .max()?;
        if segs <= 10 {
            return None; // The default initial window covers it.
        }
        let prefix = if mh.is_ipv4() { "32" } else { "128" };
        let cwnd = (segs + 2).min(1000).to_string();
        let ok = std::process::Command::new("ip")
            .args([
                "route",
                "replace",
                &format!("{mh}/{prefix}"),
                "dev",
                &dev,
                "initcwnd",
                &cwnd,
            ])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            warn!(%mh, %dev, "no initcwnd route for the restore: bytes in flight wait for a timeout");
            return None;
        }
        Some(FlightRoute { mh, dev })
    }
}

impl Drop for FlightRoute {
    fn drop(&mut self) {
        let prefix = if self.mh.is_ipv4() { "32" } else { "128" };
        let _ = std::process::Command::new("ip")
            .args([
                "route",
                "del",
                &format!("{}/{prefix}", self.mh),
                "dev",
                &self.dev,
            ])
            .status();
    }
}

/// Restarts restored sockets and starts their services (listeners first, so that
/// waiting ACCEPTs find them).
fn restart_all(d: &Arc<Daemon>, mut restored: Vec<Restored>) -> Vec<(u64, String)> {
    restored.sort_by_key(|r| r.kind != Kind::Listen);
    let mut failed = Vec::new();
    for r in restored {
        let res =
            itcp_handoff::restart(r.wireless.0.as_fd(), &r.wireless.1).and_then(|()| {
                match &r.fixed {
                    Some((fd, img)) => itcp_handoff::restart(fd.as_fd(), img),
                    None => Ok(()),
                }
            });
        if let Err(e) = res {
            warn!(id = r.id, error = %e, "restored connection did not restart");
            failed.push((r.id, e.to_string()));
            continue;
        }
        if let (Kind::Listen, Some(addr)) = (r.kind, r.listen) {
            if let Err(e) = d.listeners.listen(addr, &d.cfg.fixed) {
                warn!(id = r.id, %addr, error = %e, "listener not re-created");
                failed.push((r.id, format!("listen {addr}: {e}")));
                continue;
            }
        }
        let conv = |fd: OwnedFd| {
            let s = std::net::TcpStream::from(fd);
            s.set_nonblocking(true)?;
            TcpStream::from_std(s)
        };
        let wimg = r.wireless.1;
        let wl = wimg.local;
        let w = match conv(r.wireless.0) {
            Ok(w) => w,
            Err(e) => {
                failed.push((r.id, e.to_string()));
                continue;
            }
        };
        let (fixed, mh, fh) = match r.fixed {
            Some((fd, img)) => match conv(fd) {
                Ok(x) => (Some(x), img.local, img.remote),
                Err(e) => {
                    failed.push((r.id, e.to_string()));
                    continue;
                }
            },
            None => {
                let a = r.listen.unwrap_or(wimg.remote);
                (None, a, a)
            }
        };
        let s = d.sessions.open_moved(r.kind, mh, fh, wl);
        info!(id = s.id, from_id = r.id, kind = r.kind.as_str(), %mh, %fh, "connection moved in");
        let admitted = (r.kind != Kind::Listen).then(|| d.admit_moved(s.mh_ip()));
        spawn_service(
            d,
            Frozen {
                session: s,
                wireless: w,
                fixed,
                listen: r.listen,
                pending: r.pending,
                admitted,
            },
        );
    }
    failed
}

/// Serves MH greetings on the cell(s).
pub async fn serve_greetings(d: Arc<Daemon>, sock: UdpSocket) {
    let sock = Arc::new(sock);
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "greeting socket failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let msg: GreetMsg = match serde_json::from_slice(&buf[..n]) {
            Ok(m) => m,
            Err(e) => {
                d.sessions
                    .stats
                    .greetings_rejected
                    .fetch_add(1, Ordering::Relaxed);
                warn!(%from, error = %e, "malformed greeting rejected");
                continue;
            }
        };
        on_greeting(&d, &sock, from, msg).await;
    }
}

async fn reply(sock: &UdpSocket, to: SocketAddr, r: &GreetReply) {
    let b = serde_json::to_vec(r).expect("replies serialize");
    if let Err(e) = sock.send_to(&b, to).await {
        debug!(%to, error = %e, "greeting reply not sent");
    }
}

async fn on_greeting(d: &Arc<Daemon>, sock: &Arc<UdpSocket>, from: SocketAddr, msg: GreetMsg) {
    let h = d.handoff.as_ref().unwrap();
    let g = msg.greeting;
    if g.new_msr != h.me {
        return; // Meant for another MSR whose cell overlaps ours.
    }
    let mh = crate::admission::canonical(g.mh);
    let count_rejected = || {
        d.sessions
            .stats
            .greetings_rejected
            .fetch_add(1, Ordering::Relaxed)
    };
    if crate::admission::canonical(from.ip()) != mh || !d.is_mh(mh) {
        count_rejected();
        warn!(%from, mh = %g.mh, "greeting rejected: sender is not the MH it names, or not an MH of ours");
        return;
    }
    // A retransmitted greeting gets the answer it got before.
    let again = {
        let m = h.mhs.lock().unwrap();
        m.get(&mh)
            .filter(|s| s.last_nonce.as_deref() == Some(g.nonce.as_str()))
            .and_then(|s| s.last_reply.clone())
    };
    if let Some(r) = again {
        return reply(sock, from, &r).await;
    }
    let sessions = d.sessions.of_mh(mh);
    if sessions.iter().any(|s| s.frozen.load(Ordering::Relaxed)) {
        // We are handing this MH's connections to another MSR right now: answer once
        // that has settled (moved or rolled back); the MH retransmits its greeting.
        debug!(%mh, "greeting deferred: a handoff of this MH is under way");
        return;
    }
    // None of them is frozen (above): they are live here.
    let local = sessions.len();
    // First contact; or back at the MSR that still serves the connections (the other
    // MSR failed, crashed or never took them): nothing to fetch, only routing.
    if g.prev_msr.is_empty() || g.prev_msr == h.me || local > 0 {
        let bound = h.token(mh);
        let ok = match (&bound, &msg.token) {
            (Some(t), _) => g.verify(t),
            (None, Some(hex)) => match unhex(hex) {
                Some(t) if g.verify(&t) => {
                    h.bind_token(mh, &t);
                    true
                }
                _ => false,
            },
            (None, None) => local == 0,
        };
        if !ok {
            count_rejected();
            warn!(%mh, "attachment refused: greeting proof does not match the MH's token");
            let reason = Some("proof does not match the MH's session token".into());
            let r = h.answer(mh, &g, GreetStatus::Refused, reason, 0);
            return reply(sock, from, &r).await;
        }
        h.hold_gen_bump(mh);
        release(d, mh);
        take_over(d, mh);
        info!(%mh, connections = local, "MH attached");
        let r = h.answer(mh, &g, GreetStatus::Attached, None, local);
        return reply(sock, from, &r).await;
    }
    let Some(peer) = h.cfg.peer(&g.prev_msr).cloned() else {
        count_rejected();
        let reason = format!("previous MSR {:?} is not a peer of {}", g.prev_msr, h.me);
        warn!(%mh, %reason, "greeting refused");
        let r = h.answer(mh, &g, GreetStatus::Refused, Some(reason), 0);
        return reply(sock, from, &r).await;
    };
    let id = h.next_id.fetch_add(1, Ordering::Relaxed);
    let (m, acts) = NewSide::start(id, &h.me, g.clone(), now_us());
    let (d, sock) = (d.clone(), sock.clone());
    tokio::spawn(async move { new_side(d, sock, from, m, acts, peer.address).await });
}

async fn new_side(
    d: Arc<Daemon>,
    sock: Arc<UdpSocket>,
    mh_addr: SocketAddr,
    mut m: NewSide,
    mut acts: Vec<Action>,
    peer_addr: SocketAddr,
) {
    let h = d.handoff.as_ref().unwrap();
    let g = m.greeting().clone();
    let mh = crate::admission::canonical(g.mh);
    let prev = g.prev_msr.clone();
    let timeout = Duration::from_millis(h.cfg.images_timeout_ms);
    let mut ch: Option<Channel> = None;
    let mut restored: Vec<Restored> = Vec::new();
    let mut flight_route: Option<FlightRoute> = None;
    let mut entries: Vec<ConnEntry> = Vec::new();
    let mut moved = 0usize;
    loop {
        let mut next: Option<NewEvent> = None;
        for a in acts.drain(..) {
            match a {
                Action::Hold(mh) => {
                    hold(&d, h, mh);
                    // From here the MH may send through us: its segments are held.
                    let r = h.answer(mh, &g, GreetStatus::Holding, None, 0);
                    reply(&sock, mh_addr, &r).await;
                }
                Action::Send(msg) => {
                    if ch.is_none() {
                        match tokio::time::timeout(timeout, TcpStream::connect(peer_addr)).await {
                            Ok(Ok(s)) => {
                                let _ = s.set_nodelay(true);
                                ch = Some(Channel { s, buf: Vec::new() });
                            }
                            Ok(Err(e)) => {
                                warn!(peer = %prev, addr = %peer_addr, error = %e, "cannot reach the previous MSR");
                                next = Some(NewEvent::Timeout);
                                continue;
                            }
                            Err(_) => {
                                next = Some(NewEvent::Timeout);
                                continue;
                            }
                        }
                    }
                    if let Err(e) = ch.as_mut().unwrap().send(h, &prev, msg).await {
                        warn!(peer = %prev, error = %e, "handoff message not sent");
                    }
                }
                Action::Restore(images) => {
                    // Test hook: die between receiving the images and restoring them,
                    // to show the old MSR keeps every connection (README, testing).
                    if std::env::var("MSRD_FAULT").as_deref() == Ok("exit_before_restore") {
                        tracing::error!("MSRD_FAULT=exit_before_restore: exiting mid-handoff");
                        std::process::exit(70);
                    }
                    if let Some(t) = m.token().and_then(unhex) {
                        let mut mm = h.mhs.lock().unwrap();
                        mm.entry(mh).or_default().token = Some(t);
                    }
                    let policy = unacked(h.cfg.unacked);
                    let fwmark = d.cfg.interception.fwmark;
                    let dev = d.cell_interface(mh);
                    let (ok, failed, es, route) = tokio::task::spawn_blocking(move || {
                        let route = FlightRoute::install(mh, dev, &images);
                        let (mut ok, mut failed, mut es) = (Vec::new(), Vec::new(), Vec::new());
                        for c in &images {
                            match restore_one(c, policy, fwmark) {
                                Ok(r) => {
                                    let (mh, fh, xq) = match &r.fixed {
                                        Some((_, x)) => (x.local, x.remote, x.queued_bytes()),
                                        None => {
                                            let a = r.listen.unwrap_or(r.wireless.1.remote);
                                            (a, a, 0)
                                        }
                                    };
                                    es.push(ConnEntry {
                                        id: r.id,
                                        kind: c.kind.clone(),
                                        mh,
                                        fh,
                                        queued_bytes: (r.wireless.1.queued_bytes()
                                            + xq
                                            + r.pending.len())
                                            as u64,
                                    });
                                    ok.push(r)
                                }
                                Err(e) => failed.push((c.id, e.to_string())),
                            }
                        }
                        (ok, failed, es, route)
                    })
                    .await
                    .expect("restore task");
                    flight_route = route;
                    entries = es;
                    restored = ok;
                    next = Some(NewEvent::Restored {
                        restored: restored.iter().map(|r| r.id).collect(),
                        failed,
                    });
                }
                Action::Reroute(mh) => take_over(&d, mh),
                Action::Release(mh) => {
                    release(&d, mh);
                    let rs = std::mem::take(&mut restored);
                    moved = rs.len();
                    if moved > 0 {
                        let d2 = d.clone();
                        let failed = tokio::task::spawn_blocking(move || restart_all(&d2, rs))
                            .await
                            .expect("restart task");
                        moved -= failed.len();
                    }
                    // The sockets run with their window now: the host route goes.
                    drop(flight_route.take());
                }
                Action::Log(r) => {
                    let ok =
                        r.outcome == hlog::Outcome::Moved || r.outcome == hlog::Outcome::Partial;
                    let c = if ok {
                        &d.sessions.stats.handoffs_in
                    } else {
                        &d.sessions.stats.handoffs_failed
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                    let reason = r.reason.clone();
                    write_log(&d, r, &entries);
                    let rep = if ok {
                        h.answer(mh, &g, GreetStatus::Moved, None, moved)
                    } else {
                        h.answer(mh, &g, GreetStatus::Failed, reason, 0)
                    };
                    reply(&sock, mh_addr, &rep).await;
                }
                other => debug!(action = ?other, "not a new-side action"),
            }
        }
        if let Some(ev) = next {
            acts = m.handle(ev, now_us());
            continue;
        }
        if m.done() {
            return;
        }
        let ev = match &mut ch {
            None => NewEvent::Timeout,
            Some(c) => match tokio::time::timeout(timeout, c.recv(h)).await {
                Ok(Ok(env)) if env.from == prev => NewEvent::Message(env.body),
                Ok(Ok(env)) => {
                    rejected(
                        &d,
                        peer_addr,
                        &format!("{:?} spoke on {prev:?}'s channel", env.from),
                    );
                    NewEvent::Timeout
                }
                Ok(Err(ReadError::Wire(e))) => {
                    rejected(&d, peer_addr, &e);
                    NewEvent::Timeout
                }
                Ok(Err(_)) | Err(_) => NewEvent::Timeout,
            },
        };
        acts = m.handle(ev, now_us());
    }
}

/// Greeting messages are plain JSON; this builds one (for tests and the MH agent).
pub fn greeting_bytes(g: &Greeting, token: Option<&[u8]>) -> Vec<u8> {
    serde_json::to_vec(&GreetMsg {
        greeting: g.clone(),
        token: token.map(hex),
    })
    .expect("greetings serialize")
}
