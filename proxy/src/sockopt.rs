//! Socket options msrd sets: transparency (IP_TRANSPARENT), the per-side TCP tuning of
//! the config, and the close behaviours (half-close, abort with RST). socket2 sets the
//! options it knows; the two it does not (TCP_WINDOW_CLAMP, a listener's TCP_INFO) are
//! small libc wrappers below.

use std::io;
use std::mem::size_of;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use itcp_config::TcpTuning;
use socket2::{SockRef, TcpKeepalive};

/// Names the option in an error, keeping the OS error's kind.
fn named(what: &str) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Lets the socket bind to, and accept traffic for, addresses that are not local: the
/// MH's address on the fixed side, the FH's on the transparent wireless side.
pub fn set_transparent(fd: impl AsFd, ipv6: bool) -> io::Result<()> {
    let s = SockRef::from(&fd);
    if ipv6 {
        s.set_ip_transparent_v6(true)
            .map_err(named("IPV6_TRANSPARENT"))
    } else {
        s.set_ip_transparent_v4(true)
            .map_err(named("IP_TRANSPARENT"))
    }
}

/// An IPv6 socket for IPv6 only: `[::]:port` must not take IPv4's `0.0.0.0:port`.
pub fn set_v6only(fd: impl AsFd) -> io::Result<()> {
    SockRef::from(&fd)
        .set_only_v6(true)
        .map_err(named("IPV6_V6ONLY"))
}

pub fn set_reuseaddr(fd: impl AsFd) -> io::Result<()> {
    SockRef::from(&fd)
        .set_reuse_address(true)
        .map_err(named("SO_REUSEADDR"))
}

/// Binds the socket to one interface (a cell).
pub fn bind_to_device(fd: impl AsFd, ifname: &str) -> io::Result<()> {
    SockRef::from(&fd)
        .bind_device(Some(ifname.as_bytes()))
        .map_err(|e| io::Error::new(e.kind(), format!("SO_BINDTODEVICE {ifname}: {e}")))
}

/// The interface a socket is bound to (SO_BINDTODEVICE), if any.
pub fn bound_device(fd: impl AsFd) -> io::Result<Option<String>> {
    Ok(SockRef::from(&fd)
        .device()?
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(&n).into_owned()))
}

/// Options that must be in place before the handshake (buffers decide the window scale).
pub fn apply_pre_connect(fd: impl AsFd, t: &TcpTuning) -> io::Result<()> {
    let s = SockRef::from(&fd);
    if let Some(b) = t.send_buffer.filter(|&b| b > 0) {
        s.set_send_buffer_size(b as usize)
            .map_err(named("SO_SNDBUF"))?;
    }
    if let Some(b) = t.recv_buffer.filter(|&b| b > 0) {
        s.set_recv_buffer_size(b as usize)
            .map_err(named("SO_RCVBUF"))?;
    }
    apply_post_connect(fd, t)
}

/// Options that may be set on an established socket.
pub fn apply_post_connect(fd: impl AsFd, t: &TcpTuning) -> io::Result<()> {
    let s = SockRef::from(&fd);
    if let Some(cc) = &t.congestion_control {
        set_congestion(&fd, cc)?;
    }
    if let Some(c) = t.window_clamp.filter(|&c| c > 0) {
        set_window_clamp(&fd, c)?;
    }
    if let Some(l) = t.notsent_lowat {
        s.set_tcp_notsent_lowat(l)
            .map_err(named("TCP_NOTSENT_LOWAT"))?;
    }
    // On unless configured off: msrd cannot see whether the application turned Nagle
    // off, and a relay that batches small writes once per round trip delays every
    // interactive exchange (bulk writes are large and unaffected).
    s.set_tcp_nodelay(t.nodelay.unwrap_or(true))
        .map_err(named("TCP_NODELAY"))?;
    if let Some(idle) = t.keepalive_idle_s {
        let mut k = TcpKeepalive::new().with_time(Duration::from_secs(idle as u64));
        if let Some(i) = t.keepalive_interval_s {
            k = k.with_interval(Duration::from_secs(i as u64));
        }
        if let Some(c) = t.keepalive_count {
            k = k.with_retries(c);
        }
        s.set_tcp_keepalive(&k)
            .map_err(named("SO_KEEPALIVE/TCP_KEEPIDLE/TCP_KEEPINTVL/TCP_KEEPCNT"))?;
    }
    if let Some(u) = t.user_timeout_ms {
        s.set_tcp_user_timeout(Some(Duration::from_millis(u as u64)))
            .map_err(named("TCP_USER_TIMEOUT"))?;
    }
    Ok(())
}

