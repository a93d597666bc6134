//! `itcp-lab`: the testbed's command line.
//!
//! ```text
//! itcp-lab demo [--seed S]                  the README's main job
//! itcp-lab bench baseline [options]         the paper's regular-TCP columns, as a table
//! itcp-lab bench {nomoves,relay,paper,handoff,conns,churn,wireless} [options]
//! itcp-lab bench soak --minutes M [--seed S] [--mhs N] [--msrs 3]   chaos soak
//! itcp-lab up [--msrs N] [--itcp]           build a lab (with I-TCP running) until Ctrl-C
//! itcp-lab echo --listen ADDR:PORT          tokio echo server for load benchmarks
//! itcp-lab ctl --control SOCKET JSON        one request to a running airlink
//! itcp-lab cleanup [--all]                  remove labs left by killed runs
//! ```
//! The command line is the table [`SPEC`] (also `--help` and the man page).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::Duration;

use itcp_cli::{Arg, Args, Command, Flag, Section, Spec};
use itcp_mh::mobility::Policy;
use itcp_testbed::baseline::MobileIpOpts;
use itcp_testbed::bench::Peer;
use itcp_testbed::lab::{self, Host, Lab, LabConfig};
use itcp_testbed::report::{self, Table};
use itcp_testbed::scenario::{self, Cells, Detection, Mode, Net, Run, Traffic};

const SEEDS: Flag = Flag::value(
    "seeds",
    "N",
    "Seeds per configuration, at least 1 (default 1).",
);
const NETS: Flag = Flag::value(
    "nets",
    "lan,wan",
    "The networks: the paper's LAN and WAN profiles (default both).",
);
const SCALE: Flag = Flag::value(
    "scale",
    "F",
    "Transfer size factor, greater than 0: 4 MB (LAN) and 2 MB (WAN) times F (default 1).",
);
const DETECTION: Flag = Flag::value(
    "detection",
    "beacon|solicit",
    "How the MH notices a move, the same in both modes: beacon, the MSRs' periodic beacons \
     every 1 s as in the paper (default); solicit, link-up solicitation (the MH asks for a \
     beacon when its carrier comes up in a cell, the MSRs answer at once).",
);
const PAPER_DETECTION: Flag = Flag::value(
    "detection",
    "beacon|solicit|network",
    "How the MH notices a move: beacon, the MSRs' periodic beacons every 1 s as in the paper \
     (default); solicit, link-up solicitation in both modes; network, I-TCP for an MH that \
     runs nothing of ours (plain ttcp through transparent mode, the MSRs detect it from its \
     first frame in the cell), regular TCP with solicitation, the MH opening the connection.",
);
const AIRLINK: Flag = Flag::value(
    "airlink",
    "normal|fifo",
    "The link emulator's priority: normal (default), so that the emulated hosts' kernels, \
     which handle each frame in the emulator's context, do not preempt msrd as they could \
     not on a real network; fifo as in the tests (the links' timing kept, msrd preempted).",
);
const JSON_OUT: Flag = Flag::value(
    "json",
    "FILE",
    "Also write every run's outcome to FILE (JSON).",
);

