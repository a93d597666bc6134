//! `ttcp`: seeded-stream traffic tool (see `itcp_testbed::ttcp`).
//!
//! Exit status: 0 ok, 1 transfer failed ("ttcp: <error>" on stderr), 2 usage error.

use std::net::SocketAddr;
use std::process::ExitCode;

use itcp_testbed::ttcp::{self, EchoOpts, Endpoint, Opts, RrOpts};

const USAGE: &str = "\
usage:
  ttcp send (--connect ADDR:PORT | --listen ADDR:PORT) (--bytes N | --duration SECS)
            [--seed S] [--buf BYTES] [--cc NAME] [--nodelay] [--chunk BYTES]
            [--connect-timeout SECS] [--corrupt-at OFFSET] [--itcp] [--json FILE]
  ttcp recv (--connect ADDR:PORT | --listen ADDR:PORT) [--bytes N] [--seed S]
            [--buf BYTES] [--cc NAME] [--nodelay] [--chunk BYTES] [--no-verify]
            [--connect-timeout SECS] [--itcp] [--json FILE]
  ttcp echo --listen ADDR:PORT [--once] [--buf BYTES] [--cc NAME]
  ttcp rr   --connect ADDR:PORT [--count N] [--size BYTES] [--interval-ms MS]
            [--seed S] [--connect-timeout SECS] [--json FILE]

Sizes take binary suffixes K, M, G, T (16K = 16384). send/recv/rr print one JSON
report line on stdout (and write it to --json FILE). A listener prints
'ttcp: listening on ADDR:PORT' on stderr once bound (port 0 picks a free one).
--itcp opens the connection through the MH's I-TCP gateway (mh-lib; gateway from
ITCP_GATEWAY or the default route).
Exit status: 0 ok, 1 transfer failed, 2 usage error.";

struct UsageError(String);

type Res<T> = Result<T, UsageError>;

