//! What `itcpctl handoffs` shows: handoff records of one or several MSRs' logs merged
//! into one timeline, the old and the new MSR's record of the same handoff paired into
//! one [`Entry`], as a table for people or JSON lines for programs. No I/O here.
//!
//! **Pairing.** The new MSR picks the handoff id and sends it in its
//! `handoff_request`; the old MSR logs under the same id. Two records pair when they
//! have the same id and MH and opposite roles. The same record read twice (one log
//! given twice) counts once.
//!
//! **Phases.** An entry's timeline takes each phase from the MSR that performs it:
//! greeting (heard by the new MSR), freeze (old), images (received by the new MSR;
//! sent, in an old MSR's record alone), restored and resumed (new), acked (received by
//! the old MSR; sent, in a new MSR's record alone). Each step is the time from the
//! previous phase present to this one; the total, from the first phase to the last.
//! Steps across the two MSRs depend on their clocks agreeing (NTP): a negative step
//! means they do not.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use serde::Serialize;

use super::{time, Filter, Outcome, Record, Role};

/// The phases an entry's table row and JSON object show the steps to, in order.
pub const STEPS: [&str; 5] = ["freeze", "images", "restored", "resumed", "acked"];

/// One line of a log: a record, nothing (a blank line), or why it is not a record.
pub fn parse_line(text: &str) -> Result<Option<Record>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The records among numbered lines of the log `name`, and a warning naming the file
/// and line for each line that is not one.
pub fn parse_lines<'a>(
    name: &str,
    lines: impl IntoIterator<Item = (usize, &'a str)>,
) -> (Vec<Record>, Vec<String>) {
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    for (n, text) in lines {
        match parse_line(text) {
            Ok(Some(r)) => out.push(r),
            Ok(None) => {}
            Err(e) => bad.push(warning(name, n, &e)),
        }
    }
    (out, bad)
}

/// `FILE:LINE: skipped, not a handoff record: WHY`.
pub fn warning(name: &str, line: usize, why: &str) -> String {
    format!("{name}:{line}: skipped, not a handoff record: {why}")
}

/// One handoff: what the old MSR, the new MSR, or both logged of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub old: Option<Record>,
    pub new: Option<Record>,
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Moved => "moved",
        Outcome::RolledBack => "rolled_back",
        Outcome::Partial => "partial",
        Outcome::Rejected => "rejected",
        Outcome::OldDown => "old_down",
    }
}

/// Connections that were to move and did not (rolled back, or failed at the new MSR).
fn failed_count(r: &Record) -> usize {
    let mut ids: Vec<u64> = r.failed.iter().map(|(id, _)| *id).collect();
    if !r.went_over() {
        ids.extend(r.connections.iter().map(|c| c.id));
    }
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}

impl Entry {
    /// One record, alone.
    pub fn single(r: Record) -> Entry {
        match r.role {
            Role::Old => Entry {
                old: Some(r),
                new: None,
            },
            Role::New => Entry {
                old: None,
                new: Some(r),
            },
        }
    }

    fn get(&self, role: Role) -> &Option<Record> {
        match role {
            Role::Old => &self.old,
            Role::New => &self.new,
        }
    }

    fn slot(&mut self, role: Role) -> &mut Option<Record> {
        match role {
            Role::Old => &mut self.old,
            Role::New => &mut self.new,
        }
    }

    fn records(&self) -> impl Iterator<Item = &Record> {
        self.old.iter().chain(self.new.iter())
    }

    /// Either record (the new MSR's if both).
    fn any(&self) -> &Record {
        self.new
            .as_ref()
            .or(self.old.as_ref())
            .expect("an entry holds at least one record")
    }

    fn has(&self, r: &Record) -> bool {
        self.records().any(|x| x == r)
    }

    pub fn handoff_id(&self) -> u64 {
        self.any().handoff_id
    }

    pub fn mh(&self) -> IpAddr {
        self.any().mh
    }

    pub fn old_msr(&self) -> &str {
        &self.any().old_msr
    }

    pub fn new_msr(&self) -> &str {
        &self.any().new_msr
    }

