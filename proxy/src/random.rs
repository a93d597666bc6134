//! Random bytes from the kernel's CSPRNG (nonces, key-share secrets).

use std::io;

/// `N` bytes from getrandom(2).
pub fn bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b)
}
