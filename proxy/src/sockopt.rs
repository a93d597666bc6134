//! Socket options msrd sets: transparency (IP_TRANSPARENT), the per-side TCP tuning of
//! the config, and the close behaviours (half-close, abort with RST).

use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;

use itcp_config::TcpTuning;

fn setsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
    what: &str,
) -> io::Result<()> {
    // SAFETY: value points to a live T and its size is passed along.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, v: i64, what: &str) -> io::Result<()> {
    let v = libc::c_int::try_from(v).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what}: {v} is too large"),
        )
    })?;
    setsockopt(fd, level, name, &v, what)
}

/// Lets the socket bind to, and accept traffic for, addresses that are not local: the
/// MH's address on the fixed side, the FH's on the transparent wireless side.
pub fn set_transparent(fd: RawFd, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        set_int(
            fd,
            libc::SOL_IPV6,
            libc::IPV6_TRANSPARENT,
            1,
            "IPV6_TRANSPARENT",
        )
    } else {
        set_int(fd, libc::SOL_IP, libc::IP_TRANSPARENT, 1, "IP_TRANSPARENT")
    }
}

/// An IPv6 socket for IPv6 only: `[::]:port` must not take IPv4's `0.0.0.0:port`.
pub fn set_v6only(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1, "IPV6_V6ONLY")
}

pub fn set_reuseaddr(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1, "SO_REUSEADDR")
}

/// Binds the socket to one interface (a cell).
pub fn bind_to_device(fd: RawFd, ifname: &str) -> io::Result<()> {
    // SAFETY: the name bytes are valid for their length.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            ifname.as_ptr().cast(),
            ifname.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("SO_BINDTODEVICE {ifname}: {e}"),
        ));
    }
    Ok(())
}

/// The interface a socket is bound to (SO_BINDTODEVICE), if any.
pub fn bound_device(fd: RawFd) -> io::Result<Option<String>> {
    let mut name = [0u8; libc::IFNAMSIZ];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: name and len are valid out-pointers for the given length.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let name = &name[..(len as usize).min(name.len())];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok((end > 0).then(|| String::from_utf8_lossy(&name[..end]).into_owned()))
}

/// Options that must be in place before the handshake (buffers decide the window scale).
pub fn apply_pre_connect(fd: RawFd, t: &TcpTuning) -> io::Result<()> {
    if let Some(b) = t.send_buffer.filter(|&b| b > 0) {
        set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, b as i64, "SO_SNDBUF")?;
    }
    if let Some(b) = t.recv_buffer.filter(|&b| b > 0) {
        set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, b as i64, "SO_RCVBUF")?;
    }
    if let Some(cc) = &t.congestion_control {
        set_congestion(fd, cc)?;
    }
    apply_post_connect(fd, t)
}

/// Options that may be set on an established socket.
pub fn apply_post_connect(fd: RawFd, t: &TcpTuning) -> io::Result<()> {
    if let Some(cc) = &t.congestion_control {
        set_congestion(fd, cc)?;
    }
    if let Some(c) = t.window_clamp.filter(|&c| c > 0) {
        set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            c as i64,
            "TCP_WINDOW_CLAMP",
        )?;
    }
    if let Some(l) = t.notsent_lowat {
        set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            l as i64,
            "TCP_NOTSENT_LOWAT",
        )?;
    }
    // On unless configured off: msrd cannot see whether the application turned Nagle
    // off, and a relay that batches small writes once per round trip delays every
    // interactive exchange (bulk writes are large and unaffected).
    {
        let n = t.nodelay.unwrap_or(true);
        set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            n as i64,
            "TCP_NODELAY",
        )?;
    }
    if let Some(idle) = t.keepalive_idle_s {
        set_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1, "SO_KEEPALIVE")?;
        set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_KEEPIDLE,
            idle as i64,
            "TCP_KEEPIDLE",
        )?;
        if let Some(i) = t.keepalive_interval_s {
            set_int(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_KEEPINTVL,
                i as i64,
                "TCP_KEEPINTVL",
            )?;
        }
        if let Some(c) = t.keepalive_count {
            set_int(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_KEEPCNT,
                c as i64,
                "TCP_KEEPCNT",
            )?;
        }
    }
    if let Some(u) = t.user_timeout_ms {
        set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            u as i64,
            "TCP_USER_TIMEOUT",
        )?;
    }
    Ok(())
}

pub fn set_congestion(fd: RawFd, name: &str) -> io::Result<()> {
    // SAFETY: the name bytes are valid for their length.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("TCP_CONGESTION {name:?}: {e} (see net.ipv4.tcp_allowed_congestion_control)"),
        ));
    }
    Ok(())
}

/// Sends FIN: no more data from us, the other direction stays open.
pub fn shutdown_write(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain shutdown on an open socket.
    if unsafe { libc::shutdown(fd, libc::SHUT_WR) } != 0 {
        let e = io::Error::last_os_error();
        // Already gone: nothing left to shut.
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// Makes the next close send RST instead of FIN (SO_LINGER with zero timeout).
pub fn abort_on_close(fd: RawFd) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &l, "SO_LINGER");
}

/// Undoes [`abort_on_close`]: the next close ends the connection with FIN, after the
/// bytes still queued.
/// Connections waiting in a listening socket's accept queue (`tcpi_unacked` of a
/// listener's `TCP_INFO`).
pub fn accept_backlog(fd: RawFd) -> io::Result<u32> {
    // SAFETY: all-zero is a valid tcp_info; the kernel fills at most `len` bytes.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
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

pub fn close_gracefully(fd: RawFd) {
    let l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &l, "SO_LINGER");
}

/// Raises the open-file limit as far as allowed: every relayed connection holds two
/// sockets and, while data flows, two pipes (six fds). Root may lift the hard limit up
/// to `fs.nr_open`; others get their hard limit.
pub fn raise_nofile_limit() -> u64 {
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid in/out pointer for getrlimit/setrlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if nr_open > r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: nr_open,
                rlim_max: nr_open,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return nr_open;
            }
        }
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur
}

/// The MAC address of an interface, asked of the kernel through a socket (so it is the
/// interface of the caller's network namespace, whatever /sys shows).
pub fn interface_mac(ifname: &str) -> io::Result<String> {
    #[repr(C)]
    struct IfReq {
        name: [libc::c_char; libc::IFNAMSIZ],
        addr: libc::sockaddr,
        _pad: [u8; 8],
    }
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {ifname:?}"),
        ));
    }
    // SAFETY: all-zero is a valid ifreq.
    let mut req: IfReq = unsafe { std::mem::zeroed() };
    for (d, b) in req.name.iter_mut().zip(ifname.bytes()) {
        *d = b as libc::c_char;
    }
    // SAFETY: a plain datagram socket, closed below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR fills an ifreq, which IfReq lays out.
    let r = unsafe { libc::ioctl(s, libc::SIOCGIFHWADDR, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: s is ours.
    unsafe { libc::close(s) };
    if r != 0 {
        return Err(io::Error::new(
            err.kind(),
            format!("interface {ifname}: {err}"),
        ));
    }
    let m: Vec<String> = req.addr.sa_data[..6]
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect();
    Ok(m.join(":"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_mac_and_unknown_interface() {
        assert_eq!(super::interface_mac("lo").unwrap(), "00:00:00:00:00:00");
        let e = super::interface_mac("nosuchif0").unwrap_err();
        assert!(e.to_string().contains("nosuchif0"), "{e}");
    }
}
