//! The session table: every relayed I-TCP connection with its endpoints and byte
//! counters, and the daemon-wide statistics `itcpctl` reads.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

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
}

/// Daemon-wide counters.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    pub connections_total: AtomicU64,
    pub connections_failed: AtomicU64,
    pub refused_not_mh: AtomicU64,
    pub refused_limit: AtomicU64,
    pub refused_rate: AtomicU64,
    pub malformed_requests: AtomicU64,
    pub aborted: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
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
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let s = Arc::new(Session {
            id,
            kind,
            mh,
            fh,
            wireless_local,
            started: SystemTime::now(),
            counters: Counters::default(),
        });
        self.stats.connections_total.fetch_add(1, Ordering::Relaxed);
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
        m(
            "connections_total",
            "counter",
            "Relayed connections opened.",
            g(&st.connections_total),
        );
        m(
            "connections_failed_total",
            "counter",
            "Requests whose fixed side could not be opened.",
            g(&st.connections_failed),
        );
        m(
            "refused_not_mh_total",
            "counter",
            "Requests from outside the MH prefixes.",
            g(&st.refused_not_mh),
        );
        m(
            "refused_limit_total",
            "counter",
            "Requests refused by connection limits.",
            g(&st.refused_limit),
        );
        m(
            "refused_rate_total",
            "counter",
            "Requests refused by the accept-rate limit.",
            g(&st.refused_rate),
        );
        m(
            "malformed_requests_total",
            "counter",
            "Requests that broke the protocol.",
            g(&st.malformed_requests),
        );
        m(
            "aborted_total",
            "counter",
            "Relays ended by a reset on either side.",
            g(&st.aborted),
        );
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
