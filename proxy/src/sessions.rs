//! The session table: every relayed I-TCP connection with its endpoints and byte
//! counters, and the daemon-wide statistics `itcpctl` reads.

use std::collections::HashMap;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::{oneshot, watch};

use crate::handoff::Frozen;
use crate::relay::Counters;

/// How a connection was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// MH-initiated through the request protocol (SOCKS CONNECT).
    Connect,
    /// Accepted on an MH listener (LISTEN/ACCEPT).
    Accept,
    /// SOCKS BIND.
    Bind,
    /// Intercepted SYN of an unmodified MH app (TPROXY).
    Transparent,
    /// A LISTEN's control connection (the MSR keeps a listener for the MH).
    Listen,
    /// An ACCEPT waiting for a connection on the MH's listener.
    AcceptWait,
}

impl Kind {
    /// Relays bytes (not a listener's control connection or a waiting ACCEPT).
    pub fn relays(self) -> bool {
        !matches!(self, Kind::Listen | Kind::AcceptWait)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Connect => "connect",
            Kind::Accept => "accept",
            Kind::Bind => "bind",
            Kind::Transparent => "transparent",
            Kind::Listen => "listen",
            Kind::AcceptWait => "accept_wait",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Connect,
            Kind::Accept,
            Kind::Bind,
            Kind::Transparent,
            Kind::Listen,
            Kind::AcceptWait,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

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
    pub pause: watch::Sender<bool>,
    /// Where a paused relay hands its sockets.
    pub frozen_to: Mutex<Option<oneshot::Sender<Frozen>>>,
    /// Frozen for a handoff (shown by `itcpctl sessions`).
    pub frozen: AtomicBool,
    /// Arrived here in a handoff.
    pub moved_in: bool,
}

impl Session {
    /// The MH's address.
    pub fn mh_ip(&self) -> IpAddr {
        crate::admission::canonical(self.mh.ip())
    }
}

/// A row of `itcpctl sessions`.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    pub id: u64,
    pub kind: Kind,
    pub mh: SocketAddr,
    pub fh: SocketAddr,
    pub wireless_local: SocketAddr,
    pub age_s: f64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub frozen: bool,
    pub moved_in: bool,
}

/// Daemon-wide counters.
#[derive(Debug, Default, Serialize)]
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
}

#[derive(Debug, Default)]
pub struct Sessions {
    next: AtomicU64,
    map: Mutex<HashMap<u64, Arc<Session>>>,
    pub stats: Stats,
}

impl Sessions {
    pub fn open(
        &self,
        kind: Kind,
        mh: SocketAddr,
        fh: SocketAddr,
        wireless_local: SocketAddr,
    ) -> Arc<Session> {
        self.insert(kind, mh, fh, wireless_local, false)
    }

    /// A connection that moved here in a handoff.
    pub fn open_moved(
        &self,
        kind: Kind,
        mh: SocketAddr,
        fh: SocketAddr,
        wireless_local: SocketAddr,
    ) -> Arc<Session> {
        self.insert(kind, mh, fh, wireless_local, true)
    }

    fn insert(
        &self,
        kind: Kind,
        mh: SocketAddr,
        fh: SocketAddr,
        wireless_local: SocketAddr,
        moved_in: bool,
    ) -> Arc<Session> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let s = Arc::new(Session {
            id,
            kind,
            mh,
            fh,
            wireless_local,
            started: SystemTime::now(),
            counters: Counters::default(),
            pause: watch::channel(false).0,
            frozen_to: Mutex::new(None),
            frozen: AtomicBool::new(false),
            moved_in,
        });
        if moved_in {
            self.stats
                .connections_moved_in
                .fetch_add(1, Ordering::Relaxed);
        } else if kind.relays() {
            self.stats.connections_total.fetch_add(1, Ordering::Relaxed);
        }
        self.map.lock().unwrap().insert(id, s.clone());
        s
    }

    pub fn close(&self, s: &Session) {
        self.map.lock().unwrap().remove(&s.id);
        let st = &self.stats;
        st.bytes_up
            .fetch_add(s.counters.up.load(Ordering::Relaxed), Ordering::Relaxed);
        st.bytes_down
            .fetch_add(s.counters.down.load(Ordering::Relaxed), Ordering::Relaxed);
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
                frozen: s.frozen.load(Ordering::Relaxed),
                moved_in: s.moved_in,
            })
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }

    /// Prometheus text exposition of the statistics.
    pub fn metrics(&self) -> String {
        let st = &self.stats;
        let live: (u64, u64) = self.map.lock().unwrap().values().fold((0, 0), |a, s| {
            (
                a.0 + s.counters.up.load(Ordering::Relaxed),
                a.1 + s.counters.down.load(Ordering::Relaxed),
            )
        });
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut m = |name: &str, kind: &str, help: &str, v: u64| {
            out +=
                &format!("# HELP msrd_{name} {help}\n# TYPE msrd_{name} {kind}\nmsrd_{name} {v}\n");
        };
        m(
            "connections_active",
            "gauge",
            "Relayed connections now open.",
            self.len() as u64,
        );
        // Every plain counter, in one table.
        for (name, help, v) in [
            (
                "connections_total",
                "Relayed connections opened.",
                &st.connections_total,
            ),
            (
                "connections_failed_total",
                "Requests whose fixed side could not be opened.",
                &st.connections_failed,
            ),
            (
                "refused_not_mh_total",
                "Requests from outside the MH prefixes.",
                &st.refused_not_mh,
            ),
            (
                "refused_limit_total",
                "Requests refused by connection limits.",
                &st.refused_limit,
            ),
            (
                "refused_rate_total",
                "Requests refused by the accept-rate limit.",
                &st.refused_rate,
            ),
            (
                "refused_handshakes_total",
                "Connections closed at accept: too many in setup from their source or overall.",
                &st.refused_handshakes,
            ),
            (
                "malformed_requests_total",
                "Requests that broke the protocol.",
                &st.malformed_requests,
            ),
            (
                "aborted_total",
                "Relays ended by a reset on either side.",
                &st.aborted,
            ),
            (
                "handoffs_in_total",
                "Handoffs that moved an MH's connections here.",
                &st.handoffs_in,
            ),
            (
                "handoffs_out_total",
                "Handoffs that moved an MH's connections away.",
                &st.handoffs_out,
            ),
            (
                "handoffs_failed_total",
                "Handoffs rolled back or refused.",
                &st.handoffs_failed,
            ),
            (
                "connections_moved_in_total",
                "Connections restored here by handoffs.",
                &st.connections_moved_in,
            ),
            (
                "connections_moved_out_total",
                "Connections handed to another MSR.",
                &st.connections_moved_out,
            ),
            (
                "handoff_messages_rejected_total",
                "MSR messages rejected (forged, replayed, unknown peer, malformed).",
                &st.handoff_messages_rejected,
            ),
            (
                "greetings_rejected_total",
                "MH greetings rejected (malformed or without valid proof).",
                &st.greetings_rejected,
            ),
        ] {
            m(name, "counter", help, g(v));
        }
        m(
            "bytes_up_total",
            "counter",
            "Bytes relayed MH to FH.",
            g(&st.bytes_up) + live.0,
        );
        m(
            "bytes_down_total",
            "counter",
            "Bytes relayed FH to MH.",
            g(&st.bytes_down) + live.1,
        );
        out
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
        assert!(t.metrics().contains("msrd_bytes_down_total 100"));
        t.close(&s);
        assert!(t.is_empty());
        assert!(t.metrics().contains("msrd_bytes_down_total 100"));
        assert!(t.metrics().contains("msrd_connections_total 1"));
    }
}