    /// Which MSRs' records this entry holds: `old`, `new` or `both`.
    pub fn role(&self) -> &'static str {
        match (&self.old, &self.new) {
            (Some(_), Some(_)) => "both",
            (Some(_), None) => "old",
            _ => "new",
        }
    }

    /// When the handoff started: the earliest phase either MSR logged (µs).
    pub fn start_us(&self) -> u64 {
        self.records().map(Record::start_us).min().unwrap_or(0)
    }

    /// The phases greeting, freeze, images, restored, resumed, acked (µs), each from
    /// the MSR that performs it (module documentation).
    pub fn timeline(&self) -> [Option<u64>; 6] {
        let (o, n) = (
            self.old.as_ref().map(|r| &r.phases),
            self.new.as_ref().map(|r| &r.phases),
        );
        let acked = match o {
            Some(o) => o.acknowledged,
            None => n.and_then(|n| n.acknowledged),
        };
        let images = match n {
            Some(n) => n.images_sent,
            None => o.and_then(|o| o.images_sent),
        };
        [
            n.and_then(|n| n.greeting),
            o.and_then(|o| o.freeze),
            images,
            n.and_then(|n| n.restored),
            n.and_then(|n| n.resumed),
            acked,
        ]
    }

    /// The time to each phase of [`STEPS`] from the previous phase present (µs); `None`
    /// where the phase, or every phase before it, is missing.
    pub fn steps_us(&self) -> [Option<i64>; 5] {
        let t = self.timeline();
        let mut out = [None; 5];
        let mut prev = t[0];
        for (i, p) in t[1..].iter().enumerate() {
            if let Some(p) = *p {
                out[i] = prev.map(|q| p as i64 - q as i64);
                prev = Some(p);
            }
        }
        out
    }

    /// From the first phase of the timeline to the last (µs); with both records, end
    /// to end across the two MSRs.
    pub fn duration_us(&self) -> Option<i64> {
        let t: Vec<u64> = self.timeline().into_iter().flatten().collect();
        match (t.first(), t.last()) {
            (Some(a), Some(b)) if t.len() > 1 => Some(*b as i64 - *a as i64),
            _ => None,
        }
    }

    /// Every record says moved.
    pub fn ok(&self) -> bool {
        self.records().all(Record::ok)
    }

    /// `moved`, `rolled_back`, `partial` or `rejected`; `OLD/NEW` when the two MSRs
    /// logged different outcomes.
    pub fn outcome(&self) -> String {
        match (&self.old, &self.new) {
            (Some(o), Some(n)) if o.outcome != n.outcome => {
                format!("{}/{}", outcome_name(o.outcome), outcome_name(n.outcome))
            }
            _ => outcome_name(self.any().outcome).into(),
        }
    }

    /// Connections that moved (as the new MSR counts them, if its record is here).
    pub fn moved(&self) -> usize {
        self.any().moved_connections().count()
    }

    /// Connections that were to move and did not.
    pub fn failed(&self) -> usize {
        self.records().map(failed_count).max().unwrap_or(0)
    }

    /// Queued bytes carried by the connections that moved (as the old MSR captured
    /// them, if its record is here).
    pub fn bytes_moved(&self) -> u64 {
        self.old
            .as_ref()
            .unwrap_or_else(|| self.any())
            .moved_bytes()
    }

    /// Why it did not simply move (each MSR's reason, named, when both are here).
    pub fn reason(&self) -> Option<String> {
        match (
            self.old.as_ref().and_then(|r| r.reason.as_deref()),
            self.new.as_ref().and_then(|r| r.reason.as_deref()),
        ) {
            (None, None) => None,
            (Some(o), Some(n)) if o != n => Some(format!("old: {o}; new: {n}")),
            (Some(x), _) | (_, Some(x)) if self.role() != "both" => Some(x.into()),
            (Some(o), _) => Some(format!("old: {o}")),
            (_, Some(n)) => Some(format!("new: {n}")),
        }
    }

    /// True if `f` selects this handoff (MH, failed, started in the time window).
    pub fn selected(&self, f: &Filter) -> bool {
        f.selects(self.mh(), self.ok(), self.start_us())
    }
}

