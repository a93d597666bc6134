//! The operator's control protocol: msrd ⇄ `itcpctl` (and the testbed), one JSON
//! object per line over msrd's Unix control socket. Both ends use these types; nothing
//! indexes untyped JSON.
//!
//! ```text
//! → {"op":"stats"}
//! ← {"ok":true,"reply":"stats","msr":"msr1","active":2,"stats":{"connections_total":5,…}}
//! → {"op":"dance"}
//! ← {"ok":false,"reply":"error","error":"bad request: unknown variant `dance`, …"}
//! ```
//!
//! A malformed request gets an error reply and the connection stays usable.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

/// One request line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Every live connection.
    Sessions,
    /// The daemon-wide counters.
    Stats,
    /// The counters as Prometheus text (what `[metrics] listen` serves on `/metrics`).
    Metrics,
    /// Replace msrd by a new process of its binary, keeping every connection
    /// (the reply comes once the new process serves, or says why the old one goes on).
    Upgrade,
}

impl Request {
    /// Parses one request line; the error says what was wrong, for the reply.
    pub fn parse(line: &str) -> Result<Request, String> {
        let line = line.trim();
        if line.is_empty() {
            return Err(
                "empty request (send one JSON object per line, e.g. {\"op\":\"stats\"})".into(),
            );
        }
        // Syntax first, so that "not JSON" and "not a request" read differently.
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(line) {
            return Err(format!("request is not JSON: {e}"));
        }
        serde_json::from_str(line).map_err(|e| {
            format!("bad request: {e} (requests: {{\"op\":\"sessions\"}}, {{\"op\":\"stats\"}}, {{\"op\":\"metrics\"}}, {{\"op\":\"upgrade\"}})")
        })
    }

    /// The request as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("requests serialize");
        s.push('\n');
        s
    }
}

/// One reply line: `ok` and the body, whose `reply` field says which it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(flatten)]
    pub body: Body,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Body {
    Sessions(SessionsReply),
    Stats(StatsReply),
    Metrics(MetricsReply),
    Upgrade(UpgradeReply),
    Error(ErrorReply),
}

impl From<Body> for Reply {
    fn from(body: Body) -> Reply {
        Reply {
            ok: !matches!(body, Body::Error(_)),
            body,
        }
    }
}

impl Reply {
    pub fn error(e: impl Into<String>) -> Reply {
        Body::Error(ErrorReply { error: e.into() }).into()
    }

    /// Parses a reply line.
    pub fn parse(line: &str) -> Result<Reply, String> {
        serde_json::from_str(line.trim()).map_err(|e| format!("bad reply from msrd: {e}"))
    }

    /// The reply as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("replies serialize");
        s.push('\n');
        s
    }

    /// The body, or msrd's error.
    pub fn into_result(self) -> Result<Body, String> {
        match self.body {
            Body::Error(e) => Err(e.error),
            b if self.ok => Ok(b),
            _ => Err("msrd refused the request".into()),
        }
    }

    /// The sessions of a `sessions` reply.
    pub fn sessions(self) -> Result<SessionsReply, String> {
        match self.into_result()? {
            Body::Sessions(s) => Ok(s),
            other => Err(unexpected("sessions", &other)),
        }
    }

    /// The counters of a `stats` reply.
    pub fn stats(self) -> Result<StatsReply, String> {
        match self.into_result()? {
            Body::Stats(s) => Ok(s),
            other => Err(unexpected("stats", &other)),
        }
    }

    /// What an `upgrade` did.
    pub fn upgrade(self) -> Result<UpgradeReply, String> {
        match self.into_result()? {
            Body::Upgrade(u) => Ok(u),
            other => Err(unexpected("upgrade", &other)),
        }
    }

    /// The text of a `metrics` reply.
    pub fn metrics(self) -> Result<String, String> {
        match self.into_result()? {
            Body::Metrics(m) => Ok(m.text),
            other => Err(unexpected("metrics", &other)),
        }
    }
}

