//! `itcp-lab bench handoff`: how long a handoff takes for an MH with N I-TCP
//! connections, with empty or full queues, measured on the lab with real msrd
//! processes, TCP_REPAIR and the MH's agent; and how long the bytes stop at the MH
//! around one overlapped handoff of a bulk download.
//!
//! Latency is read from the new MSR's handoff log: from the greeting's arrival to the
//! acknowledgement (connections restored, restarted and relaying) — "greeting to
//! resumed". The MH's own view (greeting sent → "moved" answer) is printed beside it.

use std::io;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::lab::{self, bin_path, Host, Lab, LabConfig};

/// What the MH's connections carry while they move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Queues {
    /// Nothing: every queue is empty.
    Empty,
    /// The MH writes and never reads, the FH echoes: every queue on the way fills.
    Full,
    /// The MH writes a little at a steady pace and reads the FH's echo: the FH has
    /// segments in flight when a connection freezes (a third of the air's capacity,
    /// shared by the connections).
    Streaming,
}

impl Queues {
    pub const ALL: [Queues; 3] = [Queues::Empty, Queues::Full, Queues::Streaming];

    pub fn as_str(self) -> &'static str {
        match self {
            Queues::Empty => "empty",
            Queues::Full => "full",
            Queues::Streaming => "stream",
        }
    }
}

/// One configuration's results.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyResult {
    pub conns: usize,
    pub queues: Queues,
    pub moves: usize,
    /// New MSR, greeting → acknowledged, ms: median, min, max.
    pub new_msr_ms: (f64, f64, f64),
    /// Old MSR, freeze → images sent, ms (median).
    pub capture_ms: f64,
    /// At the MH: greeting sent → "moved" received, ms (median).
    pub mh_ms: f64,
    /// The same for the first move alone: the MH's first visit to the new MSR (which
    /// has never heard from it), ms.
    pub mh_first_visit_ms: f64,
    /// Bytes queued per handoff (all connections, both sockets and directions), median.
    pub queued_bytes: u64,
    /// The FH's retransmission timeouts over all the moves (`TcpExt TCPTimeouts` of its
    /// namespace, from just before the first move to 1.5 s after the last).
    pub fh_rtos: u64,
    /// The FH's tail-loss probes over the same time (`TCPLossProbes`).
    pub fh_loss_probes: u64,
}

/// A `TcpExt` counter of host `h`'s namespace (`/proc/net/netstat`).
pub fn tcp_ext(lab: &Lab, h: Host, name: &str) -> io::Result<u64> {
    tcp_ext_all(lab, h)?
        .get(name)
        .copied()
        .ok_or_else(|| io::Error::other(format!("no TcpExt {name} in /proc/net/netstat")))
}

