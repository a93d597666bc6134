//! The MSR⇄MSR channel over TCP: the challenge and hello that authenticate the peer,
//! then frames whose headers are checked before their bodies are read
//! (`itcp_proto::channel`). An unauthenticated peer can make us hold at most one hello
//! (182 bytes) for at most [`HELLO_TIMEOUT`]; nothing it sends is decoded beyond it,
//! and it may hold only a few such connections at once (`super::Authenticating`).
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
    /// Bytes read and not yet taken as a frame: what came behind the hello, then the
    /// frame being read. Kept here so that a `recv` dropped half-way (a timeout) loses
    /// nothing and the next one goes on from where it stopped.
    rbuf: Vec<u8>,
    /// The connector's socket, to see whether a channel kept ahead of need is still
    /// open ([`Channel::alive`]). Valid for as long as `s`, which owns it.
    probe: Option<std::os::fd::RawFd>,
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
        let probe = Some(std::os::fd::AsRawFd::as_raw_fd(&s));
        if let Some(tls) = &h.tls {
            let mut t = tokio::time::timeout(HELLO_TIMEOUT, tls.connect(peer, s))
                .await
                .map_err(|_| ChannelError::Timeout)??;
            t.write_all(&wire::tls_hello(&h.me, peer)).await?;
            return Ok(Channel {
                s: Box::new(t),
                addr,
                session: Session::over_tls(&h.me, peer),
                rbuf: Vec::new(),
                probe,
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
            rbuf: Vec::new(),
            probe,
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
            rbuf: early,
            probe: None,
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

    /// False once the peer has closed or reset the connection (a channel we opened;
    /// one we accepted reads as open). Bytes waiting (a TLS session ticket) are fine.
    pub fn alive(&self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        let Some(fd) = self.probe else { return true };
        // The socket is non-blocking (tokio's): nothing to read is EAGAIN.
        match recv(fd, &mut [0u8], MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(n) => n > 0,
            Err(e) => e == nix::errno::Errno::EAGAIN,
        }
    }

    /// Reads until `rbuf` holds at least `n` bytes, growing it with what arrives (at
    /// most 1 MiB ahead). Cancel-safe: `read_buf` adds only what it read.
    async fn fill(&mut self, n: usize) -> Result<(), ChannelError> {
        while self.rbuf.len() < n {
            self.rbuf.reserve((n - self.rbuf.len()).min(1 << 20));
            if self.s.read_buf(&mut self.rbuf).await? == 0 {
                return Err(ChannelError::Closed);
            }
        }
        Ok(())
    }

    pub async fn send(&mut self, m: &Message) -> io::Result<()> {
        let pieces = self.session.seal_pieces(m);
        if let [one] = &pieces[..] {
            self.s.write_all(one.bytes()).await?;
        } else {
            // The images' queues, each where it is; the small pieces between them
            // (lengths, short queues) gathered into the stream's writes.
            let mut w = tokio::io::BufWriter::with_capacity(64 << 10, &mut self.s);
            for p in &pieces {
                w.write_all(p.bytes()).await?;
            }
            w.flush().await?;
        }
        // TLS keeps the last record until flushed.
        self.s.flush().await
    }

    /// The next message. The header is authenticated before the body is read; a body
    /// is read into a buffer that grows with what actually arrives. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Message, ChannelError> {
        self.fill(HEADER).await?;
        let h: [u8; HEADER] = self.rbuf[..HEADER].try_into().expect("HEADER bytes");
        let a = self.session.check_header(&h).map_err(ChannelError::Wire)?;
        let end = HEADER + a.body_len();
        let t = std::time::Instant::now();
        self.fill(end).await?;
        let read = t.elapsed();
        let m = self.session.open_body(&h, a, &self.rbuf[HEADER..end]);
        if end >= 1 << 20 {
            // Images of many connections: where a handoff's time goes.
            tracing::debug!(
                bytes = end,
                read_us = read.as_micros() as u64,
                open_us = (t.elapsed() - read).as_micros() as u64,
                "large frame received"
            );
        }
        self.rbuf.drain(..end);
        m.map_err(ChannelError::Wire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use itcp_config::{HandoffSection, PeerSection};

    fn handoffs(me: &str, peer: &str, addr: std::net::SocketAddr) -> Handoffs {
        let cfg = HandoffSection {
            peers: vec![PeerSection {
                id: peer.into(),
                address: addr,
                key: Some("00112233445566778899aabbccddeeff".into()),
                key_file: None,
            }],
            ..HandoffSection::default()
        };
        Handoffs::new(me, &cfg).unwrap()
    }

    /// A receive dropped half-way through a frame (the idle timeout of a kept
    /// channel) loses none of it: the next receive reads the whole message.
    #[tokio::test]
    async fn a_receive_cut_short_mid_frame_loses_nothing() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = (handoffs("a", "b", addr), handoffs("b", "a", addr));
        let (acc, con) = tokio::join!(
            async { Channel::accept(&a, l.accept().await.unwrap().0).await },
            Channel::connect(&b, "a", addr)
        );
        let (mut acc, mut con) = (acc.unwrap(), con.unwrap());
        assert!(con.alive());
        let sent = Message::NotHere { handoff_id: 7 };
        let frame = con.session.seal(&sent);
        // The header and part of the body, then a receive that times out.
        let cut = HEADER + 3;
        con.s.write_all(&frame[..cut]).await.unwrap();
        con.s.flush().await.unwrap();
        let r = tokio::time::timeout(Duration::from_millis(100), acc.recv()).await;
        assert!(r.is_err(), "nothing whole to receive yet: {r:?}");
        con.s.write_all(&frame[cut..]).await.unwrap();
        con.s.flush().await.unwrap();
        let got = acc.recv().await.unwrap();
        assert_eq!(format!("{got:?}"), format!("{sent:?}"));
        // The acceptor goes: the connector sees its channel is no longer open.
        drop(acc);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!con.alive());
    }
}
