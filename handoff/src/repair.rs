//! Raw syscalls behind socket images: TCP_REPAIR and its queue, sequence, window and
//! option controls, the socket options an image carries, socket addresses, and the raw
//! socket that replays a peer's FIN.
//!
//! Every function here is a thin, safe wrapper around one or two syscalls. The rules of
//! *when* each may be called (the restore order, what repair mode allows) live in
//! [`crate::image`]; this module only gets the pointers and lengths right.
//!
//! Kernel facts these wrappers rely on (Linux `net/ipv4/tcp.c`):
//! * `TCP_REPAIR` needs CAP_NET_ADMIN and is refused on listening sockets.
//! * `TCP_QUEUE_SEQ` reads `write_seq` (send queue) or `rcv_nxt` (receive queue) of the
//!   queue chosen with `TCP_REPAIR_QUEUE`, and may only be *set* while the socket is
//!   still closed (before the repair-mode `connect`).
//! * `recv(MSG_PEEK)` in repair mode reads the chosen queue, including the send queue
//!   (sent-but-unacked and unsent bytes, in order).
//! * `send` in repair mode appends to the chosen queue: to the receive queue as if the
//!   bytes had arrived, to the send queue as if they had been sent (no packet leaves).
//! * `getsockopt(TCP_MAXSEG)` in repair mode returns the peer's MSS (`mss_clamp`).

use std::cell::RefCell;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, MsgFlags};
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use libc::{c_int, c_void, socklen_t};

// uapi/linux/tcp.h values that the libc crate does not carry.
const TCP_REPAIR_ON: c_int = 1;
const TCP_REPAIR_OFF: c_int = 0;
const TCP_REPAIR_OFF_NO_WP: c_int = -1;
const TCP_NO_QUEUE: c_int = 0;
const TCP_RECV_QUEUE: c_int = 1;
const TCP_SEND_QUEUE: c_int = 2;
/// TCP option kinds, as `TCP_REPAIR_OPTIONS` codes.
const TCPOPT_MAXSEG: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;
/// `SIOCINQ` and `SIOCOUTQ` are `FIONREAD` and `TIOCOUTQ` on sockets.
const SIOCINQ: libc::Ioctl = libc::FIONREAD;
const SIOCOUTQ: libc::Ioctl = libc::TIOCOUTQ;
const SIOCOUTQNSD: libc::Ioctl = 0x894B;
const SIOCGSKNS: libc::Ioctl = 0x894C;

/// `tcpi_options` bits.
pub const TCPI_OPT_TIMESTAMPS: u8 = 1;
pub const TCPI_OPT_SACK: u8 = 2;
pub const TCPI_OPT_WSCALE: u8 = 4;
/// The connection's timestamps count microseconds (Linux ≥ 6.7; never set before).
pub const TCPI_OPT_USEC_TS: u8 = 64;

/// Linux TCP states (`include/net/tcp_states.h`).
pub mod state {
    pub const ESTABLISHED: u8 = 1;
    pub const SYN_SENT: u8 = 2;
    pub const SYN_RECV: u8 = 3;
    pub const FIN_WAIT1: u8 = 4;
    pub const FIN_WAIT2: u8 = 5;
    pub const TIME_WAIT: u8 = 6;
    pub const CLOSE: u8 = 7;
    pub const CLOSE_WAIT: u8 = 8;
    pub const LAST_ACK: u8 = 9;
    pub const LISTEN: u8 = 10;
    pub const CLOSING: u8 = 11;
}

/// How to leave repair mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairOff {
    /// `TCP_REPAIR_OFF`: the kernel sends a window probe (an old-sequence ACK) so that
    /// the peer answers with its current ACK and window. Only sent in ESTABLISHED.
    WithProbe,
    /// `TCP_REPAIR_OFF_NO_WP`: leave silently.
    NoProbe,
}

/// The queue that repair-mode `TCP_QUEUE_SEQ`, `recv(MSG_PEEK)` and `send` act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// No queue: repair-mode `send` fails with EINVAL (a guard against stray writes).
    None,
    Recv,
    Send,
}

/// `struct tcp_repair_window`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawRepairWindow {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

/// `struct tcp_repair_opt`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RepairOpt {
    opt_code: u32,
    opt_val: u32,
}