/// Every `TcpExt` counter of host `h`'s namespace, by name.
pub fn tcp_ext_all(lab: &Lab, h: Host) -> io::Result<std::collections::HashMap<String, u64>> {
    let out = lab.run(h, "cat", &["/proc/net/netstat"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut m = std::collections::HashMap::new();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        for (n, v) in names
            .split_whitespace()
            .zip(values.split_whitespace())
            .skip(1)
        {
            m.insert(n.to_string(), v.parse().map_err(io::Error::other)?);
        }
    }
    Ok(m)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// msrd's settings in the bench (and the tests that move many connections).
pub const MSRD_EXTRA: &str = "[beacon]\ninterval_ms = 200\nlifetime_ms = 600\n\
[wireless]\nsend_buffer = 65536\nrecv_buffer = 65536\n\
[fixed]\nsend_buffer = 65536\nrecv_buffer = 65536\n";
/// The agent's arguments in the bench.
pub const AGENT: &[&str] = &["--hysteresis-ms", "0", "--beacon-interval-ms", "200"];

/// The bench's lab: two MSRs, fast clean links, the MH in cell 1; no msrd yet.
pub fn lab(seed: u64) -> io::Result<Lab> {
    let fast = lab::link(200_000_000, 1.0, 0.0);
    Lab::new(LabConfig {
        msrs: 2,
        seed,
        wan_down: fast.clone(),
        wan_up: fast.clone(),
        cell_down: fast.clone(),
        cell_up: fast,
        initial_cells: vec![1],
        veth: false,
        ipv6: false,
    })
}

/// Moves the MH from `at` to the other MSR through a short overlap and waits until the
/// agent reports the move; returns the number of moves seen so far.
pub fn move_once(lab: &Lab, at: usize, seen: usize) -> io::Result<usize> {
    let to = 3 - at;
    lab.assoc(&[at, to])?;
    std::thread::sleep(Duration::from_millis(300));
    lab.assoc(&[to])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ev = lab.agent_events();
        if let Some(bad) = ev
            .iter()
            .find(|e| e["event"] == "move_failed" || e["event"] == "refused")
        {
            return Err(io::Error::other(format!("handoff failed: {bad}")));
        }
        let n = ev.iter().filter(|e| e["event"] == "moved").count();
        if n > seen {
            return Ok(n);
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!("no move in 30 s: {ev:?}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Handoff latency for an MH with `conns` connections carrying `queues`, the MSR⇄MSR
/// channel over mutual TLS (`tls`) or pre-shared keys, the images in parts (`parts`,
/// `[handoff] images_in_parts`) or not.
pub fn latency(
    conns: usize,
    queues: Queues,
    moves: usize,
    tls: bool,
    parts: bool,
    progress: impl Fn(&str),
) -> io::Result<LatencyResult> {
    use std::sync::mpsc;
    use tokio::io::AsyncWriteExt;

    let full = queues == Queues::Full;
    let mut lab = lab(conns as u64 + queues as u64)?;
    lab.channel_tls = tls;
    if !parts {
        lab.handoff_extra = "images_in_parts = false\n".into();
    }
    let n = conns.max(1) + 16;
    lab.access_extra =
        format!("max_connections_per_mh = {n}\nmax_handshakes = {n}\nmax_handshakes_per_mh = {n}");
    lab.msrd_log_level = "info".into();
    lab.start_itcp_mobility(MSRD_EXTRA, AGENT)?;
    lab.spawn_logged(
        Host::Fh,
        bin_path("itcp-lab"),
        &["echo", "--listen", "10.0.0.1:9000"],
        "echo.log",
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<usize, String>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mh_ns = lab.ns(Host::Mh);
    let token_file = lab.dir.join("mh-token");
    let client = std::thread::spawn(move || {
        let r = crate::sys::in_netns(&mh_ns, || {
            crate::sys::raise_nofile_limit();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let opts = itcp_mh::MhOptions::new()
                    .gateway(std::net::SocketAddr::from(([10, 2, 0, 1], 1080)))
                    .token_file(token_file);
                let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(128));
                let mut tasks = Vec::new();
                for _ in 0..conns {
                    let (opts, sem) = (opts.clone(), sem.clone());
                    tasks.push(tokio::spawn(async move {
                        let _p = sem.acquire().await.unwrap();
                        itcp_mh::nonblocking::ItcpStream::connect_with(
                            &opts,
                            std::net::SocketAddr::from(([10, 0, 0, 1], 9000)),
                        )
                        .await
                    }));
                }
                let mut streams = Vec::new();
                for t in tasks {
                    match t.await {
                        Ok(Ok(s)) => streams.push(s),
                        Ok(Err(e)) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return Ok(());
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return Ok(());
                        }
                    }
                }
                let n = streams.len();
                let mut writers = Vec::new();
                if full {
                    // Write and never read: the echo fills every queue on the way.
                    for mut s in streams.drain(..) {
                        writers.push(tokio::spawn(async move {
                            let block = vec![0x5a_u8; 64 << 10];
                            while s.write_all(&block).await.is_ok() {}
                        }));
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                if queues == Queues::Streaming {
                    use tokio::io::AsyncReadExt;
                    // 4 KiB per connection per period: 8 MB/s in all, a third of the air.
                    let period =
                        Duration::from_micros((n as u64 * 4096 * 1_000_000 / 8_000_000).max(1000));
                    for (i, s) in streams.drain(..).enumerate() {
                        let (mut r, mut w) = tokio::io::split(s);
                        writers.push(tokio::spawn(async move {
                            // Spread the connections over the period.
                            tokio::time::sleep(period * i as u32 / n.max(1) as u32).await;
                            let block = vec![0x5a_u8; 4096];
                            let mut tick = tokio::time::interval(period);
                            loop {
                                tick.tick().await;
                                if w.write_all(&block).await.is_err() {
                                    break;
                                }
                            }
                        }));
                        writers.push(tokio::spawn(async move {
                            let mut buf = vec![0u8; 64 << 10];
                            while matches!(r.read(&mut buf).await, Ok(k) if k > 0) {}
                        }));
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let _ = ready_tx.send(Ok(n));
                // Hold everything open until the measurement is over.
                let _ = tokio::task::spawn_blocking(move || done_rx.recv()).await;
                drop((streams, writers));
                Ok(())
            })
        });
        if let Err(e) = r {
            eprintln!("MH client: {e}");
        }
    });
    let n = ready_rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|_| io::Error::other("the MH did not open its connections in 120 s"))?
        .map_err(|e| io::Error::other(format!("opening connections: {e}")))?;
    progress(&format!(
        "{n} connection(s) open{}; moving {moves} times",
        match queues {
            Queues::Empty => "",
            Queues::Full => ", queues filled",
            Queues::Streaming => ", streaming",
        }
    ));
    let fh_before = (
        tcp_ext(&lab, Host::Fh, "TCPTimeouts")?,
        tcp_ext(&lab, Host::Fh, "TCPLossProbes")?,
    );
    let mut at = 1;
    let mut seen = lab
        .agent_events()
        .iter()
        .filter(|e| e["event"] == "moved")
        .count();
    let moved_before = seen;
    for _ in 0..moves {
        seen = move_once(&lab, at, seen)?;
        at = 3 - at;
        // Let the previous MSR's advertisement lapse (its next beacon is then fresh).
        std::thread::sleep(Duration::from_millis(700));
    }
    // A retransmission timeout caused by the last move comes within 1.5 s.
    std::thread::sleep(Duration::from_millis(1500));
    let fh_rtos = tcp_ext(&lab, Host::Fh, "TCPTimeouts")? - fh_before.0;
    let fh_loss_probes = tcp_ext(&lab, Host::Fh, "TCPLossProbes")? - fh_before.1;
    let _ = done_tx.send(());
    let _ = client.join();
    let mut recs = Vec::new();
    for k in 1..=2 {
        recs.extend(lab.handoff_records(k));
    }
    use itcp_handoff::log::{Outcome, Role};
    if let Some(bad) = recs.iter().find(|r| r.outcome != Outcome::Moved) {
        return Err(io::Error::other(format!(
            "a handoff did not move everything: {bad:?}"
        )));
    }
    let mut new_ms: Vec<f64> = recs
        .iter()
        .filter(|r| r.role == Role::New)
        .filter_map(|r| r.duration_ms())
        .collect();
    let mut cap_ms: Vec<f64> = recs
        .iter()
        .filter(|r| r.role == Role::Old)
        .filter_map(|r| Some((r.phases.images_sent? - r.phases.freeze?) as f64 / 1000.0))
        .collect();
    let mut queued: Vec<f64> = recs
        .iter()
        .filter(|r| r.role == Role::New)
        .map(|r| r.connections.iter().map(|c| c.queued_bytes).sum::<u64>() as f64)
        .collect();
    if let Some(r) = recs.iter().find(|r| r.connections.len() != n) {
        return Err(io::Error::other(format!(
            "a handoff moved {} connections, not the {n} open ({} as the {:?} MSR, handoff {}; logs in {})",
            r.connections.len(),
            r.msr,
            r.role,
            r.handoff_id,
            lab.dir.display()
        )));
    }
    let mut mh_ms: Vec<f64> = lab
        .agent_events()
        .iter()
        .filter(|e| e["event"] == "moved")
        .filter_map(|e| e["moved_ms"].as_f64())
        .collect();
    let mh_first_visit_ms = mh_ms.get(moved_before).copied().unwrap_or(f64::NAN);
    let min = new_ms.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = new_ms.iter().cloned().fold(0.0, f64::max);
    Ok(LatencyResult {
        conns: n,
        queues,
        moves: new_ms.len(),
        new_msr_ms: (median(&mut new_ms), min, max),
        capture_ms: median(&mut cap_ms),
        mh_ms: median(&mut mh_ms),
        mh_first_visit_ms,
        queued_bytes: median(&mut queued) as u64,
        fh_rtos,
        fh_loss_probes,
    })
}

/// The gap at the MH around one overlapped handoff of a bulk download on the paper's
/// LAN profile (2 Mbit/s cells, 1 % loss), against the same download without a move.
#[derive(Debug, Clone, Serialize)]
pub struct GapResult {
    /// Longest time without bytes at the MH, with one handoff and without, in ms.
    pub stall_with_move_ms: f64,
    pub stall_without_move_ms: f64,
    /// Bytes delivered in the second around the handoff vs the median second.
    pub bytes_handoff_second: u64,
    pub bytes_median_second: u64,
    pub goodput_with_move_kbps: f64,
    pub goodput_without_move_kbps: f64,
}

fn download(with_move: bool, seed: u64) -> io::Result<(crate::ttcp::RecvReport, Option<u64>)> {
    let net = crate::scenario::Net::lan();
    let mut lab = Lab::new(LabConfig {
        msrs: 2,
        seed,
        wan_down: net.wan.clone(),
        wan_up: net.wan.clone(),
        cell_down: net.cell.clone(),
        cell_up: net.cell.clone(),
        initial_cells: vec![1],
        veth: false,
        ipv6: false,
    })?;
    lab.start_itcp_mobility("[beacon]\ninterval_ms = 200\nlifetime_ms = 600\n", AGENT)?;
    let ttcp = bin_path("ttcp");
    let bytes = (2u64 << 20).to_string();
    let fh = lab::fh_addr(5001);
    let s = lab.spawn(
        Host::Fh,
        &ttcp,
        &["send", "--listen", &fh, "--bytes", &bytes],
    )?;
    let r = lab.spawn(
        Host::Mh,
        &ttcp,
        &["recv", "--connect", &fh, "--bytes", &bytes, "--itcp"],
    )?;
    let mut moved_at = None;
    if with_move {
        std::thread::sleep(Duration::from_secs(4));
        let t = crate::sys::mono_ns();
        move_once(&lab, 1, 0)?;
        moved_at = Some(t);
    }
    let (_, out, err) = lab.wait(r, Duration::from_secs(120))?;
    let _ = lab.wait(s, Duration::from_secs(10));
    let rep: crate::ttcp::RecvReport = serde_json::from_str(out.trim())
        .map_err(|e| io::Error::other(format!("receiver: {e}: {err}")))?;
    if !rep.ok {
        return Err(io::Error::other(format!(
            "download failed: {:?}",
            rep.error
        )));
    }
    Ok((rep, moved_at))
}

pub fn gap(seed: u64) -> io::Result<GapResult> {
    let (with, at) = download(true, seed)?;
    let (without, _) = download(false, seed)?;
    let bins = &with.timeline_bytes;
    let per_s = (1.0 / with.bin_s).round() as usize;
    let at_bin = at
        .map(|t| ((t.saturating_sub(with.t0_mono_ns)) as f64 / 1e9 / with.bin_s) as usize)
        .unwrap_or(0);
    let lo = at_bin.saturating_sub(per_s / 2);
    let hi = (lo + per_s).min(bins.len());
    let around: u64 = bins[lo.min(bins.len())..hi].iter().sum();
    let mut secs: Vec<f64> = bins
        .chunks(per_s)
        .filter(|c| c.len() == per_s)
        .map(|c| c.iter().sum::<u64>() as f64)
        .collect();
    Ok(GapResult {
        stall_with_move_ms: with.longest_stall_s * 1000.0,
        stall_without_move_ms: without.longest_stall_s * 1000.0,
        bytes_handoff_second: around,
        bytes_median_second: median(&mut secs) as u64,
        goodput_with_move_kbps: with.goodput_bps / 8.0 / 1024.0,
        goodput_without_move_kbps: without.goodput_bps / 8.0 / 1024.0,
    })
}