/// Records from any number of logs, in any order, as one timeline: the old and new
/// record of each handoff paired, entries ordered by their start.
pub fn merge(records: impl IntoIterator<Item = Record>) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    let mut by_key: HashMap<(u64, IpAddr), Vec<usize>> = HashMap::new();
    for r in records {
        let idx = by_key.entry((r.handoff_id, r.mh)).or_default();
        if idx.iter().any(|&i| out[i].has(&r)) {
            continue;
        }
        let role = r.role;
        match idx.iter().find(|&&i| out[i].get(role).is_none()) {
            Some(&i) => *out[i].slot(role) = Some(r),
            None => {
                idx.push(out.len());
                out.push(Entry::single(r));
            }
        }
    }
    out.sort_by_key(Entry::start_us);
    out
}

/// Pairs records as they arrive (`--follow`): a record waits up to `wait_us` for the
/// other MSR's record of the same handoff, then is shown alone.
#[derive(Debug, Default)]
pub struct Pairer {
    wait_us: u64,
    /// Arrival time and record, oldest first.
    pending: Vec<(u64, Record)>,
}

impl Pairer {
    /// With `wait_us` 0 (one log followed) every record is shown at once.
    pub fn new(wait_us: u64) -> Pairer {
        Pairer {
            wait_us,
            pending: Vec::new(),
        }
    }

    /// A record read at `now_us`: the entry to show now, if any.
    pub fn push(&mut self, r: Record, now_us: u64) -> Option<Entry> {
        if self.pending.iter().any(|(_, p)| *p == r) {
            return None;
        }
        let other = self
            .pending
            .iter()
            .position(|(_, p)| p.handoff_id == r.handoff_id && p.mh == r.mh && p.role != r.role);
        match other {
            Some(i) => {
                let (_, p) = self.pending.remove(i);
                let mut e = Entry::single(p);
                let role = r.role;
                *e.slot(role) = Some(r);
                Some(e)
            }
            None if self.wait_us == 0 => Some(Entry::single(r)),
            None => {
                self.pending.push((now_us, r));
                None
            }
        }
    }

    /// Records that waited `wait_us` without their pair, alone, in arrival order.
    pub fn expire(&mut self, now_us: u64) -> Vec<Entry> {
        let (gone, keep) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(t, _)| now_us.saturating_sub(*t) >= self.wait_us);
        self.pending = keep;
        gone.into_iter()
            .map(|(_, r)| Entry::single(r))
            .collect::<Vec<_>>()
    }

    /// Every record still waiting, alone (at the end).
    pub fn drain(&mut self) -> Vec<Entry> {
        self.expire(u64::MAX)
    }
}

/// The table's columns: header, minimum width, right-aligned.
const COLUMNS: [(&str, usize, bool); 16] = [
    ("time (UTC)", 24, false),
    ("mh", 10, false),
    ("role", 4, false),
    ("old → new", 11, false),
    ("outcome", 7, false),
    ("moved", 5, true),
    ("failed", 6, true),
    ("bytes", 9, true),
    ("→freeze", 7, true),
    ("→images", 7, true),
    ("→restored", 9, true),
    ("→resumed", 8, true),
    ("→acked", 6, true),
    ("total ms", 8, true),
    ("handoff", 16, true),
    ("reason", 0, false),
];

/// `512 B`, `64.0 KiB`, `7.1 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut x = n as f64 / 1024.0;
    let mut u = 0;
    while x >= 1024.0 && u < UNITS.len() - 1 {
        x /= 1024.0;
        u += 1;
    }
    format!("{x:.1} {}", UNITS[u])
}

fn ms(us: Option<i64>) -> String {
    us.map_or("-".into(), |us| format!("{:.1}", us as f64 / 1000.0))
}

