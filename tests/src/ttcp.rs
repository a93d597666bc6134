//! `ttcp`: the traffic tool's transfer logic and report types.
//!
//! A sender writes the seeded byte stream of [`crate::stream`]; a receiver verifies it
//! (any lost, duplicated, reordered or altered byte fails at a named offset),
//! timestamps every read and reports goodput, a 100 ms timeline and the longest stall.
//! There is also an echo server and a request/response latency client.
//!
//! Sockets are blocking `std::net` sockets created through libc so that `SO_SNDBUF` /
//! `SO_RCVBUF` (and `TCP_CONGESTION`, `TCP_NODELAY`) are in place before `connect` /
//! `listen`: the receive buffer fixes the window scale during the handshake, so setting
//! it afterwards would not really limit the window. IPv4 and IPv6 both work.
//!
//! Reports are `serde` types; the `ttcp` binary prints them as one JSON line, and other
//! code (the scenario runner) parses them back with `serde_json`.

use std::io::{self, ErrorKind, Read, Write};
use std::mem;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::stream::{StreamCheck, StreamGen};

/// Width of one timeline bin in seconds.
pub const BIN_S: f64 = 0.1;
const BIN_NS: u128 = 100_000_000;
/// Default read/write chunk size.
pub const DEFAULT_CHUNK: usize = 64 * 1024;
/// Default connect timeout in seconds.
pub const DEFAULT_CONNECT_TIMEOUT: f64 = 10.0;
const CONNECT_RETRY: Duration = Duration::from_millis(50);

/// Which side opens the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// Actively connect to this address (retrying while it is refused/unreachable).
    Connect(SocketAddr),
    /// Listen on this address and use the first accepted connection.
    Listen(SocketAddr),
}

impl Endpoint {
    pub fn addr(&self) -> SocketAddr {
        match *self {
            Endpoint::Connect(a) | Endpoint::Listen(a) => a,
        }
    }
}

/// Options of the `send` and `recv` roles.
#[derive(Debug, Clone, PartialEq)]
pub struct Opts {
    pub endpoint: Endpoint,
    /// Stream seed (default 1).
    pub seed: u64,
    /// Sender: bytes to send. Receiver: bytes expected (less is an error, more too).
    pub bytes: Option<u64>,
    /// Sender only: send until this many seconds after the connection is up.
    pub duration: Option<f64>,
    /// `SO_SNDBUF` and `SO_RCVBUF`, set before connect/listen.
    pub buf: Option<usize>,
    /// `TCP_CONGESTION` algorithm name.
    pub cc: Option<String>,
    /// `TCP_NODELAY` (default off).
    pub nodelay: bool,
    /// Read/write size (default 64 KiB).
    pub chunk: usize,
    /// Seconds to keep retrying a refused/unreachable connect (default 10).
    pub connect_timeout: f64,
    /// Sender fault injection: flip the byte at this stream offset.
    pub corrupt_at: Option<u64>,
    /// Receiver: verify the stream (default true); false only counts bytes.
    pub verify: bool,
    /// Open the connection as an I-TCP connection through the MSR (mh-lib): connect
    /// asks the gateway to connect, listen asks it to listen on the MH's address
    /// (only the port of the listen address is used).
    pub itcp: bool,
}

impl Opts {
    pub fn new(endpoint: Endpoint) -> Self {
        Opts {
            endpoint,
            seed: 1,
            bytes: None,
            duration: None,
            buf: None,
            cc: None,
            nodelay: false,
            chunk: DEFAULT_CHUNK,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            corrupt_at: None,
            verify: true,
            itcp: false,
        }
    }

    pub fn connect(addr: SocketAddr) -> Self {
        Opts::new(Endpoint::Connect(addr))
    }

    pub fn listen(addr: SocketAddr) -> Self {
        Opts::new(Endpoint::Listen(addr))
    }

    pub fn sock_opts(&self) -> SockOpts {
        SockOpts {
            buf: self.buf,
            cc: self.cc.clone(),
            nodelay: self.nodelay,
        }
    }
}

/// Socket options applied before connect/listen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SockOpts {
    pub buf: Option<usize>,
    pub cc: Option<String>,
    pub nodelay: bool,
}

/// Options of the `rr` (request/response latency) client.
#[derive(Debug, Clone, PartialEq)]
pub struct RrOpts {
    pub addr: SocketAddr,
    /// Number of exchanges (default 1000).
    pub count: u64,
    /// Request (and response) size in bytes (default 64).
    pub size: usize,
    /// Pause between exchanges in milliseconds (default 0).
    pub interval_ms: f64,
    pub connect_timeout: f64,
    pub seed: u64,
    /// Send a request every `interval_ms` without waiting for the responses (an
    /// interactive application over a long path: several requests in flight).
    pub pipeline: bool,
    /// Exchanges left out of the statistics at the start (a split connection's first
    /// requests also wait for its fixed side to connect).
    pub warmup: u64,
    /// Connect through the MSR with mh-lib (I-TCP) instead of directly.
    pub itcp: bool,
}

impl RrOpts {
    pub fn new(addr: SocketAddr) -> Self {
        RrOpts {
            addr,
            count: 1000,
            size: 64,
            interval_ms: 0.0,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            seed: 1,
            pipeline: false,
            warmup: 0,
            itcp: false,
        }
    }
}

/// Options of the `echo` server.
#[derive(Debug, Clone, PartialEq)]
pub struct EchoOpts {
    pub listen: SocketAddr,
    /// Serve a single connection, then return.
    pub once: bool,
    pub buf: Option<usize>,
    pub cc: Option<String>,
}

impl EchoOpts {
    pub fn new(listen: SocketAddr) -> Self {
        EchoOpts {
            listen,
            once: false,
            buf: None,
            cc: None,
        }
    }
}

