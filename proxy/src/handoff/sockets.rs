//! The socket work of a handoff, shared by both sides: pause relays and capture their
//! sockets (old MSR), restore and restart them (new MSR), delete moved copies without
//! a packet, resume what stays.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use itcp_config::UnackedPolicy;
use itcp_handoff::log::ConnEntry;
use itcp_handoff::{RestoreOptions, SocketImage, UnackedRestore};
use itcp_proto::channel::ConnImage;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::daemon::Daemon;
use crate::faults::{fault, fault_delay};
use crate::relay::Pending;
use crate::sessions::Frozen;
use crate::sessions::Kind;

pub fn unacked(p: UnackedPolicy) -> UnackedRestore {
    match p {
        UnackedPolicy::Auto => UnackedRestore::Auto,
        UnackedPolicy::AsNew => UnackedRestore::AsNew,
        UnackedPolicy::AsSent => UnackedRestore::AsSent,
    }
}

/// Waits (`[handoff] setup_wait_ms`) until no fixed-side connect of `mh` is in flight
/// and no connection of its is on its way to the session table, so that they move as
/// relays; no new fixed-side setup of `mh` starts from here on. Called before the flow
/// hold, which would drop the connects' SYN retransmissions and queue the FH's
/// SYN-ACKs, and again under the hold (a short `bound`) for what was accepted in
/// between.
pub async fn settle(d: &Daemon, mh: IpAddr, bound: Option<Duration>) {
    let wait = bound.unwrap_or(Duration::from_millis(d.handoff_cfg().setup_wait_ms));
    let left = d.inflight.settle(mh, wait).await;
    if left > 0 {
        warn!(%mh, left, wait_ms = wait.as_millis() as u64,
            "fixed-side connects still in flight: they stay at this MSR");
    }
}

