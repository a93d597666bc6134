//! The client side of one request connection as a sans-IO state machine, driven by the
//! blocking and the async flavours alike.
//!
//! Sequence: greeting offering `[0x80, 0x00]` → method choice → (if `0x80`: the MSR's
//! key share → our token sealed under an X25519 agreement (`itcp_proto::token_kx`) →
//! token status) → request → reply. Each step says what to write and exactly how many
//! bytes to read next, so the driver never reads past the reply into relayed data.

use std::io;
use std::net::{IpAddr, SocketAddr};

use itcp_proto::token_kx::SealedToken;

use crate::socks::{self, Addr, Command, Method, Reply, Token};

/// The methods the MH offers, in order of preference.
pub(crate) const OFFERED_METHODS: [Method; 2] = [Method::ITCP_SESSION, Method::NO_AUTH];

/// What the driver does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Write `write` (may be empty), then read exactly `read` bytes and pass them to
    /// [`Handshake::input`].
    Io { write: Vec<u8>, read: usize },
    /// Handshake finished: the reply's BND address. The connection now relays.
    Done(Addr),
}

/// Which part of the exchange is in progress (selects the timeout, names the phase in
/// errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the method choice or token status.
    Negotiation,
    /// Waiting for the reply to the request.
    Reply,
}

#[derive(Debug)]
enum State {
    MethodChoice,
    KeyShare,
    TokenStatus,
    Reply(Vec<u8>),
    Done,
}

/// Client handshake for one request.
#[derive(Debug)]
pub(crate) struct Handshake {
    gateway: SocketAddr,
    /// Our address on the connection to the gateway (the sealed token is bound to it).
    mh: IpAddr,
    token: Token,
    /// Our key-share secret (drawn when the MSR's share arrives; set by tests).
    secret: Option<[u8; 32]>,
    command: Command,
    addr: Addr,
    state: State,
    /// Our end of the connection, named in errors (to find it in msrd's logs).
    local: Option<SocketAddr>,
}

impl Handshake {
    pub(crate) fn new(
        gateway: SocketAddr,
        mh: IpAddr,
        token: Token,
        command: Command,
        addr: Addr,
    ) -> Self {
        Handshake {
            gateway,
            mh,
            token,
            secret: None,
            command,
            addr,
            state: State::MethodChoice,
            local: None,
        }
    }

    /// Names our end of the connection in the errors of [`Handshake::io_error`].
    pub(crate) fn with_local(mut self, local: SocketAddr) -> Self {
        self.local = Some(local);
        self
    }

    /// The first step: send the greeting, read the method choice.
    pub(crate) fn start(&mut self) -> io::Result<Step> {
        // Fail before any I/O on an unencodable target (e.g. a 300-byte domain name).
        self.request_bytes()?;
        let mut write = Vec::with_capacity(4);
        socks::encode_greeting(&mut write, &OFFERED_METHODS);
        self.state = State::MethodChoice;
        Ok(Step::Io { write, read: 2 })
    }

    pub(crate) fn phase(&self) -> Phase {
        match self.state {
            State::MethodChoice | State::KeyShare | State::TokenStatus => Phase::Negotiation,
            State::Reply(_) | State::Done => Phase::Reply,
        }
    }