/// Selected fields of the kernel's `struct tcp_info` (times in microseconds).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TcpInfo {
    pub state: u8,
    pub ca_state: u8,
    pub retransmits: u8,
    pub backoff: u8,
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
    pub rto_us: u32,
    pub ato_us: u32,
    pub snd_mss: u32,
    pub rcv_mss: u32,
    pub unacked: u32,
    pub lost: u32,
    pub retrans: u32,
    pub pmtu: u32,
    pub rcv_ssthresh: u32,
    pub rtt_us: u32,
    pub rttvar_us: u32,
    pub min_rtt_us: u32,
    pub snd_ssthresh: u32,
    pub snd_cwnd: u32,
    pub advmss: u32,
    pub reordering: u32,
    pub rcv_rtt_us: u32,
    pub rcv_space: u32,
    pub total_retrans: u32,
    pub pacing_rate: u64,
    pub delivery_rate: u64,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub bytes_retrans: u64,
    pub segs_out: u32,
    pub segs_in: u32,
    pub data_segs_out: u32,
    pub data_segs_in: u32,
    pub notsent_bytes: u32,
    pub busy_time_us: u64,
    pub rwnd_limited_us: u64,
    pub sndbuf_limited_us: u64,
    pub snd_wnd: u32,
    pub rcv_wnd: u32,
    /// Retransmission timeouts over the connection's life, and the time spent in
    /// them, ms (Linux ≥ 6.7; 0 before).
    pub total_rto: u32,
    pub total_rto_time_ms: u32,
}

/// The receiver's report. `bytes` counts everything read (including any excess).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecvReport {
    pub role: String,
    pub ok: bool,
    pub error: Option<String>,
    pub bytes: u64,
    pub expected_bytes: Option<u64>,
    pub seed: u64,
    /// Whether the stream content was verified (`--no-verify` turns it off).
    #[serde(default = "yes")]
    pub verified: bool,
    /// `CLOCK_MONOTONIC` (ns) when the connection was established.
    pub t0_mono_ns: u64,
    pub first_byte_s: f64,
    pub last_byte_s: f64,
    /// From t0 to the last byte (= `last_byte_s`).
    pub duration_s: f64,
    pub goodput_bps: f64,
    pub bin_s: f64,
    /// Bytes received per `bin_s` bin from t0, empty bins included.
    pub timeline_bytes: Vec<u64>,
    /// Largest gap between consecutive data arrivals (t0 → first byte counts).
    pub longest_stall_s: f64,
    /// When that gap started (relative to t0).
    pub longest_stall_at_s: f64,
    pub peer: String,
    pub local: String,
    #[serde(default)]
    pub tcp_info: Option<TcpInfo>,
}

fn yes() -> bool {
    true
}

/// The sender's report. Its goodput is informational: with a split connection it only
/// describes the sender's own half.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendReport {
    pub role: String,
    pub ok: bool,
    pub error: Option<String>,
    pub bytes: u64,
    pub seed: u64,
    pub t0_mono_ns: u64,
    /// From t0 until the peer closed (EOF).
    pub duration_s: f64,
    pub goodput_bps: f64,
    pub peer: String,
    pub local: String,
    #[serde(default)]
    pub tcp_info: Option<TcpInfo>,
}

/// The request/response client's report (round-trip times in microseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RrReport {
    pub role: String,
    pub ok: bool,
    pub error: Option<String>,
    /// Completed exchanges.
    pub count: u64,
    pub size: usize,
    pub min_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    #[serde(default)]
    pub peer: String,
    #[serde(default)]
    pub local: String,
}

// ---------------------------------------------------------------------------------
// Clock

pub use crate::sys::mono_ns;

// ---------------------------------------------------------------------------------
// Sockets

fn ctx(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setsockopt_raw(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: *const libc::c_void,
    len: usize,
) -> io::Result<()> {
    // SAFETY: the caller passes a pointer to `len` readable bytes.
    cvt(unsafe { libc::setsockopt(fd, level, name, val, len as libc::socklen_t) }).map(|_| ())
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    setsockopt_raw(
        fd,
        level,
        name,
        &v as *const libc::c_int as *const libc::c_void,
        mem::size_of::<libc::c_int>(),
    )
}

fn apply_sock_opts(fd: RawFd, so: &SockOpts) -> io::Result<()> {
    if let Some(b) = so.buf {
        let v = libc::c_int::try_from(b).map_err(|_| {
            io::Error::new(
                ErrorKind::InvalidInput,
                format!("buffer size {b} too large"),
            )
        })?;
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v)
            .map_err(|e| ctx(e, "setsockopt SO_SNDBUF"))?;
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v)
            .map_err(|e| ctx(e, "setsockopt SO_RCVBUF"))?;
    }
    set_cc(fd, so.cc.as_deref())?;
    if so.nodelay {
        setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
            .map_err(|e| ctx(e, "setsockopt TCP_NODELAY"))?;
    }
    Ok(())
}

fn set_cc(fd: RawFd, cc: Option<&str>) -> io::Result<()> {
    if let Some(cc) = cc {
        setsockopt_raw(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr() as *const libc::c_void,
            cc.len(),
        )
        .map_err(|e| ctx(e, format!("setsockopt TCP_CONGESTION '{cc}'")))?;
    }
    Ok(())
}

/// A `sockaddr_in`/`sockaddr_in6` for libc calls.
enum RawAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl RawAddr {
    fn new(addr: &SocketAddr) -> RawAddr {
        match addr {
            SocketAddr::V4(a) => {
                // SAFETY: all-zero is a valid sockaddr_in.
                let mut sin: libc::sockaddr_in = unsafe { mem::zeroed() };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr = libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                };
                RawAddr::V4(sin)
            }
            SocketAddr::V6(a) => {
                // SAFETY: all-zero is a valid sockaddr_in6.
                let mut sin6: libc::sockaddr_in6 = unsafe { mem::zeroed() };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_flowinfo = a.flowinfo();
                sin6.sin6_addr = libc::in6_addr {
                    s6_addr: a.ip().octets(),
                };
                sin6.sin6_scope_id = a.scope_id();
                RawAddr::V6(sin6)
            }
        }
    }

    fn ptr_len(&self) -> (*const libc::sockaddr, libc::socklen_t) {
        match self {
            RawAddr::V4(s) => (
                s as *const libc::sockaddr_in as *const libc::sockaddr,
                mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            RawAddr::V6(s) => (
                s as *const libc::sockaddr_in6 as *const libc::sockaddr,
                mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }
}

fn new_socket(addr: &SocketAddr, so: &SockOpts) -> io::Result<OwnedFd> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall.
    let fd = cvt(unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })
        .map_err(|e| ctx(e, "socket"))?;
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    apply_sock_opts(fd.as_raw_fd(), so)?;
    Ok(fd)
}

fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }).map(|_| ())
}

