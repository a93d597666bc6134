//! The relay engine: moves bytes between the wireless-side and the fixed-side socket of
//! one I-TCP connection until both directions have ended, or until it is paused for a
//! handoff.
//!
//! * Zero copy: each direction splices socket → pipe → socket (user-space copy when
//!   splice is off).
//! * Half-close: end of stream on one side becomes `shutdown(SHUT_WR)` on the other,
//!   while the other direction keeps flowing.
//! * Abort: a reset on one side becomes a reset (RST, via SO_LINGER 0) on the other
//!   (done by the caller, which owns the sockets).
//! * Urgent data: passed on out of band at its place in the stream ([`urgent`]).
//! * Pause: the relay stops at its next wait and hands back the bytes it had read but
//!   not yet written ([`Pending`]), so that the sockets can be frozen and moved; a
//!   relay started with those bytes writes them first.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::sockopt;
use crate::splice::{splice, Pipe};
use crate::urgent;

/// How to relay.
#[derive(Debug, Clone)]
pub struct RelayOpts {
    pub splice: bool,
    pub pipe_size: usize,
    pub buffer_size: usize,
    /// The fixed side's receive buffer follows the wireless side
    /// ([`crate::sizing::FixedWindow`]).
    pub size_fixed: bool,
}

/// Bytes moved, per direction. Updated as bytes are delivered to the destination socket.
#[derive(Debug, Default)]
pub struct Counters {
    /// MH → FH.
    pub up: AtomicU64,
    /// FH → MH.
    pub down: AtomicU64,
}

/// Bytes a paused relay had taken from one socket and not yet given to the other.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Read from the wireless side, for the fixed side.
    pub up: Vec<u8>,
    /// Read from the fixed side, for the wireless side.
    pub down: Vec<u8>,
    /// A request handshake (whose `up`/`down` are its transcript): the secret of the
    /// key share it sent, so a replay elsewhere sends the same share.
    pub kx: Option<[u8; 32]>,
}

impl Pending {
    pub fn len(&self) -> usize {
        self.up.len() + self.down.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a relay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Both directions reached end of stream.
    Closed,
    /// The wireless side was reset or failed; the caller resets the fixed side.
    WirelessAborted,
    /// The wireless side timed out (TCP_USER_TIMEOUT: the MH is gone); the caller ends
    /// the fixed side with FIN.
    WirelessTimedOut,
    /// The fixed side was reset or failed; the caller resets the wireless side.
    FixedAborted,
    /// Paused on request; the sockets are untouched and these bytes are in transit.
    Paused(Pending),
}

/// Which socket of a direction failed.
enum Failure {
    Src(io::Error),
    Dst(io::Error),
}

/// How one direction stopped without failing.
enum Flow {
    Done,
    Paused(Vec<u8>),
}

/// The pause a handoff (or an upgrade) asks of a session's relay, and a watch of it
/// for whoever else serves the session.
///
/// A relay checks the flag in the same poll that waits for its sockets' readiness
/// ([`ready`]) and leaves the task's waker here: an idle relay holds no future per wait.
/// With a watch channel's `wait_for` beside tokio's `readable()`, each direction held
/// ~480 bytes of futures for the connection's whole life; the relay's future was
/// 2256 bytes with them and is 1184 without them and with its rare paths boxed
/// (`relay_future_stays_small`): it is the biggest part of msrd's memory per connection.
#[derive(Debug)]
pub struct Pause {
    on: AtomicBool,
    /// The relay task's, when it waits.
    waker: Mutex<Option<Waker>>,
    watch: watch::Sender<bool>,
}

impl Default for Pause {
    fn default() -> Self {
        Pause {
            on: AtomicBool::new(false),
            waker: Mutex::new(None),
            watch: watch::channel(false).0,
        }
    }
}

impl Pause {
    /// Asks for a pause (`true`) or takes it back; returns the previous state.
    pub fn send_replace(&self, on: bool) -> bool {
        let was = self.on.swap(on, Ordering::SeqCst);
        if on {
            if let Some(w) = self.waker.lock().unwrap().take() {
                w.wake();
            }
        }
        self.watch.send_replace(on);
        was
    }