/// Pauses every connection of `mh` and collects its sockets: relays, listeners, and
/// connections in setup that wait for the MH (after [`settle`]).
///
/// A relay that ends as it is asked goes on as a new `closing` session when its bytes
/// or FIN are still on their way (`Daemon::relay_session`). If it saw our ask, it
/// answers with that session; if it ended first, the ask is taken back (nobody would
/// answer it) and the next listing finds the closing session. Listings repeat until
/// one brings nothing new: a relay that went on as a session the freeze never asked
/// would otherwise stay behind, and the freeze wait for it.
pub async fn freeze(d: &Daemon, mh: IpAddr) -> Vec<Frozen> {
    /// Listings at most: a relay ends once, so a second one finds what a first missed.
    const ROUNDS: usize = 4;
    let mut listed = d.sessions.of_mh(mh);
    if fault("freeze_race") {
        // Test hook: a relay ends between this listing and our asking it (at most
        // 2 s is waited for one of the listed sessions to leave the table).
        tracing::info!(%mh, "MSRD_FAULT=freeze_race: waiting for a listed relay to end");
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while listed.iter().all(|s| d.sessions.is_open(s.id)) && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut asked = std::collections::HashSet::new();
    let mut out: Vec<Frozen> = Vec::new();
    for _ in 0..ROUNDS {
        let (mut waits, mut ended) = (Vec::new(), false);
        for s in listed {
            if !asked.insert(s.id) || out.iter().any(|f| f.session.id == s.id) {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            *s.frozen_to.lock().unwrap() = Some(tx);
            s.pause.send_replace(true);
            if !d.sessions.is_open(s.id) && s.frozen_to.lock().unwrap().take().is_some() {
                ended = true; // Ended before our ask: its successor is listed next.
                continue;
            }
            waits.push(rx);
        }
        for rx in waits {
            // A relay that ended meanwhile drops its sender: nothing to move.
            if let Ok(Ok(f)) = tokio::time::timeout(Duration::from_secs(2), rx).await {
                out.push(f);
            }
        }
        if !ended {
            break; // Every relay asked answered or is gone: nothing new to list.
        }
        listed = d.sessions.of_mh(mh);
    }
    out
}

/// The socket's connection ended (CLOSED or TIME_WAIT): it cannot be captured, though
/// bytes may still wait in its receive queue.
fn finished(fd: BorrowedFd<'_>) -> bool {
    use itcp_handoff::repair::{state, tcp_info};
    tcp_info(fd).is_ok_and(|i| matches!(i.state, state::CLOSE | state::TIME_WAIT))
}

/// Finished, and nothing is left to read from it.
fn over(fd: BorrowedFd<'_>) -> bool {
    finished(fd) && itcp_handoff::repair::inq(fd).is_ok_and(|n| n == 0)
}

/// A relay frozen after its fixed side finished (the FH's FIN and ours both done, so
/// that socket cannot be captured) but before it copied the FH's last bytes: they go
/// into the wireless socket's send queue (the hold keeps them from leaving), then our
/// FIN, and the connection can move as `closing`. False, changing nothing, when the
/// bytes do not fit or the MH's own bytes could no longer reach the FH.
fn close_out(f: &Frozen, x: BorrowedFd<'_>) -> bool {
    let w = f.wireless.as_fd();
    if !f.pending.up.is_empty() || itcp_handoff::repair::inq(w).map_or(true, |n| n > 0) {
        return false;
    }
    pass_last(
        f.session.id,
        x,
        w,
        &f.pending.down,
        "FH's last bytes only partly queued to the MH",
    )
}

/// A relay frozen after its wireless side finished (the MH's FIN and ours both done:
/// that socket cannot be captured) but before it passed the MH's FIN on to the FH,
/// which has sent its own: only our FIN to the FH is due, after the MH's last bytes.
/// Sent from here, the connection is over; its flows go with the images as closed ones,
/// so the FH's ACK of that FIN, which goes wherever the MH is, meets silence there and
/// at every MSR after (soak, seed 59: kept here as uncapturable, the connection's FH
/// ACKs reached the MH two moves later, which reset them). False, changing nothing,
/// unless all of that holds and the MH's bytes fit in the fixed socket's send buffer.
fn finish_out(f: &Frozen, x: BorrowedFd<'_>) -> bool {
    use itcp_handoff::repair::{inq, state, tcp_info};
    // The FH's FIN is in: it sends nothing more this relay would have to deliver.
    let fh_done = tcp_info(x).is_ok_and(|i| {
        matches!(
            i.state,
            state::CLOSE_WAIT | state::LAST_ACK | state::CLOSING | state::TIME_WAIT
        )
    });
    let w = f.wireless.as_fd();
    if !finished(w) || !fh_done || !f.pending.down.is_empty() || inq(x).map_or(true, |n| n > 0) {
        return false;
    }
    let done = pass_last(
        f.session.id,
        w,
        x,
        &f.pending.up,
        "MH's last bytes only partly queued to the FH",
    );
    if done {
        tracing::info!(
            conn = f.session.id,
            "the MH's end finished while frozen: our FIN to the FH goes from here"
        );
    }
    done
}

/// The last bytes of a finished `from` (those the relay had `taken`, then those still
/// in its receive queue) into `to`'s send queue, then our FIN on `to`. False, taking
/// nothing, when they do not all fit: the kernel counts buffer overhead against
/// SO_SNDBUF, half of it is payload.
fn pass_last(
    conn: u64,
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    taken: &[u8],
    partly: &str,
) -> bool {
    use itcp_handoff::repair::{inq, outq};
    use nix::sys::socket::{recv, send, MsgFlags};
    use std::os::fd::AsRawFd;
    let Ok(unread) = inq(from) else { return false };
    let room = socket2::SockRef::from(&to).send_buffer_size().unwrap_or(0) / 2;
    let queued = outq(to).map_or(usize::MAX, |n| n as usize);
    if taken.len() + unread as usize > room.saturating_sub(queued) {
        return false;
    }
    let mut rest = taken.to_vec();
    let mut buf = [0u8; 16384];
    loop {
        match recv(from.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => break,
            Ok(n) => rest.extend_from_slice(&buf[..n]),
            Err(_) => return false,
        }
    }
    let mut off = 0;
    while off < rest.len() {
        let sent = send(
            to.as_raw_fd(),
            &rest[off..],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        );
        let Ok(n @ 1..) = sent else {
            // Not expected after the room check above: say what is lost.
            tracing::error!(
                conn,
                queued = off,
                of = rest.len(),
                "{partly}: the rest is lost"
            );
            return false;
        };
        off += n;
    }
    // Already shut (LAST_ACK and after): nothing to do, it finishes on its own.
    crate::sockopt::shutdown_write(to).is_ok()
}

/// Socket work (capture, restore, restart) of at most this many connections runs on
/// the handoff's own task.
pub const FEW: usize = 4;

/// Runs socket work: on the handoff's own task for a few connections, where a hop to
/// the blocking pool and back (~60 µs) would cost more than the work; on the blocking
/// pool for more, which would hold a runtime worker for milliseconds.
pub async fn socket_work<R: Send + 'static>(
    few: bool,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    if few {
        f()
    } else {
        tokio::task::spawn_blocking(f).await.expect("socket task")
    }
}

/// What capturing one connection came to ([`capture_one`]): its image, its log entry,
/// and its wireless flow with what this MSR had sent the MH on it (`crate::departed`).
pub type Captured = io::Result<Option<(ConnImage, ConnEntry, (crate::departed::Flow, u32))>>;

/// Captures every frozen connection, on every core when there are many (each
/// capture is independent: ~45 µs of syscalls for a relay's two sockets).
pub fn capture_all(frozen: &[Frozen], mark: u32) -> Vec<Captured> {
    on_all_cores(frozen, 64, |f| {
        f.session.frozen.store(true, Ordering::Relaxed);
        capture_one(f, mark)
    })
}

/// Captures a frozen connection. `None`: it finished while it froze, nothing moves.
/// A relay whose fixed side finished moves as `closing`: its wireless side drains to
/// the MH at the new MSR (see [`close_out`]). Socket states are looked at only when a
/// capture fails, so the common case costs nothing more.
/// `mark`: msrd's fwmark, for the segment a rollback replays ([`itcp_handoff::unfreeze`]).
pub fn capture_one(f: &Frozen, mark: u32) -> Captured {
    // Test hook (docs/testing.md): a connection that cannot be captured stays here
    // while the MH's others move.
    if let Some(port) = fault_capture() {
        let hit = |p: u16| {
            f.flows()
                .iter()
                .any(|(a, z)| a.port() == p || z.port() == p)
        };
        if port.is_none_or(hit) {
            return Err(io::Error::other(
                "MSRD_FAULT=fail_capture: injected capture failure",
            ));
        }
    }
    let mut kind = f.session.kind;
    if let Some(x) = &f.fixed {
        if kind.relays() && finish_out(f, x.as_fd()) {
            return Ok(None);
        }
    }
    // The fixed side first: closing a relay out writes to the wireless socket, which
    // must happen before that one is captured.
    let x = match &f.fixed {
        // A closing relay's fixed side stays: the FH is on the fixed LAN, reachable
        // from here, and has its data; only its last ACK or FIN may still be due, and
        // the new MSR drops what strays its way (the flow travels in `closed`).
        Some(_) if kind == Kind::Closing => None,
        Some(x) => match itcp_handoff::capture(x.as_fd()) {
            Ok(img) => Some(img),
            Err(e) if !finished(x.as_fd()) => return Err(e),
            Err(e) => {
                if over(x.as_fd()) && over(f.wireless.as_fd()) && f.pending.is_empty() {
                    return Ok(None);
                }
                let relay = matches!(
                    kind,
                    Kind::Connect | Kind::Transparent | Kind::Accept | Kind::Bind
                );
                if !relay || !close_out(f, x.as_fd()) {
                    return Err(e);
                }
                kind = Kind::Closing;
                None
            }
        },
        None => None,
    };
    let w = match itcp_handoff::capture(f.wireless.as_fd()) {
        Ok(w) => w,
        Err(e) => {
            if let (Some(_), Some(fx)) = (&x, &f.fixed) {
                let _ = itcp_handoff::unfreeze(fx.as_fd(), mark);
            }
            if f.fixed.is_none() && over(f.wireless.as_fd()) && f.pending.is_empty() {
                return Ok(None);
            }
            return Err(e);
        }
    };
    // A closed-out relay's pending bytes are in its wireless send queue now.
    let pending = if kind != f.session.kind {
        Pending::default()
    } else {
        f.pending.clone()
    };
    let queued = w.queued_bytes() + x.as_ref().map_or(0, |x| x.queued_bytes()) + pending.len();
    let kind = kind.as_str().to_string();
    let entry = ConnEntry {
        id: f.session.id,
        kind: kind.clone(),
        mh: x.as_ref().map_or(f.session.mh, |x| x.local),
        fh: x.as_ref().map_or(f.session.fh, |x| x.remote),
        queued_bytes: queued as u64,
    };
    let sent = ((w.remote, w.local), w.snd_nxt());
    Ok(Some((
        ConnImage {
            id: f.session.id,
            kind,
            wireless: w.to_bytes(),
            fixed: x.map(|x| x.to_bytes()).unwrap_or_default(),
            up_pending: pending.up,
            down_pending: pending.down,
            listen: f.listen.map(|a| a.to_string()),
            kx: pending.kx.map(|k| itcp_proto::hex::hex(&k)),
            synack: None,
            up_idle_ms: up_idle_ms(f),
            started_us: f
                .session
                .started
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            bytes_up: f.session.counters.up.load(Ordering::Relaxed),
            bytes_down: f.session.counters.down.load(Ordering::Relaxed),
        },
        entry,
        sent,
    )))
}

/// How long the MH has sent no data on `f`'s connection, if it is known to be connected
/// (see `ConnImage::up_idle_ms`): the kernel's count once this socket has received data
/// from the MH; else, for a connection that moved here, what it arrived with plus the
/// time since (a restored socket's `last_data_recv` counts from its restore).
fn up_idle_ms(f: &Frozen) -> Option<u32> {
    let i = itcp_handoff::repair::tcp_info(f.wireless.as_fd()).ok()?;
    if i.data_segs_in > 0 {
        return Some(i.last_data_recv_ms);
    }
    f.session
        .up_idle_at_move
        .map(|before| before.saturating_add(i.last_data_recv_ms))
}

/// Restarts a frozen connection's service task here (rollback, or a move in).
pub fn spawn_service(d: &Arc<Daemon>, f: Frozen) {
    let d2 = d.clone();
    let peer = f.session.mh;
    match f.session.kind {
        Kind::Handshake => {
            let t = crate::setup::Transcript::from_pending(f.pending);
            let moved = Some((f.session, t));
            tokio::spawn(crate::daemon::serve_request(
                d2, f.wireless, peer, None, moved,
            ));
            return;
        }
        Kind::Intercepted => {
            let Some(adm) = f.admitted else {
                return warn!(
                    conn = f.session.id,
                    "intercepted connection not admitted: dropped"
                );
            };
            let moved = Some((f.session, adm));
            tokio::spawn(crate::daemon::serve_transparent(
                d2, f.wireless, peer, None, moved,
            ));
            return;
        }
        Kind::Closing => {
            tokio::spawn(async move {
                // Test hook: a busy runtime, slow to start the moved connection's task.
                if crate::faults::fault("slow_moved_start") {
                    let ms = crate::faults::fault_delay().unwrap_or(Duration::from_millis(100));
                    tokio::time::sleep(ms).await;
                }
                d2.drain(f.session, f.wireless, f.fixed, f.admitted).await
            });
            return;
        }
        _ => {}
    }
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
            conn = f.session.id,
            "frozen connection without a service: dropped"
        ),
    }
}