/// The cells of an entry's table row.
pub fn cells(e: &Entry) -> Vec<String> {
    let mut c = vec![
        time::format_utc_ms(e.start_us()),
        e.mh().to_string(),
        e.role().into(),
        format!("{} → {}", e.old_msr(), e.new_msr()),
        e.outcome(),
        e.moved().to_string(),
        e.failed().to_string(),
        human_bytes(e.bytes_moved()),
    ];
    c.extend(e.steps_us().into_iter().map(ms));
    c.push(ms(e.duration_us()));
    c.push(e.handoff_id().to_string());
    c.push(e.reason().unwrap_or_default());
    c
}

fn line(cells: &[String], widths: &[usize]) -> String {
    let mut s = String::new();
    for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
        if i > 0 {
            s.push_str("  ");
        }
        let pad = w.saturating_sub(c.chars().count());
        if COLUMNS[i].2 {
            s.extend(std::iter::repeat_n(' ', pad));
            s.push_str(c);
        } else if i + 1 < cells.len() {
            s.push_str(c);
            s.extend(std::iter::repeat_n(' ', pad));
        } else {
            s.push_str(c);
        }
    }
    s.truncate(s.trim_end().len());
    s
}

fn header() -> Vec<String> {
    COLUMNS.iter().map(|c| c.0.to_string()).collect()
}

fn min_widths() -> Vec<usize> {
    COLUMNS
        .iter()
        .map(|(h, w, _)| (*w).max(h.chars().count()))
        .collect()
}

/// The table of these entries, columns as wide as their content.
pub fn render(entries: &[Entry]) -> String {
    let rows: Vec<Vec<String>> = entries.iter().map(cells).collect();
    let mut widths = min_widths();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut s = line(&header(), &widths);
    s.push('\n');
    for r in &rows {
        let _ = writeln!(s, "{}", line(r, &widths));
    }
    s
}

/// The header line of a table shown line by line (`--follow`), at the minimum widths.
pub fn header_line() -> String {
    line(&header(), &min_widths())
}

/// One row at the minimum widths (`--follow`: longer cells push the rest right).
pub fn row_line(e: &Entry) -> String {
    line(&cells(e), &min_widths())
}

/// The steps of an entry, as JSON fields.
#[derive(Debug, Serialize)]
struct Steps {
    #[serde(skip_serializing_if = "Option::is_none")]
    freeze: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    images: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restored: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resumed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    acked: Option<i64>,
}

/// What `--json` prints per handoff (stable field names; times in µs).
#[derive(Debug, Serialize)]
struct Json<'a> {
    time: String,
    start_us: u64,
    handoff_id: u64,
    mh: IpAddr,
    old_msr: &'a str,
    new_msr: &'a str,
    role: &'static str,
    outcome: String,
    moved: usize,
    failed: usize,
    bytes_moved: u64,
    steps_us: Steps,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_us: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// The records as the MSRs wrote them.
    #[serde(skip_serializing_if = "Option::is_none")]
    old: Option<&'a Record>,
    #[serde(skip_serializing_if = "Option::is_none")]
    new: Option<&'a Record>,
}

