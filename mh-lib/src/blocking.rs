//! The blocking (std-like) flavour: [`ItcpStream`] and [`ItcpListener`].

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::handshake::{self, Handshake, Phase, Step};
use crate::options::MhOptions;
use crate::socks::{Addr, Command, Token};

/// An I-TCP connection: a TCP connection from this MH, relayed by its MSR, to a fixed or
/// mobile peer.
///
/// After the handshake it is an ordinary byte stream: read and write it like a
/// [`TcpStream`] (also through `&ItcpStream`), shut it down, or take the socket with
/// [`into_inner`](Self::into_inner). Dropping it closes the connection;
/// [`close`](Self::close) first sends a FIN explicitly.
#[derive(Debug)]
pub struct ItcpStream {
    inner: TcpStream,
    target: Addr,
    bound: Addr,
    gateway: SocketAddr,
}

impl ItcpStream {
    /// Opens an I-TCP connection to `addr` through the gateway found by
    /// `MhOptions::from_env()` (the file named by `ITCP_MH_CONFIG`, else `ITCP_GATEWAY`
    /// or the default route).
    ///
    /// Like [`TcpStream::connect`], `addr` is resolved here (`"host:port"`,
    /// `("host", port)`, a `SocketAddr`, …) and each resulting address is tried in
    /// turn until one succeeds; an error of the gateway itself (unreachable, protocol
    /// error) ends the attempts at once. To have the MSR resolve a name instead, use
    /// [`connect_target`](Self::connect_target) with [`Addr::Domain`].
    ///
    /// Errors carry the `ErrorKind` of the MSR's reply (refused → `ConnectionRefused`,
    /// timed out → `TimedOut`, …, see `docs/protocol.md`) and a message naming the
    /// gateway and the target.
    pub fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<ItcpStream> {
        Self::connect_with(&MhOptions::from_env()?, addr)
    }

    /// [`connect`](Self::connect) with explicit options.
    pub fn connect_with<A: ToSocketAddrs>(opts: &MhOptions, addr: A) -> io::Result<ItcpStream> {
        let gateway = opts.resolve_gateway()?;
        let token = opts.resolve_token()?;
        let mut last_err = None;
        for target in addr.to_socket_addrs()? {
            match open(opts, gateway, token, Command::Connect, Addr::Ip(target)) {
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
    /// by the MSR, not here.
    pub fn connect_target(opts: &MhOptions, target: Addr) -> io::Result<ItcpStream> {
        let gateway = opts.resolve_gateway()?;
        let token = opts.resolve_token()?;
        open(opts, gateway, token, Command::Connect, target).map_err(|(e, _)| e)
    }

    /// The peer's address: the target of [`connect`](Self::connect), or the peer of an
    /// accepted connection. Fails for a connection opened by domain name through
    /// [`connect_target`](Self::connect_target), whose resolved address only the MSR
    /// knows (see [`target`](Self::target)).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.target.socket_addr().ok_or_else(|| {
            io::Error::other(format!(
                "peer {} was resolved by the I-TCP gateway; its address is not known here",
                self.target
            ))
        })
    }

    /// The local address of the socket (this MH's end of the wireless-side connection).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The peer as requested (connect) or reported by the MSR (accept).
    pub fn target(&self) -> &Addr {
        &self.target
    }

    /// BND.ADDR/BND.PORT of the MSR's success reply (for an accepted connection: the
    /// peer).
    pub fn bound_addr(&self) -> &Addr {
        &self.bound
    }

    /// The gateway this connection goes through.
    pub fn gateway(&self) -> SocketAddr {
        self.gateway
    }

    /// Shuts down the read, write or both halves ([`TcpStream::shutdown`]); a write
    /// shutdown reaches the peer as a FIN through the MSR.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.shutdown(how)
    }

    /// Sends a FIN and closes the connection. Equivalent to dropping it, except that
    /// an error of the shutdown is reported.
    pub fn close(self) -> io::Result<()> {
        match self.inner.shutdown(Shutdown::Write) {
            Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e),
            _ => Ok(()),
        }
    }

    /// Sets TCP_NODELAY ([`TcpStream::set_nodelay`]).
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.set_nodelay(nodelay)
    }

    /// Sets the read timeout ([`TcpStream::set_read_timeout`]).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.set_read_timeout(timeout)
    }

    /// Sets the write timeout ([`TcpStream::set_write_timeout`]).
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.set_write_timeout(timeout)
    }

    /// A second handle to the same connection ([`TcpStream::try_clone`]).
    pub fn try_clone(&self) -> io::Result<ItcpStream> {
        Ok(ItcpStream {
            inner: self.inner.try_clone()?,
            target: self.target.clone(),
            bound: self.bound.clone(),
            gateway: self.gateway,
        })
    }

    /// The underlying socket, for settings not wrapped here.
    pub fn get_ref(&self) -> &TcpStream {
        &self.inner
    }

    /// The underlying socket, mutably.
    pub fn get_mut(&mut self) -> &mut TcpStream {
        &mut self.inner
    }

    /// The underlying socket: from here on an ordinary `TcpStream` to the peer.
    pub fn into_inner(self) -> TcpStream {
        self.inner
    }
}