/// Puts frozen connections back to work here (rollback): the hold is already off.
pub fn resume(d: &Arc<Daemon>, frozen: Vec<Frozen>) {
    for f in frozen {
        for s in std::iter::once(&f.wireless).chain(f.fixed.as_ref()) {
            if let Ok(true) = itcp_handoff::repair::in_repair(s.as_fd()) {
                let mark = d.cfg.interception.fwmark;
                if let Err(e) = itcp_handoff::unfreeze(s.as_fd(), mark) {
                    warn!(conn = f.session.id, error = %e, "cannot unfreeze a socket");
                }
            }
        }
        f.session.pause.send_replace(false);
        f.session.frozen.store(false, Ordering::Relaxed);
        spawn_service(d, f);
    }
}

/// Deletes the moved copies without a packet, and closes their sessions here.
pub fn delete(d: &Daemon, frozen: Vec<Frozen>) {
    for f in frozen {
        if let (Kind::Listen, Some(addr)) = (f.session.kind, f.listen) {
            d.listeners.remove(addr);
        }
        let mut fixed = f.fixed;
        if f.session.kind == Kind::Closing {
            // Not captured (see capture_one): the kernel finishes its close here.
            if let Some(x) = fixed.take() {
                d.note_closed(&f.session, None, Some(&x));
                crate::sockopt::close_gracefully(&x);
            }
        }
        for s in std::iter::once(f.wireless).chain(fixed) {
            match s.into_std() {
                Ok(std) => {
                    if let Err(e) = itcp_handoff::delete(OwnedFd::from(std)) {
                        // Closing it now could send a FIN: keep the fd (a leak, logged).
                        warn!(conn = f.session.id, error = %e.error, "socket not deleted");
                        std::mem::forget(e.fd);
                    }
                }
                Err(e) => warn!(conn = f.session.id, error = %e, "socket not deleted"),
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

/// A restored connection waiting for its restart.
pub struct Restored {
    pub id: u64,
    kind: Kind,
    wireless: (OwnedFd, SocketImage),
    fixed: Option<(OwnedFd, SocketImage)>,
    listen: Option<SocketAddr>,
    pending: Pending,
    /// What restore used: restart replays a segment to each socket too.
    opts: RestoreOptions,
    /// A closing connection whose close an ACK held during the freeze completes:
    /// nothing is left to do, so it is not restarted (see [`RestoreContext::closes`]).
    finished: bool,
    /// How long the MH had sent no data on it when the old MSR captured it.
    up_idle_ms: Option<u32>,
    /// Its age and byte counts, continued here.
    started: std::time::SystemTime,
    before: (u64, u64),
}

fn decode(b: &[u8]) -> io::Result<SocketImage> {
    SocketImage::from_bytes(b)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// What a restore needs besides the images.
#[derive(Clone, Debug, Default)]
pub struct RestoreContext {
    pub policy: UnackedRestore,
    pub fwmark: u32,
    /// When this MSR asked for the connections (they were captured after that).
    pub began: Option<Instant>,
    /// The ACK numbers in segments held during the freeze, by (sender, receiver)
    /// ([`crate::holding::Holding::acks`]).
    pub acks: HashMap<(SocketAddr, SocketAddr), Vec<u32>>,
}

impl RestoreContext {
    /// Whether an ACK the peer of `img` sent it during the freeze completes its close.
    /// Restarted, such a socket would leave repair mode with a window probe, take that
    /// ACK, close, and meet the peer's next ACKs (its answer to the probe, a second
    /// held one) with no socket: RSTs.
    fn closes(&self, img: &SocketImage) -> bool {
        self.held_acks(img).iter().any(|&a| img.closed_by(a))
    }

    /// The ACK numbers the peer of `img` sent it during the freeze.
    fn held_acks(&self, img: &SocketImage) -> &[u32] {
        let key = (canonical(img.remote), canonical(img.local));
        self.acks.get(&key).map_or(&[], Vec::as_slice)
    }

    /// Takes in the held ACKs the peer of `img` sent it.
    fn take_held_acks(&self, img: &mut SocketImage) {
        for &a in self.held_acks(img) {
            img.take_peer_ack(a);
        }
    }
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(crate::admission::canonical(a.ip()), a.port())
}

pub fn restore_one(c: &ConnImage, cx: &RestoreContext) -> io::Result<Restored> {
    let (policy, fwmark) = (cx.policy, cx.fwmark);
    // A closing connection's bytes in flight have most likely arrived (only their
    // ACK was held): re-sent all at once, each would draw an ACK, and those after the
    // one that completes the close would meet no socket and draw RSTs. As sent, one
    // retransmission settles it.
    let policy = if c.kind == Kind::Closing.as_str() {
        UnackedRestore::AsSent
    } else {
        policy
    };
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
    let needs_listen = matches!(kind, Kind::Listen | Kind::AcceptWait);
    // A closing relay may have closed its fixed side already (all delivered).
    let fixed_ok = kind == Kind::Closing || kind.relays() != c.fixed.is_empty();
    if !fixed_ok || needs_listen != listen.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a {:?} image must {}have a fixed side",
                c.kind,
                if kind.relays() { "" } else { "not " }
            ),
        ));
    }
    let mut w = decode(&c.wireless)?;
    let finished = kind == Kind::Closing && c.fixed.is_empty() && cx.closes(&w);
    cx.take_held_acks(&mut w);
    let kx = match &c.kx {
        None => None,
        Some(h) => Some(
            itcp_proto::hex::unhex(h)
                .and_then(|v| <[u8; 32]>::try_from(v).ok())
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "image: kx is not 32 hex bytes")
                })?,
        ),
    };
    let pending = Pending {
        up: c.up_pending.clone(),
        down: c.down_pending.clone(),
        kx,
    };
    let opts = RestoreOptions {
        transparent: w.sockopts.transparent,
        unacked: policy,
        nonblocking: true,
        // A peer's FIN is replayed as a raw packet to the socket's own address; for a
        // fixed-side socket that is the MH's address, which without msrd's mark would
        // be routed out to the cell (and dropped by the hold) instead of to us.
        inject_mark: fwmark,
        frozen_for: cx.began.map_or(Duration::ZERO, |b| b.elapsed()),
    };
    let wfd = itcp_handoff::restore(&w, &opts)?;
    let xopts = RestoreOptions {
        transparent: true,
        ..opts.clone()
    };
    // On failure `wfd` is dropped in repair mode: nothing is sent.
    let fixed = if !c.fixed.is_empty() {
        let mut x = decode(&c.fixed)?;
        cx.take_held_acks(&mut x);
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
        opts,
        finished,
        up_idle_ms: c.up_idle_ms,
        started: match c.started_us {
            0 => std::time::SystemTime::now(),
            us => std::time::UNIX_EPOCH + Duration::from_micros(us),
        },
        before: (c.bytes_up, c.bytes_down),
    })
}

