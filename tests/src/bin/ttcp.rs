//! `ttcp`: seeded-stream traffic tool (see `itcp_testbed::ttcp`).
//!
//! Exit status: 0 ok, 1 transfer failed ("ttcp: <error>" on stderr), 2 usage error.
//! The command line is the table [`SPEC`] (also `--help` and the man page).

use std::net::SocketAddr;
use std::process::ExitCode;

use itcp_cli::{Arg, Args, Command, Flag, Section, Spec};
use itcp_testbed::ttcp::{self, ChurnOpts, EchoOpts, Endpoint, Opts, RrOpts};

const CONNECT: Flag = Flag::value(
    "connect",
    "ADDR:PORT",
    "Connect to ADDR:PORT (retried while refused or unreachable, see --connect-timeout).",
);
const LISTEN: Flag = Flag::value(
    "listen",
    "ADDR:PORT",
    "Listen on ADDR:PORT and serve the first connection (port 0: any free port).",
);
const SEED: Flag = Flag::value(
    "seed",
    "S",
    "Seed of the byte stream, decimal or 0x hex (default 1); both ends must agree.",
);
const BUF: Flag = Flag::value(
    "buf",
    "BYTES",
    "SO_SNDBUF and SO_RCVBUF, set before connect or listen (default: autotuning).",
);
const CC: Flag = Flag::value("cc", "NAME", "TCP congestion control (TCP_CONGESTION).");
const NODELAY: Flag = Flag::switch("nodelay", "Set TCP_NODELAY.");
const CHUNK: Flag = Flag::value("chunk", "BYTES", "Read and write size (default 64K).");
const CONNECT_TIMEOUT: Flag = Flag::value(
    "connect-timeout",
    "SECS",
    "How long to keep retrying a refused or unreachable connect (default 10).",
);
const ITCP: Flag = Flag::switch(
    "itcp",
    "Open the connection through the MH's I-TCP gateway (mh-lib; gateway from ITCP_GATEWAY \
     or the default route). With --listen, the MSR listens on the MH's address (only the \
     port is used).",
);
const JSON: Flag = Flag::value("json", "FILE", "Also write the JSON report line to FILE.");

