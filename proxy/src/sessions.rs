//! The session table: every relayed I-TCP connection with its endpoints and byte
//! counters, and the daemon-wide statistics `itcpctl` reads.

use std::collections::HashMap;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::admission::Admitted;
use crate::relay::{Counters, Pending};

pub use itcp_proto::control::{Kind, SessionInfo};

/// One relayed connection.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    pub kind: Kind,
    /// The MH's address and port as the FH sees it.
    pub mh: SocketAddr,
    pub fh: SocketAddr,
    /// Our end of the wireless-side connection.
    pub wireless_local: SocketAddr,
    pub started: SystemTime,
    pub counters: Counters,
    /// True pauses the relay (handoff freeze).
    pub pause: crate::relay::Pause,
    /// Where a paused relay hands its sockets.
    pub frozen_to: Mutex<Option<oneshot::Sender<Frozen>>>,
    /// Frozen for a handoff (shown by `itcpctl sessions`).
    pub frozen: AtomicBool,
    /// Arrived here in a handoff.
    pub moved_in: bool,
    /// For a connection that arrived in a handoff: how long the MH had sent no data on
    /// it when its previous MSR captured it (`ConnImage::up_idle_ms`).
    pub up_idle_at_move: Option<u32>,
    /// Bytes (up, down) earlier MSRs relayed on a moved connection: `counters` include
    /// them, this MSR's totals do not.
    pub before: (u64, u64),
}

impl Session {
    /// The MH's address.
    pub fn mh_ip(&self) -> IpAddr {
        crate::admission::canonical(self.mh.ip())
    }
}

/// Daemon-wide counters.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections_total: AtomicU64,
    pub connections_failed: AtomicU64,
    pub refused_not_mh: AtomicU64,
    pub refused_limit: AtomicU64,
    pub refused_rate: AtomicU64,
    /// Closed at accept: too many connections in setup from that source, or overall.
    pub refused_handshakes: AtomicU64,
    pub malformed_requests: AtomicU64,
    pub aborted: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
    pub handoffs_in: AtomicU64,
    pub handoffs_out: AtomicU64,
    pub handoffs_failed: AtomicU64,
    pub connections_moved_in: AtomicU64,
    pub connections_moved_out: AtomicU64,
    pub handoff_messages_rejected: AtomicU64,
    pub greetings_rejected: AtomicU64,
    pub channels_kept_used: AtomicU64,
    pub channels_kept_stale: AtomicU64,
    pub held_delivered: AtomicU64,
    pub held_forwarded: AtomicU64,
    pub held_dropped: AtomicU64,
    pub arrivals_stale: AtomicU64,
    pub pulls_limited: AtomicU64,
    pub addresses_let_go: AtomicU64,
    pub station_questions: AtomicU64,
    pub station_questions_limited: AtomicU64,
}

#[derive(Debug, Default)]
pub struct Sessions {
    next: AtomicU64,
    map: Mutex<HashMap<u64, Arc<Session>>>,
    pub stats: Stats,
    /// Handoff durations and the recent handoff records (status page).
    pub handoffs: crate::metrics::HandoffMetrics,
}

impl Stats {
    /// The counters now, as the control protocol carries them.
    pub fn snapshot(&self) -> itcp_proto::control::Stats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        itcp_proto::control::Stats {
            connections_total: g(&self.connections_total),
            connections_failed: g(&self.connections_failed),
            refused_not_mh: g(&self.refused_not_mh),
            refused_limit: g(&self.refused_limit),
            refused_rate: g(&self.refused_rate),
            refused_handshakes: g(&self.refused_handshakes),
            malformed_requests: g(&self.malformed_requests),
            aborted: g(&self.aborted),
            bytes_up: g(&self.bytes_up),
            bytes_down: g(&self.bytes_down),
            handoffs_in: g(&self.handoffs_in),
            handoffs_out: g(&self.handoffs_out),
            handoffs_failed: g(&self.handoffs_failed),
            connections_moved_in: g(&self.connections_moved_in),
            connections_moved_out: g(&self.connections_moved_out),
            handoff_messages_rejected: g(&self.handoff_messages_rejected),
            greetings_rejected: g(&self.greetings_rejected),
            channels_kept_used: g(&self.channels_kept_used),
            channels_kept_stale: g(&self.channels_kept_stale),
            held_delivered: g(&self.held_delivered),
            held_forwarded: g(&self.held_forwarded),
            held_dropped: g(&self.held_dropped),
            arrivals_stale: g(&self.arrivals_stale),
            pulls_limited: g(&self.pulls_limited),
            addresses_let_go: g(&self.addresses_let_go),
            station_questions: g(&self.station_questions),
            station_questions_limited: g(&self.station_questions_limited),
        }
    }
}

