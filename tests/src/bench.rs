//! Relay benchmarks on an un-emulated veth path FH → GW → MSR1 → MH: msrd against
//! HAProxy (splice), socat and direct kernel forwarding, measured in the same run and
//! reported as medians and ratios (the machine is shared and noisy).
//!
//! Every peer terminates TCP on MSR1 except "direct", where MSR1 only forwards. msrd
//! runs in transparent mode for the benchmark ports, so unmodified iperf3 and ttcp
//! clients go through its relay engine; once as a plain relay and once with handoff
//! on (restarted between the two), which puts a packet tap on the cell (the greeting
//! frames, `proxy/src/handoff/frames.rs`) and the handoff's nftables sets in the path.

use std::io;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::lab::{bin_path, Host, Lab, LabConfig};
use crate::report::median;
use crate::ttcp::RrReport;

/// A way from the MH to the FH's services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Peer {
    Direct,
    Msrd,
    /// msrd with `[handoff]` on (one MSR, no peer).
    MsrdHandoff,
    Haproxy,
    Socat,
}

impl Peer {
    pub const ALL: [Peer; 5] = [
        Peer::Direct,
        Peer::Msrd,
        Peer::MsrdHandoff,
        Peer::Haproxy,
        Peer::Socat,
    ];

    /// The name `--peers` takes.
    pub fn key(self) -> &'static str {
        match self {
            Peer::Direct => "direct",
            Peer::Msrd => "msrd",
            Peer::MsrdHandoff => "msrd-handoff",
            Peer::Haproxy => "haproxy",
            Peer::Socat => "socat",
        }
    }

    /// Parses a `--peers` list (`msrd,haproxy`); an unknown name is an error that lists
    /// the known ones.
    pub fn parse_list(s: &str) -> Result<Vec<Peer>, String> {
        let mut v = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some(p) = Peer::ALL.iter().find(|p| p.key() == name) else {
                let known: Vec<&str> = Peer::ALL.iter().map(|p| p.key()).collect();
                return Err(format!(
                    "unknown peer {name:?} (known: {})",
                    known.join(", ")
                ));
            };
            if !v.contains(p) {
                v.push(*p);
            }
        }
        if v.is_empty() {
            return Err("no peer named".into());
        }
        Ok(v)
    }

    pub fn name(self) -> &'static str {
        match self {
            Peer::Direct => "direct (kernel forwarding)",
            Peer::Msrd => "msrd",
            Peer::MsrdHandoff => "msrd, handoff on",
            Peer::Haproxy => "HAProxy (splice)",
            Peer::Socat => "socat",
        }
    }

    /// (host, port) the MH connects to for the FH's iperf3 (5201) or echo (7) service.
    fn target(self, service: u16) -> (&'static str, u16) {
        match (self, service) {
            // Different FH ports: msrd intercepts 5201 and 7.
            (Peer::Direct, 5201) => ("10.0.0.1", 5202),
            (Peer::Direct, _) => ("10.0.0.1", 8),
            (Peer::Msrd | Peer::MsrdHandoff, s) => ("10.0.0.1", s),
            (Peer::Haproxy, s) => ("10.2.0.1", 10000 + s),
            (Peer::Socat, s) => ("10.2.0.1", 20000 + s),
        }
    }
}

/// Results of `bench relay`.
#[derive(Debug, Serialize)]
pub struct RelayBench {
    pub seconds: u64,
    pub rounds: usize,
    /// Gbit/s per peer per round, FH → MH.
    pub gbps: Vec<(Peer, Vec<f64>)>,
    /// Gbit/s per peer per round, MH → FH.
    pub gbps_up: Vec<(Peer, Vec<f64>)>,
    /// Request/response round trips per peer: (p50 µs, p99 µs) medians over rounds.
    pub rr: Vec<(Peer, Vec<(f64, f64)>)>,
}

const HAPROXY_CFG: &str = "\
global
    maxconn 4000
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option splice-request
    option splice-response
listen iperf
    bind 10.2.0.1:15201
    server fh 10.0.0.1:5201
listen echo
    bind 10.2.0.1:10007
    server fh 10.0.0.1:7
";

fn need(prog: &str) -> io::Result<()> {
    let ok = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{prog} is not installed (scripts/setup.sh installs it)"),
        ))
    }
}

