//! Move → first byte at the MH: how long an MH downloading through I-TCP waits after it
//! joins a new cell until its application reads again, per detection mode (the MSRs'
//! beacons, the agent's link-up solicitation, network detection for an MH that runs
//! nothing of ours). `itcp-lab bench firstbyte` prints it for the LAN and WAN profiles.
//!
//! One lab per mode and network: the FH sends for as long as the moves take (16 KB
//! socket buffer, the paper's era; msrd at 64 KB each way, so that a move ships a
//! handful of queued bytes, not the seconds of queue an autotuned buffer piles up at a
//! 2 Mbit/s cell); a reader in this process, in the MH's namespace, verifies every byte
//! and timestamps every read. The MH makes `moves` non-overlapped moves between two
//! cells (0.3–0.5 s without a cell); per move, from the join (the emulator's history)
//! to the first read after it.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::dna::{Announcer, Probe};
use crate::lab::{self, addr, bin_path, Host, Lab, LabConfig};
use crate::moves;
use crate::scenario::{Detection, Net};
use crate::sys::in_netns;
use crate::ttcp::SendReport;

/// msrd's socket buffers: 64 KB each way (see the module docs).
pub const MSRD_64K: &str = "[wireless]\nsend_buffer = 65536\nrecv_buffer = 65536\n\
[fixed]\nsend_buffer = 65536\nrecv_buffer = 65536\n";

/// What one series of moves measured.
#[derive(Debug, Clone)]
pub struct FirstBytes {
    /// Per move: the join with the new cell → the first byte read at the MH, ms.
    pub ms: Vec<f64>,
    pub median_ms: f64,
    pub p95_ms: f64,
    /// Per move with a handoff record at the new MSR: the greeting's (or, with network
    /// detection, the MH's first frame's) arrival there → the first byte read at the
    /// MH, ms: the MH's view of the handoff itself, without detection.
    pub from_greeting_ms: Vec<f64>,
    /// Per move: how long the MH withheld its first segment (an ACK) after the
    /// first data reached it in the new cell, ms ([`moves::ack_waits`]).
    pub ack_wait_ms: Vec<f64>,
    /// Bytes read, every one verified.
    pub bytes: u64,
    /// RSTs (in, out) at the FH and at the MH.
    pub rsts: ((u64, u64), (u64, u64)),
}

