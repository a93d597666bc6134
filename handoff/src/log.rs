//! The handoff log: one JSON line per handoff, successful or not, written by each MSR
//! involved, and read back by `itcpctl handoffs` for an operator.
//!
//! Both MSRs of a handoff write a record with the same `handoff_id` (the new MSR picks
//! it and sends it in its `handoff_request`), so [`view`] can pair the two records of
//! one handoff from the logs of several MSRs. Fields added later are optional: a line
//! written before them still parses.

pub mod tail;
pub mod time;
pub mod view;

use std::fs::OpenOptions;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Which side of the handoff wrote the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The MSR the MH left.
    Old,
    /// The MSR the MH moved to.
    New,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every connection moved.
    Moved,
    /// The handoff failed before the old MSR let go: it keeps serving.
    RolledBack,
    /// Some connections could not be moved (see `failed`).
    Partial,
    /// Refused: bad proof, unknown peer, forged or replayed message.
    Rejected,
    /// The old MSR's msrd is not running (its channel refused the connection): the MH
    /// attached here without its connections, which died with that msrd.
    OldDown,
}

/// One connection in a handoff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnEntry {
    pub id: u64,
    pub kind: String,
    pub mh: SocketAddr,
    pub fh: SocketAddr,
    /// Bytes queued at freeze time (both sockets, both directions).
    pub queued_bytes: u64,
}

/// Microseconds since the UNIX epoch of each phase this MSR saw (paper §5.4).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phases {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub greeting: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mh_in: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freeze: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images_sent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<u64>,
}

impl Phases {
    fn first_last(&self) -> Option<(u64, u64)> {
        let all = [
            self.greeting,
            self.mh_in,
            self.freeze,
            self.images_sent,
            self.restored,
            self.resumed,
            self.acknowledged,
        ];
        let v: Vec<u64> = all.into_iter().flatten().collect();
        Some((*v.iter().min()?, *v.iter().max()?))
    }
}

/// One handoff as one MSR saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub handoff_id: u64,
    /// Who wrote this record.
    pub msr: String,
    pub role: Role,
    pub mh: IpAddr,
    pub old_msr: String,
    pub new_msr: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub connections: Vec<ConnEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<(u64, String)>,
    pub phases: Phases,
    /// Queued bytes carried by the connections that moved (see
    /// [`Record::moved_bytes`]); absent in records written before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_moved: Option<u64>,
}

impl Record {
    /// From the first to the last phase seen, in µs.
    pub fn duration_us(&self) -> Option<u64> {
        self.phases.first_last().map(|(a, b)| b - a)
    }

    /// From the first to the last phase seen, in ms.
    pub fn duration_ms(&self) -> Option<f64> {
        self.duration_us().map(|d| d as f64 / 1000.0)
    }

    pub fn ok(&self) -> bool {
        self.outcome == Outcome::Moved
    }

    /// The earliest phase this MSR saw (µs since the epoch), 0 if none.
    pub fn start_us(&self) -> u64 {
        self.phases.first_last().map_or(0, |(a, _)| a)
    }

    /// True if the connections went to the new MSR (all, or some of them).
    pub fn went_over(&self) -> bool {
        matches!(self.outcome, Outcome::Moved | Outcome::Partial)
    }

    /// Connections that moved: listed, not failed, and the handoff went over.
    pub fn moved_connections(&self) -> impl Iterator<Item = &ConnEntry> {
        let over = self.went_over();
        self.connections
            .iter()
            .filter(move |c| over && !self.failed.iter().any(|(id, _)| *id == c.id))
    }

    /// Queued bytes carried by the connections that moved: `bytes_moved` as written,
    /// or, for records written without it, the same sum from `connections`.
    pub fn moved_bytes(&self) -> u64 {
        self.bytes_moved
            .unwrap_or_else(|| self.moved_connections().map(|c| c.queued_bytes).sum())
    }

    /// Sets the connections and the bytes moved with them (what msrd logs).
    pub fn set_connections(&mut self, conns: &[ConnEntry]) {
        self.connections = conns.to_vec();
        self.bytes_moved = None;
        self.bytes_moved = Some(self.moved_bytes());
    }
}

/// Appends one record as a JSON line (the file is created if needed).
pub fn append(path: &Path, r: &Record) -> io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut line = serde_json::to_vec(r).map_err(io::Error::other)?;
    line.push(b'\n');
    // One write per record: concurrent appenders never interleave within a line.
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(&line)
}

