//! `itcp-mh-agent`: the MH's mobility agent. Listens to MSR beacons, moves with the
//! chosen policy, greets the new MSR and repoints the gateway; prints one JSON event
//! per line on stdout (attached, moved, move_failed, refused, lost, regained,
//! other_address, registered, register_failed).
//!
//! ```text
//! itcp-mh-agent --interface air0 --mh 10.2.0.100 [--config /etc/itcp/mh.toml]
//!               [--gateway 10.2.0.1] [--policy eager|lazy] [--hysteresis-ms 2000]
//!               [--beacon-interval-ms 1000] [--beacon-port 4345] [--greet-port 4346]
//!               [--token-file PATH] [--no-solicit] [--no-register]
//! ```
//! The gateway defaults to the config file's, else the default route's; the token comes
//! from `--token-file`, the config file's `token_file`, `ITCP_TOKEN`, `ITCP_TOKEN_FILE`
//! or `/run/itcp-mh/token` (as for applications). The command line is the table
//! [`SPEC`] (also `--help` and the man page).

use std::io::Write;
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use itcp_cli::{Arg, Args, Flag, Section, Spec};
use itcp_config::{MhConfig, MobilityPolicy};
use itcp_mh::agent::{Agent, AgentConfig};
use itcp_mh::mobility::Policy;
use itcp_mh::MhOptions;

