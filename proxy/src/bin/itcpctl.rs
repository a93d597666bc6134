//! `itcpctl`: the operator's view of a running msrd.
//!
//! ```text
//! itcpctl [--socket PATH | --config FILE] sessions [--json]
//! itcpctl [--socket PATH | --config FILE] stats [--json]
//! itcpctl [--socket PATH | --config FILE] metrics
//! itcpctl [--socket PATH | --config FILE] upgrade [--json]
//! itcpctl [--log FILE | --config FILE] handoffs [--mh ADDR] [--failed] [--since TIME]
//!         [--until TIME] [--follow] [--wide] [--json] [FILE...]
//! ```
//!
//! `handoffs` reads handoff logs (`[handoff] log_file`, or the logs of several MSRs
//! given as FILEs), not the daemon: it works whether or not msrd is running. What it
//! shows is [`itcp_handoff::log::view`] (pairing, filters, the wide table, JSON, all
//! I/O-free); here are the reading and following of the files, and the default table,
//! which picks the columns that fit 120 terminal columns. The command line is the
//! table [`SPEC`] (also `--help` and the man page).

use std::io::{self, BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use itcp_cli::table::{self, Column};
use itcp_cli::{Arg, Args, Command, Flag, Section, Spec};
use itcp_handoff::log::tail::{self, Tail, TailEvent};
use itcp_handoff::log::view::{self, Entry, Pairer};
use itcp_handoff::log::{time, Filter, Record};
use itcp_proto::control::{Body, Reply, Request};

const JSON: Flag = Flag::switch(
    "json",
    "Print the daemon's reply as JSON (one object) instead of a table.",
);

static SPEC: Spec = Spec {
    name: "itcpctl",
    version: env!("CARGO_PKG_VERSION"),
    about: "show the sessions, counters and handoffs of a running msrd",
    synopsis: &[
        "[--socket PATH | --config FILE] sessions [--json]",
        "[--socket PATH | --config FILE] stats [--json]",
        "[--socket PATH | --config FILE] metrics",
        "[--socket PATH | --config FILE] upgrade [--json]",
        "[--log FILE | --config FILE] handoffs [--mh ADDR] [--failed]\n\
         [--since TIME] [--until TIME] [--follow] [--json] [FILE...]",
    ],
    description: "\
itcpctl asks a running msrd(1) over its control socket for its relayed connections
(sessions), its counters (stats) or its Prometheus metrics (metrics), tells it to
replace itself by a new process of its binary without losing a connection (upgrade),
and reads the handoff logs that msrd writes (handoffs), whether or not msrd is
running: this router's, or those of several routers merged into one timeline.

Global options (--socket, --config, --log) come before or after the command; the
command's own options come after it. --socket and --log win over --config.",
    flags: &[
        Flag::value(
            "socket",
            "PATH",
            "msrd's control socket (default /run/msrd/control.sock).",
        ),
        Flag::value(
            "config",
            "FILE",
            "Take the control socket ([msr] control_socket) and the handoff log ([handoff] \
             log_file) from msrd's configuration file.",
        ),
        Flag::value(
            "log",
            "FILE",
            "The handoff log (default /var/log/itcp/handoffs.jsonl).",
        ),
    ],
    commands: &[
        Command {
            name: "sessions",
            synopsis: "[--json]",
            about: "The relayed connections: id, kind, MH and fixed host, age, bytes each way, \
                    and whether a handoff froze or moved them in.",
            flags: &[JSON],
        },
        Command {
            name: "stats",
            synopsis: "[--json]",
            about: "The daemon's counters (connections, bytes, refusals, handoffs).",
            flags: &[JSON],
        },
        Command {
            name: "metrics",
            synopsis: "",
            about: "The counters in the Prometheus text format, as /metrics serves them.",
            flags: &[],
        },
        Command {
            name: "upgrade",
            synopsis: "[--json]",
            about: "Replace msrd by a new process of its binary (as installed now), handing it \
                    every connection, listener and queued byte. Waits until the new process \
                    serves and prints its pid; if it cannot take over, msrd serves on and \
                    itcpctl says why (exit status 1). systemctl reload msrd runs this.",
            flags: &[JSON],
        },
        Command {
            name: "handoffs",
            synopsis: "[--mh ADDR] [--failed] [--since TIME] [--until TIME]\n\
                       [--follow] [--wide] [--json] [FILE...]",
            about: "\
The handoff log (--log, --config, or the FILEs given) as a table, oldest first, one
line per handoff, within 120 columns: when it started (ISO 8601, UTC, to the
millisecond), the MH, whose records the line shows (role: old, new, or both MSRs), the
old and the new MSR, the outcome (moved, partial, rolled_back, rejected; old/new when
the two MSRs disagree), the connections moved and failed, the bytes queued in the
moved connections and the total milliseconds. A handoff that did not simply move has
a second line: its handoff id (as in msrd's own log) and why. With --wide, every
column on one line: the milliseconds to each phase from the previous one (freeze,
images, restored, resumed, acked), the handoff id and the reason too.

Several FILEs (the handoff logs of several MSRs, copied or mounted) are merged into
one timeline: the old and the new MSR's records of one handoff (same handoff id and
MH) become one line (role both) whose phases come from the MSR that performs each
(greeting and restore at the new MSR, freeze and acknowledgement at the old one), and
whose total runs from the greeting at the new MSR to the acknowledgement at the old
one. Steps between the two MSRs need their clocks in sync (NTP): a negative step means
they are not.

A line that is not a handoff record is skipped with a warning naming its file and
line.",
            flags: &[
                Flag::value("mh", "ADDR", "Only handoffs of the MH with this address."),
                Flag::switch(
                    "failed",
                    "Only handoffs that did not move every connection.",
                ),
                Flag::value(
                    "since",
                    "TIME",
                    "Only handoffs that started at or after TIME: ISO 8601 \
                     (2025-03-01T14:05:00Z, 2025-03-01 14:05, 2025-03-01; UTC unless an \
                     offset such as +01:00 is given) or how long ago (90s, 10m, 2h, 1d, \
                     1h30m).",
                ),
                Flag::value(
                    "until",
                    "TIME",
                    "Only handoffs that started at or before TIME (as for --since). With \
                     --follow, stop once TIME has passed.",
                ),
                Flag::switch(
                    "follow",
                    "Keep reading: print handoffs as they are logged, across log rotation \
                     and truncation (as tail -F does); a FILE that does not exist yet is \
                     waited for. First come the last 10 handoffs logged so far (all since \
                     --since, if given). With several FILEs, a record waits up to 10 s for \
                     the other MSR's record of the same handoff.",
                ),
                Flag::switch(
                    "wide",
                    "Every column, one line per handoff (some 230 columns): the time to \
                     each phase, the handoff id and the reason as well.",
                ),
                Flag::switch(
                    "json",
                    "One JSON object per handoff and line instead of the table: time, \
                     start_us, handoff_id, mh, old_msr, new_msr, role, outcome, moved, \
                     failed, bytes_moved, steps_us (freeze, images, restored, resumed, \
                     acked), duration_us, reason, and the records as logged (old, new).",
                ),
            ],
        },
    ],
    sections: &[
        Section {
            title: "FILES",
            body: "\
\x20 /run/msrd/control.sock            the control socket
  /var/log/itcp/handoffs.jsonl      the handoff log
  /etc/itcp/msrd.toml               msrd's configuration (--config)",
        },
        Section {
            title: "EXIT STATUS",
            body: "0 on success, 1 when msrd cannot be reached or refuses, or the log cannot be \
                   read, 2 on a usage error.",
        },
        Section {
            title: "EXAMPLES",
            body: "\
\x20 itcpctl sessions
  itcpctl --config /etc/itcp/msrd.toml stats --json
  itcpctl --config /etc/itcp/msrd.toml upgrade
  itcpctl handoffs --since 2h
  itcpctl handoffs --mh 10.2.0.100 --failed --since 2025-03-01T14:00Z --until 15m
  itcpctl handoffs --follow
  itcpctl handoffs /srv/logs/msr1/handoffs.jsonl /srv/logs/msr2/handoffs.jsonl
  itcpctl handoffs --json --since 1d | jq 'select(.role == \"both\") | .duration_us'",
        },
        Section {
            title: "SEE ALSO",
            body: "msrd(1)",
        },
    ],
};

/// The command line.
#[derive(Debug, Default)]
struct Opts {
    socket: Option<String>,
    config: Option<String>,
    log: Option<PathBuf>,
    cmd: String,
    mh: Option<IpAddr>,
    failed: bool,
    json: bool,
    since_us: Option<u64>,
    until_us: Option<u64>,
    follow: bool,
    wide: bool,
    files: Vec<PathBuf>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The value of `--since` or `--until`, as µs since the epoch.
fn time_value(a: &mut Args, long: &str, now_us: u64) -> itcp_cli::Result<u64> {
    let v = a.value(long)?;
    time::parse(&v, now_us).map_err(|why| a.usage(format!("--{long}: {v:?} is not a time: {why}")))
}

fn parse(mut a: Args) -> itcp_cli::Result<Opts> {
    let mut o = Opts::default();
    let now = now_us();
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("socket") => o.socket = Some(a.value("socket")?),
            Arg::Flag("config") => o.config = Some(a.value("config")?),
            Arg::Flag("log") => o.log = Some(a.value("log")?.into()),
            Arg::Flag("mh") => o.mh = Some(a.parse("mh", "an IP address")?),
            Arg::Flag("failed") => o.failed = true,
            Arg::Flag("json") => o.json = true,
            Arg::Flag("since") => o.since_us = Some(time_value(&mut a, "since", now)?),
            Arg::Flag("until") => o.until_us = Some(time_value(&mut a, "until", now)?),
            Arg::Flag("follow") => o.follow = true,
            Arg::Flag("wide") => o.wide = true,
            Arg::Word(w) if o.cmd == "handoffs" => o.files.push(w.into()),
            Arg::Word(w) if a.current_command().is_none() => {
                if !SPEC.commands.iter().any(|c| c.name == w) {
                    return Err(a.usage(format!(
                        "unknown command '{w}' (expected sessions, stats, metrics, upgrade or handoffs)"
                    )));
                }
                o.cmd = a.set_command(&w).name.to_string();
            }
            other => return Err(a.unexpected(other)),
        }
    }
    if o.cmd.is_empty() {
        return Err(a.usage("which command? (sessions, stats, metrics, upgrade or handoffs)"));
    }
    if let (Some(s), Some(u)) = (o.since_us, o.until_us) {
        if s > u {
            return Err(a.usage(format!(
                "--since {} is after --until {}: no handoff can match",
                time::format_utc_ms(s),
                time::format_utc_ms(u)
            )));
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let o = match parse(Args::from_env(&SPEC)) {
        Ok(o) => o,
        Err(stop) => return itcp_cli::exit(&SPEC, stop),
    };
    match run(o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("itcpctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn request(path: &str, req: Request) -> Result<Body, String> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        format!("cannot reach msrd at {path}: {e} (is msrd running? try --socket or --config)")
    })?;
    s.write_all(req.to_line().as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    Reply::parse(&line)?.into_result()
}

/// Prints a reply as the operator reads it (`--json`: as msrd sent it).
fn print_reply(body: Body, as_json: bool) {
    match body {
        Body::Metrics(m) => print!("{}", m.text),
        b if as_json => {
            let r: Reply = b.into();
            println!("{}", serde_json::to_string_pretty(&r).unwrap());
        }
        Body::Stats(st) => {
            println!("msr {}: {} active connections", st.msr, st.active);
            for (k, n) in st.stats.fields() {
                println!("  {k:<26} {n}");
            }
        }
        Body::Sessions(v) => {
            let rows = v.sessions;
            println!("msr {}: {} session(s)", v.msr, rows.len());
            if !rows.is_empty() {
                println!(
                    "{:>6}  {:<11}  {:<22}  {:<22}  {:>8}  {:>12}  {:>12}  state",
                    "id", "kind", "mh", "fh", "age s", "bytes up", "bytes down"
                );
            }
            for r in rows {
                // Every row says what its connection does; a moved one says so too.
                let state = match (r.frozen, r.moved_in) {
                    (true, _) => "frozen (handoff)".to_string(),
                    (false, true) => format!("{} (moved in)", r.state()),
                    _ => r.state().to_string(),
                };
                println!(
                    "{:>6}  {:<11}  {:<22}  {:<22}  {:>8.1}  {:>12}  {:>12}  {state}",
                    r.id,
                    r.kind.as_str(),
                    r.mh.to_string(),
                    r.fh.to_string(),
                    r.age_s,
                    r.bytes_up,
                    r.bytes_down
                );
            }
        }
        Body::Upgrade(u) => println!(
            "msr {}: upgraded in {} ms: pid {} → {}, {} connection(s) and {} listener(s) kept",
            u.msr, u.ms, u.old_pid, u.new_pid, u.connections, u.listeners
        ),
        Body::Error(e) => eprintln!("itcpctl: {}", e.error),
    }
}

fn run(o: Opts) -> Result<(), String> {
    let mut socket = "/run/msrd/control.sock".to_string();
    let mut log = PathBuf::from("/var/log/itcp/handoffs.jsonl");
    if let Some(f) = &o.config {
        let cfg = itcp_config::MsrdConfig::load(f).map_err(|e| e.to_string())?;
        socket = cfg.msr.control_socket.display().to_string();
        log = cfg.handoff.log_file.clone();
    }
    let socket = o.socket.clone().unwrap_or(socket);
    let log = o.log.clone().unwrap_or(log);
    if o.cmd == "handoffs" {
        return match handoffs(&o, log) {
            // `itcpctl handoffs | head`: the reader had enough.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            r => r.map_err(|e| e.to_string()),
        };
    }
    let (cmd, as_json) = (o.cmd, o.json);
    let req = match cmd.as_str() {
        "stats" => Request::Stats,
        "metrics" => Request::Metrics,
        "upgrade" => Request::Upgrade,
        _ => Request::Sessions,
    };
    print_reply(request(&socket, req)?, as_json);
    Ok(())
}

/// How long, with several logs followed, a record waits for the other MSR's record
/// of the same handoff (msrd's own deadlines are 5 s by default).
const PAIR_WAIT_US: u64 = 10_000_000;
const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// The default table's columns, as indices into [`view::cells`]: what fits 120
/// terminal columns for IPv4 MHs (about 104). The phases, the handoff id and the
/// reason are in `--wide`; the id and the reason also on a second line under a handoff
/// that did not simply move.
const NARROW: [(usize, Column); 9] = [
    (0, Column::left("time (UTC)", 24)),
    (1, Column::left("mh", 10)),
    (2, Column::left("role", 4)),
    (3, Column::left("old → new", 11)),
    (4, Column::left("outcome", 7)),
    (5, Column::right("moved", 5)),
    (6, Column::right("failed", 6)),
    (7, Column::right("bytes", 9)),
    (13, Column::right("total ms", 8)),
];

fn narrow_columns() -> Vec<Column> {
    NARROW.iter().map(|(_, c)| *c).collect()
}

fn narrow_cells(e: &Entry) -> Vec<String> {
    let all = view::cells(e);
    NARROW.iter().map(|(i, _)| all[*i].clone()).collect()
}

/// The second line of a handoff in the default table: its id and why it did not
/// simply move, wrapped to the table's width.
fn narrow_reason(e: &Entry) -> Vec<String> {
    let Some(r) = e.reason().filter(|r| !r.is_empty()) else {
        return Vec::new();
    };
    // Continuation lines indented under the text, past the arrow.
    let mut lines = table::wrap(&format!("handoff {}: {r}", e.handoff_id()), 4, table::WIDTH);
    if let Some(first) = lines.first_mut() {
        *first = format!("  ↳ {}", first.trim_start());
    }
    lines
}

/// The default table of these entries.
fn narrow_render(entries: &[Entry]) -> String {
    let cols = narrow_columns();
    let rows: Vec<Vec<String>> = entries.iter().map(narrow_cells).collect();
    let widths = table::widths(&cols, &rows);
    let mut s = table::header(&cols, &widths) + "\n";
    for (e, r) in entries.iter().zip(&rows) {
        s += &table::line(&cols, r, &widths);
        s.push('\n');
        for l in narrow_reason(e) {
            s += &l;
            s.push('\n');
        }
    }
    s
}

/// Prints handoffs as a table (default or `--wide`) or JSON lines.
struct Printer {
    json: bool,
    wide: bool,
    filter: Filter,
}

impl Printer {
    fn header(&self) -> io::Result<()> {
        let line = match (self.json, self.wide) {
            (true, _) => return Ok(()),
            (false, true) => view::header_line(),
            (false, false) => {
                let cols = narrow_columns();
                table::header(&cols, &table::min_widths(&cols))
            }
        };
        writeln!(io::stdout().lock(), "{line}")
    }

    /// One handoff as it comes (`--follow`), at the columns' minimum widths.
    fn one(&self, e: &Entry) -> io::Result<()> {
        if !e.selected(&self.filter) {
            return Ok(());
        }
        let mut out = io::stdout().lock();
        match (self.json, self.wide) {
            (true, _) => writeln!(out, "{}", view::json_line(e)),
            (false, true) => writeln!(out, "{}", view::row_line(e)),
            (false, false) => {
                let cols = narrow_columns();
                let line = table::line(&cols, &narrow_cells(e), &table::min_widths(&cols));
                writeln!(out, "{line}")?;
                for l in narrow_reason(e) {
                    writeln!(out, "{l}")?;
                }
                Ok(())
            }
        }
    }

    /// A whole timeline: a table whose columns fit it.
    fn all(&self, entries: &[Entry]) -> io::Result<()> {
        let shown: Vec<Entry> = entries
            .iter()
            .filter(|e| e.selected(&self.filter))
            .cloned()
            .collect();
        let mut out = io::stdout().lock();
        if self.json {
            for e in &shown {
                writeln!(out, "{}", view::json_line(e))?;
            }
            Ok(())
        } else if self.wide {
            write!(out, "{}", view::render(&shown))
        } else {
            write!(out, "{}", narrow_render(&shown))
        }
    }
}

/// The records among newly read lines, with a warning for each line that is not one.
fn records_of(name: &str, events: Vec<TailEvent>) -> Vec<Record> {
    let mut out = Vec::new();
    for ev in events {
        match ev {
            TailEvent::Line { number, text } => match view::parse_line(&text) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(why) => eprintln!("itcpctl: {}", view::warning(name, number, &why)),
            },
            TailEvent::Truncated => eprintln!("itcpctl: {name}: truncated: reading from its start"),
            TailEvent::Reopened => eprintln!("itcpctl: {name}: rotated: reading the new file"),
        }
    }
    out
}

fn handoffs(o: &Opts, log: PathBuf) -> io::Result<()> {
    let files = if o.files.is_empty() {
        vec![log]
    } else {
        o.files.clone()
    };
    let p = Printer {
        json: o.json,
        wide: o.wide,
        filter: Filter {
            mh: o.mh,
            failed_only: o.failed,
            since_us: o.since_us,
            until_us: o.until_us,
        },
    };
    if !o.follow {
        let mut records = Vec::new();
        for f in &files {
            let name = f.display().to_string();
            let lines = tail::read_lines(f).map_err(|e| {
                let hint = if e.kind() == io::ErrorKind::NotFound {
                    "; has a handoff been logged there yet? (msrd creates the log at the first)"
                } else {
                    ""
                };
                io::Error::new(e.kind(), format!("{name}: {e}{hint}"))
            })?;
            let (r, bad) = view::parse_lines(&name, lines.iter().map(|(n, t)| (*n, t.as_str())));
            for b in bad {
                eprintln!("itcpctl: {b}");
            }
            records.extend(r);
        }
        return p.all(&view::merge(records));
    }
    follow(&p, files, o.until_us)
}

/// How many of the handoffs already logged `--follow` shows first, without `--since`.
const FOLLOW_BACKLOG: usize = 10;

/// What the followed logs got since the last poll (read errors are warnings: the
/// file may come back).
fn poll(tails: &mut [(String, Tail)]) -> Vec<Record> {
    let mut out = Vec::new();
    for (name, t) in tails.iter_mut() {
        match t.poll() {
            Ok(ev) => out.extend(records_of(name, ev)),
            Err(e) => eprintln!("itcpctl: {name}: {e}"),
        }
    }
    out
}

/// `--follow`: what the logs hold now, then each handoff as it is logged.
fn follow(p: &Printer, files: Vec<PathBuf>, until_us: Option<u64>) -> io::Result<()> {
    let mut tails: Vec<(String, Tail)> = files
        .into_iter()
        .map(|f| (f.display().to_string(), Tail::new(f)))
        .collect();
    let several = tails.len() > 1;
    let mut pairer = Pairer::new(if several { PAIR_WAIT_US } else { 0 });
    let first = poll(&mut tails);
    for (name, t) in &tails {
        if !t.is_open() {
            eprintln!("itcpctl: {name}: not there yet: waiting for it");
        }
    }
    p.header()?;
    // The logs as they are, as one timeline; a recent record whose pair may still
    // come waits for it.
    let now = now_us();
    let mut shown = Vec::new();
    for e in view::merge(first) {
        match (&e.old, &e.new) {
            (Some(r), None) | (None, Some(r))
                if several && now.saturating_sub(e.start_us()) < PAIR_WAIT_US =>
            {
                let _ = pairer.push(r.clone(), now);
            }
            _ => shown.push(e),
        }
    }
    // As `tail -f`: the last few, unless --since says from when.
    shown.retain(|e| e.selected(&p.filter));
    if p.filter.since_us.is_none() {
        shown.drain(..shown.len().saturating_sub(FOLLOW_BACKLOG));
    }
    for e in &shown {
        p.one(e)?;
    }
    loop {
        if until_us.is_some_and(|u| now_us() > u) {
            for e in pairer.drain() {
                p.one(&e)?;
            }
            return Ok(());
        }
        std::thread::sleep(FOLLOW_POLL);
        let now = now_us();
        for r in poll(&mut tails) {
            if let Some(e) = pairer.push(r, now) {
                p.one(&e)?;
            }
        }
        for e in pairer.expire(now) {
            p.one(&e)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> itcp_cli::Result<Opts> {
        parse(Args::new(&SPEC, a.iter().copied()))
    }

    #[test]
    fn table_and_parser_agree() {
        itcp_cli::check_table(&SPEC, parse);
        let o = p(&["--socket", "/s", "sessions", "--json"]).unwrap();
        assert_eq!(
            (o.socket.as_deref(), o.cmd.as_str(), o.json),
            (Some("/s"), "sessions", true)
        );
        let o = p(&["handoffs", "--mh", "10.2.0.100", "--failed", "--log", "/l"]).unwrap();
        assert_eq!(o.mh, Some("10.2.0.100".parse().unwrap()));
        assert!(o.failed && o.log == Some("/l".into()));
        let o = p(&[
            "handoffs",
            "a.jsonl",
            "--since",
            "2025-03-01T14:05:00Z",
            "--until=10m",
            "b.jsonl",
            "--follow",
        ])
        .unwrap();
        assert_eq!(o.files, [PathBuf::from("a.jsonl"), "b.jsonl".into()]);
        assert_eq!(o.since_us, Some(1_740_837_900_000_000));
        let ago = now_us() - o.until_us.unwrap();
        assert!((600_000_000..610_000_000).contains(&ago), "{ago}");
        assert!(o.follow);
        let err = |args: &[&str]| match p(args) {
            Err(itcp_cli::Stop::Usage(m, _)) => m,
            other => panic!("{args:?}: {other:?}"),
        };
        assert_eq!(
            err(&["handoffs", "--since", "yesterday"]),
            format!(
                "--since: \"yesterday\" is not a time: expected {}",
                time::FORMS
            )
        );
        assert_eq!(
            err(&["handoffs", "--until", "2025-02-30"]),
            "--until: \"2025-02-30\" is not a time: day \"30\" is not 1-28"
        );
        assert!(err(&["handoffs", "--since", "1h", "--until", "2h"]).starts_with("--since 20"));
        assert!(p(&["sessions", "a.jsonl"]).is_err());
        assert!(p(&["sessions", "--since", "1h"]).is_err());
        // Command options belong to their command.
        assert!(p(&["sessions", "--mh", "10.2.0.100"]).is_err());
        assert!(p(&["--json", "sessions"]).is_err());
        assert!(p(&["handoffs", "--mh", "nope"]).is_err());
        let o = p(&["upgrade", "--json", "--config", "/c"]).unwrap();
        assert!(o.cmd == "upgrade" && o.json && o.config.as_deref() == Some("/c"));
        assert!(p(&["bogus"]).is_err());
        assert!(p(&["sessions", "stats"]).is_err());
        assert!(p(&[]).is_err());
    }
}
