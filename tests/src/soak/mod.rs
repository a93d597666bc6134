//! `itcp-lab bench soak`: the chaos soak of docs/architecture.md §8.
//!
//! One lab with three MSRs (or more) and several MHs ([`Lab::with_mhs`]: each MH is a
//! namespace of its own with its own address, token and `itcp-mh-agent`, all sharing
//! the cells). Every MH runs connection loops through I-TCP to a server at the FH —
//! bulk both ways, interactive request/response, short connections opened and closed
//! continuously — and both ends verify every byte against ttcp's seeded streams
//! ([`traffic`]). Meanwhile every MH moves at random among the cells with random
//! overlaps and blackouts, and faults are injected at random times or at a random
//! phase of a handoff ([`chaos`]): msrd SIGKILLed and restarted, the MSR⇄MSR channel
//! cut, greetings lost, a cell flushed.
//!
//! At the end the soak reports ([`report`]) the handoffs from every MSR's handoff log,
//! the bytes verified, every transfer's outcome, every RST seen at the FH and the MHs
//! (counted by nftables, captured with tcpdump for their 4-tuples) and whether an
//! injected fault explains it, and msrd's file descriptors, RSS, nftables set
//! elements, neighbour entries and routes at the end against the start ([`state`]).

pub mod chaos;
pub mod report;
pub mod state;
pub mod traffic;

use std::io::{self, BufRead};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use crate::lab::{self, addr, Host, Lab, LabConfig};
use crate::rng::SplitMix64;

pub use report::SoakReport;

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakOpts {
    /// How long the chaos lasts (then the transfers finish and the state settles).
    pub seconds: f64,
    pub seed: u64,
    pub mhs: usize,
    pub msrs: usize,
    /// Largest bulk transfer in bytes.
    pub max_bulk: u64,
    /// Move the MHs (off: every MH stays in cell 1).
    pub moves: bool,
    /// Inject faults.
    pub faults: bool,
}

impl Default for SoakOpts {
    fn default() -> Self {
        SoakOpts {
            seconds: 60.0,
            seed: 1,
            mhs: 8,
            msrs: 3,
            max_bulk: 4 << 20,
            moves: true,
            faults: true,
        }
    }
}

/// The soak's clock: seconds since its start, on CLOCK_MONOTONIC; wall-clock times
/// (tcpdump's, the handoff log's) are converted with the offset read at the start.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    mono0: u64,
    unix0: f64,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            mono0: crate::sys::mono_ns(),
            unix0: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
        }
    }

    pub fn now(&self) -> f64 {
        crate::sys::mono_ns().saturating_sub(self.mono0) as f64 / 1e9
    }

    /// A wall-clock time (seconds since the UNIX epoch) on this clock.
    pub fn from_unix(&self, s: f64) -> f64 {
        s - self.unix0
    }
}

/// Uniform in [lo, hi).
pub fn uniform(r: &mut SplitMix64, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * r.next_f64()
}

/// One line of an MH agent's output, stamped when the soak read it (≤ 100 ms late).
#[derive(Debug, Clone, Serialize)]
pub struct AgentEvent {
    pub t: f64,
    pub mh: usize,
    pub event: Value,
}

/// What every thread of the soak shares.
pub struct Shared {
    pub clock: Clock,
    /// Stop injecting faults (first: every msrd is back when the fault thread ends).
    pub stop_faults: AtomicBool,
    /// Then stop moving.
    pub stop_chaos: AtomicBool,
    /// Start no new connection (the ones open finish).
    pub stop_new: AtomicBool,
    /// The FH server stops accepting, then waits for its connections.
    pub stop_fh: AtomicBool,
    pub fh_ready: AtomicBool,
    stop_watch: AtomicBool,
    pub next_id: AtomicU64,
    pub mh_conns: Mutex<Vec<traffic::MhConn>>,
    pub fh_conns: Mutex<Vec<traffic::FhConn>>,
    pub crossings: Mutex<Vec<chaos::Crossing>>,
    pub faults: Mutex<Vec<chaos::Fault>>,
    pub agent: Mutex<Vec<AgentEvent>>,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            clock: Clock::new(),
            stop_faults: AtomicBool::new(false),
            stop_chaos: AtomicBool::new(false),
            stop_new: AtomicBool::new(false),
            stop_fh: AtomicBool::new(false),
            fh_ready: AtomicBool::new(false),
            stop_watch: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            mh_conns: Mutex::new(Vec::new()),
            fh_conns: Mutex::new(Vec::new()),
            crossings: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            agent: Mutex::new(Vec::new()),
        }
    }
}

