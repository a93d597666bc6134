//! `itcp-mh-agent`: the MH's mobility agent. Listens to MSR beacons, moves with the
//! chosen policy, greets the new MSR and repoints the gateway; prints one JSON event
//! per line on stdout (attached, moved, move_failed, refused, lost).
//!
//! ```text
//! itcp-mh-agent --interface air0 --mh 10.2.0.100 [--gateway 10.2.0.1]
//!               [--policy eager|lazy] [--hysteresis-ms 2000] [--beacon-interval-ms 1000]
//!               [--beacon-port 4345] [--greet-port 4346] [--token-file PATH]
//! ```
//! The gateway defaults to the default route's; the token comes from `--token-file`,
//! `ITCP_TOKEN`, `ITCP_TOKEN_FILE` or `/run/itcp-mh/token` (as for applications).

use std::io::Write;
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use itcp_mh::agent::{Agent, AgentConfig};
use itcp_mh::mobility::Policy;
use itcp_mh::MhOptions;

fn usage(msg: &str) -> ExitCode {
    eprintln!("itcp-mh-agent: {msg}");
    eprintln!("usage: itcp-mh-agent --interface IF --mh ADDR [--gateway ADDR] [--policy eager|lazy] [--hysteresis-ms N] [--beacon-interval-ms N] [--beacon-port N] [--greet-port N] [--token-file PATH]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |name: &str| -> Option<String> {
        let i = args.iter().position(|a| a == name)?;
        args.get(i + 1).cloned()
    };
    let Some(interface) = get("--interface") else {
        return usage("--interface is required");
    };
    let Some(mh) = get("--mh").and_then(|s| s.parse::<IpAddr>().ok()) else {
        return usage("--mh ADDR (the MH's address) is required");
    };
    let mut opts = MhOptions::new();
    if let Some(f) = get("--token-file") {
        opts = opts.token_file(f);
    }
    let gateway = match get("--gateway") {
        Some(g) => match g.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => return usage(&format!("--gateway {g:?} is not an address")),
        },
        None => match opts.resolve_gateway() {
            Ok(sa) => sa.ip(),
            Err(e) => return usage(&e.to_string()),
        },
    };
    let token = match opts.resolve_token() {
        Ok(t) => t,
        Err(e) => return usage(&format!("session token: {e}")),
    };
    let mut cfg = AgentConfig::new(&interface, mh, gateway, token);
    let num = |v: Option<String>, name: &str| -> Result<Option<u64>, ExitCode> {
        v.map(|s| {
            s.parse::<u64>()
                .map_err(|_| usage(&format!("{name} {s:?} is not a number")))
        })
        .transpose()
    };
    match get("--policy").as_deref() {
        None | Some("eager") => cfg.policy = Policy::Eager,
        Some("lazy") => cfg.policy = Policy::Lazy,
        Some(p) => return usage(&format!("--policy {p:?}: expected eager or lazy")),
    }
    let parsed = (|| -> Result<(), ExitCode> {
        if let Some(v) = num(get("--hysteresis-ms"), "--hysteresis-ms")? {
            cfg.hysteresis = Duration::from_millis(v);
        }
        if let Some(v) = num(get("--beacon-interval-ms"), "--beacon-interval-ms")? {
            cfg.beacon_interval = Duration::from_millis(v.max(1));
        }
        if let Some(v) = num(get("--beacon-port"), "--beacon-port")? {
            cfg.beacon_port = v as u16;
        }
        if let Some(v) = num(get("--greet-port"), "--greet-port")? {
            cfg.greet_port = v as u16;
        }
        Ok(())
    })();
    if let Err(c) = parsed {
        return c;
    }
    let mut agent = match Agent::new(cfg) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("itcp-mh-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stop = AtomicBool::new(false);
    let r = agent.run(&stop, |ev| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&ev).expect("events serialize")
        );
        let _ = out.flush();
    });
    if let Err(e) = r {
        eprintln!("itcp-mh-agent: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