static SPEC: Spec = Spec {
    name: "itcp-lab",
    version: env!("CARGO_PKG_VERSION"),
    about: "the I-TCP testbed: emulated networks, benchmarks and the paper's tables",
    synopsis: &[],
    description: "\
itcp-lab builds an emulated I-TCP network in network namespaces on this machine: a
fixed host (FH), a gateway (GW), mobility support routers (MSRs) with their wireless
cells, and a mobile host (MH), linked by airlink(1), the user-space link emulator. On it
it runs msrd(1), itcp-mh-agent(1) and ttcp(1) to demonstrate and measure I-TCP against
regular TCP with Mobile-IP-like rerouting, as in the paper's tables.

It needs root (namespaces, TAP devices). Labs are removed when itcp-lab exits; a killed
run's lab is removed by 'itcp-lab cleanup'.",
    flags: &[],
    commands: &[
        Command {
            name: "demo",
            synopsis: "[--seed S]",
            about: "Builds the emulated network (FH, GW, 2 MSRs, MH), sends a stream from the FH \
                    to the MH while it moves between the cells, and prints what happened.",
            flags: &[Flag::value("seed", "S", "Seed of the emulator's random losses (default 1).")],
        },
        Command {
            name: "bench baseline",
            synopsis: "[--seeds N] [--nets lan,wan] [--scale F] [--buf BYTES|auto]
[--cc NAME|default] [--detection beacon|solicit] [--json FILE]",
            about: "Regular TCP (plain routers + Mobile-IP-like rerouting) in the paper's four \
                    cell configurations. Defaults: 1 seed, both nets, 4 MB (LAN) / 2 MB (WAN) \
                    scaled by F=1, 16 KiB buffers, reno.",
            flags: &[
                SEEDS,
                NETS,
                SCALE,
                Flag::value(
                    "buf",
                    "BYTES|auto",
                    "Socket buffers of the transfer (default 16384; auto: kernel autotuning).",
                ),
                Flag::value(
                    "cc",
                    "NAME|default",
                    "The FH's congestion control (default reno; default: the kernel's).",
                ),
                DETECTION,
                JSON_OUT,
            ],
        },
        Command {
            name: "bench nomoves",
            synopsis: "[--seeds N] [--nets lan,wan] [--scale F] [--wireless 'TOML']",
            about: "The paper's no-moves column: regular TCP vs I-TCP (msrd on the MSRs) with \
                    the paper's parameters.",
            flags: &[
                SEEDS,
                NETS,
                SCALE,
                Flag::value(
                    "wireless",
                    "TOML",
                    "Appended to msrd's config, e.g. '[wireless]\\ncongestion_control = \"cubic\"'.",
                ),
            ],
        },
        Command {
            name: "bench relay",
            synopsis: "[--seconds S] [--rounds N] [--peers LIST] [--json FILE]",
            about: "Relay engine on an un-emulated veth path FH → MSR → MH: msrd (handoff off and \
                    on) vs HAProxy with splice vs socat vs direct kernel forwarding (iperf3 bulk, \
                    ttcp rr latency).",
            flags: &[
                Flag::value("seconds", "S", "Seconds per bulk measurement, at least 1 (default 5)."),
                Flag::value("rounds", "N", "Rounds of every measurement, at least 1 (default 3)."),
                Flag::value(
                    "peers",
                    "LIST",
                    "Peers to measure, comma-separated: direct, msrd, msrd-handoff, haproxy, \
                     socat (default all; ratios need haproxy and direct).",
                ),
                JSON_OUT,
            ],
        },
        Command {
            name: "bench paper",
            synopsis: "[--seeds 5] [--scale 1] [--parallel 2] [--variants era,strict,modern,cubic]
[--nets lan,wan] [--others yes|no] [--sweep yes|no] [--msrd 'TOML']
[--detection beacon|solicit|network] [--out docs] [--from-runs FILE]",
            about: "The paper's Tables 1-2 (regular TCP vs I-TCP with handoffs), seeds 000/003 \
                    scenarios, optional sweep; writes docs/results.md and docs/results/*.svg.",
            flags: &[
                Flag::value("seeds", "N", "Seeds per configuration, at least 1 (default 5)."),
                SCALE,
                Flag::value("parallel", "N", "Runs at a time, each on its own lab (default 2)."),
                Flag::value(
                    "variants",
                    "era,strict,modern,cubic",
                    "era: the paper's 1995 TCP parameters (16 KB sockets at FH and MH, reno); \
                     strict: the same with msrd's sockets at 16 KB too; modern: today's defaults \
                     (autotuned, the kernel's congestion control); cubic: autotuned with cubic at \
                     the FH and MH (default: era,modern).",
                ),
                NETS,
                Flag::value(
                    "others",
                    "yes|no",
                    "Also run the seed 000 and 003 scenarios (default yes).",
                ),
                Flag::value("sweep", "yes|no", "Also run the parameter sweep (default no)."),
                Flag::value(
                    "msrd",
                    "TOML",
                    "Appended to every msrd config of the I-TCP runs ('\\n' for newlines).",
                ),
                PAPER_DETECTION,
                Flag::value("out", "DIR", "Where results.md and results/*.svg go (default docs)."),
                Flag::value(
                    "from-runs",
                    "FILE",
                    "Render the report from an earlier run's results/runs.json instead of \
                     running (give the same --variants, --nets, --seeds, --detection).",
                ),
            ],
        },
        Command {
            name: "bench handoff",
            synopsis: "[--conns 1,100,1000] [--moves N] [--gap yes|no] [--channel tls|psk] [--parts yes|no] [--airlink normal|fifo]",
            about: "Handoff latency (greeting → resumed) with empty, full and streaming queues, \
                    the fixed host's retransmission timeouts during the moves, and the gap in \
                    bytes at the MH around one overlapped handoff.",
            flags: &[
                Flag::value(
                    "conns",
                    "N,N,...",
                    "Connection counts to measure (default 1,100,1000).",
                ),
                Flag::value("moves", "N", "Moves per measurement (default 6)."),
                Flag::value("gap", "yes|no", "Also measure the gap (default yes)."),
                Flag::value(
                    "channel",
                    "tls|psk",
                    "The MSR-to-MSR channel: mutual TLS (default) or pre-shared keys.",
                ),
                Flag::value(
                    "parts",
                    "yes|no",
                    "The old MSR sends the images of 512 connections or more in parts as \
                     it captures them ([handoff] images_in_parts; default yes).",
                ),
                AIRLINK,
            ],
        },
        Command {
            name: "bench conns",
            synopsis: "[--count N] [--bytes B]",
            about: "N concurrent I-TCP connections (default 10000) through msrd, all held open, \
                    then B bytes (default 16384) echoed and verified on each; msrd's RSS and \
                    connection setup rate.",
            flags: &[
                Flag::value("count", "N", "Concurrent connections (default 10000)."),
                Flag::value("bytes", "B", "Bytes echoed on each (default 16384)."),
            ],
        },
        Command {
            name: "bench firstbyte",
            synopsis: "[--moves 20] [--nets lan,wan] [--detection beacon,solicit,network]
[--seed S] [--airlink normal|fifo] [--json FILE]",
            about: "Move → first byte at the MH: an FH download through I-TCP across non-overlapped \
                    moves (0.3-0.5 s gaps), per network and detection mode; prints the median, \
                    p95 and range over the moves, the part after the greeting or detection, and how \
                    long the MH withheld its first ACK after a move (every byte verified, RSTs \
                    counted).",
            flags: &[
                Flag::value("moves", "N", "Moves per network and mode, at least 1 (default 20)."),
                NETS,
                Flag::value(
                    "detection",
                    "MODES",
                    "Comma-separated: beacon (the MSRs' 1 s beacons), solicit (the agent's \
                     link-up solicitation), network (an MH that runs nothing of ours, detected by \
                     the MSR from its first frame). Default: all three.",
                ),
                Flag::value("seed", "S", "Seed of the labs (default 1)."),
                AIRLINK,
                JSON_OUT,
            ],
        },
        Command {
            name: "bench upload",
            synopsis: "[--moves 20] [--nets lan,wan] [--kinds paced,bulk]
[--shapes fade:1000,fade:300,gap:300] [--seed S] [--json FILE]",
            about: "Restart → first new upload byte at the FH: an MH that runs nothing of ours \
                    (transparent mode, network detection) uploads across moves between two \
                    cells; per move, from the new MSR's restart of the connection to the FH's \
                    first read after it. Each kind and shape runs with msrd's backoff revert on \
                    and off (`[handoff] revert_backoff`), one after the other; prints the \
                    median, p95 and range of each against one wireless plus one fixed round \
                    trip (every byte verified, RSTs counted).",
            flags: &[
                Flag::value("moves", "N", "Moves per network, kind, shape and mode, at least 1 (default 20)."),
                NETS,
                Flag::value(
                    "kinds",
                    "KINDS",
                    "Comma-separated: paced (a plain socket writing 1000 bytes every 100 ms), bulk \
                     (a plain ttcp send). Default: both.",
                ),
                Flag::value(
                    "shapes",
                    "SHAPES",
                    "Comma-separated moves: fade:MS (the MH's cell loses everything for MS to MS+200 \
                     ms while its carrier stays up, then it associates with the other cell), \
                     gap:MS (in no cell, carrier down, for MS to MS+200 ms). Default: \
                     fade:1000,fade:300,gap:300.",
                ),
                Flag::value("seed", "S", "Seed of the labs (default 1)."),
                JSON_OUT,
            ],
        },
        Command {
            name: "bench wireless",
            synopsis: "[--full] [--moves no|yes|both] [--secs S] [--seed S] [--json FILE]",
            about: "The wireless side against its cell: for each cell of a grid (rate, delay, \
                    random or bursty loss, queue, behind a WAN) a verified download to an MH that \
                    runs nothing of ours, through msrd with its defaults, msrd with the kernel's \
                    defaults (`[wireless] sizing = \"kernel\"`), end-to-end cubic and end-to-end \
                    bbr, one after the other, with an interactive echo beside each download. \
                    Prints per cell and peer: goodput over the cell's rate, cell queue drops per \
                    second, bytes queued at the MSRs, bytes moved per handoff, the echo's median \
                    round trip over the path's, the share of packets the new cell's queue \
                    dropped in the second after each move, and the time from association until \
                    the new cell carried 90 % of its rate (in its round trips); then per peer \
                    the grid's medians in one line each (`wireless defaults: goodput ...`).",
            flags: &[
                Flag::switch("full", "Eight cells instead of four."),
                Flag::value("cells", "N,M", "Only these cells of the grid, counted from 1 (default all)."),
                Flag::value(
                    "peers",
                    "LIST",
                    "Comma-separated: defaults, kernel, cubic, bbr (default all four).",
                ),
                Flag::value(
                    "moves",
                    "no|yes|both",
                    "Without moves, with a move every 5 s (0.5 s without a cell), or both \
                     (default both).",
                ),
                Flag::value("secs", "S", "Seconds of the cell's rate per download, 5..=600 (default 20)."),
                Flag::value(
                    "msrd",
                    "TOML",
                    "Appended to the config of msrd with its defaults (a variant to compare), \
                     e.g. '[wireless]\\nnotsent_lowat = 131072'.",
                ),
                Flag::value("seed", "S", "Seed of the labs (default 1)."),
                JSON_OUT,
            ],
        },
        Command {
            name: "bench churn",
            synopsis: "[--total N] [--concurrency C]",
            about: "N short I-TCP connections (default 100000), C at a time (default 500); msrd \
                    must end with the fds and sessions it started with (no leaks).",
            flags: &[
                Flag::value("total", "N", "Connections in all (default 100000)."),
                Flag::value("concurrency", "C", "Connections at a time (default 500)."),
            ],
        },
        Command {
            name: "bench soak",
            synopsis: "--minutes M | --seconds S [--seed S] [--mhs N] [--msrs N]
[--max-bulk BYTES] [--moves yes|no] [--faults yes|no] [--json FILE]",
            about: "Chaos soak: several MHs with many I-TCP connections each (bulk both ways, \
                    interactive, short-lived), random moves among the MSRs, and faults at \
                    random phases of handoffs (msrd SIGKILLed and restarted, MSR channel cut, \
                    greetings lost, a cell flushed). Every byte is verified; prints a report \
                    (tables, then one JSON line) and fails on lost or corrupted bytes, RSTs no \
                    fault explains, or growth of msrd's fds, memory or router state.",
            flags: &[
                Flag::value("minutes", "M", "How long the chaos lasts, in minutes (default 1)."),
                Flag::value("seconds", "S", "The same in seconds (for short runs)."),
                Flag::value("seed", "S", "Seed of the moves, faults and traffic (default 1)."),
                Flag::value("mhs", "N", "Mobile hosts, 1-100 (default 8)."),
                Flag::value("msrs", "N", "MSRs (cells), 2-20 (default 3)."),
                Flag::value(
                    "max-bulk",
                    "BYTES",
                    "Largest bulk transfer, at least 65536 (default 4194304).",
                ),
                Flag::value("moves", "yes|no", "Move the MHs (default yes; no: to bisect a finding)."),
                Flag::value("faults", "yes|no", "Inject faults (default yes; no: to bisect a finding)."),
                JSON_OUT,
            ],
        },
        Command {
            name: "up",
            synopsis: "[--msrs N] [--seed S] [--itcp]",
            about: "Builds a lab (no emulated impairments) and keeps it until Ctrl-C. With \
                    --itcp, I-TCP runs in it, ready to try by hand (docs/try-it.md): msrd \
                    with handoff, /metrics and the status page on every MSR, the agent on \
                    the MH, a second MH (MH2) that runs nothing of ours (network detection, \
                    its port 80 intercepted), an echo server (port 7) and an HTTP server (port 80, GET /N \
                    answers N bytes) on the FH, 20 Mbit/s cells; it prints the commands \
                    to watch it, move the MH and send traffic through it.",
            flags: &[
                Flag::value("msrs", "N", "Number of MSRs (cells), at least 1 (default 2)."),
                Flag::value("seed", "S", "Seed of the emulator's random losses."),
                Flag::switch(
                    "itcp",
                    "Run I-TCP in the lab (msrd, agent, servers) and print how to use it.",
                ),
            ],
        },
        Command {
            name: "echo",
            synopsis: "--listen ADDR:PORT",
            about: "A tokio echo server for load benchmarks (used by bench conns).",
            flags: &[Flag::value("listen", "ADDR:PORT", "Where to listen (required).")],
        },
        Command {
            name: "ctl",
            synopsis: "--control SOCKET 'JSON'",
            about: "Sends one request to a running airlink and prints the reply.",
            flags: &[Flag::value(
                "control",
                "SOCKET",
                "The airlink's control socket (itcp-lab up prints it) (required).",
            )],
        },
        Command {
            name: "cleanup",
            synopsis: "[--all]",
            about: "Removes namespaces of labs whose process is gone.",
            flags: &[Flag::switch("all", "Remove the namespaces of every lab, live or not.")],
        },
    ],
    sections: &[
        Section {
            title: "EXIT STATUS",
            body: "0 on success, 1 when a run fails or a benchmark's check fails, 2 on a usage \
                   error.",
        },
        Section {
            title: "EXAMPLES",
            body: "\
  itcp-lab demo
  itcp-lab bench baseline --nets lan --scale 0.03
  itcp-lab bench paper --seeds 5 --parallel 2 --out docs",
        },
        Section {
            title: "SEE ALSO",
            body: "msrd(1), itcp-mh-agent(1), airlink(1), ttcp(1)",
        },
    ],
};

