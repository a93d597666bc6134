//! Scenarios: one transfer on a fresh lab under a handoff schedule, with everything
//! needed to judge it afterwards (both ttcp reports, the emulator's association history
//! and counters, the reroutes).
//!
//! The network profiles and cell configurations are the paper's (seed 004 §4, issue 5):
//! wireless cells 2 Mbit/s, 2 ms one-way, 1 % loss per direction; FH–GW 10 Mbit/s with
//! 1 ms (LAN) or 100 ms (WAN) one-way delay; moves every 8 s.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::baseline::{MobileIp, MobileIpOpts, Registration};
use crate::dna::{Announcer, Probe};
use crate::emu::{
    AssocEvent, CountersReply, Crossing, Dir, LinkCounters, LinkParams, ReplyBody, Request,
    Schedule,
};
use crate::lab::{self, addr, bin_path, Host, Lab, LabConfig};
use crate::ttcp::{RecvReport, RrReport, SendReport};

/// Link parameters of a network.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Net {
    pub name: String,
    pub wan: LinkParams,
    pub cell: LinkParams,
}

/// Bytes of drop-tail queue per link direction: 50 full-size packets, a common router
/// default (and 300 ms at 2 Mbit/s).
const QUEUE: u64 = 75_000;

impl Net {
    fn with_queue(mut p: LinkParams) -> LinkParams {
        p.queue_bytes = QUEUE;
        p
    }

    /// The paper's LAN: FH–GW 10 Mbit/s, 1 ms; cells 2 Mbit/s, 2 ms, 1 % loss.
    pub fn lan() -> Net {
        Net {
            name: "LAN".into(),
            wan: Self::with_queue(lab::link(10_000_000, 1.0, 0.0)),
            cell: Self::with_queue(lab::link(2_000_000, 2.0, 0.01)),
        }
    }

    /// The paper's WAN: FH–GW 10 Mbit/s, 100 ms one-way; cells as in the LAN.
    pub fn wan() -> Net {
        Net {
            name: "WAN".into(),
            wan: Self::with_queue(lab::link(10_000_000, 100.0, 0.0)),
            ..Net::lan()
        }
    }
}

/// How the MH moves during a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Cells {
    NoMoves,
    /// Moves every `period_s` with both cells present for `overlap_s`.
    Overlapped {
        period_s: f64,
        overlap_s: f64,
    },
    /// Moves every `period_s` with `gap_s` of no cell between.
    NonOverlapped {
        period_s: f64,
        gap_s: f64,
    },
}

impl Cells {
    /// The paper's four columns: no moves; overlapped; non-overlapped 0 s; 1 s.
    /// Overlap lasts 2 s: long enough to hear one beacon (1 s) and register.
    pub fn paper_columns() -> [Cells; 4] {
        [
            Cells::NoMoves,
            Cells::Overlapped {
                period_s: 8.0,
                overlap_s: 2.0,
            },
            Cells::NonOverlapped {
                period_s: 8.0,
                gap_s: 0.0,
            },
            Cells::NonOverlapped {
                period_s: 8.0,
                gap_s: 1.0,
            },
        ]
    }

    pub fn label(&self) -> String {
        match self {
            Cells::NoMoves => "no moves".into(),
            Cells::Overlapped { .. } => "overlapped".into(),
            Cells::NonOverlapped { gap_s, .. } => format!("non-overlapped {gap_s} s"),
        }
    }

    pub fn schedule(&self, msrs: usize) -> Option<Schedule> {
        let cells: Vec<usize> = (1..=msrs).collect();
        match *self {
            Cells::NoMoves => None,
            Cells::Overlapped {
                period_s,
                overlap_s,
            } => Some(Schedule {
                cells,
                period_s,
                crossing: Crossing::Overlap { overlap_s },
                max_switches: None,
            }),
            Cells::NonOverlapped { period_s, gap_s } => Some(Schedule {
                cells,
                period_s,
                crossing: Crossing::Gap { gap_s },
                max_switches: None,
            }),
        }
    }
}