static SPEC: Spec = Spec {
    name: "ttcp",
    version: env!("CARGO_PKG_VERSION"),
    about: "seeded-stream TCP traffic tool of the I-TCP testbed",
    synopsis: &[],
    description: "\
ttcp sends and receives a seeded pseudo-random byte stream and verifies every byte at
the receiver, so a transfer through a proxy, a handoff or an emulated link is known to
be intact, not just complete. It also echoes and measures request-response latency.

Sizes take binary suffixes K, M, G, T (16K = 16384). send, recv and rr print one JSON
report line on stdout (and write it to --json FILE). A listener prints 'ttcp: listening
on ADDR:PORT' on stderr once bound (port 0 picks a free one).",
    flags: &[],
    commands: &[
        Command {
            name: "send",
            synopsis: "(--connect ADDR:PORT | --listen ADDR:PORT) (--bytes N | --duration SECS)
[--seed S] [--buf BYTES] [--cc NAME] [--nodelay] [--chunk BYTES]
[--connect-timeout SECS] [--corrupt-at OFFSET] [--itcp] [--json FILE]",
            about: "Send N bytes of the stream (or send for SECS seconds), then close.",
            flags: &[
                CONNECT,
                LISTEN,
                Flag::value("bytes", "N", "Bytes to send."),
                Flag::value(
                    "duration",
                    "SECS",
                    "Send for this long after the connection is up (instead of --bytes).",
                ),
                SEED,
                BUF,
                CC,
                NODELAY,
                CHUNK,
                CONNECT_TIMEOUT,
                Flag::value(
                    "corrupt-at",
                    "OFFSET",
                    "Fault injection: flip the byte at this stream offset.",
                ),
                ITCP,
                JSON,
            ],
        },
        Command {
            name: "recv",
            synopsis: "(--connect ADDR:PORT | --listen ADDR:PORT) [--bytes N] [--seed S]
[--buf BYTES] [--cc NAME] [--nodelay] [--chunk BYTES] [--no-verify]
[--connect-timeout SECS] [--itcp] [--json FILE]",
            about: "Receive the stream until the sender closes, verifying every byte.",
            flags: &[
                CONNECT,
                LISTEN,
                Flag::value(
                    "bytes",
                    "N",
                    "Bytes expected: fewer or more is a failure (default: any).",
                ),
                SEED,
                BUF,
                CC,
                NODELAY,
                CHUNK,
                Flag::switch("no-verify", "Only count the bytes."),
                CONNECT_TIMEOUT,
                ITCP,
                JSON,
            ],
        },
        Command {
            name: "echo",
            synopsis: "--listen ADDR:PORT [--once] [--buf BYTES] [--cc NAME]",
            about: "Echo every connection's bytes back to it.",
            flags: &[
                LISTEN,
                Flag::switch("once", "Serve one connection, then exit."),
                BUF,
                CC,
            ],
        },
        Command {
            name: "http",
            synopsis: "--listen ADDR:PORT [--seed S] [--buf BYTES] [--json FILE]",
            about: "Serve one HTTP/1.1 request for unmodified clients such as curl: GET /N \
                    answers with N bytes of the stream, PUT must carry the stream as its \
                    body (curl -T FILE) and is verified like recv. The report is send's \
                    for a GET, recv's for a PUT.",
            flags: &[LISTEN, SEED, BUF, JSON],
        },
        Command {
            name: "rr",
            synopsis: "--connect ADDR:PORT [--count N] [--size BYTES] [--interval-ms MS]
[--pipeline] [--warmup N] [--seed S] [--connect-timeout SECS] [--itcp] [--json FILE]",
            about: "Request-response latency against ttcp echo: COUNT exchanges of SIZE bytes.",
            flags: &[
                CONNECT,
                Flag::value("count", "N", "Number of exchanges (default 1000)."),
                Flag::value("size", "BYTES", "Request and response size (default 64)."),
                Flag::value("interval-ms", "MS", "Pause between exchanges (default 0)."),
                Flag::switch(
                    "pipeline",
                    "Send a request every --interval-ms without waiting for responses.",
                ),
                Flag::value(
                    "warmup",
                    "N",
                    "Leave the first N exchanges out of the statistics (default 0).",
                ),
                SEED,
                CONNECT_TIMEOUT,
                ITCP,
                JSON,
            ],
        },
        Command {
            name: "churn",
            synopsis: "--connect ADDR:PORT [--rate N] [--duration SECS] [--size BYTES] [--seed S]
[--timeout SECS] [--itcp] [--json FILE]",
            about: "Short connections against ttcp echo: RATE a second for SECS, each sending \
                    SIZE bytes, closing its half and checking the echo; a refused connect is a \
                    reset, never retried.",
            flags: &[
                CONNECT,
                Flag::value("rate", "N", "New connections per second (default 20)."),
                Flag::value(
                    "duration",
                    "SECS",
                    "How long to open connections (default 10).",
                ),
                Flag::value("size", "BYTES", "Bytes per connection (default 1000)."),
                SEED,
                Flag::value(
                    "timeout",
                    "SECS",
                    "Time one connection may take, connect to EOF (default 30).",
                ),
                ITCP,
                JSON,
            ],
        },
    ],
    sections: &[
        Section {
            title: "EXIT STATUS",
            body: "0 when the transfer is intact, 1 when it failed ('ttcp: ERROR' on stderr, \
                   and the report says why), 2 on a usage error.",
        },
        Section {
            title: "EXAMPLES",
            body: "\
  ttcp recv --listen 127.0.0.1:5001 --bytes 20M
  ttcp send --connect 127.0.0.1:5001 --bytes 20M --buf 16K",
        },
        Section {
            title: "SEE ALSO",
            body: "itcp-lab(1), airlink(1)",
        },
    ],
};

