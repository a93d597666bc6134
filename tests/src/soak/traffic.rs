//! The soak's traffic: every MH runs several connection loops through I-TCP (mh-lib,
//! explicit mode) to one server at the FH, and both ends verify every byte against
//! ttcp's seeded streams ([`crate::stream`]).
//!
//! One small protocol on one FH port. The MH opens with a header — `SOAK`, kind, MH
//! number, connection id, seed, byte count (30 bytes) — then, by kind:
//!
//! * **bulk down**: the FH sends `bytes` of stream `seed` and a FIN; the MH verifies them
//!   and expects exactly that many before the FIN, then closes.
//! * **bulk up**: the MH sends `bytes` of stream `seed` and a FIN; the FH verifies them
//!   and answers a 9-byte verdict (status, bytes it verified), then closes.
//! * **interactive** and **short**: request/response exchanges. A request is
//!   `[request length u32][response length u32]` and that many bytes of the MH's
//!   stream (`seed`); the response is the next bytes of the FH's stream
//!   (`seed ^ DOWN_SALT`). Interactive connections live for tens of seconds with think
//!   times; short ones make 1–3 exchanges and close, over and over. The MH ends with a
//!   FIN; the FH answers with its own.
//!
//! Every close is a clean FIN exchange with nothing left unread, so a healthy run has
//! no RST at all. An operation that makes no progress for [`STALL`] fails the
//! connection as stalled. Results go to [`Shared`] from both ends, keyed by the
//! connection id, for the report to join.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{uniform, Shared};
use crate::rng::{derive_seed, SplitMix64};
use crate::stream::{StreamCheck, StreamGen};

/// The FH's server port.
pub const FH_PORT: u16 = 7000;
const MAGIC: &[u8; 4] = b"SOAK";
const HEADER: usize = 30;
/// An operation without progress for this long fails its connection ("stalled"). Long
/// enough for the worst recovery the soak provokes: a crash, a restart and TCP's
/// backed-off retransmission after a several-second outage.
pub const STALL: Duration = Duration::from_secs(30);
/// The FH's response stream of a connection is seeded `seed ^ DOWN_SALT`.
const DOWN_SALT: u64 = 0x5eed_d0d0_5eed_d0d0;
const CHUNK: usize = 64 * 1024;

/// What a connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    BulkDown,
    BulkUp,
    Interactive,
    Short,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::BulkDown, Kind::BulkUp, Kind::Interactive, Kind::Short];

    fn code(self) -> u8 {
        match self {
            Kind::BulkDown => b'D',
            Kind::BulkUp => b'U',
            Kind::Interactive => b'I',
            Kind::Short => b'S',
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.code() == c)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::BulkDown => "bulk_down",
            Kind::BulkUp => "bulk_up",
            Kind::Interactive => "interactive",
            Kind::Short => "short",
        }
    }
}

/// Why a connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// A byte differed from the seeded stream, or more bytes came than were sent.
    Corrupt,
    /// A clean end of stream (FIN) before every byte arrived: silent loss.
    Truncated,
    /// Reset (RST), aborted or broken pipe.
    Reset,
    /// No progress for [`STALL`].
    Stalled,
    /// The I-TCP connect itself failed (gateway, SOCKS, fixed-side connect): no bytes
    /// were at stake yet.
    Connect,
    /// Any other I/O error.
    Other,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Corrupt => "corrupt",
            Class::Truncated => "truncated",
            Class::Reset => "reset",
            Class::Stalled => "stalled",
            Class::Connect => "connect",
            Class::Other => "other",
        }
    }
}

/// A failed operation: its class and what happened.
#[derive(Debug, Clone, Serialize)]
pub struct Fail {
    pub class: Class,
    pub what: String,
}

impl Fail {
    fn new(class: Class, what: impl Into<String>) -> Fail {
        Fail {
            class,
            what: what.into(),
        }
    }

    fn io(op: &str, e: io::Error) -> Fail {
        use io::ErrorKind as K;
        let class = match e.kind() {
            K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => Class::Reset,
            K::UnexpectedEof => Class::Truncated,
            K::TimedOut => Class::Stalled,
            _ => Class::Other,
        };
        Fail::new(class, format!("{op}: {e}"))
    }
}