/// What the command line asks for.
enum Job {
    Demo(u64),
    Baseline(Baseline),
    NoMoves(NoMoves),
    Relay(u64, usize, Vec<Peer>, Option<String>),
    Paper(itcp_testbed::paper::PaperOpts),
    /// Connection counts, moves, the gap too, the channel over TLS.
    /// Connection counts, moves, gap, TLS, images in parts, SCHED_FIFO airlink.
    Handoff(Vec<usize>, usize, bool, bool, bool, bool),
    Conns(usize, usize),
    Churn(usize, usize),
    FirstByte(FirstByteOpts),
    Upload(UploadOpts),
    Wireless(WirelessOpts),
    Soak(itcp_testbed::soak::SoakOpts, Option<String>),
    /// The lab, and whether I-TCP runs in it.
    Up(Box<LabConfig>, bool),
    Echo(std::net::SocketAddr),
    Ctl(String, String),
    Cleanup(bool),
}

struct WirelessOpts {
    full: bool,
    peers: Vec<itcp_testbed::wireless::Peer>,
    cells: Vec<usize>,
    msrd: String,
    moves: Vec<bool>,
    secs: u64,
    seed: u64,
    json_out: Option<String>,
}

struct UploadOpts {
    moves: usize,
    nets: Vec<Net>,
    kinds: Vec<itcp_testbed::upload::Kind>,
    shapes: Vec<itcp_testbed::upload::Move>,
    seed: u64,
    json_out: Option<String>,
}

struct FirstByteOpts {
    moves: usize,
    nets: Vec<Net>,
    detections: Vec<Detection>,
    seed: u64,
    fifo: bool,
    json_out: Option<String>,
}

struct Baseline {
    seeds: u64,
    nets: Vec<Net>,
    scale: f64,
    buf: Option<usize>,
    cc: Option<String>,
    detection: Detection,
    json_out: Option<String>,
}

struct NoMoves {
    seeds: u64,
    nets: Vec<Net>,
    scale: f64,
    wireless: String,
}

/// `--airlink normal|fifo`: true for fifo.
fn airlink_fifo(a: &mut Args) -> itcp_cli::Result<bool> {
    match a.value("airlink")?.as_str() {
        "normal" => Ok(false),
        "fifo" => Ok(true),
        v => Err(a.usage(format!("--airlink: {v:?} is not normal or fifo"))),
    }
}

fn yes_no(a: &mut Args, flag: &str) -> itcp_cli::Result<bool> {
    Ok(a.choice(flag, &["yes", "no"])? == "yes")
}

fn detection(a: &mut Args) -> itcp_cli::Result<Detection> {
    let v = a.choice("detection", &["beacon", "solicit"])?;
    Ok(Detection::parse(v).expect("a listed choice"))
}

fn nets(a: &mut Args) -> itcp_cli::Result<Vec<Net>> {
    let v = a.value("nets")?;
    parse_nets(&v).map_err(|e| a.usage(e))
}