/// The msrd running in the relay bench: its spawn index, and whether handoff is on.
struct Msrd {
    idx: usize,
    handoff: bool,
}

impl Msrd {
    fn start(lab: &mut Lab, handoff: bool) -> io::Result<Msrd> {
        let mut cfg = lab
            .msrd_config(1, "[transparent]\nenabled = true\nports = [5201, 7]\n")
            .replace("log_level = \"debug\"", "log_level = \"warn\"");
        if handoff {
            cfg += &format!("\n{}", lab.handoff_config(1));
        }
        let idx = lab.start_msrd(1, &cfg)?;
        Ok(Msrd { idx, handoff })
    }

    /// Makes sure the msrd that `peer` needs runs (a clean stop and a start).
    fn for_peer(self, lab: &mut Lab, peer: Peer) -> io::Result<Msrd> {
        let handoff = peer == Peer::MsrdHandoff;
        if peer != Peer::Msrd && !handoff || handoff == self.handoff {
            return Ok(self);
        }
        lab.terminate(self.idx);
        lab.wait(self.idx, Duration::from_secs(10))?;
        Msrd::start(lab, handoff)
    }
}

/// Builds the veth lab with every peer running.
fn setup() -> io::Result<(Lab, Msrd)> {
    for p in ["iperf3", "haproxy", "socat"] {
        need(p)?;
    }
    crate::sys::raise_nofile_limit();
    let mut lab = Lab::new(LabConfig {
        msrs: 1,
        veth: true,
        ..LabConfig::default()
    })?;
    let msrd = Msrd::start(&mut lab, false)?;
    let hcfg = lab.dir.join("haproxy.cfg");
    std::fs::write(&hcfg, HAPROXY_CFG)?;
    lab.spawn_logged(
        Host::Msr(1),
        "haproxy",
        &["-db", "-f", hcfg.to_str().unwrap()],
        "haproxy.log",
    )?;
    for (port, to) in [(25201, 5201), (20007, 7)] {
        lab.spawn_logged(
            Host::Msr(1),
            "socat",
            &[
                &format!("TCP-LISTEN:{port},bind=10.2.0.1,fork,reuseaddr"),
                &format!("TCP:10.0.0.1:{to}"),
            ],
            &format!("socat{port}.log"),
        )?;
    }
    for port in ["5201", "5202"] {
        lab.spawn_logged(
            Host::Fh,
            "iperf3",
            &["-s", "-B", "10.0.0.1", "-p", port],
            &format!("iperf3-{port}.log"),
        )?;
    }
    let ttcp = bin_path("ttcp");
    for port in ["7", "8"] {
        lab.spawn_logged(
            Host::Fh,
            &ttcp,
            &["echo", "--listen", &format!("10.0.0.1:{port}")],
            &format!("echo{port}.log"),
        )?;
    }
    std::thread::sleep(Duration::from_millis(500));
    Ok((lab, msrd))
}

/// One iperf3 transfer through `peer`, in Gbit/s: a download (FH → MH, `-R`), or an
/// upload (MH → FH).
fn iperf(lab: &mut Lab, peer: Peer, seconds: u64, download: bool) -> io::Result<f64> {
    let (host, port) = peer.target(5201);
    let (port, secs) = (port.to_string(), seconds.to_string());
    let mut args = vec!["-c", host, "-p", &port, "-t", &secs, "-J"];
    if download {
        args.push("-R");
    }
    let idx = lab.spawn(Host::Mh, "iperf3", &args)?;
    let (ok, out, err) = lab.wait(idx, Duration::from_secs(seconds + 30))?;
    let v: Value = serde_json::from_str(&out)
        .map_err(|e| io::Error::other(format!("iperf3 via {}: {e}: {err}", peer.name())))?;
    if !ok || v.get("error").is_some() {
        return Err(io::Error::other(format!(
            "iperf3 via {} failed: {}",
            peer.name(),
            v["error"]
        )));
    }
    Ok(v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9)
}