/// One connect attempt, bounded by `deadline`.
fn connect_once(addr: &SocketAddr, so: &SockOpts, deadline: Instant) -> io::Result<TcpStream> {
    let fd = new_socket(addr, so)?;
    let raw = fd.as_raw_fd();
    set_nonblocking(raw, true)?;
    let sa = RawAddr::new(addr);
    let (p, l) = sa.ptr_len();
    // SAFETY: p/l describe a valid sockaddr.
    if unsafe { libc::connect(raw, p, l) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(ErrorKind::TimedOut, "timed out"));
            }
            let ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            let mut pfd = libc::pollfd {
                fd: raw,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r > 0 {
                break;
            }
        }
        let mut err: libc::c_int = 0;
        let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: valid out pointers.
        cvt(unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                &mut err as *mut libc::c_int as *mut libc::c_void,
                &mut len,
            )
        })?;
        if err != 0 {
            return Err(io::Error::from_raw_os_error(err));
        }
    }
    set_nonblocking(raw, false)?;
    Ok(TcpStream::from(fd))
}

fn retryable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED) | Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH)
    )
}

/// Connects to `addr` with the socket options set beforehand. A refused or
/// unreachable connect is retried every 50 ms until `timeout` (peers start
/// concurrently); a connect that hangs is abandoned at `timeout`.
pub fn connect(addr: SocketAddr, so: &SockOpts, timeout: Duration) -> io::Result<TcpStream> {
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        match connect_once(&addr, so, deadline) {
            Ok(s) => return Ok(s),
            Err(e) if retryable(&e) && Instant::now() + CONNECT_RETRY < deadline => {
                thread::sleep(CONNECT_RETRY)
            }
            Err(e) if retryable(&e) || e.kind() == ErrorKind::TimedOut => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "connect to {addr}: {e} (gave up after {:.1} s)",
                        start.elapsed().as_secs_f64()
                    ),
                ))
            }
            Err(e) => return Err(ctx(e, format!("connect to {addr}"))),
        }
    }
}

/// Creates a listening socket with `SO_REUSEADDR` and the socket options in place
/// before `listen`, so accepted connections inherit the buffer sizes.
pub fn listen(addr: SocketAddr, so: &SockOpts) -> io::Result<TcpListener> {
    let fd = new_socket(&addr, so)?;
    let raw = fd.as_raw_fd();
    setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)
        .map_err(|e| ctx(e, "setsockopt SO_REUSEADDR"))?;
    let sa = RawAddr::new(&addr);
    let (p, l) = sa.ptr_len();
    // SAFETY: p/l describe a valid sockaddr.
    cvt(unsafe { libc::bind(raw, p, l) }).map_err(|e| ctx(e, format!("bind {addr}")))?;
    // SAFETY: plain syscall.
    cvt(unsafe { libc::listen(raw, 128) }).map_err(|e| ctx(e, format!("listen {addr}")))?;
    Ok(TcpListener::from(fd))
}

/// Accepts one connection and applies the per-connection options (`TCP_NODELAY`,
/// `TCP_CONGESTION`; buffer sizes are inherited from the listener).
pub fn accept(l: &TcpListener, so: &SockOpts) -> io::Result<TcpStream> {
    let (s, _) = loop {
        match l.accept() {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            r => break r.map_err(|e| ctx(e, "accept"))?,
        }
    };
    set_cc(s.as_raw_fd(), so.cc.as_deref())?;
    if so.nodelay {
        s.set_nodelay(true)
            .map_err(|e| ctx(e, "setsockopt TCP_NODELAY"))?;
    }
    Ok(s)
}

/// Opens the connection described by `opts.endpoint`; `on_listening` is told the
/// bound address (useful with port 0) before a listener waits for its peer.
pub fn establish(opts: &Opts, on_listening: impl FnOnce(SocketAddr)) -> io::Result<TcpStream> {
    let so = opts.sock_opts();
    if opts.itcp {
        return establish_itcp(opts, &so, on_listening);
    }
    match opts.endpoint {
        Endpoint::Connect(a) => connect(a, &so, secs(opts.connect_timeout)),
        Endpoint::Listen(a) => {
            let l = listen(a, &so)?;
            on_listening(l.local_addr()?);
            accept(&l, &so)
        }
    }
}

/// The I-TCP flavour of [`establish`]: through the MSR with mh-lib. Socket options
/// are applied once the wireless-side connection is up (mh-lib makes the socket).
fn establish_itcp(
    opts: &Opts,
    so: &SockOpts,
    on_listening: impl FnOnce(SocketAddr),
) -> io::Result<TcpStream> {
    let s = match opts.endpoint {
        Endpoint::Connect(a) => connect_itcp(a, secs(opts.connect_timeout))?,
        Endpoint::Listen(a) => {
            let mh = itcp_mh::MhOptions::from_env()?;
            let l = itcp_mh::ItcpListener::bind_with(&mh, a.port())
                .map_err(|e| ctx(e, format!("I-TCP listen on port {}", a.port())))?;
            on_listening(l.local_addr()?);
            l.accept()
                .map_err(|e| ctx(e, "I-TCP accept"))?
                .0
                .into_inner()
        }
    };
    apply_sock_opts(s.as_raw_fd(), so)?;
    if so.nodelay {
        s.set_nodelay(true)?;
    }
    Ok(s)
}

/// Connects to `a` through the MSR with mh-lib, retrying refusals for `timeout` (the
/// FH may not listen yet) as a plain connect does.
fn connect_itcp(a: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let mh = itcp_mh::MhOptions::from_env()?;
    let deadline = Instant::now() + timeout;
    loop {
        match itcp_mh::ItcpStream::connect_with(&mh, a) {
            Ok(s) => return Ok(s.into_inner()),
            Err(e)
                if e.kind() == ErrorKind::ConnectionRefused
                    && Instant::now() + CONNECT_RETRY < deadline =>
            {
                thread::sleep(CONNECT_RETRY)
            }
            Err(e) => return Err(ctx(e, format!("I-TCP connect to {a}"))),
        }
    }
}

fn secs(s: f64) -> Duration {
    if s.is_finite() && s > 0.0 {
        Duration::from_secs_f64(s.min(1e9))
    } else {
        Duration::ZERO
    }
}

