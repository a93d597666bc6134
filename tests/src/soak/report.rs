//! The soak's report: what happened, what failed, and whether an injected fault
//! explains it.
//!
//! **Attribution.** Only a crash may break connections: the handoff protocol rolls back
//! when a channel is cut or a greeting is lost, and a flushed cell is a loss burst TCP
//! recovers from. So a failed transfer or an RST is *explained* only by an msrd SIGKILL
//! that *exposed* its connection:
//!
//! * the connection was alive at the kill (started before msrd was back, ended after
//!   the kill, 0.5 s slack either way), and
//! * the killed msrd held it (its address and port as the FH sees them were in the
//!   session list read just before the kill), or its MH was with the killed MSR: the
//!   MH's agent was attached to it (its last `attached`/`moved`/`move_failed` event
//!   before the kill), the soak had moved that MH out of or into its cell in the 3 s
//!   before the kill, or the agent's next events (12 s: a greeting's timeout and some)
//!   name it as the MSR the MH came from or was moving to.
//!
//! A byte that differs from the stream (corruption) and a clean end of stream before
//! the last byte (silent truncation) are never explained: msrd must reset, not end, a
//! stream it cannot finish. An RST is matched to its connection by the MH's address
//! and port (at the MH: its wireless-side port; at the FH: the address and port the
//! FH saw) and time; an RST of no known connection (a connect to a dead msrd, a
//! handshake cut short) is explained when it came between a kill of the MSR its MH was
//! with and 20 s after that msrd was back.
//!
//! One more class is not counted against msrd: an RST that answers a segment of no
//! socket (tcpdump flags `[R]`, no ACK) for a connection that had already completed
//! cleanly at both ends (every byte verified, both closes done) within the 5 s before.
//! The MSR is the passive closer there and keeps no TIME_WAIT, so a late duplicate ACK
//! (its FIN retransmitted by a tail-loss probe while the MH's ACK queued behind the
//! MH's own uploads) meets no socket: plain kernel TCP, no byte at stake. At the FH
//! the fixed flow's own clean end suffices (the FH's FIN, sent again while a handoff
//! held the first, ACKed twice). These are counted apart (`after_clean_close`). So is a reply RST the MH sends on the port of
//! a connect its application gave up while a fault or a move of that MH was under way
//! (`after_given_up_connect`): the MH's kernel answering for a socket the application
//! closed, the MSR still holding the half-done handshake (mh-lib names the port in its
//! error).
//!
//! Connects that fail put no byte at risk: they are listed with their reasons (and
//! whether a fault or a move was under way) but do not fail the soak.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;

use itcp_handoff::log::{Outcome, Record, Role};
use serde::Serialize;

use super::chaos::{Crossing, Fault, FaultKind, Style};
use super::state::{self, MsrState};
use super::traffic::{Class, FhConn, Kind, MhConn};
use super::{AgentEvent, Clock, Rst, SoakOpts};
use crate::lab::Host;