/// Runs `moves` moves on `net` with detection `d` (seeded); errors on a setup failure,
/// a lost or corrupted byte, a move not completed in 10 s, or a move after which no
/// byte came. With `verbose`, prints where each move's time went (the new MSRs'
/// handoff records) and the FH's retransmission timeouts.
pub fn run(
    net: &Net,
    d: Detection,
    moves_n: usize,
    seed: u64,
    verbose: bool,
) -> io::Result<FirstBytes> {
    let mut lab = Lab::new(LabConfig::links(2, seed, net.wan.clone(), net.cell.clone()))?;
    let port = 5001;
    let mut _announcer = None;
    match d {
        Detection::Network => {
            lab.start_itcp_network(&format!(
                "[transparent]\nenabled = true\nports = [{port}]\n{MSRD_64K}"
            ))?;
            _announcer = Some(Announcer::start(
                &lab.ns(Host::Mh),
                "air0",
                Probe::Gateway(addr::CELL_GW.to_string()),
            )?);
        }
        Detection::Beacon | Detection::Solicit => {
            let mut args = vec!["--hysteresis-ms", "0"];
            args.extend_from_slice(d.agent_args());
            lab.start_itcp_mobility(MSRD_64K, &args)?;
        }
    }
    lab.watch_rsts(Host::Fh)?;
    lab.watch_rsts(Host::Mh)?;
    let mh_tcp = lab.watch_tcp(Host::Mh)?;
    // ITCP_PCAP=1 (with ITCP_LAB_KEEP=1): what the MH and the MSRs see, to read a slow move.
    if std::env::var_os("ITCP_PCAP").is_some() {
        for h in [Host::Mh, Host::Msr(1), Host::Msr(2)] {
            lab.record_packets(h)?;
        }
    }
    // Long enough for every move: 1.2 s in each cell, ≤ 0.5 s gaps, the moves' own time
    // (up to a beacon interval more without solicitation).
    let secs = 3 + moves_n as u64 * 3;
    let fh = lab::fh_addr(port);
    let sender = lab.spawn(
        Host::Fh,
        bin_path("ttcp"),
        &[
            "send",
            "--listen",
            &fh,
            "--duration",
            &secs.to_string(),
            "--seed",
            &seed.to_string(),
            "--buf",
            "16384",
        ],
    )?;
    lab.wait_listening(Host::Fh, port)?;
    let (mh_ns, token) = (lab.ns(Host::Mh), lab.mh_token_file(1));
    let to: SocketAddr = fh
        .parse()
        .map_err(|e| io::Error::other(format!("{fh}: {e}")))?;
    let reader = std::thread::spawn(move || -> Result<(u64, Vec<u64>), String> {
        let s: Box<dyn io::Read + Send> = if d == Detection::Network {
            // A plain socket: transparent mode splits it.
            Box::new(in_netns(&mh_ns, || TcpStream::connect(to)).map_err(|e| e.to_string())?)
        } else {
            let opts = itcp_mh::MhOptions::new()
                .gateway(SocketAddr::from((addr::CELL_GW, 1080)))
                .token_file(token);
            Box::new(
                in_netns(&mh_ns, || itcp_mh::ItcpStream::connect_with(&opts, to))
                    .map_err(|e| e.to_string())?,
            )
        };
        moves::read_timestamped(s, seed)
    });
    std::thread::sleep(Duration::from_millis(1500));
    let moved = |lab: &Lab| -> usize {
        (1..=2)
            .flat_map(|k| lab.handoff_records(k))
            .filter(|r| {
                r.role == itcp_handoff::log::Role::New
                    && r.outcome == itcp_handoff::log::Outcome::Moved
            })
            .count()
    };
    let mut at = 1;
    for i in 0..moves_n {
        let to = 3 - at;
        lab.assoc(&[])?;
        std::thread::sleep(Duration::from_millis(300 + 50 * (i as u64 % 5)));
        lab.assoc(&[to])?;
        // The move completes at the new MSR, then the MH stays a while: long enough
        // that the other MSR counts as newly heard at the next move.
        let deadline = Instant::now() + Duration::from_secs(10);
        while moved(&lab) <= i {
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{} {}: move {} not done in 10 s",
                    net.name,
                    d.name(),
                    i + 1
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(1200));
        at = to;
    }
    let (bytes, reads) = reader
        .join()
        .map_err(|_| io::Error::other("the reader panicked"))?
        .map_err(|e| io::Error::other(format!("reader: {e}")))?;
    let (_, out, err) = lab.wait(sender, Duration::from_secs(30))?;
    let send: SendReport = serde_json::from_str(out.trim())
        .map_err(|e| io::Error::other(format!("sender gave no report ({e}): {err}")))?;
    if !send.ok || bytes != send.bytes {
        return Err(io::Error::other(format!(
            "{} {}: read {bytes} of {} bytes sent ({:?})",
            net.name,
            d.name(),
            send.bytes,
            send.error
        )));
    }
    if let Some(ti) = send.tcp_info.as_ref().filter(|_| verbose) {
        eprintln!(
            "FH: {} retransmission timeouts in {moves_n} moves, {} ms in them ({} bytes retransmitted)",
            ti.total_rto, ti.total_rto_time_ms, ti.bytes_retrans
        );
    }
    let rsts = (lab.rsts(Host::Fh)?, lab.rsts(Host::Mh)?);
    let joins = moves::joins(&lab.emu_status()?.events);
    let ms: Vec<f64> = moves::to_first_byte(&joins, &reads)
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| io::Error::other("a move after which no byte came"))?;
    if verbose {
        moves::print_phases(&lab, &joins, &ms);
    }
    let from_greeting_ms = moves::phases(&lab, &joins)
        .iter()
        .zip(&ms)
        .map(|(p, m)| m - p.greeting)
        .filter(|d| d.is_finite())
        .collect();
    let (median_ms, p95_ms) = moves::median_p95(&ms);
    // Moves are 300 ms or more without a cell; nothing else pauses a download that long.
    let ack_wait_ms = moves::ack_waits(&std::fs::read_to_string(&mh_tcp)?, 250.0);
    Ok(FirstBytes {
        ms,
        median_ms,
        p95_ms,
        from_greeting_ms,
        ack_wait_ms,
        bytes,
        rsts,
    })
}