/// Reads `TCP_INFO` from a connected socket.
pub fn tcp_info(s: &TcpStream) -> Option<TcpInfo> {
    // The kernel's struct is longer than libc's: room for the fields read by offset.
    #[repr(C)]
    struct Full {
        ti: libc::tcp_info,
        more: [u8; 256],
    }
    // SAFETY: all-zero is valid for both parts; fields the kernel does not fill stay 0.
    let mut full: Full = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<Full>() as libc::socklen_t;
    // SAFETY: valid out pointers of the given length.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut full as *mut Full as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: `Full` is plain data of exactly this size.
    let bytes: &[u8] = unsafe {
        std::slice::from_raw_parts(&full as *const Full as *const u8, mem::size_of::<Full>())
    };
    // include/uapi/linux/tcp.h (6.7+): __u16 tcpi_total_rto at 240, __u32
    // tcpi_total_rto_time (ms) at 244, after tcpi_rehash.
    let (total_rto, total_rto_time_ms) = if len >= 248 {
        (
            u16::from_ne_bytes([bytes[240], bytes[241]]) as u32,
            u32::from_ne_bytes(bytes[244..248].try_into().unwrap()),
        )
    } else {
        (0, 0)
    };
    let ti = full.ti;
    Some(TcpInfo {
        state: ti.tcpi_state,
        ca_state: ti.tcpi_ca_state,
        retransmits: ti.tcpi_retransmits,
        backoff: ti.tcpi_backoff,
        snd_wscale: ti.tcpi_snd_rcv_wscale & 0x0f,
        rcv_wscale: ti.tcpi_snd_rcv_wscale >> 4,
        rto_us: ti.tcpi_rto,
        ato_us: ti.tcpi_ato,
        snd_mss: ti.tcpi_snd_mss,
        rcv_mss: ti.tcpi_rcv_mss,
        unacked: ti.tcpi_unacked,
        lost: ti.tcpi_lost,
        retrans: ti.tcpi_retrans,
        pmtu: ti.tcpi_pmtu,
        rcv_ssthresh: ti.tcpi_rcv_ssthresh,
        rtt_us: ti.tcpi_rtt,
        rttvar_us: ti.tcpi_rttvar,
        min_rtt_us: ti.tcpi_min_rtt,
        snd_ssthresh: ti.tcpi_snd_ssthresh,
        snd_cwnd: ti.tcpi_snd_cwnd,
        advmss: ti.tcpi_advmss,
        reordering: ti.tcpi_reordering,
        rcv_rtt_us: ti.tcpi_rcv_rtt,
        rcv_space: ti.tcpi_rcv_space,
        total_retrans: ti.tcpi_total_retrans,
        pacing_rate: ti.tcpi_pacing_rate,
        delivery_rate: ti.tcpi_delivery_rate,
        bytes_acked: ti.tcpi_bytes_acked,
        bytes_received: ti.tcpi_bytes_received,
        bytes_sent: ti.tcpi_bytes_sent,
        bytes_retrans: ti.tcpi_bytes_retrans,
        segs_out: ti.tcpi_segs_out,
        segs_in: ti.tcpi_segs_in,
        data_segs_out: ti.tcpi_data_segs_out,
        data_segs_in: ti.tcpi_data_segs_in,
        notsent_bytes: ti.tcpi_notsent_bytes,
        busy_time_us: ti.tcpi_busy_time,
        rwnd_limited_us: ti.tcpi_rwnd_limited,
        sndbuf_limited_us: ti.tcpi_sndbuf_limited,
        snd_wnd: ti.tcpi_snd_wnd,
        rcv_wnd: ti.tcpi_rcv_wnd,
        total_rto,
        total_rto_time_ms,
    })
}

fn addr_string(a: io::Result<SocketAddr>) -> String {
    a.map(|a| a.to_string()).unwrap_or_default()
}

fn bps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

// ---------------------------------------------------------------------------------
// send

impl SendReport {
    fn empty(opts: &Opts) -> SendReport {
        SendReport {
            role: "send".into(),
            ok: false,
            error: None,
            bytes: 0,
            seed: opts.seed,
            t0_mono_ns: 0,
            duration_s: 0.0,
            goodput_bps: 0.0,
            peer: String::new(),
            local: String::new(),
            tcp_info: None,
        }
    }

    fn failed(opts: &Opts, msg: String) -> SendReport {
        let mut r = SendReport::empty(opts);
        r.error = Some(msg);
        r
    }
}

fn check_send_opts(opts: &Opts) -> Result<(), String> {
    if opts.bytes.is_none() && opts.duration.is_none() {
        return Err("send needs a byte count or a duration".into());
    }
    if let Some(d) = opts.duration {
        if !(d.is_finite() && d >= 0.0) {
            return Err(format!("invalid duration {d}"));
        }
    }
    if opts.chunk == 0 {
        return Err("chunk size must be positive".into());
    }
    Ok(())
}

/// Sender: connect (or listen and accept), send the stream, then wait for the peer to
/// close so that everything was delivered.
pub fn run_send(opts: &Opts) -> SendReport {
    run_send_with(opts, |_| {})
}

/// [`run_send`] with a callback told the listening address (listen endpoints only).
pub fn run_send_with(opts: &Opts, on_listening: impl FnOnce(SocketAddr)) -> SendReport {
    if let Err(e) = check_send_opts(opts) {
        return SendReport::failed(opts, e);
    }
    match establish(opts, on_listening) {
        Ok(s) => send_on(s, opts),
        Err(e) => SendReport::failed(opts, e.to_string()),
    }
}

/// Sender on an already established connection (t0 is now).
pub fn send_on(mut s: TcpStream, opts: &Opts) -> SendReport {
    let t0 = Instant::now();
    let mut rep = SendReport::empty(opts);
    rep.t0_mono_ns = mono_ns();
    rep.peer = addr_string(s.peer_addr());
    rep.local = addr_string(s.local_addr());
    if let Err(e) = check_send_opts(opts) {
        rep.error = Some(e);
        return rep;
    }
    let deadline = opts.duration.map(|d| t0 + secs(d));
    let result = send_stream(&mut s, opts, deadline, &mut rep.bytes);
    let result = result.and_then(|()| {
        let _ = s.set_write_timeout(None);
        s.shutdown(Shutdown::Write)
            .map_err(|e| format!("shutdown after {} bytes: {e}", rep.bytes))?;
        wait_eof(&mut s).map_err(|e| {
            format!(
                "waiting for the receiver to close after {} bytes: {e}",
                rep.bytes
            )
        })
    });
    rep.duration_s = t0.elapsed().as_secs_f64();
    rep.goodput_bps = bps(rep.bytes, rep.duration_s);
    rep.tcp_info = tcp_info(&s);
    match result {
        Ok(()) => rep.ok = true,
        Err(e) => rep.error = Some(e),
    }
    rep
}

