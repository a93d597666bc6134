//! The new MSR: pulls an MH's connections from the MSR it left. The machine
//! (`itcp_handoff::machine::NewSide`) decides; this file carries out its actions —
//! the channel, the hold, restore and restart, the takeover on the fixed LAN — and
//! tells the MH how it stands (when it greeted us; a detected MH is told nothing).
//!
//! A greeting names the MSR to ask; a detected MH does not, so every peer is asked
//! at once and the one that serves the MH continues on its channel ([`locate`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use itcp_handoff::log::{self as hlog, ConnEntry};
use itcp_handoff::machine::{Action, NewEvent, NewSide};
use itcp_proto::channel::Message;
use itcp_proto::greeting::{GreetStatus, Greeting};
use tokio::net::UdpSocket;
use tracing::{debug, field, info, info_span, warn, Instrument};

use super::channel::{Channel, ChannelError};
use super::frames::learn_link;
use super::reply;
use super::sockets::{
    discard_all, restart_or_keep, restore_all, socket_work, unacked, FlightRoute, RestoreContext,
    Restored, FEW,
};
use super::spares;
use crate::clock::now_us;
use crate::daemon::Daemon;

/// The MH that greeted us, to answer: from `sock`, to `addr`, with our `mac` on its
/// cell; `link`: the cell interface and the MAC whose frame carried the greeting.
pub struct Greeter {
    pub sock: Arc<UdpSocket>,
    pub addr: SocketAddr,
    pub g: Greeting,
    pub mac: Option<String>,
    pub link: Option<(String, [u8; 6])>,
}

impl Greeter {
    async fn tell(
        this: &Option<Greeter>,
        d: &Daemon,
        mh: IpAddr,
        status: GreetStatus,
        reason: Option<String>,
        n: usize,
    ) {
        if let Some(gr) = this {
            let r =
                d.handoff
                    .as_ref()
                    .unwrap()
                    .answer(mh, &gr.g, status, reason, n, gr.mac.clone());
            reply(&gr.sock, gr.addr, &r).await;
        }
    }
}

/// Keeps the MH's flows that closed at the old MSR lately, and those of its
/// connections that stay there (they could not be captured), from its images.
fn note_strays(msg: &Message, strays: &mut Strays) {
    if let Message::Images {
        closed, staying, ..
    } = msg
    {
        strays.closed.clone_from(closed);
        strays.staying = staying.iter().map(|f| (f.mh, f.peer)).collect();
    }
}

/// What the old MSR's images say of the MH's flows that do not move here.
#[derive(Default)]
struct Strays {
    /// Closed there lately.
    closed: Vec<itcp_proto::channel::ClosedFlow>,
    /// Of connections that stay there (could not be captured).
    staying: Vec<(SocketAddr, SocketAddr)>,
}

/// Runs one pull for a greeting to the end (moved, partial, refused or rolled back).
pub async fn pull(d: Arc<Daemon>, greeter: Greeter, prev: String, peer_addr: SocketAddr) {
    let h = d.handoff.as_ref().unwrap();
    let id = h.next_handoff_id();
    let (mut m, acts) = NewSide::start(id, &h.me, greeter.g.clone(), now_us(), h.timeouts());
    if prev != greeter.g.prev_msr {
        // Followed: the connections left the MSR the MH names for this one.
        m.set_old_msr(&prev);
    }
    let span = info_span!("handoff", handoff = id, mh = %m.mh(), role = "new", peer = %prev);
    let g = greeter.g.clone();
    let link = greeter.link.clone();
    let more = run(
        d.clone(),
        m,
        acts,
        Some(greeter),
        Some((prev, peer_addr)),
        link,
        true,
    )
    .instrument(span)
    .await;
    if let Some(at) = more {
        pull_more(d, g, at).await;
    }
}

