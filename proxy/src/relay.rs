//! The relay engine: moves bytes between the wireless-side and the fixed-side socket of
//! one I-TCP connection until both directions have ended.
//!
//! * Zero copy: each direction splices socket → pipe → socket (user-space copy when
//!   splice is off).
//! * Half-close: end of stream on one side becomes `shutdown(SHUT_WR)` on the other,
//!   while the other direction keeps flowing.
//! * Abort: a reset on one side becomes a reset (RST, via SO_LINGER 0) on the other.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::sockopt;
use crate::splice::{splice, Pipe};

/// How to relay.
#[derive(Debug, Clone)]
pub struct RelayOpts {
    pub splice: bool,
    pub pipe_size: usize,
    pub buffer_size: usize,
}

/// Bytes moved, per direction. Updated as bytes are delivered to the destination socket.
#[derive(Debug, Default)]
pub struct Counters {
    /// MH → FH.
    pub up: AtomicU64,
    /// FH → MH.
    pub down: AtomicU64,
}

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Both directions reached end of stream.
    Closed,
    /// The wireless side was reset or failed; the fixed side was reset in turn.
    WirelessAborted,
    /// The fixed side was reset or failed; the wireless side was reset in turn.
    FixedAborted,
}

/// Which socket of a direction failed.
enum Failure {
    Src(io::Error),
    Dst(io::Error),
}

/// One direction: src → dst until end of stream, then shut dst's write side.
async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    opts: &RelayOpts,
    count: &AtomicU64,
) -> Result<(), Failure> {
    if opts.splice {
        pump_splice(src, dst, opts, count).await?;
    } else {
        pump_copy(src, dst, opts, count).await?;
    }
    sockopt::shutdown_write(dst.as_raw_fd()).map_err(Failure::Dst)
}

async fn pump_splice(
    src: &TcpStream,
    dst: &TcpStream,
    opts: &RelayOpts,
    count: &AtomicU64,
) -> Result<(), Failure> {
    // The pipe is made on first data, so idle connections hold no pipe.
    let mut pipe: Option<Pipe> = None;
    let mut in_pipe = 0usize;
    let mut eof = false;
    let (sfd, dfd) = (src.as_raw_fd(), dst.as_raw_fd());
    loop {
        if eof && in_pipe == 0 {
            return Ok(());
        }
        // Fill the pipe while there is room.
        if !eof {
            if pipe.is_none() {
                src.readable().await.map_err(Failure::Src)?;
                pipe = Some(Pipe::new(opts.pipe_size).map_err(Failure::Src)?);
            }
            let p = pipe.as_ref().unwrap();
            if in_pipe < p.size {
                let w = p.write.as_raw_fd();
                match src.try_io(Interest::READABLE, || splice(sfd, w, p.size - in_pipe)) {
                    Ok(0) => eof = true,
                    Ok(n) => in_pipe += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if in_pipe == 0 {
                            src.readable().await.map_err(Failure::Src)?;
                            continue;
                        }
                    }
                    Err(e) => return Err(Failure::Src(e)),
                }
            }
        }
        // Drain the pipe into the destination.
        if in_pipe > 0 {
            let r: RawFd = pipe.as_ref().unwrap().read.as_raw_fd();
            match dst.try_io(Interest::WRITABLE, || splice(r, dfd, in_pipe)) {
                Ok(n) => {
                    in_pipe -= n;
                    count.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let full = in_pipe >= pipe.as_ref().unwrap().size;
                    if full || eof {
                        dst.writable().await.map_err(Failure::Dst)?;
                    } else {
                        // Room in the pipe: wake for whichever side is ready first.
                        tokio::select! {
                            r = dst.writable() => r.map_err(Failure::Dst)?,
                            r = src.readable() => r.map_err(Failure::Src)?,
                        }
                    }
                }
                Err(e) => return Err(Failure::Dst(e)),
            }
        }
    }
}

async fn pump_copy(
    src: &TcpStream,
    dst: &TcpStream,
    opts: &RelayOpts,
    count: &AtomicU64,
) -> Result<(), Failure> {
    let mut buf = vec![0u8; opts.buffer_size];
    loop {
        src.readable().await.map_err(Failure::Src)?;
        let n = match src.try_read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(Failure::Src(e)),
        };
        let mut off = 0;
        while off < n {
            dst.writable().await.map_err(Failure::Dst)?;
            match dst.try_write(&buf[off..n]) {
                Ok(m) => {
                    off += m;
                    count.fetch_add(m as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(Failure::Dst(e)),
            }
        }
    }
}

/// Relays until both directions have ended or one side aborts. Consumes the sockets:
/// on return they are closed (FIN already sent for a clean end, RST for an abort).
pub async fn relay(
    wireless: TcpStream,
    fixed: TcpStream,
    opts: &RelayOpts,
    counters: &Counters,
) -> End {
    let up = pump(&wireless, &fixed, opts, &counters.up);
    let down = pump(&fixed, &wireless, opts, &counters.down);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    let end = loop {
        let (res, from_wireless) = tokio::select! {
            r = &mut up, if !up_done => { up_done = true; (r, true) }
            r = &mut down, if !down_done => { down_done = true; (r, false) }
        };
        if let Err(Failure::Src(e) | Failure::Dst(e)) = &res {
            tracing::debug!(error = %e, up = from_wireless, "relay direction failed");
        }
        match (res, from_wireless) {
            (Ok(()), _) => {
                if up_done && down_done {
                    break End::Closed;
                }
            }
            // Reading the wireless side or writing to it failed.
            (Err(Failure::Src(_)), true) | (Err(Failure::Dst(_)), false) => {
                break End::WirelessAborted
            }
            (Err(Failure::Src(_)), false) | (Err(Failure::Dst(_)), true) => {
                break End::FixedAborted
            }
        }
    };
    match end {
        End::WirelessAborted => sockopt::abort_on_close(fixed.as_raw_fd()),
        End::FixedAborted => sockopt::abort_on_close(wireless.as_raw_fd()),
        End::Closed => {}
    }
    end
}
