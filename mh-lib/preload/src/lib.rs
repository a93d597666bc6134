//! `libitcp_preload.so`: explicit I-TCP for unmodified, dynamically linked programs.
//!
//! ```text
//! LD_PRELOAD=libitcp_preload.so ITCP_GATEWAY=10.2.0.1 ITCP_PRELOAD_PORTS=80 curl http://10.0.0.1/
//! ```
//!
//! * `connect(2)` of a TCP socket to a configured destination (see [`config`]) connects
//!   the program's own fd to the I-TCP gateway instead and runs the request (SOCKS5 with
//!   the I-TCP session method) for the original destination on it, so the program keeps
//!   its fd and reads and writes the peer through the MSR. The handshake is blocking
//!   with the gateway connect timeout even on a non-blocking socket (whose flags are
//!   restored): connect then returns 0 at once rather than `EINPROGRESS`. Failures
//!   return -1 with errno as a plain connect would report them (`ECONNREFUSED`,
//!   `ENETUNREACH`, `EHOSTUNREACH`, `ETIMEDOUT`, `EACCES`, …).
//! * `getpeername(2)` on such a socket reports the original destination.
//! * `listen(2)` on a TCP socket bound to a port of `ITCP_PRELOAD_LISTEN_PORTS` also
//!   asks the MSR to listen on the MH's address at that port (I-TCP LISTEN). A thread
//!   keeps one ACCEPT outstanding; when a peer arrives it queues the connection and
//!   makes the program's listening socket readable by connecting to it over loopback,
//!   so `poll`/`select`/`epoll` work. `accept`/`accept4` recognise that wake-up
//!   connection and hand out the queued I-TCP connection in its place (same fd number,
//!   the requested `SOCK_NONBLOCK`/`SOCK_CLOEXEC`), with the peer's address. Genuine
//!   local connections to the socket are accepted as usual. `close(2)` of the listening
//!   socket closes the listener at the MSR. If the MSR drops the listener (msrd
//!   restarts), the shim does not listen again: later peers reach the program's socket
//!   by plain routing, if at all (`ITCP_PRELOAD_DEBUG=1` says so).
//!
//! Calls the shim itself makes never come back into it: a thread-local flag sends every
//! interposed call made from inside the shim straight to the C library.
//!
//! Not covered: `connect` on sockets that are not `SOCK_STREAM` `AF_INET`/`AF_INET6`,
//! `sendto(MSG_FASTOPEN)`, `getsockname` of an accepted I-TCP connection (it names the
//! MH's end of the request connection, not the listening port), children after
//! `fork` without `exec` (the listener thread does not survive the fork), statically
//! linked programs.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::mem::ManuallyDrop;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use itcp_mh::socks::Command;
use itcp_mh::{request_on, Addr, ItcpListener, MhOptions};
use libc::{c_int, sockaddr, socklen_t};

pub mod config;
mod sys;

use config::Config;

// ---------------------------------------------------------------------------------
// Re-entry guard and the real functions

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside the shim until dropped.
struct Inside {
    was: bool,
}

impl Drop for Inside {
    fn drop(&mut self) {
        let was = self.was;
        let _ = INSIDE.try_with(|c| c.set(was));
    }
}

/// Enters the shim: `None` if this thread already is inside (the call comes from the
/// shim's own code and must go to the C library).
fn enter() -> Option<Inside> {
    let was = INSIDE.try_with(|c| c.replace(true)).unwrap_or(true);
    if was {
        return None;
    }
    Some(Inside { was })
}

/// Looks up the next definition of a symbol (the C library's) once.
macro_rules! real {
    ($name:literal: $ty:ty) => {{
        static P: AtomicUsize = AtomicUsize::new(0);
        let mut p = P.load(Ordering::Relaxed);
        if p == 0 {
            // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
            p = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) }
                as usize;
            P.store(p, Ordering::Relaxed);
        }
        if p == 0 {
            None
        } else {
            // SAFETY: the symbol is the C library's function of this signature.
            Some(unsafe { std::mem::transmute::<usize, $ty>(p) })
        }
    }};
}

type ConnectFn = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
type PeerFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type ListenFn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type AcceptFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type Accept4Fn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
type CloseFn = unsafe extern "C" fn(c_int) -> c_int;

