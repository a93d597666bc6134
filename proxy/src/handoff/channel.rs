//! The MSR⇄MSR channel over TCP: the challenge and hello that authenticate the peer,
//! then frames whose headers are checked before their bodies are read
//! (`itcp_proto::channel`). An unauthenticated peer can make us hold at most one hello
//! (182 bytes) for at most [`HELLO_TIMEOUT`]; nothing it sends is decoded beyond it.
//! With `[handoff.tls]` the channel is mutual TLS 1.3 instead (`super::tls`): the
//! certificates authenticate, within the same timeout, before any frame is read.

use std::fmt;
use std::io;
use std::time::Duration;

use itcp_proto::channel::{
    self as wire, Message, Session, WireError, CHALLENGE, HEADER, MAX_HELLO, NONCE,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::Handoffs;

/// How long a connecting peer has to authenticate.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a channel failed.
#[derive(Debug)]
pub enum ChannelError {
    Io(io::Error),
    Closed,
    Timeout,
    Wire(WireError),
}

impl ChannelError {
    /// The peer's host answered the connection with a refusal: no msrd listens there.
    pub fn refused(&self) -> bool {
        matches!(self, ChannelError::Io(e) if e.kind() == io::ErrorKind::ConnectionRefused)
    }
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::Io(e) => write!(f, "{e}"),
            ChannelError::Closed => f.write_str("peer closed the channel"),
            ChannelError::Timeout => f.write_str("peer did not authenticate in time"),
            ChannelError::Wire(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for ChannelError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ChannelError::Closed
        } else {
            ChannelError::Io(e)
        }
    }
}

/// 16 bytes from the kernel's CSPRNG.
pub fn random_nonce() -> io::Result<[u8; NONCE]> {
    crate::random::bytes()
}

/// A channel's byte stream: plain TCP (frames carry tags) or mutual TLS.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One authenticated MSR⇄MSR connection.
pub struct Channel {
    s: Box<dyn Stream>,
    addr: std::net::SocketAddr,
    session: Session,
    /// Bytes read behind the hello (the start of the first frame), read first.
    early: Vec<u8>,
}

fn refused(what: String) -> ChannelError {
    ChannelError::Io(io::Error::new(io::ErrorKind::PermissionDenied, what))
}