/// Everything the soak collected.
pub struct Input {
    pub opts: SoakOpts,
    pub clock: Clock,
    pub chaos_s: f64,
    pub mh_conns: Vec<MhConn>,
    pub fh_conns: Vec<FhConn>,
    pub crossings: Vec<Crossing>,
    pub faults: Vec<Fault>,
    pub agent: Vec<AgentEvent>,
    pub rsts: Vec<Rst>,
    /// FIN segments captured at the hosts (to name who ended a truncated stream).
    pub fins: Vec<Rst>,
    /// nftables counters per host: (received, sent).
    pub counted: Vec<(Host, (u64, u64))>,
    pub capture_notes: Vec<String>,
    pub records: Vec<Record>,
    pub start_state: Vec<MsrState>,
    pub end_state: Vec<MsrState>,
    pub restarts: Vec<usize>,
    pub errors: Vec<String>,
    pub lab_dir: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcomes {
    pub moved: usize,
    pub rolled_back: usize,
    pub partial: usize,
    pub rejected: usize,
}

impl Outcomes {
    fn add(&mut self, o: Outcome) {
        match o {
            Outcome::Moved => self.moved += 1,
            Outcome::RolledBack => self.rolled_back += 1,
            Outcome::Partial => self.partial += 1,
            Outcome::Rejected => self.rejected += 1,
            // The MH attached at the new MSR: its old msrd was down (killed).
            Outcome::OldDown => self.rolled_back += 1,
        }
    }
}

/// From every MSR's handoff log, and the agents' view.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Handoffs {
    /// Records written as the new MSR.
    pub new: Outcomes,
    /// Records written as the old MSR.
    pub old: Outcomes,
    /// Connections in the new MSRs' `moved` and `partial` records.
    pub connections_moved: usize,
    /// Connections the records list as failed to move (with reasons).
    pub connections_failed: usize,
    pub agent_moved: usize,
    pub agent_move_failed: usize,
    pub agent_refused: usize,
    pub agent_lost: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct KindRow {
    /// Connections that reached the FH's server.
    pub established: usize,
    pub completed: usize,
    pub failed: usize,
    pub explained: usize,
    pub bytes_verified: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Transfers {
    pub established: usize,
    pub completed: usize,
    pub failed: usize,
    pub explained: usize,
    pub unexplained: usize,
    pub corrupted: usize,
    pub by_kind: BTreeMap<String, KindRow>,
    /// `class: explanation` → count.
    pub reasons: BTreeMap<String, usize>,
    pub connect_failures: usize,
    /// … of which during a fault or a move of that MH.
    pub connect_failures_during_chaos: usize,
    pub connect_reasons: BTreeMap<String, usize>,
    /// FH connections whose header never arrived (their connect failed at the MH).
    pub fh_without_header: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Bytes {
    /// Verified at the MHs (FH → MH) and at the FH (MH → FH).
    pub verified: u64,
    pub at_mhs: u64,
    pub at_fh: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Rsts {
    /// nftables counters: RSTs received and sent, at the FH and at all MHs.
    pub fh_in: u64,
    pub fh_out: u64,
    pub mh_in: u64,
    pub mh_out: u64,
    /// RST packets captured (tcpdump) and how many an injected fault explains.
    pub captured: usize,
    pub explained: usize,
    /// RSTs after a clean close at both ends: the kernel answering a late duplicate
    /// ACK (or FIN) for a connection whose socket is gone. No byte at stake.
    pub after_clean_close: usize,
    /// Reply RSTs from an MH on the port of a connect it gave up during a fault or a
    /// move of that MH (the MSR still had the handshake).
    pub after_given_up_connect: usize,
    pub unexplained: usize,
    /// Explanations → count.
    pub by_reason: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MsrReport {
    pub msr: usize,
    pub restarts: usize,
    pub start: MsrState,
    pub end: MsrState,
    pub growth: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Moves {
    pub total: usize,
    pub overlap: usize,
    pub gap: usize,
    pub switch: usize,
}

/// The soak's report: [`SoakReport::render`] for people, `serde_json` for programs.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub bench: &'static str,
    /// No corruption, no unexplained failure or RST, no growth, no error of the soak.
    pub ok: bool,
    pub problems: Vec<String>,
    pub seed: u64,
    pub mhs: usize,
    pub msrs: usize,
    pub seconds: f64,
    pub chaos_s: f64,
    /// Whether moves and faults were on (`--moves`, `--faults`).
    pub moving: bool,
    pub faulting: bool,
    pub moves: Moves,
    pub faults: BTreeMap<String, usize>,
    pub handoffs: Handoffs,
    pub transfers: Transfers,
    pub bytes: Bytes,
    pub rsts: Rsts,
    pub msrd: Vec<MsrReport>,
    pub lab_dir: String,
    /// Up to 20 unexplained failures and RSTs, in words (also in `problems`' counts).
    pub unexplained: Vec<String>,
    /// Faults as injected (time, kind, MSR), for reproduction.
    pub fault_log: Vec<String>,
}

fn msr_num(s: &str) -> Option<usize> {
    s.strip_prefix("msr")?.parse().ok()
}

fn ev_msr(e: &AgentEvent, key: &str) -> Option<usize> {
    e.event.get(key).and_then(|v| v.as_str()).and_then(msr_num)
}

fn ev_name(e: &AgentEvent) -> &str {
    e.event.get("event").and_then(|v| v.as_str()).unwrap_or("")
}

/// What attribution looks at.
struct Ctx<'a> {
    kills: Vec<&'a Fault>,
    faults: &'a [Fault],
    crossings: &'a [Crossing],
    /// Agent events per MH (index j), in time order.
    agent: Vec<Vec<&'a AgentEvent>>,
}

impl<'a> Ctx<'a> {
    /// The MSR MH `j`'s agent was with at `t`.
    fn current(&self, j: usize, t: f64) -> Option<usize> {
        let mut cur = None;
        for e in self.agent.get(j).into_iter().flatten() {
            if e.t > t {
                break;
            }
            match ev_name(e) {
                "attached" | "regained" => cur = ev_msr(e, "msr").or(cur),
                "moved" => cur = ev_msr(e, "to").or(cur),
                "move_failed" => cur = ev_msr(e, "from").or(cur),
                _ => {}
            }
        }
        cur
    }

    /// Why MH `j` counts as being with MSR `k` when it was killed at `t`, if it does.
    fn involved(&self, j: usize, k: usize, t: f64) -> Option<&'static str> {
        if self.current(j, t) == Some(k) {
            return Some("its MH was attached there");
        }
        if self
            .crossings
            .iter()
            .any(|c| c.mh == j && (c.from == k || c.to == k) && c.start >= t - 3.0 && c.start <= t)
        {
            return Some("its MH was moving from or to it");
        }
        for e in self.agent.get(j).into_iter().flatten() {
            if e.t < t || e.t > t + 12.0 {
                continue;
            }
            let from = ev_msr(e, "from") == Some(k);
            let to = ev_msr(e, "to") == Some(k);
            let began = e.t
                - e.event
                    .get("moved_ms")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0)
                    / 1000.0;
            match ev_name(e) {
                "lost" | "move_failed" | "moved" if from => {
                    return Some("its MH's agent came from it")
                }
                "move_failed" if to => return Some("its MH's agent was moving to it"),
                "moved" if to && began - 0.3 <= t => {
                    return Some("its MH's agent was moving to it")
                }
                _ => {}
            }
        }
        None
    }

    /// The kill that explains a failure or an RST of connection `c` (FH side `fh`).
    fn exposure(&self, c: &MhConn, fh: Option<&FhConn>, not_before: f64) -> Option<String> {
        for k in &self.kills {
            if k.start < not_before - 0.5 {
                continue;
            }
            let alive = c.started <= k.end + 0.5 && c.ended >= k.start - 0.5;
            if !alive {
                continue;
            }
            let held = fh.is_some_and(|f| k.held.contains(&f.peer));
            let why = if held {
                Some("it held the connection")
            } else {
                self.involved(c.mh, k.msr, k.start)
            };
            if let Some(why) = why {
                return Some(format!(
                    "msrd{} SIGKILLed at {:.1} s ({why})",
                    k.msr, k.start
                ));
            }
        }
        None
    }

    /// An RST of no known connection of MH `j` at `t`; `mh_side` is the MH's address
    /// and port in it.
    fn orphan_rst(&self, j: usize, mh_side: SocketAddr, t: f64) -> Option<String> {
        for k in &self.kills {
            if t >= k.start - 0.5 && k.held.contains(&mh_side) {
                return Some(format!(
                    "msrd{} SIGKILLed at {:.1} s (it held the connection)",
                    k.msr, k.start
                ));
            }
        }
        for k in &self.kills {
            if t < k.start - 0.5 || t > k.end + 20.0 {
                continue;
            }
            if let Some(why) = self.involved(j, k.msr, k.start) {
                return Some(format!(
                    "msrd{} SIGKILLed at {:.1} s ({why}; no connection of record)",
                    k.msr, k.start
                ));
            }
        }
        None
    }

    /// For an RST at `t` on MH `j`'s `port` with no live connection: a late segment of
    /// a connection that had ended cleanly. Its closed-flow record goes from MSR to MSR
    /// with the MH for `closed_window_s`, in msrd's memory; a kill of an MSR the MH was
    /// with meanwhile lost it, and the next MSR forwarded the segment.
    fn closed_flow_lost(&self, conns: &[MhConn], j: usize, port: u16, t: f64) -> Option<String> {
        let c = conns
            .iter()
            .filter(|c| {
                c.mh == j
                    && c.fail.is_none()
                    && c.local_port == Some(port)
                    && c.ended <= t
                    && t - c.ended <= CLOSED_WINDOW_S
            })
            .max_by(|a, b| a.ended.total_cmp(&b.ended))?;
        self.kills.iter().find_map(|k| {
            (k.start >= c.ended - 0.5 && k.start <= t && self.involved(j, k.msr, k.start).is_some())
                .then(|| {
                    format!(
                        "msrd{} SIGKILLed at {:.1} s with the closed flow of connection {} (ended {:.1} s)",
                        k.msr, k.start, c.id, c.ended
                    )
                })
        })
    }

    /// MH `j`'s last move that started before `t`, in words.
    fn last_move(&self, j: usize, t: f64) -> String {
        self.crossings
            .iter()
            .rfind(|c| c.mh == j && c.start <= t)
            .map_or(String::new(), |c| {
                format!(
                    "; its last move: cell {} → {} at {:.2}–{:.2} s",
                    c.from, c.to, c.start, c.end
                )
            })
    }

    /// Whether a fault touching MH `j` or a move of `j` overlapped [a, b].
    fn chaos_during(&self, j: usize, a: f64, b: f64) -> bool {
        let moving = self
            .crossings
            .iter()
            .any(|c| c.mh == j && c.start <= b && c.end + 3.0 >= a);
        moving
            || self.faults.iter().any(|f| {
                f.start - 1.0 <= b
                    && f.end + 5.0 >= a
                    && (f.mh == Some(j)
                        || self.current(j, a) == Some(f.msr)
                        || (f.kind.is_kill() && self.involved(j, f.msr, f.start).is_some()))
            })
    }
}

/// A reply RST (no ACK flag: "segment of no socket") to a flow that had completed
/// cleanly within the 5 s before: all its bytes delivered and acknowledged; the
/// passive closer keeps no TIME_WAIT, so a late duplicate ACK or FIN is answered with
/// RST — plain kernel TCP. On the MH's side both ends must have completed. At the FH
/// the fixed flow's own end suffices, the MH's wireless side may still be finishing:
/// the FH's FIN, sent again while a handoff held the first, was ACKed twice by the
/// restored socket, and the first ACK had closed the FH's socket.
fn after_clean_close(p: &Rst, c: &MhConn, fh: Option<&FhConn>) -> bool {
    let Some(f) = fh else {
        return false;
    };
    if p.flags != "R" || c.fail.is_some() || f.fail.is_some() || f.ended > p.t + 0.01 {
        return false;
    }
    if p.host == "fh" && p.sent {
        return p.t <= f.ended + 5.0;
    }
    c.ended <= p.t + 0.01 && p.t <= c.ended.max(f.ended) + 5.0
}

/// MSR k's cell MAC is 02:00:00:00:0k:01 (see `lab::addr::msr_cell_mac`).
fn msr_of_mac(mac: &str) -> Option<usize> {
    let p: Vec<&str> = mac.split(':').collect();
    (p.len() == 6 && p[..4] == ["02", "00", "00", "00"] && p[5] == "01")
        .then(|| usize::from_str_radix(p[4], 16).ok())
        .flatten()
        .filter(|&k| k > 0)
}

/// The FINs of connection `c` captured at its MH (the wireless flow) and at the FH
/// (the fixed flow): which MSR's cell brought the MH its end of stream, and whether
/// the FH had closed. Empty when none was captured.
fn fins_of(fins: &[Rst], c: &MhConn, fh: Option<&FhConn>) -> String {
    let mh = format!("mh{}", c.mh);
    let mut v: Vec<String> = fins
        .iter()
        .filter(|f| f.t >= c.started - 0.01 && f.t <= c.ended + 1.0)
        .filter(|f| {
            (f.host == mh
                && c.local_port
                    .is_some_and(|p| (if f.sent { f.src.port() } else { f.dst.port() }) == p))
                || (f.host == "fh"
                    && fh.is_some_and(|x| {
                        SocketAddr::from(if f.sent { f.dst } else { f.src }) == x.peer
                    }))
        })
        .map(|f| {
            format!(
                "{:.2} s {} {} {}{}",
                f.t,
                f.host,
                if f.sent { "sent" } else { "got" },
                f.flags,
                from_cell(f)
            )
        })
        .collect();
    if v.is_empty() {
        return String::new();
    }
    v.truncate(8);
    format!("; FINs: {}", v.join(", "))
}

/// msrd's `[handoff] closed_window_s` in the soak (the default).
const CLOSED_WINDOW_S: f64 = 60.0;

/// " from MSRk's cell" for a segment an MH received, by the MAC that brought it.
fn from_cell(p: &Rst) -> String {
    match msr_of_mac(&p.src_mac) {
        Some(k) if !p.sent && p.host != "fh" => format!(" from MSR{k}'s cell"),
        _ => String::new(),
    }
}

/// A short description of what an unexplained RST looks like.
fn rst_pattern(p: &Rst, conn: Option<&MhConn>) -> &'static str {
    let to_fh = p.dst.ip() == &crate::lab::addr::FH || p.src.ip() == &crate::lab::addr::FH;
    match (p.host == "fh", p.sent, to_fh, conn) {
        (true, false, _, _) => "the FH got an RST from the MH's address",
        (true, true, _, _) => "the FH reset a segment from the MH's address",
        (false, true, true, _) => "an FH segment reached the MH, which reset it",
        (false, true, false, _) => "the MH reset a segment from the gateway",
        (false, false, _, Some(c)) if c.fail.is_none() && p.t >= c.ended - 0.05 => {
            "after its connection had completed cleanly"
        }
        (false, false, _, Some(_)) => "the gateway reset a connection in use",
        (false, false, _, None) => "the gateway reset a connection of no record (being set up?)",
    }
}

fn severity(c: Class) -> u8 {
    match c {
        Class::Corrupt => 0,
        Class::Truncated => 1,
        _ => 2,
    }
}

/// Builds the report from what the soak collected.
pub fn build(i: Input) -> SoakReport {
    let o = &i.opts;
    let mut agent: Vec<Vec<&AgentEvent>> = vec![Vec::new(); o.mhs + 1];
    for e in &i.agent {
        if let Some(v) = agent.get_mut(e.mh) {
            v.push(e);
        }
    }
    for v in &mut agent {
        v.sort_by(|a, b| a.t.total_cmp(&b.t));
    }
    let ctx = Ctx {
        kills: i.faults.iter().filter(|f| f.kind.is_kill()).collect(),
        faults: &i.faults,
        crossings: &i.crossings,
        agent,
    };
    let fh_by_id: HashMap<u64, &FhConn> = i
        .fh_conns
        .iter()
        .filter(|f| f.id != 0)
        .map(|f| (f.id, f))
        .collect();
    let mut problems: Vec<String> = i.errors.iter().map(|e| format!("soak: {e}")).collect();
    let mut unexplained = Vec::new();

    // Transfers.
    let mut t = Transfers::default();
    for k in Kind::ALL {
        t.by_kind.insert(k.name().into(), KindRow::default());
    }
    let mut bytes = Bytes::default();
    for f in &i.fh_conns {
        bytes.at_fh += f.verified;
        if f.id == 0 {
            t.fh_without_header += 1;
        }
    }
    for c in &i.mh_conns {
        bytes.at_mhs += c.verified;
        let fh = fh_by_id.get(&c.id).copied();
        let row = t.by_kind.get_mut(c.kind.name()).unwrap();
        row.bytes_verified += c.verified + fh.map_or(0, |f| f.verified);
        if c.fail.as_ref().is_some_and(|f| f.class == Class::Connect) {
            t.connect_failures += 1;
            let what = c.fail.as_ref().unwrap().what.clone();
            // Keep reasons short: the error text without addresses and numbers.
            let key: String = what
                .split(|ch: char| ch.is_ascii_digit())
                .next()
                .unwrap_or("")
                .trim_end_matches([' ', ':', '.'])
                .to_string();
            *t.connect_reasons.entry(key).or_default() += 1;
            if ctx.chaos_during(c.mh, c.started, c.ended) {
                t.connect_failures_during_chaos += 1;
            }
            continue;
        }
        t.established += 1;
        row.established += 1;
        let mut fails = Vec::new();
        if let Some(f) = &c.fail {
            fails.push(("MH", f.clone()));
        }
        match fh {
            Some(f) => {
                if let Some(x) = &f.fail {
                    fails.push(("FH", x.clone()));
                }
            }
            None => fails.push((
                "FH",
                super::traffic::Fail {
                    class: if c.fail.is_some() {
                        Class::Reset
                    } else {
                        Class::Truncated
                    },
                    what: "the FH has no record of this connection".into(),
                },
            )),
        }
        if fails.is_empty() {
            t.completed += 1;
            row.completed += 1;
            continue;
        }
        t.failed += 1;
        row.failed += 1;
        fails.sort_by_key(|(_, f)| severity(f.class));
        let (side, worst) = &fails[0];
        if worst.class == Class::Corrupt {
            t.corrupted += 1;
        }
        let why = match worst.class {
            Class::Corrupt | Class::Truncated => None,
            _ => ctx.exposure(c, fh, f64::NEG_INFINITY),
        };
        let key = format!(
            "{}: {}",
            worst.class.name(),
            why.as_deref()
                .map(|w| {
                    if w.contains("held") {
                        "msrd killed while holding it"
                    } else {
                        "msrd killed while its MH was there"
                    }
                })
                .unwrap_or("UNEXPLAINED")
        );
        *t.reasons.entry(key).or_default() += 1;
        match why {
            Some(_) => {
                t.explained += 1;
                row.explained += 1;
            }
            None => {
                t.unexplained += 1;
                if unexplained.len() < 20 {
                    unexplained.push(format!(
                        "connection {} of MH {} ({}, MH port {}, FH saw {}): {} side {} at {:.2} s: {}; started {:.2} s, {} bytes verified at the MH, {} at the FH{}",
                        c.id,
                        c.mh,
                        c.kind.name(),
                        c.local_port.map_or("-".into(), |p| p.to_string()),
                        fh.map_or("-".into(), |f| f.peer.to_string()),
                        side,
                        worst.class.name(),
                        c.ended,
                        worst.what,
                        c.started,
                        c.verified,
                        fh.map_or(0, |f| f.verified),
                        ctx.last_move(c.mh, c.ended)
                    ) + &fins_of(&i.fins, c, fh));
                }
            }
        }
    }
    bytes.verified = bytes.at_mhs + bytes.at_fh;

    // RSTs.
    let mut r = Rsts::default();
    for (h, (rin, rout)) in &i.counted {
        if *h == Host::Fh {
            r.fh_in += rin;
            r.fh_out += rout;
        } else {
            r.mh_in += rin;
            r.mh_out += rout;
        }
    }
    r.captured = i.rsts.len();
    let mh_of = |ip: &std::net::Ipv4Addr| -> Option<usize> {
        let o = ip.octets();
        (o[0] == 10 && o[1] == 2 && o[2] == 0 && o[3] >= 100).then(|| o[3] as usize - 99)
    };
    let near = |a: f64, b: f64, t: f64| t >= a - 1.0 && t <= b + 10.0;
    let mut rst_unexplained = Vec::new();
    for p in &i.rsts {
        let mh_side = if mh_of(p.src.ip()).is_some() {
            p.src
        } else {
            p.dst
        };
        let Some(j) = mh_of(mh_side.ip()) else {
            rst_unexplained.push(format!(
                "RST {} → {} at {:.2} s at {}: no MH address",
                p.src, p.dst, p.t, p.host
            ));
            continue;
        };
        let mut fh_orphan: Option<&FhConn> = None;
        let conn: Option<(&MhConn, Option<&FhConn>)> = if p.host == "fh" {
            let peer = SocketAddr::from(mh_side);
            let mut found = None;
            for f in i
                .fh_conns
                .iter()
                .filter(|f| f.peer == peer && near(f.accepted, f.ended, p.t))
            {
                match i.mh_conns.iter().find(|c| f.id != 0 && c.id == f.id) {
                    Some(c) => {
                        found = Some((c, Some(f)));
                        break;
                    }
                    None => fh_orphan = Some(f),
                }
            }
            found
        } else {
            i.mh_conns
                .iter()
                .filter(|c| {
                    c.mh == j
                        && c.local_port == Some(mh_side.port())
                        && near(c.started, c.ended, p.t)
                })
                .min_by(|a, b| (a.started - p.t).abs().total_cmp(&(b.started - p.t).abs()))
                .map(|c| (c, fh_by_id.get(&c.id).copied()))
        };
        if conn.is_some_and(|(c, fh)| after_clean_close(p, c, fh)) {
            r.after_clean_close += 1;
            continue;
        }
        let given_up = conn.is_some_and(|(c, _)| {
            p.host != "fh"
                && p.sent
                && p.flags == "R"
                && c.fail.as_ref().is_some_and(|f| f.class == Class::Connect)
                && c.ended <= p.t + 0.01
                && ctx.chaos_during(c.mh, c.started, c.ended)
        });
        if given_up {
            r.after_given_up_connect += 1;
            continue;
        }
        let why = match conn {
            Some((c, fh)) => ctx
                .exposure(c, fh, p.t - 30.0)
                // Also when its connection is of record (ended within the last 10 s).
                .or_else(|| ctx.closed_flow_lost(&i.mh_conns, j, mh_side.port(), p.t))
                .map(|w| (w, Some(c.id))),
            None => ctx
                .orphan_rst(j, SocketAddr::from(mh_side), p.t)
                .or_else(|| {
                    // A fixed-side connection whose header never came: its MH's
                    // connect failed; a kill that held it or its MH explains it.
                    let f = fh_orphan?;
                    ctx.kills.iter().find_map(|k| {
                        let alive = f.accepted <= k.end + 0.5 && f.ended >= k.start - 0.5;
                        (alive
                            && (k.held.contains(&f.peer)
                                || ctx.involved(j, k.msr, k.start).is_some()))
                        .then(|| {
                            format!(
                                "msrd{} SIGKILLed at {:.1} s (no connection of record)",
                                k.msr, k.start
                            )
                        })
                    })
                })
                .or_else(|| ctx.closed_flow_lost(&i.mh_conns, j, mh_side.port(), p.t))
                .map(|w| (w, None)),
        };
        match why {
            Some((w, _)) => {
                r.explained += 1;
                let key = if w.contains("with the closed flow") {
                    "msrd killed with the MH's closed flows"
                } else if w.contains("no connection of record") {
                    "msrd killed (connection being set up)"
                } else if w.contains("held") {
                    "msrd killed while holding the connection"
                } else {
                    "msrd killed while the MH was there"
                };
                *r.by_reason.entry(key.into()).or_default() += 1;
            }
            None => {
                r.unexplained += 1;
                let pattern = rst_pattern(p, conn.map(|(c, _)| c));
                *r.by_reason
                    .entry(format!("UNEXPLAINED: {pattern}"))
                    .or_default() += 1;
                rst_unexplained.push(format!(
                    "RST {} → {} {} {}{} at {:.2} s [{pattern}] ({}){}",
                    p.src,
                    p.dst,
                    if p.sent { "sent by" } else { "received by" },
                    p.host,
                    from_cell(p),
                    p.t,
                    match conn {
                        Some((c, _)) => format!(
                            "connection {} ({}, {:.1}–{:.1} s, {})",
                            c.id,
                            c.kind.name(),
                            c.started,
                            c.ended,
                            c.fail
                                .as_ref()
                                .map_or("completed".to_string(), |f| f.what.clone())
                        ),
                        None => "no connection of record".into(),
                    },
                    match ctx.current(j, p.t) {
                        Some(k) => format!("; MH {j}'s agent with msr{k}"),
                        None => String::new(),
                    } + &ctx.last_move(j, p.t)
                ));
            }
        }
    }
    for u in rst_unexplained.into_iter() {
        if unexplained.len() < 20 {
            unexplained.push(u);
        }
    }
    let counted_total = r.fh_in + r.fh_out + r.mh_in + r.mh_out;
    if counted_total as usize > r.captured {
        problems.push(format!(
            "{} RSTs counted by nftables but {} captured: {} cannot be attributed{}",
            counted_total,
            r.captured,
            counted_total as usize - r.captured,
            if i.capture_notes.is_empty() {
                String::new()
            } else {
                format!(" (tcpdump: {})", i.capture_notes.join("; "))
            }
        ));
    }

    // Handoffs.
    let mut h = Handoffs::default();
    for rec in &i.records {
        match rec.role {
            Role::New => {
                h.new.add(rec.outcome);
                if matches!(rec.outcome, Outcome::Moved | Outcome::Partial) {
                    h.connections_moved += rec.connections.len();
                }
                h.connections_failed += rec.failed.len();
            }
            Role::Old => h.old.add(rec.outcome),
        }
    }
    for e in &i.agent {
        match ev_name(e) {
            "moved" => h.agent_moved += 1,
            "move_failed" => h.agent_move_failed += 1,
            "refused" => h.agent_refused += 1,
            "lost" => h.agent_lost += 1,
            _ => {}
        }
    }

    // msrd state.
    let mut msrd = Vec::new();
    for k in 0..o.msrs {
        let (s, e) = (&i.start_state[k], &i.end_state[k]);
        let mut g = state::growth(s, e, o.mhs, o.msrs);
        // An MH answered for by two MSRs at once would split its traffic.
        for a in &e.proxy {
            let others: Vec<usize> = (0..o.msrs)
                .filter(|&m| m != k && i.end_state[m].proxy.contains(a))
                .map(|m| m + 1)
                .collect();
            if !others.is_empty() && others.iter().all(|&m| m > k + 1) {
                g.push(format!(
                    "{a} has proxy entries at MSR{} and MSR{others:?}",
                    k + 1
                ));
            }
        }
        for x in &g {
            problems.push(format!("MSR{}: {x}", k + 1));
        }
        msrd.push(MsrReport {
            msr: k + 1,
            restarts: i.restarts.get(k).copied().unwrap_or(0),
            start: s.clone(),
            end: e.clone(),
            growth: g,
        });
    }

    let mut moves = Moves {
        total: i.crossings.len(),
        ..Default::default()
    };
    for c in &i.crossings {
        match c.style {
            Style::Overlap => moves.overlap += 1,
            Style::Gap => moves.gap += 1,
            Style::Switch => moves.switch += 1,
        }
    }
    let mut faults = BTreeMap::new();
    for k in FaultKind::ALL {
        faults.insert(k.name().to_string(), 0usize);
    }
    for f in &i.faults {
        *faults.get_mut(f.kind.name()).unwrap() += 1;
    }
    let fault_log = i
        .faults
        .iter()
        .map(|f| {
            format!(
                "{:7.2}–{:7.2} s {:<13} MSR{}{}{}{}",
                f.start,
                f.end,
                f.kind.name(),
                f.msr,
                f.mh.map_or(String::new(), |j| format!(" at MH {j}'s crossing")),
                if f.kind.is_kill() {
                    format!(" (held {} connections)", f.held.len())
                } else {
                    String::new()
                },
                if f.note.is_empty() {
                    String::new()
                } else {
                    format!(": {}", f.note)
                }
            )
        })
        .collect();
    for f in i
        .faults
        .iter()
        .filter(|f| f.note.contains("restart failed"))
    {
        problems.push(format!(
            "MSR{}: msrd did not start again after its SIGKILL at {:.1} s: {}",
            f.msr, f.start, f.note
        ));
    }

    if t.corrupted > 0 {
        problems.push(format!("{} transfers corrupted", t.corrupted));
    }
    if t.unexplained > 0 {
        problems.push(format!(
            "{} transfers failed with no injected fault to explain it (bytes lost)",
            t.unexplained
        ));
    }
    if r.unexplained > 0 {
        problems.push(format!("{} RSTs no injected fault explains", r.unexplained));
    }
    if t.completed == 0 {
        problems.push("no transfer completed".into());
    }
    if moves.total > 0 && h.new.moved == 0 {
        problems.push("no handoff moved any connection".into());
    }
    SoakReport {
        bench: "soak",
        ok: problems.is_empty(),
        problems,
        seed: o.seed,
        mhs: o.mhs,
        msrs: o.msrs,
        seconds: o.seconds,
        chaos_s: i.chaos_s,
        moving: o.moves,
        faulting: o.faults,
        moves,
        faults,
        handoffs: h,
        transfers: t,
        bytes,
        rsts: r,
        msrd,
        lab_dir: i.lab_dir,
        unexplained,
        fault_log,
    }
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

impl SoakReport {
    /// The report as text tables.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Chaos soak: {} MHs, {} MSRs, seed {}, {:.0} s of chaos ({:.0} s asked){}{}",
            self.mhs,
            self.msrs,
            self.seed,
            self.chaos_s,
            self.seconds,
            if self.moving { "" } else { "; moves OFF" },
            if self.faulting { "" } else { "; faults OFF" }
        );
        let m = &self.moves;
        let _ = writeln!(
            s,
            "Moves: {} (overlapped {}, through a blackout {}, at once {})",
            m.total, m.overlap, m.gap, m.switch
        );
        let f: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(s, "Faults injected: {}", f.join(", "));
        let h = &self.handoffs;
        let _ = writeln!(
            s,
            "\nHandoffs (the MSRs' handoff logs)   as new MSR   as old MSR"
        );
        for (name, a, b) in [
            ("done (moved)", h.new.moved, h.old.moved),
            ("rolled back", h.new.rolled_back, h.old.rolled_back),
            ("failed in part (partial)", h.new.partial, h.old.partial),
            ("rejected", h.new.rejected, h.old.rejected),
        ] {
            let _ = writeln!(s, "  {name:<32} {a:>11}  {b:>11}");
        }
        let _ = writeln!(
            s,
            "  connections moved {}, failed to move {}; agents: moved {}, move failed {}, refused {}, lost {}",
            h.connections_moved,
            h.connections_failed,
            h.agent_moved,
            h.agent_move_failed,
            h.agent_refused,
            h.agent_lost
        );
        let t = &self.transfers;
        let _ = writeln!(
            s,
            "\nTransfers      established  completed  failed  explained  unexplained  bytes verified"
        );
        for (k, r) in &t.by_kind {
            let _ = writeln!(
                s,
                "  {k:<12} {:>11}  {:>9}  {:>6}  {:>9}  {:>11}  {:>14}",
                r.established,
                r.completed,
                r.failed,
                r.explained,
                r.failed - r.explained,
                mb(r.bytes_verified)
            );
        }
        let _ = writeln!(
            s,
            "  {:<12} {:>11}  {:>9}  {:>6}  {:>9}  {:>11}  {:>14}",
            "total",
            t.established,
            t.completed,
            t.failed,
            t.explained,
            t.unexplained,
            mb(self.bytes.verified)
        );
        if !t.reasons.is_empty() {
            let v: Vec<String> = t.reasons.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            let _ = writeln!(s, "  failures: {}", v.join("; "));
        }
        let _ = writeln!(
            s,
            "  bytes verified: {} at the MHs (FH → MH), {} at the FH (MH → FH); corrupted transfers: {}",
            mb(self.bytes.at_mhs),
            mb(self.bytes.at_fh),
            t.corrupted
        );
        let v: Vec<String> = t
            .connect_reasons
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        let _ = writeln!(
            s,
            "  connects that failed (no bytes at stake): {} ({} during a fault or a move of that MH){}{}",
            t.connect_failures,
            t.connect_failures_during_chaos,
            if v.is_empty() { "" } else { ": " },
            v.join("; ")
        );
        let r = &self.rsts;
        let _ = writeln!(s, "\nRSTs           received  sent");
        let _ = writeln!(s, "  at the FH    {:>8}  {:>4}", r.fh_in, r.fh_out);
        let _ = writeln!(s, "  at the MHs   {:>8}  {:>4}", r.mh_in, r.mh_out);
        let v: Vec<String> = r
            .by_reason
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        let _ = writeln!(
            s,
            "  captured {}: explained by a fault {}, after a clean close at both ends {}, after a connect the MH gave up {}, unexplained {}{}{}",
            r.captured,
            r.explained,
            r.after_clean_close,
            r.after_given_up_connect,
            r.unexplained,
            if v.is_empty() { "" } else { " — " },
            v.join("; ")
        );
        let _ = writeln!(
            s,
            "\nmsrd, start → end   restarts  fds (sockets/pipes/other)        RSS MiB       sessions  nft elements  neighbours  proxy  routes   host routes  rules"
        );
        for m in &self.msrd {
            let (a, b) = (&m.start, &m.end);
            let _ = writeln!(
                s,
                "  MSR{}               {:>8}  {:>2}/{:>3}/{:>2} → {:>2}/{:>3}/{:>2}    {:>5.1} → {:>5.1}   {:>2} → {:<3}   {:>2} → {:<3}    {:>2} → {:<3}  {} → {}  {:>2} → {:<3}  {} → {}       {} → {}",
                m.msr,
                m.restarts,
                a.sockets,
                a.pipes,
                a.other_fds,
                b.sockets,
                b.pipes,
                b.other_fds,
                a.rss_kib as f64 / 1024.0,
                b.rss_kib as f64 / 1024.0,
                a.sessions.map_or("?".into(), |n| n.to_string()),
                b.sessions.map_or("?".into(), |n| n.to_string()),
                a.nft_elements,
                b.nft_elements,
                a.neigh,
                b.neigh,
                a.proxy.len(),
                b.proxy.len(),
                a.routes,
                b.routes,
                a.host_routes,
                b.host_routes,
                a.rules,
                b.rules
            );
        }
        for m in &self.msrd {
            for g in &m.growth {
                let _ = writeln!(s, "  MSR{} growth: {g}", m.msr);
            }
        }
        let _ = writeln!(s, "\nFaults:");
        for f in &self.fault_log {
            let _ = writeln!(s, "  {f}");
        }
        if !self.unexplained.is_empty() {
            let _ = writeln!(s, "\nUnexplained (first {}):", self.unexplained.len());
            for u in &self.unexplained {
                let _ = writeln!(s, "  {u}");
            }
        }
        let _ = writeln!(
            s,
            "\nLab files (kept with ITCP_LAB_KEEP=1): {}",
            self.lab_dir
        );
        if self.ok {
            let _ = writeln!(
                s,
                "Verdict: OK — no byte lost or corrupted, every RST explained, no growth"
            );
        } else {
            let _ = writeln!(s, "Verdict: FAIL");
            for p in &self.problems {
                let _ = writeln!(s, "  - {p}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(t: f64, host: &str, src: &str, dst: &str, sent: bool, mac: &str) -> Rst {
        Rst {
            t,
            host: host.into(),
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            sent,
            src_mac: mac.into(),
            flags: "F.".into(),
        }
    }

    #[test]
    fn a_kill_explains_a_late_segment_of_a_closed_flow_it_held() {
        use super::super::chaos::{FaultKind, Style};
        let ended = |port, ended| MhConn {
            id: port as u64,
            mh: 8,
            kind: Kind::Short,
            local_port: Some(port),
            started: ended - 1.0,
            connected: Some(ended - 0.9),
            ended,
            verified: 10,
            sent: 10,
            fail: None,
        };
        let conns = [ended(41472, 435.0), ended(41000, 300.0)];
        // MH 8 entered cell 3 at 443 s; MSR3 was killed at 446 s.
        let crossings = [Crossing {
            mh: 8,
            from: 1,
            to: 3,
            style: Style::Switch,
            start: 443.0,
            enters: 443.0,
            end: 443.2,
        }];
        let kill = Fault {
            kind: FaultKind::KillNew,
            msr: 3,
            start: 446.0,
            end: 449.3,
            mh: Some(4),
            held: Vec::new(),
            note: String::new(),
        };
        let faults = [kill.clone()];
        let ctx = Ctx {
            kills: faults.iter().collect(),
            faults: &faults,
            crossings: &crossings,
            agent: vec![Vec::new(); 9],
        };
        let why = ctx.closed_flow_lost(&conns, 8, 41472, 491.1);
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("msrd3 SIGKILLed")),
            "{why:?}"
        );
        // Past the window, before the kill, another MH, a connection that failed.
        assert_eq!(ctx.closed_flow_lost(&conns, 8, 41472, 491.1 + 60.0), None);
        assert_eq!(ctx.closed_flow_lost(&conns, 8, 41000, 350.0), None);
        assert_eq!(ctx.closed_flow_lost(&conns, 7, 41472, 491.1), None);
        let mut failed = conns.clone();
        failed[0].fail = Some(super::super::traffic::Fail {
            class: Class::Stalled,
            what: "x".into(),
        });
        assert_eq!(ctx.closed_flow_lost(&failed, 8, 41472, 491.1), None);
    }

    #[test]
    fn an_fh_reset_after_its_fixed_flow_ended_cleanly_is_no_fault() {
        // Seed 37: the FH closed at 313.69 s; its FIN, sent again during the handoff,
        // was ACKed twice; the second ACK drew its RST while the MH's side went on.
        let c = MhConn {
            id: 10621,
            mh: 7,
            kind: Kind::BulkUp,
            local_port: Some(56924),
            started: 312.1,
            connected: Some(312.15),
            ended: 320.3,
            verified: 0,
            sent: 1_049_001,
            fail: None,
        };
        let fh = FhConn {
            id: 10621,
            mh: 7,
            kind: Some(Kind::BulkUp),
            peer: "10.2.0.106:56924".parse().unwrap(),
            accepted: 312.15,
            ended: 313.69,
            verified: 1_049_001,
            sent: 0,
            fail: None,
        };
        let mut rst = seg(
            313.75,
            "fh",
            "10.0.0.1:7000",
            "10.2.0.106:56924",
            true,
            "aa:bb:cc:dd:ee:ff",
        );
        rst.flags = "R".into();
        assert!(after_clean_close(&rst, &c, Some(&fh)));
        // Not before the FH's end, not long after, not an abort, not at the MH while
        // its side is still open, not when a side failed.
        let mut early = rst.clone();
        early.t = 313.0;
        assert!(!after_clean_close(&early, &c, Some(&fh)));
        let mut late = rst.clone();
        late.t = 319.0;
        assert!(!after_clean_close(&late, &c, Some(&fh)));
        let mut abort = rst.clone();
        abort.flags = "R.".into();
        assert!(!after_clean_close(&abort, &c, Some(&fh)));
        let at_mh = Rst {
            host: "mh7".into(),
            src: rst.dst,
            dst: "10.2.0.1:1080".parse().unwrap(),
            ..rst.clone()
        };
        assert!(!after_clean_close(&at_mh, &c, Some(&fh)));
        let mut failed = fh.clone();
        failed.fail = Some(super::super::traffic::Fail {
            class: Class::Stalled,
            what: "x".into(),
        });
        assert!(!after_clean_close(&rst, &c, Some(&failed)));
        assert!(!after_clean_close(&rst, &c, None));
    }

    #[test]
    fn a_truncated_streams_fins_name_the_cell_that_brought_them() {
        let c = MhConn {
            id: 7,
            mh: 8,
            kind: Kind::Interactive,
            local_port: Some(41864),
            started: 400.0,
            connected: Some(400.1),
            ended: 443.3,
            verified: 0,
            sent: 0,
            fail: None,
        };
        let fh = FhConn {
            id: 7,
            mh: 8,
            kind: Some(Kind::Interactive),
            peer: "10.2.0.107:41864".parse().unwrap(),
            accepted: 400.1,
            ended: 470.0,
            verified: 0,
            sent: 0,
            fail: None,
        };
        let fins = [
            // Its end of stream, from MSR3's cell.
            seg(
                443.2,
                "mh8",
                "10.2.0.1:1080",
                "10.2.0.107:41864",
                false,
                "02:00:00:00:03:01",
            ),
            // Another connection's, another MH's, and one long before.
            seg(
                443.2,
                "mh8",
                "10.2.0.1:1080",
                "10.2.0.107:41000",
                false,
                "02:00:00:00:03:01",
            ),
            seg(
                443.2,
                "mh7",
                "10.2.0.1:1080",
                "10.2.0.106:41864",
                false,
                "02:00:00:00:03:01",
            ),
            seg(
                300.0,
                "mh8",
                "10.2.0.1:1080",
                "10.2.0.107:41864",
                false,
                "02:00:00:00:01:01",
            ),
            // The FH's own close of the fixed flow.
            seg(
                443.25,
                "fh",
                "10.0.0.1:7000",
                "10.2.0.107:41864",
                true,
                "aa:bb:cc:dd:ee:ff",
            ),
        ];
        let s = fins_of(&fins, &c, Some(&fh));
        assert_eq!(
            s, "; FINs: 443.20 s mh8 got F. from MSR3's cell, 443.25 s fh sent F.",
            "{s}"
        );
        assert_eq!(fins_of(&fins[1..4], &c, None), "");
    }
}