/// A restored socket starts with the initial window of its route. Bytes that were in
/// flight are re-sent at restart only if that first flight covers all of them (else the
/// MH's ACKs for bytes beyond it are dropped and the connection waits for an RTO,
/// ~4 s): for the restore, the MH gets a host route whose `initcwnd` covers the largest
/// flight. Removed again once the sockets run (they keep their window).
pub struct FlightRoute {
    mh: IpAddr,
    dev: String,
    cwnd: u32,
}

impl FlightRoute {
    /// The route `now` (if any), widened if need be to cover `images` too: the images
    /// of one handoff may come in parts, each restored as it comes.
    pub fn cover(
        now: Option<FlightRoute>,
        mh: IpAddr,
        dev: Option<String>,
        images: &[ConnImage],
    ) -> Option<FlightRoute> {
        let Some(dev) = dev else { return now };
        let segs = images
            .iter()
            .filter_map(|c| SocketImage::from_bytes(&c.wireless).ok())
            .map(|w| itcp_handoff::first_flight(&w, w.options.mss.max(536) as usize) + 1)
            .max()
            .unwrap_or(0);
        if segs <= 10 {
            return now; // The default initial window covers it.
        }
        let cwnd = (segs + 2).min(1000) as u32;
        if now.as_ref().is_some_and(|r| r.cwnd >= cwnd) {
            return now;
        }
        // Marked as msrd's (proto): flushed after a crash (footprint).
        let proto = crate::footprint::ROUTE_PROTO;
        if let Err(e) = crate::netlink::host_route(mh, &dev, cwnd, proto, true) {
            warn!(%mh, %dev, error = %e, "no initcwnd route for the restore: bytes in flight wait for a timeout");
            return now;
        }
        // The same host route, replaced in place: the narrower one is not removed.
        std::mem::forget(now);
        Some(FlightRoute { mh, dev, cwnd })
    }
}