    /// A watch of the pause, for tasks that wait with `wait_for`.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.watch.subscribe()
    }

    /// Whether a pause is asked; if not, the task of `cx` is woken when one is.
    fn poll_on(&self, cx: &mut Context<'_>) -> bool {
        if self.on.load(Ordering::SeqCst) {
            return true;
        }
        {
            let mut w = self.waker.lock().unwrap();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        // Asked between the first look and the waker's registration: seen now.
        self.on.load(Ordering::SeqCst)
    }
}

/// Waits until `s` is readable (or writable, `write`), unless a pause is asked first
/// (`None`). A poll function: no future of its own to keep (see [`Pause`]).
async fn ready(s: &TcpStream, write: bool, pause: &Pause) -> Option<io::Result<()>> {
    std::future::poll_fn(|cx| {
        if pause.poll_on(cx) {
            return Poll::Ready(None);
        }
        let r = if write {
            s.poll_write_ready(cx)
        } else {
            s.poll_read_ready(cx)
        };
        r.map(Some)
    })
    .await
}

/// Writes `buf` to `dst`, unless paused: then returns (a copy of) what is left.
async fn write_pending(
    dst: &TcpStream,
    buf: &[u8],
    pause: &Pause,
    count: &AtomicU64,
) -> Result<Option<Vec<u8>>, Failure> {
    let mut off = 0;
    while off < buf.len() {
        match dst.try_write(&buf[off..]) {
            Ok(m) => {
                off += m;
                count.fetch_add(m as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match ready(dst, true, pause).await {
                    // Copied only when paused: the normal path allocates nothing.
                    None => return Ok(Some(buf[off..].to_vec())),
                    Some(r) => r.map_err(Failure::Dst)?,
                }
            }
            Err(e) => return Err(Failure::Dst(e)),
        }
    }
    Ok(None)
}

/// At `src`'s urgent mark, with every byte before it written to `dst`: passes the
/// urgent byte on out of band. Ok(false): paused first (the byte stays in `src`).
async fn forward_urgent(
    src: &TcpStream,
    dst: &TcpStream,
    pause: &Pause,
    count: &AtomicU64,
) -> Result<bool, Failure> {
    // Room for the byte first, so that a pause never leaves it taken and unsent.
    match ready(dst, true, pause).await {
        None => return Ok(false),
        Some(r) => r.map_err(Failure::Dst)?,
    }
    let Some(b) = urgent::take(src.as_raw_fd()).map_err(Failure::Src)? else {
        return Ok(true);
    };
    let dfd = dst.as_raw_fd();
    loop {
        match dst.try_io(Interest::WRITABLE, || urgent::send(dfd, b)) {
            Ok(()) => {
                count.fetch_add(1, Ordering::Relaxed);
                return Ok(true);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                dst.writable().await.map_err(Failure::Dst)?
            }
            Err(e) => return Err(Failure::Dst(e)),
        }
    }
}

/// One direction: src → dst until end of stream, then shut dst's write side.
async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    opts: &RelayOpts,
    count: &AtomicU64,
    pending: Vec<u8>,
    pause: &Pause,
) -> Result<Flow, Failure> {
    // Bytes in transit come only with a moved connection: that path is boxed, as are
    // the other rare ones below, so as not to weigh on every idle relay's future.
    if !pending.is_empty() {
        if let Some(left) = Box::pin(write_pending(dst, &pending, pause, count)).await? {
            return Ok(Flow::Paused(left));
        }
    }
    let flow = match opts.splice {
        true => match pump_splice(src, dst, opts, count, pause).await? {
            Some(f) => f,
            None => Box::pin(pump_copy(src, dst, opts, count, pause)).await?,
        },
        false => pump_copy(src, dst, opts, count, pause).await?,
    };
    if let Flow::Done = flow {
        if crate::faults::fault("slow_fin") && Box::pin(slow_fin(pause)).await {
            // The end of stream stays in `src`: the relay that resumes reads it again.
            return Ok(Flow::Paused(Vec::new()));
        }
        sockopt::shutdown_write(dst).map_err(Failure::Dst)?;
    }
    Ok(flow)
}

/// Test hook (`MSRD_FAULT=slow_fin`, docs/testing.md): a relay slow to pass an end of
/// stream on (a busy runtime), for at most `MSRD_FAULT_DELAY_MS`, so that a handoff's
/// freeze can come between the MH's FIN and ours to the FH. True if paused meanwhile.
async fn slow_fin(pause: &Pause) -> bool {
    let wait = crate::faults::fault_delay().unwrap_or(std::time::Duration::from_millis(500));
    tracing::info!("MSRD_FAULT=slow_fin: an end of stream waits");
    let paused = std::future::poll_fn(|cx| match pause.poll_on(cx) {
        true => Poll::Ready(()),
        false => Poll::Pending,
    });
    tokio::time::timeout(wait, paused).await.is_ok()
}

/// Reads exactly `n` bytes out of a pipe (they are there: splice put them in).
fn drain_pipe(p: &Pipe, n: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    let mut off = 0;
    while off < n {
        match nix::unistd::read(&p.read, &mut v[off..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(r) => off += r,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(v)
}

/// Splices src → pipe → dst. Returns Ok(None) if no pipe could be had (fd limit):
/// the caller then copies through user space instead.
async fn pump_splice(
    src: &TcpStream,
    dst: &TcpStream,
    opts: &RelayOpts,
    count: &AtomicU64,
    pause: &Pause,
) -> Result<Option<Flow>, Failure> {
    // A pipe is held only while bytes are in flight through it: idle connections hold
    // none (two fds per connection instead of six), busy ones reuse pooled pipes.
    let mut pipe: Option<Lease> = None;
    let mut in_pipe = 0usize;
    let mut eof = false;
    let mut crossed = false;
    let (sfd, dfd) = (src.as_raw_fd(), dst.as_raw_fd());
    let result = loop {
        if eof && in_pipe == 0 {
            break Ok(Some(Flow::Done));
        }
        let mut read_blocked = eof;
        // Read only into an empty pipe: bytes wait in the source's receive queue, where
        // TCP's window holds the sender back, not in the pipe (up to `pipe_size`, 1 MiB,
        // per direction), which only grew msrd's queue towards a slow cell: more bytes
        // for a handoff to move and for the MH to wait behind.
        if !eof && in_pipe == 0 {
            if pipe.is_none() {
                match PIPES.take(opts.pipe_size) {
                    Ok(p) => pipe = Some(p),
                    Err(_) => break Ok(None),
                }
            }
            let p = pipe.as_ref().unwrap();
            let w = p.write.as_raw_fd();
            // Into an empty pipe, EAGAIN proves the socket empty: it may clear its
            // readiness (through try_io). Not just after an urgent byte was taken (see
            // below), whose EAGAIN already spent it.
            let r = if !crossed {
                src.try_io(Interest::READABLE, || splice(sfd, w, p.size))
            } else {
                splice(sfd, w, p.size)
            };
            crossed = false;
            match r {
                Ok(0) => eof = true,
                Ok(n) => in_pipe += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => read_blocked = true,
                Err(e) => break Err(Failure::Src(e)),
            }
            // splice(2) stops at an urgent mark (EAGAIN, the socket still readable):
            // the byte goes on out of band, a plain read gets past the mark.
            if read_blocked && in_pipe == 0 && urgent::at_mark(sfd).map_err(Failure::Src)? {
                if !Box::pin(forward_urgent(src, dst, pause, count)).await? {
                    break Ok(Some(Flow::Paused(Vec::new())));
                }
                let mut buf = vec![0u8; opts.buffer_size];
                match urgent::read(sfd, &mut buf) {
                    Ok(0) => eof = true,
                    Ok(n) => {
                        if let Some(left) =
                            Box::pin(write_pending(dst, &buf[..n], pause, count)).await?
                        {
                            break Ok(Some(Flow::Paused(left)));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => break Err(Failure::Src(e)),
                }
                // Its readiness was spent on the EAGAIN: try the socket itself next.
                crossed = true;
                continue;
            }
        }
        let waited = if in_pipe > 0 {
            let r: RawFd = pipe.as_ref().unwrap().read.as_raw_fd();
            match dst.try_io(Interest::WRITABLE, || splice(r, dfd, in_pipe)) {
                Ok(n) => {
                    in_pipe -= n;
                    count.fetch_add(n as u64, Ordering::Relaxed);
                    Some(Ok(()))
                }
                // Data is waiting for the destination: only its readiness matters (the
                // source may stay "readable" forever once its FIN is in).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready(dst, true, pause)
                    .await
                    .map(|r| r.map_err(Failure::Dst)),
                Err(e) => Some(Err(Failure::Dst(e))),
            }
        } else if read_blocked {
            // Empty pipe, nothing to read: give the pipe back while idle.
            if let Some(p) = pipe.take() {
                PIPES.give(p);
            }
            ready(src, false, pause)
                .await
                .map(|r| r.map_err(Failure::Src))
        } else {
            Some(Ok(()))
        };
        match waited {
            Some(Ok(())) => {}
            Some(Err(f)) => break Err(f),
            None => {
                let left = match &pipe {
                    Some(p) if in_pipe > 0 => drain_pipe(p, in_pipe).map_err(Failure::Src),
                    _ => Ok(Vec::new()),
                };
                match left {
                    Ok(v) => {
                        in_pipe = 0;
                        break Ok(Some(Flow::Paused(v)));
                    }
                    Err(f) => break Err(f),
                }
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
    /// Pipes held by relays now (bytes in flight through them).
    in_use: AtomicU64,
    /// Capacity of the pipes held by relays now, in bytes.
    in_use_bytes: AtomicU64,
    created: AtomicU64,
    /// Relays that found no pipe (fd limit) and copied through user space.
    fallbacks: AtomicU64,
}

/// Pipes kept at most (each an fd pair; their buffers are freed when empty).
const POOLED_PIPES: usize = 256;

static PIPES: PipePool = PipePool {
    pipes: std::sync::Mutex::new(Vec::new()),
    in_use: AtomicU64::new(0),
    in_use_bytes: AtomicU64::new(0),
    created: AtomicU64::new(0),
    fallbacks: AtomicU64::new(0),
};

/// The splice pipes of every relay in this process (metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipeStats {
    pub in_use: u64,
    pub in_use_bytes: u64,
    pub pooled: u64,
    pub created: u64,
    pub fallbacks: u64,
}

pub fn pipe_stats() -> PipeStats {
    let pooled = PIPES.pipes.lock().unwrap().len() as u64;
    PipeStats {
        in_use: PIPES.in_use.load(Ordering::Relaxed),
        in_use_bytes: PIPES.in_use_bytes.load(Ordering::Relaxed),
        pooled,
        created: PIPES.created.load(Ordering::Relaxed),
        fallbacks: PIPES.fallbacks.load(Ordering::Relaxed),
    }
}

impl PipePool {
    fn take(&'static self, size: usize) -> io::Result<Lease> {
        let p = match self.pipes.lock().unwrap().pop() {
            Some(p) => p,
            None => match Pipe::new(size) {
                Ok(p) => {
                    self.created.fetch_add(1, Ordering::Relaxed);
                    p
                }
                Err(e) => {
                    self.fallbacks.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            },
        };
        self.in_use.fetch_add(1, Ordering::Relaxed);
        self.in_use_bytes
            .fetch_add(p.size as u64, Ordering::Relaxed);
        Ok(Lease(Some(p)))
    }

    /// An empty pipe back for reuse.
    fn give(&self, mut l: Lease) {
        if let Some(p) = l.0.take() {
            self.put(p, true);
        }
    }

    fn put(&self, p: Pipe, reuse: bool) {
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        self.in_use_bytes
            .fetch_sub(p.size as u64, Ordering::Relaxed);
        let mut v = self.pipes.lock().unwrap();
        if reuse && v.len() < POOLED_PIPES {
            v.push(p);
        }
    }
}

/// A pipe held by a relay. Dropped without [`PipePool::give`] (bytes left in it, or
/// the relay cancelled), it is closed, not reused.
struct Lease(Option<Pipe>);

impl std::ops::Deref for Lease {
    type Target = Pipe;
    fn deref(&self) -> &Pipe {
        self.0
            .as_ref()
            .expect("a lease holds its pipe until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            PIPES.put(p, false);
        }
    }
}

async fn pump_copy(
    src: &TcpStream,
    dst: &TcpStream,
    opts: &RelayOpts,
    count: &AtomicU64,
    pause: &Pause,
) -> Result<Flow, Failure> {
    let mut buf = vec![0u8; opts.buffer_size];
    loop {
        match ready(src, false, pause).await {
            None => return Ok(Flow::Paused(Vec::new())),
            Some(r) => r.map_err(Failure::Src)?,
        }
        // A read skips the urgent byte: it goes on out of band first.
        if urgent::at_mark(src.as_raw_fd()).map_err(Failure::Src)?
            && !Box::pin(forward_urgent(src, dst, pause, count)).await?
        {
            return Ok(Flow::Paused(Vec::new()));
        }
        let n = match src.try_read(&mut buf) {
            Ok(0) => return Ok(Flow::Done),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(Failure::Src(e)),
        };
        if let Some(left) = write_pending(dst, &buf[..n], pause, count).await? {
            return Ok(Flow::Paused(left));
        }
    }
}

/// The fixed side's sizing of one relay: its state and its clock.
struct Sizer {
    window: crate::sizing::FixedWindow,
    every: tokio::time::Interval,
}

impl Sizer {
    fn new(fixed: &TcpStream) -> Sizer {
        let mut every = tokio::time::interval(crate::sizing::EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let window = crate::sizing::FixedWindow::starting_at(
            std::time::Instant::now(),
            // The kernel reports SO_RCVBUF doubled (its overhead).
            socket2::SockRef::from(fixed)
                .recv_buffer_size()
                .map_or(crate::sizing::MIN_BUFFER, |b| (b / 2) as u32),
        );
        Sizer { window, every }
    }
}

/// Waits for the sizer's next tick, then resizes (never ends without one).
async fn resize_on_tick(sizer: &mut Option<Box<Sizer>>, wireless: &TcpStream, fixed: &TcpStream) {
    let Some(s) = sizer.as_mut() else {
        return std::future::pending().await;
    };
    s.every.tick().await;
    size_fixed_window(wireless, fixed, &mut s.window);
}

/// Applies the fixed-side receive buffer that `window` computes from the sockets'
/// TCP_INFO. Best effort: a socket that cannot say keeps the buffer it has.
fn size_fixed_window(
    wireless: &TcpStream,
    fixed: &TcpStream,
    window: &mut crate::sizing::FixedWindow,
) {
    use itcp_handoff::repair::tcp_info;
    use std::os::fd::AsFd;
    let (Ok(w), Ok(f)) = (tcp_info(wireless.as_fd()), tcp_info(fixed.as_fd())) else {
        return;
    };
    let Some(rtt) = crate::sizing::path_rtt(&f) else {
        return;
    };
    let waiting = itcp_handoff::repair::inq(fixed.as_fd()).unwrap_or(1);
    let sample = crate::sizing::Sample {
        rate: w.delivery_rate,
        rtt,
        starved: w.app_limited
            && w.notsent_bytes == 0
            && waiting == 0
            && u128::from(f.last_data_recv_ms) * 1000 < 2 * rtt.as_micros(),
    };
    if let Some(bytes) = window.next(tokio::time::Instant::now().into_std(), sample) {
        // The clamp too: a buffer set by hand stops autotuning, which is what raises
        // the window clamp the connection started with (about 64 KB) as it grows.
        let r = sockopt::fix_recv_buffer(fixed, bytes)
            .and_then(|()| sockopt::set_window_clamp(fixed, bytes));
        if let Err(e) = r {
            tracing::debug!(error = %e, "fixed-side receive buffer not resized");
        }
    }
}

/// Relays until both directions have ended, one side aborts, or `pause` turns true.
/// The sockets stay open: the caller closes them (or resets the other side after an
/// abort, or freezes them after a pause). `pending` bytes are written first.
pub async fn relay(
    wireless: &TcpStream,
    fixed: &TcpStream,
    opts: &RelayOpts,
    counters: &Counters,
    pause: &Pause,
    pending: Pending,
) -> End {
    // Urgent bytes stay in the stream until the relay passes them on out of band
    // (`crate::urgent`): out of band, one not taken in time is dropped by the kernel.
    for s in [wireless, fixed] {
        if let Err(e) = crate::urgent::keep_inline(s) {
            tracing::debug!(error = %e, "urgent bytes not kept inline");
        }
    }
    let up = pump(wireless, fixed, opts, &counters.up, pending.up, pause);
    let down = pump(fixed, wireless, opts, &counters.down, pending.down, pause);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    let mut paused = Pending::default();
    let mut was_paused = false;
    // Boxed: the relay future stays small when the fixed side is not sized.
    let mut sizer = opts.size_fixed.then(|| Box::new(Sizer::new(fixed)));
    loop {
        let (res, from_wireless) = tokio::select! {
            r = &mut up, if !up_done => { up_done = true; (r, true) }
            r = &mut down, if !down_done => { down_done = true; (r, false) }
            _ = resize_on_tick(&mut sizer, wireless, fixed), if sizer.is_some() && !down_done => {
                continue;
            }
        };
        if let Err(Failure::Src(e) | Failure::Dst(e)) = &res {
            tracing::debug!(error = %e, up = from_wireless, "relay direction failed");
        }
        match (res, from_wireless) {
            (Ok(Flow::Done), _) => {}
            (Ok(Flow::Paused(v)), true) => {
                was_paused = true;
                paused.up = v;
            }
            (Ok(Flow::Paused(v)), false) => {
                was_paused = true;
                paused.down = v;
            }
            // Reading the wireless side or writing to it failed.
            (Err(Failure::Src(e)), true) | (Err(Failure::Dst(e)), false) => {
                return if e.kind() == io::ErrorKind::TimedOut {
                    End::WirelessTimedOut
                } else {
                    End::WirelessAborted
                };
            }
            (Err(Failure::Src(_)), false) | (Err(Failure::Dst(_)), true) => {
                return End::FixedAborted
            }
        }
        if up_done && down_done {
            // A direction that finished before the pause stays finished: its socket
            // state (EOF read, FIN sent) travels in the images.
            return if was_paused {
                End::Paused(paused)
            } else {
                End::Closed
            };
        }
    }
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
        crate::sockopt::apply_pre_connect(&relay_dst, &small).unwrap();
        crate::sockopt::apply_pre_connect(&app_dst, &small).unwrap();
        let opts = RelayOpts {
            splice,
            pipe_size: 1 << 20,
            buffer_size: 65536,
            size_fixed: false,
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
        let pause = Pause::default();
        let end = tokio::time::timeout(
            Duration::from_secs(20),
            relay(
                &relay_src,
                &relay_dst,
                &opts,
                &counters,
                &pause,
                Pending::default(),
            ),
        )
        .await
        .expect("relay stalled");
        drop((relay_src, relay_dst));
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

    /// How many bytes a relay holds itself when its destination's reader drains at
    /// 2 MB/s (a cell) and its source's writer is faster (a LAN): what went in and has
    /// not come out, less what the four sockets' buffers can hold.
    async fn held_by_the_relay(splice: bool) -> i64 {
        let (mut app_src, relay_src) = pair().await;
        let (relay_dst, mut app_dst) = pair().await;
        let small = itcp_config::TcpTuning {
            send_buffer: Some(65536),
            recv_buffer: Some(65536),
            ..Default::default()
        };
        for sock in [&app_src, &relay_src, &relay_dst, &app_dst] {
            crate::sockopt::apply_pre_connect(sock, &small).unwrap();
        }
        let buffers: usize = [&app_src, &relay_src, &relay_dst, &app_dst]
            .iter()
            .map(|t| {
                let s = socket2::SockRef::from(*t);
                s.send_buffer_size().unwrap() + s.recv_buffer_size().unwrap()
            })
            .sum();
        let opts = RelayOpts {
            splice,
            pipe_size: 1 << 20,
            buffer_size: 65536,
            size_fixed: false,
        };
        let counters = Counters::default();
        let pause = Pause::default();
        let relay = relay(
            &relay_src,
            &relay_dst,
            &opts,
            &counters,
            &pause,
            Pending::default(),
        );
        let until = Instant::now() + Duration::from_secs(3);
        let write = async {
            let chunk = [7u8; 16384];
            let mut written = 0;
            while Instant::now() < until {
                let left = until.saturating_duration_since(Instant::now());
                if let Ok(Ok(n)) = tokio::time::timeout(left, app_src.write(&chunk)).await {
                    written += n;
                }
            }
            written
        };
        let read = async {
            let mut buf = [0u8; 4096];
            let mut got = 0;
            while Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(2)).await;
                got += app_dst.read(&mut buf).await.unwrap();
            }
            got
        };
        let (written, got) = tokio::select! {
            wr = async { tokio::join!(write, read) } => wr,
            _ = relay => panic!("the relay ended"),
        };
        written as i64 - got as i64 - buffers as i64
    }

    /// A destination slower than the source (a cell behind a LAN): the bytes wait in
    /// the sockets, where TCP's windows hold the sender back, not in the relay's pipe.
    /// With reads into a non-empty pipe, the relay took far more than its 1 MiB pipe
    /// (3.8 MB: a pipe bounds buffer slots, not bytes).
    #[tokio::test]
    async fn a_slow_destination_holds_the_source_back_not_the_relay() {
        for splice in [true, false] {
            let held = held_by_the_relay(splice).await;
            // One read's worth (the source's receive queue) is all the relay may hold.
            assert!(
                held < 256 * 1024,
                "splice {splice}: the relay held {held} bytes beyond the sockets' buffers"
            );
        }
    }

    #[tokio::test]
    async fn reset_propagates() {
        let (app_src, relay_src) = pair().await;
        let (relay_dst, mut app_dst) = pair().await;
        let opts = RelayOpts {
            splice: true,
            pipe_size: 1 << 16,
            buffer_size: 4096,
            size_fixed: false,
        };
        let counters = Counters::default();
        let std_src = app_src.into_std().unwrap();
        crate::sockopt::abort_on_close(&std_src);
        drop(std_src);
        let pause = Pause::default();
        let end = relay(
            &relay_src,
            &relay_dst,
            &opts,
            &counters,
            &pause,
            Pending::default(),
        )
        .await;
        assert_eq!(end, End::WirelessAborted);
        crate::sockopt::abort_on_close(&relay_dst);
        drop(relay_dst);
        let mut b = [0u8; 8];
        let e = app_dst.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    }

    /// A pause mid-stream hands back every byte read and not yet written; a second
    /// relay started with them delivers the whole stream in order.
    async fn pause_and_resume(splice: bool) {
        let (mut app_src, relay_src) = pair().await;
        let (relay_dst, mut app_dst) = pair().await;
        let small = itcp_config::TcpTuning {
            send_buffer: Some(16384),
            recv_buffer: Some(16384),
            ..Default::default()
        };
        crate::sockopt::apply_pre_connect(&relay_dst, &small).unwrap();
        let opts = RelayOpts {
            splice,
            pipe_size: 1 << 20,
            buffer_size: 65536,
            size_fixed: false,
        };
        const N: usize = 4 << 20;
        let writer = tokio::spawn(async move {
            let data: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
            app_src.write_all(&data).await.unwrap();
            app_src.shutdown().await.unwrap();
            app_src
        });
        let reader = tokio::spawn(async move {
            let mut v = Vec::new();
            let mut buf = vec![0u8; 4096];
            loop {
                // Slow: the relay's destination stays full, so bytes sit in the pipe.
                tokio::time::sleep(Duration::from_micros(200)).await;
                match app_dst.read(&mut buf).await.unwrap() {
                    0 => break,
                    n => v.extend_from_slice(&buf[..n]),
                }
            }
            v
        });
        let counters = Counters::default();
        let pause = std::sync::Arc::new(Pause::default());
        let mut pending = Pending::default();
        let mut pauses = 0;
        loop {
            let t = tokio::spawn({
                let pause = pause.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    pause.send_replace(true);
                }
            });
            match relay(&relay_src, &relay_dst, &opts, &counters, &pause, pending).await {
                End::Paused(p) => {
                    pauses += 1;
                    pending = p;
                    t.await.unwrap();
                    pause.send_replace(false);
                }
                End::Closed => break,
                e => panic!("{e:?}"),
            }
        }
        drop((relay_src, relay_dst));
        let got = reader.await.unwrap();
        let _ = writer.await.unwrap();
        assert!(pauses > 2, "only {pauses} pauses");
        assert_eq!(got.len(), N);
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }

    /// Most relays are idle, waiting for their sockets, when a handoff freezes them:
    /// the pause must reach them there (the waker they left in it), at once.
    #[tokio::test]
    async fn an_idle_relay_sees_a_pause_at_once() {
        for splice in [true, false] {
            let (_app_a, relay_a) = pair().await;
            let (relay_b, _app_b) = pair().await;
            let opts = RelayOpts {
                splice,
                pipe_size: 1 << 16,
                buffer_size: 4096,
                size_fixed: false,
            };
            let (counters, pause) = (Counters::default(), std::sync::Arc::new(Pause::default()));
            let asker = {
                let pause = pause.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    pause.send_replace(true);
                    Instant::now()
                })
            };
            let end = tokio::time::timeout(
                Duration::from_secs(5),
                relay(
                    &relay_a,
                    &relay_b,
                    &opts,
                    &counters,
                    &pause,
                    Pending::default(),
                ),
            )
            .await
            .expect("the paused relay did not stop");
            let asked = asker.await.unwrap();
            assert_eq!(end, End::Paused(Pending::default()));
            assert!(
                asked.elapsed() < Duration::from_millis(100),
                "{:?}",
                asked.elapsed()
            );
        }
    }

    /// An idle relay's future stays allocated for its connection's whole life: its size
    /// is most of msrd's memory per connection (`bench conns`). 2256 bytes when each
    /// wait was a `readable()` raced against a watch channel's `wait_for`.
    #[tokio::test]
    async fn relay_future_stays_small() {
        let (a, b) = pair().await;
        let opts = RelayOpts {
            splice: true,
            pipe_size: 1 << 16,
            buffer_size: 4096,
            size_fixed: false,
        };
        let (counters, pause) = (Counters::default(), Pause::default());
        let f = relay(&a, &b, &opts, &counters, &pause, Pending::default());
        let size = std::mem::size_of_val(&f);
        eprintln!("relay future: {size} bytes");
        assert!(size <= 1400, "{size} bytes");
    }

    #[tokio::test]
    async fn splice_relay_pauses_and_resumes_without_loss() {
        pause_and_resume(true).await;
    }

    #[tokio::test]
    async fn copy_relay_pauses_and_resumes_without_loss() {
        pause_and_resume(false).await;
    }
}