fn usage_err<T>(msg: impl Into<String>) -> Res<T> {
    Err(UsageError(msg.into()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(UsageError(msg)) => {
            eprintln!("ttcp: {msg}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Command-line flags of one invocation.
struct Args<'a> {
    role: &'a str,
    rest: std::slice::Iter<'a, String>,
}

impl<'a> Args<'a> {
    /// Next flag and its inline `=value`, if any.
    fn next_flag(&mut self) -> Res<Option<(&'a str, Option<&'a str>)>> {
        let Some(a) = self.rest.next() else {
            return Ok(None);
        };
        if !a.starts_with('-') {
            return usage_err(format!(
                "unexpected argument '{a}' for 'ttcp {}'",
                self.role
            ));
        }
        Ok(Some(match a.split_once('=') {
            Some((f, v)) if a.starts_with("--") => (f, Some(v)),
            _ => (a.as_str(), None),
        }))
    }

    fn value(&mut self, flag: &str, inline: Option<&'a str>) -> Res<&'a str> {
        if let Some(v) = inline {
            return Ok(v);
        }
        match self.rest.next() {
            Some(v) => Ok(v),
            None => usage_err(format!("{flag} needs a value")),
        }
    }

    fn unknown<T>(&self, flag: &str) -> Res<T> {
        usage_err(format!("unknown flag '{flag}' for 'ttcp {}'", self.role))
    }
}

fn no_value(flag: &str, inline: Option<&str>) -> Res<()> {
    match inline {
        Some(_) => usage_err(format!("{flag} takes no value")),
        None => Ok(()),
    }
}

fn parse_size(flag: &str, s: &str) -> Res<u64> {
    let bad = || {
        UsageError(format!(
            "invalid value '{s}' for {flag}: expected a number with optional suffix K, M, G or T"
        ))
    };
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    n.checked_mul(mult).ok_or_else(bad)
}

fn parse_usize(flag: &str, s: &str) -> Res<usize> {
    let n = parse_size(flag, s)?;
    usize::try_from(n).map_err(|_| UsageError(format!("invalid value '{s}' for {flag}: too large")))
}

fn parse_positive(flag: &str, s: &str) -> Res<usize> {
    match parse_usize(flag, s)? {
        0 => usage_err(format!("invalid value '{s}' for {flag}: must be positive")),
        n => Ok(n),
    }
}

fn parse_u64(flag: &str, s: &str) -> Res<u64> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| {
        UsageError(format!(
            "invalid value '{s}' for {flag}: expected an unsigned integer"
        ))
    })
}

fn parse_secs(flag: &str, s: &str) -> Res<f64> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => usage_err(format!(
            "invalid value '{s}' for {flag}: expected a non-negative number"
        )),
    }
}

fn parse_addr(flag: &str, s: &str) -> Res<SocketAddr> {
    s.parse().map_err(|_| {
        UsageError(format!(
            "invalid value '{s}' for {flag}: expected ADDR:PORT (e.g. 10.0.0.1:5001 or [fd00::1]:5001)"
        ))
    })
}

fn set_endpoint(ep: &mut Option<Endpoint>, new: Endpoint) -> Res<()> {
    if ep.is_some() {
        return usage_err("give exactly one of --connect and --listen");
    }
    *ep = Some(new);
    Ok(())
}

fn run(args: &[String]) -> Res<ExitCode> {
    let Some(role) = args.first() else {
        return usage_err("missing command (send, recv, echo or rr)");
    };
    let mut a = Args {
        role,
        rest: args[1..].iter(),
    };
    match role.as_str() {
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        "send" | "recv" => send_recv(&mut a),
        "echo" => echo(&mut a),
        "rr" => rr(&mut a),
        other => usage_err(format!(
            "unknown command '{other}' (expected send, recv, echo or rr)"
        )),
    }
}

fn help_requested(args: &[String]) -> bool {
    args.iter().any(|a| a == "-h" || a == "--help")
}

fn send_recv(a: &mut Args) -> Res<ExitCode> {
    if help_requested(a.rest.as_slice()) {
        println!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    let send = a.role == "send";
    let mut ep = None;
    let mut o = Opts::new(Endpoint::Connect(([0, 0, 0, 0], 0).into()));
    let mut json = None;
    while let Some((flag, inline)) = a.next_flag()? {
        match flag {
            "--connect" => set_endpoint(
                &mut ep,
                Endpoint::Connect(parse_addr(flag, a.value(flag, inline)?)?),
            )?,
            "--listen" => set_endpoint(
                &mut ep,
                Endpoint::Listen(parse_addr(flag, a.value(flag, inline)?)?),
            )?,
            "--bytes" => o.bytes = Some(parse_size(flag, a.value(flag, inline)?)?),
            "--seed" => o.seed = parse_u64(flag, a.value(flag, inline)?)?,
            "--buf" => o.buf = Some(parse_positive(flag, a.value(flag, inline)?)?),
            "--cc" => o.cc = Some(a.value(flag, inline)?.to_string()),
            "--nodelay" => {
                no_value(flag, inline)?;
                o.nodelay = true
            }
            "--chunk" => o.chunk = parse_positive(flag, a.value(flag, inline)?)?,
            "--connect-timeout" => o.connect_timeout = parse_secs(flag, a.value(flag, inline)?)?,
            "--json" => json = Some(a.value(flag, inline)?.to_string()),
            "--itcp" => {
                no_value(flag, inline)?;
                o.itcp = true
            }
            "--duration" if send => {
                let v = a.value(flag, inline)?;
                let d = parse_secs(flag, v)?;
                if d == 0.0 {
                    return usage_err(format!("invalid value '{v}' for {flag}: must be positive"));
                }
                o.duration = Some(d)
            }
            "--corrupt-at" if send => {
                o.corrupt_at = Some(parse_size(flag, a.value(flag, inline)?)?)
            }
            "--no-verify" if !send => {
                no_value(flag, inline)?;
                o.verify = false
            }
            _ => return a.unknown(flag),
        }
    }
    let Some(ep) = ep else {
        return usage_err(format!(
            "ttcp {}: one of --connect or --listen is required",
            a.role
        ));
    };
    o.endpoint = ep;
    if send && o.bytes.is_none() && o.duration.is_none() {
        return usage_err("ttcp send: one of --bytes or --duration is required");
    }
    let announce = |addr: SocketAddr| eprintln!("ttcp: listening on {addr}");
    let (line, err) = if send {
        let r = ttcp::run_send_with(&o, announce);
        (serde_json::to_string(&r), r.error)
    } else {
        let r = ttcp::run_recv_with(&o, announce);
        (serde_json::to_string(&r), r.error)
    };
    Ok(finish(line, err, json.as_deref()))
}

/// Prints the report line (and writes it to `json`), the error on stderr; exit code.
fn finish(line: serde_json::Result<String>, err: Option<String>, json: Option<&str>) -> ExitCode {
    let line = match line {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ttcp: serializing the report: {e}");
            return ExitCode::from(1);
        }
    };
    println!("{line}");
    let mut code = 0u8;
    if let Some(path) = json {
        if let Err(e) = std::fs::write(path, format!("{line}\n")) {
            eprintln!("ttcp: writing {path}: {e}");
            code = 1;
        }
    }
    if let Some(e) = err {
        eprintln!("ttcp: {e}");
        code = 1;
    }
    ExitCode::from(code)
}

fn echo(a: &mut Args) -> Res<ExitCode> {
    if help_requested(a.rest.as_slice()) {
        println!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut listen = None;
    let mut once = false;
    let mut buf = None;
    let mut cc = None;
    while let Some((flag, inline)) = a.next_flag()? {
        match flag {
            "--listen" => listen = Some(parse_addr(flag, a.value(flag, inline)?)?),
            "--once" => {
                no_value(flag, inline)?;
                once = true
            }
            "--buf" => buf = Some(parse_positive(flag, a.value(flag, inline)?)?),
            "--cc" => cc = Some(a.value(flag, inline)?.to_string()),
            _ => return a.unknown(flag),
        }
    }
    let Some(listen) = listen else {
        return usage_err("ttcp echo: --listen is required");
    };
    let o = EchoOpts {
        listen,
        once,
        buf,
        cc,
    };
    match ttcp::run_echo_with(&o, |addr| eprintln!("ttcp: listening on {addr}")) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("ttcp: echo: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn rr(a: &mut Args) -> Res<ExitCode> {
    if help_requested(a.rest.as_slice()) {
        println!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut o = RrOpts::new(([0, 0, 0, 0], 0).into());
    let mut addr = None;
    let mut json = None;
    while let Some((flag, inline)) = a.next_flag()? {
        match flag {
            "--connect" => addr = Some(parse_addr(flag, a.value(flag, inline)?)?),
            "--count" => {
                let v = a.value(flag, inline)?;
                o.count = parse_u64(flag, v)?;
                if o.count == 0 {
                    return usage_err(format!("invalid value '{v}' for {flag}: must be positive"));
                }
            }
            "--size" => o.size = parse_positive(flag, a.value(flag, inline)?)?,
            "--interval-ms" => o.interval_ms = parse_secs(flag, a.value(flag, inline)?)?,
            "--seed" => o.seed = parse_u64(flag, a.value(flag, inline)?)?,
            "--connect-timeout" => o.connect_timeout = parse_secs(flag, a.value(flag, inline)?)?,
            "--json" => json = Some(a.value(flag, inline)?.to_string()),
            _ => return a.unknown(flag),
        }
    }
    let Some(addr) = addr else {
        return usage_err("ttcp rr: --connect is required");
    };
    o.addr = addr;
    let r = ttcp::run_rr(&o);
    Ok(finish(
        serde_json::to_string(&r),
        r.error.clone(),
        json.as_deref(),
    ))
}