fn enosys() -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

fn set_errno(n: c_int) {
    // SAFETY: this thread's errno slot is always valid.
    unsafe { *libc::__errno_location() = n };
}

/// The C library's connect.
///
/// # Safety
/// As connect(2).
unsafe fn real_connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    match real!("connect": ConnectFn) {
        // SAFETY: forwarding the caller's arguments.
        Some(f) => unsafe { f(fd, addr, len) },
        None => enosys(),
    }
}

/// The C library's accept4.
///
/// # Safety
/// As accept4(2).
unsafe fn real_accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    match real!("accept4": Accept4Fn) {
        // SAFETY: forwarding the caller's arguments.
        Some(f) => unsafe { f(fd, addr, len, flags) },
        None => enosys(),
    }
}

/// The C library's close.
fn real_close(fd: c_int) -> c_int {
    match real!("close": CloseFn) {
        // SAFETY: close takes any int; the caller decided to close it.
        Some(f) => unsafe { f(fd) },
        None => enosys(),
    }
}

// ---------------------------------------------------------------------------------
// Settings

struct Shim {
    cfg: Config,
    /// `None` if the configuration is unusable (reported once).
    opts: Option<MhOptions>,
}

fn shim() -> &'static Shim {
    static S: OnceLock<Shim> = OnceLock::new();
    S.get_or_init(|| {
        let cfg = Config::from_env().unwrap_or_else(|e| {
            eprintln!("itcp-preload: {e}: nothing is intercepted");
            Config::default()
        });
        let opts = match MhOptions::from_env() {
            Ok(o) => Some(o),
            Err(e) => {
                eprintln!("itcp-preload: {e}: nothing is intercepted");
                None
            }
        };
        Shim { cfg, opts }
    })
}

macro_rules! debug {
    ($($t:tt)*) => {
        if shim().cfg.debug {
            eprintln!("itcp-preload[{}]: {}", std::process::id(), format_args!($($t)*));
        }
    };
}

/// errno for an `itcp-mh` error (the table of `docs/protocol.md`).
fn errno_of(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::NetworkUnreachable => libc::ENETUNREACH,
        K::HostUnreachable => libc::EHOSTUNREACH,
        K::TimedOut | K::WouldBlock => libc::ETIMEDOUT,
        K::PermissionDenied => libc::EACCES,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::InvalidInput => libc::EINVAL,
        // "no gateway configured" / "no such listener".
        K::NotFound => libc::ENETUNREACH,
        K::Unsupported => libc::EOPNOTSUPP,
        K::InvalidData => libc::EPROTO,
        K::UnexpectedEof | K::ConnectionAborted => libc::ECONNABORTED,
        K::ConnectionReset => libc::ECONNRESET,
        K::Interrupted => libc::EINTR,
        _ => libc::EIO,
    }
}

/// Runs `f`, turning a panic into `EIO` (unwinding into C is not an option).
fn no_panic(f: impl FnOnce() -> c_int) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            -1
        }
    }
}

// ---------------------------------------------------------------------------------
// Intercepted connections: original destinations for getpeername

/// A socket's (device, inode).
type Identity = (u64, u64);

/// fd → (socket identity, original destination).
static PEERS: Mutex<BTreeMap<RawFd, (Identity, SocketAddr)>> = Mutex::new(BTreeMap::new());

fn remember_peer(fd: RawFd, dest: SocketAddr) {
    if let Ok(id) = sys::identity(fd) {
        PEERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fd, (id, dest));
    }
}

fn peer_of(fd: RawFd) -> Option<SocketAddr> {
    let id = sys::identity(fd).ok()?;
    let mut m = PEERS.lock().unwrap_or_else(|e| e.into_inner());
    match m.get(&fd) {
        Some((i, d)) if *i == id => Some(*d),
        Some(_) => {
            m.remove(&fd);
            None
        }
        None => None,
    }
}

fn unmap(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        a => a,
    }
}