fn usage_err<T>(a: &Args, msg: impl Into<String>) -> itcp_cli::Result<T> {
    Err(a.usage(msg))
}

fn parse_size(a: &mut Args, flag: &str) -> itcp_cli::Result<u64> {
    let s = a.value(flag)?;
    let bad = |a: &Args| {
        a.usage(format!(
            "--{flag}: '{s}' is not a size (a number with optional suffix K, M, G or T)"
        ))
    };
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s.as_str(), 1),
    };
    let n: u64 = num.parse().map_err(|_| bad(a))?;
    n.checked_mul(mult).ok_or_else(|| bad(a))
}

fn parse_positive(a: &mut Args, flag: &str) -> itcp_cli::Result<usize> {
    match parse_size(a, flag)? {
        0 => usage_err(a, format!("--{flag}: must be positive")),
        n => usize::try_from(n).or_else(|_| usage_err(a, format!("--{flag}: {n} is too large"))),
    }
}

fn parse_u64(a: &mut Args, flag: &str) -> itcp_cli::Result<u64> {
    let s = a.value(flag)?;
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.or_else(|_| usage_err(a, format!("--{flag}: '{s}' is not an unsigned integer")))
}

fn parse_secs(a: &mut Args, flag: &str) -> itcp_cli::Result<f64> {
    let s = a.value(flag)?;
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => usage_err(a, format!("--{flag}: '{s}' is not a non-negative number")),
    }
}

fn parse_addr(a: &mut Args, flag: &str) -> itcp_cli::Result<SocketAddr> {
    let s = a.value(flag)?;
    s.parse().or_else(|_| {
        usage_err(
            a,
            format!("--{flag}: '{s}' is not ADDR:PORT (e.g. 10.0.0.1:5001 or [fd00::1]:5001)"),
        )
    })
}

fn set_endpoint(a: &Args, ep: &mut Option<Endpoint>, new: Endpoint) -> itcp_cli::Result<()> {
    if ep.is_some() {
        return usage_err(a, "give exactly one of --connect and --listen");
    }
    *ep = Some(new);
    Ok(())
}

/// What the command line asks for.
enum Job {
    SendRecv {
        send: bool,
        o: Opts,
        json: Option<String>,
    },
    Echo(EchoOpts),
    Rr(RrOpts, Option<String>),
    Churn(ChurnOpts, Option<String>),
    Http(Opts, Option<String>),
}

fn parse(mut a: Args) -> itcp_cli::Result<Job> {
    match a.command()?.name {
        "send" | "recv" => send_recv(a),
        "echo" => echo(a),
        "churn" => churn(a),
        "http" => http(a),
        _ => rr(a),
    }
}

