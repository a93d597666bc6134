//! The MH's route and presence on the fixed LAN (proxy ARP/NDP, takeover
//! announcements, flow holds, network detection's presence marks) and the handoff
//! records: what the handoff glue, the request server and network detection ask of the
//! daemon about an MH.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use itcp_handoff::log::{self as hlog, ConnEntry, Record};
use tracing::{info, warn};

use super::Daemon;
use crate::clock::now_us;

impl Daemon {
    /// Makes the fixed LAN deliver `mh`'s traffic here: proxy ARP (proxy NDP), then a
    /// gratuitous ARP (an unsolicited neighbour advertisement) that repoints neighbours
    /// (the GW) which still have another MSR's MAC.
    pub fn take_over(&self, mh: IpAddr) {
        let Some(lan) = &self.handoff_cfg().lan_interface else {
            return;
        };
        if let Some(h) = &self.handoff {
            h.mhs.lock().unwrap().entry(mh).or_default().claimed = true;
        }
        if let Err(e) = crate::netlink::proxy_neigh(lan, mh, true) {
            warn!(%mh, interface = %lan, error = %e, "proxy ARP entry not added");
        }
        let announced = match mh {
            IpAddr::V4(v4) => crate::netlink::send_garp(lan, v4),
            IpAddr::V6(v6) => crate::netlink::send_unsolicited_na(lan, v6),
        };
        if let Err(e) = announced {
            warn!(%mh, interface = %lan, error = %e, "takeover not announced (gratuitous ARP / unsolicited NA)");
        }
    }

    /// Takes `mh` over on the fixed LAN unless we already did: called when the MH opens
    /// a connection here (its traffic from the fixed side must reach us).
    pub fn claim(&self, mh: IpAddr) {
        let Some(h) = &self.handoff else {
            return;
        };
        let claimed = h.mhs.lock().unwrap().get(&mh).is_some_and(|s| s.claimed);
        if !claimed {
            self.take_over(mh);
        }
    }

    /// Stops answering for `mh` on the fixed LAN.
    pub fn give_up_route(&self, mh: IpAddr) {
        if let Some(h) = &self.handoff {
            if let Some(s) = h.mhs.lock().unwrap().get_mut(&mh) {
                s.claimed = false;
            }
        }
        if let Some(lan) = &self.handoff_cfg().lan_interface {
            if let Err(e) = crate::netlink::proxy_neigh(lan, mh, false) {
                warn!(%mh, interface = %lan, error = %e, "proxy ARP entry not removed");
            }
        }
    }

    /// Holds `mh`'s flows (held in `self.holding`, never answered) until
    /// [`Daemon::release`].
    pub fn hold(&self, mh: IpAddr) {
        if let Some(h) = &self.handoff {
            h.hold_gen_bump(mh);
        }
        self.holding.unforward(mh);
        if let Err(e) = self.rules.hold(mh) {
            warn!(%mh, error = %e, "flow hold not installed");
        }
    }

    /// Ends the hold: the packets held meanwhile are dropped (no connection of the MH
    /// runs here for them; see `holding::Holding::settle`).
    pub fn release(&self, mh: IpAddr) {
        self.lift_hold(mh);
        self.holding.settle(mh, &[]);
    }

    /// Ends the hold, keeping the packets held meanwhile until
    /// `self.holding.settle`: once the connections they belong to run here.
    pub fn lift_hold(&self, mh: IpAddr) {
        if let Err(e) = self.rules.release(mh) {
            warn!(%mh, error = %e, "flow hold not released");
        }
    }