/// TCP_WINDOW_CLAMP, which socket2 does not cover: the most receive window the socket
/// offers (it may be changed on an established socket, down as well as up).
pub fn set_window_clamp(fd: impl AsFd, v: u32) -> io::Result<()> {
    let fd = fd.as_fd().as_raw_fd();
    let v = libc::c_int::try_from(v).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("TCP_WINDOW_CLAMP: {v} is too large"),
        )
    })?;
    // SAFETY: v is a live c_int and its size is passed along.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(named("TCP_WINDOW_CLAMP")(io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets the socket's receive buffer to `bytes` as SO_RCVBUF does (the kernel doubles
/// it for its overhead), past `net.core.rmem_max` where allowed (SO_RCVBUFFORCE, with
/// CAP_NET_ADMIN). A buffer set by hand is no longer autotuned.
pub fn fix_recv_buffer(fd: impl AsFd, bytes: u32) -> io::Result<()> {
    let raw = fd.as_fd().as_raw_fd();
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: v is a live c_int and its size is passed along.
        let r = unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return Ok(());
        }
    }
    Err(named("SO_RCVBUF")(io::Error::last_os_error()))
}

pub fn set_congestion(fd: impl AsFd, name: &str) -> io::Result<()> {
    SockRef::from(&fd)
        .set_tcp_congestion(name.as_bytes())
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "TCP_CONGESTION {name:?}: {e} (see net.ipv4.tcp_allowed_congestion_control)"
                ),
            )
        })
}

/// Sends FIN: no more data from us, the other direction stays open.
pub fn shutdown_write(fd: impl AsFd) -> io::Result<()> {
    match SockRef::from(&fd).shutdown(Shutdown::Write) {
        // Already gone: nothing left to shut.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(()),
        r => r,
    }
}

/// Makes the next close send RST instead of FIN (SO_LINGER with zero timeout).
pub fn abort_on_close(fd: impl AsFd) {
    let _ = SockRef::from(&fd).set_linger(Some(Duration::ZERO));
}

/// Undoes [`abort_on_close`]: the next close ends the connection with FIN, after the
/// bytes still queued.
pub fn close_gracefully(fd: impl AsFd) {
    let _ = SockRef::from(&fd).set_linger(None);
}

/// Connections waiting in a listening socket's accept queue (`tcpi_unacked` of a
/// listener's `TCP_INFO`, which socket2 does not cover).
pub fn accept_backlog(fd: RawFd) -> io::Result<u32> {
    // SAFETY: all-zero is a valid tcp_info; the kernel fills at most `len` bytes.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `ti` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut ti as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ti.tcpi_unacked)
}

/// Raises the open-file limit as far as allowed: every relayed connection holds two
/// sockets and, while data flows, two pipes (six fds). Root may lift the hard limit up
/// to `fs.nr_open`; others get their hard limit.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource::RLIMIT_NOFILE};
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let Ok((cur, max)) = getrlimit(RLIMIT_NOFILE) else {
        return 0;
    };
    if nr_open > max && setrlimit(RLIMIT_NOFILE, nr_open, nr_open).is_ok() {
        return nr_open;
    }
    let _ = setrlimit(RLIMIT_NOFILE, max, max);
    getrlimit(RLIMIT_NOFILE).map_or(cur, |(c, _)| c)
}
