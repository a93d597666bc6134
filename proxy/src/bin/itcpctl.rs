//! `itcpctl`: the operator's view of a running msrd.
//!
//! ```text
//! itcpctl [--socket PATH | --config FILE] sessions [--json]
//! itcpctl [--socket PATH | --config FILE] stats [--json]
//! itcpctl [--socket PATH | --config FILE] metrics
//! itcpctl [--socket PATH | --config FILE] upgrade [--json]
//! itcpctl [--log FILE | --config FILE] handoffs [--mh ADDR] [--failed] [--json]
//! ```
//!
//! `handoffs` reads the handoff log (`[handoff] log_file`), not the daemon: it works
//! whether or not msrd is running. The command line is the table [`SPEC`] (also
//! `--help` and the man page).

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;

use itcp_cli::{Arg, Args, Command, Flag, Section, Spec};
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
        "[--log FILE | --config FILE] handoffs [--mh ADDR] [--failed] [--json]",
    ],
    description: "\
itcpctl asks a running msrd(1) over its control socket for its relayed connections
(sessions), its counters (stats) or its Prometheus metrics (metrics), tells it to
replace itself by a new process of its binary without losing a connection (upgrade),
and reads the handoff log that msrd writes (handoffs), whether or not msrd is running.

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
            synopsis: "[--mh ADDR] [--failed] [--json]",
            about: "The handoff log as a table (or JSON lines): when, which MH, from which MSR \
                    to which, how many connections moved, how long it took.",
            flags: &[
                Flag::value("mh", "ADDR", "Only handoffs of the MH with this address."),
                Flag::switch(
                    "failed",
                    "Only handoffs that did not move every connection.",
                ),
                Flag::switch("json", "One JSON record per line, as in the log."),
            ],
        },
    ],
    sections: &[
        Section {
            title: "FILES",
            body: "\
  /run/msrd/control.sock            the control socket
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
  itcpctl sessions
  itcpctl --config /etc/itcp/msrd.toml stats --json
  itcpctl --config /etc/itcp/msrd.toml upgrade
  itcpctl handoffs --mh 10.2.0.100 --failed",
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
}

fn parse(mut a: Args) -> itcp_cli::Result<Opts> {
    let mut o = Opts::default();
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("socket") => o.socket = Some(a.value("socket")?),
            Arg::Flag("config") => o.config = Some(a.value("config")?),
            Arg::Flag("log") => o.log = Some(a.value("log")?.into()),
            Arg::Flag("mh") => o.mh = Some(a.parse("mh", "an IP address")?),
            Arg::Flag("failed") => o.failed = true,
            Arg::Flag("json") => o.json = true,
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
                let state = match (r.frozen, r.moved_in) {
                    (true, _) => "frozen (handoff)",
                    (false, true) => "moved in",
                    _ => "",
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
    let socket = o.socket.unwrap_or(socket);
    let log = o.log.unwrap_or(log);
    let filter = itcp_handoff::log::Filter {
        mh: o.mh,
        failed_only: o.failed,
    };
    let (cmd, as_json) = (o.cmd, o.json);
    if cmd == "handoffs" {
        let (records, bad) = itcp_handoff::log::read(&log, &filter).map_err(|e| e.to_string())?;
        for b in &bad {
            eprintln!("itcpctl: skipped a line that is not a handoff record: {b}");
        }
        if as_json {
            for r in &records {
                println!("{}", serde_json::to_string(r).unwrap());
            }
        } else {
            print!("{}", itcp_handoff::log::render(&records));
        }
        return Ok(());
    }
    let req = match cmd.as_str() {
        "stats" => Request::Stats,
        "metrics" => Request::Metrics,
        "upgrade" => Request::Upgrade,
        _ => Request::Sessions,
    };
    print_reply(request(&socket, req)?, as_json);
    Ok(())
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