fn send_stream(
    s: &mut TcpStream,
    opts: &Opts,
    deadline: Option<Instant>,
    sent: &mut u64,
) -> Result<(), String> {
    if deadline.is_some() {
        // Lets a blocked write return (partially) so the duration is kept closely.
        s.set_write_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| format!("setting the write timeout: {e}"))?;
    }
    let past = |dl: Option<Instant>| dl.is_some_and(|d| Instant::now() >= d);
    let mut gen = StreamGen::new(opts.seed);
    let mut buf = vec![0u8; opts.chunk];
    loop {
        let want = match opts.bytes {
            Some(n) => (n - *sent).min(opts.chunk as u64) as usize,
            None => opts.chunk,
        };
        if want == 0 || past(deadline) {
            return Ok(());
        }
        let start = gen.offset();
        let b = &mut buf[..want];
        gen.fill(b);
        if let Some(c) = opts.corrupt_at {
            if c >= start && c < start + want as u64 {
                b[(c - start) as usize] ^= 0xff;
            }
        }
        let mut pos = 0;
        while pos < want {
            match s.write(&b[pos..]) {
                Ok(0) => return Err(format!("write returned 0 at byte offset {sent}")),
                Ok(n) => {
                    pos += n;
                    *sent += n as u64;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(format!("write failed at byte offset {sent}: {e}")),
            }
            if past(deadline) {
                return Ok(());
            }
        }
    }
}

fn wait_eof(s: &mut TcpStream) -> io::Result<()> {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

// ---------------------------------------------------------------------------------
// recv

impl RecvReport {
    fn empty(opts: &Opts) -> RecvReport {
        RecvReport {
            role: "recv".into(),
            ok: false,
            error: None,
            bytes: 0,
            expected_bytes: opts.bytes,
            seed: opts.seed,
            verified: opts.verify,
            t0_mono_ns: 0,
            first_byte_s: 0.0,
            last_byte_s: 0.0,
            duration_s: 0.0,
            goodput_bps: 0.0,
            bin_s: BIN_S,
            timeline_bytes: Vec::new(),
            longest_stall_s: 0.0,
            longest_stall_at_s: 0.0,
            peer: String::new(),
            local: String::new(),
            tcp_info: None,
        }
    }
}

/// Receiver: connect (or listen and accept), read and verify until EOF.
pub fn run_recv(opts: &Opts) -> RecvReport {
    run_recv_with(opts, |_| {})
}

/// [`run_recv`] with a callback told the listening address (listen endpoints only).
pub fn run_recv_with(opts: &Opts, on_listening: impl FnOnce(SocketAddr)) -> RecvReport {
    match establish(opts, on_listening) {
        Ok(s) => recv_on(s, opts),
        Err(e) => {
            let mut r = RecvReport::empty(opts);
            r.error = Some(e.to_string());
            r
        }
    }
}

/// Receiver on an already established connection (t0 is now).
pub fn recv_on(mut s: TcpStream, opts: &Opts) -> RecvReport {
    let mut rep = RecvReport::empty(opts);
    rep.peer = addr_string(s.peer_addr());
    rep.local = addr_string(s.local_addr());
    read_verified(&mut s, opts, &mut rep);
    rep.tcp_info = tcp_info(&s);
    rep
}

/// Reads `r` to its end into `rep` (t0 is now), verifying the stream.
fn read_verified(r: &mut impl Read, opts: &Opts, rep: &mut RecvReport) {
    let t0 = Instant::now();
    rep.t0_mono_ns = mono_ns();
    let mut check = StreamCheck::new(opts.seed);
    let mut buf = vec![0u8; opts.chunk.max(1)];
    let mut total: u64 = 0;
    let mut first: Option<f64> = None;
    let mut prev = 0.0f64;
    let mut error: Option<String> = None;
    loop {
        let n = match r.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                error = Some(format!("read failed at byte offset {total}: {e}"));
                break;
            }
        };
        if n == 0 {
            if let Some(exp) = opts.bytes {
                if total < exp {
                    error = Some(format!(
                        "stream ended at byte offset {total}, expected {exp} bytes"
                    ));
                }
            }
            break;
        }
        let el = t0.elapsed();
        let t = el.as_secs_f64();
        let bin = (el.as_nanos() / BIN_NS) as usize;
        if rep.timeline_bytes.len() <= bin {
            rep.timeline_bytes.resize(bin + 1, 0);
        }
        rep.timeline_bytes[bin] += n as u64;
        first.get_or_insert(t);
        if t - prev > rep.longest_stall_s {
            rep.longest_stall_s = t - prev;
            rep.longest_stall_at_s = prev;
        }
        prev = t;

        let valid = match opts.bytes {
            Some(exp) => (exp.saturating_sub(total)).min(n as u64) as usize,
            None => n,
        };
        let checked = if opts.verify {
            check.check(&buf[..valid])
        } else {
            Ok(())
        };
        total += n as u64;
        if let Err(m) = checked {
            error = Some(m.to_string());
            break;
        }
        if valid < n {
            error = Some(format!(
                "excess data at byte offset {}",
                opts.bytes.unwrap_or(0)
            ));
            break;
        }
    }
    rep.bytes = total;
    rep.first_byte_s = first.unwrap_or(0.0);
    rep.last_byte_s = prev;
    rep.duration_s = prev;
    rep.goodput_bps = bps(total, prev);
    rep.ok = error.is_none();
    rep.error = error;
}

// ---------------------------------------------------------------------------------
// http

/// What `ttcp http` did with its one request: a GET's body sent, or a PUT's body
/// received and verified.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum HttpReport {
    Get(SendReport),
    Put(RecvReport),
}

impl HttpReport {
    pub fn error(&self) -> Option<String> {
        match self {
            HttpReport::Get(r) => r.error.clone(),
            HttpReport::Put(r) => r.error.clone(),
        }
    }
}

/// The largest request head `ttcp http` reads.
const HTTP_HEAD_MAX: usize = 16 << 10;

/// A tiny HTTP/1.1 server for unmodified clients (curl): accepts one connection and
/// serves its one request. `GET /N` answers with N bytes of the seeded stream; `PUT`
/// (as `curl -T FILE` sends) must carry the stream as its body, which is verified
/// like `recv` does. Anything else is answered with 400 and reported as an error.
pub fn run_http_with(opts: &Opts, on_listening: impl FnOnce(SocketAddr)) -> HttpReport {
    match establish(opts, on_listening) {
        Ok(s) => http_on(s, opts),
        Err(e) => HttpReport::Get(SendReport::failed(opts, e.to_string())),
    }
}