/// Small-message round trips through `peer`: (p50, p99) in µs.
fn rr(lab: &mut Lab, peer: Peer, count: u64) -> io::Result<(f64, f64)> {
    let (host, port) = peer.target(7);
    let idx = lab.spawn(
        Host::Mh,
        bin_path("ttcp"),
        &[
            "rr",
            "--connect",
            &format!("{host}:{port}"),
            "--count",
            &count.to_string(),
            "--size",
            "64",
        ],
    )?;
    let (ok, out, err) = lab.wait(idx, Duration::from_secs(60))?;
    let r: RrReport = serde_json::from_str(out.trim())
        .map_err(|e| io::Error::other(format!("ttcp rr via {}: {e}: {err}", peer.name())))?;
    if !ok || !r.ok {
        return Err(io::Error::other(format!(
            "ttcp rr via {}: {:?}",
            peer.name(),
            r.error
        )));
    }
    Ok((r.p50_us, r.p99_us))
}

/// Runs the relay benchmark: `rounds` rounds, each measuring every peer of `peers`
/// once (in a rotated order, so no peer always runs first or last).
pub fn relay(
    seconds: u64,
    rounds: usize,
    peers: &[Peer],
    progress: impl Fn(&str),
) -> io::Result<RelayBench> {
    let (mut lab, mut msrd) = setup()?;
    let mut gbps: Vec<(Peer, Vec<f64>)> = peers.iter().map(|&p| (p, Vec::new())).collect();
    let mut gbps_up = gbps.clone();
    let mut lat: Vec<(Peer, Vec<(f64, f64)>)> = peers.iter().map(|&p| (p, Vec::new())).collect();
    for round in 0..rounds {
        for i in 0..peers.len() {
            let k = (i + round) % peers.len();
            let peer = peers[k];
            msrd = msrd.for_peer(&mut lab, peer)?;
            let g = iperf(&mut lab, peer, seconds, true)?;
            let u = iperf(&mut lab, peer, seconds, false)?;
            progress(&format!(
                "round {} {:<28} {g:6.2} Gbit/s FH → MH, {u:6.2} Gbit/s MH → FH",
                round + 1,
                peer.name()
            ));
            gbps[k].1.push(g);
            gbps_up[k].1.push(u);
            let l = rr(&mut lab, peer, 2000)?;
            progress(&format!(
                "round {} {:<28} rr p50 {:.1} µs p99 {:.1} µs",
                round + 1,
                peer.name(),
                l.0,
                l.1
            ));
            lat[k].1.push(l);
        }
    }
    Ok(RelayBench {
        seconds,
        rounds,
        gbps,
        gbps_up,
        rr: lat,
    })
}

impl RelayBench {
    /// Markdown table with medians, ranges and ratios (to HAProxy for bulk, to direct
    /// forwarding for latency; "–" when that peer was not measured), both directions.
    pub fn render(&self) -> String {
        let med =
            |v: &[(Peer, Vec<f64>)], p: Peer| v.iter().find(|g| g.0 == p).map(|g| median(&g.1));
        let ratio = |x: f64, base: Option<f64>| {
            base.map_or("–".to_string(), |b| format!("{:.2}×", x / b))
        };
        let mut s = format!(
            "Bulk iperf3, {} s each way (FH → MH with -R), median [min–max] of {} round(s); latency: \
             64-byte request/response, 2000 per round, median of the rounds' p50 and p99\n\n\
             | peer | FH → MH Gbit/s | vs HAProxy | MH → FH Gbit/s | vs HAProxy | rr p50 µs | rr p99 µs | p99 vs direct |\n\
             |---|---|---|---|---|---|---|---|\n",
            self.seconds, self.rounds
        );
        let range = |v: &[f64]| {
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.2} [{lo:.2}–{hi:.2}]", median(v))
        };
        let p99 = |p: Peer| {
            let l = &self.rr.iter().find(|r| r.0 == p)?.1;
            Some(median(&l.iter().map(|x| x.1).collect::<Vec<_>>()))
        };
        let direct_p99 = p99(Peer::Direct);
        for (p, v) in &self.gbps {
            let up = &self.gbps_up.iter().find(|g| g.0 == *p).unwrap().1;
            let l = &self.rr.iter().find(|r| r.0 == *p).unwrap().1;
            let p50 = median(&l.iter().map(|x| x.0).collect::<Vec<_>>());
            let p99 = p99(*p).unwrap_or(f64::NAN);
            s += &format!(
                "| {} | {} | {} | {} | {} | {p50:.1} | {p99:.1} | {} |\n",
                p.name(),
                range(v),
                ratio(median(v), med(&self.gbps, Peer::Haproxy)),
                range(up),
                ratio(median(up), med(&self.gbps_up, Peer::Haproxy)),
                ratio(p99, direct_p99),
            );
        }
        s
    }
}

