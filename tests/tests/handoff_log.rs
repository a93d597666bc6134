//! `itcpctl handoffs` on real handoff logs: the logs of two MSRs merged into one
//! timeline (each handoff's old and new record on one line), the filters, JSON lines,
//! malformed lines, and `--follow` across rotation and truncation.
//!
//! `tests/fixtures/handoff-logs/msr{1,2}.jsonl` are records msrd wrote in three labs of
//! tests/tests/handoff.rs (kept with ITCP_LAB_KEEP=1): a restart failure at the new
//! MSR (rolled back on both sides), a move msr1 → msr2 and back, and a move whose new
//! MSR was killed (the old MSR's record only). They predate `bytes_moved`; msr1's log
//! has a line cut short and a blank line added. The last test makes a handoff on a
//! live lab (needs root) and reads both MSRs' fresh logs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use itcp_handoff::log::{time, Role};
use itcp_testbed::lab::{self, bin_path, Host, Lab, LabConfig};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/handoff-logs")
        .join(name)
}

fn itcpctl(args: &[&str]) -> Output {
    Command::new(bin_path("itcpctl"))
        .args(args)
        .output()
        .expect("itcpctl (build the workspace's binaries first)")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// stdout of a successful run, as lines.
fn ok_lines(args: &[&str]) -> (Vec<String>, String) {
    let out = itcpctl(args);
    let err = text(&out.stderr);
    assert!(out.status.success(), "itcpctl {args:?}: {err}");
    (text(&out.stdout).lines().map(String::from).collect(), err)
}

/// The table's cells, split on runs of two or more spaces.
fn cells(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Without --wide the table fits 120 columns: the phases and the id go, a handoff
/// that did not simply move gets a second line with its id and reason.
#[test]
fn the_default_table_fits_120_columns() {
    let (m1, m2) = (fixture("msr1.jsonl"), fixture("msr2.jsonl"));
    let (m1, m2) = (m1.to_str().unwrap(), m2.to_str().unwrap());
    let (lines, _) = ok_lines(&["handoffs", m1, m2]);
    let long: Vec<&String> = lines.iter().filter(|l| l.chars().count() > 120).collect();
    assert!(long.is_empty(), "lines over 120 columns: {long:#?}");
    assert_eq!(
        cells(&lines[0]),
        [
            "time (UTC)",
            "mh",
            "role",
            "old → new",
            "outcome",
            "moved",
            "failed",
            "bytes",
            "total ms"
        ]
    );
    assert_eq!(
        cells(&lines[1]),
        [
            "2026-11-23T03:51:26.170Z",
            "10.2.0.100",
            "both",
            "msr1 → msr2",
            "rolled_back",
            "0",
            "1",
            "0 B",
            "40.9"
        ]
    );
    // The reason, wrapped under its row, with the id to grep msrd's logs for.
    assert!(
        lines[2].starts_with("  ↳ handoff 1795405884909242: old: no connection resumed"),
        "{lines:#?}"
    );
    let moved = lines
        .iter()
        .position(|l| l.starts_with("2026-11-23T03:51:39.244Z"))
        .unwrap();
    assert!(lines[moved].ends_with("7.1 MiB      74.8"), "{lines:#?}");
    assert!(
        lines[moved + 1].starts_with("2026-11-23T03:51:43.188Z"),
        "{lines:#?}"
    );
    // --wide: every column, as wide as it takes.
    let (wide, _) = ok_lines(&["handoffs", "--wide", m1, m2]);
    assert!(wide.iter().any(|l| l.chars().count() > 200), "{wide:#?}");
}

#[test]
fn two_msrs_logs_merge_into_one_timeline() {
    let (m1, m2) = (fixture("msr1.jsonl"), fixture("msr2.jsonl"));
    let (m1, m2) = (m1.to_str().unwrap(), m2.to_str().unwrap());
    let (lines, err) = ok_lines(&["handoffs", "--wide", m1, m2]);
    // The line cut short is skipped with a warning naming file and line; the rest is read.
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "itcpctl: {m1}:2: skipped, not a handoff record: EOF while parsing"
        )),
        "{err}"
    );
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert_eq!(
        cells(&lines[0]),
        [
            "time (UTC)",
            "mh",
            "role",
            "old → new",
            "outcome",
            "moved",
            "failed",
            "bytes",
            "→freeze",
            "→images",
            "→restored",
            "→resumed",
            "→acked",
            "total ms",
            "handoff",
            "reason"
        ]
    );
    let rows: Vec<Vec<&str>> = lines[1..].iter().map(|l| cells(l)).collect();
    // In time order; both MSRs' records of a handoff on one line.
    assert_eq!(
        rows[0][..8],
        [
            "2026-11-23T03:51:26.170Z",
            "10.2.0.100",
            "both",
            "msr1 → msr2",
            "rolled_back",
            "0",
            "1",
            "0 B"
        ]
    );
    assert!(rows[0][15].starts_with("old: no connection resumed at the new MSR; new: "));
    // msr1 → msr2 end to end: greeting (msr2) → freeze (msr1) → images (msr2) →
    // restored → resumed (msr2) → acked (msr1).
    assert_eq!(
        rows[1],
        [
            "2026-11-23T03:51:39.244Z",
            "10.2.0.100",
            "both",
            "msr1 → msr2",
            "moved",
            "1",
            "0",
            "7.1 MiB",
            "0.4",
            "52.4",
            "9.1",
            "12.8",
            "0.1",
            "74.8",
            "1795405896199814"
        ]
    );
    assert_eq!(
        rows[2][..5],
        [
            "2026-11-23T03:51:43.188Z",
            "10.2.0.100",
            "both",
            "msr2 → msr1",
            "moved"
        ]
    );
    // The new MSR was killed: the old MSR's record alone.
    assert_eq!(rows[3][2..5], ["old", "msr1 → msr2", "rolled_back"]);
    assert_eq!(rows[3][8..12], ["-", "11.5", "-", "-"]);

    // One MSR's log alone: its own role on each line.
    let (one, _) = ok_lines(&["--log", m2, "handoffs", "--wide"]);
    let roles: Vec<&str> = one[1..].iter().map(|l| cells(l)[2]).collect();
    assert_eq!(roles, ["new", "new", "old"]);

    // Filters: the time window (both ends included), failures, the MH.
    let (w, _) = ok_lines(&[
        "handoffs",
        "--wide",
        m1,
        m2,
        "--since",
        "2026-11-23T03:51:39.244Z",
        "--until",
        "2026-11-23 04:51:43.189+01:00",
    ]);
    let ids: Vec<&str> = w[1..].iter().map(|l| cells(l)[14]).collect();
    assert_eq!(ids, ["1795405896199814", "1795405896158739"]);
    let (f, _) = ok_lines(&["handoffs", "--wide", m1, m2, "--failed"]);
    assert!(
        f[1..].iter().all(|l| l.contains("rolled_back")) && f.len() == 3,
        "{f:#?}"
    );
    let (none, _) = ok_lines(&["handoffs", m1, m2, "--mh", "10.2.0.101"]);
    assert_eq!(none.len(), 1, "the header only");
    // Relative times: everything in the fixtures happened more than 1 s ago.
    let (recent, _) = ok_lines(&["handoffs", m1, m2, "--since", "1s"]);
    assert_eq!(recent.len(), 1);

    // JSON lines: one object per handoff, the table's columns and the records.
    let (j, _) = ok_lines(&[
        "handoffs",
        m1,
        m2,
        "--json",
        "--since",
        "2026-11-23T03:51:39Z",
    ]);
    let v: Vec<Value> = j.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(v.len(), 3);
    assert_eq!(v[0]["time"], "2026-11-23T03:51:39.244Z");
    assert_eq!(v[0]["role"], "both");
    assert_eq!(v[0]["bytes_moved"], 7484328);
    assert_eq!(v[0]["duration_us"], 74821);
    assert_eq!(v[0]["steps_us"]["freeze"], 427);
    assert_eq!(v[0]["old"]["handoff_id"], v[0]["new"]["handoff_id"]);
    assert_eq!(v[2]["role"], "old");
    assert!(v[2].get("new").is_none());

    // Errors: a bad time names its flag (usage, 2); a missing file names it (1).
    let out = itcpctl(&["handoffs", m1, "--until", "last tuesday"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .starts_with("itcpctl: --until: \"last tuesday\" is not a time: expected ISO 8601"),
        "{}",
        text(&out.stderr)
    );
    let out = itcpctl(&["handoffs", m1, "/nonexistent/handoffs.jsonl"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("/nonexistent/handoffs.jsonl: No such file"),
        "{}",
        text(&out.stderr)
    );
}

/// A running `itcpctl handoffs --follow`, its stdout and stderr lines as they come.
struct Follow {
    child: Child,
    out: Receiver<String>,
    err: Receiver<String>,
}

impl Follow {
    fn start(args: &[&str]) -> Follow {
        let mut child = Command::new(bin_path("itcpctl"))
            .args(["handoffs", "--follow"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = |r: Box<dyn std::io::Read + Send>| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
            rx
        };
        let out = lines(Box::new(child.stdout.take().unwrap()));
        let err = lines(Box::new(child.stderr.take().unwrap()));
        Follow { child, out, err }
    }

    fn next(rx: &Receiver<String>, what: &str) -> String {
        rx.recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("no {what} line in 5 s"))
    }

    fn line(&self) -> String {
        Self::next(&self.out, "output")
    }

    fn warning(&self) -> String {
        Self::next(&self.err, "stderr")
    }

    fn quiet_for(&self, d: Duration) {
        if let Ok(l) = self.out.recv_timeout(d) {
            panic!("unexpected output: {l}");
        }
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fixture line of this handoff and role.
fn record(id: u64, role: Role) -> String {
    ["msr1.jsonl", "msr2.jsonl"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(fixture(f))
                .unwrap()
                .lines()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .find(|l| {
            serde_json::from_str::<itcp_handoff::log::Record>(l)
                .is_ok_and(|r| r.handoff_id == id && r.role == role)
        })
        .unwrap()
}

fn append(p: &Path, line: &str) {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .unwrap()
        .write_all(format!("{line}\n").as_bytes())
        .unwrap();
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("itcp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const MOVE: u64 = 1795405896199814;
const BACK: u64 = 1795405896158739;
const RESTART_FAILED: u64 = 1795405884909242;

#[test]
fn follow_prints_records_as_they_come_across_rotation_and_truncation() {
    let dir = temp_dir("follow");
    let log = dir.join("handoffs.jsonl");
    append(&log, &record(RESTART_FAILED, Role::Old));
    let f = Follow::start(&[log.to_str().unwrap()]);
    assert!(f.line().starts_with("time (UTC)"));
    assert!(f.line().contains(" old   msr1 → msr2  rolled_back"));
    let why = f.line();
    assert!(
        why.starts_with(&format!("  ↳ handoff {RESTART_FAILED}: ")),
        "{why}"
    );
    f.quiet_for(Duration::from_millis(600));

    // Appended: shown at once.
    append(&log, &record(MOVE, Role::New));
    let l = f.line();
    assert!(
        l.starts_with("2026-11-23T03:51:39.244Z  10.2.0.100  new   msr1 → msr2  moved"),
        "{l}"
    );
    append(&log, "garbage");
    assert_eq!(
        f.warning(),
        format!(
            "itcpctl: {}:3: skipped, not a handoff record: expected value at line 1 column 1",
            log.display()
        )
    );

    // Rotated (renamed, a new file under the name).
    std::fs::rename(&log, dir.join("handoffs.jsonl.1")).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    append(&log, &record(BACK, Role::Old));
    assert!(f.line().contains(" old   msr2 → msr1  moved"));

    // Truncated in place (logrotate's copytruncate).
    std::fs::File::create(&log).unwrap();
    assert_eq!(
        f.warning(),
        format!(
            "itcpctl: {}: truncated: reading from its start",
            log.display()
        )
    );
    append(&log, &record(BACK, Role::New));
    assert!(f.line().contains(" new   msr2 → msr1  moved"));
    f.quiet_for(Duration::from_millis(600));
    drop(f);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn following_two_msrs_pairs_each_handoff_as_both_records_arrive() {
    let dir = temp_dir("follow2");
    let (a, b) = (dir.join("msr1.jsonl"), dir.join("msr2.jsonl"));
    append(&a, &record(RESTART_FAILED, Role::Old));
    append(&b, &record(RESTART_FAILED, Role::New));
    // msr2's log does not exist yet when following starts: waited for.
    std::fs::remove_file(&b).unwrap();
    let f = Follow::start(&["--json", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(
        f.warning(),
        format!("itcpctl: {}: not there yet: waiting for it", b.display())
    );
    let v: Value = serde_json::from_str(&f.line()).unwrap();
    assert_eq!(
        (v["role"].as_str(), v["outcome"].as_str()),
        (Some("old"), Some("rolled_back"))
    );

    // The old MSR's record first: it waits for the new MSR's, then one line.
    append(&a, &record(MOVE, Role::Old));
    f.quiet_for(Duration::from_millis(800));
    append(&b, &record(MOVE, Role::New));
    let v: Value = serde_json::from_str(&f.line()).unwrap();
    assert_eq!(v["role"], "both");
    assert_eq!(v["handoff_id"], MOVE);
    assert_eq!(v["duration_us"], 74821);
    drop(f);
    let _ = std::fs::remove_dir_all(dir);
}

/// A handoff on a live lab: both MSRs' fresh logs read as one line, with the bytes
/// moved as msrd now writes them. Needs root.
#[test]
fn a_live_handoff_reads_as_one_line_from_both_msrs_logs() {
    let mut lab = Lab::new(LabConfig::clean(2, 77)).unwrap();
    lab.start_itcp_mobility("", &["--hysteresis-ms", "0"])
        .unwrap();
    let bytes = (16u64 << 20).to_string();
    let fh = lab::fh_addr(5001);
    let ttcp = bin_path("ttcp");
    let send = lab
        .spawn(
            Host::Fh,
            &ttcp,
            &["send", "--listen", &fh, "--bytes", &bytes],
        )
        .unwrap();
    lab.wait_listening(Host::Fh, 5001).unwrap();
    let recv = lab
        .spawn(
            Host::Mh,
            &ttcp,
            &["recv", "--connect", &fh, "--bytes", &bytes, "--itcp"],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let before = now_us();
    lab.assoc(&[1, 2]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    lab.assoc(&[2]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while lab.handoff_records(1).is_empty() || lab.handoff_records(2).is_empty() {
        assert!(Instant::now() < deadline, "no handoff logged at both MSRs");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (ok, out, err) = lab.wait(recv, Duration::from_secs(60)).unwrap();
    assert!(ok, "receiver: {out} {err}");
    lab.wait(send, Duration::from_secs(10)).unwrap();

    let (l1, l2) = (lab.handoff_log(1), lab.handoff_log(2));
    let (l1, l2) = (l1.to_str().unwrap(), l2.to_str().unwrap());
    let (lines, err) = ok_lines(&["handoffs", "--wide", l1, l2]);
    assert!(err.is_empty(), "{err}");
    for l in &lines {
        eprintln!("{l}");
    }
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let row = cells(&lines[1]);
    assert_eq!(
        row[1..7],
        ["10.2.0.100", "both", "msr1 → msr2", "moved", "1", "0"]
    );
    let started = time::parse(row[0], 0).unwrap();
    assert!(
        started + 1000 >= before && started <= now_us(),
        "{} not between the move and now",
        row[0]
    );
    assert_ne!(row[7], "0 B");
    assert!(
        row[8..14].iter().all(|c| *c != "-"),
        "every step timed: {row:?}"
    );

    let (j, _) = ok_lines(&["handoffs", l1, l2, "--json", "--since", "1m"]);
    assert_eq!(j.len(), 1);
    let v: Value = serde_json::from_str(&j[0]).unwrap();
    // msrd writes the bytes moved; both MSRs agree on them and on the handoff id.
    let (old, new) = (&v["old"], &v["new"]);
    assert!(old["bytes_moved"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(old["bytes_moved"], new["bytes_moved"]);
    assert_eq!(v["bytes_moved"], old["bytes_moved"]);
    assert_eq!(old["handoff_id"], new["handoff_id"]);
    let steps = v["steps_us"].as_object().unwrap();
    assert_eq!(steps.len(), 5, "{v}");
    let total: i64 = steps.values().map(|s| s.as_i64().unwrap()).sum();
    assert_eq!(Some(total), v["duration_us"].as_i64());
    assert!(total > 0 && total < 5_000_000, "{v}");
}