/// How the MH notices that it moved (docs/architecture.md §7). A comparison uses the same for
/// both modes: the I-TCP agent and the baseline's Mobile-IP-like agent detect alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Detection {
    /// The MSRs' periodic beacons (every 1 s), as in the paper: up to an interval's
    /// wait after each move.
    #[default]
    Beacon,
    /// Link-up solicitation: when the MH's carrier comes up it asks for a beacon, and
    /// the MSRs answer at once.
    Solicit,
    /// Network detection, I-TCP only: the MH runs nothing of ours (a plain `ttcp`
    /// through transparent mode, no agent, no mh-lib) and the new MSR pulls its
    /// connection on the MH's first frame in the cell (`detect = "network"`; the MH's
    /// OS probes its gateway on link-up, [`crate::dna`]). Regular TCP, which has no MSR
    /// to detect for it, gets link-up solicitation. The MH opens the connection in
    /// both modes (transparent mode splits the MH's connections).
    Network,
}

impl Detection {
    pub const ALL: [Detection; 3] = [Detection::Beacon, Detection::Solicit, Detection::Network];

    pub fn name(self) -> &'static str {
        match self {
            Detection::Beacon => "beacon",
            Detection::Solicit => "solicit",
            Detection::Network => "network",
        }
    }

    pub fn parse(s: &str) -> Option<Detection> {
        Detection::ALL.into_iter().find(|d| d.name() == s)
    }

    /// `itcp-mh-agent` arguments for this detection (it solicits by default).
    pub fn agent_args(self) -> &'static [&'static str] {
        match self {
            Detection::Beacon => &["--no-solicit"],
            Detection::Solicit | Detection::Network => &[],
        }
    }

    /// The baseline's options for this detection and movement `policy`.
    pub fn mobile_ip(self, policy: itcp_mh::mobility::Policy) -> MobileIpOpts {
        MobileIpOpts {
            policy,
            solicit: self != Detection::Beacon,
            ..MobileIpOpts::default()
        }
    }

    /// Both modes of a comparison with this detection: regular TCP with `policy`, and
    /// I-TCP with `msrd_extra` and extra agent arguments.
    pub fn modes(
        self,
        policy: itcp_mh::mobility::Policy,
        msrd_extra: &str,
        agent: &[&str],
    ) -> [Mode; 2] {
        let mut args: Vec<String> = self.agent_args().iter().map(|a| a.to_string()).collect();
        args.extend(agent.iter().map(|a| a.to_string()));
        let itcp = match self {
            Detection::Network => Mode::ItcpNetwork {
                msrd_extra: msrd_extra.into(),
            },
            _ => Mode::Itcp {
                msrd_extra: msrd_extra.into(),
                agent: args,
            },
        };
        [Mode::RegularTcp(self.mobile_ip(policy)), itcp]
    }

    /// Whether the MH opens the connection (the FH listens): with network detection,
    /// where transparent mode splits the MH's connections.
    pub fn mh_opens(self) -> bool {
        self == Detection::Network
    }
}

/// How the connection crosses the MSRs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Mode {
    /// Plain routers plus Mobile-IP-like rerouting (the baseline).
    RegularTcp(#[serde(skip)] MobileIpOpts),
    /// I-TCP: msrd with `[handoff]` on every MSR and the MH's mobility agent; the MH
    /// listens through mh-lib and the FH connects to the MH's address, as with regular
    /// TCP. `msrd_extra` is appended to each msrd config (e.g. a `[wireless]` section);
    /// `agent` are extra `itcp-mh-agent` arguments (e.g. `--policy lazy`).
    Itcp {
        msrd_extra: String,
        #[serde(default)]
        agent: Vec<String>,
    },
    /// I-TCP for an MH that runs nothing of ours: msrd with `[handoff]`, a shared
    /// gateway MAC and network detection on every cell, transparent mode for the
    /// transfer's port; the MH runs a plain `ttcp` and opens the connection
    /// ([`Traffic::mh_opens`]).
    ItcpNetwork { msrd_extra: String },
}

impl Mode {
    pub fn label(&self) -> &'static str {
        match self {
            Mode::RegularTcp(_) => "regular TCP",
            Mode::Itcp { .. } | Mode::ItcpNetwork { .. } => "I-TCP",
        }
    }

    pub fn is_itcp(&self) -> bool {
        !matches!(self, Mode::RegularTcp(_))
    }
}