impl Channel {
    /// Connects to `peer` at `addr` and authenticates (we are the connector).
    pub async fn connect(
        h: &Handoffs,
        peer: &str,
        addr: std::net::SocketAddr,
    ) -> Result<Channel, ChannelError> {
        let mut s = TcpStream::connect(addr).await?;
        let _ = s.set_nodelay(true);
        if let Some(tls) = &h.tls {
            let mut t = tokio::time::timeout(HELLO_TIMEOUT, tls.connect(peer, s))
                .await
                .map_err(|_| ChannelError::Timeout)??;
            t.write_all(&wire::tls_hello(&h.me, peer)).await?;
            return Ok(Channel {
                s: Box::new(t),
                addr,
                session: Session::over_tls(&h.me, peer),
                early: Vec::new(),
            });
        }
        let key = h.key(peer).ok_or_else(|| {
            ChannelError::Io(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{peer:?} is not a configured [[handoff.peer]]"),
            ))
        })?;
        let mut ch = [0u8; CHALLENGE];
        tokio::time::timeout(HELLO_TIMEOUT, s.read_exact(&mut ch))
            .await
            .map_err(|_| ChannelError::Timeout)??;
        let theirs = wire::parse_challenge(&ch).map_err(ChannelError::Wire)?;
        let (hello, session) = wire::hello(&h.me, peer, &key, &theirs, &random_nonce()?);
        s.write_all(&hello).await?;
        Ok(Channel {
            s: Box::new(s),
            addr,
            session,
            early: Vec::new(),
        })
    }

    /// Authenticates a peer that connected to us (we are the acceptor): at most
    /// [`MAX_HELLO`] bytes of hello are read, within [`HELLO_TIMEOUT`].
    pub async fn accept(h: &Handoffs, s: TcpStream) -> Result<Channel, ChannelError> {
        let _ = s.set_nodelay(true);
        let addr = s
            .peer_addr()
            .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        let auth = async {
            if let Some(tls) = &h.tls {
                Self::accept_tls(h, tls, s).await
            } else {
                Self::accept_psk(h, s).await
            }
        };
        let (s, session, early) = tokio::time::timeout(HELLO_TIMEOUT, auth)
            .await
            .map_err(|_| ChannelError::Timeout)??;
        Ok(Channel {
            s,
            addr,
            session,
            early,
        })
    }

    /// Reads a hello (at most [`MAX_HELLO`] bytes) until `open` accepts or refuses it.
    async fn read_hello<T>(
        s: &mut (impl AsyncRead + Unpin),
        mut open: impl FnMut(&[u8]) -> Result<Option<(T, usize)>, WireError>,
    ) -> Result<(T, Vec<u8>), ChannelError> {
        let mut buf = [0u8; MAX_HELLO];
        let mut have = 0;
        loop {
            match open(&buf[..have]) {
                // The connector may send its first frame right behind the hello.
                Ok(Some((v, n))) => return Ok((v, buf[n..have].to_vec())),
                Ok(None) => {}
                Err(e) => return Err(ChannelError::Wire(e)),
            }
            if have == buf.len() {
                return Err(ChannelError::Wire(WireError::TooLarge(have)));
            }
            let n = s.read(&mut buf[have..]).await?;
            if n == 0 {
                return Err(ChannelError::Closed);
            }
            have += n;
        }
    }

    async fn accept_psk(
        h: &Handoffs,
        mut s: TcpStream,
    ) -> Result<(Box<dyn Stream>, Session, Vec<u8>), ChannelError> {
        let nonce = random_nonce()?;
        s.write_all(&wire::challenge(&nonce)).await?;
        let (session, early) =
            Self::read_hello(&mut s, |b| wire::open_hello(b, &h.me, |p| h.key(p), &nonce)).await?;
        Ok((Box::new(s), session, early))
    }

    async fn accept_tls(
        h: &Handoffs,
        tls: &super::tls::ChannelTlsConfig,
        s: TcpStream,
    ) -> Result<(Box<dyn Stream>, Session, Vec<u8>), ChannelError> {
        let mut t = tls.accept(s).await?;
        let (from, early) = Self::read_hello(&mut t, |b| wire::open_tls_hello(b, &h.me)).await?;
        let cert = t.get_ref().1.peer_certificates().and_then(|c| c.first());
        if !cert.is_some_and(|c| super::tls::names(c, &from)) {
            return Err(refused(format!(
                "peer calls itself {from:?} but its certificate does not name it"
            )));
        }
        if !tls.accept_unlisted && h.cfg.peer(&from).is_none() {
            return Err(refused(format!(
                "{from:?} is not a [[handoff.peer]] (and [handoff.tls] accept_unlisted = false)"
            )));
        }
        let session = Session::over_tls(&h.me, &from);
        Ok((Box::new(t), session, early))
    }

    /// The authenticated peer's MSR id.
    pub fn peer(&self) -> &str {
        self.session.peer()
    }

    /// The peer's socket address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.early.is_empty() {
            return self.s.read(buf).await;
        }
        let n = buf.len().min(self.early.len());
        buf[..n].copy_from_slice(&self.early[..n]);
        self.early.drain(..n);
        Ok(n)
    }

    async fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ChannelError> {
        let mut at = 0;
        while at < buf.len() {
            let n = self.read(&mut buf[at..]).await?;
            if n == 0 {
                return Err(ChannelError::Closed);
            }
            at += n;
        }
        Ok(())
    }

    pub async fn send(&mut self, m: &Message) -> io::Result<()> {
        let f = self.session.seal(m);
        self.s.write_all(&f).await?;
        // TLS keeps the last record until flushed.
        self.s.flush().await
    }

    /// The next message. The header is authenticated before the body is read; a body
    /// is read into a buffer that grows with what actually arrives.
    pub async fn recv(&mut self) -> Result<Message, ChannelError> {
        let mut h = [0u8; HEADER];
        self.read_exact(&mut h).await?;
        let a = self.session.check_header(&h).map_err(ChannelError::Wire)?;
        let len = a.body_len();
        let mut body = Vec::with_capacity(len.min(1 << 20));
        while body.len() < len {
            let want = (len - body.len()).min(1 << 20);
            let at = body.len();
            body.resize(at + want, 0);
            let n = self.read(&mut body[at..]).await?;
            if n == 0 {
                return Err(ChannelError::Closed);
            }
            body.truncate(at + n);
        }
        self.session
            .open_body(&h, a, &body)
            .map_err(ChannelError::Wire)
    }
}
