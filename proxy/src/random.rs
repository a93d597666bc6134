//! Random bytes from the kernel's CSPRNG (nonces, key-share secrets).

use std::io;

/// `N` bytes from getrandom(2).
pub fn bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut at = 0;
    while at < N {
        // SAFETY: getrandom writes at most `N - at` bytes into the rest of our buffer.
        let n = unsafe { libc::getrandom(b[at..].as_mut_ptr().cast(), N - at, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        at += n as usize;
    }
    Ok(b)
}