/// Pulls the MH's connections that a late pull took to peer `at` (the old MSR said so,
/// `also_at`), with the greeting that just moved the others here. The MH was told of
/// the first pull already; these join them.
async fn pull_more(d: Arc<Daemon>, g: Greeting, at: String) {
    let h = d.handoff.as_ref().unwrap();
    let Some(addr) = h.cfg.peers.iter().find(|p| p.id == at).map(|p| p.address) else {
        return warn!(mh = %g.mh, peer = %at, "the MH's other connections are at a peer we do not know");
    };
    let id = h.next_handoff_id();
    let (mut m, acts) = NewSide::start(id, &h.me, g, now_us(), h.timeouts());
    m.set_old_msr(&at);
    let span = info_span!("handoff", handoff = id, mh = %m.mh(), role = "new", peer = %at);
    info!(parent: &span, "the MH's other connections are at {at}: pulling them too");
    run(d, m, acts, None, Some((at, addr)), None, false)
        .instrument(span)
        .await;
}

/// Runs one pull for an MH detected on a cell (its first packet came from `mac`).
pub async fn pull_detected(d: Arc<Daemon>, mh: IpAddr, mac: [u8; 6]) {
    let h = d.handoff.as_ref().unwrap();
    let id = h.next_handoff_id();
    let (m, acts) = NewSide::detected(id, &h.me, mh, mac, now_us(), h.timeouts());
    // The peer is known once one answers for the MH.
    let span = info_span!("handoff", handoff = id, %mh, role = "new", peer = field::Empty);
    let link = d.cell_interface(mh).map(|i| (i, mac));
    run(d, m, acts, None, None, link, true)
        .instrument(span)
        .await;
}

/// Asks every peer which MHs it serves that are bound to station `mac` (network
/// detection saw the station send from no address it proves), waiting at most
/// [`STATION_WAIT`]. Peers that do not answer in time count as serving none.
pub async fn ask_station(d: &Arc<Daemon>, mac: [u8; 6]) -> Vec<IpAddr> {
    let h = d.handoff.as_ref().unwrap();
    let msg = Message::Station {
        handoff_id: h.next_handoff_id(),
        mac: itcp_proto::hex::mac(&mac),
    };
    let mut asks = ask_every_peer(d, &msg, STATION_WAIT);
    let mut mhs = Vec::new();
    while let Some(done) = asks.join_next().await {
        let Ok((peer, r)) = done else { continue };
        match r {
            Ok(Ok((_, Message::Addresses { mhs: m, .. }))) => mhs.extend(m),
            Ok(Ok((_, other))) => debug!(%peer, ?other, "station question answered oddly"),
            Ok(Err(e)) => debug!(%peer, error = %e, "station question not answered"),
            Err(_) => debug!(%peer, "station question: no answer in time"),
        }
    }
    mhs.sort();
    mhs.dedup();
    mhs
}

/// One peer's answer to a question sent to every peer, or why there is none.
type PeerAnswer = (
    String,
    Result<Result<(Channel, Message), super::channel::ChannelError>, tokio::time::error::Elapsed>,
);

/// Sends `msg` to every peer at once, each on a channel of its own; each answer (or its
/// absence after `wait`) comes out of the set as it arrives.
fn ask_every_peer(
    d: &Arc<Daemon>,
    msg: &Message,
    wait: Duration,
) -> tokio::task::JoinSet<PeerAnswer> {
    let h = d.handoff.as_ref().unwrap();
    let mut asks = tokio::task::JoinSet::new();
    for p in &h.cfg.peers {
        let (d, msg, id, addr) = (d.clone(), msg.clone(), p.id.clone(), p.address);
        asks.spawn(async move {
            let h = d.handoff.as_ref().unwrap();
            let r = tokio::time::timeout(wait, spares::ask(&d, h, &id, addr, &msg)).await;
            (id, r)
        });
    }
    asks
}

/// How long a station question waits for the peers.
const STATION_WAIT: Duration = Duration::from_millis(500);

/// What asking every peer came to.
enum Located {
    /// This peer serves the MH and accepted: the handoff goes on on its channel.
    Found {
        peer: String,
        ch: Channel,
        answer: Message,
    },
    /// Every peer answered: nobody serves the MH (`NotHere`)...
    Answer(Message),
    /// ...or this one serves it and refused (`Abort`: another link-layer address).
    Refused { peer: String, abort: Message },
    /// Some peer could not be asked: the MH's connections may be there.
    Lost(String),
}