/// The negotiated options `TCP_REPAIR_OPTIONS` can restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepairOptions {
    /// The peer's MSS (`mss_clamp`).
    pub mss: u32,
    /// Window scale: (ours applied to the peer's windows = snd, ours announced = rcv).
    pub wscale: Option<(u8, u8)>,
    pub sack: bool,
    pub timestamps: bool,
}

/// The fields of `struct tcp_info` an image needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpInfo {
    pub state: u8,
    pub options: u8,
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
    pub snd_mss: u32,
    pub snd_cwnd: u32,
    pub rtt_us: u32,
    /// Segments received so far (`tcpi_segs_in`), counted as they reach the socket.
    pub segs_in: u32,
    /// Milliseconds since data last arrived (`tcpi_last_data_recv`).
    pub last_data_recv_ms: u32,
    /// Segments with data received so far (`tcpi_data_segs_in`).
    pub data_segs_in: u32,
    /// The latest delivery rate sample, bytes/s (`tcpi_delivery_rate`).
    pub delivery_rate: u64,
    /// The smallest round trip seen, µs (`tcpi_min_rtt`); None before any sample,
    /// which the kernel reports as `u32::MAX` (a restored socket that only receives
    /// never takes one).
    pub min_rtt_us: Option<u32>,
    /// The receiver's estimate of the round trip, µs (`tcpi_rcv_rtt`, from timestamps
    /// or a window's arrival; 0 before any): the only one a socket that never sends
    /// data has once restored.
    pub rcv_rtt_us: u32,
    /// Bytes queued and not yet sent (`tcpi_notsent_bytes`).
    pub notsent_bytes: u32,
    /// The latest delivery rate sample was taken while the socket had too little to
    /// send to fill its window (`tcpi_delivery_rate_app_limited`): the rate says how
    /// fast the application fed it, not what the path carries.
    pub app_limited: bool,
}

fn cvt(ret: c_int) -> io::Result<c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Adds what was being done to an OS error, keeping its kind.
pub fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn setsockopt_raw<T>(fd: RawFd, level: c_int, name: c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live T for the duration of the call and its exact size
    // is passed along; the kernel only reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast::<c_void>(),
            size_of::<T>() as socklen_t,
        )
    })
    .map(drop)
}

fn getsockopt_raw<T: Copy>(fd: RawFd, level: c_int, name: c_int) -> io::Result<T> {
    let mut value = MaybeUninit::<T>::zeroed();
    let mut len = size_of::<T>() as socklen_t;
    // SAFETY: `value` is a writable buffer of `len` bytes, zero-initialised so that a
    // shorter answer from the kernel still leaves a valid T (all Ts used here are plain
    // integers or `repr(C)` structs of integers).
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            value.as_mut_ptr().cast::<c_void>(),
            &mut len,
        )
    })?;
    // SAFETY: zero-initialised above and possibly overwritten by the kernel: either way
    // a valid T of plain integers.
    Ok(unsafe { value.assume_init() })
}

/// Sets an integer socket option; `what` names it in errors.
pub fn set_int(
    fd: BorrowedFd<'_>,
    level: c_int,
    name: c_int,
    v: c_int,
    what: &str,
) -> io::Result<()> {
    setsockopt_raw(fd.as_raw_fd(), level, name, &v).map_err(|e| ctx(e, what))
}

/// Reads an integer socket option; `what` names it in errors.
pub fn get_int(fd: BorrowedFd<'_>, level: c_int, name: c_int, what: &str) -> io::Result<c_int> {
    getsockopt_raw::<c_int>(fd.as_raw_fd(), level, name).map_err(|e| ctx(e, what))
}

/// Reads a string socket option (`TCP_CONGESTION`, `SO_BINDTODEVICE`, `TCP_ULP`).
pub fn get_string(fd: BorrowedFd<'_>, level: c_int, name: c_int, what: &str) -> io::Result<String> {
    let mut buf = [0u8; 64];
    let mut len = buf.len() as socklen_t;
    // SAFETY: `buf` is writable for `len` bytes.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            buf.as_mut_ptr().cast::<c_void>(),
            &mut len,
        )
    })
    .map_err(|e| ctx(e, what))?;
    let bytes = &buf[..(len as usize).min(buf.len())];
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Sets a string socket option.
pub fn set_string(
    fd: BorrowedFd<'_>,
    level: c_int,
    name: c_int,
    v: &str,
    what: &str,
) -> io::Result<()> {
    // SAFETY: the bytes of `v` are readable for their length.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            v.as_ptr().cast::<c_void>(),
            v.len() as socklen_t,
        )
    })
    .map(drop)
    .map_err(|e| ctx(e, what))
}

