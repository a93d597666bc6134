//! `itcpctl`: the operator's view of a running msrd.
//!
//! ```text
//! itcpctl [--socket PATH | --config FILE] sessions [--json]
//! itcpctl [--socket PATH | --config FILE] stats [--json]
//! itcpctl [--socket PATH | --config FILE] metrics
//! itcpctl [--log FILE | --config FILE] handoffs [--mh ADDR] [--failed] [--json]
//! ```
//!
//! `handoffs` reads the handoff log (`[handoff] log_file`), not the daemon: it works
//! whether or not msrd is running.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use itcp_proto::control::{Body, Reply, Request};

const USAGE: &str = "usage: itcpctl [--socket PATH | --config MSRD.toml] (sessions [--json] | stats [--json] | metrics)
       itcpctl [--log FILE | --config MSRD.toml] handoffs [--mh ADDR] [--failed] [--json]
  --socket PATH   msrd's control socket (default /run/msrd/control.sock)
  --config FILE   take the control socket and handoff log from msrd's config file
  --log FILE      the handoff log (default /var/log/itcp/handoffs.jsonl)
  --mh ADDR       only handoffs of this mobile host
  --failed        only handoffs that did not move everything";

fn main() -> ExitCode {
    match run() {
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
        Body::Error(e) => eprintln!("itcpctl: {}", e.error),
    }
}

fn run() -> Result<(), String> {
    let mut socket = "/run/msrd/control.sock".to_string();
    let mut log = std::path::PathBuf::from("/var/log/itcp/handoffs.jsonl");
    let mut filter = itcp_handoff::log::Filter::default();
    let mut cmd = None;
    let mut as_json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next().ok_or("--socket needs a path")?,
            "--config" => {
                let f = args.next().ok_or("--config needs a file")?;
                let cfg = itcp_config::MsrdConfig::load(&f).map_err(|e| e.to_string())?;
                socket = cfg.msr.control_socket.display().to_string();
                log = cfg.handoff.log_file.clone();
            }
            "--log" => log = args.next().ok_or("--log needs a file")?.into(),
            "--mh" => {
                let a = args.next().ok_or("--mh needs an address")?;
                filter.mh = Some(
                    a.parse()
                        .map_err(|_| format!("--mh {a:?} is not an address"))?,
                );
            }
            "--failed" => filter.failed_only = true,
            "--json" => as_json = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "sessions" | "stats" | "metrics" | "handoffs" if cmd.is_none() => cmd = Some(a),
            _ => return Err(format!("unexpected argument {a:?}\n{USAGE}")),
        }
    }
    let cmd = cmd.ok_or(format!("which command?\n{USAGE}"))?;
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
        _ => Request::Sessions,
    };
    print_reply(request(&socket, req)?, as_json);
    Ok(())
}
