//! The async (tokio) flavour: [`ItcpStream`] and [`ItcpListener`], same semantics as
//! the blocking ones at the crate root.
//!
//! Timeouts use `tokio::time`, so the runtime needs its time driver (`#[tokio::main]`
//! and `Builder::enable_all` have it). Resolving the gateway and the token reads small
//! files (`/proc/net/route`, the token file) synchronously.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, ToSocketAddrs};

use crate::blocking::{nonzero, phase_timeout};
use crate::handshake::{self, Handshake, Step};
use crate::options::MhOptions;
use crate::socks::{Addr, Command, Token};

/// An I-TCP connection (async). After the handshake it is an ordinary tokio
/// [`TcpStream`] to the peer: it implements [`AsyncRead`] and [`AsyncWrite`] (a write
/// shutdown — [`AsyncWriteExt::shutdown`] — reaches the peer as a FIN through the MSR),
/// and [`into_inner`](Self::into_inner) hands out the socket.
#[derive(Debug)]
pub struct ItcpStream {
    inner: TcpStream,
    target: Addr,
    bound: Addr,
    gateway: SocketAddr,
}

impl ItcpStream {
    /// Opens an I-TCP connection to `addr` through the gateway found by
    /// `MhOptions::from_env()`. `addr` is resolved here and each address tried in turn,
    /// as in [`crate::ItcpStream::connect`].
    pub async fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<ItcpStream> {
        Self::connect_with(&MhOptions::from_env()?, addr).await
    }

    /// [`connect`](Self::connect) with explicit options.
    pub async fn connect_with<A: ToSocketAddrs>(
        opts: &MhOptions,
        addr: A,
    ) -> io::Result<ItcpStream> {
        let gateway = opts.resolve_gateway()?;
        let token = opts.resolve_token()?;
        let mut last_err = None;
        for target in tokio::net::lookup_host(addr).await? {
            match open(opts, gateway, token, Command::Connect, Addr::Ip(target)).await {
                Ok(s) => return Ok(s),
                Err((e, true)) => last_err = Some(e),
                Err((e, false)) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "could not resolve to any addresses",
            )
        }))
    }

    /// Opens an I-TCP connection to `target` as given: an [`Addr::Domain`] is resolved
    /// by the MSR.
    pub async fn connect_target(opts: &MhOptions, target: Addr) -> io::Result<ItcpStream> {
        let gateway = opts.resolve_gateway()?;
        let token = opts.resolve_token()?;
        open(opts, gateway, token, Command::Connect, target)
            .await
            .map_err(|(e, _)| e)
    }

    /// The peer's address (see [`crate::ItcpStream::peer_addr`]).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.target.socket_addr().ok_or_else(|| {
            io::Error::other(format!(
                "peer {} was resolved by the I-TCP gateway; its address is not known here",
                self.target
            ))
        })
    }

    /// The local address of the socket.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The peer as requested (connect) or reported by the MSR (accept).
    pub fn target(&self) -> &Addr {
        &self.target
    }

    /// BND.ADDR/BND.PORT of the MSR's success reply.
    pub fn bound_addr(&self) -> &Addr {
        &self.bound
    }

    /// The gateway this connection goes through.
    pub fn gateway(&self) -> SocketAddr {
        self.gateway
    }

    /// Sends a FIN and closes the connection.
    pub async fn close(mut self) -> io::Result<()> {
        match self.inner.shutdown().await {
            Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e),
            _ => Ok(()),
        }
    }

    /// Sets TCP_NODELAY.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.set_nodelay(nodelay)
    }

    /// The underlying socket.
    pub fn get_ref(&self) -> &TcpStream {
        &self.inner
    }

    /// The underlying socket, mutably.
    pub fn get_mut(&mut self) -> &mut TcpStream {
        &mut self.inner
    }

    /// The underlying socket: from here on an ordinary tokio `TcpStream` to the peer.
    pub fn into_inner(self) -> TcpStream {
        self.inner
    }
}

impl AsyncRead for ItcpStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ItcpStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl AsRawFd for ItcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl AsFd for ItcpStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl From<ItcpStream> for TcpStream {
    fn from(s: ItcpStream) -> TcpStream {
        s.inner
    }
}

/// A listener the MSR keeps on this MH's address (async; see
/// [`crate::ItcpListener`]). Dropping it closes the listener at the MSR; `accept` may
/// run concurrently from several tasks on a shared `&ItcpListener`.
#[derive(Debug)]
pub struct ItcpListener {
    control: TcpStream,
    local: SocketAddr,
    gateway: SocketAddr,
    token: Token,
    opts: MhOptions,
}

impl ItcpListener {
    /// Asks the MSR to listen on this MH's address, port `port` (0: the MSR picks).
    pub async fn bind(port: u16) -> io::Result<ItcpListener> {
        Self::bind_with(&MhOptions::from_env()?, port).await
    }