static SPEC: Spec = Spec {
    name: "itcp-mh-agent",
    version: env!("CARGO_PKG_VERSION"),
    about: "the mobility agent of an I-TCP mobile host",
    synopsis: &["--interface IF --mh ADDR [--config FILE] [--gateway ADDR]
[--policy eager|lazy] [--hysteresis-ms MS] [--beacon-interval-ms MS]
[--beacon-port PORT] [--greet-port PORT] [--token-file PATH] [--no-solicit]
[--no-register]"],
    description: "\
itcp-mh-agent runs on a mobile host (MH). It listens on its wireless interface for the
beacons of the mobility support routers (MSRs), chooses a cell with the given policy,
greets the new cell's MSR (which then fetches the MH's connections from the old one)
and points the MH's route to the I-TCP gateway at it.

It does not wait for the next beacon when the interface associates with a cell: it
watches the interface's carrier (rtnetlink) and, when it comes up, broadcasts a
solicitation to the MSRs' greeting port at once and twice more 20 ms apart unless a
beacon arrives first; the MSRs in the cell answer with their beacon at once. It also
solicits when it starts on an interface that has carrier.

Each time an MSR answers that the MH is attached to it (with nothing moved), the
agent registers the MH's session token there (a SOCKS request from each of the MH's
addresses to the gateway's port). Then its greetings prove every connection the MH has
at that MSR, also those the MSR intercepted (transparent mode) or a SOCKS client
without the I-TCP method opened, and those connections move with the MH.

It prints one JSON object per line on stdout for each event: attached, moved,
move_failed, refused, lost, regained, registered, register_failed; for a dual-stack
MH, other_address reports the outcome of the greeting for its second address. Applications reach the gateway with the MH
library (libitcp, itcp.h) or through the LD_PRELOAD shim; they and the agent share the
MH's session token, which lets the MSRs recognise the MH after a move.

Options given on the command line win over the configuration file (--config); the
configuration file wins over the built-in defaults.",
    flags: &[
        Flag::value(
            "interface",
            "IF",
            "The wireless interface beacons arrive on (required).",
        ),
        Flag::value(
            "mh",
            "ADDR",
            "The MH's own address, the one its connections use (required). A dual-stack MH \
             gives it twice, its IPv4 and its IPv6 address: both are greeted at every move, \
             so the connections of both families move.",
        ),
        Flag::value(
            "config",
            "FILE",
            "Read defaults from an MH configuration file (/etc/itcp/mh.toml): the gateway and \
             token file of [mh], and beacon_port, policy and hysteresis_ms of [mobility].",
        ),
        Flag::value(
            "gateway",
            "ADDR",
            "The cell gateway address every MSR shares. Default: the configuration file's \
             [mh] gateway, else the default route's gateway. A dual-stack MH may give it \
             twice, its IPv4 and its IPv6 address: both are pointed at the MSR at every \
             move (the first given is the main one).",
        ),
        Flag::value(
            "policy",
            "eager|lazy",
            "eager: move as soon as a new MSR's beacon is heard (default); lazy: stay until \
             the current MSR's beacons stop.",
        ),
        Flag::value(
            "hysteresis-ms",
            "MS",
            "No eager move sooner than this after the last one (default 2000).",
        ),
        Flag::value(
            "beacon-interval-ms",
            "MS",
            "The MSRs' beacon interval, at least 1 (default 1000); an MSR not heard for \
             three intervals is lost.",
        ),
        Flag::value(
            "beacon-port",
            "PORT",
            "UDP port the beacons arrive on (default 4345).",
        ),
        Flag::value(
            "greet-port",
            "PORT",
            "UDP port of the MSRs' greeting service (default 4346).",
        ),
        Flag::value(
            "token-file",
            "PATH",
            "Read (or create) the MH session token in this file.",
        ),
        Flag::switch(
            "no-solicit",
            "Do not solicit a beacon when the interface's carrier comes up: wait for the \
             MSRs' periodic beacons (up to a beacon interval after each move).",
        ),
        Flag::switch(
            "no-register",
            "Do not register the session token at the MSRs: only connections opened \
             through the MH library or the LD_PRELOAD shim then move with the MH's \
             greetings; others move only in cells with network detection.",
        ),
    ],
    commands: &[],
    sections: &[
        Section {
            title: "ENVIRONMENT",
            body: "\
  ITCP_GATEWAY      the gateway, when neither --gateway nor --config gives one
  ITCP_TOKEN        the session token (32 hex digits), unless a token file is given
  ITCP_TOKEN_FILE   the token file, unless --token-file or --config gives one",
        },
        Section {
            title: "FILES",
            body: "\
  /etc/itcp/mh.toml         the MH configuration (--config)
  /etc/itcp/mh-agent.env    the systemd unit's options (ITCP_AGENT_ARGS)
  /run/itcp-mh/token        the default session token file",
        },
        Section {
            title: "EXIT STATUS",
            body: "0 when stopped, 1 when the agent cannot start (no gateway, no token, no \
                   interface) or fails, 2 on a usage error.",
        },
        Section {
            title: "EXAMPLES",
            body: "\
  itcp-mh-agent --interface wlan0 --mh 10.2.0.100 --config /etc/itcp/mh.toml
  itcp-mh-agent --interface air0 --mh 10.2.0.100 --gateway 10.2.0.1 --policy lazy",
        },
        Section {
            title: "SEE ALSO",
            body: "msrd(1), itcpctl(1)",
        },
    ],
};

/// The command line, before the configuration file and the environment fill the gaps.
#[derive(Debug, Default, PartialEq)]
struct Opts {
    interface: String,
    mh: Vec<IpAddr>,
    config: Option<String>,
    gateway: Vec<IpAddr>,
    policy: Option<Policy>,
    hysteresis_ms: Option<u64>,
    beacon_interval_ms: Option<u64>,
    beacon_port: Option<u16>,
    greet_port: Option<u16>,
    token_file: Option<String>,
    no_solicit: bool,
    no_register: bool,
}