/// The intercepting connect: `None` if this connect is not ours (go to the C library),
/// else its return value (errno set).
fn itcp_connect(fd: RawFd, dest: SocketAddr) -> Option<c_int> {
    let s = shim();
    let dest = unmap(dest);
    if !s.cfg.intercepts(dest) || sys::sock_type(fd).ok()? != libc::SOCK_STREAM {
        return None;
    }
    let opts = s.opts.as_ref()?;
    let gateway = match opts.resolve_gateway() {
        Ok(g) => g,
        Err(e) => {
            debug!("connect {dest}: {e}");
            set_errno(errno_of(&e));
            return Some(-1);
        }
    };
    if unmap(gateway) == dest {
        return None;
    }
    match connect_through(fd, gateway, dest, opts) {
        Ok(()) => {
            debug!("connect fd {fd} to {dest}: through I-TCP gateway {gateway}");
            remember_peer(fd, dest);
            Some(0)
        }
        Err(e) => {
            debug!("connect fd {fd} to {dest}: {e}");
            // The fd may be connected to the gateway: make it useless rather than
            // let the program talk SOCKS by mistake.
            sys::shutdown_both(fd);
            set_errno(errno_of(&e));
            Some(-1)
        }
    }
}

/// Connects `fd` to the gateway and asks for `dest`, restoring the fd's flags and
/// timeouts.
fn connect_through(
    fd: RawFd,
    gateway: SocketAddr,
    dest: SocketAddr,
    opts: &MhOptions,
) -> io::Result<()> {
    let family = sys::sock_family(fd)?;
    let (gw, gw_len) = sys::to_sockaddr(gateway, family).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!("I-TCP gateway {gateway} is IPv6 but the socket is IPv4"),
        )
    })?;
    let flags = sys::get_fl(fd)?;
    let timeouts = sys::get_timeouts(fd)?;
    let r = (|| {
        sys::set_fl(fd, flags | libc::O_NONBLOCK)?;
        // SAFETY: gw holds a sockaddr of gw_len bytes.
        let rc = unsafe { real_connect(fd, (&gw as *const libc::sockaddr_storage).cast(), gw_len) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINPROGRESS) | Some(libc::EINTR) => {
                    let t = opts.get_connect_timeout();
                    if !sys::wait_writable(fd, t)? {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("cannot reach I-TCP gateway {gateway}: no answer within {t:?}"),
                        ));
                    }
                    match sys::so_error(fd)? {
                        0 => {}
                        n => return Err(io::Error::from_raw_os_error(n)),
                    }
                }
                _ => return Err(e),
            }
        }
        sys::set_fl(fd, flags & !libc::O_NONBLOCK)?;
        // SAFETY: the fd stays the program's: ManuallyDrop never closes it.
        let mut stream = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
        request_on(&mut stream, opts, Command::Connect, Addr::Ip(dest)).map(|_| ())
    })();
    let restored = sys::set_timeouts(fd, &timeouts).and_then(|()| sys::set_fl(fd, flags));
    r.and(restored)
}

// ---------------------------------------------------------------------------------
// Listening sockets

/// A program's listening socket that also listens at the MSR.
struct Listening {
    id: Identity,
    itcp: ItcpListener,
    /// Connections accepted at the MSR, waiting for the program's accept.
    queue: Mutex<VecDeque<(OwnedFd, SocketAddr)>>,
    /// Our wake-up connections to the program's socket, by their local address
    /// (registered before they connect; `None` until connected).
    wakers: Mutex<HashMap<SocketAddr, Option<OwnedFd>>>,
    /// The ACCEPT request connection in progress (-1: none), to cut it on close.
    pending: AtomicI32,
    stop: AtomicBool,
}

static LISTENING: Mutex<BTreeMap<RawFd, Arc<Listening>>> = Mutex::new(BTreeMap::new());
/// How many entries LISTENING has: `close` and `accept` skip the lock while it is 0.
static LISTENING_N: AtomicUsize = AtomicUsize::new(0);

fn listening_of(fd: RawFd) -> Option<Arc<Listening>> {
    if LISTENING_N.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let id = sys::identity(fd).ok()?;
    let m = LISTENING.lock().unwrap_or_else(|e| e.into_inner());
    m.get(&fd).filter(|l| l.id == id).cloned()
}

fn unregister(fd: RawFd) -> Option<Arc<Listening>> {
    if LISTENING_N.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let l = LISTENING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&fd)?;
    LISTENING_N.fetch_sub(1, Ordering::Relaxed);
    shut(&l);
    Some(l)
}