fn main() -> ExitCode {
    let job = match parse(Args::from_env(&SPEC)) {
        Ok(j) => j,
        Err(stop) => return itcp_cli::exit(&SPEC, stop),
    };
    match job {
        Job::SendRecv { send, o, json } => {
            let announce = |addr: SocketAddr| eprintln!("ttcp: listening on {addr}");
            let (line, err) = if send {
                let r = ttcp::run_send_with(&o, announce);
                (serde_json::to_string(&r), r.error)
            } else {
                let r = ttcp::run_recv_with(&o, announce);
                (serde_json::to_string(&r), r.error)
            };
            finish(line, err, json.as_deref())
        }
        Job::Echo(o) => {
            match ttcp::run_echo_with(&o, |addr| eprintln!("ttcp: listening on {addr}")) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ttcp: echo: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Job::Http(o, json) => {
            let r = ttcp::run_http_with(&o, |addr| eprintln!("ttcp: listening on {addr}"));
            finish(serde_json::to_string(&r), r.error(), json.as_deref())
        }
        Job::Rr(o, json) => {
            let r = ttcp::run_rr(&o);
            finish(serde_json::to_string(&r), r.error.clone(), json.as_deref())
        }
        Job::Churn(o, json) => {
            let r = ttcp::run_churn(&o);
            let err = (!r.ok).then(|| {
                format!(
                    "{} of {} connections failed: {}",
                    r.attempted - r.completed,
                    r.attempted,
                    r.errors.first().map_or("", |e| e.as_str())
                )
            });
            finish(serde_json::to_string(&r), err, json.as_deref())
        }
    }
}

fn send_recv(mut a: Args) -> itcp_cli::Result<Job> {
    let send = a.current_command().map(|c| c.name) == Some("send");
    let mut ep = None;
    let mut o = Opts::new(Endpoint::Connect(([0, 0, 0, 0], 0).into()));
    let mut json = None;
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("connect") => {
                let e = Endpoint::Connect(parse_addr(&mut a, "connect")?);
                set_endpoint(&a, &mut ep, e)?
            }
            Arg::Flag("listen") => {
                let e = Endpoint::Listen(parse_addr(&mut a, "listen")?);
                set_endpoint(&a, &mut ep, e)?
            }
            Arg::Flag("bytes") => o.bytes = Some(parse_size(&mut a, "bytes")?),
            Arg::Flag("seed") => o.seed = parse_u64(&mut a, "seed")?,
            Arg::Flag("buf") => o.buf = Some(parse_positive(&mut a, "buf")?),
            Arg::Flag("cc") => o.cc = Some(a.value("cc")?),
            Arg::Flag("nodelay") => o.nodelay = true,
            Arg::Flag("chunk") => o.chunk = parse_positive(&mut a, "chunk")?,
            Arg::Flag("connect-timeout") => {
                o.connect_timeout = parse_secs(&mut a, "connect-timeout")?
            }
            Arg::Flag("json") => json = Some(a.value("json")?),
            Arg::Flag("itcp") => o.itcp = true,
            Arg::Flag("duration") => {
                let d = parse_secs(&mut a, "duration")?;
                if d == 0.0 {
                    return usage_err(&a, "--duration: must be positive");
                }
                o.duration = Some(d)
            }
            Arg::Flag("corrupt-at") => o.corrupt_at = Some(parse_size(&mut a, "corrupt-at")?),
            Arg::Flag("no-verify") => o.verify = false,
            other => return Err(a.unexpected(other)),
        }
    }
    let role = if send { "send" } else { "recv" };
    let Some(ep) = ep else {
        return usage_err(
            &a,
            format!("ttcp {role}: one of --connect or --listen is required"),
        );
    };
    o.endpoint = ep;
    if send && o.bytes.is_none() && o.duration.is_none() {
        return usage_err(&a, "ttcp send: one of --bytes or --duration is required");
    }
    Ok(Job::SendRecv { send, o, json })
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

fn http(mut a: Args) -> itcp_cli::Result<Job> {
    let mut o = Opts::new(Endpoint::Connect(([0, 0, 0, 0], 0).into()));
    let mut listen = None;
    let mut json = None;
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("listen") => listen = Some(parse_addr(&mut a, "listen")?),
            Arg::Flag("seed") => o.seed = parse_u64(&mut a, "seed")?,
            Arg::Flag("buf") => o.buf = Some(parse_positive(&mut a, "buf")?),
            Arg::Flag("json") => json = Some(a.value("json")?),
            other => return Err(a.unexpected(other)),
        }
    }
    let Some(listen) = listen else {
        return usage_err(&a, "ttcp http: --listen is required");
    };
    o.endpoint = Endpoint::Listen(listen);
    Ok(Job::Http(o, json))
}