impl Stats {
    /// Carries the counters of an older msrd on (upgrade).
    pub fn restore(&self, s: &itcp_proto::control::Stats) {
        let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&self.connections_total, s.connections_total);
        set(&self.connections_failed, s.connections_failed);
        set(&self.refused_not_mh, s.refused_not_mh);
        set(&self.refused_limit, s.refused_limit);
        set(&self.refused_rate, s.refused_rate);
        set(&self.refused_handshakes, s.refused_handshakes);
        set(&self.malformed_requests, s.malformed_requests);
        set(&self.aborted, s.aborted);
        set(&self.bytes_up, s.bytes_up);
        set(&self.bytes_down, s.bytes_down);
        set(&self.handoffs_in, s.handoffs_in);
        set(&self.handoffs_out, s.handoffs_out);
        set(&self.handoffs_failed, s.handoffs_failed);
        set(&self.connections_moved_in, s.connections_moved_in);
        set(&self.connections_moved_out, s.connections_moved_out);
        set(&self.handoff_messages_rejected, s.handoff_messages_rejected);
        set(&self.greetings_rejected, s.greetings_rejected);
        set(&self.channels_kept_used, s.channels_kept_used);
        set(&self.channels_kept_stale, s.channels_kept_stale);
        set(&self.held_delivered, s.held_delivered);
        set(&self.held_forwarded, s.held_forwarded);
        set(&self.held_dropped, s.held_dropped);
        set(&self.arrivals_stale, s.arrivals_stale);
        set(&self.pulls_limited, s.pulls_limited);
        set(&self.addresses_let_go, s.addresses_let_go);
        set(&self.station_questions, s.station_questions);
        set(&self.station_questions_limited, s.station_questions_limited);
    }
}

/// A session as an older msrd hands it over (upgrade).
#[derive(Debug, Clone)]
pub struct Adopted {
    pub id: u64,
    pub kind: Kind,
    pub mh: SocketAddr,
    pub fh: SocketAddr,
    pub wireless_local: SocketAddr,
    pub started: SystemTime,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub moved_in: bool,
    pub up_idle_at_move: Option<u32>,
    pub before: (u64, u64),
}

/// What a connection that moved here brings from its previous MSR.
#[derive(Debug, Clone, Copy)]
pub struct MovedIn {
    pub started: SystemTime,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// See [`Session::up_idle_at_move`].
    pub up_idle_ms: Option<u32>,
}

impl Sessions {
    pub fn open(
        &self,
        kind: Kind,
        mh: SocketAddr,
        fh: SocketAddr,
        wireless_local: SocketAddr,
    ) -> Arc<Session> {
        self.insert(kind, mh, fh, wireless_local, None)
    }

    /// A connection that moved here in a handoff: it keeps its age and byte counts.
    pub fn open_moved(
        &self,
        kind: Kind,
        mh: SocketAddr,
        fh: SocketAddr,
        wireless_local: SocketAddr,
        from: MovedIn,
    ) -> Arc<Session> {
        self.insert(kind, mh, fh, wireless_local, Some(from))
    }