fn http_on(mut s: TcpStream, opts: &Opts) -> HttpReport {
    let (head, rest) = match read_head(&mut s) {
        Ok(h) => h,
        Err(e) => return http_refused(&mut s, opts, format!("request: {e}")),
    };
    let mut request = head.lines().next().unwrap_or_default().split(' ');
    let (method, path) = (request.next().unwrap_or(""), request.next().unwrap_or(""));
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    match method {
        "GET" => {
            let Ok(n) = path.trim_start_matches('/').parse::<u64>() else {
                return http_refused(&mut s, opts, format!("GET {path}: not /BYTES"));
            };
            let o = Opts {
                bytes: Some(n),
                ..opts.clone()
            };
            let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n");
            if let Err(e) = s.write_all(reply.as_bytes()) {
                return HttpReport::Get(SendReport::failed(opts, format!("reply: {e}")));
            }
            HttpReport::Get(send_on(s, &o))
        }
        "PUT" => {
            let Some(n) = header("content-length").and_then(|v| v.parse::<u64>().ok()) else {
                return http_refused(&mut s, opts, "PUT without a Content-Length".into());
            };
            // curl waits up to a second for this before it sends a large body.
            if header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
                if let Err(e) = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n") {
                    return http_refused(&mut s, opts, format!("100 Continue: {e}"));
                }
            }
            let o = Opts {
                bytes: Some(n),
                ..opts.clone()
            };
            let mut rep = RecvReport::empty(&o);
            rep.peer = addr_string(s.peer_addr());
            rep.local = addr_string(s.local_addr());
            let mut body = io::Cursor::new(rest).chain(&s).take(n);
            read_verified(&mut body, &o, &mut rep);
            rep.tcp_info = tcp_info(&s);
            let status = if rep.ok { "200 OK" } else { "400 Bad Request" };
            let reply =
                format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            if let Err(e) = s.write_all(reply.as_bytes()) {
                rep.ok = false;
                rep.error.get_or_insert(format!("reply: {e}"));
            }
            let _ = s.shutdown(Shutdown::Write);
            let _ = wait_eof(&mut s);
            HttpReport::Put(rep)
        }
        _ => http_refused(&mut s, opts, format!("method {method:?} not served")),
    }
}

