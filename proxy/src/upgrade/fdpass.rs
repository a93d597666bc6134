//! Packets with file descriptors (SCM_RIGHTS) on a `SOCK_SEQPACKET` Unix socket: the
//! syscalls of an upgrade's hand-over, with safe wrappers. Blocking, with timeouts.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair as nix_socketpair, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use socket2::SockRef;

use super::wire::{MAX_FDS, MAX_PACKET};

/// A connected pair of `SOCK_SEQPACKET` sockets, close-on-exec.
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix_socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?)
}

/// Limits how long a send or a receive on `fd` may block (None: forever).
pub fn set_timeout(fd: BorrowedFd<'_>, t: Option<Duration>) -> io::Result<()> {
    let s = SockRef::from(&fd);
    s.set_read_timeout(t)?;
    s.set_write_timeout(t)
}

/// Sends one packet with `fds` (duplicated into the receiver; ours stay open).
pub fn send(sock: BorrowedFd<'_>, packet: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} fds in one packet (at most {MAX_FDS})", fds.len()),
        ));
    }
    let iov = [IoSlice::new(packet)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs = if fds.is_empty() { &[][..] } else { &rights[..] };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) if n == packet.len() => return Ok(()),
            Ok(_) => return Err(io::Error::other("hand-over packet sent in part")),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one packet and the fds that came with it (close-on-exec). `Ok(None)` at
/// end of stream (the peer closed or exited).
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_PACKET + 1];
    let mut cbuf = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (n, flags, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cbuf),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        // Take ownership of every fd received first, so that none leaks on an error below.
        let mut fds = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(rights) = c {
                // SAFETY: the kernel just installed these fds for us alone.
                fds.extend(
                    rights
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        break (msg.bytes, msg.flags, fds);
    };
    if flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "hand-over packet with more fds than allowed",
        ));
    }
    if flags.contains(MsgFlags::MSG_TRUNC) || n > MAX_PACKET {
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
