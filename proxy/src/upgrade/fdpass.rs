//! Packets with file descriptors (SCM_RIGHTS) on a `SOCK_SEQPACKET` Unix socket: the
//! syscalls of an upgrade's hand-over, with safe wrappers. Blocking, with timeouts.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use super::wire::{MAX_FDS, MAX_PACKET};

/// A connected pair of `SOCK_SEQPACKET` sockets, close-on-exec.
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair(2) writes two fds into the array we own.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Limits how long a send or a receive on `fd` may block (None: forever).
pub fn set_timeout(fd: BorrowedFd<'_>, t: Option<Duration>) -> io::Result<()> {
    let t = t.unwrap_or_default();
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: setsockopt with a timeval that lives across the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Room for the control message of `n` fds.
fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is pure arithmetic.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// Sends one packet with `fds` (duplicated into the receiver; ours stay open).
pub fn send(sock: BorrowedFd<'_>, packet: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} fds in one packet (at most {MAX_FDS})", fds.len()),
        ));
    }
    let mut iov = libc::iovec {
        iov_base: packet.as_ptr() as *mut libc::c_void,
        iov_len: packet.len(),
    };
    // u64 elements keep the buffer aligned for cmsghdr.
    let mut cbuf = vec![0u64; cmsg_space(fds.len()).div_ceil(8)];
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_space(fds.len()) as _;
        // SAFETY: msg_control points at a buffer of msg_controllen bytes, enough for one
        // header and `fds.len()` fds (CMSG_SPACE); CMSG_FIRSTHDR is then non-null.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: msg describes buffers that live across the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return if r as usize == packet.len() {
                Ok(())
            } else {
                Err(io::Error::other("hand-over packet sent in part"))
            };
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one packet and the fds that came with it (close-on-exec). `Ok(None)` at
/// end of stream (the peer closed or exited).
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_PACKET + 1];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let space = cmsg_space(MAX_FDS);
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: msg describes buffers that live across the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Take ownership of every fd received first, so that none leaks on an error below.
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control; CMSG_FIRSTHDR/NXTHDR walk it within
    // msg_controllen, and each SCM_RIGHTS header is followed by its fds.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(p.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "hand-over packet with more fds than allowed",
        ));
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 || n > MAX_PACKET {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("hand-over packet larger than {MAX_PACKET} bytes"),
        ));
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    buf.truncate(n);
    Ok(Some((buf, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn packets_carry_working_fds() {
        let (a, b) = socketpair().unwrap();
        let (mut p, q) = std::os::unix::net::UnixStream::pair().unwrap();
        send(a.as_fd(), b"hello", &[q.as_raw_fd()]).unwrap();
        drop(q);
        let (pkt, fds) = recv(b.as_fd()).unwrap().unwrap();
        assert_eq!(pkt, b"hello");
        assert_eq!(fds.len(), 1);
        // The received fd is the same socket: what we write on p comes out of it.
        let mut q2 = std::os::unix::net::UnixStream::from(fds.into_iter().next().unwrap());
        p.write_all(b"x").unwrap();
        let mut got = [0u8; 1];
        q2.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
        // Packets keep their boundaries; no fds is fine; the end is None.
        send(a.as_fd(), b"one", &[]).unwrap();
        send(a.as_fd(), b"two", &[]).unwrap();
        assert_eq!(recv(b.as_fd()).unwrap().unwrap().0, b"one");
        assert_eq!(recv(b.as_fd()).unwrap().unwrap().0, b"two");
        drop(a);
        assert!(recv(b.as_fd()).unwrap().is_none());
    }

    #[test]
    fn a_receive_times_out() {
        let (_a, b) = socketpair().unwrap();
        set_timeout(b.as_fd(), Some(Duration::from_millis(20))).unwrap();
        let e = recv(b.as_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}