/// Reads up to the blank line that ends an HTTP request head: the head, and what
/// was read past it.
fn read_head(s: &mut TcpStream) -> io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > HTTP_HEAD_MAX {
            return Err(io::Error::new(ErrorKind::InvalidData, "head too long"));
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn http_refused(s: &mut TcpStream, opts: &Opts, why: String) -> HttpReport {
    let _ =
        s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    HttpReport::Get(SendReport::failed(opts, why))
}

// ---------------------------------------------------------------------------------
// echo

/// Echo server: listens and echoes every connection (a thread each) until EOF.
/// Returns only on a listen error, or after one connection with `once`.
pub fn run_echo(opts: &EchoOpts) -> io::Result<()> {
    run_echo_with(opts, |_| {})
}

/// [`run_echo`] with a callback told the listening address.
pub fn run_echo_with(opts: &EchoOpts, on_listening: impl FnOnce(SocketAddr)) -> io::Result<()> {
    let so = SockOpts {
        buf: opts.buf,
        cc: opts.cc.clone(),
        nodelay: true,
    };
    let l = listen(opts.listen, &so)?;
    on_listening(l.local_addr()?);
    serve_echo(&l, &so, opts.once)
}

/// Serves echo connections on `l` (see [`run_echo`]).
pub fn serve_echo(l: &TcpListener, so: &SockOpts, once: bool) -> io::Result<()> {
    loop {
        let s = match accept(l, so) {
            Ok(s) => s,
            Err(e) if once => return Err(e),
            Err(e) => {
                eprintln!("ttcp echo: {e}");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if once {
            return echo_conn(s).map(|_| ());
        }
        thread::spawn(move || {
            let peer = addr_string(s.peer_addr());
            if let Err(e) = echo_conn(s) {
                eprintln!("ttcp echo: {peer}: {e}");
            }
        });
    }
}

/// Echoes one connection until EOF; returns the byte count.
fn echo_conn(mut s: TcpStream) -> io::Result<u64> {
    let mut buf = vec![0u8; DEFAULT_CHUNK];
    let mut total = 0u64;
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        s.write_all(&buf[..n])?;
        total += n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    Ok(total)
}

// ---------------------------------------------------------------------------------
// rr

/// Request/response latency client against an echo server.
pub fn run_rr(opts: &RrOpts) -> RrReport {
    let mut rep = RrReport {
        role: "rr".into(),
        ok: false,
        error: None,
        count: 0,
        size: opts.size,
        min_us: 0.0,
        p50_us: 0.0,
        p90_us: 0.0,
        p99_us: 0.0,
        max_us: 0.0,
        mean_us: 0.0,
        peer: String::new(),
        local: String::new(),
    };
    let so = SockOpts {
        buf: None,
        cc: None,
        nodelay: true,
    };
    let opened = if opts.itcp {
        connect_itcp(opts.addr, secs(opts.connect_timeout)).and_then(|s| {
            s.set_nodelay(true)?;
            Ok(s)
        })
    } else {
        connect(opts.addr, &so, secs(opts.connect_timeout))
    };
    let mut s = match opened {
        Ok(s) => s,
        Err(e) => {
            rep.error = Some(e.to_string());
            return rep;
        }
    };
    rep.peer = addr_string(s.peer_addr());
    rep.local = addr_string(s.local_addr());
    let mut gen = StreamGen::new(opts.seed);
    let mut req = vec![0u8; opts.size];
    let mut resp = vec![0u8; opts.size];
    let mut rtts: Vec<f64> = Vec::with_capacity(opts.count.min(1 << 20) as usize);
    let mut error = None;
    if opts.pipeline {
        match rr_pipelined(&s, opts) {
            Ok(v) => rtts = v,
            Err(e) => error = Some(e),
        }
    }
    for i in 0..opts.count {
        if opts.pipeline {
            break;
        }
        if i > 0 && opts.interval_ms > 0.0 {
            thread::sleep(secs(opts.interval_ms / 1000.0));
        }
        gen.fill(&mut req);
        let t = Instant::now();
        if let Err(e) = s.write_all(&req) {
            error = Some(format!("exchange {i}: write failed: {e}"));
            break;
        }
        if let Err(e) = s.read_exact(&mut resp) {
            error = Some(format!("exchange {i}: read failed: {e}"));
            break;
        }
        let us = t.elapsed().as_nanos() as f64 / 1000.0;
        if req != resp {
            error = Some(format!("exchange {i}: response differs from request"));
            break;
        }
        rtts.push(us);
    }
    let _ = s.shutdown(Shutdown::Write);
    if error.is_none() {
        if let Err(e) = wait_eof(&mut s) {
            error = Some(format!("waiting for the server to close: {e}"));
        }
    }
    let skip = (opts.warmup as usize).min(rtts.len());
    rtts.drain(..skip);
    rep.count = rtts.len() as u64;
    if !rtts.is_empty() {
        rep.mean_us = rtts.iter().sum::<f64>() / rtts.len() as f64;
        rtts.sort_by(|a, b| a.total_cmp(b));
        rep.min_us = rtts[0];
        rep.max_us = rtts[rtts.len() - 1];
        rep.p50_us = percentile(&rtts, 0.50);
        rep.p90_us = percentile(&rtts, 0.90);
        rep.p99_us = percentile(&rtts, 0.99);
    }
    rep.ok = error.is_none();
    rep.error = error;
    rep
}

// ---------------------------------------------------------------------------------
// churn

/// Options of the `churn` client: short connections opened and closed continuously.
#[derive(Debug, Clone, PartialEq)]
pub struct ChurnOpts {
    pub addr: SocketAddr,
    /// New connections per second (default 20).
    pub rate: f64,
    /// Seconds to keep opening connections (default 10).
    pub duration: f64,
    /// Bytes each connection sends and expects echoed (default 1000).
    pub size: usize,
    pub seed: u64,
    /// Through the MH's I-TCP gateway (mh-lib) instead of a plain connect.
    pub itcp: bool,
    /// Seconds one connection may take from connect to the echo server's FIN (30).
    pub timeout: f64,
}

impl ChurnOpts {
    pub fn new(addr: SocketAddr) -> Self {
        ChurnOpts {
            addr,
            rate: 20.0,
            duration: 10.0,
            size: 1000,
            seed: 1,
            itcp: false,
            timeout: 30.0,
        }
    }
}

/// What `churn` saw. A connection fails on a reset (ECONNRESET, ECONNREFUSED, EPIPE),
/// a timeout, an echo that differs from what was sent, or any other error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChurnReport {
    pub role: String,
    /// Every connection completed, byte-exact.
    pub ok: bool,
    pub attempted: u64,
    pub completed: u64,
    pub resets: u64,
    pub timeouts: u64,
    pub corrupt: u64,
    pub other_errors: u64,
    /// Echoed bytes that were compared with what was sent.
    pub bytes_verified: u64,
    /// Connect to the echo server's FIN, milliseconds.
    pub p50_ms: f64,
    pub max_ms: f64,
    /// The first errors, each with its connection number and time since start.
    pub errors: Vec<String>,
}

enum ChurnFail {
    Reset(String),
    Timeout(String),
    Corrupt(String),
    Other(String),
}

fn churn_fail(what: &str, e: io::Error) -> ChurnFail {
    let m = format!("{what}: {e}");
    match e.raw_os_error() {
        Some(libc::ECONNRESET) | Some(libc::ECONNREFUSED) | Some(libc::EPIPE) => {
            ChurnFail::Reset(m)
        }
        _ if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            ChurnFail::Timeout(m)
        }
        _ => ChurnFail::Other(m),
    }
}

/// One short connection: connect (never retried: a refusal is a reset), send `size`
/// bytes, close the sending half, read the echo to EOF and compare.
fn churn_one(
    opts: &ChurnOpts,
    mh: Option<&itcp_mh::MhOptions>,
    i: u64,
) -> Result<(u64, Duration), ChurnFail> {
    let t0 = Instant::now();
    let timeout = secs(opts.timeout);
    let mut s = match mh {
        Some(mh) => itcp_mh::ItcpStream::connect_with(mh, opts.addr)
            .map_err(|e| churn_fail("I-TCP connect", e))?
            .into_inner(),
        None => connect_once(&opts.addr, &SockOpts::default(), t0 + timeout)
            .map_err(|e| churn_fail("connect", e))?,
    };
    let left = timeout
        .saturating_sub(t0.elapsed())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))
        .and_then(|_| s.set_write_timeout(Some(left)))
        .map_err(|e| churn_fail("setsockopt", e))?;
    let seed = opts.seed.wrapping_mul(1_000_003).wrapping_add(i);
    let mut data = vec![0u8; opts.size];
    StreamGen::new(seed).fill(&mut data);
    s.write_all(&data).map_err(|e| churn_fail("write", e))?;
    s.shutdown(Shutdown::Write)
        .map_err(|e| churn_fail("shutdown", e))?;
    let mut got = Vec::with_capacity(opts.size);
    s.read_to_end(&mut got).map_err(|e| churn_fail("read", e))?;
    if got != data {
        let at = got.iter().zip(&data).position(|(a, b)| a != b);
        return Err(ChurnFail::Corrupt(format!(
            "echo of {} bytes differs from the {} sent (first difference at {:?})",
            got.len(),
            data.len(),
            at
        )));
    }
    Ok((got.len() as u64, t0.elapsed()))
}

