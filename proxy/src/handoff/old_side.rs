//! The old MSR: serves the MSR⇄MSR channel. A peer asks for an MH's connections; the
//! machine (`itcp_handoff::machine::OldSide`) checks the greeting's proof and decides;
//! this file carries out its actions against the relays and sockets.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use itcp_handoff::log::{self as hlog, ConnEntry};
use itcp_handoff::machine::{Action, MhKnown, OldEvent, OldSide, Request};
use itcp_proto::channel::Message;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn, Instrument};

use super::channel::{Channel, ChannelError};
use super::sockets::{capture_all, delete, freeze, resume, settle, socket_work, Captured, FEW};
use super::spares::IDLE_LIMIT;
use crate::clock::now_us;
use crate::daemon::Daemon;
use crate::sessions::Frozen;

/// Serves the MSR⇄MSR channel: each connection carries one handoff, asked by a peer
/// (it may be opened ahead of need and wait idle for its request).
pub async fn serve_peers(d: Arc<Daemon>, l: TcpListener) {
    loop {
        match l.accept().await {
            Ok((s, peer)) => {
                let h = d.handoff.as_ref().unwrap();
                // Beyond its source's share (see `Authenticating`) closed at once.
                if !h.unauthenticated.lock().unwrap().begin(peer.ip()) {
                    d.rejected(peer, &"too many channel connections authenticating");
                    continue;
                }
                tokio::spawn(serve_one(d.clone(), s, peer));
            }
            Err(e) => {
                // EMFILE and friends: back off, keep serving.
                warn!(error = %e, "handoff channel accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Authenticated channels idle for over a second that one peer may hold open here:
/// one kept ahead of need and its replacement, with room to spare.
const MAX_IDLE_PER_PEER: u32 = 4;

/// An authenticated channel waiting for its first message, counted per peer.
struct Idle<'a> {
    h: &'a super::Handoffs,
    peer: String,
}

impl<'a> Idle<'a> {
    fn enter(h: &'a super::Handoffs, peer: &str) -> Option<Idle<'a>> {
        let mut m = h.idle.lock().unwrap();
        let n = m.entry(peer.to_string()).or_default();
        if *n >= MAX_IDLE_PER_PEER {
            return None;
        }
        *n += 1;
        Some(Idle {
            h,
            peer: peer.to_string(),
        })
    }
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        let mut m = self.h.idle.lock().unwrap();
        if let Some(n) = m.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.peer);
            }
        }
    }
}

async fn serve_one(d: Arc<Daemon>, s: TcpStream, peer: SocketAddr) {
    let h = d.handoff.as_ref().unwrap();
    let ch = Channel::accept(h, s).await;
    h.unauthenticated.lock().unwrap().end(peer.ip());
    let mut ch = match ch {
        Ok(c) => c,
        Err(ChannelError::Wire(e)) => return d.rejected(peer, &e),
        Err(e) => return d.rejected(peer, &e),
    };
    // A channel opened for a handoff asks at once. One a peer opened ahead of need
    // (`spares`) waits for its first message: at most IDLE_LIMIT, and at most
    // MAX_IDLE_PER_PEER such channels per peer (counted only after the first second,
    // so a burst of handoffs is never refused by the count).
    let first = match tokio::time::timeout(Duration::from_secs(1), ch.recv()).await {
        Ok(r) => r,
        Err(_) => {
            let Some(_idle) = Idle::enter(h, ch.peer()) else {
                let e = format!("{:?} keeps too many idle channels open", ch.peer());
                return d.rejected(peer, &e);
            };
            match tokio::time::timeout(IDLE_LIMIT, ch.recv()).await {
                Ok(r) => r,
                Err(_) => return debug!(addr = %peer, "handoff channel idle: closed"),
            }
        }
    };
    let first = match first {
        Ok(m) => m,
        Err(ChannelError::Wire(e)) => return d.rejected(peer, &e),
        Err(e) => return debug!(addr = %peer, error = %e, "handoff channel closed"),
    };
    if let Message::Station { handoff_id, mac } = first {
        return answer_station(&d, ch, peer, handoff_id, &mac).await;
    }
    let (handoff_id, req, parts) = match first {
        Message::HandoffRequest {
            handoff_id,
            greeting,
            parts,
        } => (handoff_id, Asked::Greeting(greeting), parts),
        Message::Detected {
            handoff_id,
            mh,
            mac,
            parts,
        } => match itcp_proto::hex::parse_mac(&mac) {
            Some(mac) => (handoff_id, Asked::Detected { mh, mac }, parts),
            None => {
                let e = format!("{:?} sent a detection with bad MAC {mac:?}", ch.peer());
                return d.rejected(peer, &e);
            }
        },
        first => {
            let e = format!("{:?} opened with {first:?}", ch.peer());
            return d.rejected(peer, &e);
        }
    };
    // An upgrade is handing the connections over: the new MSR rolls back, the MH
    // stays here and greets again.
    let Some(_busy) = h.try_busy() else {
        return debug!(addr = %peer, "handoff request while upgrading: closed");
    };
    let mh = match &req {
        Asked::Greeting(g) => g.mh,
        Asked::Detected { mh, .. } => *mh,
    };
    let span =
        tracing::info_span!("handoff", handoff = handoff_id, %mh, role = "old", peer = %ch.peer());
    old_side(d.clone(), ch, peer, handoff_id, req, parts)
        .instrument(span)
        .await
}

/// Tells a peer which MHs served here are bound to station `mac` (it saw the station
/// arrive in its cell); the peer then asks for each as for any detected MH.
async fn answer_station(d: &Daemon, mut ch: Channel, peer: SocketAddr, handoff_id: u64, mac: &str) {
    let Some(mac) = itcp_proto::hex::parse_mac(mac) else {
        let e = format!("{:?} asked about a station with bad MAC {mac:?}", ch.peer());
        return d.rejected(peer, &e);
    };
    let h = d.handoff.as_ref().unwrap();
    let mhs = h.served_of_station(mac);
    debug!(peer = %ch.peer(), mac = %itcp_proto::hex::mac(&mac), ?mhs, "asked about a station");
    if let Err(e) = ch.send(&Message::Addresses { handoff_id, mhs }).await {
        debug!(peer = %ch.peer(), error = %e, "station answer not sent");
    }
}

/// What the peer asked for (owned).
enum Asked {
    Greeting(itcp_proto::greeting::Greeting),
    Detected { mh: std::net::IpAddr, mac: [u8; 6] },
}

/// `parts`: the new MSR takes the images in parts ([`capture_in_parts`]).
async fn old_side(
    d: Arc<Daemon>,
    mut ch: Channel,
    peer: SocketAddr,
    handoff_id: u64,
    req: Asked,
    parts: bool,
) {
    let h = d.handoff.as_ref().unwrap();
    let from = ch.peer().to_string();
    let req = match &req {
        Asked::Greeting(g) => Request::Greeting(g),
        Asked::Detected { mh, mac } => Request::Detected {
            mh: crate::admission::canonical(*mh),
            mac: *mac,
        },
    };
    let mh = crate::admission::canonical(match req {
        Request::Greeting(g) => g.mh,
        Request::Detected { mh, .. } => mh,
    });
    let _turn = h.old_side_turn(mh).await;
    let (token, last_ts, mac, moved_to, came_from) = {
        let m = h.mhs.lock().unwrap();
        m.get(&mh)
            .map(|s| {
                let (to, from) = (s.moved_to.clone(), s.came_from.clone());
                (s.token.clone(), s.last_greeting_ts, s.mac, to, from)
            })
            .unwrap_or_default()
    };
    let known = MhKnown {
        token: token.as_deref(),
        last_greeting_ts: last_ts,
        mac,
        local: connections_here(&d, mh),
        moved_to: moved_to.as_deref(),
        came_from: came_from.as_deref(),
    };
    let (mut m, mut acts) =
        OldSide::start(&h.me, &from, handoff_id, req, known, now_us(), h.timeouts());
    let mut frozen: Vec<Frozen> = Vec::new();
    // Frozen connections that cannot be captured: they stay here.
    let mut stuck: Vec<(u64, String)> = Vec::new();
    let mut entries: Vec<ConnEntry> = Vec::new();
    // Per captured connection: its wireless flow and what was sent the MH on it.
    let mut sent: HashMap<u64, (crate::departed::Flow, u32)> = HashMap::new();
    // Those of the connections that moved, for the MH's departure (`crate::departed`).
    let mut departing: Vec<(crate::departed::Flow, u32)> = Vec::new();
    // Connections whose images went ahead in parts: left out of the last message.
    let mut sent_ahead: HashSet<u64> = HashSet::new();
    // However this handoff ends, the MH's connections in setup stop waiting for it.
    struct Thaw<'a>(&'a Daemon, std::net::IpAddr);
    impl Drop for Thaw<'_> {
        fn drop(&mut self) {
            self.0.inflight.thaw(self.1);
            // SYNs were held since `CompleteHandshakes` (the flow hold covers them too).
            hold_syns(self.0, self.1, false);
        }
    }
    let _thaw = Thaw(&d, mh);
    loop {
        let mut next: Option<OldEvent> = None;
        for a in acts.drain(..) {
            match a {
                Action::GreetingUsed { mh, ts_ms } => h.greeting_used(mh, ts_ms),
                Action::CompleteHandshakes { mh, wait_for_ack } => {
                    complete_handshakes(&d, mh, wait_for_ack).await
                }
                Action::FreezeAndCapture(mh) => {
                    let t0 = std::time::Instant::now();
                    settle(&d, mh, None).await;
                    d.hold(mh);
                    settle(&d, mh, Some(Duration::from_millis(50))).await;
                    frozen = freeze(&d, mh).await;
                    let t_freeze = t0.elapsed();
                    let mut images = Vec::new();
                    let mut failure = None;
                    stuck.clear();
                    let mut over = Vec::new();
                    let mut live = Vec::new();
                    let fwmark = d.cfg.interception.fwmark;
                    let few = frozen.len() <= FEW;
                    let fs = std::mem::take(&mut frozen);
                    let in_parts = parts && h.cfg.images_in_parts;
                    let (fs, captured) = if in_parts && fs.len() >= PARTS_FROM {
                        let replayed = d.handshakes.replayed(mh);
                        let c = capture_in_parts(&mut ch, fs, fwmark, handoff_id, &replayed).await;
                        sent_ahead = c.2;
                        (c.0, c.1)
                    } else {
                        socket_work(few, move || {
                            let c = capture_all(&fs, fwmark);
                            (fs, c)
                        })
                        .await
                    };
                    for (f, c) in fs.into_iter().zip(captured) {
                        if failure.is_some() {
                            // Captured or not, it resumes here (Unfreeze follows).
                            live.push(f);
                            continue;
                        }
                        match c {
                            // It finished while frozen: nothing to move.
                            Ok(None) => over.push(f),
                            Ok(Some((img, e, s))) => {
                                sent.insert(img.id, s);
                                images.push(img);
                                entries.push(e);
                                live.push(f);
                            }
                            // A closing connection may have finished meanwhile (TIME_WAIT
                            // or closed): nothing to move, no reason to stop the handoff.
                            Err(_) if f.session.kind == crate::sessions::Kind::Closing => {
                                over.push(f)
                            }
                            // It changed while it was captured: try again (the MH's
                            // next greeting), all of the MH's connections together.
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                warn!(conn = f.session.id, error = %e, "connection changed while it was captured: the handoff is off");
                                failure = Some(format!("connection {}: {e}", f.session.id));
                                live.push(f);
                            }
                            // It cannot be captured: it stays here, the rest move.
                            Err(e) => {
                                warn!(conn = f.session.id, error = %e, "connection cannot be captured: it stays here");
                                stuck.push((f.session.id, format!("could not capture: {e}")));
                                live.push(f);
                            }
                        }
                    }
                    frozen = live;
                    finish_closed(&d, over);
                    debug!(
                        pause_us = t_freeze.as_micros() as u64,
                        capture_us = (t0.elapsed() - t_freeze).as_micros() as u64,
                        connections = images.len(),
                        "frozen and captured"
                    );
                    next = Some(match failure {
                        None if images.is_empty() && !stuck.is_empty() => {
                            let why: Vec<_> = stuck
                                .iter()
                                .map(|(id, e)| format!("connection {id}: {e}"))
                                .collect();
                            OldEvent::CaptureFailed(why.join("; "))
                        }
                        None => {
                            if !stuck.is_empty() {
                                m.handle(OldEvent::Uncaptured(stuck.clone()), now_us());
                            }
                            OldEvent::Captured(images)
                        }
                        // Unfreeze (which follows) resumes every frozen connection here.
                        Some(reason) => OldEvent::CaptureFailed(reason),
                    });
                }
                Action::Send(mut msg) => {
                    if let Message::Images {
                        closed,
                        staying,
                        images,
                        ..
                    } = &mut msg
                    {
                        let w = Duration::from_secs(h.cfg.closed_window_s);
                        *closed = d.strays.take(mh, w);
                        closed.extend(staying_fixed_flows(&frozen, images));
                        *staying = frozen
                            .iter()
                            .filter(|f| stuck.iter().any(|(id, _)| *id == f.session.id))
                            .flat_map(Frozen::flows)
                            .map(|(mh, peer)| itcp_proto::channel::ClosedFlow {
                                mh,
                                peer,
                                age_ms: 0,
                            })
                            .collect();
                        super::handshakes::attach(&d, mh, images);
                        // Sent ahead in parts already.
                        images.retain(|i| !sent_ahead.contains(&i.id));
                        // Test hook: images held up after the acceptance
                        // (`MSRD_FAULT_DELAY_MS`, default 100 ms), as by a channel
                        // outage, to show what a pull failing after it leaves behind.
                        if crate::faults::fault("slow_images") {
                            let ms =
                                crate::faults::fault_delay().unwrap_or(Duration::from_millis(100));
                            tokio::time::sleep(ms).await;
                        }
                    }
                    let t = std::time::Instant::now();
                    if let Err(e) = ch.send(&msg).await {
                        warn!(peer = %from, error = %e, "handoff message not sent");
                    }
                    if matches!(msg, Message::Images { .. }) {
                        debug!(
                            send_us = t.elapsed().as_micros() as u64,
                            ahead = sent_ahead.len(),
                            "images sent"
                        );
                    }
                }
                Action::SendAhead(mh) => {
                    // Held there until the sockets restart, the segments that met the
                    // freeze here reach them before any the FH sends there.
                    let flows: Vec<_> = frozen
                        .iter()
                        .filter(|f| !stuck.iter().any(|(id, _)| *id == f.session.id))
                        .flat_map(Frozen::flows)
                        .collect();
                    d.holding.send_ahead(mh, peer.ip(), &flows);
                }
                Action::Delete(ids) => {
                    let (gone, stay): (Vec<Frozen>, Vec<Frozen>) = std::mem::take(&mut frozen)
                        .into_iter()
                        .partition(|f| ids.contains(&f.session.id));
                    frozen = stay;
                    if !frozen.is_empty() {
                        // Partial: the hold goes with the connections that stay here,
                        // so the MH's stray segments of those that moved must meet a
                        // silent drop, not an RST (which the MH would answer by
                        // resetting the moved connection at the new MSR).
                        let flows: Vec<_> = gone.iter().flat_map(Frozen::flows).collect();
                        let w = Duration::from_millis(h.cfg.hold_after_ms);
                        if let Err(e) = h.gates.drop_elsewhere(&d.rules, &flows, w) {
                            warn!(%mh, error = %e, "stray segments of connections that moved will draw RSTs here");
                        }
                    }
                    // The FH's segments held here during the freeze, and those that
                    // come until the LAN has moved on, go on to the new MSR.
                    let moved: Vec<_> = gone.iter().flat_map(Frozen::flows).collect();
                    let w = Duration::from_millis(h.cfg.hold_after_ms);
                    d.holding.forward(mh, peer.ip(), &moved, w);
                    departing = gone
                        .iter()
                        .filter_map(|f| sent.get(&f.session.id).copied())
                        .collect();
                    delete(&d, gone);
                    h.moved_away(mh, &from);
                    // The new MSR took the MH's address over on the fixed LAN.
                    d.give_up_route(mh);
                    d.sessions
                        .stats
                        .handoffs_out
                        .fetch_add(1, Ordering::Relaxed);
                    // Stray TCP of the MH that still reaches us is dropped, never
                    // forwarded to the MH nor answered, until the LAN has moved on.
                    d.release_later(mh, Duration::from_millis(h.cfg.hold_after_ms));
                }
                // The new MSR took the address and then gave it back.
                Action::Reroute(mh) => d.take_over(mh),
                Action::Forget(mh) => {
                    // What the MH sent before it left may still reach this cell. The
                    // departure is on record before forgetting the MH turns detection
                    // back on: a frame reported in between would count as its return.
                    let at = crate::clock::mono_us();
                    let left = std::mem::take(&mut departing);
                    h.departed(mh, crate::departed::Departure::new(at, left));
                    d.forget(mh);
                }
                Action::Unfreeze(mh) => {
                    // Their held segments go to them once they run again.
                    let live: Vec<_> = frozen.iter().flat_map(Frozen::flows).collect();
                    d.lift_hold(mh);
                    if !frozen.is_empty() {
                        d.sessions
                            .stats
                            .handoffs_failed
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    resume(&d, std::mem::take(&mut frozen));
                    d.holding.settle(mh, &live);
                }
                Action::Log(r) => {
                    if r.outcome == hlog::Outcome::Rejected {
                        d.sessions
                            .stats
                            .handoffs_failed
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    d.write_log(r, &entries)
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
        // Wait for the new MSR until the machine's own deadline: frames that change
        // nothing do not extend it.
        let deadline = m.poll_timeout().unwrap_or(now_us() + 10_000_000);
        let wait = Duration::from_micros(deadline.saturating_sub(now_us()));
        acts = match tokio::time::timeout(wait, ch.recv()).await {
            Ok(Ok(msg)) => m.handle(OldEvent::Message(msg), now_us()),
            Ok(Err(ChannelError::Wire(e))) => {
                d.rejected(peer, &e);
                m.handle_channel_lost(&e.to_string())
            }
            // The new MSR went away (crashed?): nothing was acknowledged, serve on.
            Ok(Err(e)) => m.handle_channel_lost(&e.to_string()),
            Err(_) => m.handle_timeout(now_us()),
        };
    }
}

/// Connections captured and sent per part ([`capture_in_parts`]).
const PART: usize = 256;
/// Fewer connections than this go in one message: two parts at least, or nothing
/// overlaps.
const PARTS_FROM: usize = 2 * PART;

/// Captures `frozen` in parts of [`PART`] and sends each part's images to the new MSR
/// (`ImagesPart`) while the next is captured, so that it restores them meanwhile: a
/// handoff of many connections takes about the longest of capture, transfer and
/// restore instead of their sum. The last part goes with the images' last message, as
/// does every image of a `closing` connection (an ACK held at the new MSR until its
/// restore may complete its close there: restored ahead, it would miss it). After a
/// capture that calls the handoff off (a connection changed), nothing more goes
/// ahead: the new MSR discards what did when the call-off reaches it. Returns the
/// connections and what their capture came to, as [`capture_all`] does, and the ids
/// of the connections sent ahead.
async fn capture_in_parts(
    ch: &mut Channel,
    frozen: Vec<Frozen>,
    mark: u32,
    handoff_id: u64,
    replayed: &[(SocketAddr, SocketAddr, Vec<u8>)],
) -> (Vec<Frozen>, Vec<Captured>, HashSet<u64>) {
    let mut chunks: std::collections::VecDeque<Vec<Frozen>> = Default::default();
    let mut rest = frozen.into_iter();
    loop {
        let c: Vec<Frozen> = rest.by_ref().take(PART).collect();
        if c.is_empty() {
            break;
        }
        chunks.push_back(c);
    }
    let capture = |c: Vec<Frozen>| {
        tokio::task::spawn_blocking(move || {
            let r = capture_all(&c, mark);
            (c, r)
        })
    };
    let (mut fs, mut cs, mut ahead) = (Vec::new(), Vec::new(), HashSet::new());
    let mut sending = true;
    let mut next = chunks.pop_front().map(&capture);
    while let Some(task) = next.take() {
        let (f, mut c) = task.await.expect("capture task");
        next = chunks.pop_front().map(&capture);
        let changed =
            |r: &Captured| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        sending &= !c.iter().any(changed);
        if sending && next.is_some() {
            // The images move into the message and back: their queues are not copied.
            let mut at = Vec::new();
            let mut images = Vec::new();
            for (i, (fz, r)) in f.iter().zip(c.iter_mut()).enumerate() {
                if fz.session.kind == crate::sessions::Kind::Closing {
                    continue;
                }
                if let Ok(Some((img, _, _))) = r {
                    at.push(i);
                    images.push(std::mem::take(img));
                }
            }
            super::handshakes::attach_from(replayed, &mut images);
            let msg = Message::ImagesPart { handoff_id, images };
            if let Err(e) = ch.send(&msg).await {
                // The last message will not go either: the handoff fails as it would.
                warn!(error = %e, "images' part not sent");
                sending = false;
            }
            let Message::ImagesPart { images, .. } = msg else {
                unreachable!()
            };
            for (i, img) in at.into_iter().zip(images) {
                if let Ok(Some((slot, _, _))) = &mut c[i] {
                    if sending {
                        ahead.insert(img.id);
                    }
                    *slot = img;
                }
            }
        }
        fs.extend(f);
        cs.extend(c);
    }
    (fs, cs, ahead)
}

/// Completes the MH's TCP handshakes half-open here (SYN_RECV) so that they move
/// (`Action::CompleteHandshakes`). With `wait_for_ack`, the MH's own ACK is waited for
/// first, at most `setup_wait_ms` and never more than [`HANDSHAKE_WAIT`]: one wireless
/// round trip completes them, and one whose SYN-ACK was lost would take a
/// retransmission timeout. Those still half-open then (or at once, without the wait)
/// are completed here with the MH's ACK replayed ([`crate::handshakes`]), and waited
/// for at most [`REPLAYED_WAIT`]. New SYNs of the MH are dropped from now on (it
/// retransmits them to the new MSR): none is answered here after the MH has turned to
/// the new MSR. Only an MH sent a SYN-ACK in the last
/// [`crate::intercept::SYNACK_RECENT`] is looked for: one whose handshake has been
/// half-open longer (its ACK lost, nothing sent since) stays here.
async fn complete_handshakes(d: &Daemon, mh: std::net::IpAddr, wait_for_ack: bool) {
    hold_syns(d, mh, true);
    if !synack_recent(d, mh) {
        return;
    }
    let patience = if wait_for_ack {
        Duration::from_millis(d.handoff_cfg().setup_wait_ms).min(HANDSHAKE_WAIT)
    } else {
        Duration::ZERO
    };
    let t0 = std::time::Instant::now();
    let mut replayed = std::collections::HashSet::new();
    loop {
        let open = match half_open(mh) {
            Ok(open) => open,
            Err(e) => return warn!(error = %e, "half-open handshakes not listed: not completed"),
        };
        if open.is_empty() {
            return;
        }
        if t0.elapsed() >= patience + REPLAYED_WAIT {
            return warn!(%mh, half_open = open.len(),
                "TCP handshakes of the MH still half-open: they stay here");
        }
        if t0.elapsed() >= patience {
            // Each once: its SYN-ACK report may come a moment after the listing.
            let new: Vec<_> = open
                .into_iter()
                .filter(|h| !replayed.contains(&(h.local, h.remote)))
                .collect();
            for h in super::handshakes::complete(d, &new) {
                replayed.insert(h);
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Whether `mh` was sent a SYN-ACK lately: only then can it have a handshake half-open
/// here, and the costly listing (it walks every connection of the router) is worth it.
fn synack_recent(d: &Daemon, mh: std::net::IpAddr) -> bool {
    d.rules.synack_recent(mh).unwrap_or_else(|e| {
        warn!(error = %e, "recent SYN-ACKs not known: half-open handshakes listed");
        true
    })
}

/// The MH's handshakes half-open here. IPv4 MHs reach msrd's IPv4 sockets (its IPv6
/// ones are IPv6-only).
fn half_open(mh: std::net::IpAddr) -> std::io::Result<Vec<crate::sockdiag::HalfOpen>> {
    let all = crate::sockdiag::syn_recv(mh.is_ipv6())?;
    Ok(all.into_iter().filter(|h| h.remote.ip() == mh).collect())
}

/// The MH's connections here in any state, for the handoff's decisions (a peer that
/// detected the MH is told `NotHere` only when there are none): relays, connections
/// in setup, and handshakes half-open (completed and moved: `complete_handshakes`).
fn connections_here(d: &Daemon, mh: std::net::IpAddr) -> usize {
    let settled = d.sessions.of_mh(mh).len() + d.inflight.pending(mh);
    if settled > 0 || !synack_recent(d, mh) {
        return settled;
    }
    half_open(mh).map_or(0, |open| open.len())
}

fn hold_syns(d: &Daemon, mh: std::net::IpAddr, on: bool) {
    if let Err(e) = d.rules.hold_syns(mh, on) {
        warn!(%mh, on, error = %e, "SYN hold not changed");
    }
}

/// See [`await_handshakes`].
const HANDSHAKE_WAIT: Duration = Duration::from_millis(250);
/// How long a replayed ACK may take to complete its handshake (it goes over loopback).
const REPLAYED_WAIT: Duration = Duration::from_millis(50);

/// The fixed flows of connections that move as `closing`: their fixed sockets stay
/// here to finish their close (see `sockets::capture_one`), and what the FH sends
/// them last (its ACK of our FIN) strays to the new MSR, which must drop it. Not when
/// the fixed flow is the wireless one (transparent mode): the moved socket has it.
fn staying_fixed_flows(
    frozen: &[Frozen],
    images: &[itcp_proto::channel::ConnImage],
) -> Vec<itcp_proto::channel::ClosedFlow> {
    let closing: std::collections::HashSet<u64> = images
        .iter()
        .filter(|i| i.kind == crate::sessions::Kind::Closing.as_str())
        .map(|i| i.id)
        .collect();
    frozen
        .iter()
        .filter(|f| closing.contains(&f.session.id))
        .filter_map(|f| {
            let x = f.fixed.as_ref()?;
            let flow = (x.local_addr().ok()?, x.peer_addr().ok()?);
            let wireless = (f.wireless.peer_addr().ok()?, f.wireless.local_addr().ok()?);
            (flow != wireless).then_some(flow)
        })
        .map(|(mh, peer)| itcp_proto::channel::ClosedFlow {
            mh,
            peer,
            age_ms: 0,
        })
        .collect()
}

/// Closes connections that finished closing while frozen (nothing left to send). Their
/// flows go with the images as closed ones, like any that closed here lately: the
/// last segments of their close (the FH's ACK of our FIN) reach the new MSR, which
/// must drop them, not hand them to the MH (which resets them, and the FH's end with
/// them: soak, seed 29).
fn finish_closed(d: &Daemon, over: Vec<Frozen>) {
    for f in over {
        d.note_closed(&f.session, Some(&f.wireless), f.fixed.as_ref());
        for s in std::iter::once(&f.wireless).chain(f.fixed.as_ref()) {
            crate::sockopt::close_gracefully(s);
        }
        d.sessions.close(&f.session);
    }
}