/// Stops a listener's accept thread: it ends its outstanding ACCEPT and drops its
/// reference, which closes the control connection (and the MSR's listener).
fn shut(l: &Listening) {
    l.stop.store(true, Ordering::SeqCst);
    let p = l.pending.load(Ordering::SeqCst);
    if p >= 0 {
        sys::shutdown_both(p);
    }
}

/// Before the program's listen(2) on `fd`: if its port is configured, the MSR's
/// listener (first, so no peer reaches the MH's own socket by plain routing meanwhile).
/// `None`: not ours.
fn itcp_listen_prepare(fd: RawFd) -> io::Result<Option<(ItcpListener, SocketAddr)>> {
    let s = shim();
    if s.cfg.listen_ports.is_empty() || sys::sock_type(fd)? != libc::SOCK_STREAM {
        return Ok(None);
    }
    let local = match sys::local_addr(fd) {
        Ok(a) => a,
        Err(_) => return Ok(None), // not an IP socket
    };
    // An unbound socket (port 0) gets its port from listen(2) itself: not ours.
    if local.port() == 0 || !s.cfg.listen_ports.contains(local.port()) || local.ip().is_loopback() {
        return Ok(None);
    }
    let Some(opts) = s.opts.as_ref() else {
        return Ok(None);
    };
    let itcp = ItcpListener::bind_with(opts, local.port())?;
    debug!(
        "listen fd {fd} on {local}: the I-TCP gateway {} listens on {}",
        itcp.gateway(),
        itcp.local_addr()?
    );
    Ok(Some((itcp, local)))
}

/// After the program's listen(2) succeeded: registers the socket and starts the thread
/// that accepts at the MSR.
fn itcp_listen_start(fd: RawFd, itcp: ItcpListener, local: SocketAddr) -> io::Result<()> {
    let id = sys::identity(fd)?;
    let l = Arc::new(Listening {
        id,
        itcp,
        queue: Mutex::new(VecDeque::new()),
        wakers: Mutex::new(HashMap::new()),
        pending: AtomicI32::new(-1),
        stop: AtomicBool::new(false),
    });
    if let Some(old) = LISTENING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(fd, l.clone())
    {
        // Its fd was closed behind our back (not through close(2)) and reused.
        shut(&old);
    } else {
        LISTENING_N.fetch_add(1, Ordering::Relaxed);
    }
    let Some(opts) = shim().opts.clone() else {
        return Ok(());
    };
    std::thread::Builder::new()
        .name("itcp-preload-accept".into())
        .spawn(move || {
            // Everything this thread does is the shim's own business.
            INSIDE.with(|c| c.set(true));
            if let Err(e) = accept_loop(&l, &opts, local) {
                debug!("listener on port {}: {e}", local.port());
            }
        })?;
    Ok(())
}

/// Keeps one ACCEPT outstanding at the MSR; queues each connection and wakes the
/// program's socket.
fn accept_loop(l: &Listening, opts: &MhOptions, local: SocketAddr) -> io::Result<()> {
    let gateway = l.itcp.gateway();
    let any = if gateway.is_ipv6() {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let wake_to = if local.ip().is_unspecified() {
        match local {
            SocketAddr::V4(_) => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), local.port()),
            SocketAddr::V6(_) => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), local.port()),
        }
    } else {
        local
    };
    while !l.stop.load(Ordering::Relaxed) {
        let mut s = TcpStream::connect_timeout(&gateway, opts.get_connect_timeout())?;
        l.pending.store(s.as_raw_fd(), Ordering::SeqCst);
        // close() sets `stop` then cuts `pending`; we set `pending` then check `stop`:
        // one of the two sees the other.
        if l.stop.load(Ordering::SeqCst) {
            break;
        }
        let r = request_on(
            &mut s,
            opts,
            Command::Accept,
            Addr::Ip(SocketAddr::new(any, local.port())),
        );
        l.pending.store(-1, Ordering::SeqCst);
        let peer = match r {
            Ok(Addr::Ip(p)) => p,
            Ok(a) => {
                return Err(io::Error::other(format!(
                    "the gateway named the peer {a} by name"
                )))
            }
            Err(e) => return Err(e),
        };
        if l.stop.load(Ordering::Relaxed) {
            break;
        }
        debug!("I-TCP connection from {peer} for port {}", local.port());
        l.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((OwnedFd::from(s), peer));
        wake(l, wake_to)?;
    }
    Ok(())
}

