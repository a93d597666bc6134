//! The new MSR: pulls an MH's connections from the MSR it left. The machine
//! (`itcp_handoff::machine::NewSide`) decides; this file carries out its actions —
//! the channel, the hold, restore and restart, the takeover on the fixed LAN — and
//! tells the MH how it stands.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use itcp_handoff::log::{self as hlog, ConnEntry};
use itcp_handoff::machine::{Action, NewEvent, NewSide};
use itcp_proto::greeting::{GreetStatus, Greeting};
use itcp_proto::hex::unhex;
use tokio::net::UdpSocket;
use tracing::{debug, info, warn};

use super::channel::{Channel, ChannelError};
use super::greeting::reply;
use super::sockets::{restart_all, restore_all, unacked, FlightRoute, Restored};
use super::{give_up_route, hold, now_us, rejected, release, release_later, take_over, write_log};
use crate::daemon::Daemon;

/// Runs one pull to the end (moved, partial, refused or rolled back).
pub async fn pull(
    d: Arc<Daemon>,
    sock: Arc<UdpSocket>,
    mh_addr: SocketAddr,
    g: Greeting,
    prev: String,
    peer_addr: SocketAddr,
) {
    let h = d.handoff.as_ref().unwrap();
    let mh = crate::admission::canonical(g.mh);
    let id = h.next_handoff_id();
    let (mut m, mut acts) = NewSide::start(id, &h.me, g.clone(), now_us(), h.timeouts());
    let mut ch: Option<Channel> = None;
    let mut restored: Vec<Restored> = Vec::new();
    // The MH's flows that closed at the old MSR lately (from the images).
    let mut strays: Vec<itcp_proto::channel::ClosedFlow> = Vec::new();
    let mut flight_route: Option<FlightRoute> = None;
    let mut entries: Vec<ConnEntry> = Vec::new();
    let mut moved = 0usize;
    loop {
        let mut next: Option<NewEvent> = None;
        let mut lost: Option<String> = None;
        let mut down: Option<String> = None;
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
                        let wait = Duration::from_micros(
                            m.poll_timeout().unwrap_or(0).saturating_sub(now_us()),
                        );
                        match tokio::time::timeout(wait, Channel::connect(h, &prev, peer_addr))
                            .await
                        {
                            Ok(Ok(c)) => ch = Some(c),
                            Ok(Err(e)) => {
                                warn!(peer = %prev, addr = %peer_addr, error = %e, "cannot reach the previous MSR");
                                if e.refused() {
                                    down = Some(e.to_string());
                                } else {
                                    lost = Some(e.to_string());
                                }
                                continue;
                            }
                            Err(_) => {
                                lost = Some("connect timed out".into());
                                continue;
                            }
                        }
                    }
                    if let Err(e) = ch.as_mut().unwrap().send(&msg).await {
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
                    {
                        // The old MSR verified this greeting: it is used here too, and the
                        // MH's token (shipped on the authenticated channel) is now ours.
                        let mut mm = h.mhs.lock().unwrap();
                        let st = mm.entry(mh).or_default();
                        st.last_greeting_ts = st.last_greeting_ts.max(g.ts_ms);
                        if let Some(t) = m.token().and_then(unhex) {
                            st.token = Some(t);
                        }
                    }
                    let policy = unacked(h.cfg.unacked);
                    let fwmark = d.cfg.interception.fwmark;
                    let dev = d.cell_interface(mh);
                    let (ok, failed, es, route) = tokio::task::spawn_blocking(move || {
                        let route = FlightRoute::install(mh, dev, &images);
                        let (ok, failed, es) = restore_all(&images, policy, fwmark);
                        (ok, failed, es, route)
                    })
                    .await
                    .expect("restore task");
                    flight_route = route;
                    entries = es;
                    next = Some(NewEvent::Restored {
                        restored: ok.iter().map(|r| r.id).collect(),
                        failed,
                    });
                    restored = ok;
                }
                Action::Reroute(mh) => take_over(&d, mh),
                Action::Unroute(mh) => give_up_route(&d, mh),
                Action::Quarantine(mh) => {
                    hold(&d, h, mh);
                    release_later(&d, mh, Duration::from_millis(h.cfg.hold_after_ms));
                }
                Action::Release(mh) => release(&d, mh),
                Action::Restart(ids) => {
                    let rs: Vec<Restored> = std::mem::take(&mut restored)
                        .into_iter()
                        .filter(|r| ids.contains(&r.id))
                        .collect();
                    let d2 = d.clone();
                    let (resumed, failed) =
                        tokio::task::spawn_blocking(move || restart_all(&d2, rs))
                            .await
                            .expect("restart task");
                    moved = resumed.len();
                    // The sockets run with their window now: the host route goes.
                    drop(flight_route.take());
                    next = Some(NewEvent::Restarted { resumed, failed });
                }
                Action::Log(r) => {
                    let ok = matches!(r.outcome, hlog::Outcome::Moved | hlog::Outcome::Partial);
                    if ok && !strays.is_empty() {
                        // After the restart: not on the handoff's path.
                        let w = Duration::from_secs(h.cfg.closed_window_s);
                        let flows = crate::strays::to_drop(&strays, w);
                        if let Err(e) = d.rules.drop_strays(&flows) {
                            warn!(%mh, error = %e, "stray segments of closed flows will draw RSTs here");
                        }
                    }
                    let c = if ok {
                        &d.sessions.stats.handoffs_in
                    } else {
                        &d.sessions.stats.handoffs_failed
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                    let reason = r.reason.clone();
                    let old_down = r.outcome == hlog::Outcome::OldDown;
                    // A refused pull is what a spoofed greeting causes: one record per
                    // MH per interval, not one per datagram.
                    if r.outcome != hlog::Outcome::Rejected || h.may_log(mh) {
                        write_log(&d, r, &entries);
                    }
                    let rep = if ok {
                        h.answer(mh, &g, GreetStatus::Moved, None, moved)
                    } else if old_down {
                        info!(%mh, old = %prev, "old MSR down: the MH attaches here");
                        h.answer(mh, &g, GreetStatus::Attached, None, 0)
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
        if let Some(why) = down {
            acts = m.handle_old_down(&why);
            continue;
        }
        if let Some(why) = lost {
            acts = m.handle_channel_lost(&why);
            continue;
        }
        if m.done() {
            return;
        }
        let Some(c) = ch.as_mut() else {
            acts = m.handle_channel_lost("no channel");
            continue;
        };
        let deadline = m.poll_timeout().unwrap_or(now_us());
        let wait = Duration::from_micros(deadline.saturating_sub(now_us()));
        acts = match tokio::time::timeout(wait, c.recv()).await {
            Ok(Ok(msg)) => {
                if let itcp_proto::channel::Message::Images { closed, .. } = &msg {
                    strays.clone_from(closed);
                }
                m.handle(NewEvent::Message(msg), now_us())
            }
            Ok(Err(ChannelError::Wire(e))) => {
                rejected(&d, peer_addr, &e);
                m.handle_channel_lost(&e.to_string())
            }
            Ok(Err(e)) => m.handle_channel_lost(&e.to_string()),
            Err(_) => m.handle_timeout(now_us()),
        };
    }
}