impl Drop for FlightRoute {
    fn drop(&mut self) {
        let proto = crate::footprint::ROUTE_PROTO;
        if let Err(e) = crate::netlink::host_route(self.mh, &self.dev, 0, proto, false) {
            warn!(mh = %self.mh, error = %e, "initcwnd route not removed");
        }
    }
}

/// Restores every image in repair mode (nothing is sent yet). Returns the restored
/// connections, the failures with reasons, and their log entries.
pub fn restore_all(
    images: &[ConnImage],
    cx: &RestoreContext,
) -> (Vec<Restored>, Vec<(u64, String)>, Vec<ConnEntry>) {
    let (mut ok, mut failed, mut entries) = (Vec::new(), Vec::new(), Vec::new());
    let results = on_all_cores(images, 64, |c| restore_one(c, cx));
    for (c, result) in images.iter().zip(results) {
        match result {
            Ok(r) => {
                let (mh, fh, xq) = match &r.fixed {
                    Some((_, x)) => (x.local, x.remote, x.queued_bytes()),
                    None => {
                        let a = r.listen.unwrap_or(r.wireless.1.remote);
                        (a, a, 0)
                    }
                };
                entries.push(ConnEntry {
                    id: r.id,
                    kind: c.kind.clone(),
                    mh,
                    fh,
                    queued_bytes: (r.wireless.1.queued_bytes() + xq + r.pending.len()) as u64,
                });
                ok.push(r)
            }
            Err(e) => failed.push((c.id, e.to_string())),
        }
    }
    (ok, failed, entries)
}