/// One connection as the MH saw it. Times are seconds on the soak's clock.
#[derive(Debug, Clone, Serialize)]
pub struct MhConn {
    pub id: u64,
    pub mh: usize,
    pub kind: Kind,
    /// The MH's port of the wireless-side connection (once connected).
    pub local_port: Option<u16>,
    pub started: f64,
    pub connected: Option<f64>,
    pub ended: f64,
    /// Bytes the MH received and verified.
    pub verified: u64,
    /// Bytes the MH sent.
    pub sent: u64,
    pub fail: Option<Fail>,
}

/// One connection as the FH saw it.
#[derive(Debug, Clone, Serialize)]
pub struct FhConn {
    /// 0 when the header never arrived.
    pub id: u64,
    pub mh: usize,
    pub kind: Option<Kind>,
    /// The MH's address and port as the FH sees them.
    pub peer: SocketAddr,
    pub accepted: f64,
    pub ended: f64,
    /// Bytes the FH received and verified.
    pub verified: u64,
    pub sent: u64,
    pub fail: Option<Fail>,
}

async fn step<T>(op: &str, f: impl std::future::Future<Output = io::Result<T>>) -> Result<T, Fail> {
    match tokio::time::timeout(STALL, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Fail::io(op, e)),
        Err(_) => Err(Fail::new(
            Class::Stalled,
            format!("{op}: no progress for {} s", STALL.as_secs()),
        )),
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before the
/// first byte (a message boundary), a truncation error after it.
async fn read_full(s: &mut TcpStream, buf: &mut [u8], op: &str) -> Result<bool, Fail> {
    let mut got = 0;
    while got < buf.len() {
        let n = step(op, s.read(&mut buf[got..])).await?;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(Fail::new(
                Class::Truncated,
                format!("{op}: end of stream after {got} of {} bytes", buf.len()),
            ));
        }
        got += n;
    }
    Ok(true)
}

/// Reads `n` bytes and checks them against `check`, counting verified bytes in `ok`.
async fn read_verified(
    s: &mut TcpStream,
    check: &mut StreamCheck,
    n: u64,
    ok: &mut u64,
    buf: &mut [u8],
    op: &str,
) -> Result<(), Fail> {
    let mut left = n;
    while left > 0 {
        let want = (left as usize).min(buf.len());
        let got = step(op, s.read(&mut buf[..want])).await?;
        if got == 0 {
            return Err(Fail::new(
                Class::Truncated,
                format!("{op}: end of stream after {} of {n} bytes", n - left),
            ));
        }
        check
            .check(&buf[..got])
            .map_err(|m| Fail::new(Class::Corrupt, format!("{op}: {m}")))?;
        *ok += got as u64;
        left -= got as u64;
    }
    Ok(())
}

/// Writes `n` bytes of `gen`, counting them in `sent`.
async fn write_stream(
    s: &mut TcpStream,
    gen: &mut StreamGen,
    n: u64,
    sent: &mut u64,
    buf: &mut [u8],
    op: &str,
) -> Result<(), Fail> {
    let mut left = n;
    while left > 0 {
        let k = (left as usize).min(buf.len());
        gen.fill(&mut buf[..k]);
        step(op, s.write_all(&buf[..k])).await?;
        *sent += k as u64;
        left -= k as u64;
    }
    Ok(())
}

/// Expects the peer's FIN with nothing before it.
async fn expect_eof(s: &mut TcpStream, op: &str) -> Result<(), Fail> {
    let mut b = [0u8; 1];
    match step(op, s.read(&mut b)).await? {
        0 => Ok(()),
        _ => Err(Fail::new(
            Class::Corrupt,
            format!("{op}: a byte where the end of stream belongs"),
        )),
    }
}

/// What one MH runs: connection loops of every kind until the soak stops.
pub struct MhPlan {
    pub mh: usize,
    pub seed: u64,
    pub fh: SocketAddr,
    pub token_file: std::path::PathBuf,
    /// Loops of each kind.
    pub loops: Vec<(Kind, usize)>,
    /// Bulk transfers are 64 KiB to this many bytes (log-uniform).
    pub max_bulk: u64,
}

