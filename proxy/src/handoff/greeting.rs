//! The greeting server: one UDP socket per cell interface (a greeting from the fixed
//! LAN or any other interface never reaches msrd). What a greeting may do is decided
//! by `itcp_handoff::greet::decide`; this file answers and carries out the decision.
//! Solicitations arrive on the same port and go to the beacons (`crate::beacon`).

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use itcp_handoff::greet::{self, Context, Decision, MhView, Sender};
use itcp_proto::beacon::Solicitation;
use itcp_proto::greeting::{parse_greet_msg, GreetStatus, MAX_DATAGRAM};
use socket2::{Domain, Socket, Type};
use tokio::net::UdpSocket;
use tracing::{debug, info, warn};

use super::frames::{learn_link, GreetFrames};
use super::{new_side, reply};
use crate::daemon::Daemon;
use crate::sockopt;

/// One greeting socket: a cell interface and a family. IPv6 greetings come from MHs
/// whose IPv6 connections move by greeting (a dual-stack agent greets for both).
pub struct GreetSocket {
    pub interface: String,
    pub ipv6: bool,
}

impl GreetSocket {
    /// The name the upgrade hand-over and `expected_sockets` know it by.
    pub fn name(&self) -> String {
        if self.ipv6 {
            format!("{} ipv6", self.interface)
        } else {
            self.interface.clone()
        }
    }
}

/// The greeting sockets of a configuration: each cell interface, for IPv6 too when an
/// MH prefix is IPv6.
pub fn sockets_of(cfg: &itcp_config::MsrdConfig) -> Vec<GreetSocket> {
    let v6 = cfg.access.mh_prefixes.iter().any(|p| !p.is_ipv4());
    let mut out = Vec::new();
    for c in &cfg.cells {
        for ipv6 in [false, true].into_iter().filter(|&x| !x || v6) {
            out.push(GreetSocket {
                interface: c.interface.clone(),
                ipv6,
            });
        }
    }
    out
}

/// Binds the greeting port on each of `socks`.
pub fn bind(socks: &[GreetSocket], port: u16) -> io::Result<Vec<UdpSocket>> {
    let mut out = Vec::new();
    for g in socks {
        let s = (|| {
            // SO_BINDTODEVICE before bind, so that every cell can have the same port.
            let (domain, any) = if g.ipv6 {
                (
                    Domain::IPV6,
                    SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)),
                )
            } else {
                (
                    Domain::IPV4,
                    SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
                )
            };
            let s = Socket::new(domain, Type::DGRAM, None)?;
            s.set_reuse_address(true)?;
            if g.ipv6 {
                s.set_only_v6(true)?;
            }
            s.bind_device(Some(g.interface.as_bytes()))?;
            s.bind(&any.into())?;
            let s = std::net::UdpSocket::from(s);
            s.set_nonblocking(true)?;
            Ok::<_, io::Error>(s)
        })()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "greeting port {port} on cell interface {} ({}): {e}",
                    g.interface,
                    if g.ipv6 { "IPv6" } else { "IPv4" }
                ),
            )
        })?;
        out.push(UdpSocket::from_std(s)?);
    }
    Ok(out)
}

/// Serves MH greetings arriving on one cell interface.
pub async fn serve_greetings(d: Arc<Daemon>, sock: UdpSocket) {
    let sock = Arc::new(sock);
    let ifname = sockopt::bound_device(&sock)
        .ok()
        .flatten()
        .unwrap_or_default();
    // What the MHs on this cell point their gateway at, in our tagged replies.
    let mac = crate::beacon::cell_mac(&ifname, d.cfg.msr.gateway_mac()).ok();
    // The frames of the datagrams: who sent each greeting, at the link layer.
    let mut frames = match sock.local_addr() {
        Ok(a) => GreetFrames::open(&ifname, a.port(), a.is_ipv6())
            .map_err(|e| warn!(error = %e, "the MH's link-layer address will be resolved after each greeting (ARP/NDP)"))
            .ok(),
        Err(_) => None,
    };
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    loop {
        let (n, from) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "greeting socket failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Ok(s) = Solicitation::parse(&buf[..n]) {
            if let Some(f) = frames.as_mut() {
                f.drain();
            }
            crate::beacon::on_solicitation(d.beacons.get().map(|a| &**a), &ifname, from, s);
            continue;
        }
        let h = d.handoff.as_ref().unwrap();
        match parse_greet_msg(&buf[..n]) {
            Ok(msg) => {
                let link = frames
                    .as_mut()
                    .and_then(|f| f.mac_of(from.ip(), &buf[..n]))
                    .map(|m| (ifname.clone(), m));
                on_greeting(&d, &sock, from, msg.greeting, &mac, link).await
            }
            Err(e) => {
                d.sessions
                    .stats
                    .greetings_rejected
                    .fetch_add(1, Ordering::Relaxed);
                if h.may_log(from.ip()) {
                    warn!(%from, error = %e, "malformed greeting rejected");
                }
            }
        }
    }
}

