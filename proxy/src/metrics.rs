//! What msrd measures, in two shapes: the Prometheus text exposition (`/metrics` of
//! `[metrics] listen`, and `itcpctl metrics`), and the status document the status page
//! draws (`/status.json`). Also the handoff duration histogram and the recent handoff
//! records, which [`crate::daemon::Daemon::write_log`] feeds.
//!
//! Families (all prefixed `msrd_`):
//!
//! | family | type | labels |
//! |---|---|---|
//! | `connections_active` | gauge | |
//! | `connections` | gauge | `kind`, `state` (relaying, listening, waiting, frozen) |
//! | `mhs` | gauge | MHs with connections here |
//! | `connections_total`, `connections_failed_total` | counter | |
//! | `refused_total` | counter | `reason` (not_mh, limit, rate, handshakes) |
//! | `malformed_requests_total`, `aborted_total` | counter | |
//! | `bytes_total` | counter | `direction` (up: MH → FH, down: FH → MH) |
//! | `handoffs_total` | counter | `direction` (in, out) |
//! | `handoffs_failed_total` | counter | |
//! | `connections_moved_total` | counter | `direction` (in, out) |
//! | `handoff_duration_seconds` | histogram | `role` (new, old) |
//! | `handoff_messages_rejected_total`, `greetings_rejected_total` | counter | |
//! | `arrivals_stale_total` | counter | |
//! | `handoff_pulls_limited_total` | counter | |
//! | `addresses_let_go_total` | counter | |
//! | `station_questions_total` | counter | `outcome` (asked, limited) |
//! | `handoff_channels_kept_total` | counter | `outcome` (used, stale) |
//! | `held_packets_total` | counter | `fate` (delivered, forwarded, dropped) |
//! | `relay_pipes` | gauge | `state` (in_use, pooled) |
//! | `relay_pipe_bytes` | gauge | capacity of the pipes in use |
//! | `relay_pipes_created_total`, `relay_pipe_fallbacks_total` | counter | |

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use itcp_handoff::log::{Outcome, Record, Role};
use itcp_proto::control::{Kind, SessionInfo, Stats};
use serde::Serialize;

use crate::relay::PipeStats;
use crate::upgrade::wire::{HandoffHistory, HistogramState};

/// Upper bounds of the handoff duration buckets, in µs (5 ms … 30 s).
pub const DURATION_BUCKETS_US: [u64; 12] = [
    5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
    10_000_000, 30_000_000,
];

/// Handoff records kept for the status page.
pub const RECENT_HANDOFFS: usize = 50;