/// Closes a restored socket without a packet (back into repair mode first if a
/// restart got it out).
fn discard(id: u64, fd: OwnedFd) {
    if let Err(e) = itcp_handoff::delete(fd) {
        // Closing it now could send a FIN or RST: keep the fd (a leak, logged).
        warn!(id, error = %e.error, "restored socket not deleted");
        std::mem::forget(e.fd);
    }
}

/// An `MSRD_FAULT` hook `name` or `name:PORT` among `v`'s: Some(None) for every
/// connection, Some(Some(port)) for those with an end on PORT.
fn port_fault(v: &str, name: &str) -> Option<Option<u16>> {
    v.split(',').find_map(|f| match f.strip_prefix(name)? {
        "" => Some(None),
        p => p.strip_prefix(':')?.parse().ok().map(Some),
    })
}

/// The `MSRD_FAULT` restart failure asked for, read once (this runs per connection
/// inside the handoff): `fail_restart` fails every restart, `fail_restart:PORT` only
/// those of connections with an end on PORT (some resume, some do not).
fn fault_restart() -> Option<Option<u16>> {
    static FAULT: std::sync::OnceLock<Option<Option<u16>>> = std::sync::OnceLock::new();
    *FAULT.get_or_init(|| port_fault(&std::env::var("MSRD_FAULT").ok()?, "fail_restart"))
}

/// The `MSRD_FAULT` capture failure asked for, read once: `fail_capture:PORT` fails
/// the capture of connections with an end on PORT at the old MSR (they stay there).
fn fault_capture() -> Option<Option<u16>> {
    static FAULT: std::sync::OnceLock<Option<Option<u16>>> = std::sync::OnceLock::new();
    *FAULT.get_or_init(|| port_fault(&std::env::var("MSRD_FAULT").ok()?, "fail_capture"))
}

/// Restarts a few restored connections, then lets the segments of those that run
/// through their MH's gate (`super::gate`) in one nftables message: a few dozen at a
/// time keep a running socket gated well under a millisecond.
fn restart_group(d: &Daemon, rs: &[Restored]) -> Vec<io::Result<()>> {
    let gates = &d.handoff.as_ref().expect("handoffs are on").gates;
    end_closing(d, rs);
    let mut resent = HashMap::new();
    let results: Vec<_> = rs
        .iter()
        .map(|r| {
            if r.finished {
                return Ok(());
            }
            restart_one(r).map(|v| resent.extend(v))
        })
        .collect();
    // A finished connection's held packets are not delivered (dropped with the hold),
    // and its gate stays shut.
    let flows: Vec<_> = rs
        .iter()
        .zip(&results)
        .filter(|(r, ok)| ok.is_ok() && !r.finished)
        .flat_map(|(r, _)| r.flows())
        .collect();
    // What was held for them first, then what comes through the opened gate, and
    // then what the gate held between the two.
    d.holding.deliver_restarted(&flows, &resent);
    gates.mark(&d.rules, &flows);
    d.holding.deliver_restarted(&flows, &resent);
    if d.handoff_cfg().revert_backoff {
        let started = rs
            .iter()
            .zip(&results)
            .filter(|(r, ok)| ok.is_ok() && !r.finished);
        for (r, _) in started {
            revert_backoff(d, r);
        }
    }
    results
}

