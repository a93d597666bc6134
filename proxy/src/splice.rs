//! Pipes and splice(2): the zero-copy path of the relay. Bytes move socket → pipe →
//! socket inside the kernel, never through user space.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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
        let mut fds = [0; 2];
        // SAFETY: fds is a valid 2-element array for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 just returned these two fds, owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: F_SETPIPE_SZ/F_GETPIPE_SZ take an int argument on a pipe fd.
        let got = unsafe {
            libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size as libc::c_int);
            libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
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