/// A Prometheus histogram over [`DURATION_BUCKETS_US`], lock-free.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket (not cumulative); the last one is +Inf.
    counts: [AtomicU64; DURATION_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe_us(&self, us: u64) {
        let i = DURATION_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(DURATION_BUCKETS_US.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Cumulative counts per bucket (the last is +Inf, i.e. the total count).
    pub fn cumulative(&self) -> Vec<u64> {
        let mut acc = 0;
        self.counts
            .iter()
            .map(|c| {
                acc += c.load(Ordering::Relaxed);
                acc
            })
            .collect()
    }

    pub fn count(&self) -> u64 {
        self.cumulative().last().copied().unwrap_or(0)
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    fn state(&self) -> HistogramState {
        HistogramState {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }

    /// Adds a handed-over histogram's counts. One with other buckets (a build that
    /// changed them) is left out rather than counted in the wrong buckets.
    fn restore(&self, s: &HistogramState) {
        if s.counts.len() != self.counts.len() {
            return;
        }
        for (c, n) in self.counts.iter().zip(&s.counts) {
            c.fetch_add(*n, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(s.sum_us, Ordering::Relaxed);
    }
}

/// Handoff durations by role and the last [`RECENT_HANDOFFS`] records.
#[derive(Debug, Default)]
pub struct HandoffMetrics {
    pub new: Histogram,
    pub old: Histogram,
    recent: Mutex<VecDeque<Record>>,
}

/// How long a handoff took as its record tells: at the new MSR from the greeting to
/// the resumed connections (what the MH waits for), else from the first phase seen to
/// the last.
pub fn handoff_duration_us(r: &Record) -> Option<u64> {
    match (r.role, r.phases.greeting, r.phases.resumed) {
        (Role::New, Some(g), Some(x)) if x >= g => Some(x - g),
        _ => r.duration_us(),
    }
}

impl HandoffMetrics {
    /// One handoff record as msrd writes it. Rejected requests (spoofed greetings,
    /// forged messages) are kept for the page but not timed.
    pub fn observe(&self, r: &Record) {
        if r.outcome != Outcome::Rejected {
            if let Some(us) = handoff_duration_us(r) {
                match r.role {
                    Role::New => self.new.observe_us(us),
                    Role::Old => self.old.observe_us(us),
                }
            }
        }
        let mut q = self.recent.lock().unwrap();
        if q.len() == RECENT_HANDOFFS {
            q.pop_front();
        }
        q.push_back(r.clone());
    }

    /// The recent records, newest first.
    pub fn recent(&self) -> Vec<Record> {
        self.recent.lock().unwrap().iter().rev().cloned().collect()
    }

    /// What an upgrade hands to the new process.
    pub fn history(&self) -> HandoffHistory {
        HandoffHistory {
            new: self.new.state(),
            old: self.old.state(),
            recent: self.recent.lock().unwrap().iter().cloned().collect(),
        }
    }

    /// Takes over what the old process of an upgrade had, before anything is observed
    /// here.
    pub fn restore(&self, h: &HandoffHistory) {
        self.new.restore(&h.new);
        self.old.restore(&h.old);
        let mut q = self.recent.lock().unwrap();
        let skip = h.recent.len().saturating_sub(RECENT_HANDOFFS);
        q.extend(h.recent.iter().skip(skip).cloned());
        while q.len() > RECENT_HANDOFFS {
            q.pop_front();
        }
    }
}

/// Escapes a label value (backslash, double quote, newline).
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Writes Prometheus text, one family at a time.
struct Exposition(String);

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = write!(
            self.0,
            "# HELP msrd_{name} {help}\n# TYPE msrd_{name} {kind}\n"
        );
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: impl std::fmt::Display) {
        self.0.push_str("msrd_");
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape_label(val));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {v}");
    }

    fn single(&mut self, name: &str, kind: &str, help: &str, v: u64) {
        self.family(name, kind, help);
        self.sample(name, &[], v);
    }

    fn histogram(&mut self, name: &str, label: &str, parts: &[(&str, &Histogram)]) {
        for (value, h) in parts {
            let cum = h.cumulative();
            for (i, c) in cum.iter().enumerate() {
                let le = match DURATION_BUCKETS_US.get(i) {
                    Some(&b) => format!("{}", b as f64 / 1e6),
                    None => "+Inf".to_string(),
                };
                self.sample(&format!("{name}_bucket"), &[(label, value), ("le", &le)], c);
            }
            self.sample(&format!("{name}_sum"), &[(label, value)], h.sum_seconds());
            self.sample(&format!("{name}_count"), &[(label, value)], h.count());
        }
    }
}

/// The states a connection of `kind` can be in (every pair is always exposed).
fn states(kind: Kind) -> [&'static str; 2] {
    match kind {
        Kind::Listen => ["listening", "frozen"],
        Kind::AcceptWait => ["waiting", "frozen"],
        Kind::Handshake | Kind::Intercepted => ["setup", "frozen"],
        Kind::Closing => ["closing", "frozen"],
        _ => ["relaying", "frozen"],
    }
}

/// Everything, as Prometheus text (format 0.0.4), from its parts (pure, for tests;
/// `Sessions::metrics` gathers them).
pub fn render_parts(
    st: &Stats,
    live: &[SessionInfo],
    handoffs: &HandoffMetrics,
    pipes: &PipeStats,
) -> String {
    let mut e = Exposition(String::new());
    let (live_up, live_down) = live
        .iter()
        // This msrd's bytes only: a moved connection's counts began at earlier MSRs.
        .fold((0, 0), |a, s| {
            (
                a.0 + s.bytes_up.saturating_sub(s.bytes_up_before),
                a.1 + s.bytes_down.saturating_sub(s.bytes_down_before),
            )
        });
    e.single(
        "connections_active",
        "gauge",
        "Connections in the session table now (relays, listeners, waiting accepts, setups).",
        live.len() as u64,
    );
    e.family(
        "connections",
        "gauge",
        "Connections now, by how they were opened and what they are doing.",
    );
    let mut by: BTreeMap<(Kind, &str), u64> = BTreeMap::new();
    for s in live {
        *by.entry((s.kind, s.state())).or_default() += 1;
    }
    for k in Kind::ALL {
        for state in states(k) {
            let n = by.get(&(k, state)).copied().unwrap_or(0);
            e.sample("connections", &[("kind", k.as_str()), ("state", state)], n);
        }
    }
    let mhs: std::collections::HashSet<IpAddr> = live.iter().map(SessionInfo::mh_ip).collect();
    e.single(
        "mhs",
        "gauge",
        "Mobile hosts with connections here now.",
        mhs.len() as u64,
    );
    e.single(
        "connections_total",
        "counter",
        "Relayed connections opened here (not counting those moved in).",
        st.connections_total,
    );
    e.single(
        "connections_failed_total",
        "counter",
        "Requests whose fixed side could not be opened.",
        st.connections_failed,
    );
    e.family(
        "refused_total",
        "counter",
        "Connections refused, by reason: not_mh (outside the MH prefixes), limit (connection limits), rate (accept rate), handshakes (too many in setup).",
    );
    for (reason, v) in [
        ("not_mh", st.refused_not_mh),
        ("limit", st.refused_limit),
        ("rate", st.refused_rate),
        ("handshakes", st.refused_handshakes),
    ] {
        e.sample("refused_total", &[("reason", reason)], v);
    }
    e.single(
        "malformed_requests_total",
        "counter",
        "Requests that broke the protocol.",
        st.malformed_requests,
    );
    e.single(
        "aborted_total",
        "counter",
        "Relays ended by a reset on either side.",
        st.aborted,
    );
    e.family(
        "bytes_total",
        "counter",
        "Bytes relayed: up is MH to FH, down is FH to MH.",
    );
    e.sample("bytes_total", &[("direction", "up")], st.bytes_up + live_up);
    e.sample(
        "bytes_total",
        &[("direction", "down")],
        st.bytes_down + live_down,
    );
    e.family(
        "handoffs_total",
        "counter",
        "Handoffs that moved an MH's connections here (in) or away (out).",
    );
    e.sample("handoffs_total", &[("direction", "in")], st.handoffs_in);
    e.sample("handoffs_total", &[("direction", "out")], st.handoffs_out);
    e.single(
        "handoffs_failed_total",
        "counter",
        "Handoffs rolled back or refused.",
        st.handoffs_failed,
    );
    e.family(
        "connections_moved_total",
        "counter",
        "Connections restored here (in) or handed to another MSR (out) by handoffs.",
    );
    e.sample(
        "connections_moved_total",
        &[("direction", "in")],
        st.connections_moved_in,
    );
    e.sample(
        "connections_moved_total",
        &[("direction", "out")],
        st.connections_moved_out,
    );
    e.family(
        "handoff_duration_seconds",
        "histogram",
        "Handoff durations from the handoff records: at the new MSR greeting to resumed, at the old MSR first to last phase.",
    );
    e.histogram(
        "handoff_duration_seconds",
        "role",
        &[("new", &handoffs.new), ("old", &handoffs.old)],
    );
    e.single(
        "handoff_messages_rejected_total",
        "counter",
        "MSR channel messages rejected (forged, replayed, unknown peer, malformed).",
        st.handoff_messages_rejected,
    );
    e.single(
        "greetings_rejected_total",
        "counter",
        "MH greetings rejected (malformed or without valid proof).",
        st.greetings_rejected,
    );
    e.single(
        "arrivals_stale_total",
        "counter",
        "Frames of an MH handed away that reached its old cell and did not prove its return (network detection): taken for frames from before the move.",
        st.arrivals_stale,
    );
    e.single(
        "handoff_pulls_limited_total",
        "counter",
        "Handoffs not started because the MH's pull budget (5 at once, then 2 a second) or the sending station's was spent: the bound on moves per MH.",
        st.pulls_limited,
    );
    e.single(
        "addresses_let_go_total",
        "counter",
        "MH addresses unbound because their station held [access] max_addresses_per_station (network detection): the oldest with no connection here goes.",
        st.addresses_let_go,
    );
    e.family(
        "station_questions_total",
        "counter",
        "Network detection: peers asked which MHs a station is, after it sent a frame that proves no address (link-local, unspecified source, or hostapd's association event); limited: not asked, too many at once or too fast.",
    );
    e.sample(
        "station_questions_total",
        &[("outcome", "asked")],
        st.station_questions,
    );
    e.sample(
        "station_questions_total",
        &[("outcome", "limited")],
        st.station_questions_limited,
    );
    e.family(
        "handoff_channels_kept_total",
        "counter",
        "Channels kept open to peers ahead of need: used by a handoff, or found closed and replaced.",
    );
    e.sample(
        "handoff_channels_kept_total",
        &[("outcome", "used")],
        st.channels_kept_used,
    );
    e.sample(
        "handoff_channels_kept_total",
        &[("outcome", "stale")],
        st.channels_kept_stale,
    );
    e.family(
        "held_packets_total",
        "counter",
        "TCP packets held while their connection was frozen for a handoff, by what became of them.",
    );
    for (fate, n) in [
        ("delivered", st.held_delivered),
        ("forwarded", st.held_forwarded),
        ("dropped", st.held_dropped),
    ] {
        e.sample("held_packets_total", &[("fate", fate)], n);
    }
    e.family(
        "relay_pipes",
        "gauge",
        "Splice pipes held by relays with bytes in flight (in_use) or kept for reuse (pooled).",
    );
    e.sample("relay_pipes", &[("state", "in_use")], pipes.in_use);
    e.sample("relay_pipes", &[("state", "pooled")], pipes.pooled);
    e.single(
        "relay_pipe_bytes",
        "gauge",
        "Capacity of the splice pipes in use, in bytes.",
        pipes.in_use_bytes,
    );
    e.single(
        "relay_pipes_created_total",
        "counter",
        "Splice pipes created.",
        pipes.created,
    );
    e.single(
        "relay_pipe_fallbacks_total",
        "counter",
        "Times a relay found no pipe (fd limit) and copied through user space.",
        pipes.fallbacks,
    );
    e.0
}

/// One MH on the status page.
#[derive(Debug, Clone, Serialize)]
pub struct MhStatus {
    pub mh: IpAddr,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub connections: Vec<ConnStatus>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConnStatus {
    #[serde(flatten)]
    pub info: SessionInfo,
    pub state: &'static str,
}

/// What `/status.json` serves and the status page draws.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub msr: String,
    /// µs since the UNIX epoch (the handoff phases use the same clock).
    pub now_us: u64,
    pub active: usize,
    pub stats: Stats,
    pub mhs: Vec<MhStatus>,
    /// The recent handoff records, newest first.
    pub handoffs: Vec<Record>,
}

/// The status document from its parts (`Sessions::status` gathers them).
pub fn status_parts(
    msr: &str,
    now_us: u64,
    stats: Stats,
    live: Vec<SessionInfo>,
    handoffs: Vec<Record>,
) -> Status {
    let active = live.len();
    let mut by_mh: BTreeMap<IpAddr, MhStatus> = BTreeMap::new();
    for s in live {
        let m = by_mh.entry(s.mh_ip()).or_insert_with(|| MhStatus {
            mh: s.mh_ip(),
            bytes_up: 0,
            bytes_down: 0,
            connections: Vec::new(),
        });
        m.bytes_up += s.bytes_up;
        m.bytes_down += s.bytes_down;
        let state = s.state();
        m.connections.push(ConnStatus { info: s, state });
    }
    Status {
        msr: msr.to_string(),
        now_us,
        active,
        stats,
        mhs: by_mh.into_values().collect(),
        handoffs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use itcp_handoff::log::Phases;

    fn record(role: Role, outcome: Outcome, phases: Phases) -> Record {
        Record {
            handoff_id: 7,
            msr: "msr2".into(),
            role,
            mh: "10.2.0.100".parse().unwrap(),
            old_msr: "msr1".into(),
            new_msr: "msr2".into(),
            outcome,
            reason: None,
            connections: vec![],
            failed: vec![],
            phases,
            bytes_moved: None,
        }
    }

    fn session(id: u64, kind: Kind, mh: &str, frozen: bool) -> SessionInfo {
        SessionInfo {
            id,
            kind,
            mh: format!("{mh}:5000").parse().unwrap(),
            fh: "10.0.0.1:80".parse().unwrap(),
            wireless_local: "10.2.0.1:1080".parse().unwrap(),
            age_s: 1.0,
            bytes_up: 10 * id,
            bytes_down: 100 * id,
            bytes_up_before: 0,
            bytes_down_before: 0,
            frozen,
            moved_in: false,
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_bounds_inclusive() {
        let h = Histogram::default();
        h.observe_us(5_000); // exactly on the first bound
        h.observe_us(5_001);
        h.observe_us(40_000_000); // past the last: +Inf only
        let c = h.cumulative();
        assert_eq!(c.len(), DURATION_BUCKETS_US.len() + 1);
        assert_eq!(&c[..3], &[1, 2, 2]);
        assert_eq!(c[DURATION_BUCKETS_US.len() - 1], 2);
        assert_eq!(h.count(), 3);
        assert!((h.sum_seconds() - 40.010001).abs() < 1e-9);
    }

    #[test]
    fn durations_and_recent_records() {
        let m = HandoffMetrics::default();
        let p = Phases {
            greeting: Some(1_000_000),
            restored: Some(1_020_000),
            resumed: Some(1_030_000),
            acknowledged: Some(1_900_000),
            ..Default::default()
        };
        let r = record(Role::New, Outcome::Moved, p.clone());
        assert_eq!(handoff_duration_us(&r), Some(30_000));
        m.observe(&r);
        let old = record(Role::Old, Outcome::Moved, p);
        assert_eq!(handoff_duration_us(&old), Some(900_000));
        m.observe(&old);
        let rej = record(
            Role::New,
            Outcome::Rejected,
            Phases {
                greeting: Some(5),
                ..Default::default()
            },
        );
        m.observe(&rej);
        assert_eq!((m.new.count(), m.old.count()), (1, 1));
        assert_eq!(m.recent().len(), 3);
        assert_eq!(m.recent()[0].outcome, Outcome::Rejected);
        for _ in 0..RECENT_HANDOFFS {
            m.observe(&old);
        }
        assert_eq!(m.recent().len(), RECENT_HANDOFFS);
        assert!(m.recent().iter().all(|r| r.role == Role::Old));
    }

    #[test]
    fn an_upgrade_carries_the_histograms_and_recent_handoffs() {
        let old = HandoffMetrics::default();
        let p = Phases {
            greeting: Some(1_000_000),
            resumed: Some(1_030_000),
            ..Default::default()
        };
        old.observe(&record(Role::New, Outcome::Moved, p.clone()));
        old.observe(&record(Role::Old, Outcome::RolledBack, p.clone()));
        // Through the hand-over's JSON, as the new process gets it.
        let json = serde_json::to_string(&old.history()).unwrap();
        let new = HandoffMetrics::default();
        new.restore(&serde_json::from_str(&json).unwrap());
        assert_eq!(new.new.cumulative(), old.new.cumulative());
        assert_eq!(new.old.count(), 1);
        assert_eq!(new.new.sum_seconds(), old.new.sum_seconds());
        assert_eq!(new.recent(), old.recent());
        // The new process goes on counting on top.
        new.observe(&record(Role::New, Outcome::Moved, p));
        assert_eq!(new.new.count(), 2);
        assert_eq!(new.recent().len(), 3);
        // Buckets of another build are left out, not misplaced.
        let odd = HandoffHistory {
            new: HistogramState {
                counts: vec![1],
                sum_us: 5,
            },
            ..Default::default()
        };
        new.restore(&odd);
        assert_eq!(new.new.count(), 2);
    }

    #[test]
    fn bytes_total_counts_what_this_msrd_relayed_not_what_a_moved_connection_brought() {
        let mut moved = session(4, Kind::Connect, "10.2.0.100", false);
        (moved.bytes_up, moved.bytes_up_before) = (1000, 900);
        (moved.bytes_down, moved.bytes_down_before) = (50, 50);
        let pipes = PipeStats::default();
        let t = render_parts(
            &Stats::default(),
            &[moved],
            &HandoffMetrics::default(),
            &pipes,
        );
        for line in [
            "msrd_bytes_total{direction=\"up\"} 100",
            "msrd_bytes_total{direction=\"down\"} 0",
        ] {
            assert!(t.lines().any(|l| l == line), "no {line:?} in\n{t}");
        }
    }

    #[test]
    fn exposition_has_every_family_once_with_labels() {
        let st = Stats {
            refused_rate: 3,
            bytes_up: 5,
            handoffs_in: 2,
            ..Default::default()
        };
        let live = vec![
            session(1, Kind::Connect, "10.2.0.100", false),
            session(2, Kind::Connect, "10.2.0.100", true),
            session(3, Kind::Listen, "10.2.0.101", false),
        ];
        let h = HandoffMetrics::default();
        h.new.observe_us(20_000);
        let pipes = PipeStats {
            in_use: 1,
            in_use_bytes: 1 << 20,
            pooled: 2,
            created: 3,
            fallbacks: 0,
        };
        let t = render_parts(&st, &live, &h, &pipes);
        for line in [
            "msrd_connections_active 3",
            "msrd_connections{kind=\"connect\",state=\"relaying\"} 1",
            "msrd_connections{kind=\"connect\",state=\"frozen\"} 1",
            "msrd_connections{kind=\"listen\",state=\"listening\"} 1",
            "msrd_connections{kind=\"bind\",state=\"frozen\"} 0",
            "msrd_mhs 2",
            "msrd_refused_total{reason=\"rate\"} 3",
            "msrd_bytes_total{direction=\"up\"} 65",
            "msrd_bytes_total{direction=\"down\"} 600",
            "msrd_handoffs_total{direction=\"in\"} 2",
            "msrd_handoff_duration_seconds_bucket{role=\"new\",le=\"0.01\"} 0",
            "msrd_handoff_duration_seconds_bucket{role=\"new\",le=\"0.025\"} 1",
            "msrd_handoff_duration_seconds_bucket{role=\"new\",le=\"+Inf\"} 1",
            "msrd_handoff_duration_seconds_sum{role=\"new\"} 0.02",
            "msrd_handoff_duration_seconds_count{role=\"old\"} 0",
            "msrd_relay_pipes{state=\"pooled\"} 2",
            "msrd_relay_pipe_bytes 1048576",
        ] {
            assert!(t.lines().any(|l| l == line), "no {line:?} in\n{t}");
        }
        // Every sample belongs to a family declared once, right before it.
        let mut declared = std::collections::HashSet::new();
        let mut current = String::new();
        for l in t.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(declared.insert(name.clone()), "{name} declared twice");
                current = name;
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                let base = name
                    .strip_suffix("_bucket")
                    .or_else(|| name.strip_suffix("_sum"))
                    .or_else(|| name.strip_suffix("_count"))
                    .filter(|b| *b == current)
                    .unwrap_or(name);
                assert_eq!(base, current, "{l}");
            }
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn status_groups_connections_by_mh() {
        let live = vec![
            session(1, Kind::Connect, "10.2.0.100", false),
            session(2, Kind::AcceptWait, "10.2.0.101", false),
            session(3, Kind::Transparent, "10.2.0.100", true),
        ];
        let s = status_parts(
            "msr1",
            9,
            Stats::default(),
            live,
            vec![record(Role::New, Outcome::Moved, Phases::default())],
        );
        assert_eq!(s.active, 3);
        assert_eq!(s.mhs.len(), 2);
        assert_eq!(s.mhs[0].connections.len(), 2);
        assert_eq!(s.mhs[0].bytes_down, 400);
        assert_eq!(s.mhs[0].connections[1].state, "frozen");
        assert_eq!(s.mhs[1].connections[0].state, "waiting");
        let j = serde_json::to_string(&s).unwrap();
        assert!(j.contains(r#""state":"waiting""#), "{j}");
        assert!(j.contains(r#""handoff_id":7"#), "{j}");
    }
}