    /// Releases the hold after `after` unless another hold was made meanwhile.
    pub fn release_later(self: &Arc<Self>, mh: IpAddr, after: Duration) {
        let h = self.handoff.as_ref().unwrap();
        let gen = h.hold_gen(mh);
        h.mhs.lock().unwrap().entry(mh).or_default().release_at =
            Some((gen, now_us() + after.as_micros() as u64));
        let d = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let h = d.handoff.as_ref().unwrap();
            if h.hold_gen(mh) == gen {
                d.release(mh);
            }
        });
    }

    /// Ends now a hold that [`Daemon::release_later`] was to end (a quarantine after a
    /// failed pull): the MH attached here with nothing to move, so its new
    /// connections must not wait for it. A hold made since is left alone.
    pub fn end_quarantine(&self, mh: IpAddr) {
        let Some(h) = &self.handoff else { return };
        let pending = h.mhs.lock().unwrap().get_mut(&mh).is_some_and(|s| {
            let due = s.release_at.is_some_and(|(gen, _)| gen == s.hold_gen);
            if due {
                s.release_at = None;
                // The release that was due finds a newer generation: it does nothing.
                s.hold_gen += 1;
            }
            due
        });
        if pending {
            self.release(mh);
        }
    }

    /// The MH is served here now (its connections arrived, or it has none anywhere):
    /// network detection stops reporting it, and the hold left from when this MSR last
    /// gave it away ends, or its new connections would meet silence until it expires.
    pub fn present(&self, mh: IpAddr, mac: Option<[u8; 6]>) {
        self.end_quarantine(mh);
        if let Some(h) = &self.handoff {
            let mut m = h.mhs.lock().unwrap();
            let st = m.entry(mh).or_default();
            st.departure = None;
            if mac.is_some() && st.mac != mac {
                st.mac = mac;
                st.bound_ns = crate::clock::mono_ns();
            }
        }
        if let Err(e) = self.rules.set_present(mh, true) {
            warn!(%mh, error = %e, "MH not marked present: its packets keep being reported");
        }
        if let Some(mac) = mac {
            if let Err(e) = self.rules.set_station_here(mac, true) {
                warn!(%mh, error = %e, "station not marked present: its link-local frames keep being reported");
            }
            self.bound_within_cap(mac);
        }
    }

    /// Lets go of the station's oldest idle addresses past
    /// `[access] max_addresses_per_station` ([`crate::bindings`]).
    fn bound_within_cap(&self, mac: [u8; 6]) {
        let Some(h) = &self.handoff else { return };
        let mine: Vec<(IpAddr, u64)> = h
            .mhs
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| s.mac == Some(mac))
            .map(|(a, s)| (*a, s.bound_ns))
            .collect();
        let cap = self.cfg.access.max_addresses_per_station as usize;
        if mine.len() <= cap {
            return;
        }
        let bound = mine
            .into_iter()
            .map(|(addr, seq)| crate::bindings::Bound {
                addr,
                seq,
                busy: !self.sessions.of_mh(addr).is_empty(),
            })
            .collect();
        for addr in crate::bindings::over_cap(bound, cap) {
            self.sessions
                .stats
                .addresses_let_go
                .fetch_add(1, Ordering::Relaxed);
            if self.may_log(addr) {
                info!(mh = %addr, mac = %itcp_proto::hex::mac(&mac), cap, "address let go: its station holds its most");
            }
            self.forget(addr);
        }
    }

    /// The MH is in another MSR's cell now: its presence and address binding here end,
    /// and this MSR stops answering for it on the fixed LAN.
    pub fn forget(&self, mh: IpAddr) {
        let (claimed, left) = self.handoff.as_ref().map_or((false, None), |h| {
            let mut m = h.mhs.lock().unwrap();
            let (claimed, mac) = m
                .get_mut(&mh)
                .map_or((false, None), |s| (s.claimed, s.mac.take()));
            // The station is gone from here once none of its addresses is bound here.
            let left = mac.filter(|mac| !m.values().any(|s| s.mac == Some(*mac)));
            (claimed, left)
        });
        if claimed && self.sessions.of_mh(mh).is_empty() {
            self.give_up_route(mh);
        }
        if let Err(e) = self.rules.set_present(mh, false) {
            warn!(%mh, error = %e, "MH still marked present here");
        }
        if let Some(mac) = left {
            if let Err(e) = self.rules.set_station_here(mac, false) {
                warn!(%mh, error = %e, "station still marked present here");
            }
        }
    }

    /// Records a handoff: the log file, the metrics, and one log line.
    pub fn write_log(&self, mut r: Record, conns: &[ConnEntry]) {
        r.set_connections(conns);
        self.sessions.handoffs.observe(&r);
        let path = &self.handoff_cfg().log_file;
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

    /// Counts a rejected channel message or connection, logging at a bounded rate.
    pub fn rejected(&self, peer: SocketAddr, e: &dyn std::fmt::Display) {
        self.sessions
            .stats
            .handoff_messages_rejected
            .fetch_add(1, Ordering::Relaxed);
        let h = self.handoff.as_ref().unwrap();
        if h.may_log(peer.ip()) {
            warn!(addr = %peer, error = %e, "handoff channel: rejected");
        }
    }
}