/// Runs `plan` on the current thread (which must be in the MH's namespace) until
/// `shared.stop_new` is set and every loop has finished its connection.
pub fn run_mh(plan: MhPlan, shared: Arc<Shared>) -> io::Result<()> {
    crate::sys::raise_nofile_limit();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let plan = Arc::new(plan);
    rt.block_on(async move {
        let mut set = tokio::task::JoinSet::new();
        for &(kind, n) in &plan.loops {
            for slot in 0..n {
                set.spawn(mh_loop(plan.clone(), shared.clone(), kind, slot));
            }
        }
        while set.join_next().await.is_some() {}
    });
    Ok(())
}

async fn mh_loop(plan: Arc<MhPlan>, shared: Arc<Shared>, kind: Kind, slot: usize) {
    let mut rng = SplitMix64::new(derive_seed(
        plan.seed,
        &format!("mh{}/{}/{slot}", plan.mh, kind.name()),
    ));
    let opts = itcp_mh::MhOptions::new()
        .gateway(SocketAddr::from((crate::lab::addr::CELL_GW, 1080)))
        .token_file(plan.token_file.clone())
        .connect_timeout(Duration::from_secs(5))
        .reply_timeout(Some(Duration::from_secs(10)));
    // Spread the loops' first connections over the first second.
    tokio::time::sleep(Duration::from_secs_f64(uniform(&mut rng, 0.0, 1.0))).await;
    while !shared.stop_new.load(Ordering::Relaxed) {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut c = MhConn {
            id,
            mh: plan.mh,
            kind,
            local_port: None,
            started: shared.clock.now(),
            connected: None,
            ended: 0.0,
            verified: 0,
            sent: 0,
            fail: None,
        };
        let r = one_connection(&plan, &shared, &opts, &mut rng, &mut c).await;
        c.ended = shared.clock.now();
        c.fail = r.err();
        let failed = c.fail.is_some();
        shared.mh_conns.lock().unwrap().push(c);
        let pause = match (failed, kind) {
            (true, _) => uniform(&mut rng, 0.3, 1.0),
            (false, Kind::Short) => uniform(&mut rng, 0.0, 0.2),
            (false, _) => uniform(&mut rng, 0.0, 0.5),
        };
        tokio::time::sleep(Duration::from_secs_f64(pause)).await;
    }
}

/// The port of `(from A:P)` in an mh-lib error.
fn port_named_in(msg: &str) -> Option<u16> {
    let (_, rest) = msg.split_once("(from ")?;
    let (addr, _) = rest.split_once(')')?;
    addr.parse::<std::net::SocketAddr>().ok().map(|a| a.port())
}

