//! `libitcp`: the I-TCP mobile-host library for C programs (`include/itcp.h`).
//!
//! The paper's calls over `itcp-mh`: [`itcp_connect`], [`itcp_listen`], [`itcp_accept`],
//! [`itcp_close`], returning plain socket fds with errors in `errno`, and mobility
//! events from `itcp_mh::agent` through [`itcp_set_event_callback`] once the program
//! runs the agent with [`itcp_agent_start`].
//!
//! Every exported item is declared through the macros below, which also feed
//! [`header`]: the committed `include/itcp.h` is checked against the rendering by a unit
//! test, so the header is generated, never hand-kept.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use itcp_mh::agent::{Agent, AgentConfig, Event};
use itcp_mh::mobility::Policy;
use itcp_mh::{Addr, ItcpListener, ItcpStream, MhOptions};
use libc::{c_char, c_int, c_void, sockaddr_storage, socklen_t};

pub mod header;

/// Declares `#define`d integer constants (and the Rust constants).
macro_rules! c_consts {
    ($($(#[doc = $doc:expr])* pub const $name:ident = $v:expr;)*) => {
        $($(#[doc = $doc])* pub const $name: c_int = $v;)*
        /// The constants, for the header.
        pub const CONSTANTS: &[header::Constant] = &[$(header::Constant {
            name: stringify!($name),
            doc: &[$($doc),*],
            value: $v as i64,
        }),*];
    };
}

/// Declares the one `#[repr(C)]` struct of the API.
macro_rules! c_struct {
    ($(#[doc = $doc:expr])* pub struct $name:ident as $cname:literal {
        $($(#[doc = $fdoc:expr])* pub $f:ident: $t:ty,)*
    }) => {
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Debug)]
        pub struct $name { $($(#[doc = $fdoc])* pub $f: $t,)* }
        /// The structs, for the header.
        pub const STRUCTS: &[header::Struct] = &[header::Struct {
            name: $cname,
            doc: &[$($doc),*],
            fields: &[$((stringify!($f), <$t as header::CType>::C, &[$($fdoc),*])),*],
        }];
    };
}

/// One exported function: `safe` or `unsafe`.
macro_rules! c_fn {
    (safe $(#[$m:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$m])* #[no_mangle] pub extern "C" fn $name($($arg: $ty),*) -> $ret $body
    };
    (unsafe $(#[$m:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$m])* #[no_mangle] pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body
    };
}

/// Declares the exported functions and records them for the header.
macro_rules! c_api {
    ($($(#[doc = $doc:expr])* pub $safety:ident extern "C" fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block)*) => {
        $(c_fn!($safety $(#[doc = $doc])* $name($($arg: $ty),*) -> $ret $body);)*
        /// The functions, for the header.
        pub const FUNCTIONS: &[header::Function] = &[$(header::Function {
            name: stringify!($name),
            doc: &[$($doc),*],
            ret: <$ret as header::CType>::C,
            args: &[$((stringify!($arg), <$ty as header::CType>::C)),*],
        }),*];
    };
}

/// The text of `include/itcp.h`.
pub fn header_text() -> String {
    header::render(CONSTANTS, STRUCTS, FUNCTIONS)
}

c_consts! {
    /// Event: the agent attached to an MSR with nothing to move (first contact, or an
    /// MSR after connections were lost). to_msr names it.
    pub const ITCP_EVENT_ATTACHED = 1;
    /// Event: the MH's connections moved from_msr -> to_msr (a handoff completed);
    /// connections is how many, elapsed_ms the time since the greeting.
    pub const ITCP_EVENT_MOVED = 2;
    /// Event: a handoff failed; the connections stayed with from_msr (reason says why).
    pub const ITCP_EVENT_MOVE_FAILED = 3;
    /// Event: the MSR to_msr refused the MH's greeting (reason says why).
    pub const ITCP_EVENT_REFUSED = 4;
    /// Event: no MSR is heard any more (the beacons of from_msr expired and no other MSR
    /// is in range). Open connections stay open at the MSR, waiting for the MH.
    pub const ITCP_EVENT_DISCONNECTED = 5;
    /// Event: the first contact after ITCP_EVENT_DISCONNECTED: the MH hears its MSR again
    /// (from_msr = to_msr) or reached another one, whose ATTACHED or MOVED event came
    /// just before this one.
    pub const ITCP_EVENT_RECONNECTED = 6;
    /// Event: the agent stopped on an error (reason says which); no more events follow
    /// until itcp_agent_start is called again (after itcp_agent_stop).
    pub const ITCP_EVENT_AGENT_ERROR = 7;
}

c_struct! {
    /// A mobility event, passed to the callback set with itcp_set_event_callback.
    pub struct ItcpEvent as "itcp_event" {
        /// One of ITCP_EVENT_*.
        pub kind: c_int,
        /// The MSR the MH comes from ("" if none). Never NULL.
        pub from_msr: *const c_char,
        /// The MSR the MH is at now ("" if none). Never NULL.
        pub to_msr: *const c_char,
        /// MOVED/ATTACHED: connections moved (or held) by the MSR; else 0.
        pub connections: u32,
        /// MOVED: ms from the greeting to the end of the handoff; else 0.
        pub elapsed_ms: f64,
        /// MOVE_FAILED, REFUSED, AGENT_ERROR: why; else "". Never NULL.
        pub reason: *const c_char,
    }
}

/// The event callback's type (`itcp_event_cb` in C).
pub type ItcpEventCb = Option<unsafe extern "C" fn(event: *const ItcpEvent, user: *mut c_void)>;

// ---------------------------------------------------------------------------------
// Errors

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The errno for an error of `itcp-mh` (see the header's preamble for the table).
pub fn errno_of(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::NetworkUnreachable => libc::ENETUNREACH,
        K::HostUnreachable => libc::EHOSTUNREACH,
        K::TimedOut => libc::ETIMEDOUT,
        K::PermissionDenied => libc::EACCES,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::InvalidInput => libc::EINVAL,
        K::NotFound => libc::ENOENT,
        K::Unsupported => libc::EOPNOTSUPP,
        K::InvalidData => libc::EPROTO,
        K::UnexpectedEof | K::ConnectionAborted => libc::ECONNABORTED,
        K::ConnectionReset => libc::ECONNRESET,
        K::NotConnected => libc::ENOTCONN,
        K::BrokenPipe => libc::EPIPE,
        K::WouldBlock => libc::EAGAIN,
        K::Interrupted => libc::EINTR,
        K::AlreadyExists => libc::EEXIST,
        K::OutOfMemory => libc::ENOMEM,
        _ => libc::EIO,
    }
}

fn set_errno(n: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = n };
}

fn remember(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

fn err(errno: c_int, msg: impl Into<String>) -> io::Error {
    Tagged::wrap(errno, msg.into())
}

/// An error whose errno is fixed, with a message of our own.
#[derive(Debug)]
struct Tagged {
    errno: c_int,
    msg: String,
}

impl std::fmt::Display for Tagged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Tagged {}

impl Tagged {
    fn wrap(errno: c_int, msg: String) -> io::Error {
        io::Error::other(Tagged { errno, msg })
    }
}

fn errno_and_msg(e: &io::Error) -> (c_int, String) {
    if let Some(t) = e.get_ref().and_then(|i| i.downcast_ref::<Tagged>()) {
        return (t.errno, t.msg.clone());
    }
    (errno_of(e), e.to_string())
}

/// Runs `f`; on error (or a panic) records the message, sets errno and returns `fail`.
/// errno is set last, after everything `f` owned is dropped.
fn ffi<T>(fail: T, f: impl FnOnce() -> io::Result<T>) -> T {
    let r = catch_unwind(AssertUnwindSafe(f));
    let (errno, msg) = match r {
        Ok(Ok(v)) => return v,
        Ok(Err(e)) => errno_and_msg(&e),
        Err(_) => (libc::EIO, "libitcp: internal error (panic)".to_string()),
    };
    remember(msg);
    set_errno(errno);
    fail
}

/// A C string argument as UTF-8 (`what` names it in errors).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives `'a`.
unsafe fn arg_str<'a>(p: *const c_char, what: &str) -> io::Result<&'a str> {
    if p.is_null() {
        return Err(err(libc::EINVAL, format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| err(libc::EINVAL, format!("{what} is not UTF-8")))
}

/// Writes `addr` like accept(2) does: at most `*len` bytes into `out`, then the full
/// size into `*len`. NULL `out` or `len` skips it.
///
/// # Safety
/// `out`, if not NULL, points to `*len` writable bytes; `len`, if not NULL, is valid.
unsafe fn write_sockaddr(addr: SocketAddr, out: *mut sockaddr_storage, len: *mut socklen_t) {
    if out.is_null() || len.is_null() {
        return;
    }
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let size = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write((&mut ss as *mut sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and suitably aligned.
            unsafe { std::ptr::write((&mut ss as *mut sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: the caller gives `*len` writable bytes at `out`; we copy no more.
    unsafe {
        let n = (*len as usize).min(size);
        std::ptr::copy_nonoverlapping((&ss as *const sockaddr_storage).cast::<u8>(), out.cast(), n);
        *len = size as socklen_t;
    }
}

// ---------------------------------------------------------------------------------
// Listener handles

/// A socket's identity: (device, inode). A closed and reused fd number has another.
fn identity(fd: RawFd) -> io::Result<(u64, u64)> {
    // SAFETY: an all-zero stat is valid; fstat only writes into it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; fstat on any int is safe (EBADF if closed).
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

struct Registered {
    id: (u64, u64),
    listener: Arc<ItcpListener>,
}

/// Listener handles by fd (the fd of each listener's control connection).
static LISTENERS: Mutex<BTreeMap<RawFd, Registered>> = Mutex::new(BTreeMap::new());

fn listeners() -> std::sync::MutexGuard<'static, BTreeMap<RawFd, Registered>> {
    LISTENERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops a registry entry whose fd was closed behind our back: its socket number may
/// belong to someone else now, so the stale `TcpStream` must never close it.
fn forget_stale(r: Registered) {
    std::mem::forget(r.listener);
}

/// The listener registered for `fd`, if `fd` is one.
fn listener_of(fd: RawFd) -> io::Result<Arc<ItcpListener>> {
    let id = identity(fd)?;
    let mut map = listeners();
    match map.get(&fd) {
        Some(r) if r.id == id => Ok(r.listener.clone()),
        Some(_) => {
            if let Some(r) = map.remove(&fd) {
                forget_stale(r);
            }
            Err(not_a_listener(fd))
        }
        None => Err(not_a_listener(fd)),
    }
}

fn not_a_listener(fd: RawFd) -> io::Error {
    err(
        libc::EINVAL,
        format!("fd {fd} is not an I-TCP listener (itcp_listen)"),
    )
}

// ---------------------------------------------------------------------------------
// Events and the agent

struct Callback {
    f: unsafe extern "C" fn(*const ItcpEvent, *mut c_void),
    user: usize,
}

static CALLBACK: Mutex<Option<Callback>> = Mutex::new(None);

struct AgentHandle {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

static AGENT: Mutex<Option<AgentHandle>> = Mutex::new(None);

/// An event as owned strings, before it is lent to C.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedEvent {
    pub kind: c_int,
    pub from_msr: String,
    pub to_msr: String,
    pub connections: u32,
    pub elapsed_ms: f64,
    pub reason: String,
}

impl OwnedEvent {
    fn new(kind: c_int) -> Self {
        OwnedEvent {
            kind,
            from_msr: String::new(),
            to_msr: String::new(),
            connections: 0,
            elapsed_ms: 0.0,
            reason: String::new(),
        }
    }
}

/// Turns the agent's events into the C events, tracking DISCONNECTED → RECONNECTED.
#[derive(Debug, Default)]
pub struct EventMapper {
    disconnected: bool,
}

impl EventMapper {
    /// The C events for one agent event, in delivery order.
    pub fn map(&mut self, ev: Event) -> Vec<OwnedEvent> {
        let mut out = Vec::new();
        let mut reconnect = |out: &mut Vec<OwnedEvent>, from: &str, to: &str| {
            if std::mem::take(&mut self.disconnected) {
                let mut e = OwnedEvent::new(ITCP_EVENT_RECONNECTED);
                e.from_msr = from.into();
                e.to_msr = to.into();
                out.push(e);
            }
        };
        match ev {
            Event::Attached { msr, connections } => {
                let mut e = OwnedEvent::new(ITCP_EVENT_ATTACHED);
                e.to_msr = msr.clone();
                e.connections = connections as u32;
                out.push(e);
                reconnect(&mut out, "", &msr);
            }
            Event::Moved {
                from,
                to,
                connections,
                moved_ms,
                ..
            } => {
                let mut e = OwnedEvent::new(ITCP_EVENT_MOVED);
                e.from_msr = from.clone();
                e.to_msr = to.clone();
                e.connections = connections as u32;
                e.elapsed_ms = moved_ms;
                out.push(e);
                reconnect(&mut out, &from, &to);
            }
            Event::Regained { msr } => reconnect(&mut out, &msr, &msr),
            Event::MoveFailed { from, to, reason } => {
                let mut e = OwnedEvent::new(ITCP_EVENT_MOVE_FAILED);
                e.from_msr = from;
                e.to_msr = to;
                e.reason = reason;
                out.push(e);
            }
            Event::Refused { msr, reason } => {
                let mut e = OwnedEvent::new(ITCP_EVENT_REFUSED);
                e.to_msr = msr;
                e.reason = reason;
                out.push(e);
            }
            // For the agent's log: nothing changed for the app (an app's connections
            // go through the main address's gateway).
            Event::AnswerDropped { .. }
            | Event::GreetedAfresh { .. }
            | Event::OtherAddress { .. }
            | Event::Registered { .. }
            | Event::RegisterFailed { .. } => {}
            Event::Lost { from } => {
                self.disconnected = true;
                let mut e = OwnedEvent::new(ITCP_EVENT_DISCONNECTED);
                e.from_msr = from;
                out.push(e);
            }
        }
        out
    }
}

/// Calls the registered callback (if any) with `ev`.
fn deliver(ev: &OwnedEvent) {
    let cb = CALLBACK
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|c| (c.f, c.user));
    let Some((f, user)) = cb else { return };
    let c = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
    let (from, to, reason) = (c(&ev.from_msr), c(&ev.to_msr), c(&ev.reason));
    let e = ItcpEvent {
        kind: ev.kind,
        from_msr: from.as_ptr(),
        to_msr: to.as_ptr(),
        connections: ev.connections,
        elapsed_ms: ev.elapsed_ms,
        reason: reason.as_ptr(),
    };
    // SAFETY: whoever registered `f` promised (itcp_set_event_callback) that it may be
    // called from the agent's thread with `user`; `e` and its strings outlive the call.
    unsafe { f(&e, user as *mut c_void) };
}

/// Applies the `key=value` options of itcp_agent_start.
fn agent_options(cfg: &mut AgentConfig, text: &str) -> io::Result<()> {
    for item in text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
    {
        let bad = |why: &str| err(libc::EINVAL, format!("agent option {item:?}: {why}"));
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| bad("expected key=value"))?;
        let num = || v.parse::<u64>().map_err(|_| bad("not a number"));
        match k {
            "policy" => {
                cfg.policy = match v {
                    "eager" => Policy::Eager,
                    "lazy" => Policy::Lazy,
                    _ => return Err(bad("expected eager or lazy")),
                }
            }
            "hysteresis_ms" => cfg.hysteresis = Duration::from_millis(num()?),
            "beacon_interval_ms" => cfg.beacon_interval = Duration::from_millis(num()?.max(1)),
            "greet_retry_ms" => cfg.greet_retry = Duration::from_millis(num()?.max(1)),
            "greet_timeout_ms" => cfg.greet_timeout = Duration::from_millis(num()?),
            "solicit" => {
                cfg.solicit = match v {
                    "1" | "yes" => true,
                    "0" | "no" => false,
                    _ => return Err(bad("expected 1 or 0")),
                }
            }
            "beacon_port" | "greet_port" => {
                let p = u16::try_from(num()?).map_err(|_| bad("not a port"))?;
                if k == "beacon_port" {
                    cfg.beacon_port = p;
                } else {
                    cfg.greet_port = p;
                }
            }
            _ => return Err(bad("unknown key (policy, hysteresis_ms, beacon_interval_ms, greet_retry_ms, greet_timeout_ms, solicit, beacon_port, greet_port)")),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// The API

c_api! {
    /// Opens an I-TCP connection to host:port through the current MSR (the paper's
    /// active open). host is an IPv4/IPv6 address in text form, or a name, which the MSR
    /// resolves (as SOCKS5 does), not this host. Blocks until the MSR has connected to
    /// the peer or failed.
    ///
    /// Returns a connected, blocking TCP socket (FD_CLOEXEC set) whose bytes reach the
    /// peer through the MSR. The caller owns it: close it with close(2) or itcp_close.
    /// getpeername(2) on it names the gateway, not the peer.
    ///
    /// On failure returns -1 and sets errno: EINVAL (host NULL, not UTF-8, or too
    /// long), ECONNREFUSED, ENETUNREACH, EHOSTUNREACH, ETIMEDOUT (the MSR's answer for
    /// the peer, or no answer from the gateway within the connect timeout), EACCES (the
    /// MSR does not serve this MH, or rejected the session token), ENOENT (no gateway
    /// configured), EPROTO (the gateway is not an I-TCP MSR), ECONNABORTED (the gateway
    /// closed the connection), or the errno of reaching the gateway.
    ///
    /// # Safety
    /// host is NULL or a NUL-terminated string.
    pub unsafe extern "C" fn itcp_connect(host: *const c_char, port: u16) -> c_int {
        ffi(-1, || {
            // SAFETY: the caller's contract for `host`.
            let host = unsafe { arg_str(host, "host") }?;
            let opts = MhOptions::from_env()?;
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let s = match bare.parse::<IpAddr>() {
                Ok(ip) => ItcpStream::connect_with(&opts, SocketAddr::new(ip, port))?,
                Err(_) => ItcpStream::connect_target(&opts, Addr::Domain(host.to_string(), port))?,
            };
            Ok(s.into_raw_fd())
        })
    }

    /// Asks the MSR to listen for this MH on the MH's address, port port (0: the MSR
    /// picks one; see itcp_listener_addr). This is the paper's passive open: peers
    /// connect to the MH's address, the MSR accepts for it.
    ///
    /// Returns a listener handle: the fd of the control connection to the MSR that keeps
    /// the listener open. Use it only with itcp_accept, itcp_listener_addr and
    /// itcp_close; do not read or write it. It becomes readable (EOF) if the MSR drops
    /// the listener. Close it with itcp_close (close(2) closes the listener at the MSR
    /// too, but leaves a small record here until the fd number is reused).
    ///
    /// On failure returns -1 and sets errno: EADDRINUSE (port taken), EACCES (the MSR
    /// does not serve this MH, or the listener belongs to another MH), and the gateway
    /// errors of itcp_connect.
    pub safe extern "C" fn itcp_listen(port: u16) -> c_int {
        ffi(-1, || {
            let opts = MhOptions::from_env()?;
            let l = ItcpListener::bind_with(&opts, port)?;
            let fd = l.control_stream().as_raw_fd();
            let id = identity(fd)?;
            let old = listeners().insert(fd, Registered { id, listener: Arc::new(l) });
            if let Some(old) = old {
                // Its fd was closed with close(2) and the number reused for ours.
                forget_stale(old);
            }
            Ok(fd)
        })
    }

    /// Stores the address the MSR listens on for the listener listen_fd (the MH's
    /// address and the port) like getsockname(2): at most *len bytes into addr, then the
    /// full size into *len.
    ///
    /// Returns 0, or -1 with errno EBADF (listen_fd is not open) or EINVAL (listen_fd is
    /// not a listener handle of itcp_listen, or addr or len is NULL).
    ///
    /// # Safety
    /// addr points to *len writable bytes; len is valid.
    pub unsafe extern "C" fn itcp_listener_addr(listen_fd: c_int, addr: *mut sockaddr_storage, len: *mut socklen_t) -> c_int {
        ffi(-1, || {
            if addr.is_null() || len.is_null() {
                return Err(err(libc::EINVAL, "addr or len is NULL"));
            }
            let l = listener_of(listen_fd)?;
            // SAFETY: the caller's contract for `addr` and `len`.
            unsafe { write_sockaddr(l.local_addr()?, addr, len) };
            Ok(0)
        })
    }

    /// Waits for the next connection to the listener listen_fd (the paper's accept) and
    /// returns it: a connected, blocking TCP socket (FD_CLOEXEC set), owned by the
    /// caller, whose bytes reach the peer through the MSR. Blocks until a peer connects,
    /// without a timeout. Several threads may wait on one listener at once; each
    /// connection goes to one of them.
    ///
    /// If peer and len are not NULL, the peer's address is stored as accept(2) does: at
    /// most *len bytes into peer, then the full size into *len.
    ///
    /// On failure returns -1 and sets errno: EBADF (listen_fd is not open), EINVAL
    /// (listen_fd is not a listener handle of itcp_listen), ENOENT (the listener was
    /// closed, e.g. by itcp_close from another thread), EACCES, and the gateway errors of
    /// itcp_connect.
    ///
    /// # Safety
    /// peer is NULL or points to *len writable bytes; len is NULL or valid.
    pub unsafe extern "C" fn itcp_accept(listen_fd: c_int, peer: *mut sockaddr_storage, len: *mut socklen_t) -> c_int {
        ffi(-1, || {
            let l = listener_of(listen_fd)?;
            let (s, from) = l.accept()?;
            // SAFETY: the caller's contract for `peer` and `len`.
            unsafe { write_sockaddr(from, peer, len) };
            Ok(s.into_raw_fd())
        })
    }

    /// Closes fd. For a listener handle of itcp_listen, closes the listener at the MSR
    /// at once (a thread blocked in itcp_accept on it returns -1 with ENOENT) and frees
    /// it. Any other fd is closed with close(2).
    ///
    /// Returns 0, or -1 with the errno of close(2) (EBADF if fd is not open).
    pub safe extern "C" fn itcp_close(fd: c_int) -> c_int {
        ffi(-1, || {
            let id = identity(fd).ok();
            let entry = {
                let mut map = listeners();
                match map.get(&fd) {
                    Some(r) if Some(r.id) == id => map.remove(&fd),
                    Some(_) => {
                        // A listener closed with close(2) earlier; the number is reused.
                        if let Some(stale) = map.remove(&fd) {
                            forget_stale(stale);
                        }
                        None
                    }
                    None => None,
                }
            };
            if let Some(r) = entry {
                return match Arc::try_unwrap(r.listener) {
                    // Dropping it closes the control connection: the MSR closes the
                    // listener.
                    Ok(l) => {
                        drop(l);
                        Ok(0)
                    }
                    Err(shared) => {
                        // A thread is in itcp_accept on it: close the control connection
                        // now (the MSR ends that ACCEPT) and never again — the fd number
                        // is free for reuse once closed, so the shared value is leaked.
                        let _ = shared.control_stream().shutdown(std::net::Shutdown::Both);
                        // SAFETY: the fd is the listener's own (identity checked), and
                        // the leaked value below never closes it a second time.
                        let rc = unsafe { libc::close(fd) };
                        let e = io::Error::last_os_error();
                        std::mem::forget(shared);
                        if rc == 0 { Ok(0) } else { Err(e) }
                    }
                };
            }
            // SAFETY: closing an fd the caller names; the caller owns it.
            if unsafe { libc::close(fd) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(0)
        })
    }

    /// The message of the last failed itcp_* call on this thread (e.g. "I-TCP gateway
    /// 10.2.0.1:1080 could not connect to 10.0.0.1:9: connection refused"), or "".
    /// The string stays valid until the next failing itcp_* call on this thread. Never
    /// NULL.
    pub safe extern "C" fn itcp_last_error() -> *const c_char {
        LAST_ERROR.with(|l| l.borrow().as_ptr())
    }

    /// Sets the mobility event callback (NULL: none), replacing the previous one.
    /// cb(event, user) is called on the agent's thread (see itcp_agent_start), once per
    /// event, in order; it should return quickly. It may call any itcp_* function except
    /// itcp_agent_stop. event and its strings are valid only during the call. A callback
    /// being replaced may still run once, concurrently, if an event is being delivered.
    ///
    /// Events come only from the agent: without itcp_agent_start nothing is reported.
    /// The library does not watch the fds it returned (a reset or closed connection is
    /// seen by the application's own reads and writes as usual).
    ///
    /// # Safety
    /// cb, if not NULL, must be callable from another thread with user until it is
    /// replaced and no call is in progress.
    pub unsafe extern "C" fn itcp_set_event_callback(cb: ItcpEventCb, user: *mut c_void) -> () {
        let mut g = CALLBACK.lock().unwrap_or_else(|e| e.into_inner());
        *g = cb.map(|f| Callback { f, user: user as usize });
    }

    /// Starts the MH's mobility agent on a thread of this process (as the itcp-mh-agent
    /// program does): it listens to MSR beacons on interface, greets a new MSR when the
    /// MH moves (proving the session token), points the gateway address at the MSR that
    /// holds the MH's connections (ip neigh replace), and reports each step as an event
    /// to the callback of itcp_set_event_callback. Needs CAP_NET_ADMIN (root) and the
    /// ip program. Run one agent per MH: a second process's agent cannot bind the beacon
    /// port.
    ///
    /// interface is the wireless interface (e.g. "air0"), mh_addr the MH's address.
    /// options is NULL or "key=value" items separated by commas or spaces: policy=eager
    /// or lazy, hysteresis_ms, beacon_interval_ms, greet_retry_ms, greet_timeout_ms,
    /// solicit=1 or 0 (ask for a beacon when the interface's carrier comes up instead of
    /// waiting for the next one; default 1), beacon_port (4345), greet_port (4346). The
    /// gateway and token come from the configuration, as for itcp_connect.
    ///
    /// Returns 0, or -1 with errno: EALREADY (an agent runs in this process), EINVAL (a
    /// bad argument or option), EADDRINUSE (the beacon port is taken), EACCES (not
    /// permitted), EIO (the interface cannot be used, e.g. there is none of that name),
    /// ENOENT (no gateway configured).
    ///
    /// # Safety
    /// interface and mh_addr are NULL or NUL-terminated strings; so is options.
    pub unsafe extern "C" fn itcp_agent_start(interface: *const c_char, mh_addr: *const c_char, options: *const c_char) -> c_int {
        ffi(-1, || {
            // SAFETY: the caller's contract for the strings.
            let (ifname, mh, options) = unsafe {
                (
                    arg_str(interface, "interface")?,
                    arg_str(mh_addr, "mh_addr")?,
                    if options.is_null() { "" } else { arg_str(options, "options")? },
                )
            };
            let mh: IpAddr = mh
                .parse()
                .map_err(|_| err(libc::EINVAL, format!("mh_addr {mh:?} is not an address")))?;
            let mut slot = AGENT.lock().unwrap_or_else(|e| e.into_inner());
            if slot.as_ref().is_some_and(|a| !a.thread.is_finished()) {
                return Err(err(libc::EALREADY, "the mobility agent already runs"));
            }
            let opts = MhOptions::from_env()?;
            let gateway = opts.resolve_gateway()?;
            let token = opts.resolve_token()?;
            let mut cfg = AgentConfig::new(ifname, mh, gateway.ip(), token);
            cfg.register_port = Some(gateway.port());
            agent_options(&mut cfg, options)?;
            let mut agent = Agent::new(cfg)?;
            let stop = Arc::new(AtomicBool::new(false));
            let stop2 = stop.clone();
            let thread = std::thread::Builder::new()
                .name("itcp-agent".into())
                .spawn(move || {
                    let mut mapper = EventMapper::default();
                    let r = agent.run(&stop2, |ev| {
                        for e in mapper.map(ev) {
                            deliver(&e);
                        }
                    });
                    if let Err(e) = r {
                        let mut ev = OwnedEvent::new(ITCP_EVENT_AGENT_ERROR);
                        ev.reason = e.to_string();
                        deliver(&ev);
                    }
                })?;
            *slot = Some(AgentHandle { stop, thread });
            Ok(0)
        })
    }

    /// Stops the agent of itcp_agent_start and waits for its thread to end (within
    /// about 50 ms). No event is delivered after it returns.
    ///
    /// Returns 0, or -1 with errno ESRCH (no agent was started) or EDEADLK (called from
    /// the event callback, i.e. on the agent's own thread).
    pub safe extern "C" fn itcp_agent_stop() -> c_int {
        ffi(-1, || {
            let mut slot = AGENT.lock().unwrap_or_else(|e| e.into_inner());
            let Some(a) = slot.take() else {
                return Err(err(libc::ESRCH, "no mobility agent runs"));
            };
            if a.thread.thread().id() == std::thread::current().id() {
                *slot = Some(a);
                return Err(err(libc::EDEADLK, "itcp_agent_stop called from the event callback"));
            }
            drop(slot);
            a.stop.store(true, Ordering::Relaxed);
            let _ = a.thread.join();
            Ok(0)
        })
    }

    /// The library's version, e.g. "0.1.0". Never NULL; static.
    pub safe extern "C" fn itcp_version() -> *const c_char {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_table() {
        use io::ErrorKind as K;
        let e = |k: K| errno_of(&io::Error::new(k, "x"));
        assert_eq!(e(K::ConnectionRefused), libc::ECONNREFUSED);
        assert_eq!(e(K::NetworkUnreachable), libc::ENETUNREACH);
        assert_eq!(e(K::HostUnreachable), libc::EHOSTUNREACH);
        assert_eq!(e(K::TimedOut), libc::ETIMEDOUT);
        assert_eq!(e(K::PermissionDenied), libc::EACCES);
        assert_eq!(e(K::AddrInUse), libc::EADDRINUSE);
        assert_eq!(e(K::InvalidInput), libc::EINVAL);
        assert_eq!(e(K::InvalidData), libc::EPROTO);
        assert_eq!(e(K::NotFound), libc::ENOENT);
        assert_eq!(e(K::Other), libc::EIO);
        assert_eq!(
            errno_of(&io::Error::from_raw_os_error(libc::EMFILE)),
            libc::EMFILE
        );
        let (n, m) = errno_and_msg(&err(libc::EALREADY, "busy"));
        assert_eq!((n, m.as_str()), (libc::EALREADY, "busy"));
    }

    #[test]
    fn bad_arguments_set_errno_and_message() {
        // SAFETY: NULL is allowed and rejected.
        assert_eq!(unsafe { itcp_connect(std::ptr::null(), 80) }, -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
        // SAFETY: itcp_last_error never returns NULL.
        let msg = unsafe { CStr::from_ptr(itcp_last_error()) }
            .to_str()
            .unwrap();
        assert_eq!(msg, "host is NULL");
        // An fd that is open but no listener.
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // SAFETY: NULL peer/len are allowed.
        let r =
            unsafe { itcp_accept(sock.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(r, -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(itcp_close(-1), -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EBADF));
        assert_eq!(itcp_agent_stop(), -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::ESRCH));
        let v = unsafe { CStr::from_ptr(itcp_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn connect_to_a_dead_gateway_is_econnrefused() {
        // A port nobody listens on, on loopback.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        std::env::set_var("ITCP_GATEWAY", format!("127.0.0.1:{port}"));
        std::env::set_var("ITCP_TOKEN", "000102030405060708090a0b0c0d0e0f");
        let host = CString::new("10.0.0.1").unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { itcp_connect(host.as_ptr(), 80) }, -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::ECONNREFUSED)
        );
        let msg = unsafe { CStr::from_ptr(itcp_last_error()) }
            .to_string_lossy()
            .into_owned();
        assert!(msg.contains("cannot reach I-TCP gateway"), "{msg}");
    }

    #[test]
    fn sockaddr_like_accept() {
        let a: SocketAddr = "10.0.0.1:5001".parse().unwrap();
        // SAFETY: zeroed storage is valid.
        let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<sockaddr_storage>() as socklen_t;
        // SAFETY: ss has len bytes.
        unsafe { write_sockaddr(a, &mut ss, &mut len) };
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: it holds a sockaddr_in now.
        let sin: libc::sockaddr_in =
            unsafe { std::ptr::read((&ss as *const sockaddr_storage).cast()) };
        assert_eq!(sin.sin_family as c_int, libc::AF_INET);
        assert_eq!(u16::from_be(sin.sin_port), 5001);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 0, 0, 1]);
        // Truncation: *len says the real size.
        let mut small = 4 as socklen_t;
        unsafe { write_sockaddr(a, &mut ss, &mut small) };
        assert_eq!(small as usize, std::mem::size_of::<libc::sockaddr_in>());
    }

    #[test]
    fn agent_options_parse() {
        let mut cfg = AgentConfig::new(
            "air0",
            "10.2.0.100".parse().unwrap(),
            "10.2.0.1".parse().unwrap(),
            itcp_mh::Token([0; 16]),
        );
        agent_options(&mut cfg, "policy=lazy, hysteresis_ms=0 beacon_port=5000").unwrap();
        assert_eq!(cfg.policy, Policy::Lazy);
        assert_eq!(cfg.hysteresis, Duration::ZERO);
        assert_eq!(cfg.beacon_port, 5000);
        let e = agent_options(&mut cfg, "colour=blue").unwrap_err();
        assert_eq!(errno_and_msg(&e).0, libc::EINVAL);
        assert!(agent_options(&mut cfg, "greet_port=70000").is_err());
        assert!(agent_options(&mut cfg, "").is_ok());
        assert!(cfg.solicit);
        agent_options(&mut cfg, "solicit=0").unwrap();
        assert!(!cfg.solicit);
        assert!(agent_options(&mut cfg, "solicit=maybe").is_err());
    }

    #[test]
    fn events_map_with_reconnect() {
        let mut m = EventMapper::default();
        let kinds = |v: Vec<OwnedEvent>| v.into_iter().map(|e| e.kind).collect::<Vec<_>>();
        assert_eq!(
            kinds(m.map(Event::Attached {
                msr: "msr1".into(),
                connections: 0
            })),
            [ITCP_EVENT_ATTACHED]
        );
        assert_eq!(
            kinds(m.map(Event::Lost {
                from: "msr1".into()
            })),
            [ITCP_EVENT_DISCONNECTED]
        );
        let back = m.map(Event::Regained { msr: "msr1".into() });
        assert_eq!(back.len(), 1);
        assert_eq!(
            (
                back[0].kind,
                back[0].from_msr.as_str(),
                back[0].to_msr.as_str()
            ),
            (ITCP_EVENT_RECONNECTED, "msr1", "msr1")
        );
        // A regain without a loss says nothing; a move after a loss says both.
        assert!(m.map(Event::Regained { msr: "msr1".into() }).is_empty());
        m.map(Event::Lost {
            from: "msr1".into(),
        });
        let moved = m.map(Event::Moved {
            from: "msr1".into(),
            to: "msr2".into(),
            connections: 2,
            holding_ms: 1.0,
            moved_ms: 5.0,
        });
        assert_eq!(
            kinds(moved.clone()),
            [ITCP_EVENT_MOVED, ITCP_EVENT_RECONNECTED]
        );
        assert_eq!(moved[0].connections, 2);
        assert_eq!(moved[0].elapsed_ms, 5.0);
    }
}