fn parse(mut a: Args) -> itcp_cli::Result<Job> {
    use itcp_testbed::paper::{PaperOpts, Variant};
    let cmd = a.command()?.name;
    let job = match cmd {
        "demo" => {
            let mut seed = 1;
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("seed") => seed = a.int("seed")?,
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Demo(seed)
        }
        "bench baseline" => {
            let mut o = Baseline {
                seeds: 1,
                nets: vec![Net::lan(), Net::wan()],
                scale: 1.0,
                buf: Some(16 * 1024),
                cc: Some("reno".to_string()),
                detection: Detection::Beacon,
                json_out: None,
            };
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("seeds") => o.seeds = a.int_in("seeds", 1, u64::MAX as i128)?,
                    Arg::Flag("scale") => o.scale = a.positive_f64("scale")?,
                    Arg::Flag("buf") => {
                        let v = a.value("buf")?;
                        o.buf = if v == "auto" {
                            None
                        } else {
                            Some(v.parse().map_err(|_| {
                                a.usage(format!("--buf: {v:?} is not a size in bytes or auto"))
                            })?)
                        }
                    }
                    Arg::Flag("cc") => {
                        let v = a.value("cc")?;
                        o.cc = if v == "default" { None } else { Some(v) }
                    }
                    Arg::Flag("json") => o.json_out = Some(a.value("json")?),
                    Arg::Flag("nets") => o.nets = nets(&mut a)?,
                    Arg::Flag("detection") => o.detection = detection(&mut a)?,
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Baseline(o)
        }
        "bench nomoves" => {
            let mut o = NoMoves {
                seeds: 1,
                nets: vec![Net::lan(), Net::wan()],
                scale: 1.0,
                wireless: String::new(),
            };
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("seeds") => o.seeds = a.int_in("seeds", 1, u64::MAX as i128)?,
                    Arg::Flag("scale") => o.scale = a.positive_f64("scale")?,
                    Arg::Flag("nets") => o.nets = nets(&mut a)?,
                    Arg::Flag("wireless") => o.wireless = a.value("wireless")?,
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::NoMoves(o)
        }
        "bench relay" => {
            let (mut seconds, mut rounds, mut json_out) = (5u64, 3usize, None);
            let mut peers = Peer::ALL.to_vec();
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("seconds") => seconds = a.int_in("seconds", 1, u64::MAX as i128)?,
                    Arg::Flag("rounds") => rounds = a.int_in("rounds", 1, usize::MAX as i128)?,
                    Arg::Flag("peers") => {
                        let v = a.value("peers")?;
                        peers =
                            Peer::parse_list(&v).map_err(|e| a.usage(format!("--peers: {e}")))?
                    }
                    Arg::Flag("json") => json_out = Some(a.value("json")?),
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Relay(seconds, rounds, peers, json_out)
        }
        "bench paper" => {
            let mut o = PaperOpts {
                seeds: 5,
                scale: 1.0,
                parallel: 2,
                variants: vec![Variant::Era, Variant::Modern],
                nets: vec![Net::lan(), Net::wan()],
                other_seeds: true,
                sweep: false,
                msrd_extra: String::new(),
                detection: Detection::Beacon,
                out: "docs".into(),
                from_runs: None,
            };
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("seeds") => o.seeds = a.int_in("seeds", 1, u64::MAX as i128)?,
                    Arg::Flag("scale") => o.scale = a.positive_f64("scale")?,
                    Arg::Flag("parallel") => o.parallel = a.int("parallel")?,
                    Arg::Flag("nets") => o.nets = nets(&mut a)?,
                    Arg::Flag("variants") => {
                        let v = a.value("variants")?;
                        o.variants = v
                            .split(',')
                            .map(|x| {
                                Variant::parse(x).ok_or_else(|| {
                                    a.usage(format!(
                                        "--variants: {x:?} is not a variant (era, strict, modern, cubic)"
                                    ))
                                })
                            })
                            .collect::<Result<_, _>>()?
                    }
                    Arg::Flag("others") => o.other_seeds = yes_no(&mut a, "others")?,
                    Arg::Flag("sweep") => o.sweep = yes_no(&mut a, "sweep")?,
                    Arg::Flag("msrd") => o.msrd_extra = a.value("msrd")?.replace("\\n", "\n"),
                    Arg::Flag("detection") => {
                        let v = a.choice("detection", &["beacon", "solicit", "network"])?;
                        o.detection = Detection::parse(v).expect("a listed choice");
                    }
                    Arg::Flag("out") => o.out = a.value("out")?.into(),
                    Arg::Flag("from-runs") => o.from_runs = Some(a.value("from-runs")?.into()),
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Paper(o)
        }
        "bench handoff" => {
            let (mut conns, mut moves, mut gap) = (vec![1usize, 100, 1000], 6usize, true);
            let (mut tls, mut parts, mut fifo) = (true, true, false);
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("airlink") => fifo = airlink_fifo(&mut a)?,
                    Arg::Flag("conns") => {
                        let v = a.value("conns")?;
                        conns = v
                            .split(',')
                            .map(|n| {
                                n.trim().parse::<usize>().map_err(|_| {
                                    a.usage(format!("--conns: {n:?} is not a whole number"))
                                })
                            })
                            .collect::<Result<_, _>>()?
                    }
                    Arg::Flag("moves") => moves = a.int("moves")?,
                    Arg::Flag("gap") => gap = yes_no(&mut a, "gap")?,
                    Arg::Flag("parts") => parts = yes_no(&mut a, "parts")?,
                    Arg::Flag("channel") => {
                        tls = match a.value("channel")?.as_str() {
                            "tls" => true,
                            "psk" => false,
                            v => return Err(a.usage(format!("--channel: {v:?} is not tls or psk"))),
                        }
                    }
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Handoff(conns, moves, gap, tls, parts, fifo)
        }
        "bench conns" => {
            let (mut count, mut bytes) = (10_000usize, 16_384usize);
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("count") => count = a.int("count")?,
                    Arg::Flag("bytes") => bytes = a.int("bytes")?,
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Conns(count, bytes)
        }
        "bench firstbyte" => {
            let mut o = FirstByteOpts {
                moves: 20,
                nets: vec![Net::lan(), Net::wan()],
                detections: Detection::ALL.to_vec(),
                seed: 1,
                fifo: false,
                json_out: None,
            };
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("airlink") => o.fifo = airlink_fifo(&mut a)?,
                    Arg::Flag("moves") => o.moves = a.int_in("moves", 1, 1000)?,
                    Arg::Flag("nets") => o.nets = nets(&mut a)?,
                    Arg::Flag("detection") => {
                        let v = a.value("detection")?;
                        o.detections = v
                            .split(',')
                            .map(|d| {
                                Detection::parse(d).ok_or_else(|| {
                                    a.usage(format!(
                                        "--detection: {d:?} is not beacon, solicit or network"
                                    ))
                                })
                            })
                            .collect::<Result<_, _>>()?;
                    }
                    Arg::Flag("seed") => o.seed = a.int("seed")?,
                    Arg::Flag("json") => o.json_out = Some(a.value("json")?),
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::FirstByte(o)
        }
        "bench upload" => {
            use itcp_testbed::upload::{Kind, Move};
            let mut o = UploadOpts {
                moves: 20,
                nets: vec![Net::lan(), Net::wan()],
                kinds: vec![Kind::Paced, Kind::Bulk],
                shapes: vec![Move::Fade(1000), Move::Fade(300), Move::Gap(300)],
                seed: 1,
                json_out: None,
            };
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("moves") => o.moves = a.int_in("moves", 1, 1000)?,
                    Arg::Flag("nets") => o.nets = nets(&mut a)?,
                    Arg::Flag("kinds") => {
                        let v = a.value("kinds")?;
                        o.kinds = v
                            .split(',')
                            .map(|k| match k {
                                "paced" => Ok(Kind::Paced),
                                "bulk" => Ok(Kind::Bulk),
                                _ => Err(a.usage(format!("--kinds: {k:?} is not paced or bulk"))),
                            })
                            .collect::<Result<_, _>>()?;
                    }
                    Arg::Flag("shapes") => {
                        let v = a.value("shapes")?;
                        o.shapes = v
                            .split(',')
                            .map(|s| {
                                let bad = || {
                                    a.usage(format!(
                                        "--shapes: {s:?} is not fade:MS or gap:MS (MS up to 10000)"
                                    ))
                                };
                                let (kind, ms) = s.split_once(':').ok_or_else(bad)?;
                                let ms: u64 =
                                    ms.parse().ok().filter(|&m| m <= 10_000).ok_or_else(bad)?;
                                match kind {
                                    "fade" => Ok(Move::Fade(ms)),
                                    "gap" => Ok(Move::Gap(ms)),
                                    _ => Err(bad()),
                                }
                            })
                            .collect::<Result<_, _>>()?;
                    }
                    Arg::Flag("seed") => o.seed = a.int("seed")?,
                    Arg::Flag("json") => o.json_out = Some(a.value("json")?),
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Upload(o)
        }
        "bench wireless" => {
            let mut o = WirelessOpts {
                full: false,
                peers: itcp_testbed::wireless::Peer::ALL.to_vec(),
                cells: Vec::new(),
                msrd: String::new(),
                moves: vec![false, true],
                secs: 20,
                seed: 1,
                json_out: None,
            };
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("full") => o.full = true,
                    Arg::Flag("peers") => {
                        use itcp_testbed::wireless::Peer;
                        let v = a.value("peers")?;
                        o.peers = v
                            .split(',')
                            .map(|p| match p {
                                "defaults" => Ok(Peer::MsrdDefaults),
                                "kernel" => Ok(Peer::MsrdKernel),
                                "cubic" => Ok(Peer::E2eCubic),
                                "bbr" => Ok(Peer::E2eBbr),
                                _ => Err(a.usage(format!(
                                    "--peers: {p:?} is not defaults, kernel, cubic or bbr"
                                ))),
                            })
                            .collect::<Result<_, _>>()?;
                    }
                    Arg::Flag("cells") => {
                        let v = a.value("cells")?;
                        o.cells = v
                            .split(',')
                            .map(|c| {
                                c.parse::<usize>()
                                    .ok()
                                    .filter(|&n| (1..=8).contains(&n))
                                    .ok_or_else(|| a.usage(format!("--cells: {c:?} is not 1..=8")))
                            })
                            .collect::<Result<_, _>>()?;
                    }
                    Arg::Flag("moves") => {
                        o.moves = match a.value("moves")?.as_str() {
                            "no" => vec![false],
                            "yes" => vec![true],
                            "both" => vec![false, true],
                            v => {
                                return Err(
                                    a.usage(format!("--moves: {v:?} is not no, yes or both"))
                                )
                            }
                        }
                    }
                    Arg::Flag("secs") => o.secs = a.int_in("secs", 5, 600)?,
                    Arg::Flag("msrd") => o.msrd = a.value("msrd")?.replace("\\n", "\n"),
                    Arg::Flag("seed") => o.seed = a.int("seed")?,
                    Arg::Flag("json") => o.json_out = Some(a.value("json")?),
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Wireless(o)
        }
        "bench churn" => {
            let (mut total, mut conc) = (100_000usize, 500usize);
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("total") => total = a.int("total")?,
                    Arg::Flag("concurrency") => conc = a.int("concurrency")?,
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Churn(total, conc)
        }
        "bench soak" => {
            let mut o = itcp_testbed::soak::SoakOpts::default();
            let mut json_out = None;
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("minutes") => o.seconds = a.positive_f64("minutes")? * 60.0,
                    Arg::Flag("seconds") => o.seconds = a.positive_f64("seconds")?,
                    Arg::Flag("seed") => o.seed = a.int("seed")?,
                    Arg::Flag("mhs") => o.mhs = a.int_in("mhs", 1, 100)?,
                    Arg::Flag("msrs") => o.msrs = a.int_in("msrs", 2, 20)?,
                    Arg::Flag("max-bulk") => {
                        o.max_bulk = a.int_in("max-bulk", 65536, u64::MAX as i128)?
                    }
                    Arg::Flag("moves") => o.moves = yes_no(&mut a, "moves")?,
                    Arg::Flag("faults") => o.faults = yes_no(&mut a, "faults")?,
                    Arg::Flag("json") => json_out = Some(a.value("json")?),
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Soak(o, json_out)
        }
        "up" => {
            let (mut msrs, mut seed, mut itcp) = (2, 1, false);
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("msrs") => msrs = a.int_in("msrs", 1, usize::MAX as i128)?,
                    Arg::Flag("seed") => seed = a.int("seed")?,
                    Arg::Flag("itcp") => itcp = true,
                    other => return Err(a.unexpected(other)),
                }
            }
            // With I-TCP running, links people can use (a bare lab keeps the
            // emulator's defaults, as it always had).
            let mut cfg = if itcp {
                LabConfig::clean(msrs, seed)
            } else {
                LabConfig::default()
            };
            if itcp && msrs < 2 {
                return Err(a.usage("up --itcp needs --msrs 2 or more (to move the MH)"));
            }
            cfg.msrs = msrs;
            cfg.seed = seed;
            Job::Up(Box::new(cfg), itcp)
        }
        "echo" => {
            let mut listen = None;
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("listen") => listen = Some(a.parse("listen", "ADDR:PORT")?),
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Echo(listen.ok_or_else(|| a.usage("echo needs --listen ADDR:PORT"))?)
        }
        "ctl" => {
            let (mut control, mut req) = (None, None);
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("control") => control = Some(a.value("control")?),
                    Arg::Word(w) if req.is_none() => req = Some(w),
                    other => return Err(a.unexpected(other)),
                }
            }
            match (control, req) {
                (Some(c), Some(r)) => Job::Ctl(c, r),
                _ => return Err(a.usage("ctl needs --control SOCKET 'JSON'")),
            }
        }
        _ => {
            let mut all = false;
            while let Some(arg) = a.next()? {
                match arg {
                    Arg::Flag("all") => all = true,
                    other => return Err(a.unexpected(other)),
                }
            }
            Job::Cleanup(all)
        }
    };
    Ok(job)
}