/// Enters repair mode (`TCP_REPAIR_ON`).
pub fn repair_on(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_raw(
        fd.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR,
        &TCP_REPAIR_ON,
    )
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) {
            io::Error::new(
                e.kind(),
                format!(
                    "TCP_REPAIR on: {e} (needs CAP_NET_ADMIN in the socket's network \
                     namespace, and the socket must not be listening)"
                ),
            )
        } else {
            ctx(e, "TCP_REPAIR on")
        }
    })
}

/// Leaves repair mode.
pub fn repair_off(fd: BorrowedFd<'_>, how: RepairOff) -> io::Result<()> {
    let v = match how {
        RepairOff::WithProbe => TCP_REPAIR_OFF,
        RepairOff::NoProbe => TCP_REPAIR_OFF_NO_WP,
    };
    setsockopt_raw(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_REPAIR, &v)
        .map_err(|e| ctx(e, "TCP_REPAIR off"))
}

/// Whether the socket is in repair mode.
pub fn in_repair(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(get_int(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR,
        "getsockopt TCP_REPAIR",
    )? != 0)
}

/// Selects the queue later repair calls act on.
pub fn select_queue(fd: BorrowedFd<'_>, q: Queue) -> io::Result<()> {
    let v = match q {
        Queue::None => TCP_NO_QUEUE,
        Queue::Recv => TCP_RECV_QUEUE,
        Queue::Send => TCP_SEND_QUEUE,
    };
    set_int(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR_QUEUE,
        v,
        "TCP_REPAIR_QUEUE",
    )
}

/// `TCP_QUEUE_SEQ` of the selected queue: `write_seq` (send) or `rcv_nxt` (receive).
pub fn queue_seq(fd: BorrowedFd<'_>) -> io::Result<u32> {
    getsockopt_raw::<u32>(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_QUEUE_SEQ)
        .map_err(|e| ctx(e, "getsockopt TCP_QUEUE_SEQ"))
}

/// Sets `TCP_QUEUE_SEQ` of the selected queue (only before the repair-mode connect).
pub fn set_queue_seq(fd: BorrowedFd<'_>, seq: u32) -> io::Result<()> {
    setsockopt_raw(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_QUEUE_SEQ, &seq)
        .map_err(|e| ctx(e, "setsockopt TCP_QUEUE_SEQ"))
}

/// `TCP_REPAIR_WINDOW` (repair mode only).
pub fn repair_window(fd: BorrowedFd<'_>) -> io::Result<RawRepairWindow> {
    getsockopt_raw::<RawRepairWindow>(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_REPAIR_WINDOW)
        .map_err(|e| ctx(e, "getsockopt TCP_REPAIR_WINDOW"))
}

/// Sets `TCP_REPAIR_WINDOW`. The kernel refuses (EINVAL) a `rcv_wup` beyond `rcv_nxt`,
/// a `snd_wl1` beyond `rcv_nxt + rcv_wnd`, or `max_window < snd_wnd`.
pub fn set_repair_window(fd: BorrowedFd<'_>, w: &RawRepairWindow) -> io::Result<()> {
    setsockopt_raw(
        fd.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR_WINDOW,
        w,
    )
    .map_err(|e| ctx(e, "setsockopt TCP_REPAIR_WINDOW"))
}