/// The traffic of a run: the FH sends `bytes` to the MH (MH listens, as `ttcp -r`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Traffic {
    pub bytes: u64,
    /// SO_SNDBUF/SO_RCVBUF at FH and MH (the paper's 16 KB window); None = autotuned.
    pub buf: Option<usize>,
    /// Congestion control at the FH (and MH); None = the kernel's default.
    pub cc: Option<String>,
    /// The MH opens the connection and the FH listens (else the reverse). The bytes
    /// flow from the FH to the MH either way.
    #[serde(default)]
    pub mh_opens: bool,
}

#[derive(Debug, Clone)]
pub struct Run {
    pub net: Net,
    pub cells: Cells,
    pub mode: Mode,
    pub traffic: Traffic,
    pub seed: u64,
    pub msrs: usize,
    /// Give up after this long.
    pub timeout: Duration,
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub net: String,
    pub cells: Cells,
    pub seed: u64,
    pub recv: RecvReport,
    pub send: Option<SendReport>,
    /// Association changes (CLOCK_MONOTONIC ns) and reroutes.
    pub events: Vec<AssocEvent>,
    pub registrations: Vec<Registration>,
    /// I-TCP: the handoffs as the new MSRs logged them.
    #[serde(default)]
    pub handoffs: Vec<itcp_handoff::log::Record>,
    /// I-TCP: RSTs (FH in, FH out, MH in, MH out) counted during the run.
    #[serde(default)]
    pub rsts: Option<(u64, u64, u64, u64)>,
    /// Fraction of the transfer's time in which the MH had a cell.
    pub coverage: f64,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC in µs at the end of the run: relates the
    /// handoff records' phases (wall clock) to `events` (None in older runs).
    #[serde(default)]
    pub wall_minus_mono_us: Option<i64>,
    /// The emulator's counters by link.
    pub counters: BTreeMap<String, LinkCounters>,
}

impl Outcome {
    /// Goodput at the MH in KB/s (1 KB = 1024 bytes, as the paper's tables).
    pub fn kbytes_per_s(&self) -> f64 {
        self.recv.goodput_bps / 8.0 / 1024.0
    }
}

/// Runs one transfer on a fresh lab. Errors are setup failures; a transfer that fails
/// verification comes back as an Outcome with `recv.ok == false`.
pub fn run(r: &Run) -> io::Result<Outcome> {
    run_with(r, &[])
}

/// [`run`] with per-cell link parameters replacing the network's (cell number, both
/// directions), set before the transfer starts (e.g. a slow second cell).
pub fn run_with(r: &Run, cell_links: &[(usize, crate::emu::LinkParams)]) -> io::Result<Outcome> {
    run_observed(r, cell_links, Observe::default()).map(|o| o.outcome)
}

/// What [`run_observed`] watches beside the transfer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observe {
    /// The bytes queued in the MSRs' TCP sockets (receive and send queues of every
    /// established socket in every MSR's namespace, summed) every 200 ms. Bytes inside
    /// msrd's splice pipes are not seen.
    pub queues: bool,
    /// The emulator's counters every [`COUNTERS_EVERY`].
    pub counters: bool,
    /// This many exchanges of an interactive echo beside the transfer: 100 bytes from
    /// the MH every 50 ms to an echo at the FH (port [`ECHO_PORT`], intercepted too).
    pub echo: Option<u32>,
}

/// How often [`Observe::counters`] samples.
pub const COUNTERS_EVERY: Duration = Duration::from_millis(20);

/// The FH's echo port for [`Observe::echo`].
pub const ECHO_PORT: u16 = 5003;

/// What [`run_observed`] saw.
#[derive(Debug)]
pub struct Observed {
    pub outcome: Outcome,
    /// [`Observe::queues`]' samples, bytes.
    pub queued: Vec<u64>,
    /// [`Observe::counters`]' samples (`now_ns` is CLOCK_MONOTONIC, as the events').
    pub counters: Vec<CountersReply>,
    /// [`Observe::echo`]'s report.
    pub echo: Option<RrReport>,
}