    /// Whether the MSR's reply has been received (so a failure came from the reply code,
    /// not from the gateway connection or the negotiation).
    pub(crate) fn got_reply(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Feeds the bytes the previous step asked for.
    pub(crate) fn input(&mut self, bytes: &[u8]) -> io::Result<Step> {
        match &mut self.state {
            State::MethodChoice => {
                let (method, _) = socks::parse_method_choice(bytes)
                    .map_err(|e| self.malformed(e))?
                    .ok_or_else(|| self.internal())?;
                match method {
                    Method::ITCP_SESSION => {
                        self.state = State::KeyShare;
                        Ok(Step::Io {
                            write: Vec::new(),
                            read: socks::KEY_SHARE_LEN,
                        })
                    }
                    Method::NO_AUTH => self.send_request(),
                    Method::NONE_ACCEPTABLE => Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "I-TCP gateway {} accepts neither of the offered methods \
                             (I-TCP session 0x80, no authentication 0x00)",
                            self.gateway
                        ),
                    )),
                    Method(other) => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "I-TCP gateway {} chose method 0x{other:02x}, which was not offered",
                            self.gateway
                        ),
                    )),
                }
            }
            State::KeyShare => {
                let (share, _) = socks::parse_key_share(bytes)
                    .map_err(|e| self.malformed(e))?
                    .ok_or_else(|| self.internal())?;
                let secret = match self.secret {
                    Some(s) => s,
                    None => *self.secret.insert(crate::token::random_secret()?),
                };
                let sealed =
                    SealedToken::seal(&self.token, &secret, &share, self.mh).map_err(|e| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("I-TCP gateway {} sent a bad key share: {e}", self.gateway),
                        )
                    })?;
                let mut write = Vec::with_capacity(socks::SEALED_TOKEN_LEN);
                socks::encode_token(&mut write, &sealed);
                self.state = State::TokenStatus;
                Ok(Step::Io { write, read: 2 })
            }
            State::TokenStatus => {
                let (status, _) = socks::parse_token_status(bytes)
                    .map_err(|e| self.malformed(e))?
                    .ok_or_else(|| self.internal())?;
                if status != socks::TOKEN_STATUS_OK {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "I-TCP gateway {} rejected the session token (status 0x{status:02x})",
                            self.gateway
                        ),
                    ));
                }
                self.send_request()
            }
            State::Reply(buf) => {
                buf.extend_from_slice(bytes);
                let total = socks::frame_len(buf).map_err(|e| malformed(self.gateway, e))?;
                let need = match total {
                    None => buf.len() + 1,
                    Some(total) => total,
                };
                if need > buf.len() {
                    // Checks version, code and reserved byte early.
                    socks::parse_reply(buf).map_err(|e| malformed(self.gateway, e))?;
                    return Ok(Step::Io {
                        write: Vec::new(),
                        read: need - buf.len(),
                    });
                }
                let (resp, _) = socks::parse_reply(buf)
                    .map_err(|e| malformed(self.gateway, e))?
                    .ok_or_else(|| internal(self.gateway))?;
                self.state = State::Done;
                if resp.reply == Reply::Succeeded {
                    Ok(Step::Done(resp.addr))
                } else {
                    Err(self.failure(resp.reply))
                }
            }
            State::Done => Err(self.internal()),
        }
    }

    fn request_bytes(&self) -> io::Result<Vec<u8>> {
        let mut write = Vec::with_capacity(3 + self.addr.encoded_len());
        socks::encode_request(&mut write, self.command, &self.addr).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot ask the I-TCP gateway for {}: {e}", self.addr),
            )
        })?;
        Ok(write)
    }

    fn send_request(&mut self) -> io::Result<Step> {
        let write = self.request_bytes()?;
        self.state = State::Reply(Vec::with_capacity(22));
        // VER REP RSV ATYP: enough to learn the frame length.
        Ok(Step::Io { write, read: 4 })
    }

    /// The error for a non-zero reply code.
    fn failure(&self, reply: Reply) -> io::Error {
        let what = match self.command {
            Command::Connect => format!("could not connect to {}", self.addr),
            Command::Listen | Command::Bind => {
                format!("could not listen on port {}", self.addr.port())
            }
            Command::Accept => format!("could not accept on port {}", self.addr.port()),
            Command::Register => "could not register the session token".to_string(),
        };
        io::Error::new(
            reply.to_io_error_kind(),
            format!("I-TCP gateway {} {what}: {reply}", self.gateway),
        )
    }

    fn malformed(&self, e: socks::ProtoError) -> io::Error {
        malformed(self.gateway, e)
    }

    fn internal(&self) -> io::Error {
        internal(self.gateway)
    }

    /// Maps an I/O error of the driver during the current phase to a message naming the
    /// gateway and the phase.
    pub(crate) fn io_error(&self, e: io::Error, timeout: Option<std::time::Duration>) -> io::Error {
        let phase = match self.state {
            State::MethodChoice => "method negotiation",
            State::KeyShare | State::TokenStatus => "token exchange",
            State::Reply(_) | State::Done => match self.command {
                Command::Accept => "accept request",
                Command::Connect => "connect request",
                Command::Listen => "listen request",
                Command::Bind => "bind request",
                Command::Register => "register request",
            },
        };
        let gateway = named(self.gateway, self.local);
        match e.kind() {
            io::ErrorKind::UnexpectedEof => io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("I-TCP gateway {gateway} closed the connection during the {phase}"),
            ),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                match timeout {
                    Some(t) => {
                        format!("I-TCP gateway {gateway} did not answer the {phase} within {t:?}")
                    }
                    None => format!("I-TCP gateway {gateway}: {phase}: {e}"),
                },
            ),
            kind => io::Error::new(kind, format!("I-TCP gateway {gateway}: {phase}: {e}")),
        }
    }
}