/// What `itcpctl handoffs` shows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub mh: Option<IpAddr>,
    pub failed_only: bool,
    /// Only handoffs that started at or after this time (µs since the epoch).
    pub since_us: Option<u64>,
    /// Only handoffs that started at or before this time (µs since the epoch).
    pub until_us: Option<u64>,
}

impl Filter {
    pub fn matches(&self, r: &Record) -> bool {
        self.selects(r.mh, r.ok(), r.start_us())
    }

    /// The same test on what a record (or a pair of them) says: the MH, whether every
    /// connection moved, and when the handoff started.
    pub fn selects(&self, mh: IpAddr, ok: bool, start_us: u64) -> bool {
        self.mh.is_none_or(|m| m == mh)
            && (!self.failed_only || !ok)
            && self.since_us.is_none_or(|t| start_us >= t)
            && self.until_us.is_none_or(|t| start_us <= t)
    }
}

/// Reads the log; lines that are not records are reported with their line number
/// instead of aborting the whole read.
pub fn read(path: &Path, f: &Filter) -> io::Result<(Vec<Record>, Vec<String>)> {
    let file = std::fs::File::open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(&line) {
            Ok(r) if f.matches(&r) => out.push(r),
            Ok(_) => {}
            Err(e) => bad.push(format!("{}:{}: {e}", path.display(), i + 1)),
        }
    }
    Ok((out, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64, mh: &str, outcome: Outcome) -> Record {
        Record {
            handoff_id: id,
            msr: "msr2".into(),
            role: Role::New,
            mh: mh.parse().unwrap(),
            old_msr: "msr1".into(),
            new_msr: "msr2".into(),
            outcome,
            reason: (outcome != Outcome::Moved).then(|| "old MSR did not answer".into()),
            connections: vec![ConnEntry {
                id: 1,
                kind: "connect".into(),
                mh: "10.2.0.100:40000".parse().unwrap(),
                fh: "10.0.0.1:80".parse().unwrap(),
                queued_bytes: 1234,
            }],
            failed: vec![],
            phases: Phases {
                greeting: Some(1_000_000),
                restored: Some(1_012_000),
                acknowledged: Some(1_015_000),
                ..Default::default()
            },
            bytes_moved: None,
        }
    }

    #[test]
    fn append_read_filter() {
        let dir = std::env::temp_dir().join(format!("ith-log-{}", std::process::id()));
        let path = dir.join("handoffs.jsonl");
        let _ = std::fs::remove_file(&path);
        append(&path, &rec(1, "10.2.0.100", Outcome::Moved)).unwrap();
        append(&path, &rec(2, "10.2.0.101", Outcome::RolledBack)).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"not json\n")
            .unwrap();
        let (all, bad) = read(&path, &Filter::default()).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(bad.len(), 1);
        assert!(
            bad[0].ends_with(":3: expected ident at line 1 column 2"),
            "{}",
            bad[0]
        );
        let (failed, _) = read(
            &path,
            &Filter {
                failed_only: true,
                ..Filter::default()
            },
        )
        .unwrap();
        assert_eq!(
            failed.iter().map(|r| r.handoff_id).collect::<Vec<_>>(),
            vec![2]
        );
        let (one, _) = read(
            &path,
            &Filter {
                mh: Some("10.2.0.100".parse().unwrap()),
                ..Filter::default()
            },
        )
        .unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].duration_us(), Some(15_000));
        let (later, _) = read(
            &path,
            &Filter {
                since_us: Some(1_000_001),
                ..Filter::default()
            },
        )
        .unwrap();
        assert!(later.is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn bytes_moved_is_written_and_derived_for_old_records() {
        let mut r = rec(1, "10.2.0.100", Outcome::Partial);
        let conn = |id, queued_bytes| ConnEntry {
            id,
            queued_bytes,
            ..r.connections[0].clone()
        };
        let conns = [conn(1, 100), conn(2, 20), conn(3, 3)];
        r.failed = vec![(2, "restart failed".into())];
        r.set_connections(&conns);
        assert_eq!(r.bytes_moved, Some(103));
        assert_eq!(r.moved_connections().count(), 2);
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.contains("\"bytes_moved\":103"), "{line}");
        // A line written before the field existed: the same total, from the connections.
        let old = line.replace(",\"bytes_moved\":103", "");
        let back: Record = serde_json::from_str(&old).unwrap();
        assert_eq!((back.bytes_moved, back.moved_bytes()), (None, 103));
        // Nothing moves in a rollback.
        r.outcome = Outcome::RolledBack;
        r.set_connections(&conns);
        assert_eq!(r.bytes_moved, Some(0));
    }
}