/// Sends `msg` (a detection) to every peer at once and waits for their answers, at
/// most `wait`. A peer whose msrd is down (connection refused) serves nothing.
async fn locate(d: &Arc<Daemon>, msg: &Message, handoff_id: u64, wait: Duration) -> Located {
    let mut asks = ask_every_peer(d, msg, wait);
    let (mut refusal, mut lost) = (None, None);
    while let Some(done) = asks.join_next().await {
        let Ok((peer, r)) = done else { continue };
        match r {
            Ok(Ok((ch, answer @ Message::Accepted { .. }))) => {
                // The others answered, or will be dropped with their channels.
                return Located::Found { peer, ch, answer };
            }
            Ok(Ok((_, Message::NotHere { .. }))) => {}
            Ok(Ok((_, abort @ Message::Abort { .. }))) => refusal = Some((peer, abort)),
            Ok(Ok((_, other))) => lost = Some(format!("{peer} answered {other:?}")),
            Ok(Err(e)) if e.refused() => debug!(%peer, "peer down: serves nothing"),
            Ok(Err(e)) => lost = Some(format!("{peer}: {e}")),
            Err(_) => lost = Some(format!("{peer} did not answer in time")),
        }
    }
    match (refusal, lost) {
        (Some((peer, abort)), _) => Located::Refused { peer, abort },
        (None, Some(why)) => Located::Lost(why),
        (None, None) => Located::Answer(Message::NotHere { handoff_id }),
    }
}

