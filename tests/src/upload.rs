//! Restart → first new upload byte at the FH: how long an MH that runs nothing of ours
//! and was uploading when it lost its cell takes to send again once the new MSR has
//! restarted its connection. Its own TCP backed its retransmission timer off during the
//! blackout; with `[handoff] revert_backoff` the new MSR tells it its retransmissions
//! were lost to the move (`itcp_handoff::backoff`). `itcp-lab bench upload` prints it
//! with the revert on and off, in the same run.
//!
//! One lab per run: transparent mode, network detection, an MH that runs nothing of
//! ours uploading to a reader in this process, in the FH's namespace, that verifies
//! every byte and timestamps every read. Two kinds of upload ([`Kind`]): a bulk one (a
//! plain `ttcp send`, no `--itcp`), and a paced one (a plain socket in the MH's
//! namespace writing 1000 bytes every 100 ms, as a chat or a telemetry feed would). The
//! MH makes `moves` moves between two cells, each of one of two shapes ([`Move`]): a
//! clean gap (the MH's NIC disassociates, its carrier drops and it sends nothing until
//! it associates again), or a fade (the MH goes out of its cell's range before its NIC
//! notices: its carrier stays up and what it sends is lost, then it associates with
//! the next cell). Per move, from the new MSR's restart of the connection (its handoff
//! record's `resumed`) to the FH's first read after it. The old MSR has long passed on
//! every byte it got from the MH by then, so that read carries bytes the MH sent after
//! it lost its cell.
//!
//! What wakes the MH up differs. After a clean gap the MH's stack sends what it held
//! back as soon as its carrier is up again. A bulk sender always has segments in the
//! air when the cell goes: the old MSR received some whose ACKs were lost, so the
//! restored socket's first ACK acknowledges new data and the MH's TCP retransmits the
//! rest at once. A paced sender in a fade has its last segment before the fade
//! acknowledged; what it writes into the fade is lost whole, and nothing but its
//! backed-off timer (or the new MSR's revert) makes it try again.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use itcp_handoff::log::{Outcome, Role};

use crate::dna::{Announcer, Probe};
use crate::emu::{Dir, LinkParams, Loss, Request};
use crate::lab::{self, addr, bin_path, Host, Lab, LabConfig};
use crate::scenario::Net;
use crate::sys::in_netns;

/// What the MH uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// As fast as the cell takes it (`ttcp send`).
    Bulk,
    /// 1000 bytes every 100 ms (TCP_NODELAY), below the cell's rate.
    Paced,
    /// 1000 bytes at the start, then 1000 bytes as the cell fades on every second move
    /// only (TCP_NODELAY): the connection reaches each odd move's old MSR in a move
    /// and gets no data there, and what the MH writes into the fade waits for its
    /// backed-off timer. Only the odd moves are measured.
    Interactive,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bulk => "bulk",
            Kind::Paced => "paced",
            Kind::Interactive => "interactive",
        }
    }
}

/// The shape of a move between cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// The MH is in no cell for this many ms (up to 200 more), its carrier down.
    Gap(u64),
    /// The MH's cell loses every frame both ways for this many ms (up to 200 more)
    /// while its carrier stays up; then it associates with the other cell.
    Fade(u64),
}

impl Move {
    pub fn name(self) -> String {
        match self {
            Move::Gap(ms) => format!(
                "gap {:.1}-{:.1} s",
                ms as f64 / 1e3,
                (ms + 200) as f64 / 1e3
            ),
            Move::Fade(ms) => format!(
                "fade {:.1}-{:.1} s",
                ms as f64 / 1e3,
                (ms + 200) as f64 / 1e3
            ),
        }
    }

    fn ms(self) -> u64 {
        match self {
            Move::Gap(ms) | Move::Fade(ms) => ms,
        }
    }
}

/// What one series of moves measured.
#[derive(Debug, Clone)]
pub struct UploadResumes {
    /// Per move: the new MSR's restart → the FH's first read after it, ms.
    pub ms: Vec<f64>,
    pub median_ms: f64,
    pub p95_ms: f64,
    /// Bytes the FH read, every one verified.
    pub bytes: u64,
    /// RSTs (in, out) at the FH and at the MH.
    pub rsts: ((u64, u64), (u64, u64)),
}

/// One wireless round trip plus one fixed one on `net`, ms: propagation both ways on
/// each, and one full-size segment's serialisation on the cell (the MH's
/// retransmission). The bound for an upload to resume after a restart.
pub fn bound_ms(net: &Net) -> f64 {
    let rtt = |l: &LinkParams| 2.0 * l.delay_us as f64 / 1000.0;
    let seg = if net.cell.rate_bps > 0 {
        1500.0 * 8.0 / net.cell.rate_bps as f64 * 1000.0
    } else {
        0.0
    };
    rtt(&net.cell) + seg + rtt(&net.wan)
}