impl Read for ItcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        self.inner.read_vectored(bufs)
    }
}

impl Write for ItcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.inner.write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Read for &ItcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.inner).read(buf)
    }
}

impl Write for &ItcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&self.inner).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&self.inner).flush()
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

impl IntoRawFd for ItcpStream {
    fn into_raw_fd(self) -> RawFd {
        self.inner.into_raw_fd()
    }
}

impl From<ItcpStream> for TcpStream {
    fn from(s: ItcpStream) -> TcpStream {
        s.inner
    }
}

impl From<ItcpStream> for OwnedFd {
    fn from(s: ItcpStream) -> OwnedFd {
        s.inner.into()
    }
}

/// A listener the MSR keeps on this MH's address, on behalf of this MH (I-TCP LISTEN).
///
/// It lives as long as this value: dropping it closes the control connection, which
/// closes the listener at the MSR. Each [`accept`](Self::accept) opens its own request
/// connection (I-TCP ACCEPT), so several threads may accept concurrently on a shared
/// `&ItcpListener`.
#[derive(Debug)]
pub struct ItcpListener {
    control: TcpStream,
    local: SocketAddr,
    gateway: SocketAddr,
    token: Token,
    opts: MhOptions,
}

impl ItcpListener {
    /// Asks the MSR (gateway from `MhOptions::from_env()`) to listen on this MH's
    /// address, port `port` (0: the MSR picks one; see
    /// [`local_addr`](Self::local_addr)).
    ///
    /// Errors: `AddrInUse` if the port is taken, `PermissionDenied` if the MSR does not
    /// serve this MH or the listener belongs to someone else, gateway errors as for
    /// [`ItcpStream::connect`].
    pub fn bind(port: u16) -> io::Result<ItcpListener> {
        Self::bind_with(&MhOptions::from_env()?, port)
    }

    /// [`bind`](Self::bind) with explicit options.
    pub fn bind_with(opts: &MhOptions, port: u16) -> io::Result<ItcpListener> {
        let gateway = opts.resolve_gateway()?;
        let token = opts.resolve_token()?;
        let addr = handshake::any_addr_for(gateway, port);
        let control = open(opts, gateway, token, Command::Listen, addr).map_err(|(e, _)| e)?;
        let local = match control.bound {
            Addr::Ip(sa) => sa,
            Addr::Domain(..) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "I-TCP gateway {gateway} answered LISTEN with a domain name ({})",
                        control.bound
                    ),
                ))
            }
        };
        Ok(ItcpListener {
            control: control.inner,
            local,
            gateway,
            token,
            opts: opts.clone(),
        })
    }

    /// The address the MSR listens on for this MH (MH address and port).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// The gateway this listener is held by.
    pub fn gateway(&self) -> SocketAddr {
        self.gateway
    }

    /// Waits for the next connection to this listener and returns it with the peer's
    /// address. Blocks until a peer connects (no timeout).
    pub fn accept(&self) -> io::Result<(ItcpStream, SocketAddr)> {
        let addr = handshake::any_addr_for(self.gateway, self.local.port());
        let mut stream = open(&self.opts, self.gateway, self.token, Command::Accept, addr)
            .map_err(|(e, _)| e)?;
        let peer = match &stream.bound {
            Addr::Ip(sa) => *sa,
            Addr::Domain(..) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "I-TCP gateway {} reported a domain name ({}) as the peer of an accepted connection",
                        self.gateway, stream.bound
                    ),
                ))
            }
        };
        stream.target = Addr::Ip(peer);
        Ok((stream, peer))
    }

    /// An endless iterator over accepted connections ([`accept`](Self::accept) in a
    /// loop).
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The control connection (holding the listener open at the MSR).
    pub fn control_stream(&self) -> &TcpStream {
        &self.control
    }
}

/// Iterator returned by [`ItcpListener::incoming`].
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a ItcpListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<ItcpStream>;
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}