/// Results of `bench conns`.
#[derive(Debug, Serialize)]
pub struct ConnsBench {
    pub count: usize,
    pub bytes_per_conn: usize,
    pub established: usize,
    pub intact: usize,
    /// Seconds to open all connections (at most 256 handshakes in flight).
    pub setup_s: f64,
    pub setup_per_s: f64,
    /// msrd sessions while all were open.
    pub sessions_at_peak: u64,
    pub msrd_rss_kib_idle: u64,
    pub msrd_rss_kib_peak: u64,
    /// Once every session has ended and msrd's heap trimmer has run.
    pub msrd_rss_kib_after: u64,
    pub msrd_fds_at_peak: usize,
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Byte `i` of connection `c`'s payload: distinct per connection, so crossed streams
/// would be caught.
fn payload(c: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (c.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8)
        .collect()
}

/// A veth lab (one MSR) for load benchmarks, and an msrd config for it that logs
/// warnings only, with `access_extra` added to its `[access]` section.
fn veth_lab_msrd_config(access_extra: &str) -> io::Result<(Lab, String)> {
    crate::sys::raise_nofile_limit();
    let lab = Lab::new(LabConfig {
        msrs: 1,
        veth: true,
        ..LabConfig::default()
    })?;
    let cfg = lab
        .msrd_config(1, "")
        .replace("log_level = \"debug\"", "log_level = \"warn\"")
        .replace(
            "mh_prefixes = [\"10.2.0.0/24\"]",
            &format!("mh_prefixes = [\"10.2.0.0/24\"]\n{access_extra}"),
        );
    Ok((lab, cfg))
}

/// Starts the FH's echo server for load benchmarks (`itcp-lab echo`, in its own
/// process: each process has its own fd limit, and this machine caps it) and waits
/// until it accepts connections.
fn start_fh_echo(lab: &mut Lab) -> io::Result<()> {
    lab.spawn_logged(
        Host::Fh,
        bin_path("itcp-lab"),
        &["echo", "--listen", "10.0.0.1:9000"],
        "echo.log",
    )?;
    let ns = lab.ns(Host::Fh);
    for _ in 0..100 {
        if crate::sys::in_netns(&ns, || std::net::TcpStream::connect("10.0.0.1:9000")).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(io::Error::other("the FH echo server did not come up"))
}

/// How the load generators reach MSR1: its gateway, a fixed session token.
fn bench_mh_opts() -> itcp_mh::MhOptions {
    itcp_mh::MhOptions::new()
        .gateway(std::net::SocketAddr::from(([10, 2, 0, 1], 1080)))
        .token(itcp_mh::Token([9; 16]))
}

/// Opens `count` I-TCP connections from the MH through msrd to an echo server on the
/// FH, holds them all open, then has each send `bytes` and verify the echo.
pub fn conns(count: usize, bytes: usize, progress: impl Fn(&str)) -> io::Result<ConnsBench> {
    use std::sync::mpsc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // One MH opens them all: lift the per-MH limit (default 4096) above the count.
    let (mut lab, cfg) =
        // One MH opens them all at once: its setups may all be in flight together.
        veth_lab_msrd_config(&format!(
            "max_connections_per_mh = {n}\nmax_handshakes = {n}\nmax_handshakes_per_mh = {n}",
            n = count.max(1)
        ))?;
    let idx = lab.start_msrd(1, &cfg)?;
    let pid = lab.pid(idx);
    let rss_idle = rss_kib(pid);

    start_fh_echo(&mut lab)?;

    // MH: a client thread in the MH's namespace (sockets it makes stay there).
    let (to_main, from_mh) = mpsc::channel::<(usize, f64, Option<String>)>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let mh_ns = lab.ns(Host::Mh);
    let client = std::thread::spawn(move || -> io::Result<usize> {
        crate::sys::in_netns(&mh_ns, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let opts = bench_mh_opts();
                let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
                let t0 = std::time::Instant::now();
                let mut tasks = Vec::with_capacity(count);
                for _ in 0..count {
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
                let mut streams = Vec::with_capacity(count);
                let mut first_error = None;
                for t in tasks {
                    match t.await {
                        Ok(Ok(s)) => streams.push(s),
                        Ok(Err(e)) => first_error = first_error.or(Some(e.to_string())),
                        Err(e) => first_error = first_error.or(Some(e.to_string())),
                    }
                }
                let _ = to_main.send((streams.len(), t0.elapsed().as_secs_f64(), first_error));
                let _ = go_rx.recv();
                let mut tasks = Vec::with_capacity(streams.len());
                for (c, s) in streams.into_iter().enumerate() {
                    tasks.push(tokio::spawn(async move {
                        let mut s = s.into_inner();
                        let data = payload(c, bytes);
                        let (mut r, mut w) = s.split();
                        let send = async {
                            w.write_all(&data).await?;
                            w.shutdown().await
                        };
                        let mut back = Vec::with_capacity(bytes);
                        let recv = r.read_to_end(&mut back);
                        let (a, b) = tokio::join!(send, recv);
                        a?;
                        b?;
                        if back != data {
                            return Err(io::Error::other(format!(
                                "echo differs: {} of {} bytes back",
                                back.len(),
                                data.len()
                            )));
                        }
                        Ok::<bool, io::Error>(true)
                    }));
                }
                let mut intact = 0;
                let mut first_error = None;
                for t in tasks {
                    match t.await {
                        Ok(Ok(true)) => intact += 1,
                        Ok(Err(e)) => first_error = first_error.or(Some(e.to_string())),
                        _ => {}
                    }
                }
                if let Some(e) = first_error {
                    eprintln!("first transfer error: {e}");
                }
                Ok(intact)
            })
        })
    });
    let (established, setup_s, first_error) = from_mh
        .recv_timeout(Duration::from_secs(600))
        .map_err(|_| io::Error::other("the MH never finished opening connections"))?;
    progress(&format!(
        "{established}/{count} connections open in {setup_s:.2} s"
    ));
    if let Some(e) = first_error {
        progress(&format!("first connect error: {e}"));
    }
    std::thread::sleep(Duration::from_millis(500));
    let rss_peak = rss_kib(pid);
    let fds = fd_count(pid);
    let sessions = lab.msrd_stats(1)?.active;
    progress(&format!(
        "msrd: {sessions} sessions, RSS {rss_peak} KiB, {fds} fds"
    ));
    let _ = go_tx.send(());
    let intact = client
        .join()
        .map_err(|_| io::Error::other("client thread panicked"))??;
    // "After": once every session has ended and msrd's heap trimmer has had its turn
    // (it looks every 5 s; `proxy/src/heap.rs`).
    let t0 = std::time::Instant::now();
    while lab.msrd_stats(1)?.active > 0 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(11));
    let rss_after = rss_kib(pid);
    progress(&format!("msrd: RSS {rss_after} KiB once they have closed"));
    Ok(ConnsBench {
        count,
        bytes_per_conn: bytes,
        established,
        intact,
        setup_s,
        setup_per_s: established as f64 / setup_s,
        sessions_at_peak: sessions,
        msrd_rss_kib_idle: rss_idle,
        msrd_rss_kib_peak: rss_peak,
        msrd_rss_kib_after: rss_after,
        msrd_fds_at_peak: fds,
    })
}