fn echo(mut a: Args) -> itcp_cli::Result<Job> {
    let mut listen = None;
    let mut once = false;
    let mut buf = None;
    let mut cc = None;
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("listen") => listen = Some(parse_addr(&mut a, "listen")?),
            Arg::Flag("once") => once = true,
            Arg::Flag("buf") => buf = Some(parse_positive(&mut a, "buf")?),
            Arg::Flag("cc") => cc = Some(a.value("cc")?),
            other => return Err(a.unexpected(other)),
        }
    }
    let Some(listen) = listen else {
        return usage_err(&a, "ttcp echo: --listen is required");
    };
    Ok(Job::Echo(EchoOpts {
        listen,
        once,
        buf,
        cc,
    }))
}

fn rr(mut a: Args) -> itcp_cli::Result<Job> {
    let mut o = RrOpts::new(([0, 0, 0, 0], 0).into());
    let mut addr = None;
    let mut json = None;
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("connect") => addr = Some(parse_addr(&mut a, "connect")?),
            Arg::Flag("count") => {
                o.count = parse_u64(&mut a, "count")?;
                if o.count == 0 {
                    return usage_err(&a, "--count: must be positive");
                }
            }
            Arg::Flag("size") => o.size = parse_positive(&mut a, "size")?,
            Arg::Flag("interval-ms") => o.interval_ms = parse_secs(&mut a, "interval-ms")?,
            Arg::Flag("pipeline") => o.pipeline = true,
            Arg::Flag("itcp") => o.itcp = true,
            Arg::Flag("warmup") => o.warmup = parse_u64(&mut a, "warmup")?,
            Arg::Flag("seed") => o.seed = parse_u64(&mut a, "seed")?,
            Arg::Flag("connect-timeout") => {
                o.connect_timeout = parse_secs(&mut a, "connect-timeout")?
            }
            Arg::Flag("json") => json = Some(a.value("json")?),
            other => return Err(a.unexpected(other)),
        }
    }
    let Some(addr) = addr else {
        return usage_err(&a, "ttcp rr: --connect is required");
    };
    o.addr = addr;
    Ok(Job::Rr(o, json))
}

fn churn(mut a: Args) -> itcp_cli::Result<Job> {
    let mut o = ChurnOpts::new(([0, 0, 0, 0], 0).into());
    let mut addr = None;
    let mut json = None;
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("connect") => addr = Some(parse_addr(&mut a, "connect")?),
            Arg::Flag("rate") => {
                o.rate = parse_secs(&mut a, "rate")?;
                if o.rate <= 0.0 {
                    return usage_err(&a, "--rate: must be positive");
                }
            }
            Arg::Flag("duration") => o.duration = parse_secs(&mut a, "duration")?,
            Arg::Flag("size") => o.size = parse_positive(&mut a, "size")?,
            Arg::Flag("seed") => o.seed = parse_u64(&mut a, "seed")?,
            Arg::Flag("timeout") => o.timeout = parse_secs(&mut a, "timeout")?,
            Arg::Flag("itcp") => o.itcp = true,
            Arg::Flag("json") => json = Some(a.value("json")?),
            other => return Err(a.unexpected(other)),
        }
    }
    let Some(addr) = addr else {
        return usage_err(&a, "ttcp churn: --connect is required");
    };
    o.addr = addr;
    Ok(Job::Churn(o, json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use itcp_cli::Stop;

    #[test]
    fn table_and_parser_agree() {
        itcp_cli::check_table(&SPEC, parse);
        let p = |a: &[&str]| parse(Args::new(&SPEC, a.iter().copied()));
        assert!(matches!(
            p(&["send", "--connect=127.0.0.1:9", "--bytes", "16K"]),
            Ok(Job::SendRecv { send: true, .. })
        ));
        match p(&["recv", "--buf", "12Q", "--listen", "127.0.0.1:0"]) {
            Err(Stop::Usage(m, _)) => assert!(m.contains("--buf: '12Q'"), "{m}"),
            _ => panic!(),
        }
    }
}