/// Binds `token` to the MH's address `mh` at the MSR behind `gateway` (command
/// REGISTER, from `mh`), so that the MH's greetings prove every connection it has
/// there, also those opened without I-TCP (intercepted by the MSR, or by a SOCKS
/// client without the I-TCP method). The agent registers at every MSR it attaches to.
/// `timeout` bounds each phase. An MSR that has another token bound for the address
/// refuses (`PermissionDenied`).
pub fn register(
    mh: IpAddr,
    gateway: SocketAddr,
    token: Token,
    timeout: Duration,
) -> io::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(
        Domain::for_address(gateway),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    sock.bind(&SocketAddr::new(mh, 0).into())?;
    sock.connect_timeout(&gateway.into(), timeout)
        .map_err(|e| handshake::gateway_connect_error(gateway, None, e, timeout))?;
    let mut s: TcpStream = sock.into();
    let opts = MhOptions::new()
        .token(token)
        .connect_timeout(timeout)
        .reply_timeout(Some(timeout));
    let addr = handshake::any_addr_for(gateway, 0);
    request_on(&mut s, &opts, Command::Register, addr)?;
    // The MSR closes after its reply; this end's close is all that is left.
    let _ = s.shutdown(Shutdown::Both);
    Ok(())
}

/// Runs one I-TCP request (method negotiation, session token, request, reply) on
/// `stream`, a TCP connection already open to the gateway — for callers that must keep
/// their own socket, such as an `LD_PRELOAD` shim that connected an application's fd to
/// the gateway. The token comes from `opts`; the phases use `opts`' timeouts, set as the
/// stream's read/write timeouts, which are left unset (`None`) on return.
///
/// Returns the reply's BND address (for CONNECT the MSR's idea of the MH's side, for
/// ACCEPT the peer). Errors as for [`ItcpStream::connect`].
pub fn request_on(
    stream: &mut TcpStream,
    opts: &MhOptions,
    command: Command,
    target: Addr,
) -> io::Result<Addr> {
    let gateway = stream.peer_addr()?;
    let token = opts.resolve_token()?;
    let mh = stream.local_addr()?.ip();
    let mut hs = Handshake::new(gateway, mh, token, command, target);
    let bound = drive(stream, &mut hs, opts, command)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(bound)
}

/// Zero durations are invalid as socket timeouts; treat them as the smallest one.
pub(crate) fn nonzero(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}

/// The read/write timeout for a phase of the handshake.
pub(crate) fn phase_timeout(opts: &MhOptions, phase: Phase, command: Command) -> Option<Duration> {
    match phase {
        Phase::Negotiation => Some(nonzero(opts.get_connect_timeout())),
        Phase::Reply if command == Command::Accept => None,
        Phase::Reply => opts.get_reply_timeout().map(nonzero),
    }
}

/// Connects to the gateway (as `TcpStream::connect_timeout`, but a failure names our
/// end once the kernel had chosen it).
fn connect_gateway(gateway: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(
        Domain::for_address(gateway),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    match sock.connect_timeout(&gateway.into(), timeout) {
        Ok(()) => Ok(sock.into()),
        Err(e) => {
            let local = sock.local_addr().ok().and_then(|a| a.as_socket());
            let local = local.filter(|a| a.port() != 0);
            Err(handshake::gateway_connect_error(gateway, local, e, timeout))
        }
    }
}

/// Connects to the gateway and runs one request. On error, the flag says whether the
/// MSR answered the request with a failure code (so another target address may work).
fn open(
    opts: &MhOptions,
    gateway: SocketAddr,
    token: Token,
    command: Command,
    addr: Addr,
) -> Result<ItcpStream, (io::Error, bool)> {
    let timeout = nonzero(opts.get_connect_timeout());
    let mut stream = connect_gateway(gateway, timeout).map_err(|e| (e, false))?;
    let local = stream.local_addr().map_err(|e| (e, false))?;
    let mut hs =
        Handshake::new(gateway, local.ip(), token, command, addr.clone()).with_local(local);
    let bound = drive(&mut stream, &mut hs, opts, command).map_err(|e| (e, hs.got_reply()))?;
    let reset = stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None));
    reset.map_err(|e| (e, false))?;
    Ok(ItcpStream {
        inner: stream,
        target: addr,
        bound,
        gateway,
    })
}

fn drive(
    stream: &mut TcpStream,
    hs: &mut Handshake,
    opts: &MhOptions,
    command: Command,
) -> io::Result<Addr> {
    let mut step = hs.start()?;
    let mut buf = Vec::with_capacity(32);
    let mut current: Option<Option<Duration>> = None;
    loop {
        match step {
            Step::Done(bound) => return Ok(bound),
            Step::Io { write, read } => {
                let timeout = phase_timeout(opts, hs.phase(), command);
                if current != Some(timeout) {
                    stream.set_read_timeout(timeout)?;
                    stream.set_write_timeout(timeout)?;
                    current = Some(timeout);
                }
                if !write.is_empty() {
                    stream
                        .write_all(&write)
                        .map_err(|e| hs.io_error(e, timeout))?;
                }
                buf.resize(read, 0);
                stream
                    .read_exact(&mut buf)
                    .map_err(|e| hs.io_error(e, timeout))?;
                step = hs.input(&buf)?;
            }
        }
    }
}