fn unexpected(wanted: &str, got: &Body) -> String {
    let got = match got {
        Body::Sessions(_) => "sessions",
        Body::Stats(_) => "stats",
        Body::Metrics(_) => "metrics",
        Body::Upgrade(_) => "upgrade",
        Body::Error(_) => "error",
    };
    format!("msrd answered a {wanted} request with a {got} reply")
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionsReply {
    pub msr: String,
    pub sessions: Vec<SessionInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsReply {
    pub msr: String,
    /// Connections in the session table now.
    pub active: u64,
    pub stats: Stats,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsReply {
    pub text: String,
}

/// A finished upgrade: the new process serves, the old one exits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeReply {
    pub msr: String,
    pub old_pid: u32,
    pub new_pid: u32,
    /// Connections handed over (relayed ones, listeners' control connections, waiting
    /// ACCEPTs).
    pub connections: u64,
    /// MH listeners handed over.
    pub listeners: u64,
    /// From the request to the new process serving, in ms.
    pub ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: String,
}

/// How a connection was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
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
    /// In setup: a request handshake waiting for the MH's next message.
    Handshake,
    /// In setup: an intercepted connection whose fixed side is not connected yet.
    Intercepted,
    /// Both directions ended; the kernel still delivers what was queued (and the
    /// FINs) before the sockets close.
    Closing,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Connect,
        Kind::Accept,
        Kind::Bind,
        Kind::Transparent,
        Kind::Listen,
        Kind::AcceptWait,
        Kind::Handshake,
        Kind::Intercepted,
        Kind::Closing,
    ];

    /// Relays bytes (not a listener's control connection, a waiting ACCEPT, or a
    /// connection in setup).
    pub fn relays(self) -> bool {
        !matches!(
            self,
            Kind::Listen | Kind::AcceptWait | Kind::Handshake | Kind::Intercepted | Kind::Closing
        )
    }

    /// Still being set up (no fixed side yet).
    pub fn in_setup(self) -> bool {
        matches!(self, Kind::Handshake | Kind::Intercepted)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Connect => "connect",
            Kind::Accept => "accept",
            Kind::Bind => "bind",
            Kind::Transparent => "transparent",
            Kind::Listen => "listen",
            Kind::AcceptWait => "accept_wait",
            Kind::Handshake => "handshake",
            Kind::Intercepted => "intercepted",
            Kind::Closing => "closing",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One live connection (a row of `itcpctl sessions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: u64,
    pub kind: Kind,
    /// The MH's address and port as the FH sees it.
    pub mh: SocketAddr,
    pub fh: SocketAddr,
    /// msrd's end of the wireless-side connection.
    pub wireless_local: SocketAddr,
    /// Since the connection was opened, wherever that was.
    pub age_s: f64,
    /// Relayed since the connection was opened, at every MSR it was served by.
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Of `bytes_up` and `bytes_down`, what earlier MSRs relayed (a moved connection).
    #[serde(default)]
    pub bytes_up_before: u64,
    #[serde(default)]
    pub bytes_down_before: u64,
    /// Frozen for a handoff.
    #[serde(default)]
    pub frozen: bool,
    /// Arrived here in a handoff.
    #[serde(default)]
    pub moved_in: bool,
}

impl SessionInfo {
    /// What the connection is doing, in a word.
    pub fn state(&self) -> &'static str {
        match (self.frozen, self.kind) {
            (true, _) => "frozen",
            (false, Kind::Listen) => "listening",
            (false, Kind::AcceptWait) => "waiting",
            (false, Kind::Handshake | Kind::Intercepted) => "setup",
            (false, Kind::Closing) => "closing",
            _ => "relaying",
        }
    }

    /// The MH's address.
    pub fn mh_ip(&self) -> IpAddr {
        match self.mh.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        }
    }
}

macro_rules! stats {
    ($($(#[doc = $doc:literal])* $field:ident,)*) => {
        /// The daemon-wide counters at one instant. Fields a reply lacks (an older
        /// msrd) read as 0.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct Stats {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl Stats {
            /// Every counter with its name, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field),)*]
            }
        }
    };
}

stats! {
    /// Relayed connections opened.
    connections_total,
    /// Requests whose fixed side could not be opened.
    connections_failed,
    /// Requests from outside the MH prefixes.
    refused_not_mh,
    /// Requests refused by connection limits.
    refused_limit,
    /// Requests refused by the accept-rate limit.
    refused_rate,
    /// Closed at accept: too many connections in setup from that source, or overall.
    refused_handshakes,
    /// Requests that broke the protocol.
    malformed_requests,
    /// Relays ended by a reset on either side.
    aborted,
    /// Bytes MH → FH of closed connections.
    bytes_up,
    /// Bytes FH → MH of closed connections.
    bytes_down,
    handoffs_in,
    handoffs_out,
    handoffs_failed,
    connections_moved_in,
    connections_moved_out,
    /// MSR channel messages rejected.
    handoff_messages_rejected,
    /// MH greetings rejected.
    greetings_rejected,
    /// Handoffs asked on a channel kept open to the peer ahead of need.
    channels_kept_used,
    /// Kept channels found closed by the peer (or dead when used) and replaced.
    channels_kept_stale,
    /// Packets held while their connection was frozen, then delivered to it here.
    held_delivered,
    /// Held packets sent on to the MSR their connection moved to.
    held_forwarded,
    /// Held packets dropped (no connection of theirs runs here, or held too long).
    held_dropped,
    /// Frames of an MH handed away that did not prove its return (network detection).
    arrivals_stale,
    /// Pulls not made: the MH's or the sending station's pull budget was spent.
    pulls_limited,
    /// Addresses let go because their station held `max_addresses_per_station`.
    addresses_let_go,
    /// Peers asked which MHs a station is (it sent a frame that proves no address).
    station_questions,
    /// Such questions not asked: too many at once or too fast.
    station_questions_limited,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_keep_their_wire_form() {
        for (r, line) in [
            (Request::Sessions, r#"{"op":"sessions"}"#),
            (Request::Stats, r#"{"op":"stats"}"#),
            (Request::Metrics, r#"{"op":"metrics"}"#),
            (Request::Upgrade, r#"{"op":"upgrade"}"#),
        ] {
            assert_eq!(Request::parse(line), Ok(r));
            assert_eq!(r.to_line(), format!("{line}\n"));
        }
        assert_eq!(
            Request::parse(" {\"op\": \"stats\"} \r\n"),
            Ok(Request::Stats)
        );
    }

    #[test]
    fn malformed_requests_say_what_is_wrong() {
        let e = Request::parse("{nope").unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let e = Request::parse(r#"{"op":"dance"}"#).unwrap_err();
        assert!(e.contains("unknown variant `dance`"), "{e}");
        let e = Request::parse(r#"{"cmd":"stats"}"#).unwrap_err();
        assert!(e.contains("op"), "{e}");
        // Requests without arguments ignore extra fields (serde's rule for them).
        assert_eq!(
            Request::parse(r#"{"op":"stats","x":1}"#),
            Ok(Request::Stats)
        );
        assert!(Request::parse("").unwrap_err().contains("empty"));
        assert!(Request::parse("[1]").is_err());
    }

    #[test]
    fn replies_round_trip_and_keep_ok() {
        let stats = Stats {
            connections_total: 3,
            bytes_up: 7,
            ..Default::default()
        };
        let r: Reply = Body::Stats(StatsReply {
            msr: "msr1".into(),
            active: 2,
            stats: stats.clone(),
        })
        .into();
        let line = r.to_line();
        assert!(line.starts_with(r#"{"ok":true,"reply":"stats","msr":"msr1","active":2,"stats":{"connections_total":3,"#), "{line}");
        assert_eq!(Reply::parse(&line).unwrap(), r);
        assert_eq!(Reply::parse(&line).unwrap().stats().unwrap().stats, stats);

        let s = SessionInfo {
            id: 1,
            kind: Kind::AcceptWait,
            mh: "10.2.0.100:5000".parse().unwrap(),
            fh: "10.0.0.1:80".parse().unwrap(),
            wireless_local: "10.2.0.1:1080".parse().unwrap(),
            age_s: 1.5,
            bytes_up: 1,
            bytes_down: 2,
            bytes_up_before: 1,
            bytes_down_before: 0,
            frozen: false,
            moved_in: true,
        };
        let r: Reply = Body::Sessions(SessionsReply {
            msr: "m".into(),
            sessions: vec![s.clone()],
        })
        .into();
        let line = r.to_line();
        assert!(line.contains(r#""kind":"accept_wait""#), "{line}");
        assert_eq!(
            Reply::parse(&line).unwrap().sessions().unwrap().sessions,
            vec![s]
        );

        let e = Reply::error("no");
        assert_eq!(
            e.to_line(),
            "{\"ok\":false,\"reply\":\"error\",\"error\":\"no\"}\n"
        );
        assert_eq!(
            Reply::parse(&e.to_line()).unwrap().into_result(),
            Err("no".into())
        );
        let m: Reply = Body::Metrics(MetricsReply {
            text: "x 1\n".into(),
        })
        .into();
        assert!(Reply::parse(&m.to_line())
            .unwrap()
            .stats()
            .unwrap_err()
            .contains("metrics reply"));
        let u = UpgradeReply {
            msr: "m".into(),
            old_pid: 10,
            new_pid: 11,
            connections: 3,
            listeners: 1,
            ms: 40,
        };
        let line = Reply::from(Body::Upgrade(u.clone())).to_line();
        assert!(
            line.starts_with(
                r#"{"ok":true,"reply":"upgrade","msr":"m","old_pid":10,"new_pid":11,"#
            ),
            "{line}"
        );
        assert_eq!(Reply::parse(&line).unwrap().upgrade(), Ok(u));
    }

    #[test]
    fn stats_from_an_older_msrd_read_missing_counters_as_zero() {
        let s: Stats = serde_json::from_str(r#"{"connections_total":4,"future":1}"#).unwrap();
        assert_eq!(s.connections_total, 4);
        assert_eq!(s.fields().len(), 27);
        assert_eq!(s.fields()[0], ("connections_total", 4));
    }

    #[test]
    fn kinds_and_states() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.as_str())
            );
        }
        assert_eq!(Kind::parse("nope"), None);
        assert!(!Kind::Listen.relays() && Kind::Transparent.relays());
    }
}