fn malformed(gateway: SocketAddr, e: socks::ProtoError) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("I-TCP gateway {gateway} sent a malformed answer: {e}"),
    )
}

fn internal(gateway: SocketAddr) -> io::Error {
    io::Error::other(format!(
        "I-TCP handshake with {gateway}: internal error (step fed too few bytes)"
    ))
}

/// The gateway as errors name it: with our end of the connection, when known.
fn named(gateway: SocketAddr, local: Option<SocketAddr>) -> String {
    match local {
        Some(l) => format!("{gateway} (from {l})"),
        None => gateway.to_string(),
    }
}

/// The error for a failed TCP connect to the gateway; `local` is our end, once the
/// kernel had chosen it (to find the attempt in msrd's logs).
pub(crate) fn gateway_connect_error(
    gateway: SocketAddr,
    local: Option<SocketAddr>,
    e: io::Error,
    timeout: std::time::Duration,
) -> io::Error {
    let gateway = named(gateway, local);
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("cannot reach I-TCP gateway {gateway}: no answer within {timeout:?}"),
        ),
        kind => io::Error::new(kind, format!("cannot reach I-TCP gateway {gateway}: {e}")),
    }
}

/// ADDR for LISTEN/ACCEPT: all-zero of the gateway's family, with `port`.
pub(crate) fn any_addr_for(gateway: SocketAddr, port: u16) -> Addr {
    Addr::unspecified(gateway.is_ipv6(), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw() -> SocketAddr {
        "10.2.0.1:1080".parse().unwrap()
    }

    fn mh() -> IpAddr {
        "10.2.0.100".parse().unwrap()
    }

    fn io_step(step: Step) -> (Vec<u8>, usize) {
        match step {
            Step::Io { write, read } => (write, read),
            Step::Done(a) => panic!("unexpected Done({a})"),
        }
    }

    #[test]
    fn full_exchange_with_token() {
        let token = Token([0xAB; 16]);
        let target = Addr::Ip("10.0.0.1:80".parse().unwrap());
        let mut hs = Handshake::new(gw(), mh(), token, Command::Connect, target);
        let (w, r) = io_step(hs.start().unwrap());
        assert_eq!(w, [5, 2, 0x80, 0]);
        assert_eq!(r, 2);
        assert_eq!(hs.phase(), Phase::Negotiation);
        let (w, r) = io_step(hs.input(&[5, 0x80]).unwrap());
        assert!(w.is_empty());
        assert_eq!(r, socks::KEY_SHARE_LEN);
        // The MSR's key share; the token goes out sealed under it, never in clear.
        let msr_secret = [0x42u8; 32];
        let mut share = Vec::new();
        socks::encode_key_share(&mut share, &itcp_proto::token_kx::public_key(&msr_secret));
        hs.secret = Some([0x17; 32]);
        let (w, r) = io_step(hs.input(&share).unwrap());
        assert_eq!(w.len(), socks::SEALED_TOKEN_LEN);
        assert!(!w.windows(16).any(|x| x == [0xAB; 16]), "token in clear");
        let (sealed, _) = socks::parse_token(&w).unwrap().unwrap();
        assert_eq!(sealed.open(&msr_secret, mh()), Ok(token));
        assert_eq!(r, 2);
        let (w, r) = io_step(hs.input(&[2, 0]).unwrap());
        assert_eq!(w, [5, 1, 0, 1, 10, 0, 0, 1, 0, 80]);
        assert_eq!(r, 4);
        assert_eq!(hs.phase(), Phase::Reply);
        let (w, r) = io_step(hs.input(&[5, 0, 0, 1]).unwrap());
        assert!(w.is_empty());
        assert_eq!(r, 6);
        match hs.input(&[10, 1, 0, 2, 0x9c, 0x40]).unwrap() {
            Step::Done(a) => assert_eq!(a, Addr::Ip("10.1.0.2:40000".parse().unwrap())),
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn no_auth_skips_token_and_domain_reply() {
        let mut hs = Handshake::new(
            gw(),
            mh(),
            Token([0; 16]),
            Command::Connect,
            Addr::Domain("fh".into(), 80),
        );
        hs.start().unwrap();
        let (w, r) = io_step(hs.input(&[5, 0]).unwrap());
        assert_eq!(w, [5, 1, 0, 3, 2, b'f', b'h', 0, 80]);
        assert_eq!(r, 4);
        let (_, r) = io_step(hs.input(&[5, 0, 0, 3]).unwrap());
        assert_eq!(r, 1);
        let (_, r) = io_step(hs.input(&[2]).unwrap());
        assert_eq!(r, 4);
        assert!(matches!(hs.input(b"fh\x00\x50").unwrap(), Step::Done(_)));
    }

    #[test]
    fn failures() {
        let target = Addr::Ip("10.0.0.1:9".parse().unwrap());
        let mut hs = Handshake::new(gw(), mh(), Token([0; 16]), Command::Connect, target.clone());
        hs.start().unwrap();
        hs.input(&[5, 0]).unwrap();
        hs.input(&[5, 5, 0, 1]).unwrap();
        let e = hs.input(&[0, 0, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(
            e.to_string(),
            "I-TCP gateway 10.2.0.1:1080 could not connect to 10.0.0.1:9: connection refused"
        );

        let mut hs = Handshake::new(gw(), mh(), Token([0; 16]), Command::Connect, target.clone());
        hs.start().unwrap();
        let e = hs.input(&[5, 0xFF]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);

        let mut hs = Handshake::new(gw(), mh(), Token([0; 16]), Command::Connect, target.clone());
        hs.start().unwrap();
        hs.input(&[5, 0x80]).unwrap();
        let mut share = Vec::new();
        socks::encode_key_share(&mut share, &itcp_proto::token_kx::public_key(&[9; 32]));
        hs.input(&share).unwrap();
        let e = hs.input(&[2, 1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("rejected the session token"), "{e}");

        let mut hs = Handshake::new(gw(), mh(), Token([0; 16]), Command::Connect, target);
        hs.start().unwrap();
        let e = hs.input(&[4, 0]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(
            e.to_string()
                .contains("method choice version 4, expected 5"),
            "{e}"
        );

        let mut hs = Handshake::new(
            gw(),
            mh(),
            Token([0; 16]),
            Command::Accept,
            any_addr_for(gw(), 80),
        );
        hs.start().unwrap();
        hs.input(&[5, 0]).unwrap();
        // Early error on a bad reply header.
        let e = hs.input(&[5, 0, 1, 1]).unwrap_err();
        assert!(e.to_string().contains("reserved byte is 0x01"), "{e}");

        let mut hs = Handshake::new(
            gw(),
            mh(),
            Token([0; 16]),
            Command::Connect,
            Addr::Domain("x".repeat(300), 80),
        );
        assert_eq!(hs.start().unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_handshake_that_times_out_names_our_end() {
        let target = Addr::Ip("10.0.0.1:80".parse().unwrap());
        let local: SocketAddr = "10.2.0.100:58870".parse().unwrap();
        let hs = Handshake::new(gw(), mh(), Token([0; 16]), Command::Connect, target.clone())
            .with_local(local);
        let e = hs.io_error(
            io::ErrorKind::WouldBlock.into(),
            Some(std::time::Duration::from_secs(5)),
        );
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            e.to_string(),
            "I-TCP gateway 10.2.0.1:1080 (from 10.2.0.100:58870) did not answer the method negotiation within 5s"
        );
        let plain = Handshake::new(gw(), mh(), Token([0; 16]), Command::Connect, target);
        let e = plain.io_error(io::ErrorKind::UnexpectedEof.into(), None);
        assert_eq!(
            e.to_string(),
            "I-TCP gateway 10.2.0.1:1080 closed the connection during the method negotiation"
        );
    }
}
