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
    if !opts.splice || !pump_splice(src, dst, opts, count).await? {
        pump_copy(src, dst, opts, count).await?;
    }
    sockopt::shutdown_write(dst.as_raw_fd()).map_err(Failure::Dst)
}

/// Splices src → pipe → dst. Returns Ok(false) if no pipe could be had (fd limit):
/// the caller then copies through user space instead.
async fn pump_splice(
    src: &TcpStream,
    dst: &TcpStream,
    opts: &RelayOpts,
    count: &AtomicU64,
) -> Result<bool, Failure> {
    // A pipe is held only while bytes are in flight through it: idle connections hold
    // none (two fds per connection instead of six), busy ones reuse pooled pipes.
    let mut pipe: Option<Pipe> = None;
    let mut in_pipe = 0usize;
    let mut eof = false;
    let (sfd, dfd) = (src.as_raw_fd(), dst.as_raw_fd());
    let result = loop {
        if eof && in_pipe == 0 {
            break Ok(true);
        }
        let mut read_blocked = eof;
        if !eof {
            if pipe.is_none() {
                match PIPES.take(opts.pipe_size) {
                    Ok(p) => pipe = Some(p),
                    Err(_) => break Ok(false),
                }
            }
            let p = pipe.as_ref().unwrap();
            let w = p.write.as_raw_fd();
            // EAGAIN here means "no data" or "pipe full": a pipe holds at most 16..256
            // buffers, so it can be full long before `p.size` bytes.
            match src.try_io(Interest::READABLE, || splice(sfd, w, p.size)) {
                Ok(0) => eof = true,
                Ok(n) => in_pipe += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => read_blocked = true,
                Err(e) => break Err(Failure::Src(e)),
            }
        }
        if in_pipe > 0 {
            let r: RawFd = pipe.as_ref().unwrap().read.as_raw_fd();
            match dst.try_io(Interest::WRITABLE, || splice(r, dfd, in_pipe)) {
                Ok(n) => {
                    in_pipe -= n;
                    count.fetch_add(n as u64, Ordering::Relaxed);
                }
                // Data is waiting for the destination: only its readiness matters (the
                // source may stay "readable" forever once its FIN is in).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Err(e) = dst.writable().await {
                        break Err(Failure::Dst(e));
                    }
                }
                Err(e) => break Err(Failure::Dst(e)),
            }
        } else if read_blocked {
            // Empty pipe, nothing to read: give the pipe back while idle.
            if let Some(p) = pipe.take() {
                PIPES.give(p);
            }
            if let Err(e) = src.readable().await {
                break Err(Failure::Src(e));
            }
        }
    };
    // A pipe with bytes left in it (an aborted relay) is not reusable.
    if let Some(p) = pipe {
        if in_pipe == 0 {
            PIPES.give(p);
        }
    }
    result
}

/// Empty pipes kept for reuse, so busy connections do not create and destroy pipes
/// for every burst.
struct PipePool {
    pipes: std::sync::Mutex<Vec<Pipe>>,
}

/// Pipes kept at most (each an fd pair; their buffers are freed when empty).
const POOLED_PIPES: usize = 256;

static PIPES: PipePool = PipePool {
    pipes: std::sync::Mutex::new(Vec::new()),
};

impl PipePool {
    fn take(&self, size: usize) -> io::Result<Pipe> {
        if let Some(p) = self.pipes.lock().unwrap().pop() {
            return Ok(p);
        }
        Pipe::new(size)
    }

    fn give(&self, p: Pipe) {
        let mut v = self.pipes.lock().unwrap();
        if v.len() < POOLED_PIPES {
            v.push(p);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    /// Many small segments fill the pipe's buffer slots long before its byte size, and
    /// the source's FIN leaves it readable forever: the relay must still drain to a slow
    /// destination and finish (this once spun at 100 % CPU without progress).
    async fn slow_reader_small_segments(splice: bool) {
        let (mut app_src, relay_src) = pair().await;
        let (relay_dst, mut app_dst) = pair().await;
        // A small destination: its send buffer fills and stays full.
        let small = itcp_config::TcpTuning {
            send_buffer: Some(16384),
            recv_buffer: Some(16384),
            ..Default::default()
        };
        crate::sockopt::apply_pre_connect(relay_dst.as_raw_fd(), &small).unwrap();
        crate::sockopt::apply_pre_connect(app_dst.as_raw_fd(), &small).unwrap();
        let opts = RelayOpts {
            splice,
            pipe_size: 1 << 20,
            buffer_size: 65536,
        };
        let counters = Counters::default();
        let writer = tokio::spawn(async move {
            app_src.set_nodelay(true).unwrap();
            for i in 0..6000u32 {
                app_src.write_all(&[(i % 251) as u8; 700]).await.unwrap();
            }
            app_src.shutdown().await.unwrap();
            let mut rest = Vec::new();
            app_src.read_to_end(&mut rest).await.unwrap();
        });
        let reader = tokio::spawn(async move {
            let mut got = 0usize;
            let mut buf = [0u8; 8192];
            loop {
                tokio::time::sleep(Duration::from_micros(300)).await;
                match app_dst.read(&mut buf).await.unwrap() {
                    0 => break,
                    n => got += n,
                }
            }
            app_dst.shutdown().await.unwrap();
            got
        });
        let t0 = Instant::now();
        let end = tokio::time::timeout(
            Duration::from_secs(20),
            relay(relay_src, relay_dst, &opts, &counters),
        )
        .await
        .expect("relay stalled");
        assert_eq!(end, End::Closed);
        assert_eq!(reader.await.unwrap(), 6000 * 700);
        writer.await.unwrap();
        assert_eq!(counters.up.load(Ordering::Relaxed), 6000 * 700);
        assert!(t0.elapsed() < Duration::from_secs(20));
    }

    #[tokio::test]
    async fn splice_relay_drains_slow_destination_after_fin() {
        slow_reader_small_segments(true).await;
    }

    #[tokio::test]
    async fn copy_relay_drains_slow_destination_after_fin() {
        slow_reader_small_segments(false).await;
    }

    #[tokio::test]
    async fn reset_propagates() {
        let (app_src, relay_src) = pair().await;
        let (relay_dst, mut app_dst) = pair().await;
        let opts = RelayOpts {
            splice: true,
            pipe_size: 1 << 16,
            buffer_size: 4096,
        };
        let counters = Counters::default();
        let std_src = app_src.into_std().unwrap();
        crate::sockopt::abort_on_close(std_src.as_raw_fd());
        drop(std_src);
        let end = relay(relay_src, relay_dst, &opts, &counters).await;
        assert_eq!(end, End::WirelessAborted);
        let mut b = [0u8; 8];
        let e = app_dst.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    }
}