fn parse(mut a: Args) -> itcp_cli::Result<Opts> {
    let mut o = Opts::default();
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("interface") => o.interface = a.value("interface")?,
            Arg::Flag("mh") => {
                let ip: IpAddr = a.parse("mh", "an IP address")?;
                if o.mh.iter().any(|m| m.is_ipv4() == ip.is_ipv4()) {
                    return Err(a.usage("--mh: at most one IPv4 and one IPv6 address"));
                }
                o.mh.push(ip);
            }
            Arg::Flag("config") => o.config = Some(a.value("config")?),
            Arg::Flag("gateway") => {
                let ip: IpAddr = a.parse("gateway", "an IP address")?;
                if o.gateway.iter().any(|g| g.is_ipv4() == ip.is_ipv4()) {
                    return Err(a.usage("--gateway: at most one IPv4 and one IPv6 address"));
                }
                o.gateway.push(ip);
            }
            Arg::Flag("policy") => {
                o.policy = Some(match a.choice("policy", &["eager", "lazy"])? {
                    "lazy" => Policy::Lazy,
                    _ => Policy::Eager,
                })
            }
            Arg::Flag("hysteresis-ms") => o.hysteresis_ms = Some(a.int("hysteresis-ms")?),
            Arg::Flag("beacon-interval-ms") => {
                o.beacon_interval_ms = Some(a.int_in("beacon-interval-ms", 1, u64::MAX as i128)?)
            }
            Arg::Flag("beacon-port") => o.beacon_port = Some(a.port("beacon-port")?),
            Arg::Flag("greet-port") => o.greet_port = Some(a.port("greet-port")?),
            Arg::Flag("token-file") => o.token_file = Some(a.value("token-file")?),
            Arg::Flag("no-solicit") => o.no_solicit = true,
            Arg::Flag("no-register") => o.no_register = true,
            other => return Err(a.unexpected(other)),
        }
    }
    if o.interface.is_empty() {
        return Err(a.usage("--interface IF is required"));
    }
    if o.mh.is_empty() {
        return Err(a.usage("--mh ADDR (the MH's address) is required"));
    }
    Ok(o)
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("itcp-mh-agent: {msg}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let o = match parse(Args::from_env(&SPEC)) {
        Ok(o) => o,
        Err(stop) => return itcp_cli::exit(&SPEC, stop),
    };
    let file = match &o.config {
        Some(path) => match MhConfig::load(path) {
            Ok(c) => Some(c),
            Err(e) => return fail(e),
        },
        None => None,
    };
    let mut opts = match &file {
        Some(c) => MhOptions::from_config(c),
        None => MhOptions::new(),
    };
    if let Some(f) = &o.token_file {
        opts = opts.token_file(f);
    }
    // The gateway's port is the MSRs' SOCKS port, where the token is registered.
    let configured_port = file.as_ref().and_then(|c| c.mh.gateway).map(|g| g.port());
    let (gateway, socks_port) = match o.gateway.first() {
        Some(&ip) => (ip, configured_port.unwrap_or(1080)),
        None => match opts.resolve_gateway() {
            Ok(sa) => (sa.ip(), sa.port()),
            Err(e) => return fail(format!("{e} (or give --gateway)")),
        },
    };
    let token = match opts.resolve_token() {
        Ok(t) => t,
        Err(e) => return fail(format!("session token: {e}")),
    };
    // The main address is the gateway's family; the other one is greeted alongside.
    let (main, more): (Vec<IpAddr>, Vec<IpAddr>) =
        o.mh.iter()
            .partition(|m| m.is_ipv4() == gateway.is_ipv4() || o.mh.len() == 1);
    let mh = *main.first().unwrap_or(&o.mh[0]);
    let mut cfg = AgentConfig::new(&o.interface, mh, gateway, token);
    cfg.more_mh = more;
    cfg.more_gateways = o.gateway.iter().skip(1).copied().collect();
    if let Some(m) = file.as_ref().map(|c| &c.mobility) {
        cfg.beacon_port = m.beacon_port;
        cfg.hysteresis = m.hysteresis();
        cfg.policy = match m.policy {
            MobilityPolicy::Eager => Policy::Eager,
            MobilityPolicy::Lazy => Policy::Lazy,
        };
    }
    if let Some(p) = o.policy {
        cfg.policy = p;
    }
    if let Some(v) = o.hysteresis_ms {
        cfg.hysteresis = Duration::from_millis(v);
    }
    if let Some(v) = o.beacon_interval_ms {
        cfg.beacon_interval = Duration::from_millis(v);
    }
    if let Some(v) = o.beacon_port {
        cfg.beacon_port = v;
    }
    if let Some(v) = o.greet_port {
        cfg.greet_port = v;
    }
    cfg.solicit = !o.no_solicit;
    cfg.register_port = (!o.no_register).then_some(socks_port);
    let mut agent = match Agent::new(cfg) {
        Ok(a) => a,
        Err(e) => return fail(e),
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
        return fail(e);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use itcp_cli::Stop;

    fn p(a: &[&str]) -> itcp_cli::Result<Opts> {
        parse(Args::new(&SPEC, a.iter().copied()))
    }

    fn err(a: &[&str]) -> String {
        match p(a) {
            Err(Stop::Usage(m, _)) => m,
            other => panic!("{a:?}: {other:?}"),
        }
    }

    #[test]
    fn table_and_parser_agree() {
        itcp_cli::check_table(&SPEC, parse);
        let o = p(&[
            "--interface",
            "air0",
            "--mh",
            "10.2.0.100",
            "--policy",
            "lazy",
            "--beacon-port",
            "65535",
            "--hysteresis-ms",
            "0",
        ])
        .unwrap();
        assert_eq!(o.policy, Some(Policy::Lazy));
        assert_eq!((o.beacon_port, o.hysteresis_ms), (Some(65535), Some(0)));
        assert!(!o.no_solicit);
        let o = p(&["--interface", "air0", "--mh", "10.2.0.100", "--no-solicit"]).unwrap();
        assert!(o.no_solicit && !o.no_register);
        let o = p(&["--interface", "air0", "--mh", "10.2.0.100", "--no-register"]).unwrap();
        assert!(o.no_register);
        // A dual-stack MH: one address of each family.
        let o = p(&[
            "--interface",
            "air0",
            "--mh",
            "10.2.0.100",
            "--mh",
            "2001:db8:2::64",
        ])
        .unwrap();
        assert_eq!(o.mh.len(), 2);
        // ...and its gateway in both families, the first one the main one.
        let o = p(&[
            "--interface",
            "air0",
            "--mh",
            "10.2.0.100",
            "--gateway",
            "10.2.0.1",
            "--gateway",
            "2001:db8:2::1",
        ])
        .unwrap();
        let gws: Vec<String> = o.gateway.iter().map(|g| g.to_string()).collect();
        assert_eq!(gws, ["10.2.0.1", "2001:db8:2::1"]);
    }

    #[test]
    fn bad_values_and_unknown_flags_are_errors_naming_the_flag() {
        let base = ["--interface", "air0", "--mh", "10.2.0.100"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            err(&v)
        };
        assert_eq!(
            with(&["--beacon-port", "70000"]),
            "--beacon-port: 70000 is not a port (1-65535)"
        );
        assert_eq!(
            with(&["--greet-port", "0"]),
            "--greet-port: 0 is not a port (1-65535)"
        );
        assert_eq!(with(&["--frobnicate"]), "unknown flag --frobnicate");
        assert!(with(&["--beacon-interval-ms", "0"])
            .starts_with("--beacon-interval-ms: 0 is out of range"));
        assert!(with(&["--hysteresis-ms", "-5"]).starts_with("--hysteresis-ms: -5 is out of range"));
        assert!(
            with(&["--policy", "fast"]).starts_with("--policy: \"fast\" is not one of eager, lazy")
        );
        assert!(with(&["--gateway", "gw"]).starts_with("--gateway:"));
        assert!(with(&["--gateway", "10.2.0.1", "--gateway", "10.2.0.2"])
            .contains("at most one IPv4 and one IPv6"));
        assert_eq!(err(&["--mh", "10.2.0.100"]), "--interface IF is required");
        assert!(err(&["--interface", "air0", "--mh", "x"]).starts_with("--mh:"));
        assert!(with(&["--mh", "10.2.0.101"]).contains("at most one IPv4 and one IPv6"));
    }
}