/// Sets the negotiated options (`TCP_REPAIR_OPTIONS`). Only allowed right after the
/// repair-mode connect, while ESTABLISHED and before any byte was transmitted.
pub fn set_repair_options(fd: BorrowedFd<'_>, o: &RepairOptions) -> io::Result<()> {
    let mut opts = Vec::with_capacity(4);
    opts.push(RepairOpt {
        opt_code: TCPOPT_MAXSEG,
        opt_val: o.mss,
    });
    if let Some((snd, rcv)) = o.wscale {
        opts.push(RepairOpt {
            opt_code: TCPOPT_WINDOW,
            opt_val: u32::from(snd) | (u32::from(rcv) << 16),
        });
    }
    if o.sack {
        opts.push(RepairOpt {
            opt_code: TCPOPT_SACK_PERM,
            opt_val: 0,
        });
    }
    if o.timestamps {
        opts.push(RepairOpt {
            opt_code: TCPOPT_TIMESTAMP,
            opt_val: 0,
        });
    }
    // SAFETY: `opts` is a contiguous array of repr(C) pairs of u32, readable for the
    // length passed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR_OPTIONS,
            opts.as_ptr().cast::<c_void>(),
            (opts.len() * size_of::<RepairOpt>()) as socklen_t,
        )
    })
    .map(drop)
    .map_err(|e| ctx(e, "setsockopt TCP_REPAIR_OPTIONS"))
}

/// `TCP_TIMESTAMP`: the connection's current TSval clock (low bit: usec resolution).
pub fn timestamp(fd: BorrowedFd<'_>) -> io::Result<u32> {
    getsockopt_raw::<u32>(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_TIMESTAMP)
        .map_err(|e| ctx(e, "getsockopt TCP_TIMESTAMP"))
}

/// Sets the connection's TSval clock to `v` from now on (repair mode only).
pub fn set_timestamp(fd: BorrowedFd<'_>, v: u32) -> io::Result<()> {
    setsockopt_raw(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_TIMESTAMP, &v)
        .map_err(|e| ctx(e, "setsockopt TCP_TIMESTAMP"))
}

/// `TCP_INFO`, the fields we use.
pub fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<TcpInfo> {
    const N: usize = size_of::<libc::tcp_info>();
    let raw: [u8; N] = getsockopt_raw(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO)
        .map_err(|e| ctx(e, "getsockopt TCP_INFO"))?;
    // SAFETY: `raw` holds N bytes, the size of the plain-integer struct read from it
    // (unaligned: a byte array has no alignment).
    let i: libc::tcp_info = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
    Ok(TcpInfo {
        state: i.tcpi_state,
        options: i.tcpi_options,
        // `__u8 tcpi_snd_wscale : 4, tcpi_rcv_wscale : 4;` — snd is the low nibble.
        snd_wscale: i.tcpi_snd_rcv_wscale & 0x0f,
        rcv_wscale: i.tcpi_snd_rcv_wscale >> 4,
        snd_mss: i.tcpi_snd_mss,
        snd_cwnd: i.tcpi_snd_cwnd,
        rtt_us: i.tcpi_rtt,
        segs_in: i.tcpi_segs_in,
        last_data_recv_ms: i.tcpi_last_data_recv,
        data_segs_in: i.tcpi_data_segs_in,
        delivery_rate: i.tcpi_delivery_rate,
        rcv_rtt_us: i.tcpi_rcv_rtt,
        min_rtt_us: (i.tcpi_min_rtt != u32::MAX).then_some(i.tcpi_min_rtt),
        notsent_bytes: i.tcpi_notsent_bytes,
        // `__u8 tcpi_delivery_rate_app_limited:1, …` after the window scales: libc's
        // struct leaves that byte as padding, the raw bytes still hold it.
        app_limited: raw[7] & 1 == 1,
    })
}

fn ioctl_int(fd: BorrowedFd<'_>, req: libc::Ioctl, what: &str) -> io::Result<u32> {
    let mut v: c_int = 0;
    // SAFETY: these socket ioctls write one int through the pointer.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), req, &mut v as *mut c_int) })
        .map_err(|e| ctx(e, what))?;
    u32::try_from(v).map_err(|_| io::Error::other(format!("{what}: negative answer {v}")))
}

/// Bytes in the receive queue (`SIOCINQ`), not counting a received FIN.
pub fn inq(fd: BorrowedFd<'_>) -> io::Result<u32> {
    ioctl_int(fd, SIOCINQ, "SIOCINQ")
}

/// `write_seq - snd_una` (`SIOCOUTQ`): unacknowledged plus unsent, counting a queued FIN.
pub fn outq(fd: BorrowedFd<'_>) -> io::Result<u32> {
    ioctl_int(fd, SIOCOUTQ, "SIOCOUTQ")
}