/// Runs `moves_n` moves of shape `shape` on `net`, the MH uploading as `kind`, with
/// msrd's backoff revert on or off (seeded); errors on a setup failure, a lost or
/// corrupted byte, a move not completed in 10 s, or a move after which no byte came.
pub fn run(
    net: &Net,
    kind: Kind,
    shape: Move,
    revert: bool,
    moves_n: usize,
    seed: u64,
) -> io::Result<UploadResumes> {
    let mut lab = Lab::new(LabConfig::links(2, seed, net.wan.clone(), net.cell.clone()))?;
    let port = 5001;
    if !revert {
        lab.handoff_extra = "revert_backoff = false\n".into();
    }
    lab.start_itcp_network(&format!(
        "[transparent]\nenabled = true\nports = [{port}]\n{}",
        crate::firstbyte::MSRD_64K
    ))?;
    let _announcer = Announcer::start(
        &lab.ns(Host::Mh),
        "air0",
        Probe::Gateway(addr::CELL_GW.to_string()),
    )?;
    lab.watch_rsts(Host::Fh)?;
    lab.watch_rsts(Host::Mh)?;
    let fh: SocketAddr = lab::fh_addr(port)
        .parse()
        .map_err(|e| io::Error::other(format!("FH address: {e}")))?;
    let listener = in_netns(&lab.ns(Host::Fh), || TcpListener::bind(fh))?;
    let reader = std::thread::spawn(move || -> Result<(u64, Vec<u64>), String> {
        let (s, _) = listener.accept().map_err(|e| e.to_string())?;
        crate::moves::read_timestamped(s, seed)
    });
    // Long enough for every move: 1.2 s in each cell, the gaps, the moves' own time.
    let secs = 3 + moves_n as u64 * (3 + shape.ms() / 1000);
    let sender = match kind {
        Kind::Bulk => Sender::Ttcp(lab.spawn(
            Host::Mh,
            bin_path("ttcp"),
            &[
                "send",
                "--connect",
                &fh.to_string(),
                "--duration",
                &secs.to_string(),
                "--seed",
                &seed.to_string(),
            ],
        )?),
        Kind::Paced => {
            let s = in_netns(&lab.ns(Host::Mh), || TcpStream::connect(fh))?;
            let until = Instant::now() + Duration::from_secs(secs);
            Sender::Paced(std::thread::spawn(move || paced(s, seed, until)))
        }
        Kind::Interactive => {
            let s = in_netns(&lab.ns(Host::Mh), || TcpStream::connect(fh))?;
            s.set_nodelay(true)?;
            let mut w = Writer {
                s,
                gen: crate::stream::StreamGen::new(seed),
                sent: 0,
            };
            w.message()?;
            Sender::Interactive(w)
        }
    };
    let mut sender = sender;
    std::thread::sleep(Duration::from_millis(1500));
    let moved = |lab: &Lab| -> usize {
        (1..=2)
            .flat_map(|k| lab.handoff_records(k))
            .filter(|r| r.role == Role::New && r.outcome == Outcome::Moved)
            .count()
    };
    let mut at = 1;
    for i in 0..moves_n {
        let to = 3 - at;
        let out_ms = shape.ms() + 50 * (i as u64 % 5);
        match shape {
            Move::Gap(_) => {
                lab.assoc(&[])?;
                sender.on_fade(i)?;
                std::thread::sleep(Duration::from_millis(out_ms));
                lab.assoc(&[to])?;
            }
            Move::Fade(_) => {
                let cell = |params: LinkParams| Request::Link {
                    link: format!("cell{at}"),
                    dir: Dir::Both,
                    params,
                };
                let dead = LinkParams {
                    loss: Loss::Bernoulli { p: 1.0 },
                    ..net.cell.clone()
                };
                lab.emu(cell(dead))?;
                sender.on_fade(i)?;
                std::thread::sleep(Duration::from_millis(out_ms));
                lab.assoc(&[to])?;
                lab.emu(cell(net.cell.clone()))?;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while moved(&lab) <= i {
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{}: move {} not done in 10 s",
                    net.name,
                    i + 1
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(1200));
        at = to;
    }
    let sent = match sender {
        Sender::Ttcp(idx) => {
            let (_, out, err) = lab.wait(idx, Duration::from_secs(secs + 30))?;
            let send: crate::ttcp::SendReport = serde_json::from_str(out.trim()).map_err(|e| {
                io::Error::other(format!("the MH's sender gave no report ({e}): {err}"))
            })?;
            match send.error {
                None if send.ok => send.bytes,
                e => return Err(io::Error::other(format!("the MH's sender: {e:?}"))),
            }
        }
        Sender::Paced(t) => t
            .join()
            .map_err(|_| io::Error::other("the MH's writer panicked"))?
            .map_err(|e| io::Error::other(format!("the MH's writer: {e}")))?,
        Sender::Interactive(w) => w
            .finish()
            .map_err(|e| io::Error::other(format!("the MH's writer: {e}")))?,
    };
    let (bytes, reads) = reader
        .join()
        .map_err(|_| io::Error::other("the reader panicked"))?
        .map_err(|e| io::Error::other(format!("FH reader: {e}")))?;
    if bytes != sent {
        return Err(io::Error::other(format!(
            "{}: the FH read {bytes} of {sent} bytes sent",
            net.name
        )));
    }
    let rsts = (lab.rsts(Host::Fh)?, lab.rsts(Host::Mh)?);
    let mut ms = resumes_to_reads(&lab, &reads)?;
    if kind == Kind::Interactive {
        ms = ms.into_iter().skip(1).step_by(2).collect();
    }
    let (median_ms, p95_ms) = crate::moves::median_p95(&ms);
    Ok(UploadResumes {
        ms,
        median_ms,
        p95_ms,
        bytes,
        rsts,
    })
}

/// The MH's sending side: a `ttcp` process, a paced writer thread, or an interactive
/// writer driven by the moves.
enum Sender {
    Ttcp(usize),
    Paced(std::thread::JoinHandle<io::Result<u64>>),
    Interactive(Writer),
}

impl Sender {
    /// What the MH writes as its cell goes on move `i`: the interactive writer, on
    /// every odd move.
    fn on_fade(&mut self, i: usize) -> io::Result<()> {
        match self {
            Sender::Interactive(w) if i % 2 == 1 => w.message(),
            _ => Ok(()),
        }
    }
}

/// The interactive MH's connection: one message of the seeded stream at a time.
struct Writer {
    s: TcpStream,
    gen: crate::stream::StreamGen,
    sent: u64,
}

impl Writer {
    fn message(&mut self) -> io::Result<()> {
        let mut buf = [0u8; 1000];
        self.gen.fill(&mut buf);
        self.s.write_all(&buf)?;
        self.sent += buf.len() as u64;
        Ok(())
    }

    /// Ends the stream and waits for the FH to close. Returns the bytes written.
    fn finish(mut self) -> io::Result<u64> {
        self.s.shutdown(std::net::Shutdown::Write)?;
        let mut rest = Vec::new();
        self.s.read_to_end(&mut rest)?;
        Ok(self.sent)
    }
}

/// Writes the seeded stream on `s`, 1000 bytes every 100 ms, until `until`; then ends
/// it and waits for the FH to close. Returns the bytes written.
fn paced(mut s: TcpStream, seed: u64, until: Instant) -> io::Result<u64> {
    s.set_nodelay(true)?;
    let mut gen = crate::stream::StreamGen::new(seed);
    let mut buf = [0u8; 1000];
    let mut sent = 0u64;
    let mut next = Instant::now();
    while Instant::now() < until {
        gen.fill(&mut buf);
        s.write_all(&buf)?;
        sent += buf.len() as u64;
        next += Duration::from_millis(100);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)?;
    Ok(sent)
}

/// Per move (the new MSRs' `moved` records, in order): ms from the restart to the
/// first read in `reads` (CLOCK_MONOTONIC ns) after it.
fn resumes_to_reads(lab: &Lab, reads: &[u64]) -> io::Result<Vec<f64>> {
    let wall_minus_mono_us = crate::scenario::wall_minus_mono_us();
    let mut resumed: Vec<i64> = (1..=lab.msrs())
        .flat_map(|k| lab.handoff_records(k))
        .filter(|r| r.role == Role::New && r.outcome == Outcome::Moved)
        .filter_map(|r| r.phases.resumed)
        .map(|us| (us as i64 - wall_minus_mono_us) * 1000)
        .collect();
    resumed.sort_unstable();
    resumed
        .iter()
        .map(|&t| {
            reads
                .iter()
                .find(|&&r| r as i64 > t)
                .map(|&r| (r as i64 - t) as f64 / 1e6)
                .ok_or_else(|| io::Error::other("a move after which the FH read nothing"))
        })
        .collect()
}
