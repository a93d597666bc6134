//! Small safe wrappers over the socket calls the shim makes on the application's fds.
//! None of them goes through the shim's own interposed symbols: `socket`, `bind`,
//! `getsockname`, `getsockopt`, `fcntl`, `poll`, `fstat`, `dup3` and `shutdown` are not
//! interposed,
//! and `connect`/`getpeername`/`accept4`/`close` are called through [`crate::real`].

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use libc::{c_int, sockaddr, sockaddr_storage, socklen_t};

fn check(r: c_int) -> io::Result<c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A `sockaddr` of the caller as a `SocketAddr` (IPv4 and IPv6 only).
///
/// # Safety
/// `addr` is NULL or points to `len` readable bytes.
pub unsafe fn from_sockaddr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family field is readable (checked above).
    let family = unsafe { (*addr).sa_family } as c_int;
    match family {
        libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the caller's buffer holds a whole sockaddr_in; read_unaligned
            // copes with any alignment.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `addr` as a sockaddr of the socket family `family` (an IPv4 address on an IPv6
/// socket becomes `::ffff:a.b.c.d`). `None` for IPv6 on an IPv4 socket.
pub fn to_sockaddr(addr: SocketAddr, family: c_int) -> Option<(sockaddr_storage, socklen_t)> {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: sockaddr_storage = unsafe { zeroed() };
    let addr = match (addr, family) {
        (SocketAddr::V4(a), libc::AF_INET6) => {
            SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
        }
        (SocketAddr::V6(_), libc::AF_INET) => return None,
        (a, _) => a,
    };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is big and aligned enough for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
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
            // SAFETY: sockaddr_storage is big and aligned enough for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    Some((ss, len as socklen_t))
}

/// Stores `addr` as getpeername(2)/accept(2) do: at most `*len` bytes, then the full
/// size in `*len`. NULL pointers skip it.
///
/// # Safety
/// `out` is NULL or points to `*len` writable bytes; `len` is NULL or valid.
pub unsafe fn write_sockaddr(
    addr: SocketAddr,
    family: c_int,
    out: *mut sockaddr,
    len: *mut socklen_t,
) {
    if out.is_null() || len.is_null() {
        return;
    }
    let Some((ss, size)) = to_sockaddr(addr, family) else {
        return;
    };
    // SAFETY: the caller gives `*len` writable bytes at `out`; we copy no more.
    unsafe {
        let n = (*len).min(size) as usize;
        std::ptr::copy_nonoverlapping((&ss as *const sockaddr_storage).cast::<u8>(), out.cast(), n);
        *len = size;
    }
}

fn getsockopt_int(fd: RawFd, level: c_int, name: c_int) -> io::Result<c_int> {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: v and len are valid out-pointers of the sizes given.
    check(unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) })?;
    Ok(v)
}

/// SO_TYPE (SOCK_STREAM, …).
pub fn sock_type(fd: RawFd) -> io::Result<c_int> {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)
}

/// SO_DOMAIN (AF_INET, AF_INET6, …).
pub fn sock_family(fd: RawFd) -> io::Result<c_int> {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)
}

/// SO_ERROR: the pending error of a non-blocking connect.
pub fn so_error(fd: RawFd) -> io::Result<c_int> {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)
}

/// The socket's local address.
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: zeroed storage is valid; getsockname writes at most `len` bytes.
    let mut ss: sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: ss/len are valid out-pointers.
    check(unsafe { libc::getsockname(fd, (&mut ss as *mut sockaddr_storage).cast(), &mut len) })?;
    // SAFETY: ss holds `len` bytes written by the kernel.
    unsafe { from_sockaddr((&ss as *const sockaddr_storage).cast(), len) }
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

/// File status flags (O_NONBLOCK, …).
pub fn get_fl(fd: RawFd) -> io::Result<c_int> {
    // SAFETY: F_GETFL takes no argument.
    check(unsafe { libc::fcntl(fd, libc::F_GETFL) })
}

pub fn set_fl(fd: RawFd, flags: c_int) -> io::Result<()> {
    // SAFETY: F_SETFL takes an int.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }).map(|_| ())
}