/// `write_seq - snd_nxt` (`SIOCOUTQNSD`): not yet sent, counting an unsent FIN.
pub fn outq_notsent(fd: BorrowedFd<'_>) -> io::Result<u32> {
    ioctl_int(fd, SIOCOUTQNSD, "SIOCOUTQNSD")
}

/// `SO_NETNS_COOKIE` (Linux 5.14; not in every libc crate target).
const SO_NETNS_COOKIE: c_int = 71;

/// A socket's network namespace: its cookie (`SO_NETNS_COOKIE`, one call), or where
/// the kernel lacks it the (device, inode) of its nsfs file (`SIOCGSKNS`, which makes
/// and drops a descriptor: three calls, per replayed segment).
pub fn netns_of(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    match getsockopt_raw::<u64>(fd.as_raw_fd(), libc::SOL_SOCKET, SO_NETNS_COOKIE) {
        Ok(cookie) => return Ok((0, cookie)),
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {}
        Err(e) => return Err(ctx(e, "getsockopt SO_NETNS_COOKIE")),
    }
    use std::os::unix::fs::MetadataExt;
    // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor.
    let ns = cvt(unsafe { libc::ioctl(fd.as_raw_fd(), SIOCGSKNS) })
        .map_err(|e| ctx(e, "SIOCGSKNS (the socket's network namespace)"))?;
    // SAFETY: `ns` was just returned by the kernel and nobody else owns it.
    let m = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(ns) }).metadata()?;
    Ok((m.dev(), m.ino()))
}

/// `recv(MSG_PEEK | MSG_DONTWAIT)` into `buf`; in repair mode this reads the selected
/// queue without consuming it. The send queue is copied whole skb by whole skb and
/// the answer is their total even when `buf` is shorter (the rest is not copied).
pub fn peek(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    Ok(recv(
        fd.as_raw_fd(),
        buf,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    )?)
}

/// One `send(MSG_NOSIGNAL)`, `flags` added.
pub fn send(fd: BorrowedFd<'_>, buf: &[u8], flags: c_int) -> io::Result<usize> {
    let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::from_bits_truncate(flags);
    Ok(nix::sys::socket::send(fd.as_raw_fd(), buf, flags)?)
}

/// Waits until `fd` is writable or `timeout_ms` passes; false on timeout.
pub fn wait_writable(fd: BorrowedFd<'_>, timeout_ms: c_int) -> io::Result<bool> {
    let timeout = PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::MAX);
    loop {
        match poll(&mut [PollFd::new(fd, PollFlags::POLLOUT)], timeout) {
            Ok(n) => return Ok(n > 0),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// `shutdown(SHUT_WR)`.
pub fn shutdown_write(fd: BorrowedFd<'_>) -> io::Result<()> {
    SockRef::from(&fd)
        .shutdown(Shutdown::Write)
        .map_err(|e| ctx(e, "shutdown(SHUT_WR)"))
}

/// Sets or clears O_NONBLOCK.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    SockRef::from(&fd).set_nonblocking(on)
}

/// A new TCP socket (close-on-exec, blocking) of the address family of `addr`.
pub fn tcp_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map(OwnedFd::from)
    .map_err(|e| ctx(e, "socket(SOCK_STREAM)"))
}

fn ip_socket_addr(a: SockAddr) -> io::Result<SocketAddr> {
    a.as_socket().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not an IP socket (address family {})", a.family()),
        )
    })
}

/// The socket's local address.
pub fn local_addr(fd: BorrowedFd<'_>) -> io::Result<SocketAddr> {
    ip_socket_addr(
        SockRef::from(&fd)
            .local_addr()
            .map_err(|e| ctx(e, "getsockname"))?,
    )
}

/// The socket's peer address.
pub fn peer_addr(fd: BorrowedFd<'_>) -> io::Result<SocketAddr> {
    ip_socket_addr(
        SockRef::from(&fd)
            .peer_addr()
            .map_err(|e| ctx(e, "getpeername"))?,
    )
}

/// `bind(addr)`.
pub fn bind(fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
    SockRef::from(&fd)
        .bind(&(*addr).into())
        .map_err(|e| ctx(e, &format!("bind {addr}")))
}

