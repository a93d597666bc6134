//! Pipes and splice(2): the zero-copy path of the relay. Bytes move socket → pipe →
//! socket inside the kernel, never through user space.

use std::io;
use std::os::fd::{OwnedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::unistd::pipe2;

/// A non-blocking pipe used as the splice buffer of one relay direction.
pub struct Pipe {
    pub read: OwnedFd,
    pub write: OwnedFd,
    /// Capacity in bytes (what F_SETPIPE_SZ granted).
    pub size: usize,
}

impl Pipe {
    /// Creates a pipe and asks for `size` bytes of capacity; if the kernel refuses
    /// (pipe-user-pages limits), the default 64 KiB pipe is kept.
    pub fn new(size: usize) -> io::Result<Pipe> {
        let (read, write) = pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(size as libc::c_int));
        let got = fcntl(&write, FcntlArg::F_GETPIPE_SZ).unwrap_or(0);
        Ok(Pipe {
            read,
            write,
            size: if got > 0 { got as usize } else { 65536 },
        })
    }
}

/// Moves up to `len` bytes from `from` to `to` without blocking; one of them must be a
/// pipe. Returns 0 at end of stream of `from`.
pub fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: null offsets are valid for sockets and pipes; the fds are open.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn splices_between_sockets() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l2.local_addr().unwrap()).unwrap();
        let (mut d, _) = l2.accept().unwrap();
        let p = Pipe::new(1 << 20).unwrap();
        assert!(p.size >= 65536);
        a.write_all(b"hello splice").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let n = splice(b.as_raw_fd(), p.write.as_raw_fd(), p.size).unwrap();
        assert_eq!(n, 12);
        assert_eq!(splice(p.read.as_raw_fd(), c.as_raw_fd(), n).unwrap(), 12);
        let mut buf = [0u8; 12];
        d.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello splice");
        // Nothing more to read: a non-blocking socket says so instead of waiting.
        b.set_nonblocking(true).unwrap();
        let e = splice(b.as_raw_fd(), p.write.as_raw_fd(), p.size).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}