/// Makes the program's listening socket readable with a connection from us, whose
/// local address is registered *before* it connects: the program's accept may return
/// it before our connect does, and must know it as a wake-up, not a peer.
fn wake(l: &Listening, to: SocketAddr) -> io::Result<()> {
    let sock = sys::stream_socket(to)?;
    sys::bind_any_port(sock.as_raw_fd(), to.ip())?;
    let key = sys::local_addr(sock.as_raw_fd())?;
    let wakers = || l.wakers.lock().unwrap_or_else(|e| e.into_inner());
    wakers().insert(key, None);
    let (sa, len) = sys::to_sockaddr(to, sys::sock_family(sock.as_raw_fd())?)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?;
    // SAFETY: `sock` is our open socket; sa holds a sockaddr of len bytes.
    let rc = unsafe {
        real_connect(
            sock.as_raw_fd(),
            (&sa as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        wakers().remove(&key);
        return Err(e);
    }
    // Keep our end open until the program has accepted the other (unless it already
    // has: then the entry is gone and ours closes here).
    if let Some(slot) = wakers().get_mut(&key) {
        *slot = Some(sock);
    }
    Ok(())
}

/// The intercepting accept on a listening socket of ours: accept(2) on the program's
/// socket; a wake-up connection is swapped for the next queued I-TCP connection.
///
/// # Safety
/// As accept4(2).
unsafe fn accept_swap(
    l: &Listening,
    fd: RawFd,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    loop {
        // SAFETY: zeroed storage is valid; accept4 writes at most `slen` bytes.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut slen = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
        // SAFETY: ss/slen are valid out-pointers.
        let nfd = unsafe {
            real_accept4(
                fd,
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                &mut slen,
                flags,
            )
        };
        if nfd < 0 {
            return nfd;
        }
        // SAFETY: the kernel wrote `slen` bytes.
        let from =
            unsafe { sys::from_sockaddr((&ss as *const libc::sockaddr_storage).cast(), slen) };
        let waker = from.and_then(|a| {
            l.wakers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&a)
        });
        if waker.is_none() {
            // A genuine local connection: the program's, as accepted.
            if !addr.is_null() && !len.is_null() {
                // SAFETY: the caller's buffers, at most *len bytes.
                unsafe {
                    let n = (*len).min(slen) as usize;
                    std::ptr::copy_nonoverlapping(
                        (&ss as *const libc::sockaddr_storage).cast::<u8>(),
                        addr.cast(),
                        n,
                    );
                    *len = slen;
                }
            }
            return nfd;
        }
        drop(waker);
        let next = l
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        let Some((conn, peer)) = next else {
            // Nothing queued (cannot happen: each waker follows a queued connection).
            real_close(nfd);
            continue;
        };
        let family = sys::sock_family(fd).unwrap_or(libc::AF_INET);
        let swapped = sys::dup_onto(conn.as_raw_fd(), nfd, flags & libc::SOCK_CLOEXEC != 0)
            .and_then(|()| {
                let fl = sys::get_fl(nfd)?;
                let fl = if flags & libc::SOCK_NONBLOCK != 0 {
                    fl | libc::O_NONBLOCK
                } else {
                    fl & !libc::O_NONBLOCK
                };
                sys::set_fl(nfd, fl)?;
                sys::set_cloexec(nfd, flags & libc::SOCK_CLOEXEC != 0)
            });
        drop(conn);
        if let Err(e) = swapped {
            real_close(nfd);
            set_errno(errno_of(&e));
            return -1;
        }
        remember_peer(nfd, peer);
        // SAFETY: the caller's buffers.
        unsafe { sys::write_sockaddr(peer, family, addr, len) };
        debug!("accept fd {fd}: I-TCP connection from {peer} as fd {nfd}");
        return nfd;
    }
}

// ---------------------------------------------------------------------------------
// The interposed symbols

/// connect(2), through I-TCP for configured destinations.
///
/// # Safety
/// As connect(2).
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(_g) = enter() {
        // SAFETY: the caller's sockaddr of `len` bytes.
        if let Some(dest) = unsafe { sys::from_sockaddr(addr, len) } {
            let r = catch_unwind(AssertUnwindSafe(|| itcp_connect(fd, dest)));
            match r {
                Ok(Some(rc)) => return rc,
                Ok(None) => {}
                Err(_) => {
                    set_errno(libc::EIO);
                    return -1;
                }
            }
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_connect(fd, addr, len) }
}

/// getpeername(2): the original destination of an intercepted connection.
///
/// # Safety
/// As getpeername(2).
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(_g) = enter() {
        if let Some(dest) = peer_of(fd) {
            if addr.is_null() || len.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            let family = sys::sock_family(fd).unwrap_or(libc::AF_INET);
            // SAFETY: the caller's buffers of *len bytes.
            unsafe { sys::write_sockaddr(dest, family, addr, len) };
            return 0;
        }
    }
    match real!("getpeername": PeerFn) {
        // SAFETY: forwarding the caller's arguments.
        Some(f) => unsafe { f(fd, addr, len) },
        None => enosys(),
    }
}