/// [`run_with`], watching what `observe` asks for while the transfer runs.
pub fn run_observed(
    r: &Run,
    cell_links: &[(usize, crate::emu::LinkParams)],
    observe: Observe,
) -> io::Result<Observed> {
    let mut lab = Lab::new(LabConfig {
        msrs: r.msrs,
        seed: r.seed,
        wan_down: r.net.wan.clone(),
        wan_up: r.net.wan.clone(),
        cell_down: r.net.cell.clone(),
        cell_up: r.net.cell.clone(),
        initial_cells: vec![1],
        veth: false,
        ipv6: false,
    })?;
    for (k, p) in cell_links {
        lab.emu(Request::Link {
            link: format!("cell{k}"),
            dir: Dir::Both,
            params: p.clone(),
        })?;
    }
    let mut agent = None;
    let mut announcer = None;
    let mut itcp = false;
    match &r.mode {
        Mode::RegularTcp(mip) => agent = Some(MobileIp::start(&lab, mip.clone())?),
        Mode::Itcp { msrd_extra, agent } => {
            lab.msrd_log_level = "info".into();
            let mut args: Vec<&str> = vec!["--hysteresis-ms", "0"];
            args.extend(agent.iter().map(String::as_str));
            // Beacons at the same seeded wall-clock phases as the baseline's.
            lab.beacon_offsets = true;
            lab.start_itcp_mobility(msrd_extra, &args)?;
            lab.watch_rsts(Host::Fh)?;
            lab.watch_rsts(Host::Mh)?;
            itcp = true;
        }
        Mode::ItcpNetwork { msrd_extra } => {
            lab.msrd_log_level = "info".into();
            let port = 5001;
            let echo = observe
                .echo
                .map_or(String::new(), |_| format!(", {ECHO_PORT}"));
            lab.start_itcp_network(&format!(
                "[transparent]\nenabled = true\nports = [{port}{echo}]\n{msrd_extra}"
            ))?;
            lab.watch_rsts(Host::Fh)?;
            lab.watch_rsts(Host::Mh)?;
            announcer = Some(Announcer::start(
                &lab.ns(Host::Mh),
                "air0",
                Probe::Gateway(addr::CELL_GW.to_string()),
            )?);
            itcp = true;
        }
    }
    // ITCP_PCAP=1 (with ITCP_LAB_KEEP=1): what the FH and the first MSR see.
    if std::env::var_os("ITCP_PCAP").is_some() {
        for h in [Host::Fh, Host::Msr(1)] {
            lab.record_packets(h)?;
        }
    }
    let ttcp = bin_path("ttcp");
    let port = 5001;
    let mut common: Vec<String> = vec![
        "--bytes".into(),
        r.traffic.bytes.to_string(),
        "--seed".into(),
        r.seed.to_string(),
    ];
    if let Some(b) = r.traffic.buf {
        common.extend(["--buf".into(), b.to_string()]);
    }
    if let Some(cc) = &r.traffic.cc {
        common.extend(["--cc".into(), cc.clone()]);
    }
    let args = |role: &str, ep: &str, addr: String| -> Vec<String> {
        let mut a = vec![role.to_string(), ep.to_string(), addr];
        a.extend(common.iter().cloned());
        a
    };
    // With mh-lib (`--itcp`) the MH listens through its MSR; a plain MH opens the
    // connection itself when `mh_opens`.
    let explicit = matches!(r.mode, Mode::Itcp { .. });
    let (recv_args, send_args) = if r.traffic.mh_opens {
        (
            args("recv", "--connect", lab::fh_addr(port)),
            args("send", "--listen", lab::fh_addr(port)),
        )
    } else {
        let mut recv_args = args("recv", "--listen", lab::mh_addr(port));
        if explicit {
            recv_args.push("--itcp".into());
        }
        (recv_args, args("send", "--connect", lab::mh_addr(port)))
    };
    // The listening side first: the FH when the MH opens, else the MH.
    let (first_host, first_args, second_host, second_args) = if r.traffic.mh_opens {
        (Host::Fh, &send_args, Host::Mh, &recv_args)
    } else {
        (Host::Mh, &recv_args, Host::Fh, &send_args)
    };
    let echo_server = match observe.echo {
        Some(_) => {
            let listen = lab::fh_addr(ECHO_PORT);
            let i = lab.spawn(Host::Fh, &ttcp, &["echo", "--listen", &listen])?;
            lab.wait_listening(Host::Fh, ECHO_PORT)?;
            Some(i)
        }
        None => None,
    };
    let first = lab.spawn(first_host, &ttcp, &strs(first_args))?;
    if r.traffic.mh_opens {
        lab.wait_listening(Host::Fh, port)?;
    } else if explicit {
        // The FH must not connect before the MH's listener exists at its MSR: the SYN
        // would be routed on to the MH, whose kernel answers RST (counted as one).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !lab
            .msrd_sessions(1)
            .map(|v| {
                v.iter()
                    .any(|s| s.kind == itcp_proto::control::Kind::AcceptWait)
            })
            .unwrap_or(false)
        {
            if std::time::Instant::now() > deadline {
                return Err(io::Error::other(
                    "the MH's ttcp did not listen through msrd in 10 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let start_ns = match r.cells.schedule(r.msrs) {
        Some(s) => {
            // Moves start on a whole second of the wall clock, so that the beacon phases
            // (also wall-clock aligned) relative to the moves depend only on the seed.
            let start_in_s = lab::until_wall_aligned(1000, 0).as_secs_f64() + 1.0;
            match lab.emu(Request::Schedule {
                schedule: s,
                start_in_s,
            })? {
                ReplyBody::Schedule { start_ns } => start_ns,
                _ => 0,
            }
        }
        None => crate::sys::mono_ns(),
    };
    let second = lab.spawn(second_host, &ttcp, &strs(second_args))?;
    let (recv, send) = if r.traffic.mh_opens {
        (second, first)
    } else {
        (first, second)
    };
    let queue_sampler = observe.queues.then(|| {
        let nss: Vec<String> = (1..=r.msrs).map(|k| lab.ns(Host::Msr(k))).collect();
        Sampler::start(Duration::from_millis(200), move || {
            Some(nss.iter().map(|ns| queued_in(ns)).sum())
        })
    });
    let counter_sampler = observe.counters.then(|| {
        let control = lab.control_path().to_path_buf();
        Sampler::start(COUNTERS_EVERY, move || lab::counters_at(&control).ok())
    });
    let echo_client = match observe.echo {
        Some(count) => {
            let (to, count) = (lab::fh_addr(ECHO_PORT), count.to_string());
            let args = ["rr", "--connect", &to, "--count", &count, "--size", "100"];
            let mut args = args.to_vec();
            args.extend(["--interval-ms", "50"]);
            Some(lab.spawn(Host::Mh, &ttcp, &args)?)
        }
        None => None,
    };
    let (_, rout, rerr) = lab.wait(recv, r.timeout)?;
    let queued = queue_sampler.map(Sampler::stop).unwrap_or_default();
    let counter_samples = counter_sampler.map(Sampler::stop).unwrap_or_default();
    let echo = match echo_client {
        Some(i) => {
            let (_, out, err) = lab.wait(i, Duration::from_secs(60))?;
            let r: RrReport = serde_json::from_str(out.trim()).map_err(|e| {
                io::Error::other(format!("echo client gave no report ({e}): {}", err.trim()))
            })?;
            Some(r)
        }
        None => None,
    };
    if let Some(i) = echo_server {
        lab.terminate(i);
    }
    let (_, sout, _) = lab.wait(send, Duration::from_secs(10))?;
    let status = lab.emu_status()?;
    let counters = lab.counters()?.links;
    let registrations = agent
        .as_ref()
        .map(MobileIp::registrations)
        .unwrap_or_default();
    drop(agent);
    drop(announcer);
    let (mut handoffs, mut rsts) = (Vec::new(), None);
    if itcp {
        for k in 1..=r.msrs {
            handoffs.extend(
                lab.handoff_records(k)
                    .into_iter()
                    .filter(|h| h.role == itcp_handoff::log::Role::New),
            );
        }
        handoffs.sort_by_key(|h| h.phases.greeting);
        let (a, b) = lab.rsts(Host::Fh)?;
        let (c, d) = lab.rsts(Host::Mh)?;
        rsts = Some((a, b, c, d));
    }
    let recv: RecvReport = serde_json::from_str(rout.trim()).map_err(|e| {
        io::Error::other(format!(
            "receiver gave no report ({e}); stderr: {}",
            rerr.trim()
        ))
    })?;
    let send: Option<SendReport> = serde_json::from_str(sout.trim()).ok();
    let events: Vec<AssocEvent> = status.events;
    let end_ns = recv.t0_mono_ns + (recv.duration_s * 1e9) as u64;
    let coverage = coverage(&events, start_ns.min(recv.t0_mono_ns), end_ns);
    let outcome = Outcome {
        net: r.net.name.clone(),
        cells: r.cells.clone(),
        seed: r.seed,
        recv,
        send,
        events,
        registrations,
        handoffs,
        rsts,
        coverage,
        wall_minus_mono_us: Some(wall_minus_mono_us()),
        counters,
    };
    Ok(Observed {
        outcome,
        queued,
        counters: counter_samples,
        echo,
    })
}

/// Takes a sample every period in a thread until stopped (None: no sample this time).
struct Sampler<T> {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<T>>,
}

impl<T: Send + 'static> Sampler<T> {
    fn start(every: Duration, mut sample: impl FnMut() -> Option<T> + Send + 'static) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut v = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                v.extend(sample());
                std::thread::sleep(every);
            }
            v
        });
        Sampler { stop, thread }
    }

    fn stop(self) -> Vec<T> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Receive plus send queue bytes of the established TCP sockets in namespace `ns`
/// (`ss`; 0 if it cannot say).
fn queued_in(ns: &str) -> u64 {
    let Ok(o) = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-tnH", "state", "established"])
        .output()
    else {
        return 0;
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            l.split_whitespace()
                .take(2)
                .filter_map(|w| w.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Fraction of [from, to) in which the association history shows at least one cell.
pub fn coverage(events: &[AssocEvent], from: u64, to: u64) -> f64 {
    if to <= from {
        return 1.0;
    }
    let mut covered = 0u64;
    for (i, e) in events.iter().enumerate() {
        let start = e.t_ns.max(from);
        let end = events.get(i + 1).map_or(to, |n| n.t_ns).min(to);
        if end > start && !e.cells.is_empty() {
            covered += end - start;
        }
    }
    // Before the first event the MH is in its initial cell.
    if let Some(first) = events.first() {
        if first.t_ns > from {
            covered += first.t_ns.min(to) - from;
        }
    }
    covered as f64 / (to - from) as f64
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC now, in µs.
pub fn wall_minus_mono_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
        - (crate::sys::mono_ns() / 1000) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_the_same_in_both_modes() {
        use itcp_mh::mobility::Policy;
        for d in Detection::ALL {
            assert_eq!(Detection::parse(d.name()), Some(d));
            let [Mode::RegularTcp(mip), itcp] = d.modes(Policy::Lazy, "x", &["--policy", "lazy"])
            else {
                panic!("regular TCP first");
            };
            assert_eq!(mip.policy, Policy::Lazy);
            // The baseline solicits unless it waits for beacons.
            assert_eq!(mip.solicit, d != Detection::Beacon);
            // Only network detection opens from the MH, where transparent mode splits.
            assert_eq!(d.mh_opens(), d == Detection::Network);
            match itcp {
                Mode::Itcp { msrd_extra, agent } => {
                    assert_ne!(d, Detection::Network);
                    assert_eq!(msrd_extra, "x");
                    // The I-TCP agent solicits unless told not to.
                    assert_eq!(
                        agent.contains(&"--no-solicit".to_string()),
                        d == Detection::Beacon
                    );
                    assert!(agent.ends_with(&["--policy".into(), "lazy".into()]));
                }
                Mode::ItcpNetwork { msrd_extra } => {
                    assert_eq!(d, Detection::Network);
                    assert_eq!(msrd_extra, "x");
                }
                Mode::RegularTcp(_) => panic!("I-TCP second"),
            }
        }
        assert_eq!(Detection::parse("nope"), None);
        assert_eq!(Detection::default(), Detection::Beacon);
    }

    #[test]
    fn coverage_counts_gaps() {
        let ev = |t: u64, c: &[usize]| AssocEvent {
            t_ns: t,
            cells: c.to_vec(),
        };
        let events = vec![
            ev(0, &[1]),
            ev(8, &[]),
            ev(9, &[2]),
            ev(16, &[]),
            ev(17, &[1]),
        ];
        assert!((coverage(&events, 0, 20) - 0.9).abs() < 1e-9);
        assert!((coverage(&events, 2, 12) - 0.9).abs() < 1e-9);
        assert_eq!(coverage(&events, 9, 16), 1.0);
    }

    #[test]
    fn paper_columns_have_schedules() {
        let c = Cells::paper_columns();
        assert!(c[0].schedule(2).is_none());
        for col in &c[1..] {
            let s = col.schedule(2).unwrap();
            assert!(s.validate(2).is_ok());
        }
    }
}