/// A tokio echo server for load benchmarks (`itcp-lab echo`): echoes every connection
/// until EOF, then closes it. Runs until killed.
pub fn echo_server(listen: std::net::SocketAddr) -> io::Result<()> {
    use tokio::io::AsyncWriteExt;
    crate::sys::raise_nofile_limit();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let std_l = std::net::TcpListener::bind(listen)?;
        // std listens with a backlog of 128: far too short for thousands of connects.
        // SAFETY: listen(2) again on a listening socket only changes its backlog.
        unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&std_l), 8192) };
        std_l.set_nonblocking(true)?;
        let l = tokio::net::TcpListener::from_std(std_l)?;
        loop {
            match l.accept().await {
                Ok((mut s, _)) => {
                    tokio::spawn(async move {
                        let (mut r, mut w) = s.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                        let _ = w.shutdown().await;
                    });
                }
                // Out of fds: wait for connections to finish rather than give up.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
}

/// Results of `bench churn`.
#[derive(Debug, Serialize)]
pub struct ChurnBench {
    pub handoff: bool,
    pub total: usize,
    pub concurrency: usize,
    pub intact: usize,
    pub seconds: f64,
    pub per_s: f64,
    pub msrd_fds_before: usize,
    pub msrd_fds_after: usize,
    pub msrd_rss_kib_before: u64,
    pub msrd_rss_kib_after: u64,
    pub sessions_after: u64,
}

/// `total` short I-TCP connections (each echoes 1 KiB and closes), `concurrency` at a
/// time; afterwards msrd must hold as many fds as before and no session. With
/// `handoff`, msrd has handoff on (one MSR, no peer): what that costs a new connection
/// (its SYN-ACK is reported to msrd, `itcp_proxy::handshakes`).
pub fn churn(
    total: usize,
    concurrency: usize,
    handoff: bool,
    progress: impl Fn(&str),
) -> io::Result<ChurnBench> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut lab, mut cfg) = veth_lab_msrd_config(
        "accept_rate = 1000000\naccept_burst = 1000000\nmax_handshakes_per_mh = 1024",
    )?;
    if handoff {
        cfg += &format!("\n{}", lab.handoff_config(1));
    }
    // The MH closes first, so its ports sit in TIME_WAIT for 60 s: without reuse and a
    // wide port range, one client host runs out of ports at ~470 connections/s. msrd's
    // fixed side reuses the MH's port towards the same FH, so it needs reuse too.
    for h in [Host::Mh, Host::Msr(1)] {
        lab.sysctl(
            h,
            &[
                ("net.ipv4.tcp_tw_reuse", "1"),
                ("net.ipv4.ip_local_port_range", "1024 65535"),
            ],
        )?;
    }
    let idx = lab.start_msrd(1, &cfg)?;
    let pid = lab.pid(idx);
    start_fh_echo(&mut lab)?;
    let (fds_before, rss_before) = (fd_count(pid), rss_kib(pid));
    let mh_ns = lab.ns(Host::Mh);
    let t0 = std::time::Instant::now();
    let intact = crate::sys::in_netns(&mh_ns, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let opts = bench_mh_opts();
            let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
            let mut tasks = Vec::with_capacity(total);
            for c in 0..total {
                let (opts, sem) = (opts.clone(), sem.clone());
                tasks.push(tokio::spawn(async move {
                    let _p = sem.acquire().await.unwrap();
                    let s = itcp_mh::nonblocking::ItcpStream::connect_with(
                        &opts,
                        std::net::SocketAddr::from(([10, 0, 0, 1], 9000)),
                    )
                    .await?;
                    let mut s = s.into_inner();
                    let data = payload(c, 1024);
                    s.write_all(&data).await?;
                    s.shutdown().await?;
                    let mut back = Vec::new();
                    s.read_to_end(&mut back).await?;
                    Ok::<bool, io::Error>(back == data)
                }));
            }
            let mut ok = 0;
            for t in tasks {
                if let Ok(Ok(true)) = t.await {
                    ok += 1;
                }
            }
            Ok::<usize, io::Error>(ok)
        })
    })?;
    let seconds = t0.elapsed().as_secs_f64();
    let on = if handoff { "on" } else { "off" };
    progress(&format!(
        "handoff {on}: {intact}/{total} intact in {seconds:.1} s"
    ));
    // Let msrd finish closing the last ones.
    std::thread::sleep(Duration::from_millis(500));
    let stats = lab.msrd_stats(1)?;
    Ok(ChurnBench {
        handoff,
        total,
        concurrency,
        intact,
        seconds,
        per_s: total as f64 / seconds,
        msrd_fds_before: fds_before,
        msrd_fds_after: fd_count(pid),
        msrd_rss_kib_before: rss_before,
        msrd_rss_kib_after: rss_kib(pid),
        sessions_after: stats.active,
    })
}