/// Marks the flows of the closing connections among `rs` ended gracefully, before they
/// restart: the MH's first ACK of our FIN ends such a socket at once, and a segment of
/// the MH's after it (a duplicate, an older ACK the old MSR copied on) must meet
/// silence, not an RST. Their task marks them too (`Daemon::drain`), but only once it
/// runs, which a busy runtime may not do before that ACK comes through the open gate.
fn end_closing(d: &Daemon, rs: &[Restored]) {
    let window = Duration::from_secs(d.handoff_cfg().closed_window_s);
    if window.is_zero() {
        return;
    }
    let flows: Vec<_> = rs
        .iter()
        .filter(|r| r.kind == Kind::Closing && !r.finished)
        .flat_map(Restored::flows)
        .map(|(a, z)| (a, z, window))
        .collect();
    if flows.is_empty() {
        return;
    }
    if let Err(e) = d.rules.end_flows(&flows) {
        warn!(error = %e, "ended flows of closing connections not recorded: a stray segment may draw an RST");
    }
}

/// Tells the MH's TCP that what it sent on `r` during the move was lost to it, once
/// `r` runs here (its gate is open for the retransmission this asks for): ICMP
/// unreachables quoting the MH's first unacknowledged byte, one per doubling of its
/// retransmission timeout the MH's silence allows ([`itcp_handoff::backoff`]).
fn revert_backoff(d: &Daemon, r: &Restored) {
    use itcp_handoff::backoff;
    let (fd, w) = (&r.wireless.0, &r.wireless.1);
    // A connection in setup may be one whose MH is still connecting (the old MSR
    // completed its handshake by replaying its ACK): an ICMP unreachable that quotes
    // its next sequence number would abort its connect ("No route to host").
    if r.kind.in_setup() {
        return;
    }
    let Some(idle) = r.up_idle_ms else { return };
    if w.recv.fin {
        return; // The MH has closed its side: nothing of its is left to resend.
    }
    let n = backoff::reverts(Duration::from_millis(idle.into()) + r.opts.frozen_for);
    let (mh, peer) = (canonical(w.remote), canonical(w.local));
    let gw = d
        .cfg
        .msr
        .gateway
        .iter()
        .find(|a| a.is_ipv4() == mh.is_ipv4());
    let (Some(&gw), true) = (gw, n > 0) else {
        return;
    };
    // The MH's snd_una, if our last ACK reached it: the end of what we received.
    let una = w.recv.seq.wrapping_add(w.recv.data.len() as u32);
    let Some(icmp) = backoff::unreachable(gw, mh, peer, una) else {
        return;
    };
    for _ in 0..n {
        if let Err(e) = itcp_handoff::repair::send_raw_ip_to(fd.as_fd(), &mh, &icmp, 0) {
            return debug!(conn = r.id, error = %e, "backoff revert not sent");
        }
    }
}

/// Sockets that re-sent their bytes in flight as new data, as ((peer, socket's end),
/// (snd_una, one past the FIN they re-sent)) (see `Holding::deliver_restarted`).
type Resent = Vec<((SocketAddr, SocketAddr), (u32, Option<u32>))>;

/// Restarts one connection. Returns its sockets that re-sent their bytes in flight.
fn restart_one(r: &Restored) -> io::Result<Resent> {
    // Test hook (docs/testing.md): a restart that fails, to show the connection is
    // kept at the old MSR and on record, never lost silently.
    if let Some(port) = fault_restart() {
        let ends = std::iter::once(&r.wireless.1)
            .chain(r.fixed.as_ref().map(|f| &f.1))
            .flat_map(|i| [i.local.port(), i.remote.port()]);
        if port.is_none_or(|p| ends.clone().any(|e| e == p)) {
            // `MSRD_FAULT_DELAY_MS`: the failure comes that late, as a slow real one
            // would (the MH's hold is released meanwhile; the gate keeps its segments
            // from this socket).
            if let Some(ms) = fault_delay() {
                std::thread::sleep(ms);
            }
            return Err(io::Error::other(
                "MSRD_FAULT=fail_restart: injected restart failure",
            ));
        }
    }
    let mut resent = Vec::new();
    let sockets = std::iter::once((&r.wireless.0, &r.wireless.1))
        .chain(r.fixed.as_ref().map(|(fd, img)| (fd, img)));
    for (fd, img) in sockets {
        if itcp_handoff::restart(fd.as_fd(), img, &r.opts)? {
            // A FIN sent before the freeze (the peer may have acknowledged it).
            let past_fin =
                (img.send.fin == itcp_handoff::image::SendFin::Sent).then(|| img.snd_nxt());
            let ends = (canonical(img.remote), canonical(img.local));
            resent.push((ends, (img.send.una, past_fin)));
        }
    }
    Ok(resent)
}

impl Restored {
    /// The connection's flows as (MH's end, other end): the wireless one and the
    /// fixed one, if any.
    pub fn flows(&self) -> Vec<(SocketAddr, SocketAddr)> {
        let w = &self.wireless.1;
        let mut v = vec![(w.remote, w.local)];
        if let Some((_, f)) = &self.fixed {
            v.push((f.local, f.remote));
        }
        v
    }
}