    /// [`bind`](Self::bind) with explicit options.
    pub async fn bind_with(opts: &MhOptions, port: u16) -> io::Result<ItcpListener> {
        let gateway = opts.resolve_gateway()?;
        let token = opts.resolve_token()?;
        let addr = handshake::any_addr_for(gateway, port);
        let control = open(opts, gateway, token, Command::Listen, addr)
            .await
            .map_err(|(e, _)| e)?;
        let local = control.bound.socket_addr().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "I-TCP gateway {gateway} answered LISTEN with a domain name ({})",
                    control.bound
                ),
            )
        })?;
        Ok(ItcpListener {
            control: control.inner,
            local,
            gateway,
            token,
            opts: opts.clone(),
        })
    }

    /// The address the MSR listens on for this MH.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// The gateway this listener is held by.
    pub fn gateway(&self) -> SocketAddr {
        self.gateway
    }

    /// Waits for the next connection to this listener; returns it with the peer's
    /// address.
    pub async fn accept(&self) -> io::Result<(ItcpStream, SocketAddr)> {
        let addr = handshake::any_addr_for(self.gateway, self.local.port());
        let mut stream = open(&self.opts, self.gateway, self.token, Command::Accept, addr)
            .await
            .map_err(|(e, _)| e)?;
        let peer = stream.bound.socket_addr().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "I-TCP gateway {} reported a domain name ({}) as the peer of an accepted connection",
                    self.gateway, stream.bound
                ),
            )
        })?;
        stream.target = Addr::Ip(peer);
        Ok((stream, peer))
    }

    /// The control connection (holding the listener open at the MSR).
    pub fn control_stream(&self) -> &TcpStream {
        &self.control
    }
}

async fn with_timeout<T>(
    timeout: Option<Duration>,
    fut: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match timeout {
        None => fut.await,
        Some(t) => match tokio::time::timeout(t, fut).await {
            Ok(r) => r,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        },
    }
}

/// Connects to the gateway (as `TcpStream::connect` within `timeout`, but a failure
/// names our end once the kernel had chosen it).
async fn connect_gateway(gateway: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(
        Domain::for_address(gateway),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    sock.set_nonblocking(true)?;
    let fail = |local: Option<SocketAddr>, e| {
        let local = local.filter(|a| a.port() != 0);
        handshake::gateway_connect_error(gateway, local, e, timeout)
    };
    if let Err(e) = sock.connect(&gateway.into()) {
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(fail(sock.local_addr().ok().and_then(|a| a.as_socket()), e));
        }
    }
    let stream = TcpStream::from_std(sock.into())?;
    let local = stream.local_addr().ok();
    // Writable once the connect is over; its outcome is the socket's error.
    let done = async {
        stream.writable().await?;
        match stream.take_error()? {
            Some(e) => Err(e),
            None => Ok(()),
        }
    };
    match with_timeout(Some(timeout), done).await {
        Ok(()) => Ok(stream),
        Err(e) => Err(fail(local, e)),
    }
}

/// Connects to the gateway and runs one request (see the blocking `open`).
async fn open(
    opts: &MhOptions,
    gateway: SocketAddr,
    token: Token,
    command: Command,
    addr: Addr,
) -> Result<ItcpStream, (io::Error, bool)> {
    let timeout = nonzero(opts.get_connect_timeout());
    let mut stream = connect_gateway(gateway, timeout)
        .await
        .map_err(|e| (e, false))?;
    let local = stream.local_addr().map_err(|e| (e, false))?;
    let mut hs =
        Handshake::new(gateway, local.ip(), token, command, addr.clone()).with_local(local);
    let bound = drive(&mut stream, &mut hs, opts, command)
        .await
        .map_err(|e| (e, hs.got_reply()))?;
    Ok(ItcpStream {
        inner: stream,
        target: addr,
        bound,
        gateway,
    })
}

async fn drive(
    stream: &mut TcpStream,
    hs: &mut Handshake,
    opts: &MhOptions,
    command: Command,
) -> io::Result<Addr> {
    let mut step = hs.start()?;
    let mut buf = Vec::with_capacity(32);
    loop {
        match step {
            Step::Done(bound) => return Ok(bound),
            Step::Io { write, read } => {
                let timeout = phase_timeout(opts, hs.phase(), command);
                buf.resize(read, 0);
                let io = async {
                    if !write.is_empty() {
                        stream.write_all(&write).await?;
                    }
                    stream.read_exact(&mut buf).await.map(|_| ())
                };
                with_timeout(timeout, io)
                    .await
                    .map_err(|e| hs.io_error(e, timeout))?;
                step = hs.input(&buf)?;
            }
        }
    }
}