/// listen(2); configured ports listen at the MSR too.
#[no_mangle]
pub extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    let Some(f) = real!("listen": ListenFn) else {
        return enosys();
    };
    let Some(_g) = enter() else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(fd, backlog) };
    };
    no_panic(|| {
        if listening_of(fd).is_some() {
            // listen(2) again (a new backlog): already listening at the MSR.
            // SAFETY: forwarding.
            return unsafe { f(fd, backlog) };
        }
        let prepared = match itcp_listen_prepare(fd) {
            Ok(p) => p,
            Err(e) => {
                debug!("listen fd {fd}: I-TCP listen failed: {e}");
                set_errno(errno_of(&e));
                return -1;
            }
        };
        // SAFETY: forwarding.
        let rc = unsafe { f(fd, backlog) };
        if rc != 0 {
            // The MSR's listener (if any) closes with `prepared`; keep listen's errno.
            let e = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            drop(prepared);
            set_errno(e);
            return rc;
        }
        if let Some((itcp, local)) = prepared {
            if let Err(e) = itcp_listen_start(fd, itcp, local) {
                debug!("listen fd {fd}: {e}");
                set_errno(errno_of(&e));
                return -1;
            }
        }
        0
    })
}

/// accept4(2); see the crate docs for listening sockets of ours.
///
/// # Safety
/// As accept4(2).
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    if let Some(_g) = enter() {
        if let Some(l) = listening_of(fd) {
            // SAFETY: the caller's arguments.
            return no_panic(|| unsafe { accept_swap(&l, fd, addr, len, flags) });
        }
    }
    // SAFETY: forwarding.
    unsafe { real_accept4(fd, addr, len, flags) }
}

/// accept(2): accept4 without flags.
///
/// # Safety
/// As accept(2).
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(_g) = enter() {
        if let Some(l) = listening_of(fd) {
            // SAFETY: the caller's arguments.
            return no_panic(|| unsafe { accept_swap(&l, fd, addr, len, 0) });
        }
    }
    match real!("accept": AcceptFn) {
        // SAFETY: forwarding.
        Some(f) => unsafe { f(fd, addr, len) },
        None => enosys(),
    }
}

/// close(2); closing a listening socket of ours closes the listener at the MSR.
#[no_mangle]
pub extern "C" fn close(fd: c_int) -> c_int {
    if LISTENING_N.load(Ordering::Relaxed) != 0 {
        if let Some(_g) = enter() {
            let l = catch_unwind(|| {
                if listening_of(fd).is_some() {
                    unregister(fd)
                } else {
                    None
                }
            });
            if let Ok(Some(l)) = l {
                debug!("close fd {fd}: the I-TCP listener closes");
                // The accept thread may hold it a little longer; the control connection
                // closes with the last reference, and the MSR's listener with it.
                drop(l);
            }
        }
    }
    real_close(fd)
}

/// The shim's settings as parsed (for tests and `ITCP_PRELOAD_DEBUG`).
pub fn settings() -> Config {
    shim().cfg.clone()
}