/// One JSON object (one line): the table's columns, with the records themselves.
pub fn json_line(e: &Entry) -> String {
    let [freeze, images, restored, resumed, acked] = e.steps_us();
    let j = Json {
        time: time::format_utc_ms(e.start_us()),
        start_us: e.start_us(),
        handoff_id: e.handoff_id(),
        mh: e.mh(),
        old_msr: e.old_msr(),
        new_msr: e.new_msr(),
        role: e.role(),
        outcome: e.outcome(),
        moved: e.moved(),
        failed: e.failed(),
        bytes_moved: e.bytes_moved(),
        steps_us: Steps {
            freeze,
            images,
            restored,
            resumed,
            acked,
        },
        duration_us: e.duration_us(),
        reason: e.reason(),
        old: e.old.as_ref(),
        new: e.new.as_ref(),
    };
    serde_json::to_string(&j).expect("plain data serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Records msrd wrote in the lab (tests/tests/handoff.rs, ITCP_LAB_KEEP=1): a move
    // msr1 → msr2 and back, one where the connection failed to restart at the new
    // MSR, and one whose new MSR was killed mid-handoff (no new record). Written
    // before `bytes_moved` existed.
    const MSR1: &str = r#"{"handoff_id":1795405896199814,"msr":"msr1","role":"old","mh":"10.2.0.100","old_msr":"msr1","new_msr":"msr2","outcome":"moved","connections":[{"id":1,"kind":"connect","mh":"10.2.0.100:53654","fh":"10.0.0.1:5001","queued_bytes":7484328}],"phases":{"mh_in":1795405899244668,"freeze":1795405899244668,"images_sent":1795405899258467,"acknowledged":1795405899319062}}
{"handoff_id":1795405896158739,"msr":"msr1","role":"new","mh":"10.2.0.100","old_msr":"msr2","new_msr":"msr1","outcome":"moved","connections":[{"id":1,"kind":"connect","mh":"10.2.0.100:53654","fh":"10.0.0.1:5001","queued_bytes":7478416}],"phases":{"greeting":1795405903188294,"mh_in":1795405903188294,"images_sent":1795405903239473,"restored":1795405903247592,"resumed":1795405903267451,"acknowledged":1795405903267451}}
{"handoff_id":1795405884909242,"msr":"msr1","role":"old","mh":"10.2.0.101","old_msr":"msr1","new_msr":"msr2","outcome":"rolled_back","reason":"no connection resumed at the new MSR","connections":[{"id":1,"kind":"connect","mh":"10.2.0.101:49208","fh":"10.0.0.1:5001","queued_bytes":2367904}],"failed":[[1,"restart: MSRD_FAULT=fail_restart: injected restart failure"]],"phases":{"mh_in":1795405886171369,"freeze":1795405886171369,"images_sent":1795405886176009,"acknowledged":1795405886211886}}
not a record
{"handoff_id":1795405908138286,"msr":"msr1","role":"old","mh":"10.2.0.100","old_msr":"msr1","new_msr":"msr2","outcome":"rolled_back","reason":"channel to the new MSR: peer closed the channel","connections":[{"id":1,"kind":"connect","mh":"10.2.0.100:44914","fh":"10.0.0.1:5001","queued_bytes":5491496}],"phases":{"mh_in":1795405909568449,"freeze":1795405909568449,"images_sent":1795405909579944}}
"#;
    const MSR2: &str = r#"{"handoff_id":1795405896199814,"msr":"msr2","role":"new","mh":"10.2.0.100","old_msr":"msr1","new_msr":"msr2","outcome":"moved","connections":[{"id":1,"kind":"connect","mh":"10.2.0.100:53654","fh":"10.0.0.1:5001","queued_bytes":7484328}],"phases":{"greeting":1795405899244241,"mh_in":1795405899244241,"images_sent":1795405899297024,"restored":1795405899306118,"resumed":1795405899318939,"acknowledged":1795405899318939}}

{"handoff_id":1795405896158739,"msr":"msr2","role":"old","mh":"10.2.0.100","old_msr":"msr2","new_msr":"msr1","outcome":"moved","connections":[{"id":1,"kind":"connect","mh":"10.2.0.100:53654","fh":"10.0.0.1:5001","queued_bytes":7478416}],"phases":{"mh_in":1795405903188650,"freeze":1795405903188650,"images_sent":1795405903202772,"acknowledged":1795405903267567}}
{"handoff_id":1795405884909242,"msr":"msr2","role":"new","mh":"10.2.0.101","old_msr":"msr1","new_msr":"msr2","outcome":"rolled_back","reason":"no connection resumed here: the old MSR keeps them","connections":[{"id":1,"kind":"connect","mh":"10.2.0.101:49208","fh":"10.0.0.1:5001","queued_bytes":2367904}],"failed":[[1,"restart: MSRD_FAULT=fail_restart: injected restart failure"]],"phases":{"greeting":1795405886170944,"mh_in":1795405886170944,"images_sent":1795405886188866,"restored":1795405886193734,"resumed":1795405886211401,"acknowledged":1795405886211401}}
"#;

    fn numbered(s: &str) -> impl Iterator<Item = (usize, &str)> {
        s.lines().enumerate().map(|(i, l)| (i + 1, l))
    }

    fn both() -> Vec<Entry> {
        let (mut a, bad1) = parse_lines("msr1.jsonl", numbered(MSR1));
        let (b, bad2) = parse_lines("msr2.jsonl", numbered(MSR2));
        assert_eq!(
            bad1,
            ["msr1.jsonl:4: skipped, not a handoff record: expected ident at line 1 column 2"]
        );
        assert!(bad2.is_empty(), "a blank line is not an error");
        a.extend(b);
        merge(a)
    }

    #[test]
    fn pairs_the_two_msrs_records_of_each_handoff_in_time_order() {
        let e = both();
        let roles: Vec<_> = e.iter().map(|e| (e.role(), e.outcome())).collect();
        assert_eq!(
            roles,
            [
                ("both", "rolled_back".to_string()),
                ("both", "moved".into()),
                ("both", "moved".into()),
                ("old", "rolled_back".into()),
            ]
        );
        // msr1 → msr2: greeting at msr2, freeze at msr1 0.43 ms later, images at msr2
        // 52.36 ms after that, restored 9.09, resumed 12.82, acked at msr1 0.12.
        let mv = &e[1];
        assert_eq!(mv.start_us(), 1795405899244241);
        assert_eq!(
            mv.steps_us(),
            [Some(427), Some(52356), Some(9094), Some(12821), Some(123)]
        );
        assert_eq!(mv.duration_us(), Some(74821));
        assert_eq!((mv.moved(), mv.failed()), (1, 0));
        assert_eq!(mv.bytes_moved(), 7484328);
        assert_eq!((mv.old_msr(), mv.new_msr()), ("msr1", "msr2"));
        assert_eq!(mv.reason(), None);
        // The move back is msr2 → msr1.
        assert_eq!((e[2].old_msr(), e[2].new_msr()), ("msr2", "msr1"));
        // The restart failure: nothing moved, one connection stayed; both reasons.
        let rb = &e[0];
        assert_eq!((rb.moved(), rb.failed(), rb.bytes_moved()), (0, 1, 0));
        assert_eq!(
            rb.steps_us(),
            [Some(425), Some(17497), Some(4868), Some(17667), Some(485)]
        );
        assert_eq!(
            rb.reason().unwrap(),
            "old: no connection resumed at the new MSR; new: no connection resumed here: \
             the old MSR keeps them"
        );
        // The old MSR alone: freeze → images, then nothing.
        let alone = &e[3];
        assert_eq!(alone.steps_us(), [None, Some(11495), None, None, None]);
        assert_eq!(alone.duration_us(), Some(11495));
        assert_eq!(alone.failed(), 1);
        assert_eq!(
            alone.reason().as_deref(),
            Some("channel to the new MSR: peer closed the channel")
        );
    }

    #[test]
    fn one_msr_alone_and_duplicates() {
        let (a, _) = parse_lines("msr1", numbered(MSR1));
        let e = merge(a.clone());
        assert_eq!(e.len(), 4);
        assert!(e.iter().all(|e| e.role() != "both"));
        // The new MSR's record alone: greeting → images → restored → resumed → acked.
        let new = e.iter().find(|e| e.role() == "new").unwrap();
        assert_eq!(
            new.steps_us(),
            [None, Some(51179), Some(8119), Some(19859), Some(0)]
        );
        assert_eq!(new.duration_us(), Some(79157));
        // The same log twice: the same four entries.
        let twice = merge(a.iter().cloned().chain(a.iter().cloned()));
        assert_eq!(twice, e);
    }

    #[test]
    fn filters_by_mh_failure_and_time() {
        let e = both();
        let pick = |f: Filter| -> Vec<u64> {
            e.iter()
                .filter(|e| e.selected(&f))
                .map(Entry::handoff_id)
                .collect()
        };
        let mh101 = Filter {
            mh: Some("10.2.0.101".parse().unwrap()),
            ..Filter::default()
        };
        assert_eq!(pick(mh101), [1795405884909242]);
        let failed = Filter {
            failed_only: true,
            ..Filter::default()
        };
        assert_eq!(pick(failed), [1795405884909242, 1795405908138286]);
        // Entries start at their earliest phase (the greeting at the new MSR), both
        // ends of the window included.
        let window = Filter {
            since_us: Some(1795405899244241),
            until_us: Some(1795405903188294),
            ..Filter::default()
        };
        assert_eq!(pick(window), [1795405896199814, 1795405896158739]);
        let later = Filter {
            since_us: Some(1795405899244242),
            ..Filter::default()
        };
        assert_eq!(pick(later), [1795405896158739, 1795405908138286]);
    }

    #[test]
    fn table_shows_time_both_sides_bytes_and_steps() {
        let t = render(&both());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(
            lines[0].starts_with("time (UTC)                mh          role"),
            "{t}"
        );
        assert!(
            lines[0].contains("→freeze  →images  →restored  →resumed  →acked  total ms"),
            "{t}"
        );
        let mv: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            mv,
            [
                "2026-11-23T03:51:39.244Z",
                "10.2.0.100",
                "both",
                "msr1",
                "→",
                "msr2",
                "moved",
                "1",
                "0",
                "7.1",
                "MiB",
                "0.4",
                "52.4",
                "9.1",
                "12.8",
                "0.1",
                "74.8",
                "1795405896199814"
            ],
            "{t}"
        );
        assert!(lines[1].contains("rolled_back"), "{t}");
        assert!(lines[4].ends_with("channel to the new MSR: peer closed the channel"));
        // Columns line up: in every row, the outcome starts where its header does.
        let col = lines[0][..lines[0].find("outcome").unwrap()]
            .chars()
            .count();
        for l in &lines[1..] {
            let c: Vec<char> = l.chars().collect();
            assert!(c[col - 1] == ' ' && c[col] != ' ', "{l}");
        }
        // The follow view: same cells at fixed widths.
        assert!(header_line().starts_with("time (UTC)"));
        assert!(row_line(&both()[0]).contains("msr1 → msr2"));
    }

    #[test]
    fn json_lines_carry_the_columns_and_the_records() {
        let e = both();
        let v: serde_json::Value = serde_json::from_str(&json_line(&e[1])).unwrap();
        assert_eq!(v["time"], "2026-11-23T03:51:39.244Z");
        assert_eq!(v["role"], "both");
        assert_eq!(v["mh"], "10.2.0.100");
        assert_eq!(v["bytes_moved"], 7484328);
        assert_eq!(v["steps_us"]["images"], 52356);
        assert_eq!(v["duration_us"], 74821);
        assert_eq!(v["old"]["role"], "old");
        assert_eq!(v["new"]["msr"], "msr2");
        let alone: serde_json::Value = serde_json::from_str(&json_line(&e[3])).unwrap();
        assert!(alone.get("new").is_none() && alone["steps_us"].get("freeze").is_none());
    }

    #[test]
    fn pairer_waits_for_the_other_side_then_shows_one_alone() {
        let (a, _) = parse_lines("msr1", numbered(MSR1));
        let (b, _) = parse_lines("msr2", numbered(MSR2));
        let mut p = Pairer::new(10_000_000);
        assert_eq!(p.push(a[0].clone(), 0), None);
        assert_eq!(p.push(a[0].clone(), 1), None, "a duplicate is dropped");
        assert_eq!(p.push(b[1].clone(), 2), None, "not its pair");
        let e = p.push(b[0].clone(), 5).expect("paired");
        assert_eq!(e.role(), "both");
        assert_eq!(p.push(a[3].clone(), 100), None);
        assert!(p.expire(9_999_999).is_empty());
        let alone = p.expire(10_000_100);
        assert_eq!(alone.len(), 2);
        assert_eq!((alone[0].role(), alone[1].role()), ("old", "old"));
        assert!(p.drain().is_empty());
        // Following one log: at once.
        let mut one = Pairer::new(0);
        assert_eq!(one.push(a[1].clone(), 0).unwrap().role(), "new");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(65536), "64.0 KiB");
        assert_eq!(human_bytes(7484328), "7.1 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