/// Returns the peer to pull the MH's other connections from next, if the old MSR
/// named one (`also_at`) and this handoff moved something.
async fn run(
    d: Arc<Daemon>,
    mut m: NewSide,
    mut acts: Vec<Action>,
    greeter: Option<Greeter>,
    mut old: Option<(String, SocketAddr)>,
    link: Option<(String, [u8; 6])>,
    charged: bool,
) -> Option<String> {
    // The old MSR captures the connections after this: how long they are frozen at
    // most when restored here.
    let began = std::time::Instant::now();
    let h = d.handoff.as_ref().unwrap();
    let mh = crate::admission::canonical(m.mh());
    let id = m.handoff_id;
    let mut prev = old.as_ref().map_or_else(String::new, |o| o.0.clone());
    let mut ch: Option<Channel> = None;
    let mut restored: Vec<Restored> = Vec::new();
    // The MH's flows that closed at the old MSR lately (from the images).
    let mut strays = Strays::default();
    // The flows of the connections restored here (live: none of the strays).
    let mut moving: std::collections::HashSet<(SocketAddr, SocketAddr)> = Default::default();
    let mut flight_route: Option<FlightRoute> = None;
    // Parts of the images being restored ahead of their last message
    // (`Action::RestoreAhead`): joined at the last restore, or at a discard.
    let mut ahead: Vec<tokio::task::JoinHandle<Restoration>> = Vec::new();
    let mut entries: Vec<ConnEntry> = Vec::new();
    let mut moved = 0usize;
    let mut moved_any = false;
    // The hold was lifted and its packets still wait (for the restart).
    let mut lifted = false;
    loop {
        let mut next: Option<NewEvent> = None;
        let mut lost: Option<String> = None;
        let mut down: Option<String> = None;
        let mut timed_out = false;
        // Sent on to a peer we do not know: nothing more goes out.
        let mut astray = false;
        for a in acts.drain(..) {
            match a {
                Action::AskInstead(to) => {
                    let Some(p) = h.cfg.peers.iter().find(|p| p.id == to) else {
                        astray = true;
                        lost = Some(format!("{prev} sent us on to {to}, not a peer of ours"));
                        continue;
                    };
                    tracing::Span::current().record("peer", field::display(&to));
                    info!(%mh, from = %prev, to = %to, "the MH's connections moved on: asking there");
                    old = Some((to.clone(), p.address));
                    prev = to;
                    ch = None;
                }
                Action::Send(_) if astray => {}
                Action::Hold(mh) => {
                    // The old MSR accepted, with the MH's token: our answers are
                    // tagged under it from now on.
                    h.adopt_token(mh, m.token());
                    d.hold(mh);
                    // The old MSR verified the MH: our answer and the restarted
                    // connections go out without resolving its address first.
                    learn_link(&d, mh, &link);
                    // From here the MH may send through us: its segments are held.
                    Greeter::tell(&greeter, &d, mh, GreetStatus::Holding, None, 0).await;
                }
                Action::Send(msg) if ch.is_none() && old.is_none() => {
                    let wait = Duration::from_micros(
                        m.poll_timeout().unwrap_or(0).saturating_sub(now_us()),
                    );
                    match locate(&d, &msg, id, wait).await {
                        Located::Found {
                            peer,
                            ch: c,
                            answer,
                        } => {
                            tracing::Span::current().record("peer", field::display(&peer));
                            m.set_old_msr(&peer);
                            prev = peer;
                            ch = Some(c);
                            next = Some(NewEvent::Message(answer));
                        }
                        Located::Answer(a) => next = Some(NewEvent::Message(a)),
                        Located::Refused { peer, abort } => {
                            tracing::Span::current().record("peer", field::display(&peer));
                            m.set_old_msr(&peer);
                            next = Some(NewEvent::Message(abort));
                        }
                        Located::Lost(why) => lost = Some(why),
                    }
                }
                Action::Send(msg) => {
                    if ch.is_none() {
                        // The request: on the channel kept to the old MSR if any.
                        let (prev, peer_addr) = old.clone().expect("a greeting names its MSR");
                        let wait = Duration::from_micros(
                            m.poll_timeout().unwrap_or(0).saturating_sub(now_us()),
                        );
                        let asked = spares::ask(&d, h, &prev, peer_addr, &msg);
                        match tokio::time::timeout(wait, asked).await {
                            Ok(Ok((c, answer))) => {
                                ch = Some(c);
                                note_strays(&answer, &mut strays);
                                next = Some(NewEvent::Message(answer));
                            }
                            Ok(Err(e)) => {
                                warn!(peer = %prev, addr = %peer_addr, error = %e, "cannot reach the previous MSR");
                                if let ChannelError::Wire(w) = &e {
                                    d.rejected(peer_addr, w);
                                }
                                if e.refused() {
                                    down = Some(e.to_string());
                                } else {
                                    lost = Some(e.to_string());
                                }
                            }
                            Err(_) => timed_out = true,
                        }
                        continue;
                    }
                    let Some(c) = ch.as_mut() else { continue };
                    // Test hook: a late acknowledgement (`MSRD_FAULT_DELAY_MS`, default
                    // 100 ms after the restart), as after restarting many connections,
                    // to show the old MSR's held segments do not come after the FH's
                    // newer ones.
                    if matches!(msg, Message::Ack { .. }) && crate::faults::fault("slow_ack") {
                        let ms = crate::faults::fault_delay().unwrap_or(Duration::from_millis(100));
                        tokio::time::sleep(ms).await;
                    }
                    if let Err(e) = c.send(&msg).await {
                        warn!(peer = %prev, error = %e, "handoff message not sent");
                    }
                }
                Action::Restore(images) => {
                    // Test hook: die between receiving the images and restoring them,
                    // to show the old MSR keeps every connection (docs/testing.md).
                    if std::env::var("MSRD_FAULT").as_deref() == Ok("exit_before_restore") {
                        tracing::error!("MSRD_FAULT=exit_before_restore: exiting mid-handoff");
                        std::process::exit(70);
                    }
                    // Test hook: a slow handoff (`MSRD_FAULT_DELAY_MS`, default 100 ms
                    // between the images and their restore), as with many connections,
                    // to show what the hosts see while their connections are frozen.
                    if crate::faults::fault("slow_restore") {
                        let ms = crate::faults::fault_delay().unwrap_or(Duration::from_millis(100));
                        tokio::time::sleep(ms).await;
                    }
                    // The old MSR verified this greeting: it is used here too, and the
                    // MH's token (in the images, from an older peer) is now ours.
                    if let Some(g) = m.greeting() {
                        h.greeting_used(mh, g.ts_ms);
                    }
                    h.adopt_token(mh, m.token());
                    super::handshakes::expect(&d, &images);
                    let cx = restore_context(&d, mh, began);
                    let dev = d.cell_interface(mh);
                    let few = images.len() <= FEW;
                    let t = std::time::Instant::now();
                    let route = flight_route.take();
                    let (mut ok, mut failed, mut es, route) = socket_work(few, move || {
                        let route = FlightRoute::cover(route, mh, dev, &images);
                        let (ok, failed, es) = restore_all(&images, &cx);
                        (ok, failed, es, route)
                    })
                    .await;
                    flight_route = route;
                    let restore_us = t.elapsed().as_micros() as u64;
                    let parts = ahead.len();
                    for (o, f, e) in join_ahead(&mut ahead).await {
                        ok.extend(o);
                        failed.extend(f);
                        es.extend(e);
                    }
                    debug!(
                        restore_us,
                        parts,
                        waited_us = t.elapsed().as_micros() as u64 - restore_us,
                        "restored"
                    );
                    entries = es;
                    moving = ok.iter().flat_map(Restored::flows).collect();
                    // The old MSR may have called the handoff off meanwhile (a slow
                    // restore): heard now, before the restart, it keeps the connections
                    // and these copies go. Heard later, it waits for our acknowledgement.
                    if let Some(c) = ch.as_mut() {
                        if let Some(Ok(msg)) = now_or_never(c.recv()) {
                            let ignored = m.handle(NewEvent::Message(msg), now_us());
                            debug_assert!(ignored.is_empty(), "{ignored:?}");
                        }
                    }
                    next = Some(NewEvent::Restored {
                        restored: ok.iter().map(|r| r.id).collect(),
                        failed,
                    });
                    restored = ok;
                }
                Action::RestoreAhead(images) => {
                    super::handshakes::expect(&d, &images);
                    let cx = restore_context(&d, mh, began);
                    // Installed before the restore: a socket takes its route's window.
                    let dev = d.cell_interface(mh);
                    flight_route = FlightRoute::cover(flight_route.take(), mh, dev, &images);
                    ahead.push(tokio::task::spawn_blocking(move || {
                        restore_all(&images, &cx)
                    }));
                }
                Action::Discard(ids) => {
                    for (o, _, _) in join_ahead(&mut ahead).await {
                        restored.extend(o);
                    }
                    let (gone, keep): (Vec<Restored>, Vec<Restored>) =
                        std::mem::take(&mut restored)
                            .into_iter()
                            .partition(|r| ids.contains(&r.id));
                    restored = keep;
                    moving.clear();
                    drop(flight_route.take());
                    discard_all(gone);
                }
                Action::Attached => {
                    debug!(%mh, old = %prev, "the previous MSR holds nothing of the MH: attached here");
                    d.end_quarantine(mh);
                    Greeter::tell(&greeter, &d, mh, GreetStatus::Attached, None, 0).await;
                }
                Action::Reroute(mh) => d.take_over(mh),
                Action::Unroute(mh) => {
                    d.give_up_route(mh);
                    d.forget(mh);
                }
                Action::Arrived { mh, mac } => d.present(mh, mac),
                Action::Quarantine(mh) => {
                    d.hold(mh);
                    d.release_later(mh, Duration::from_millis(h.cfg.hold_after_ms));
                }
                Action::Gate(mh) => {
                    let flows: Vec<_> = restored.iter().flat_map(Restored::flows).collect();
                    if let Err(e) = h.gates.close(&d.rules, mh, &flows) {
                        warn!(%mh, error = %e, "restored connections not gated: one that fails to restart could lose bytes");
                    }
                }
                Action::Release(mh) => {
                    d.lift_hold(mh);
                    lifted = true;
                }
                Action::Restart(ids) => {
                    let rs: Vec<Restored> = std::mem::take(&mut restored)
                        .into_iter()
                        .filter(|r| ids.contains(&r.id))
                        .collect();
                    let flows: Vec<_> = rs.iter().flat_map(Restored::flows).collect();
                    // Test hook: the MH's address taken over and its hold lifted, the
                    // restart comes `MSRD_FAULT_DELAY_MS` late, as behind many others.
                    if crate::faults::fault("slow_restart") {
                        let ms = crate::faults::fault_delay().unwrap_or(Duration::from_millis(100));
                        tokio::time::sleep(ms).await;
                    }
                    let d2 = d.clone();
                    let few = rs.len() <= FEW;
                    let (resumed, failed, unstarted) =
                        socket_work(few, move || restart_or_keep(&d2, rs)).await;
                    if resumed.is_empty() && !unstarted.is_empty() {
                        // Nothing runs here: hold the MH's flows before the sockets
                        // go, so its segments meet a silent drop and not an RST.
                        d.hold(mh);
                    } else if (!unstarted.is_empty() || !strays.staying.is_empty())
                        && h.cfg.closed_window_s > 0
                    {
                        // The MH's flows stay here, but these connections live on at
                        // the old MSR (they did not restart here, or were never
                        // captured there): their segments (the MH's, the FH's) are
                        // dropped here, not answered with RST, until the MH is back.
                        let w = Duration::from_secs(h.cfg.closed_window_s);
                        let mut flows: Vec<_> =
                            unstarted.iter().flat_map(Restored::flows).collect();
                        flows.extend(&strays.staying);
                        if let Err(e) = h.gates.drop_elsewhere(&d.rules, &flows, w) {
                            warn!(%mh, error = %e, "segments of connections kept at the old MSR will draw RSTs here");
                        }
                    }
                    // Segments of the failed ones are dropped now (above): the gate goes.
                    h.gates.open(&d.rules, mh);
                    let down: std::collections::HashSet<_> =
                        unstarted.iter().flat_map(Restored::flows).collect();
                    discard_all(unstarted);
                    moved = resumed.len();
                    // The sockets run: what reached us meanwhile goes to them.
                    let live: Vec<_> = flows.into_iter().filter(|f| !down.contains(f)).collect();
                    d.holding.settle(mh, &live);
                    lifted = false;
                    // The sockets run with their window now: the host route goes.
                    drop(flight_route.take());
                    next = Some(NewEvent::Restarted { resumed, failed });
                }
                Action::Log(r) => {
                    let ok = matches!(r.outcome, hlog::Outcome::Moved | hlog::Outcome::Partial);
                    moved_any = ok;
                    if ok && !prev.is_empty() {
                        h.moved_in(mh, &prev);
                    }
                    if ok && !strays.closed.is_empty() {
                        // After the restart: not on the handoff's path. A new
                        // connection's SYN takes its flow out of the set (the rules),
                        // so only those opened before now need leaving out.
                        let w = Duration::from_secs(h.cfg.closed_window_s);
                        let mut live = std::mem::take(&mut moving);
                        live.extend(d.sessions.of_mh(mh).iter().map(|s| (s.mh, s.fh)));
                        let closed = crate::strays::to_drop(&strays.closed, w, &live);
                        if let Err(e) = h
                            .gates
                            .drop_closed(&d.rules, &crate::strays::timed(&closed, w))
                        {
                            warn!(%mh, error = %e, "stray segments of closed flows will draw RSTs here");
                        }
                        d.strays.adopt(mh, &closed, w);
                    }
                    let c = if ok {
                        &d.sessions.stats.handoffs_in
                    } else {
                        &d.sessions.stats.handoffs_failed
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                    let old_down = r.outcome == hlog::Outcome::OldDown;
                    let (status, reason, n) = if ok {
                        (GreetStatus::Moved, None, moved)
                    } else if old_down {
                        info!(%mh, old = %prev, "old MSR down: the MH attaches here");
                        d.end_quarantine(mh);
                        (GreetStatus::Attached, None, 0)
                    } else {
                        (GreetStatus::Failed, r.reason.clone(), 0)
                    };
                    // The MH hears first; the record is written after, off its path.
                    Greeter::tell(&greeter, &d, mh, status, reason, n).await;
                    // A refused pull proved nothing: it does not count against the
                    // MH's pull budget (its sender's paid for it).
                    if charged && r.outcome == hlog::Outcome::Rejected {
                        h.pull_refused(mh);
                    }
                    // A refused pull is what a spoofed greeting causes: one record per
                    // MH per interval, not one per datagram.
                    if r.outcome != hlog::Outcome::Rejected || h.may_log(mh) {
                        d.write_log(r, &entries);
                    }
                }
                other => debug!(action = ?other, "not a new-side action"),
            }
        }
        if let Some(ev) = next {
            acts = m.handle(ev, now_us());
            continue;
        }
        if timed_out {
            acts = m.handle_timeout(now_us());
            continue;
        }
        if let Some(why) = down {
            acts = m.handle_old_down(&why);
            continue;
        }
        if let Some(why) = lost {
            acts = m.handle_channel_lost(&why);
            continue;
        }
        if m.done() {
            if !ahead.is_empty() {
                // Not restarted (the machine discards them first): nothing is left.
                for (o, _, _) in join_ahead(&mut ahead).await {
                    discard_all(o);
                }
            }
            if lifted {
                d.holding.settle(mh, &[]);
            }
            if let (true, Some(c)) = (m.acknowledged(), ch.take()) {
                tokio::spawn(answer_call_off(c, m.clone()).in_current_span());
            }
            return m.also_at().filter(|_| moved_any).map(str::to_string);
        }
        let Some(c) = ch.as_mut() else {
            acts = m.handle_channel_lost("no channel");
            continue;
        };
        let deadline = m.poll_timeout().unwrap_or(now_us());
        let wait = Duration::from_micros(deadline.saturating_sub(now_us()));
        acts = match tokio::time::timeout(wait, c.recv()).await {
            Ok(Ok(msg)) => {
                note_strays(&msg, &mut strays);
                m.handle(NewEvent::Message(msg), now_us())
            }
            Ok(Err(ChannelError::Wire(e))) => {
                d.rejected(c.addr(), &e);
                m.handle_channel_lost(&e.to_string())
            }
            Ok(Err(e)) => m.handle_channel_lost(&e.to_string()),
            Err(_) => m.handle_timeout(now_us()),
        };
    }
}

/// `f`'s output if it is ready now. Never waits: a zero timeout would, for the timer
/// wheel's next tick (up to a millisecond, most of a one-connection handoff). `f` must
/// be cancel-safe (it is dropped if not ready).
fn now_or_never<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(f).poll(&mut cx) {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}

/// What restoring some images came to ([`restore_all`]).
type Restoration = (Vec<Restored>, Vec<(u64, String)>, Vec<ConnEntry>);

/// The restores of parts started ahead, once each is done.
async fn join_ahead(ahead: &mut Vec<tokio::task::JoinHandle<Restoration>>) -> Vec<Restoration> {
    let mut out = Vec::new();
    for j in ahead.drain(..) {
        out.push(j.await.expect("restore task"));
    }
    out
}

/// What restoring `mh`'s images here needs besides them: the ACKs held for its flows
/// so far, among others.
fn restore_context(d: &Daemon, mh: IpAddr, began: std::time::Instant) -> RestoreContext {
    let h = d.handoff.as_ref().expect("handoffs are on");
    RestoreContext {
        policy: unacked(h.cfg.unacked),
        fwmark: d.cfg.interception.fwmark,
        began: Some(began),
        acks: d.holding.acks(mh),
    }
}

/// Keeps the channel of an acknowledged handoff open until the old MSR closes it, to
/// answer a call-off that crossed our acknowledgement with the acknowledgement again.
/// Closed at once, the channel met such a call-off with an RST, and the old MSR,
/// unable to tell what ran here, unfroze its copies: the connections ran at both MSRs
/// (the soak, seed 37: the channel cut while the acknowledgement was on its way).
async fn answer_call_off(mut ch: Channel, mut m: NewSide) {
    let wait = Duration::from_micros(itcp_handoff::machine::CALL_OFF_WAIT_US);
    while let Ok(Ok(msg)) = tokio::time::timeout(wait, ch.recv()).await {
        for a in m.handle(NewEvent::Message(msg), now_us()) {
            if let Action::Send(msg) = a {
                info!("the old MSR called the handoff off after our acknowledgement: sent again");
                if let Err(e) = ch.send(&msg).await {
                    warn!(error = %e, "acknowledgement not sent again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::now_or_never;

    #[test]
    fn now_or_never_takes_what_is_ready_and_leaves_what_is_not() {
        assert_eq!(now_or_never(async { 7 }), Some(7));
        assert_eq!(now_or_never(std::future::pending::<u8>()), None);
        // A channel message not yet sent: no value, and the receiver still works.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u8>();
        assert_eq!(now_or_never(rx.recv()), None);
        tx.send(3).unwrap();
        assert_eq!(now_or_never(rx.recv()), Some(Some(3)));
    }
}