/// Sets or clears FD_CLOEXEC.
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFD takes no argument.
    let f = check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    let f = if on {
        f | libc::FD_CLOEXEC
    } else {
        f & !libc::FD_CLOEXEC
    };
    // SAFETY: F_SETFD takes an int.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, f) }).map(|_| ())
}

/// Waits until `fd` is writable (a connect finished) or `timeout` passes.
pub fn wait_writable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as c_int;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(r > 0);
    }
}

/// SO_RCVTIMEO and SO_SNDTIMEO as they are, to put back after the handshake.
pub fn get_timeouts(fd: RawFd) -> io::Result<[libc::timeval; 2]> {
    let mut out = [libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    }; 2];
    for (i, name) in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO]
        .into_iter()
        .enumerate()
    {
        let mut len = size_of::<libc::timeval>() as socklen_t;
        // SAFETY: out[i] and len are valid out-pointers of the sizes given.
        check(unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut out[i] as *mut libc::timeval).cast(),
                &mut len,
            )
        })?;
    }
    Ok(out)
}

pub fn set_timeouts(fd: RawFd, t: &[libc::timeval; 2]) -> io::Result<()> {
    for (i, name) in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO]
        .into_iter()
        .enumerate()
    {
        // SAFETY: t[i] is a valid timeval of the size given.
        check(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&t[i] as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as socklen_t,
            )
        })?;
    }
    Ok(())
}

/// A socket's identity (device, inode): a closed and reused fd number has another.
pub fn identity(fd: RawFd) -> io::Result<(u64, u64)> {
    // SAFETY: an all-zero stat is valid; fstat only writes into it.
    let mut st: libc::stat = unsafe { zeroed() };
    // SAFETY: valid out-pointer; any fd number is fine (EBADF if closed).
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok((st.st_dev, st.st_ino))
}

/// Makes `dst` refer to the socket of `src` (dup3), with or without FD_CLOEXEC.
pub fn dup_onto(src: RawFd, dst: RawFd, cloexec: bool) -> io::Result<()> {
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: dup3 on two fds; `dst` is atomically replaced (the caller owns it).
    check(unsafe { libc::dup3(src, dst, flags) }).map(|_| ())
}

/// A new blocking TCP socket (FD_CLOEXEC) of `to`'s family.
pub fn stream_socket(to: SocketAddr) -> io::Result<OwnedFd> {
    let family = if to.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket(2) with constant arguments.
    let fd = check(unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a new socket nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds `fd` to `ip` with a port of the kernel's choosing.
pub fn bind_any_port(fd: RawFd, ip: std::net::IpAddr) -> io::Result<()> {
    let family = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let (sa, len) = to_sockaddr(SocketAddr::new(ip, 0), family)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?;
    // SAFETY: sa holds a sockaddr of len bytes.
    check(unsafe { libc::bind(fd, (&sa as *const sockaddr_storage).cast(), len) }).map(|_| ())
}

/// shutdown(2), errors ignored (used to end a socket's use, not to report).
pub fn shutdown_both(fd: RawFd) {
    // SAFETY: shutdown on any fd number is harmless (EBADF/ENOTSOCK at worst).
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_roundtrip_and_mapping() {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let (ss, len) = to_sockaddr(a, libc::AF_INET).unwrap();
        // SAFETY: ss holds len bytes.
        let back = unsafe { from_sockaddr((&ss as *const sockaddr_storage).cast(), len) };
        assert_eq!(back, Some(a));
        let (ss, len) = to_sockaddr(a, libc::AF_INET6).unwrap();
        // SAFETY: as above.
        let mapped = unsafe { from_sockaddr((&ss as *const sockaddr_storage).cast(), len) };
        assert_eq!(mapped, Some("[::ffff:10.0.0.1]:80".parse().unwrap()));
        assert!(to_sockaddr("[fd00::1]:80".parse().unwrap(), libc::AF_INET).is_none());
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { from_sockaddr(std::ptr::null(), 16) }, None);
    }
}