/// Opens `rate` connections per second for `duration` seconds, each in its own
/// thread, against an echo server.
pub fn run_churn(opts: &ChurnOpts) -> ChurnReport {
    let mut rep = ChurnReport {
        role: "churn".into(),
        ..Default::default()
    };
    let mh = if opts.itcp {
        match itcp_mh::MhOptions::from_env() {
            Ok(m) => Some(std::sync::Arc::new(m)),
            Err(e) => {
                rep.errors.push(format!("I-TCP options: {e}"));
                rep.other_errors = 1;
                return rep;
            }
        }
    } else {
        None
    };
    let start = Instant::now();
    let n = (opts.rate * opts.duration).ceil().max(1.0) as u64;
    let mut threads = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = start + secs(i as f64 / opts.rate);
        if let Some(d) = at.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        }
        let (o, mh) = (opts.clone(), mh.clone());
        let t = start.elapsed();
        threads.push((i, t, thread::spawn(move || churn_one(&o, mh.as_deref(), i))));
    }
    let mut times = Vec::new();
    for (i, t, h) in threads {
        rep.attempted += 1;
        let r = h
            .join()
            .unwrap_or_else(|_| Err(ChurnFail::Other("thread panicked".into())));
        let msg = match r {
            Ok((bytes, d)) => {
                rep.completed += 1;
                rep.bytes_verified += bytes;
                times.push(d.as_secs_f64() * 1000.0);
                continue;
            }
            Err(ChurnFail::Reset(m)) => {
                rep.resets += 1;
                m
            }
            Err(ChurnFail::Timeout(m)) => {
                rep.timeouts += 1;
                m
            }
            Err(ChurnFail::Corrupt(m)) => {
                rep.corrupt += 1;
                m
            }
            Err(ChurnFail::Other(m)) => {
                rep.other_errors += 1;
                m
            }
        };
        if rep.errors.len() < 20 {
            rep.errors.push(format!(
                "connection {i} (opened at {:.3} s): {msg}",
                t.as_secs_f64()
            ));
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    rep.p50_ms = percentile(&times, 0.5);
    rep.max_ms = times.last().copied().unwrap_or(0.0);
    rep.ok = rep.completed == rep.attempted;
    rep
}

/// Pipelined exchanges: a writer sends a request every `interval_ms`; responses are
/// matched to requests in order (TCP keeps it) and checked. Returns the round trips.
fn rr_pipelined(s: &TcpStream, opts: &RrOpts) -> Result<Vec<f64>, String> {
    let mut w = s.try_clone().map_err(|e| format!("dup socket: {e}"))?;
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let o = opts.clone();
    let writer = thread::spawn(move || -> Result<(), String> {
        let mut gen = StreamGen::new(o.seed);
        let start = Instant::now();
        for i in 0..o.count {
            let at = start + secs(i as f64 * o.interval_ms / 1000.0);
            if let Some(d) = at.checked_duration_since(Instant::now()) {
                thread::sleep(d);
            }
            let mut req = vec![0u8; o.size];
            gen.fill(&mut req);
            let t = Instant::now();
            w.write_all(&req)
                .map_err(|e| format!("request {i}: write failed: {e}"))?;
            if tx.send((t, req)).is_err() {
                break;
            }
        }
        Ok(())
    });
    let mut r = s.try_clone().map_err(|e| format!("dup socket: {e}"))?;
    let mut resp = vec![0u8; opts.size];
    let mut rtts = Vec::with_capacity(opts.count as usize);
    for i in 0..opts.count {
        r.read_exact(&mut resp)
            .map_err(|e| format!("response {i}: read failed: {e}"))?;
        let now = Instant::now();
        let (t, req) = rx
            .recv()
            .map_err(|_| format!("response {i} without a request"))?;
        if req != resp {
            return Err(format!("response {i} differs from its request"));
        }
        rtts.push(now.duration_since(t).as_nanos() as f64 / 1000.0);
    }
    writer.join().map_err(|_| "writer panicked".to_string())??;
    Ok(rtts)
}

/// Nearest-rank percentile of sorted data.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn lo() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[7.0], 0.9), 7.0);
    }

    #[test]
    fn in_process_send_recv_v4_and_v6() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let l = match listen(addr, &SockOpts::default()) {
                Ok(l) => l,
                Err(_) if addr.is_ipv6() => continue, // no IPv6 loopback here
                Err(e) => panic!("{e}"),
            };
            let port = l.local_addr().unwrap();
            let mut o = Opts::listen(addr);
            o.bytes = Some(1_000_001);
            let o2 = o.clone();
            let h = thread::spawn(move || recv_on(accept(&l, &SockOpts::default()).unwrap(), &o2));
            let mut so = Opts::connect(port);
            so.bytes = Some(1_000_001);
            let sr = run_send(&so);
            let rr = h.join().unwrap();
            assert!(sr.ok, "{sr:?}");
            assert!(rr.ok, "{rr:?}");
            assert_eq!(rr.bytes, 1_000_001);
            assert_eq!(rr.timeline_bytes.iter().sum::<u64>(), 1_000_001);
            let j = serde_json::to_string(&rr).unwrap();
            let back: RecvReport = serde_json::from_str(&j).unwrap();
            assert_eq!(back, rr);
        }
    }

    #[test]
    fn duration_send_and_listen_callback() {
        let (tx, rx) = mpsc::channel();
        let h = thread::spawn(move || {
            let mut o = Opts::listen(lo());
            o.duration = Some(0.3);
            run_send_with(&o, |a| tx.send(a).unwrap())
        });
        let a = rx.recv().unwrap();
        let r = run_recv(&Opts::connect(a));
        let s = h.join().unwrap();
        assert!(r.ok && s.ok, "{r:?} {s:?}");
        assert_eq!(r.bytes, s.bytes);
        assert!(
            s.duration_s >= 0.3 && s.duration_s < 2.0,
            "{}",
            s.duration_s
        );
    }

    #[test]
    fn no_verify_and_excess() {
        let (tx, rx) = mpsc::channel();
        let h = thread::spawn(move || {
            let mut o = Opts::listen(lo());
            o.bytes = Some(100_000);
            o.verify = false;
            run_recv_with(&o, |a| tx.send(a).unwrap())
        });
        let mut o = Opts::connect(rx.recv().unwrap());
        o.bytes = Some(300_000);
        o.seed = 99; // wrong seed: not noticed without verification
        let _ = run_send(&o);
        let r = h.join().unwrap();
        assert!(!r.ok);
        assert_eq!(
            r.error.as_deref(),
            Some("excess data at byte offset 100000")
        );
    }

    #[test]
    fn send_without_amount_fails() {
        let r = run_send(&Opts::connect("127.0.0.1:9".parse().unwrap()));
        assert!(!r.ok);
        assert!(r.error.unwrap().contains("byte count or a duration"));
    }

    #[test]
    fn echo_rr_in_process() {
        let (tx, rx) = mpsc::channel();
        let h = thread::spawn(move || {
            let mut o = EchoOpts::new(lo());
            o.once = true;
            run_echo_with(&o, |a| tx.send(a).unwrap())
        });
        let mut o = RrOpts::new(rx.recv().unwrap());
        o.count = 50;
        o.size = 1000;
        let r = run_rr(&o);
        assert!(r.ok, "{r:?}");
        assert_eq!(r.count, 50);
        assert!(r.min_us > 0.0 && r.min_us <= r.p50_us && r.p99_us <= r.max_us);
        h.join().unwrap().unwrap();
    }
}