fn view(st: Option<&super::MhState>, local: usize, frozen: bool) -> MhView<'_> {
    MhView {
        token: st.and_then(|s| s.token.as_deref()),
        local,
        frozen,
        pulling: st.is_some_and(|s| s.pulling),
        last_greeting_ts: st.map_or(0, |s| s.last_greeting_ts),
        last_nonce: st.and_then(|s| s.last_nonce.as_deref()),
        moved_to: st.and_then(|s| s.moved_to.as_deref()),
    }
}

async fn on_greeting(
    d: &Arc<Daemon>,
    sock: &Arc<UdpSocket>,
    from: SocketAddr,
    g: itcp_proto::greeting::Greeting,
    mac: &Option<String>,
    link: Option<(String, [u8; 6])>,
) {
    let h = d.handoff.as_ref().unwrap();
    let mh = crate::admission::canonical(g.mh);
    let sessions = d.sessions.of_mh(mh);
    let frozen = sessions.iter().any(|s| s.frozen.load(Ordering::Relaxed));
    let prev_is_peer = h.cfg.peer(&g.prev_msr).is_some();
    let cx = Context {
        me: &h.me,
        from_mh: crate::admission::canonical(from.ip()) == mh,
        is_mh: d.is_mh(mh),
        prev_is_peer,
        // Asked only when it matters (taking a token from the bucket).
        pull_allowed: true,
    };
    let mut busy = None;
    let (decision, last_reply) = {
        let m = h.mhs.lock().unwrap();
        let mut dec = greet::decide(&g, cx, view(m.get(&mh), sessions.len(), frozen));
        if matches!(dec, Decision::Pull | Decision::Follow(_)) {
            // Charged to the frame's sender: forgeries from the MH's address by
            // another station use up that station's pulls.
            let sender = link
                .as_ref()
                .map_or(Sender::Addr(from.ip()), |l| Sender::Mac(l.1));
            if h.pull_allowed(mh, sender) {
                busy = h.try_busy();
            } else {
                d.sessions
                    .stats
                    .pulls_limited
                    .fetch_add(1, Ordering::Relaxed);
            }
            if busy.is_none() {
                // Rate-limited, or an upgrade is under way: the MH greets again.
                dec = Decision::Defer;
            }
        }
        let last = m.get(&mh).and_then(|s| s.last_reply.clone());
        (dec, last)
    };
    let count_rejected = || {
        d.sessions
            .stats
            .greetings_rejected
            .fetch_add(1, Ordering::Relaxed)
    };
    match decision {
        Decision::Ignore => {}
        Decision::Repeat => {
            if let Some(r) = last_reply {
                reply(sock, from, &r).await;
            }
        }
        Decision::Drop(why) => {
            count_rejected();
            if h.may_log(from.ip()) {
                warn!(%from, mh = %g.mh, reason = why, "greeting dropped");
            }
        }
        Decision::Defer => {
            debug!(%mh, "greeting deferred: a handoff of this MH is under way or pulls are rate-limited");
        }
        Decision::Refuse(reason) => {
            count_rejected();
            if h.may_log(from.ip()) {
                warn!(%mh, %reason, "greeting refused");
            }
            let r = h.answer(mh, &g, GreetStatus::Refused, Some(reason), 0, mac.clone());
            reply(sock, from, &r).await;
        }
        Decision::Attach { proven } => {
            if proven {
                // Our answer goes out without resolving the MH's address first.
                learn_link(d, mh, &link);
                h.greeting_used(mh, g.ts_ms);
                // Back with us: the MH's traffic comes here, nothing stays held.
                h.hold_gen_bump(mh);
                d.release(mh);
                d.take_over(mh);
            }
            info!(%mh, connections = sessions.len(), proven, "MH attached");
            let n = sessions.len();
            let r = h.answer(mh, &g, GreetStatus::Attached, None, n, mac.clone());
            reply(sock, from, &r).await;
        }
        Decision::Pull | Decision::Follow(_) => {
            let from_peer = match &decision {
                Decision::Follow(at) => {
                    info!(%mh, peer = %at, "the MH names us, its connections left for a peer: fetching them there");
                    at.as_str()
                }
                _ => g.prev_msr.as_str(),
            };
            let Some(peer) = h.cfg.peer(from_peer).cloned() else {
                return;
            };
            h.set_pulling(mh, true);
            let (d, sock, mac) = (d.clone(), sock.clone(), mac.clone());
            tokio::spawn(async move {
                let _busy = busy;
                let greeter = new_side::Greeter {
                    sock,
                    addr: from,
                    g,
                    mac,
                    link,
                };
                new_side::pull(d.clone(), greeter, peer.id.clone(), peer.address).await;
                d.handoff.as_ref().unwrap().set_pulling(mh, false);
            });
        }
    }
}