/// Deletes restored sockets that did not restart, silently.
pub fn discard_all(unstarted: Vec<Restored>) {
    for r in unstarted {
        discard(r.id, r.wireless.0);
        if let Some((fd, _)) = r.fixed {
            discard(r.id, fd);
        }
    }
}

/// `f` over `items`, split across the machine's cores when there are enough of them
/// to pay for the threads (per-socket repair syscalls run in parallel in the kernel).
/// Threads inherit the caller's network namespace, where the sockets are.
fn on_all_cores<T: Sync, R: Send>(
    items: &[T],
    min_per_thread: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    // Asked only when there is work to share: the answer reads cgroup files (~65 µs
    // here, a quarter of a one-connection restart).
    if items.len() < 2 * min_per_thread {
        return items.iter().map(f).collect();
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(items.len() / min_per_thread).max(1);
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|sc| {
        let f = &f;
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|c| sc.spawn(move || c.iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("restart thread"))
            .collect()
    })
}

/// A closing connection that finished during the freeze (see `Restored::finished`):
/// deleted silently, its flow dropped here as a stray for the closed-flow window (the
/// MH's TIME_WAIT may still answer something), and recorded as closed here.
fn finish_moved(d: &Daemon, r: Restored) {
    let w = &r.wireless.1;
    let flow = (canonical(w.remote), canonical(w.local));
    debug!(conn = r.id, mh = %flow.0, "closing connection finished during the handoff: not restarted");
    discard(r.id, r.wireless.0);
    let window = Duration::from_secs(d.handoff_cfg().closed_window_s);
    d.strays.closed(flow.0.ip(), &[flow], window);
    let gates = &d.handoff.as_ref().expect("handoffs are on").gates;
    if let Err(e) = gates.drop_closed(&d.rules, &[(flow.0, flow.1, window)]) {
        warn!(conn = r.id, error = %e, "stray segments of a finished connection will draw RSTs here");
    }
}

/// Restarts the restored connections (listeners first) and starts their relays,
/// handing back the sockets that failed to restart (still in repair
/// mode) so the caller can hold the MH's flows before they go: once deleted, the
/// MH's segments for them would meet no socket here and draw an RST.
#[allow(clippy::type_complexity)]
pub fn restart_or_keep(
    d: &Arc<Daemon>,
    mut restored: Vec<Restored>,
) -> (Vec<u64>, Vec<(u64, String)>, Vec<Restored>) {
    restored.sort_by_key(|r| r.kind != Kind::Listen);
    // Two flows a connection: 32 make one nftables message of 64 elements.
    let groups: Vec<&[Restored]> = restored.chunks(32).collect();
    let restarts: Vec<_> = on_all_cores(&groups, 2, |g| restart_group(d, g))
        .into_iter()
        .flatten()
        .collect();
    let (mut resumed, mut failed, mut unstarted) = (Vec::new(), Vec::new(), Vec::new());
    for (r, restart) in restored.into_iter().zip(restarts) {
        if let Err(e) = restart {
            warn!(conn = r.id, error = %e, "restored connection did not restart: kept at the old MSR");
            failed.push((r.id, format!("restart: {e}")));
            unstarted.push(r);
            continue;
        }
        if r.finished {
            // Its close is complete: the old MSR may delete its copy.
            resumed.push(r.id);
            finish_moved(d, r);
            continue;
        }
        if let (Kind::Listen, Some(addr)) = (r.kind, r.listen) {
            if let Err(e) = d.listeners.listen(addr, &d.cfg.fixed) {
                warn!(conn = r.id, %addr, error = %e, "listener not re-created");
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
            // In setup or closing: the MH and what it connected to (the FH, or our
            // request port).
            None if r.kind.in_setup() || r.kind == Kind::Closing => (None, wimg.remote, wimg.local),
            None => {
                let a = r.listen.unwrap_or(wimg.remote);
                (None, a, a)
            }
        };
        let from = crate::sessions::MovedIn {
            started: r.started,
            bytes_up: r.before.0,
            bytes_down: r.before.1,
            up_idle_ms: r.up_idle_ms,
        };
        let s = d.sessions.open_moved(r.kind, mh, fh, wl, from);
        // One line per connection would cost the handoff ~25 µs each; the handoff log
        // lists every connection moved.
        debug!(conn = s.id, from_conn = r.id, kind = r.kind.as_str(), mh = %mh.ip(), mh_port = mh.port(), %fh, "connection moved in");
        // A handshake is admitted once its request is known, wherever that is.
        let admitted =
            (!matches!(r.kind, Kind::Listen | Kind::Handshake)).then(|| d.admit_moved(s.mh_ip()));
        resumed.push(r.id);
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
    (resumed, failed, unstarted)
}