async fn one_connection(
    plan: &MhPlan,
    shared: &Shared,
    opts: &itcp_mh::MhOptions,
    rng: &mut SplitMix64,
    c: &mut MhConn,
) -> Result<(), Fail> {
    let s = tokio::time::timeout(
        Duration::from_secs(20),
        itcp_mh::nonblocking::ItcpStream::connect_with(opts, plan.fh),
    )
    .await
    .map_err(|_| Fail::new(Class::Connect, "connect: no answer in 20 s"))?
    .map_err(|e| {
        // mh-lib names our end once connected to the gateway: an RST the MH sends
        // later on that port is its kernel answering for the socket given up here.
        c.local_port = port_named_in(&e.to_string());
        Fail::new(Class::Connect, format!("connect: {e}"))
    })?;
    let mut s = s.into_inner();
    c.connected = Some(shared.clock.now());
    c.local_port = s.local_addr().ok().map(|a| a.port());
    let seed = rng.next_u64();
    let bytes = match c.kind {
        Kind::BulkDown | Kind::BulkUp => {
            let (lo, hi) = ((64u64 << 10) as f64, plan.max_bulk.max(64 << 10) as f64);
            (lo * (hi / lo).powf(rng.next_f64())) as u64
        }
        _ => 0,
    };
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(MAGIC);
    h.push(c.kind.code());
    h.push(plan.mh as u8);
    h.extend_from_slice(&c.id.to_be_bytes());
    h.extend_from_slice(&seed.to_be_bytes());
    h.extend_from_slice(&bytes.to_be_bytes());
    step("header", s.write_all(&h)).await?;
    let mut buf = vec![0u8; CHUNK];
    match c.kind {
        Kind::BulkDown => {
            let mut check = StreamCheck::new(seed);
            loop {
                let n = step("receive", s.read(&mut buf)).await?;
                if n == 0 {
                    break;
                }
                if check.offset() + n as u64 > bytes {
                    return Err(Fail::new(
                        Class::Corrupt,
                        format!("receive: more than the {bytes} bytes sent"),
                    ));
                }
                check
                    .check(&buf[..n])
                    .map_err(|m| Fail::new(Class::Corrupt, format!("receive: {m}")))?;
                c.verified += n as u64;
            }
            if c.verified != bytes {
                return Err(Fail::new(
                    Class::Truncated,
                    format!(
                        "receive: end of stream after {} of {bytes} bytes",
                        c.verified
                    ),
                ));
            }
            step("close", s.shutdown()).await?;
        }
        Kind::BulkUp => {
            let mut gen = StreamGen::new(seed);
            write_stream(&mut s, &mut gen, bytes, &mut c.sent, &mut buf, "send").await?;
            step("close", s.shutdown()).await?;
            let mut v = [0u8; 9];
            if !read_full(&mut s, &mut v, "verdict").await? {
                return Err(Fail::new(
                    Class::Truncated,
                    "verdict: end of stream instead of the FH's verdict",
                ));
            }
            let got = u64::from_be_bytes(v[1..9].try_into().unwrap());
            match v[0] {
                0 if got == bytes => {}
                1 => {
                    return Err(Fail::new(
                        Class::Corrupt,
                        format!("the FH found a mismatch after {got} good bytes"),
                    ))
                }
                _ => {
                    return Err(Fail::new(
                        Class::Truncated,
                        format!("the FH got {got} of {bytes} bytes before the end of stream"),
                    ))
                }
            }
            expect_eof(&mut s, "close").await?;
        }
        Kind::Interactive | Kind::Short => {
            let (count, think) = if c.kind == Kind::Interactive {
                (20 + (rng.next_u64() % 180) as usize, (0.02, 0.3))
            } else {
                (1 + (rng.next_u64() % 3) as usize, (0.0, 0.0))
            };
            let mut gen = StreamGen::new(seed);
            let mut check = StreamCheck::new(seed ^ DOWN_SALT);
            for i in 0..count {
                if i > 0 && shared.stop_new.load(Ordering::Relaxed) {
                    break;
                }
                let req = 1 + rng.next_u64() % 2048;
                let resp = 1 + rng.next_u64() % 16384;
                let mut f = [0u8; 8];
                f[..4].copy_from_slice(&(req as u32).to_be_bytes());
                f[4..].copy_from_slice(&(resp as u32).to_be_bytes());
                step("request", s.write_all(&f)).await?;
                write_stream(&mut s, &mut gen, req, &mut c.sent, &mut buf, "request").await?;
                read_verified(
                    &mut s,
                    &mut check,
                    resp,
                    &mut c.verified,
                    &mut buf,
                    "response",
                )
                .await?;
                if think.1 > 0.0 {
                    tokio::time::sleep(Duration::from_secs_f64(uniform(rng, think.0, think.1)))
                        .await;
                }
            }
            step("close", s.shutdown()).await?;
            expect_eof(&mut s, "close").await?;
        }
    }
    Ok(())
}

/// The FH's server: serves every connection until `shared.stop_fh` is set, then waits
/// for the connections still open (each ends by itself or stalls out). Runs on the
/// current thread, which must be in the FH's namespace.
pub fn run_fh(listen: SocketAddr, shared: Arc<Shared>) -> io::Result<()> {
    crate::sys::raise_nofile_limit();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind(listen).await?;
        shared.fh_ready.store(true, Ordering::Relaxed);
        let mut set = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                a = l.accept() => {
                    if let Ok((s, peer)) = a {
                        set.spawn(fh_conn(s, peer, shared.clone()));
                    }
                }
                _ = tick.tick() => {
                    if shared.stop_fh.load(Ordering::Relaxed) {
                        break;
                    }
                    while set.try_join_next().is_some() {}
                }
            }
        }
        drop(l);
        while set.join_next().await.is_some() {}
        Ok(())
    })
}

