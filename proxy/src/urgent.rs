//! Urgent data (TCP's URG, MSG_OOB) across the relay. Telnet's interrupt and FTP's
//! ABOR send one byte as urgent; a router passes it on with its urgent pointer, so
//! msrd does too: where the stream reaches the urgent mark, the byte is taken out of
//! band from the source and sent out of band to the destination, after every byte
//! before it. A reader that keeps urgent bytes inline then sees the same stream as
//! over a direct path; one that does not gets the byte with MSG_OOB, as before.
//!
//! Three kernel facts shape the relay: splice(2) never reads past an urgent mark (it
//! says EAGAIN there, while the socket stays readable), so at a mark the relay reads
//! once through user space; and a socket that takes urgent bytes out of band drops one
//! not yet taken when the next urgent pointer arrives, so the relay's sockets keep
//! urgent bytes inline (SO_OOBINLINE, [`keep_inline`]) and the byte at the mark is read
//! as data: a relay at its mark may wait for room at the destination while the next
//! urgent byte arrives.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};

use socket2::SockRef;

/// `SIOCATMARK` (asm-generic/sockios.h; the libc crate lacks it).
const SIOCATMARK: libc::Ioctl = 0x8905;

/// Whether the next byte to read from `fd` is at the urgent mark (SIOCATMARK).
pub fn at_mark(fd: RawFd) -> io::Result<bool> {
    let mut v: libc::c_int = 0;
    // SAFETY: one int out; `fd` is open.
    let r = unsafe { libc::ioctl(fd, SIOCATMARK, &mut v as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v != 0)
}

/// Keeps `s`'s urgent bytes inline (SO_OOBINLINE): read at their place, never
/// dropped for a newer urgent pointer.
pub fn keep_inline(s: impl AsFd) -> io::Result<()> {
    SockRef::from(&s).set_out_of_band_inline(true)
}

/// Takes the urgent byte at the mark: out of band, or as the next byte of a socket
/// that keeps urgent bytes inline. `None`: it has not arrived yet or was taken already.
pub fn take(fd: RawFd) -> io::Result<Option<u8>> {
    if inline(fd)? {
        let mut b = [0u8; 1];
        return match read(fd, &mut b) {
            Ok(1) => Ok(Some(b[0])),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        };
    }
    let mut b = [0u8; 1];
    // SAFETY: one byte of a live buffer; `fd` is open.
    let r = unsafe {
        libc::recv(
            fd,
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_OOB | libc::MSG_DONTWAIT,
        )
    };
    if r == 1 {
        return Ok(Some(b[0]));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::EAGAIN) => Ok(None),
        _ if r == 0 => Ok(None),
        _ => Err(e),
    }
}

fn inline(fd: RawFd) -> io::Result<bool> {
    // SAFETY: `fd` is open for the duration of this call (the caller's socket).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    SockRef::from(&fd).out_of_band_inline()
}

/// Sends `b` as urgent data; WouldBlock when the send buffer is full.
pub fn send(fd: RawFd, b: u8) -> io::Result<()> {
    let buf = [b];
    // SAFETY: one byte of a live buffer; `fd` is open.
    let r = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            1,
            libc::MSG_OOB | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if r == 1 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A plain read past the mark (the kernel skips the urgent byte): Ok(0) at end of
/// stream, WouldBlock when nothing follows the mark yet.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a live buffer of that length; `fd` is open.
    let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        a.set_nodelay(true).unwrap();
        (a, b)
    }

    fn wait_at_mark(fd: RawFd) {
        for _ in 0..1000 {
            if at_mark(fd).unwrap() {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("never at the mark");
    }

    #[test]
    fn the_urgent_byte_is_taken_out_of_band_and_read_skips_it() {
        let (mut a, mut b) = pair();
        a.write_all(b"ab").unwrap();
        send(a.as_raw_fd(), b'!').unwrap();
        a.write_all(b"cd").unwrap();
        let mut two = [0u8; 2];
        b.read_exact(&mut two).unwrap();
        assert_eq!(&two, b"ab");
        wait_at_mark(b.as_raw_fd());
        assert_eq!(take(b.as_raw_fd()).unwrap(), Some(b'!'));
        // Taken once only.
        assert_eq!(take(b.as_raw_fd()).unwrap(), None);
        let mut buf = [0u8; 8];
        let mut got = Vec::new();
        while got.len() < 2 {
            match read(b.as_raw_fd(), &mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, b"cd");
        assert!(!at_mark(b.as_raw_fd()).unwrap());
    }

    /// Out of band, an urgent byte not taken yet is dropped when the next urgent
    /// pointer arrives; inline, it stays in the stream and the newer one is taken at
    /// its mark.
    #[test]
    fn inline_urgent_bytes_survive_a_newer_urgent_pointer() {
        for keep in [false, true] {
            let (mut a, mut b) = pair();
            if keep {
                keep_inline(&b).unwrap();
            }
            a.write_all(b"ab").unwrap();
            send(a.as_raw_fd(), b'1').unwrap();
            let mut two = [0u8; 2];
            b.read_exact(&mut two).unwrap();
            assert_eq!(&two, b"ab");
            // The reader sits at the first mark (as a relay waiting for room at its
            // destination) when the next urgent pointer arrives.
            wait_at_mark(b.as_raw_fd());
            a.write_all(b"c").unwrap();
            send(a.as_raw_fd(), b'2').unwrap();
            a.write_all(b"d").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            let mut got = Vec::new();
            let mut buf = [0u8; 8];
            while got.len() < if keep { 4 } else { 3 } {
                if at_mark(b.as_raw_fd()).unwrap() {
                    if let Some(u) = take(b.as_raw_fd()).unwrap() {
                        got.push(u);
                        continue;
                    }
                }
                let n = read(b.as_raw_fd(), &mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            if keep {
                assert_eq!(got, b"1c2d", "inline");
            } else {
                assert_eq!(got, b"c2d", "out of band: the first urgent byte is gone");
            }
        }
    }

    #[test]
    fn no_urgent_data_no_mark() {
        let (mut a, b) = pair();
        a.write_all(b"plain").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!at_mark(b.as_raw_fd()).unwrap());
        assert_eq!(take(b.as_raw_fd()).unwrap(), None);
    }
}