    fn insert(
        &self,
        kind: Kind,
        mh: SocketAddr,
        fh: SocketAddr,
        wireless_local: SocketAddr,
        moved: Option<MovedIn>,
    ) -> Arc<Session> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let s = Arc::new(Session {
            id,
            kind,
            mh,
            fh,
            wireless_local,
            started: moved.map_or_else(SystemTime::now, |m| m.started),
            counters: Counters::default(),
            pause: crate::relay::Pause::default(),
            frozen_to: Mutex::new(None),
            frozen: AtomicBool::new(false),
            moved_in: moved.is_some(),
            up_idle_at_move: moved.and_then(|m| m.up_idle_ms),
            before: moved.map_or((0, 0), |m| (m.bytes_up, m.bytes_down)),
        });
        if let Some(m) = moved {
            s.counters.up.store(m.bytes_up, Ordering::Relaxed);
            s.counters.down.store(m.bytes_down, Ordering::Relaxed);
            self.stats
                .connections_moved_in
                .fetch_add(1, Ordering::Relaxed);
        } else if kind.relays() {
            self.stats.connections_total.fetch_add(1, Ordering::Relaxed);
        }
        self.map.lock().unwrap().insert(id, s.clone());
        s
    }

    /// Puts a session of an older msrd in the table, with its id and counters
    /// (upgrade); later ids follow the largest one.
    pub fn adopt(&self, a: Adopted) -> Arc<Session> {
        let s = Arc::new(Session {
            id: a.id,
            kind: a.kind,
            mh: a.mh,
            fh: a.fh,
            wireless_local: a.wireless_local,
            started: a.started,
            counters: Counters::default(),
            pause: crate::relay::Pause::default(),
            frozen_to: Mutex::new(None),
            frozen: AtomicBool::new(false),
            moved_in: a.moved_in,
            up_idle_at_move: a.up_idle_at_move,
            before: a.before,
        });
        s.counters.up.store(a.bytes_up, Ordering::Relaxed);
        s.counters.down.store(a.bytes_down, Ordering::Relaxed);
        self.next.fetch_max(a.id, Ordering::Relaxed);
        self.map.lock().unwrap().insert(a.id, s.clone());
        s
    }

    /// The last id given out.
    pub fn last_id(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Makes later ids follow `id` (upgrade).
    pub fn continue_after(&self, id: u64) {
        self.next.fetch_max(id, Ordering::Relaxed);
    }

    /// Every live session, by id.
    pub fn all(&self) -> Vec<Arc<Session>> {
        let mut v: Vec<Arc<Session>> = self.map.lock().unwrap().values().cloned().collect();
        v.sort_by_key(|s| s.id);
        v
    }

    pub fn close(&self, s: &Session) {
        self.map.lock().unwrap().remove(&s.id);
        let st = &self.stats;
        let here = |c: &AtomicU64, before: u64| c.load(Ordering::Relaxed).saturating_sub(before);
        st.bytes_up
            .fetch_add(here(&s.counters.up, s.before.0), Ordering::Relaxed);
        st.bytes_down
            .fetch_add(here(&s.counters.down, s.before.1), Ordering::Relaxed);
    }

    /// Whether session `id` is still in the table (its relay or drain runs).
    pub fn is_open(&self, id: u64) -> bool {
        self.map.lock().unwrap().contains_key(&id)
    }

    /// The live sessions of one MH.
    pub fn of_mh(&self, mh: IpAddr) -> Vec<Arc<Session>> {
        let mh = crate::admission::canonical(mh);
        let mut v: Vec<Arc<Session>> = self
            .map
            .lock()
            .unwrap()
            .values()
            .filter(|s| s.mh_ip() == mh)
            .cloned()
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let now = SystemTime::now();
        let mut v: Vec<SessionInfo> = self
            .map
            .lock()
            .unwrap()
            .values()
            .map(|s| SessionInfo {
                id: s.id,
                kind: s.kind,
                mh: s.mh,
                fh: s.fh,
                wireless_local: s.wireless_local,
                age_s: now
                    .duration_since(s.started)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0),
                bytes_up: s.counters.up.load(Ordering::Relaxed),
                bytes_down: s.counters.down.load(Ordering::Relaxed),
                bytes_up_before: s.before.0,
                bytes_down_before: s.before.1,
                frozen: s.frozen.load(Ordering::Relaxed),
                moved_in: s.moved_in,
            })
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }

    /// Prometheus text exposition of the statistics (see [`crate::metrics`]).
    pub fn metrics(&self) -> String {
        crate::metrics::render_parts(
            &self.stats.snapshot(),
            &self.list(),
            &self.handoffs,
            &crate::relay::pipe_stats(),
        )
    }

    /// What the status page draws, now.
    pub fn status(&self, msr: &str) -> crate::metrics::Status {
        crate::metrics::status_parts(
            msr,
            crate::clock::now_us(),
            self.stats.snapshot(),
            self.list(),
            self.handoffs.recent(),
        )
    }
}

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

impl Frozen {
    /// The connection's flows as (MH's end, other end): the wireless one and the
    /// fixed one, if any (whose local end is the MH's address).
    pub fn flows(&self) -> Vec<(SocketAddr, SocketAddr)> {
        let w = &self.wireless;
        let mut v: Vec<_> = w.peer_addr().into_iter().zip(w.local_addr()).collect();
        if let Some(x) = &self.fixed {
            v.extend(x.local_addr().into_iter().zip(x.peer_addr()));
        }
        v
    }
}

impl std::fmt::Debug for Frozen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Frozen(session {})", self.session.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_list_close() {
        let t = Sessions::default();
        let a: SocketAddr = "10.2.0.100:4000".parse().unwrap();
        let f: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let s = t.open(Kind::Connect, a, f, "10.2.0.1:1080".parse().unwrap());
        s.counters.down.fetch_add(100, Ordering::Relaxed);
        let l = t.list();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].bytes_down, 100);
        assert!(t
            .metrics()
            .contains("msrd_bytes_total{direction=\"down\"} 100"));
        t.close(&s);
        assert!(t.is_empty());
        assert!(t
            .metrics()
            .contains("msrd_bytes_total{direction=\"down\"} 100"));
        assert!(t.metrics().contains("msrd_connections_total 1"));
    }
}