/// `connect(addr)`; in repair mode this sends nothing and the socket is ESTABLISHED.
pub fn connect(fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
    SockRef::from(&fd)
        .connect(&(*addr).into())
        .map_err(|e| ctx(e, &format!("connect {addr} (repair mode)")))
}

thread_local! {
    /// Raw sockets for [`send_raw_ip_to`], by (IPv6, mark, namespace): opening and
    /// closing one per replayed segment cost ~8 µs, on every restart of a handoff.
    static RAW_SOCKS: RefCell<Vec<RawSock>> = const { RefCell::new(Vec::new()) };
}

struct RawSock {
    v6: bool,
    mark: u32,
    netns: (u64, u64),
    sock: Socket,
}

/// A raw socket (IPPROTO_RAW: header included) made in the calling thread's namespace.
fn raw_socket(v6: bool, mark: u32) -> io::Result<Socket> {
    // IPPROTO_RAW implies IP_HDRINCL (and IPV6_HDRINCL since Linux 4.5).
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let raw =
        Socket::new(domain, Type::RAW, Some(Protocol::from(libc::IPPROTO_RAW))).map_err(|e| {
            ctx(
                e,
                "socket(SOCK_RAW) to replay a segment (needs CAP_NET_RAW)",
            )
        })?;
    if mark != 0 {
        raw.set_mark(mark)
            .map_err(|e| ctx(e, "SO_MARK (raw socket)"))?;
    }
    Ok(raw)
}

/// Sends one complete IP packet (header included) to `dst` through a raw socket of the
/// network namespace of `target`, the socket the packet is meant for (from another
/// namespace it would be routed there, maybe out to a real network). The raw socket is
/// made by the calling thread, which must therefore be in that namespace the first
/// time; it is kept for the next packet. `mark` (if non-zero) is set as SO_MARK so that
/// netfilter rules can recognise the packet. Needs CAP_NET_RAW.
pub fn send_raw_ip_to(
    target: BorrowedFd<'_>,
    dst: &SocketAddr,
    packet: &[u8],
    mark: u32,
) -> io::Result<()> {
    let netns = netns_of(target)?;
    let v6 = dst.is_ipv6();
    // The kernel takes the destination from the packet; the port must be 0 for raw.
    let dst0 = match dst {
        SocketAddr::V4(a) => SocketAddr::V4(SocketAddrV4::new(*a.ip(), 0)),
        SocketAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(*a.ip(), 0, 0, a.scope_id())),
    };
    RAW_SOCKS.with(|socks| {
        let mut socks = socks.borrow_mut();
        let found = socks
            .iter()
            .position(|r| r.v6 == v6 && r.mark == mark && r.netns == netns);
        let at = match found {
            Some(at) => at,
            None => {
                let sock = raw_socket(v6, mark)?;
                if netns_of(sock.as_fd())? != netns {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the socket belongs to another network namespace than the calling \
                         thread; run this in the socket's own (a segment is replayed to the \
                         socket through a raw socket of the calling thread's namespace)",
                    ));
                }
                socks.push(RawSock {
                    v6,
                    mark,
                    netns,
                    sock,
                });
                socks.len() - 1
            }
        };
        let sent = socks[at].sock.send_to(packet, &dst0.into());
        let n = match sent {
            Ok(n) => n,
            Err(e) => {
                // Start afresh next time.
                socks.swap_remove(at);
                return Err(ctx(e, "sendto (raw segment replay)"));
            }
        };
        if n != packet.len() {
            return Err(io::Error::other(format!(
                "raw segment replay: sent {n} of {} bytes",
                packet.len()
            )));
        }
        Ok(())
    })
}

/// Checks that a network interface exists (for SO_BINDTODEVICE errors that say so).
pub fn interface_exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_socket_fed_a_few_bytes_reports_an_app_limited_rate() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(&[7; 100]).unwrap();
        let mut b = [0u8; 100];
        s.read_exact(&mut b).unwrap();
        // The ACK of those bytes gives the sender its rate sample.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let i = loop {
            let i = tcp_info(c.as_fd()).unwrap();
            if i.delivery_rate > 0 || std::time::Instant::now() > deadline {
                break i;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(i.delivery_rate > 0, "{i:?}");
        assert!(i.app_limited, "100 bytes cannot fill a window: {i:?}");
    }
}