/// `[handoff] linger_s` in the soak.
const LINGER_S: u64 = 20;

/// msrd's configuration in the soak: beacons every 200 ms so that many moves fit.
const MSRD_EXTRA: &str = "[beacon]\ninterval_ms = 200\nlifetime_ms = 600\n";
const AGENT: &[&str] = &["--hysteresis-ms", "0", "--beacon-interval-ms", "200"];

/// Tails every agent's event file, stamping new lines, until told to stop.
fn watch_agents(lab: &Lab, shared: &Shared) {
    let n = lab.mhs();
    let mut offsets = vec![0usize; n + 1];
    loop {
        let last = shared.stop_watch.load(Ordering::Relaxed);
        for (j, off) in offsets.iter_mut().enumerate().skip(1) {
            let Ok(text) = std::fs::read_to_string(lab.agent_events_path(j)) else {
                continue;
            };
            let Some(done) = text[(*off).min(text.len())..].rfind('\n') else {
                continue;
            };
            let t = shared.clock.now();
            let new = &text[*off..*off + done + 1];
            let mut ev = shared.agent.lock().unwrap();
            for l in new.lines() {
                if let Ok(v) = serde_json::from_str::<Value>(l) {
                    ev.push(AgentEvent { t, mh: j, event: v });
                }
            }
            *off += done + 1;
        }
        if last {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A tcpdump capturing the RSTs and FINs of one host (a FIN tells which MSR ended a
/// stream the soak finds truncated).
struct Capture {
    host: Host,
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

fn start_capture(lab: &Lab, h: Host, ifname: &str) -> io::Result<Capture> {
    let name = match h.mh_index() {
        Some(j) => format!("mh{j}"),
        None => "fh".into(),
    };
    let out = lab.dir.join(format!("rst-{name}.txt"));
    let err = lab.dir.join(format!("rst-{name}.log"));
    let args = [
        "-i",
        ifname,
        "-nn",
        "-tt",
        "-e",
        "-l",
        "--immediate-mode",
        "-s",
        "128",
        "tcp[tcpflags] & (tcp-rst | tcp-fin) != 0",
    ];
    let child = lab.start_tcpdump(h, &args, std::fs::File::create(&out)?.into(), &err)?;
    Ok(Capture {
        host: h,
        child,
        out,
        err,
    })
}

/// One RST (or FIN) packet seen at a host (tcpdump).
#[derive(Debug, Clone, Serialize)]
pub struct Rst {
    pub t: f64,
    /// `fh` or `mh<j>`.
    pub host: String,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    /// Sent by this host (else received).
    pub sent: bool,
    /// The frame's source MAC (at an MH: which MSR's cell it came from).
    pub src_mac: String,
    /// tcpdump's flags: `R` (a reply to a segment of no socket) or `R.` (an abort).
    pub flags: String,
}

fn parse_endpoint(s: &str) -> Option<SocketAddrV4> {
    let s = s.trim_end_matches(':');
    let (ip, port) = s.rsplit_once('.')?;
    Some(SocketAddrV4::new(ip.parse().ok()?, port.parse().ok()?))
}

/// Parses tcpdump's `-nn -tt -e` lines:
/// `TS SRCMAC > DSTMAC, ethertype IPv4 (0x0800), length N: A.B.C.D.P > E.F.G.H.Q: Flags [R.], …`.
pub fn parse_rst_line(line: &str, me: Ipv4Addr, host: &str, clock: &Clock) -> Option<Rst> {
    let (head, ip) = line.split_once(": ")?;
    let h: Vec<&str> = head.split_whitespace().collect();
    let f: Vec<&str> = ip.split_whitespace().collect();
    if h.len() < 2 || f.len() < 3 || f[1] != ">" || !head.contains("IPv4") {
        return None;
    }
    let src = parse_endpoint(f[0])?;
    let dst = parse_endpoint(f[2])?;
    let flags = ip
        .split_once("Flags [")
        .and_then(|(_, r)| r.split_once(']'))
        .map_or(String::new(), |(f, _)| f.to_string());
    Some(Rst {
        flags,
        t: clock.from_unix(h[0].parse().ok()?),
        host: host.to_string(),
        src,
        dst,
        sent: *src.ip() == me,
        src_mac: h[1].to_string(),
    })
}

/// Stops a capture: its RSTs, its FINs (without RST), and tcpdump's drop note.
fn stop_capture(mut c: Capture, clock: &Clock) -> (Vec<Rst>, Vec<Rst>, String) {
    // SAFETY: SIGINT to the tcpdump we started: it prints its counters and exits.
    unsafe { libc::kill(c.child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(3);
    while c.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.child.kill();
    let _ = c.child.wait();
    let (me, host) = match c.host.mh_index() {
        Some(j) => (addr::mh(j), format!("mh{j}")),
        None => (addr::FH, "fh".to_string()),
    };
    let (mut v, mut fins) = (Vec::new(), Vec::new());
    if let Ok(f) = std::fs::File::open(&c.out) {
        for l in io::BufReader::new(f).lines().map_while(Result::ok) {
            match parse_rst_line(&l, me, &host, clock) {
                Some(r) if r.flags.contains('R') => v.push(r),
                Some(r) if r.flags.contains('F') => fins.push(r),
                _ => {}
            }
        }
    }
    let log = std::fs::read_to_string(&c.err).unwrap_or_default();
    let dropped = log
        .lines()
        .find(|l| l.contains("dropped by kernel"))
        .unwrap_or("")
        .to_string();
    (v, fins, dropped)
}

/// Runs the soak and returns its report (see [`SoakReport::ok`] for the verdict).
pub fn run(o: &SoakOpts, progress: &dyn Fn(&str)) -> io::Result<SoakReport> {
    if o.msrs < 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the soak needs at least 2 MSRs",
        ));
    }
    let cell = lab::link(10_000_000, 2.0, 0.0);
    let wan = lab::link(100_000_000, 5.0, 0.0);
    let mut lab = Lab::with_mhs(
        LabConfig {
            msrs: o.msrs,
            seed: o.seed,
            wan_down: wan.clone(),
            wan_up: wan,
            cell_down: cell.clone(),
            cell_up: cell,
            initial_cells: vec![1],
            veth: false,
            ipv6: false,
        },
        o.mhs,
    )?;
    // Debug logs of a long soak would fill the disk; handoffs and errors are at info.
    lab.msrd_log_level = "info".into();
    // Connections an MH abandoned where it cannot be reached (a crash, a failed
    // handoff) end after the linger; a short one lets them end before the final check,
    // so what is left then is a leak. The soak's outages on live MSRs are far shorter.
    lab.handoff_extra = format!("linger_s = {LINGER_S}");
    progress(&format!(
        "lab {}: {} MSRs, {} MHs; starting msrd and the agents",
        lab.id, o.msrs, o.mhs
    ));
    let (msrd_idx, _) = lab.start_itcp_mobility(MSRD_EXTRA, AGENT)?;
    let hosts: Vec<Host> = std::iter::once(Host::Fh)
        .chain((1..=o.mhs).map(Host::mh))
        .collect();
    let mut captures = Vec::new();
    for &h in &hosts {
        lab.watch_rsts(h)?;
        captures.push(start_capture(
            &lab,
            h,
            if h == Host::Fh { "wan0" } else { "air0" },
        )?);
    }
    let msrds = Mutex::new(
        msrd_idx
            .iter()
            .map(|&i| chaos::Msrd {
                pid: lab.pid(i),
                child: None,
                restarts: 0,
            })
            .collect::<Vec<_>>(),
    );
    let shared = Arc::new(Shared::new());
    let fh_listen = SocketAddr::from((addr::FH, traffic::FH_PORT));
    let fh_thread = {
        let (ns, shared) = (lab.ns(Host::Fh), shared.clone());
        std::thread::spawn(move || crate::sys::in_netns(&ns, || traffic::run_fh(fh_listen, shared)))
    };
    while !shared.fh_ready.load(Ordering::Relaxed) {
        if fh_thread.is_finished() {
            return Err(match fh_thread.join() {
                Ok(Err(e)) => e,
                _ => io::Error::other("the FH server stopped"),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let start_state = (1..=o.msrs)
        .map(|k| state::snapshot(&lab, k, msrds.lock().unwrap()[k - 1].pid))
        .collect::<io::Result<Vec<_>>>()?;
    progress(&format!(
        "chaos for {:.0} s (seed {}); every byte verified at both ends",
        o.seconds, o.seed
    ));
    let t_chaos0 = shared.clock.now();
    let mut errors: Vec<String> = Vec::new();
    // msrd restarts happen on this thread (see chaos::faults).
    type Answer = std::sync::mpsc::Sender<io::Result<Child>>;
    let (restart_tx, restart_rx) = std::sync::mpsc::channel::<(usize, Answer)>();
    let serve_restarts = || {
        while let Ok((k, answer)) = restart_rx.try_recv() {
            let _ = answer.send(lab.restart_msrd(k));
        }
    };
    std::thread::scope(|sc| {
        let labr = &lab;
        let sh = &*shared;
        let msrds_r = &msrds;
        let watcher = sc.spawn(move || watch_agents(labr, sh));
        let movers: Vec<_> = (1..=o.mhs)
            .filter(|_| o.moves)
            .map(|j| sc.spawn(move || chaos::mover(labr, sh, j, o.seed)))
            .collect();
        let faulter = sc.spawn(move || {
            let restart = |k: usize| -> io::Result<Child> {
                let (tx, rx) = std::sync::mpsc::channel();
                restart_tx
                    .send((k, tx))
                    .map_err(|_| io::Error::other("the soak's main thread is gone"))?;
                rx.recv()
                    .map_err(|_| io::Error::other("the soak's main thread is gone"))?
            };
            if o.faults {
                chaos::faults(labr, sh, msrds_r, &restart, o.seed)
            } else {
                Ok(())
            }
        });
        let mh_threads: Vec<_> = (1..=o.mhs)
            .map(|j| {
                let plan = traffic::MhPlan {
                    mh: j,
                    seed: o.seed,
                    fh: fh_listen,
                    token_file: labr.mh_token_file(j),
                    loops: vec![
                        (traffic::Kind::BulkDown, 1),
                        (traffic::Kind::BulkUp, 1),
                        (traffic::Kind::Interactive, 3),
                        (traffic::Kind::Short, 2),
                    ],
                    max_bulk: o.max_bulk,
                };
                let (ns, shared) = (labr.ns(Host::mh(j)), shared.clone());
                sc.spawn(move || crate::sys::in_netns(&ns, || traffic::run_mh(plan, shared)))
            })
            .collect();
        let mut next_report = 30.0;
        while sh.clock.now() - t_chaos0 < o.seconds {
            std::thread::sleep(Duration::from_millis(20));
            serve_restarts();
            let el = sh.clock.now() - t_chaos0;
            if el >= next_report {
                next_report += 30.0;
                let c = sh.mh_conns.lock().unwrap();
                let failed = c.iter().filter(|c| c.fail.is_some()).count();
                let bytes: u64 = c.iter().map(|c| c.verified).sum();
                progress(&format!(
                    "{el:.0} s: {} connections ended ({failed} failed), {:.1} MB verified at the MHs, {} moves, {} faults",
                    c.len(),
                    bytes as f64 / 1e6,
                    sh.crossings.lock().unwrap().len(),
                    sh.faults.lock().unwrap().len()
                ));
            }
            if (o.faults && faulter.is_finished()) || movers.iter().any(|m| m.is_finished()) {
                break;
            }
        }
        // Faults end first (a crashed msrd is started again), moves after: no MH is
        // left in the cell of a dead msrd while the transfers finish.
        progress("chaos over: stopping faults, then moves; letting the transfers finish");
        sh.stop_faults.store(true, Ordering::Relaxed);
        while !faulter.is_finished() {
            serve_restarts();
            std::thread::sleep(Duration::from_millis(20));
        }
        match faulter.join() {
            Ok(Err(e)) => errors.push(format!("faults: {e}")),
            Err(_) => errors.push("the fault injector panicked".into()),
            _ => {}
        }
        sh.stop_chaos.store(true, Ordering::Relaxed);
        for m in movers {
            match m.join() {
                Ok(Err(e)) => errors.push(format!("mover: {e}")),
                Err(_) => errors.push("a mover panicked".into()),
                _ => {}
            }
        }
        sh.stop_new.store(true, Ordering::Relaxed);
        for t in mh_threads {
            match t.join() {
                Ok(Err(e)) => errors.push(format!("MH traffic: {e}")),
                Err(_) => errors.push("an MH traffic thread panicked".into()),
                _ => {}
            }
        }
        sh.stop_fh.store(true, Ordering::Relaxed);
        sh.stop_watch.store(true, Ordering::Relaxed);
        let _ = watcher.join();
    });
    match fh_thread.join() {
        Ok(Err(e)) => errors.push(format!("FH server: {e}")),
        Err(_) => errors.push("the FH server panicked".into()),
        _ => {}
    }
    let t_end = shared.clock.now();
    // Let the old MSRs' post-handoff holds lapse (hold_after_ms, 3 s), then compare;
    // state that is still settling (connections an MH abandoned end after the linger)
    // gets up to the linger and 10 s more.
    progress("transfers over; letting msrd's state settle");
    std::thread::sleep(Duration::from_secs(4));
    let settle_until = Instant::now() + Duration::from_secs(LINGER_S + 10);
    let mut end_state;
    loop {
        end_state = (1..=o.msrs)
            .map(|k| state::snapshot(&lab, k, msrds.lock().unwrap()[k - 1].pid))
            .collect::<io::Result<Vec<_>>>()?;
        let grew = (0..o.msrs)
            .any(|i| !state::growth(&start_state[i], &end_state[i], o.mhs, o.msrs).is_empty());
        if !grew || Instant::now() >= settle_until {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let (mut rsts, mut fins) = (Vec::new(), Vec::new());
    let mut capture_notes = Vec::new();
    for c in captures {
        let (v, f, note) = stop_capture(c, &shared.clock);
        rsts.extend(v);
        fins.extend(f);
        if !note.is_empty() {
            capture_notes.push(note);
        }
    }
    let mut counted = Vec::new();
    for &h in &hosts {
        counted.push((h, lab.rsts(h)?));
    }
    let records: Vec<_> = (1..=o.msrs).flat_map(|k| lab.handoff_records(k)).collect();
    let restarts: Vec<usize> = msrds.lock().unwrap().iter().map(|m| m.restarts).collect();
    let input = report::Input {
        opts: o.clone(),
        clock: shared.clock,
        chaos_s: t_end - t_chaos0,
        mh_conns: std::mem::take(&mut *shared.mh_conns.lock().unwrap()),
        fh_conns: std::mem::take(&mut *shared.fh_conns.lock().unwrap()),
        crossings: std::mem::take(&mut *shared.crossings.lock().unwrap()),
        faults: std::mem::take(&mut *shared.faults.lock().unwrap()),
        agent: std::mem::take(&mut *shared.agent.lock().unwrap()),
        rsts,
        fins,
        counted,
        capture_notes,
        records,
        start_state,
        end_state,
        restarts,
        errors,
        lab_dir: lab.dir.display().to_string(),
    };
    // Everything, for a post-mortem (kept with the lab's files under ITCP_LAB_KEEP=1).
    let dump = serde_json::json!({
        "mh_conns": input.mh_conns,
        "fh_conns": input.fh_conns,
        "crossings": input.crossings,
        "faults": input.faults,
        "agent": input.agent,
        "rsts": input.rsts,
    });
    let _ = std::fs::write(
        lab.dir.join("soak-records.json"),
        serde_json::to_vec(&dump).unwrap_or_default(),
    );
    // The soak's own msrd processes: end them (the lab ends the rest).
    for m in msrds.lock().unwrap().iter_mut() {
        if let Some(c) = &mut m.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    Ok(report::build(input))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcpdump_rst_lines() {
        let clock = Clock {
            mono0: 0,
            unix0: 1000.0,
        };
        let l = "1010.250000 02:00:00:00:03:01 > 02:00:00:00:00:64, ethertype IPv4 (0x0800), length 54: 10.2.0.1.1080 > 10.2.0.100.40022: Flags [R.], seq 1, ack 2, win 0, length 0";
        let r = parse_rst_line(l, addr::mh(1), "mh1", &clock).unwrap();
        assert_eq!(r.src_mac, "02:00:00:00:03:01");
        assert_eq!(r.flags, "R.");
        assert!((r.t - 10.25).abs() < 1e-9);
        assert_eq!(r.src, "10.2.0.1:1080".parse().unwrap());
        assert_eq!(r.dst, "10.2.0.100:40022".parse().unwrap());
        assert!(!r.sent);
        let l = "1001.0 02:00:00:00:f0:01 > 02:00:00:00:f0:02, ethertype IPv4 (0x0800), length 54: 10.0.0.1.7000 > 10.2.0.103.5555: Flags [R], seq 9, win 0, length 0";
        assert!(parse_rst_line(l, addr::FH, "fh", &clock).unwrap().sent);
        assert!(parse_rst_line("tcpdump: listening on air0", addr::FH, "fh", &clock).is_none());
    }
}