fn main() -> ExitCode {
    // `bench paper --parallel N` runs labs side by side on purpose.
    itcp_testbed::lab::labs_in_parallel();
    let job = match parse(Args::from_env(&SPEC)) {
        Ok(j) => j,
        Err(stop) => return itcp_cli::exit(&SPEC, stop),
    };
    let r = match job {
        Job::Demo(seed) => demo(seed),
        Job::Baseline(o) => bench_baseline(o),
        Job::NoMoves(o) => bench_nomoves(o),
        Job::Relay(seconds, rounds, peers, json_out) => {
            bench_relay(seconds, rounds, &peers, json_out)
        }
        Job::Paper(o) => bench_paper(o),
        Job::Handoff(conns, moves, gap, tls, parts, fifo) => {
            bench_handoff(conns, moves, gap, tls, parts, fifo)
        }
        Job::Conns(count, bytes) => bench_conns(count, bytes),
        Job::Churn(total, conc) => bench_churn(total, conc),
        Job::FirstByte(o) => bench_firstbyte(o),
        Job::Upload(o) => bench_upload(o),
        Job::Wireless(o) => bench_wireless(o),
        Job::Soak(o, json_out) => bench_soak(o, json_out),
        Job::Up(cfg, itcp) => up(*cfg, itcp),
        Job::Echo(addr) => itcp_testbed::bench::echo_server(addr).map_err(|e| e.to_string()),
        Job::Ctl(path, req) => ctl(&path, &req),
        Job::Cleanup(all) => {
            let removed = lab::sweep(all);
            println!("removed {} lab(s) {}", removed.len(), removed.join(" "));
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("itcp-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo(seed: u64) -> Result<(), String> {
    println!("I-TCP testbed demo: FH ── 10 Mbit/s, 1 ms ── GW ── LAN ── MSR1/MSR2 ~~ 2 Mbit/s cells, 2 ms, 1 % loss ~~ MH");
    println!("The FH sends 3 MiB to the MH (16 KiB buffers, reno) while the MH moves between");
    println!("the cells every 4 s with a 1 s blackout between them; MSRs beacon every 1 s.\n");
    let run = |mode: Mode| Run {
        net: Net::lan(),
        cells: Cells::NonOverlapped {
            period_s: 4.0,
            gap_s: 1.0,
        },
        mode,
        traffic: Traffic {
            bytes: 3 << 20,
            buf: Some(16 * 1024),
            cc: Some("reno".into()),
            mh_opens: false,
        },
        seed,
        msrs: 2,
        timeout: Duration::from_secs(300),
    };
    // A line per step with the time so far: each transfer runs for a minute or more.
    let t0 = std::time::Instant::now();
    let step = |what: &str| {
        println!("[demo {:3.0}s] {what}", t0.elapsed().as_secs_f64());
        let _ = std::io::stdout().flush();
    };
    println!("== I-TCP: msrd on both MSRs splits the connection; the MH's agent greets the new");
    println!("   MSR, which fetches the connection (TCP_REPAIR) from the old one.");
    step("building the lab, starting msrd and the agent, then 3 MiB to the MH (20-40 s)");
    // Both modes detect moves the same way: by the MSRs' beacons, as in the paper.
    let [regular_mode, itcp_mode] = Detection::Beacon.modes(Policy::Eager, "", &[]);
    let itcp = scenario::run(&run(itcp_mode)).map_err(|e| e.to_string())?;
    step("I-TCP transfer done");
    print!("{}", report::describe(&itcp));
    println!("\n== Regular TCP, same network and moves: plain routers, Mobile-IP-like rerouting.");
    step("the same 3 MiB over regular TCP (20-40 s)");
    let regular = scenario::run(&run(regular_mode)).map_err(|e| e.to_string())?;
    step("regular TCP transfer done");
    print!("{}", report::describe(&regular));
    println!(
        "\nI-TCP {:.1} KB/s vs regular TCP {:.1} KB/s: ratio {:.2}\n",
        itcp.kbytes_per_s(),
        regular.kbytes_per_s(),
        itcp.kbytes_per_s() / regular.kbytes_per_s()
    );
    let figures = report::DemoFigures {
        itcp_kbs: itcp.kbytes_per_s(),
        regular_kbs: regular.kbytes_per_s(),
        itcp_stall_s: itcp.recv.longest_stall_s,
        regular_stall_s: regular.recv.longest_stall_s,
        coverage: itcp.coverage,
        handoff_ms: itcp
            .handoffs
            .iter()
            .filter_map(report::greeting_to_resumed_ms)
            .collect(),
        handoffs_failed: itcp.handoffs.iter().filter(|h| !h.ok()).count(),
        verified: itcp.recv.ok && regular.recv.ok,
        rsts: itcp.rsts.map_or(0, |(a, b, c, d)| a + b + c + d),
    };
    print!("{}", report::explain_demo(&figures));
    if !itcp.recv.ok || !regular.recv.ok {
        return Err("a transfer failed verification".into());
    }
    if itcp.rsts.is_some_and(|(a, b, c, d)| a + b + c + d > 0) {
        return Err("RSTs were seen during the I-TCP transfer".into());
    }
    Ok(())
}

fn bench_firstbyte(o: FirstByteOpts) -> Result<(), String> {
    itcp_testbed::lab::set_airlink_fifo(o.fifo);
    println!(
        "Move → first byte at the MH, ms: {} non-overlapped moves (0.3-0.5 s without a cell) per \
         network and detection mode, seed {}; an FH download (16 KB socket buffer, msrd at 64 KB); \
         link emulator: {} priority",
        o.moves,
        o.seed,
        if o.fifo { "SCHED_FIFO" } else { "normal" }
    );
    println!(
        "\n| network | detection | median | p95 | min–max | greeting/detection at the new MSR → first byte, median [min–max] | MH's first ACK withheld, median [max] | RSTs FH/MH |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut all = Vec::new();
    for net in &o.nets {
        for &d in &o.detections {
            let r = itcp_testbed::firstbyte::run(net, d, o.moves, o.seed, false)
                .map_err(|e| format!("{} {}: {e}", net.name, d.name()))?;
            let range = |v: &[f64]| {
                let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
                (lo, v.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
            };
            let median = itcp_testbed::report::median;
            let (lo, hi) = range(&r.ms);
            let ((fi, fo), (mi, mo)) = r.rsts;
            let (g, w) = (&r.from_greeting_ms, &r.ack_wait_ms);
            let (glo, ghi) = range(g);
            let from_greeting = match g.is_empty() {
                true => "–".to_string(),
                false => format!("{:.1} [{glo:.1}–{ghi:.1}] ({} moves)", median(g), g.len()),
            };
            let held = match w.is_empty() {
                true => "–".to_string(),
                false => format!("{:.1} [{:.1}]", median(w), range(w).1),
            };
            println!(
                "| {} | {} | {:.1} | {:.1} | {lo:.1}–{hi:.1} | {from_greeting} | {held} | {} / {} |",
                net.name,
                d.name(),
                r.median_ms,
                r.p95_ms,
                fi + fo,
                mi + mo
            );
            all.push(serde_json::json!({
                "net": net.name, "detection": d.name(), "ms": r.ms,
                "from_greeting_ms": r.from_greeting_ms, "ack_wait_ms": r.ack_wait_ms,
                "median_ms": r.median_ms, "p95_ms": r.p95_ms, "bytes": r.bytes,
                "rsts_fh": [fi, fo], "rsts_mh": [mi, mo],
            }));
        }
    }
    if let Some(path) = o.json_out {
        std::fs::write(&path, serde_json::to_vec_pretty(&all).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn bench_wireless(o: WirelessOpts) -> Result<(), String> {
    use itcp_testbed::wireless::{self, Peer};
    println!(
        "The wireless side against its cell: a {} s download per cell and peer, seed {}; an MH \
         that runs nothing of ours; the FH runs cubic except end to end bbr",
        o.secs, o.seed
    );
    if !o.msrd.is_empty() {
        println!("msrd defaults with: {}", o.msrd.replace('\n', "; "));
    }
    println!(
        "\n| cell | moves | peer | goodput / cell | cell drops/s | held at MSRs | moved per handoff \
         | echo / path | move drops | ramp |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut all = Vec::new();
    let mut figures: Vec<(bool, Peer, wireless::Figures)> = Vec::new();
    let grid = wireless::grid(!o.full && o.cells.iter().all(|&c| c <= 4));
    let picked = grid
        .iter()
        .enumerate()
        .filter(|(i, _)| o.cells.is_empty() || o.cells.contains(&(i + 1)))
        .map(|(_, c)| c.clone());
    for cell in picked {
        for &moves in &o.moves {
            for peer in Peer::ALL {
                if !o.peers.contains(&peer) {
                    continue;
                }
                let f = wireless::run_with(&cell, peer, moves, o.secs, o.seed, &o.msrd)
                    .map_err(|e| format!("{} {}: {e}", cell.name(), peer.name()))?;
                let kb = |b: u64| b as f64 / 1000.0;
                let opt = |v: Option<f64>, fmt: &dyn Fn(f64) -> String| v.map_or("-".into(), fmt);
                println!(
                    "| {} | {} | {} | {:.3} | {:.1} | {:.0} KB | {} | {} | {} | {} |",
                    cell.name(),
                    if moves { "every 5 s" } else { "none" },
                    peer.name(),
                    f.goodput,
                    f.drops_per_s,
                    kb(f.held_bytes),
                    f.moved_per_handoff
                        .map_or("-".into(), |m| format!("{:.0} KB", kb(m))),
                    opt(f.echo_over_path, &|e| format!("{e:.2}x")),
                    opt(f.move_drops, &|d| format!("{:.1} %", d * 100.0)),
                    opt(f.ramp_rtts, &|r| format!("{r:.1} RTT")),
                );
                all.push(serde_json::json!({
                    "cell": cell.name(), "moves": moves, "peer": peer.name(),
                    "goodput_over_cell": f.goodput, "cell_drops_per_s": f.drops_per_s,
                    "held_bytes": f.held_bytes, "moved_per_handoff": f.moved_per_handoff,
                    "echo_over_path": f.echo_over_path, "move_drops": f.move_drops,
                    "ramp_rtts": f.ramp_rtts,
                }));
                figures.push((moves, peer, f));
            }
        }
    }
    println!("\nMedians over the grid (goodput, echo and held from the runs without moves, move drops and ramp from those with):\n");
    for peer in Peer::ALL.into_iter().filter(|p| o.peers.contains(p)) {
        println!("{}", wireless::summary(peer, &figures));
    }
    if let Some(path) = o.json_out {
        std::fs::write(&path, serde_json::to_vec_pretty(&all).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn bench_upload(o: UploadOpts) -> Result<(), String> {
    println!(
        "Restart → first new upload byte at the FH, ms: {} moves per network, kind and shape, \
         seed {}; an MH that runs nothing of ours (transparent mode, network detection); \
         msrd's backoff revert on and off; bound: one wireless and one fixed round trip",
        o.moves, o.seed
    );
    println!(
        "\n| network | upload | move | revert | median | p95 | min–max | bound | RSTs FH/MH |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut all = Vec::new();
    for net in &o.nets {
        let bound = itcp_testbed::upload::bound_ms(net);
        for &kind in &o.kinds {
            for &shape in &o.shapes {
                for revert in [true, false] {
                    let r = itcp_testbed::upload::run(net, kind, shape, revert, o.moves, o.seed)
                        .map_err(|e| {
                            format!(
                                "{} {} {} revert {}: {e}",
                                net.name,
                                kind.name(),
                                shape.name(),
                                on_off(revert)
                            )
                        })?;
                    let lo = r.ms.iter().cloned().fold(f64::INFINITY, f64::min);
                    let hi = r.ms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let ((fi, fo), (mi, mo)) = r.rsts;
                    println!(
                        "| {} | {} | {} | {} | {:.1} | {:.1} | {lo:.1}–{hi:.1} | {bound:.1} | {} / {} |",
                        net.name,
                        kind.name(),
                        shape.name(),
                        on_off(revert),
                        r.median_ms,
                        r.p95_ms,
                        fi + fo,
                        mi + mo
                    );
                    all.push(serde_json::json!({
                        "net": net.name, "kind": kind.name(), "move": shape.name(),
                        "revert": revert, "ms": r.ms, "median_ms": r.median_ms,
                        "p95_ms": r.p95_ms, "bound_ms": bound, "bytes": r.bytes,
                        "rsts_fh": [fi, fo], "rsts_mh": [mi, mo],
                    }));
                }
            }
        }
    }
    if let Some(path) = o.json_out {
        std::fs::write(&path, serde_json::to_vec_pretty(&all).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn bench_baseline(o: Baseline) -> Result<(), String> {
    let Baseline {
        seeds,
        nets,
        scale,
        buf,
        cc,
        detection,
        json_out,
    } = o;
    let mut table = Table::default();
    let mut all = Vec::new();
    for net in &nets {
        let mb = if net.name == "LAN" { 4.0 } else { 2.0 };
        let bytes = (mb * 1_048_576.0 * scale) as u64;
        for cells in Cells::paper_columns() {
            for seed in 1..=seeds {
                let run = Run {
                    net: net.clone(),
                    cells: cells.clone(),
                    mode: Mode::RegularTcp(detection.mobile_ip(Policy::Eager)),
                    traffic: Traffic {
                        bytes,
                        buf,
                        cc: cc.clone(),
                        mh_opens: false,
                    },
                    seed,
                    msrs: 2,
                    timeout: Duration::from_secs(1800),
                };
                let o = scenario::run(&run).map_err(|e| e.to_string())?;
                eprintln!(
                    "{} {:<18} seed {seed}: {:7.2} KB/s  longest stall {:5.2} s  {}",
                    net.name,
                    cells.label(),
                    o.kbytes_per_s(),
                    o.recv.longest_stall_s,
                    if o.recv.ok { "intact" } else { "FAILED" }
                );
                if !o.recv.ok {
                    return Err(format!(
                        "{} {} seed {seed}: {}",
                        net.name,
                        cells.label(),
                        o.recv.error.clone().unwrap_or_default()
                    ));
                }
                table.add(&net.name, &cells.label(), o.kbytes_per_s());
                all.push(o);
            }
        }
    }
    println!(
        "\nRegular TCP (baseline), goodput at the MH in KB/s, median [min–max] of {seeds} seed(s);"
    );
    println!(
        "buffers {}, FH congestion control {}, transfer {:.2} MB (LAN) / {:.2} MB (WAN)\n",
        buf.map_or("autotuned".into(), |b| format!("{b} B")),
        cc.as_deref().unwrap_or("kernel default"),
        4.0 * scale,
        2.0 * scale
    );
    print!("{}", table.render(&report::PAPER_REGULAR));
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_vec_pretty(&all).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn bench_relay(
    seconds: u64,
    rounds: usize,
    peers: &[Peer],
    json_out: Option<String>,
) -> Result<(), String> {
    let b = itcp_testbed::bench::relay(seconds, rounds, peers, |l| eprintln!("{l}"))
        .map_err(|e| e.to_string())?;
    println!("{}", b.render());
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_vec_pretty(&b).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn bench_conns(count: usize, bytes: usize) -> Result<(), String> {
    let b = itcp_testbed::bench::conns(count, bytes, |l| eprintln!("{l}"))
        .map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string_pretty(&b).unwrap());
    println!(
        "{}/{} connections established, {} intact; setup {:.0} conn/s; msrd RSS {} KiB idle, {} KiB with {} open ({:.1} MiB, {:.2} KiB per connection over idle), {} KiB once closed",
        b.established,
        b.count,
        b.intact,
        b.setup_per_s,
        b.msrd_rss_kib_idle,
        b.msrd_rss_kib_peak,
        b.sessions_at_peak,
        b.msrd_rss_kib_peak as f64 / 1024.0,
        b.msrd_rss_kib_peak.saturating_sub(b.msrd_rss_kib_idle) as f64 / b.sessions_at_peak.max(1) as f64,
        b.msrd_rss_kib_after
    );
    if b.intact != b.count {
        return Err(format!(
            "{} of {} connections did not complete intact",
            b.count - b.intact,
            b.count
        ));
    }
    Ok(())
}

/// Three rounds, each msrd without handoff then with it (alternating on this noisy
/// machine); the medians and their ratio.
fn bench_churn(total: usize, conc: usize) -> Result<(), String> {
    let mut rates = [Vec::new(), Vec::new()];
    for _round in 0..3 {
        for handoff in [false, true] {
            let b = itcp_testbed::bench::churn(total, conc.max(1), handoff, |l| eprintln!("{l}"))
                .map_err(|e| e.to_string())?;
            println!("{}", serde_json::to_string(&b).unwrap());
            println!(
                "handoff {}: {}/{} intact, {:.0} conn/s; msrd fds {} before, {} after; RSS {} KiB before, {} KiB after; {} sessions left",
                if handoff { "on" } else { "off" },
                b.intact, b.total, b.per_s, b.msrd_fds_before, b.msrd_fds_after, b.msrd_rss_kib_before, b.msrd_rss_kib_after, b.sessions_after
            );
            // msrd keeps up to 256 empty pipes pooled for reuse (512 fds); more would be a leak.
            if b.intact != b.total
                || b.msrd_fds_after > b.msrd_fds_before + 512
                || b.sessions_after != 0
            {
                return Err("connections failed or msrd leaked fds/sessions".into());
            }
            rates[usize::from(handoff)].push(b.per_s);
        }
    }
    let [off, on] = rates.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    });
    println!(
        "median of 3: {off:.0} conn/s with handoff off, {on:.0} conn/s on (SYN-ACKs reported): {:.2}x",
        on / off
    );
    Ok(())
}

fn bench_soak(o: itcp_testbed::soak::SoakOpts, json_out: Option<String>) -> Result<(), String> {
    let r = itcp_testbed::soak::run(&o, &|l| eprintln!("soak: {l}")).map_err(|e| e.to_string())?;
    print!("{}", r.render());
    let line = serde_json::to_string(&r).unwrap();
    println!("{line}");
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_vec_pretty(&r).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    if !r.ok {
        return Err(format!("soak failed: {}", r.problems.join("; ")));
    }
    Ok(())
}

fn bench_paper(o: itcp_testbed::paper::PaperOpts) -> Result<(), String> {
    use itcp_testbed::paper;
    let summary = paper::run(&o, &|l| eprintln!("{l}")).map_err(|e| e.to_string())?;
    print!("{summary}");
    println!("report written to {}", o.out.join("results.md").display());
    Ok(())
}

fn bench_handoff(
    conns: Vec<usize>,
    moves: usize,
    gap: bool,
    tls: bool,
    parts: bool,
    fifo: bool,
) -> Result<(), String> {
    use itcp_testbed::handoff_bench;
    itcp_testbed::lab::set_airlink_fifo(fifo);
    let mut rows = Vec::new();
    for &n in &conns {
        for q in handoff_bench::Queues::ALL {
            eprintln!("handoff latency: {n} connection(s), {} queues", q.as_str());
            let r = handoff_bench::latency(n, q, moves, tls, parts, |l| eprintln!("  {l}"))
                .map_err(|e| format!("{n} connections ({}): {e}", q.as_str()))?;
            println!("{}", serde_json::to_string(&r).unwrap());
            rows.push(r);
        }
    }
    println!(
        "\nlink emulator: {} priority; images {}",
        if fifo { "SCHED_FIFO" } else { "normal" },
        if parts {
            "in parts ([handoff] images_in_parts)"
        } else {
            "in one message"
        }
    );
    println!(
        "Handoff latency, greeting → resumed at the new MSR (median of the moves; min–max), \
         the MH's greeting → moved (median; '1st': the first move, the MH's first visit to \
         that MSR), and the FH's retransmission timeouts and loss probes over all the moves:"
    );
    println!(
        "{:>6}  {:<6}  {:>5}  {:>22}  {:>8}  {:>10}  {:>9}  {:>9}  {:>12}  {:>7}  {:>9}",
        "conns",
        "queues",
        "moves",
        "new MSR ms",
        "µs/conn",
        "capture ms",
        "MH ms",
        "MH 1st ms",
        "queued bytes",
        "FH RTOs",
        "FH probes"
    );
    for r in &rows {
        println!(
            "{:>6}  {:<6}  {:>5}  {:>8.2} ({:.2}–{:.2})  {:>8.0}  {:>10.2}  {:>9.2}  {:>9.2}  {:>12}  {:>7}  {:>9}",
            r.conns,
            r.queues.as_str(),
            r.moves,
            r.new_msr_ms.0,
            r.new_msr_ms.1,
            r.new_msr_ms.2,
            r.new_msr_ms.0 * 1000.0 / r.conns.max(1) as f64,
            r.capture_ms,
            r.mh_ms,
            r.mh_first_visit_ms,
            r.queued_bytes,
            r.fh_rtos,
            r.fh_loss_probes
        );
    }
    println!(
        "µs/conn: the median new-MSR time over the connections moved, both sockets of each \
         (the published figure for one TCP_REPAIR hand-off: 232 µs, Prism, NSDI 2021)"
    );
    if gap {
        eprintln!("gap at the MH around one overlapped handoff (LAN profile, 2 MiB download)");
        let g = handoff_bench::gap(1).map_err(|e| e.to_string())?;
        println!("{}", serde_json::to_string(&g).unwrap());
        println!(
            "gap: longest stall {:.0} ms with a handoff vs {:.0} ms without; {} bytes in the second around the handoff vs {} in the median second; goodput {:.1} vs {:.1} KB/s",
            g.stall_with_move_ms,
            g.stall_without_move_ms,
            g.bytes_handoff_second,
            g.bytes_median_second,
            g.goodput_with_move_kbps,
            g.goodput_without_move_kbps
        );
    }
    Ok(())
}

fn parse_nets(v: &str) -> Result<Vec<Net>, String> {
    v.split(',')
        .map(|n| match n {
            "lan" => Ok(Net::lan()),
            "wan" => Ok(Net::wan()),
            _ => Err(format!("--nets: unknown network {n:?} (lan, wan)")),
        })
        .collect()
}

fn bench_nomoves(o: NoMoves) -> Result<(), String> {
    let NoMoves {
        seeds,
        nets,
        scale,
        wireless,
    } = o;
    let modes = [
        Mode::RegularTcp(MobileIpOpts::default()),
        Mode::Itcp {
            msrd_extra: wireless.clone(),
            agent: vec![],
        },
    ];
    println!("No moves, goodput at the MH in KB/s: median [min–max] of {seeds} seed(s); 16 KiB buffers, reno at the FH");
    if !wireless.is_empty() {
        println!("msrd extra config: {}", wireless.replace('\n', "; "));
    }
    println!("\n| network | regular TCP | I-TCP | I-TCP / regular | paper regular | paper I-TCP | paper ratio |");
    println!("|---|---|---|---|---|---|---|");
    for net in &nets {
        let mb = if net.name == "LAN" { 4.0 } else { 2.0 };
        let bytes = (mb * 1_048_576.0 * scale) as u64;
        let mut res: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
        for seed in 1..=seeds {
            for (i, mode) in modes.iter().enumerate() {
                let o = scenario::run(&Run {
                    net: net.clone(),
                    cells: Cells::NoMoves,
                    mode: mode.clone(),
                    traffic: Traffic {
                        bytes,
                        buf: Some(16 * 1024),
                        cc: Some("reno".into()),
                        mh_opens: false,
                    },
                    seed,
                    msrs: 2,
                    timeout: Duration::from_secs(1800),
                })
                .map_err(|e| e.to_string())?;
                eprintln!(
                    "{} {:<12} seed {seed}: {:7.2} KB/s  {}",
                    net.name,
                    mode.label(),
                    o.kbytes_per_s(),
                    if o.recv.ok { "intact" } else { "FAILED" }
                );
                if !o.recv.ok {
                    return Err(format!(
                        "{} {} seed {seed}: {}",
                        net.name,
                        mode.label(),
                        o.recv.error.unwrap_or_default()
                    ));
                }
                res[i].push(o.kbytes_per_s());
            }
        }
        let cell = |v: &[f64]| {
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.2} [{lo:.2}–{hi:.2}]", report::median(v))
        };
        let (pr, pi) = if net.name == "LAN" {
            (report::PAPER_REGULAR.lan[0], report::PAPER_ITCP.lan[0])
        } else {
            (report::PAPER_REGULAR.wan[0], report::PAPER_ITCP.wan[0])
        };
        println!(
            "| {} | {} | {} | {:.2} | {pr:.2} | {pi:.2} | {:.2} |",
            net.name,
            cell(&res[0]),
            cell(&res[1]),
            report::median(&res[1]) / report::median(&res[0]),
            pi / pr
        );
    }
    Ok(())
}

/// Where `up --itcp` serves the status page and /metrics on each MSR's fixed-LAN
/// address.
const METRICS_PORT: u16 = 9473;

fn up(cfg: LabConfig, itcp: bool) -> Result<(), String> {
    // With I-TCP: MH 1 runs the agent, MH 2 nothing of ours (network detection).
    let mhs = if itcp { 2 } else { 1 };
    let mut lab = Lab::with_mhs(cfg, mhs).map_err(|e| e.to_string())?;
    let hosts: Vec<Host> = [Host::Fh, Host::Gw]
        .into_iter()
        .chain((1..=lab.msrs()).map(Host::Msr))
        .chain((1..=mhs).map(Host::mh))
        .collect();
    if !itcp {
        println!("lab {} is up; namespaces:", lab.id);
        for h in &hosts {
            println!("  {h:<5} {}", lab.ns(*h));
        }
        println!("emulator control: {}", lab.control_path().display());
        println!("e.g.  ip netns exec {} bash", lab.ns(Host::Mh));
        println!(
            "      itcp-lab ctl --control {} '{{\"op\":\"status\"}}'",
            lab.control_path().display()
        );
        println!("Ctrl-C tears it down.");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    eprintln!(
        "starting msrd on {} MSRs, MH1's agent, the FH's servers…",
        lab.msrs()
    );
    lab.msrd_log_level = "info".into();
    // MH2's connections to the FH's web port are intercepted (it knows no SOCKS).
    let extra = format!(
        "[metrics]\nlisten = \"{{MSR_LAN}}:{METRICS_PORT}\"\n\
         [transparent]\nenabled = true\nports = [80]\n"
    );
    lab.start_itcp_agent_and_bare(&extra, &[])
        .map_err(|e| e.to_string())?;
    lab.start_fh_echo(7).map_err(|e| e.to_string())?;
    let bin = lab::bin_path("msrd");
    let bin = bin.parent().unwrap_or(std::path::Path::new("."));
    let dir = lab.dir.display().to_string();
    let cell = |k: usize| format!("MSR{k}'s cell");
    println!(
        "I-TCP lab {} is up: FH (10.0.0.1), GW, {}, MH ({}, the agent) and MH2 ({}, \
         nothing of ours), both in {}.",
        lab.id,
        (1..=lab.msrs())
            .map(|k| format!("MSR{k} ({})", lab::addr::msr_lan(k)))
            .collect::<Vec<_>>()
            .join(", "),
        lab::addr::mh(1),
        lab::addr::mh(2),
        cell(1)
    );
    println!("The walkthrough is docs/try-it.md. Paste this into a root shell first:\n");
    println!("export LAB={dir} BIN={}", bin.display());
    for h in &hosts {
        println!("export {}_NS={}", h, lab.ns(*h));
    }
    println!();
    for (what, cmd) in TRY_IT {
        println!("# {what}\n{cmd}\n");
    }
    for k in 2..=lab.msrs() {
        println!(
            "# MSR{k}: its status page is http://{}:{METRICS_PORT}/, its control socket $LAB/msrd{k}.sock\n",
            lab::addr::msr_lan(k)
        );
    }
    println!("Logs: $LAB/msrd1.log … (msrd), $LAB/agent.events (the agent's events).");
    println!("Ctrl-C tears the lab down.");
    let _ = std::io::stdout().flush();
    // ttcp http serves one request: serve the next one as each ends, until Ctrl-C
    // (the signal handler tears the lab down and exits).
    let ttcp = lab::bin_path("ttcp");
    loop {
        let started = std::time::Instant::now();
        let status = lab
            .command(Host::Fh, &ttcp)
            .and_then(|mut c| {
                c.args(["http", "--listen", "10.0.0.1:80"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
            })
            .map_err(|e| format!("ttcp http on the FH: {e}"))?;
        if !status.success() && started.elapsed() < Duration::from_millis(100) {
            // It cannot listen at all: do not spin.
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// What `up --itcp` prints after the lab's variables, and docs/try-it.md walks
/// through (tests/tests/try_it.rs checks that the page has each command as printed,
/// and runs the page's).
const TRY_IT: &[(&str, &str)] = &[
    (
        "MSR1's status page as a screenshot (chromium, as root, needs --no-sandbox)",
        r#"ip netns exec $GW_NS chromium --headless --no-sandbox --disable-gpu \
  --window-size=1400,1000 --screenshot=$LAB/msr1.png http://10.1.0.11:9473/ 2>/dev/null
ls -l $LAB/msr1.png"#,
    ),
    (
        "MSR1's status page in your own browser: forward a port, open http://127.0.0.1:9473/",
        r#"socat TCP-LISTEN:9473,bind=127.0.0.1,fork,reuseaddr \
  EXEC:"ip netns exec $GW_NS socat STDIO TCP\:10.1.0.11\:9473" &"#,
    ),
    (
        "MSR1's counters, as Prometheus scrapes them",
        r#"ip netns exec $GW_NS curl -s http://10.1.0.11:9473/metrics | grep -E '^msrd_(connections_total|handoffs_total)'"#,
    ),
    (
        "a connection through I-TCP for 8 s; after 2 s the MH moves to MSR2's cell",
        r#"ip netns exec $MH_NS env ITCP_TOKEN_FILE=$LAB/mh-token \
  $BIN/ttcp rr --connect 10.0.0.1:7 --itcp --count 400 --interval-ms 20 > $LAB/rr.json &
sleep 2
$BIN/itcp-lab ctl --control $LAB/airlink.sock '{"op":"assoc","cells":[2]}'
wait; tail -n 3 $LAB/agent.events"#,
    ),
    (
        "both MSRs' handoff logs as one timeline",
        r#"$BIN/itcpctl handoffs $LAB/handoffs-msr1.jsonl $LAB/handoffs-msr2.jsonl"#,
    ),
    (
        "MSR2's live connections and counters (it serves the MH now)",
        r#"$BIN/itcpctl --socket $LAB/msrd2.sock sessions
$BIN/itcpctl --socket $LAB/msrd2.sock stats | grep -E 'handoffs_|moved_'"#,
    ),
    (
        "curl as it is, through SOCKS5 on the cell gateway address (GET /N: N bytes)",
        r#"ip netns exec $MH_NS curl -s --socks5 10.2.0.1:1080 -o /dev/null \
  -w '%{http_code} %{size_download} bytes\n' http://10.0.0.1/1000000"#,
    ),
    (
        "the same curl under the LD_PRELOAD shim (port 80 goes through I-TCP)",
        r#"ip netns exec $MH_NS env LD_PRELOAD=$BIN/libitcp_preload.so ITCP_GATEWAY=10.2.0.1 \
  ITCP_TOKEN_FILE=$LAB/mh-token ITCP_PRELOAD_PORTS=80 \
  curl -s -o /dev/null -w '%{http_code} %{size_download} bytes\n' http://10.0.0.1/1000000"#,
    ),
    (
        "MH2 runs nothing of ours: its download moves with it, found by network detection",
        r#"ip netns exec $MH2_NS curl -s --limit-rate 1M -o /dev/null \
  -w '%{http_code} %{size_download} bytes\n' http://10.0.0.1/3000000 &
sleep 1
$BIN/itcp-lab ctl --control $LAB/airlink.sock '{"op":"assoc","cells":[2],"mh":2}'
wait; $BIN/itcpctl handoffs $LAB/handoffs-msr1.jsonl $LAB/handoffs-msr2.jsonl | grep 10.2.0.101"#,
    ),
    (
        "both MHs back to MSR1's cell",
        r#"$BIN/itcp-lab ctl --control $LAB/airlink.sock '{"op":"assoc","cells":[1]}'
$BIN/itcp-lab ctl --control $LAB/airlink.sock '{"op":"assoc","cells":[1],"mh":2}'"#,
    ),
];

fn ctl(path: &str, req: &str) -> Result<(), String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("{path}: {e}"))?;
    s.write_all(format!("{}\n", req.trim()).as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    print!("{line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> itcp_cli::Result<Job> {
        parse(Args::new(&SPEC, a.iter().copied()))
    }

    #[test]
    fn table_and_parser_agree() {
        itcp_cli::check_table(&SPEC, parse);
        // As the tests and scripts call it.
        assert!(matches!(
            p(&["bench", "baseline", "--nets", "lan", "--scale", "0.03"]),
            Ok(Job::Baseline(Baseline { ref nets, .. })) if nets.len() == 1
        ));
        assert!(matches!(
            p(&["bench", "conns", "--count", "200", "--bytes", "4096"]),
            Ok(Job::Conns(200, 4096))
        ));
        assert!(matches!(
            p(&["bench", "firstbyte", "--moves", "3", "--detection", "network,beacon"]),
            Ok(Job::FirstByte(FirstByteOpts { moves: 3, ref detections, .. }))
                if detections == &[Detection::Network, Detection::Beacon]
        ));
        assert!(p(&["bench", "firstbyte", "--detection", "psychic"]).is_err());
        assert!(matches!(
            p(&["bench", "firstbyte"]),
            Ok(Job::FirstByte(FirstByteOpts { fifo: false, .. }))
        ));
        assert!(matches!(
            p(&["bench", "firstbyte", "--airlink", "fifo"]),
            Ok(Job::FirstByte(FirstByteOpts { fifo: true, .. }))
        ));
        assert!(p(&["bench", "firstbyte", "--airlink", "realtime"]).is_err());
        assert!(matches!(
            p(&["bench", "handoff", "--airlink", "fifo"]),
            Ok(Job::Handoff(_, _, _, _, true, true))
        ));
        assert!(matches!(
            p(&["bench", "handoff", "--parts", "no"]),
            Ok(Job::Handoff(_, _, _, _, false, false))
        ));
        {
            use itcp_testbed::upload::{Kind, Move};
            assert!(matches!(
                p(&["bench", "upload", "--kinds", "bulk", "--shapes", "gap:500,fade:1000"]),
                Ok(Job::Upload(UploadOpts { moves: 20, ref kinds, ref shapes, .. }))
                    if kinds == &[Kind::Bulk] && shapes == &[Move::Gap(500), Move::Fade(1000)]
            ));
            for bad in ["fade", "fade:x", "fade:20000", "glide:100"] {
                assert!(p(&["bench", "upload", "--shapes", bad]).is_err(), "{bad}");
            }
            assert!(p(&["bench", "upload", "--kinds", "trickle"]).is_err());
        }
        assert!(matches!(
            p(&["bench", "churn", "--total", "3000", "--concurrency", "200"]),
            Ok(Job::Churn(3000, 200))
        ));
        assert!(matches!(
            p(&["bench", "relay", "--seconds", "1", "--rounds", "1"]),
            Ok(Job::Relay(1, 1, ref v, None)) if v.len() == 5
        ));
        assert!(matches!(
            p(&["bench", "relay", "--peers", "msrd,msrd-handoff"]),
            Ok(Job::Relay(5, 3, ref v, None)) if v == &[Peer::Msrd, Peer::MsrdHandoff]
        ));
        assert!(p(&["bench", "relay", "--peers", "nginx"]).is_err());
        assert!(matches!(
            p(&["echo", "--listen", "10.0.0.1:9000"]),
            Ok(Job::Echo(_))
        ));
        assert!(matches!(
            p(&["ctl", "--control", "/c.sock", "{not json"]),
            Ok(Job::Ctl(ref c, ref r)) if c == "/c.sock" && r == "{not json"
        ));
        assert!(matches!(p(&["cleanup", "--all"]), Ok(Job::Cleanup(true))));
        assert!(matches!(
            p(&["bench", "soak", "--minutes", "0.5", "--mhs", "3", "--seed", "7"]),
            Ok(Job::Soak(ref o, None)) if o.seconds == 30.0 && o.mhs == 3 && o.seed == 7 && o.msrs == 3
        ));
        assert!(p(&["bench", "soak", "--msrs", "1"]).is_err());
        assert!(p(&["bench", "soak", "--mhs", "0"]).is_err());
        assert!(
            matches!(p(&["bench", "paper", "--msrd", "a\\nb"]), Ok(Job::Paper(ref o)) if o.msrd_extra == "a\nb")
        );
        assert!(
            matches!(p(&["bench", "paper"]), Ok(Job::Paper(ref o)) if o.detection == Detection::Beacon)
        );
        assert!(
            matches!(p(&["bench", "paper", "--detection", "solicit"]), Ok(Job::Paper(ref o)) if o.detection == Detection::Solicit)
        );
        assert!(
            matches!(p(&["bench", "baseline", "--detection", "solicit"]), Ok(Job::Baseline(ref o)) if o.detection == Detection::Solicit)
        );
        assert!(
            matches!(p(&["bench", "paper", "--detection", "network"]), Ok(Job::Paper(ref o)) if o.detection == Detection::Network)
        );
        // The baseline alone has no MSR to detect for it.
        assert!(p(&["bench", "baseline", "--detection", "network"]).is_err());
        assert!(p(&["bench", "paper", "--detection", "psychic"]).is_err());
        assert!(
            matches!(p(&["bench", "paper", "--from-runs", "/r.json"]), Ok(Job::Paper(ref o)) if o.from_runs.as_deref() == Some(std::path::Path::new("/r.json")))
        );
        // Errors.
        assert!(p(&["bench", "baseline", "--scale", "0"]).is_err());
        assert!(p(&["bench", "baseline", "--seeds", "0"]).is_err());
        assert!(p(&["bench", "baseline", "--nets", "moon"]).is_err());
        assert!(p(&["bench", "paper", "--sweep", "maybe"]).is_err());
        assert!(p(&["bench", "relay", "--count", "1"]).is_err());
        assert!(p(&["bench"]).is_err());
        assert!(p(&["up", "--msrs", "0"]).is_err());
    }
}