async fn fh_conn(mut s: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let mut c = FhConn {
        id: 0,
        mh: 0,
        kind: None,
        peer,
        accepted: shared.clock.now(),
        ended: 0.0,
        verified: 0,
        sent: 0,
        fail: None,
    };
    c.fail = fh_serve(&mut s, &mut c).await.err();
    c.ended = shared.clock.now();
    shared.fh_conns.lock().unwrap().push(c);
}

async fn fh_serve(s: &mut TcpStream, c: &mut FhConn) -> Result<(), Fail> {
    let mut h = [0u8; HEADER];
    if !read_full(s, &mut h, "header").await? {
        return Err(Fail::new(
            Class::Truncated,
            "header: end of stream before it",
        ));
    }
    let kind = Kind::from_code(h[4]).filter(|_| &h[..4] == MAGIC);
    let Some(kind) = kind else {
        return Err(Fail::new(Class::Corrupt, "header: not a soak header"));
    };
    c.kind = Some(kind);
    c.mh = h[5] as usize;
    c.id = u64::from_be_bytes(h[6..14].try_into().unwrap());
    let seed = u64::from_be_bytes(h[14..22].try_into().unwrap());
    let bytes = u64::from_be_bytes(h[22..30].try_into().unwrap());
    let mut buf = vec![0u8; CHUNK];
    match kind {
        Kind::BulkDown => {
            let mut gen = StreamGen::new(seed);
            write_stream(s, &mut gen, bytes, &mut c.sent, &mut buf, "send").await?;
            step("close", s.shutdown()).await?;
            expect_eof(s, "close").await?;
        }
        Kind::BulkUp => {
            let mut check = StreamCheck::new(seed);
            let mut status = 0u8;
            let mut fail = None;
            loop {
                let n = step("receive", s.read(&mut buf)).await?;
                if n == 0 {
                    break;
                }
                if check.offset() + n as u64 > bytes {
                    status = 1;
                    fail = Some(Fail::new(
                        Class::Corrupt,
                        format!("receive: more than the {bytes} bytes sent"),
                    ));
                    break;
                }
                if let Err(m) = check.check(&buf[..n]) {
                    status = 1;
                    fail = Some(Fail::new(Class::Corrupt, format!("receive: {m}")));
                    break;
                }
                c.verified += n as u64;
            }
            if status == 0 && c.verified != bytes {
                status = 2;
                fail = Some(Fail::new(
                    Class::Truncated,
                    format!(
                        "receive: end of stream after {} of {bytes} bytes",
                        c.verified
                    ),
                ));
            }
            let mut v = [0u8; 9];
            v[0] = status;
            v[1..].copy_from_slice(&c.verified.to_be_bytes());
            step("verdict", s.write_all(&v)).await?;
            step("close", s.shutdown()).await?;
            if let Some(f) = fail {
                return Err(f);
            }
        }
        Kind::Interactive | Kind::Short => {
            let mut check = StreamCheck::new(seed);
            let mut gen = StreamGen::new(seed ^ DOWN_SALT);
            loop {
                let mut f = [0u8; 8];
                if !read_full(s, &mut f, "request").await? {
                    break;
                }
                let req = u32::from_be_bytes(f[..4].try_into().unwrap()) as u64;
                let resp = u32::from_be_bytes(f[4..].try_into().unwrap()) as u64;
                read_verified(s, &mut check, req, &mut c.verified, &mut buf, "request").await?;
                write_stream(s, &mut gen, resp, &mut c.sent, &mut buf, "response").await?;
            }
            step("close", s.shutdown()).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod port_tests {
    #[test]
    fn the_port_of_a_failed_connect_is_read_from_mh_libs_error() {
        let e = "I-TCP gateway 10.2.0.1:1080 (from 10.2.0.103:58870) did not answer the method negotiation within 5s";
        assert_eq!(super::port_named_in(e), Some(58870));
        assert_eq!(
            super::port_named_in("cannot reach I-TCP gateway 10.2.0.1:1080: timed out"),
            None
        );
    }
}
