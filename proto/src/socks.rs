//! Sans-IO codec for the MH ⇄ MSR request protocol (`docs/protocol.md`): SOCKS5
//! (RFC 1928) plus the I-TCP extensions (method `0x80` with its token
//! sub-negotiation, commands LISTEN `0x80` / ACCEPT `0x81` / REGISTER `0x82`, reply codes `0x09`/`0x0A`).
//!
//! Both sides use this module: the MH library (client side) and `msrd` (server side).
//! Nothing here does I/O. Every parser takes the bytes received so far and returns
//!
//! * `Ok(Some((message, consumed)))` — one complete message was decoded from the first
//!   `consumed` bytes; anything after them belongs to the next message or to the relayed
//!   byte stream,
//! * `Ok(None)` — the bytes are a valid prefix, read more and call again,
//! * `Err(ProtoError)` — the bytes can never become a valid message; the error says what
//!   is wrong (and, for a request, [`ProtoError::reply`] says which reply to send before
//!   closing).
//!
//! Parsers report an error as soon as the offending byte has arrived, so a peer speaking
//! another protocol is rejected without waiting for a full message.
//!
//! Encoders append to a `Vec<u8>`.
//!
//! | message | direction | parse | encode |
//! |---|---|---|---|
//! | greeting `05 N METHODS…` | MH → MSR | [`parse_greeting`] | [`encode_greeting`] |
//! | method choice `05 M` | MSR → MH | [`parse_method_choice`] | [`encode_method_choice`] |
//! | token `01 TOKEN(16)` | MH → MSR | [`parse_token`] | [`encode_token`] |
//! | token status `01 S` | MSR → MH | [`parse_token_status`] | [`encode_token_status`] |
//! | request `05 CMD 00 ADDR PORT` | MH → MSR | [`parse_request`] | [`encode_request`] |
//! | reply `05 REP 00 ADDR PORT` | MSR → MH | [`parse_reply`] | [`encode_reply`] |
//!
//! [`frame_len`] tells a reader how many bytes a request or reply occupies once its
//! first 4–5 bytes are known, so it can read exactly that much and not a byte of the
//! relayed stream that follows.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::token_kx::{Public, SealedToken};

/// SOCKS protocol version byte (`05`) of greetings, method choices, requests and replies.
pub const SOCKS_VERSION: u8 = 0x05;
/// Version byte (`02`) of the method-`0x80` sub-negotiation: key share, sealed token
/// and status (version `01` sent the token in clear).
pub const TOKEN_VERSION: u8 = 0x02;
/// Token status meaning "accepted"; any other status closes the connection.
pub const TOKEN_STATUS_OK: u8 = 0x00;

/// Address type byte: IPv4 (4 bytes follow).
pub const ATYP_IPV4: u8 = 0x01;
/// Address type byte: domain name (1 length byte and that many bytes follow).
pub const ATYP_DOMAIN: u8 = 0x03;
/// Address type byte: IPv6 (16 bytes follow).
pub const ATYP_IPV6: u8 = 0x04;

/// An authentication method code of the method negotiation (RFC 1928 §3).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Method(pub u8);

impl Method {
    /// `00`: no authentication (what stock SOCKS clients offer).
    pub const NO_AUTH: Method = Method(0x00);
    /// `80`: I-TCP session; the server sends a key share, the client its 16-byte
    /// session token sealed under it ([`crate::token_kx`]).
    pub const ITCP_SESSION: Method = Method(0x80);
    /// `FF`: the server's answer when none of the offered methods is acceptable.
    pub const NONE_ACCEPTABLE: Method = Method(0xFF);

    /// The MSR's choice among the `offered` methods: [`Method::ITCP_SESSION`] if offered,
    /// else [`Method::NO_AUTH`] if offered, else [`Method::NONE_ACCEPTABLE`] (after
    /// sending which the server closes the connection).
    pub fn select(offered: &[Method]) -> Method {
        if offered.contains(&Method::ITCP_SESSION) {
            Method::ITCP_SESSION
        } else if offered.contains(&Method::NO_AUTH) {
            Method::NO_AUTH
        } else {
            Method::NONE_ACCEPTABLE
        }
    }
}

impl fmt::Debug for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Method::NO_AUTH => f.write_str("Method::NO_AUTH"),
            Method::ITCP_SESSION => f.write_str("Method::ITCP_SESSION"),
            Method::NONE_ACCEPTABLE => f.write_str("Method::NONE_ACCEPTABLE"),
            Method(m) => write!(f, "Method(0x{m:02x})"),
        }
    }
}

/// A request command (RFC 1928 §4 plus the I-TCP extensions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Command {
    /// `01`: open a TCP connection to ADDR:PORT from the MH's own address.
    Connect = 0x01,
    /// `02`: RFC 1928 BIND — one listening socket, one peer, two replies.
    Bind = 0x02,
    /// `80` (I-TCP): listen on the MH's address, port PORT, for as long as the request
    /// connection stays open. One reply.
    Listen = 0x80,
    /// `81` (I-TCP): take the next connection arriving at the MH's listener on PORT.
    /// The reply comes when a peer connects; then the connection relays.
    Accept = 0x81,
    /// `82` (I-TCP): bind the session token of the method-`0x80` negotiation to the MH's
    /// address at this MSR, and nothing else (ADDR:PORT unused). The MH's greetings
    /// then prove its connections here however they were opened (intercepted, or by a
    /// SOCKS client without the I-TCP method). One reply, then the MSR closes.
    Register = 0x82,
}

impl Command {
    /// The command for a wire code, `None` if unknown.
    pub fn from_u8(code: u8) -> Option<Command> {
        match code {
            0x01 => Some(Command::Connect),
            0x02 => Some(Command::Bind),
            0x80 => Some(Command::Listen),
            0x81 => Some(Command::Accept),
            0x82 => Some(Command::Register),
            _ => None,
        }
    }

    /// The wire code.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Lower-case name for messages ("connect", "listen", …).
    pub fn name(self) -> &'static str {
        match self {
            Command::Connect => "connect",
            Command::Bind => "bind",
            Command::Listen => "listen",
            Command::Accept => "accept",
            Command::Register => "register",
        }
    }
}

/// A reply code (RFC 1928 §6 plus the I-TCP extensions `09` and `0A`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Reply {
    /// `00`: succeeded.
    Succeeded = 0x00,
    /// `01`: general failure (also the answer to a malformed request).
    GeneralFailure = 0x01,
    /// `02`: not allowed (MH outside the MSR's prefixes, limits reached, listener owned
    /// by someone else).
    NotAllowed = 0x02,
    /// `03`: network unreachable.
    NetworkUnreachable = 0x03,
    /// `04`: host unreachable.
    HostUnreachable = 0x04,
    /// `05`: connection refused.
    ConnectionRefused = 0x05,
    /// `06`: TTL expired — used for "connect timed out".
    TtlExpired = 0x06,
    /// `07`: command not supported.
    CommandNotSupported = 0x07,
    /// `08`: address type not supported.
    AddressTypeNotSupported = 0x08,
    /// `09` (I-TCP): no such listener (ACCEPT for a port the MH does not listen on).
    NoSuchListener = 0x09,
    /// `0A` (I-TCP): address in use (LISTEN/BIND port taken).
    AddrInUse = 0x0A,
}

impl Reply {
    /// The reply for a wire code, `None` if unknown.
    pub fn from_u8(code: u8) -> Option<Reply> {
        Some(match code {
            0x00 => Reply::Succeeded,
            0x01 => Reply::GeneralFailure,
            0x02 => Reply::NotAllowed,
            0x03 => Reply::NetworkUnreachable,
            0x04 => Reply::HostUnreachable,
            0x05 => Reply::ConnectionRefused,
            0x06 => Reply::TtlExpired,
            0x07 => Reply::CommandNotSupported,
            0x08 => Reply::AddressTypeNotSupported,
            0x09 => Reply::NoSuchListener,
            0x0A => Reply::AddrInUse,
            _ => return None,
        })
    }

    /// The wire code.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The `io::ErrorKind` an MH application sees for this reply (protocol.md §3).
    /// Meaningless for [`Reply::Succeeded`], which maps to `Other`.
    pub fn to_io_error_kind(self) -> io::ErrorKind {
        match self {
            Reply::Succeeded | Reply::GeneralFailure => io::ErrorKind::Other,
            Reply::NotAllowed => io::ErrorKind::PermissionDenied,
            Reply::NetworkUnreachable => io::ErrorKind::NetworkUnreachable,
            Reply::HostUnreachable => io::ErrorKind::HostUnreachable,
            Reply::ConnectionRefused => io::ErrorKind::ConnectionRefused,
            Reply::TtlExpired => io::ErrorKind::TimedOut,
            Reply::CommandNotSupported | Reply::AddressTypeNotSupported => {
                io::ErrorKind::Unsupported
            }
            Reply::NoSuchListener => io::ErrorKind::NotFound,
            Reply::AddrInUse => io::ErrorKind::AddrInUse,
        }
    }

    /// Server side: the reply for a failed connect/listen on the fixed side.
    ///
    /// `ECONNREFUSED`→`ConnectionRefused`, `ENETUNREACH`→`NetworkUnreachable`,
    /// `EHOSTUNREACH`→`HostUnreachable`, `ETIMEDOUT` (or kind `TimedOut`)→`TtlExpired`,
    /// `EADDRINUSE`→`AddrInUse`, `EACCES`/`EPERM`→`NotAllowed`, anything else
    /// `GeneralFailure`. Errors without an OS code are mapped by their `ErrorKind`.
    pub fn from_io_error(err: &io::Error) -> Reply {
        if let Some(code) = err.raw_os_error() {
            match code {
                libc::ECONNREFUSED => return Reply::ConnectionRefused,
                libc::ENETUNREACH => return Reply::NetworkUnreachable,
                libc::EHOSTUNREACH => return Reply::HostUnreachable,
                libc::ETIMEDOUT => return Reply::TtlExpired,
                libc::EADDRINUSE => return Reply::AddrInUse,
                libc::EACCES | libc::EPERM => return Reply::NotAllowed,
                // No route or no source address for that family here.
                libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT => return Reply::NetworkUnreachable,
                _ => {}
            }
        }
        match err.kind() {
            io::ErrorKind::ConnectionRefused => Reply::ConnectionRefused,
            io::ErrorKind::NetworkUnreachable => Reply::NetworkUnreachable,
            io::ErrorKind::HostUnreachable => Reply::HostUnreachable,
            io::ErrorKind::TimedOut => Reply::TtlExpired,
            io::ErrorKind::AddrInUse => Reply::AddrInUse,
            io::ErrorKind::PermissionDenied => Reply::NotAllowed,
            _ => Reply::GeneralFailure,
        }
    }

    /// Lower-case description for messages ("connection refused", …).
    pub fn description(self) -> &'static str {
        match self {
            Reply::Succeeded => "succeeded",
            Reply::GeneralFailure => "general failure",
            Reply::NotAllowed => "not allowed",
            Reply::NetworkUnreachable => "network unreachable",
            Reply::HostUnreachable => "host unreachable",
            Reply::ConnectionRefused => "connection refused",
            Reply::TtlExpired => "timed out (TTL expired)",
            Reply::CommandNotSupported => "command not supported",
            Reply::AddressTypeNotSupported => "address type not supported",
            Reply::NoSuchListener => "no such listener",
            Reply::AddrInUse => "address in use",
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// An MH session token: 16 random bytes shared by every process of one MH, sent sealed
/// (X25519, [`crate::token_kx`]) in the method-`0x80` sub-negotiation.
///
/// `Debug` shows only the first two bytes, so tokens do not end up in logs whole; use
/// [`Token::to_hex`] when the full value is really wanted.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub [u8; 16]);

impl Token {
    /// Parses 32 hex digits (either case; surrounding whitespace is ignored).
    pub fn from_hex(s: &str) -> Option<Token> {
        let s = s.trim().as_bytes();
        if s.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, pair) in s.chunks(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            bytes[i] = (hi * 16 + lo) as u8;
        }
        Some(Token(bytes))
    }

    /// The token as 32 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Comparison whose duration does not depend on where the tokens differ (for the
    /// server checking a presented token against a stored one).
    pub fn ct_eq(&self, other: &Token) -> bool {
        let diff = self
            .0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        // black_box keeps the optimiser from short-circuiting the fold.
        std::hint::black_box(diff) == 0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({:02x}{:02x}…)", self.0[0], self.0[1])
    }
}

/// A destination or bound address: ATYP + address + port on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Addr {
    /// IPv4 (`ATYP 01`) or IPv6 (`ATYP 04`) address and port. An IPv6 scope id or flow
    /// label is not carried on the wire.
    Ip(SocketAddr),
    /// Domain name (`ATYP 03`, 1–255 bytes, resolved by the MSR) and port.
    Domain(String, u16),
}

impl Addr {
    /// `0.0.0.0:0`, the "any/unspecified" address (replies with nothing to report,
    /// LISTEN/ACCEPT with no specific address).
    pub const UNSPECIFIED_V4: Addr =
        Addr::Ip(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)));

    /// The all-zero address of the given family with `port` (`0.0.0.0:port` or
    /// `[::]:port`).
    pub fn unspecified(ipv6: bool, port: u16) -> Addr {
        if ipv6 {
            Addr::Ip(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port))
        } else {
            Addr::Ip(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        match self {
            Addr::Ip(sa) => sa.port(),
            Addr::Domain(_, port) => *port,
        }
    }

    /// The socket address, `None` for a domain name.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self {
            Addr::Ip(sa) => Some(*sa),
            Addr::Domain(..) => None,
        }
    }

    /// Bytes this address takes on the wire (ATYP through PORT).
    pub fn encoded_len(&self) -> usize {
        match self {
            Addr::Ip(SocketAddr::V4(_)) => 1 + 4 + 2,
            Addr::Ip(SocketAddr::V6(_)) => 1 + 16 + 2,
            Addr::Domain(name, _) => 1 + 1 + name.len() + 2,
        }
    }

    /// Appends ATYP, address and port.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        match self {
            Addr::Ip(SocketAddr::V4(sa)) => {
                out.push(ATYP_IPV4);
                out.extend_from_slice(&sa.ip().octets());
            }
            Addr::Ip(SocketAddr::V6(sa)) => {
                out.push(ATYP_IPV6);
                out.extend_from_slice(&sa.ip().octets());
            }
            Addr::Domain(name, _) => {
                if name.is_empty() {
                    return Err(ProtoError::EmptyDomain);
                }
                if name.len() > 255 {
                    return Err(ProtoError::DomainTooLong(name.len()));
                }
                out.push(ATYP_DOMAIN);
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
            }
        }
        out.extend_from_slice(&self.port().to_be_bytes());
        Ok(())
    }

    /// Decodes ATYP + address + port from the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Option<(Addr, usize)>, ProtoError> {
        let Some(len) = addr_len(buf)? else {
            return Ok(None);
        };
        if buf.len() < len {
            return Ok(None);
        }
        let port = u16::from_be_bytes([buf[len - 2], buf[len - 1]]);
        let addr = match buf[0] {
            ATYP_IPV4 => {
                let ip: [u8; 4] = buf[1..5].try_into().expect("length checked");
                Addr::Ip(SocketAddr::V4(SocketAddrV4::new(ip.into(), port)))
            }
            ATYP_IPV6 => {
                let ip: [u8; 16] = buf[1..17].try_into().expect("length checked");
                Addr::Ip(SocketAddr::V6(SocketAddrV6::new(ip.into(), port, 0, 0)))
            }
            ATYP_DOMAIN => {
                let name =
                    std::str::from_utf8(&buf[2..len - 2]).map_err(|_| ProtoError::DomainNotUtf8)?;
                Addr::Domain(name.to_owned(), port)
            }
            _ => unreachable!("addr_len rejects unknown address types"),
        };
        Ok(Some((addr, len)))
    }
}

impl From<SocketAddr> for Addr {
    fn from(sa: SocketAddr) -> Addr {
        Addr::Ip(sa)
    }
}

impl From<SocketAddrV4> for Addr {
    fn from(sa: SocketAddrV4) -> Addr {
        Addr::Ip(sa.into())
    }
}

impl From<SocketAddrV6> for Addr {
    fn from(sa: SocketAddrV6) -> Addr {
        Addr::Ip(sa.into())
    }
}

impl fmt::Display for Addr {
    /// `10.0.0.1:80`, `[::1]:80`, `example.com:80`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Ip(sa) => write!(f, "{sa}"),
            Addr::Domain(name, port) => write!(f, "{name}:{port}"),
        }
    }
}

/// Length of ATYP + address + port at the start of `buf`, once knowable.
fn addr_len(buf: &[u8]) -> Result<Option<usize>, ProtoError> {
    let Some(&atyp) = buf.first() else {
        return Ok(None);
    };
    match atyp {
        ATYP_IPV4 => Ok(Some(1 + 4 + 2)),
        ATYP_IPV6 => Ok(Some(1 + 16 + 2)),
        ATYP_DOMAIN => match buf.get(1) {
            None => Ok(None),
            Some(0) => Err(ProtoError::EmptyDomain),
            Some(&n) => Ok(Some(1 + 1 + n as usize + 2)),
        },
        other => Err(ProtoError::UnknownAddrType(other)),
    }
}

/// Which message a [`ProtoError`] was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// `05 NMETHODS METHODS…`
    Greeting,
    /// `05 METHOD`
    MethodChoice,
    /// `02 PUBLIC(32)` (the MSR's key share)
    KeyShare,
    /// `02 PUBLIC(32) SEALED(16) TAG(16)`
    Token,
    /// `02 STATUS`
    TokenStatus,
    /// `05 CMD 00 ADDR PORT`
    Request,
    /// `05 REP 00 ADDR PORT`
    Reply,
}

impl MessageKind {
    fn name(self) -> &'static str {
        match self {
            MessageKind::Greeting => "greeting",
            MessageKind::MethodChoice => "method choice",
            MessageKind::KeyShare => "key share",
            MessageKind::Token => "token sub-negotiation",
            MessageKind::TokenStatus => "token status",
            MessageKind::Request => "request",
            MessageKind::Reply => "reply",
        }
    }
}

/// What is wrong with a message. `Display` gives a precise one-line description such as
/// "request version 4, expected 5" or "unknown address type 0x02".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtoError {
    /// The version byte is not the one this message must carry.
    BadVersion {
        /// The message.
        message: MessageKind,
        /// The version received.
        got: u8,
        /// The version required (`05`, or `02` for the token messages).
        expected: u8,
    },
    /// The reserved byte of a request or reply is not zero.
    BadReserved(u8),
    /// ATYP is none of `01`, `03`, `04`.
    UnknownAddrType(u8),
    /// A domain name of length 0.
    EmptyDomain,
    /// A domain name (to encode) longer than 255 bytes.
    DomainTooLong(usize),
    /// A domain name that is not UTF-8.
    DomainNotUtf8,
    /// A greeting with NMETHODS = 0.
    NoMethods,
    /// A request with an unknown CMD; the server answers
    /// [`Reply::CommandNotSupported`].
    UnknownCommand(u8),
    /// A reply with a REP code this implementation does not know.
    UnknownReply(u8),
}

impl ProtoError {
    /// Server side: the reply to send for a malformed request before closing
    /// (protocol.md §3): [`Reply::CommandNotSupported`] for an unknown command,
    /// [`Reply::GeneralFailure`] for everything else (wrong version, reserved byte, unknown
    /// ATYP, bad domain name).
    pub fn reply(&self) -> Reply {
        match self {
            ProtoError::UnknownCommand(_) => Reply::CommandNotSupported,
            _ => Reply::GeneralFailure,
        }
    }
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::BadVersion {
                message,
                got,
                expected,
            } => write!(f, "{} version {got}, expected {expected}", message.name()),
            ProtoError::BadReserved(b) => write!(f, "reserved byte is 0x{b:02x}, expected 0"),
            ProtoError::UnknownAddrType(t) => write!(f, "unknown address type 0x{t:02x}"),
            ProtoError::EmptyDomain => f.write_str("domain name of length 0"),
            ProtoError::DomainTooLong(n) => {
                write!(f, "domain name of length {n}, at most 255 allowed")
            }
            ProtoError::DomainNotUtf8 => f.write_str("domain name is not valid UTF-8"),
            ProtoError::NoMethods => f.write_str("greeting offers no methods (NMETHODS is 0)"),
            ProtoError::UnknownCommand(c) => write!(f, "unknown command 0x{c:02x}"),
            ProtoError::UnknownReply(r) => write!(f, "unknown reply code 0x{r:02x}"),
        }
    }
}

impl std::error::Error for ProtoError {}

impl From<ProtoError> for io::Error {
    fn from(e: ProtoError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// A decoded request: command and destination (CONNECT) or listen address (BIND,
/// LISTEN, ACCEPT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// CMD.
    pub command: Command,
    /// DST.ADDR and DST.PORT.
    pub addr: Addr,
}

/// A decoded reply: code and BND.ADDR/BND.PORT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// REP.
    pub reply: Reply,
    /// BND.ADDR and BND.PORT.
    pub addr: Addr,
}

fn check_version(buf: &[u8], message: MessageKind, expected: u8) -> Result<Option<()>, ProtoError> {
    match buf.first() {
        None => Ok(None),
        Some(&v) if v == expected => Ok(Some(())),
        Some(&got) => Err(ProtoError::BadVersion {
            message,
            got,
            expected,
        }),
    }
}

/// What a SOCKS5 server answers a SOCKS4 request with: a SOCKS4 reply, `00 5B` and
/// six zero bytes ("request rejected or failed"), which SOCKS4 clients understand
/// (a SOCKS5 reply reads to them as a wrong version).
pub const SOCKS4_REJECTION: [u8; 8] = [0x00, 0x5B, 0, 0, 0, 0, 0, 0];

/// True if `buf` starts like a SOCKS4 or SOCKS4a request (`04 CMD`).
pub fn is_socks4(buf: &[u8]) -> bool {
    matches!(buf, [0x04, 0x01 | 0x02, ..])
}

/// Total length in bytes of the request or reply (`05 X 00 ADDR PORT`) starting at
/// `buf[0]`, once the first 4 bytes (5 for a domain name) are there; `Ok(None)` before.
///
/// Lets a reader fetch exactly one request/reply and leave whatever follows (relayed
/// data) in the socket. Only the address type and domain length are checked here; use
/// [`parse_request`] / [`parse_reply`] on the complete frame.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, ProtoError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    Ok(addr_len(&buf[3..])?.map(|n| 3 + n))
}

/// Server side: decodes a greeting `05 NMETHODS METHODS…` into the offered methods.
pub fn parse_greeting(buf: &[u8]) -> Result<Option<(Vec<Method>, usize)>, ProtoError> {
    if check_version(buf, MessageKind::Greeting, SOCKS_VERSION)?.is_none() {
        return Ok(None);
    }
    let Some(&n) = buf.get(1) else {
        return Ok(None);
    };
    if n == 0 {
        return Err(ProtoError::NoMethods);
    }
    let len = 2 + n as usize;
    if buf.len() < len {
        return Ok(None);
    }
    Ok(Some((
        buf[2..len].iter().map(|&m| Method(m)).collect(),
        len,
    )))
}

/// Client side: decodes the server's method choice `05 METHOD`.
pub fn parse_method_choice(buf: &[u8]) -> Result<Option<(Method, usize)>, ProtoError> {
    if check_version(buf, MessageKind::MethodChoice, SOCKS_VERSION)?.is_none() {
        return Ok(None);
    }
    match buf.get(1) {
        None => Ok(None),
        Some(&m) => Ok(Some((Method(m), 2))),
    }
}

/// Length of the MH's sealed token message `02 PUBLIC(32) SEALED(16) TAG(16)`.
pub const SEALED_TOKEN_LEN: usize = 1 + 32 + 16 + 16;
/// Length of the MSR's key share `02 PUBLIC(32)`.
pub const KEY_SHARE_LEN: usize = 1 + 32;

/// Server side: decodes the MH's sealed token `02 PUBLIC(32) SEALED(16) TAG(16)`
/// (open it with [`crate::token_kx::SealedToken::open`]).
pub fn parse_token(buf: &[u8]) -> Result<Option<(SealedToken, usize)>, ProtoError> {
    if check_version(buf, MessageKind::Token, TOKEN_VERSION)?.is_none() {
        return Ok(None);
    }
    if buf.len() < SEALED_TOKEN_LEN {
        return Ok(None);
    }
    let t = SealedToken {
        public: buf[1..33].try_into().expect("length checked"),
        sealed: buf[33..49].try_into().expect("length checked"),
        tag: buf[49..65].try_into().expect("length checked"),
    };
    Ok(Some((t, SEALED_TOKEN_LEN)))
}

/// Client side: decodes the MSR's key share `02 PUBLIC(32)`, sent right after it
/// chose method `0x80`.
pub fn parse_key_share(buf: &[u8]) -> Result<Option<(Public, usize)>, ProtoError> {
    if check_version(buf, MessageKind::KeyShare, TOKEN_VERSION)?.is_none() {
        return Ok(None);
    }
    if buf.len() < KEY_SHARE_LEN {
        return Ok(None);
    }
    Ok(Some((
        buf[1..33].try_into().expect("length checked"),
        KEY_SHARE_LEN,
    )))
}

/// Client side: decodes the token status `02 STATUS`
/// ([`TOKEN_STATUS_OK`] = accepted).
pub fn parse_token_status(buf: &[u8]) -> Result<Option<(u8, usize)>, ProtoError> {
    if check_version(buf, MessageKind::TokenStatus, TOKEN_VERSION)?.is_none() {
        return Ok(None);
    }
    match buf.get(1) {
        None => Ok(None),
        Some(&s) => Ok(Some((s, 2))),
    }
}

/// Shared body of request and reply: `05 X 00 ADDR PORT`, X already validated by `code`.
fn parse_frame<T>(
    buf: &[u8],
    message: MessageKind,
    code: impl FnOnce(u8) -> Result<T, ProtoError>,
) -> Result<Option<(T, Addr, usize)>, ProtoError> {
    if check_version(buf, message, SOCKS_VERSION)?.is_none() {
        return Ok(None);
    }
    let Some(&c) = buf.get(1) else {
        return Ok(None);
    };
    let value = code(c)?;
    match buf.get(2) {
        None => return Ok(None),
        Some(0) => {}
        Some(&r) => return Err(ProtoError::BadReserved(r)),
    }
    match Addr::parse(&buf[3..])? {
        None => Ok(None),
        Some((addr, n)) => Ok(Some((value, addr, 3 + n))),
    }
}

/// Server side: decodes a request `05 CMD 00 ADDR PORT`. An unknown CMD is
/// [`ProtoError::UnknownCommand`] (answer [`Reply::CommandNotSupported`]; see
/// [`ProtoError::reply`]).
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, ProtoError> {
    let parsed = parse_frame(buf, MessageKind::Request, |c| {
        Command::from_u8(c).ok_or(ProtoError::UnknownCommand(c))
    })?;
    Ok(parsed.map(|(command, addr, n)| (Request { command, addr }, n)))
}

/// Client side: decodes a reply `05 REP 00 ADDR PORT`.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Response, usize)>, ProtoError> {
    let parsed = parse_frame(buf, MessageKind::Reply, |c| {
        Reply::from_u8(c).ok_or(ProtoError::UnknownReply(c))
    })?;
    Ok(parsed.map(|(reply, addr, n)| (Response { reply, addr }, n)))
}

/// Client side: appends a greeting offering `methods`.
///
/// # Panics
/// If `methods` is empty or has more than 255 entries (not encodable).
pub fn encode_greeting(out: &mut Vec<u8>, methods: &[Method]) {
    assert!(
        !methods.is_empty() && methods.len() <= 255,
        "a greeting offers 1 to 255 methods, not {}",
        methods.len()
    );
    out.push(SOCKS_VERSION);
    out.push(methods.len() as u8);
    out.extend(methods.iter().map(|m| m.0));
}

/// Server side: appends the method choice.
pub fn encode_method_choice(out: &mut Vec<u8>, method: Method) {
    out.extend_from_slice(&[SOCKS_VERSION, method.0]);
}

/// Client side: appends the method-`0x80` sub-negotiation carrying the sealed token.
pub fn encode_token(out: &mut Vec<u8>, token: &SealedToken) {
    out.push(TOKEN_VERSION);
    out.extend_from_slice(&token.public);
    out.extend_from_slice(&token.sealed);
    out.extend_from_slice(&token.tag);
}

/// Server side: appends its key share, right after the method choice `0x80`.
pub fn encode_key_share(out: &mut Vec<u8>, public: &Public) {
    out.push(TOKEN_VERSION);
    out.extend_from_slice(public);
}

/// Server side: appends the token status ([`TOKEN_STATUS_OK`] = accepted).
pub fn encode_token_status(out: &mut Vec<u8>, status: u8) {
    out.extend_from_slice(&[TOKEN_VERSION, status]);
}

/// Client side: appends a request. Fails (leaving `out` unchanged) only for a domain
/// name that is empty or longer than 255 bytes.
pub fn encode_request(out: &mut Vec<u8>, command: Command, addr: &Addr) -> Result<(), ProtoError> {
    encode_frame(out, command.as_u8(), addr)
}

/// Server side: appends a reply. Fails (leaving `out` unchanged) only for a domain name
/// that is empty or longer than 255 bytes.
pub fn encode_reply(out: &mut Vec<u8>, reply: Reply, addr: &Addr) -> Result<(), ProtoError> {
    encode_frame(out, reply.as_u8(), addr)
}

fn encode_frame(out: &mut Vec<u8>, code: u8, addr: &Addr) -> Result<(), ProtoError> {
    let start = out.len();
    out.extend_from_slice(&[SOCKS_VERSION, code, 0x00]);
    addr.encode(out).inspect_err(|_| out.truncate(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> Addr {
        Addr::Ip(s.parse().unwrap())
    }

    fn sample_addrs() -> Vec<Addr> {
        vec![
            v4("10.0.0.1:80"),
            v4("0.0.0.0:0"),
            v4("255.255.255.255:65535"),
            Addr::Ip("[2001:db8::1]:443".parse().unwrap()),
            Addr::Ip("[::]:0".parse().unwrap()),
            Addr::Domain("example.com".into(), 8080),
            Addr::Domain("a".into(), 1),
            Addr::Domain("x".repeat(255), 65535),
        ]
    }

    /// Every proper prefix of a complete message is `Ok(None)`; the whole message, with
    /// trailing bytes after it, parses to `expected` consuming exactly `bytes.len()`.
    fn check_message<T: PartialEq + fmt::Debug>(
        bytes: &[u8],
        parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, ProtoError>,
        expected: &T,
    ) {
        for i in 0..bytes.len() {
            assert_eq!(
                parse(&bytes[..i]),
                Ok(None),
                "prefix of {i} bytes of {bytes:02x?}"
            );
        }
        let (value, n) = parse(bytes).unwrap().unwrap();
        assert_eq!(&value, expected);
        assert_eq!(n, bytes.len());
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(b"trailing relay data");
        let (value, n) = parse(&longer).unwrap().unwrap();
        assert_eq!(&value, expected);
        assert_eq!(n, bytes.len());
    }

    #[test]
    fn greeting_round_trip() {
        for methods in [
            vec![Method::ITCP_SESSION, Method::NO_AUTH],
            vec![Method::NO_AUTH],
            (0..=254).map(Method).collect(),
        ] {
            let mut buf = Vec::new();
            encode_greeting(&mut buf, &methods);
            check_message(&buf, parse_greeting, &methods);
        }
    }

    #[test]
    fn greeting_bytes() {
        let mut buf = Vec::new();
        encode_greeting(&mut buf, &[Method::ITCP_SESSION, Method::NO_AUTH]);
        assert_eq!(buf, [0x05, 0x02, 0x80, 0x00]);
    }

    #[test]
    fn method_choice_round_trip() {
        for m in [
            Method::NO_AUTH,
            Method::ITCP_SESSION,
            Method::NONE_ACCEPTABLE,
            Method(0x02),
        ] {
            let mut buf = Vec::new();
            encode_method_choice(&mut buf, m);
            assert_eq!(buf, [0x05, m.0]);
            check_message(&buf, parse_method_choice, &m);
        }
    }

    #[test]
    fn method_select() {
        use Method as M;
        assert_eq!(M::select(&[M::NO_AUTH, M::ITCP_SESSION]), M::ITCP_SESSION);
        assert_eq!(M::select(&[M(0x02), M::NO_AUTH]), M::NO_AUTH);
        assert_eq!(M::select(&[M(0x02)]), M::NONE_ACCEPTABLE);
        assert_eq!(M::select(&[]), M::NONE_ACCEPTABLE);
    }

    #[test]
    fn token_round_trip() {
        let sealed = SealedToken {
            public: [7; 32],
            sealed: *b"0123456789abcdef",
            tag: [9; 16],
        };
        let mut buf = Vec::new();
        encode_token(&mut buf, &sealed);
        assert_eq!(buf.len(), SEALED_TOKEN_LEN);
        assert_eq!(buf[0], 0x02);
        assert_eq!(&buf[33..49], b"0123456789abcdef");
        check_message(&buf, parse_token, &sealed);
        // The clear-text version 01 of older clients is refused, with the reason.
        let mut old = vec![0x01];
        old.extend_from_slice(b"0123456789abcdef");
        assert!(matches!(
            parse_token(&old),
            Err(ProtoError::BadVersion {
                got: 1,
                expected: 2,
                ..
            })
        ));
    }

    #[test]
    fn key_share_round_trip() {
        let mut buf = Vec::new();
        encode_key_share(&mut buf, &[5; 32]);
        assert_eq!(buf.len(), KEY_SHARE_LEN);
        assert_eq!(buf[0], 0x02);
        check_message(&buf, parse_key_share, &[5; 32]);
    }

    #[test]
    fn token_status_round_trip() {
        for status in [TOKEN_STATUS_OK, 0x01, 0xFF] {
            let mut buf = Vec::new();
            encode_token_status(&mut buf, status);
            assert_eq!(buf, [0x02, status]);
            check_message(&buf, parse_token_status, &status);
        }
    }

    #[test]
    fn request_round_trip_all_commands_and_addresses() {
        for command in [
            Command::Connect,
            Command::Bind,
            Command::Listen,
            Command::Accept,
        ] {
            for addr in sample_addrs() {
                let mut buf = Vec::new();
                encode_request(&mut buf, command, &addr).unwrap();
                assert_eq!(buf.len(), 3 + addr.encoded_len());
                assert_eq!(frame_len(&buf), Ok(Some(buf.len())));
                check_message(&buf, parse_request, &Request { command, addr });
            }
        }
    }

    #[test]
    fn reply_round_trip_all_codes_and_addresses() {
        for code in 0..=0x0A {
            let reply = Reply::from_u8(code).unwrap();
            assert_eq!(reply.as_u8(), code);
            for addr in sample_addrs() {
                let mut buf = Vec::new();
                encode_reply(&mut buf, reply, &addr).unwrap();
                assert_eq!(frame_len(&buf), Ok(Some(buf.len())));
                check_message(&buf, parse_reply, &Response { reply, addr });
            }
        }
    }

    #[test]
    fn byte_exact_vectors() {
        let mut buf = Vec::new();
        encode_request(&mut buf, Command::Connect, &v4("10.0.0.1:80")).unwrap();
        assert_eq!(
            buf,
            [0x05, 0x01, 0x00, 0x01, 0x0a, 0x00, 0x00, 0x01, 0x00, 0x50]
        );

        buf.clear();
        encode_request(&mut buf, Command::Listen, &v4("0.0.0.0:5001")).unwrap();
        assert_eq!(buf, [0x05, 0x80, 0x00, 0x01, 0, 0, 0, 0, 0x13, 0x89]);

        buf.clear();
        encode_request(&mut buf, Command::Accept, &Addr::unspecified(true, 80)).unwrap();
        let mut expected = vec![0x05, 0x81, 0x00, 0x04];
        expected.extend_from_slice(&[0; 16]);
        expected.extend_from_slice(&[0x00, 0x50]);
        assert_eq!(buf, expected);

        buf.clear();
        encode_request(&mut buf, Command::Connect, &Addr::Domain("fh".into(), 443)).unwrap();
        assert_eq!(buf, [0x05, 0x01, 0x00, 0x03, 0x02, b'f', b'h', 0x01, 0xbb]);

        buf.clear();
        encode_reply(&mut buf, Reply::ConnectionRefused, &Addr::UNSPECIFIED_V4).unwrap();
        assert_eq!(buf, [0x05, 0x05, 0x00, 0x01, 0, 0, 0, 0, 0, 0]);

        buf.clear();
        encode_reply(&mut buf, Reply::Succeeded, &v4("10.1.0.2:40000")).unwrap();
        assert_eq!(buf, [0x05, 0x00, 0x00, 0x01, 10, 1, 0, 2, 0x9c, 0x40]);
    }

    #[test]
    fn parse_known_vectors() {
        let (req, n) = parse_request(&[0x05, 0x01, 0x00, 0x01, 0x0a, 0, 0, 1, 0x00, 0x50])
            .unwrap()
            .unwrap();
        assert_eq!(n, 10);
        assert_eq!(req.command, Command::Connect);
        assert_eq!(req.addr, v4("10.0.0.1:80"));

        let (resp, n) = parse_reply(&[0x05, 0x0A, 0x00, 0x01, 0, 0, 0, 0, 0, 0])
            .unwrap()
            .unwrap();
        assert_eq!(n, 10);
        assert_eq!(resp.reply, Reply::AddrInUse);
    }

    #[test]
    fn malformed_greeting() {
        assert_eq!(
            parse_greeting(&[0x04, 0x01, 0x00]),
            Err(ProtoError::BadVersion {
                message: MessageKind::Greeting,
                got: 4,
                expected: 5
            })
        );
        // Reported as soon as the version byte arrives.
        assert!(parse_greeting(&[0x04]).is_err());
        assert_eq!(parse_greeting(&[0x05, 0x00]), Err(ProtoError::NoMethods));
        assert_eq!(
            parse_greeting(&[0x04]).unwrap_err().to_string(),
            "greeting version 4, expected 5"
        );
    }

    #[test]
    fn malformed_token_messages() {
        let e = parse_token(&[0x01; 17]).unwrap_err();
        assert_eq!(e.to_string(), "token sub-negotiation version 1, expected 2");
        let e = parse_key_share(&[0x05; 33]).unwrap_err();
        assert_eq!(e.to_string(), "key share version 5, expected 2");
        let e = parse_token_status(&[0x05, 0x00]).unwrap_err();
        assert_eq!(e.to_string(), "token status version 5, expected 2");
        let e = parse_method_choice(&[0x04, 0x00]).unwrap_err();
        assert_eq!(e.to_string(), "method choice version 4, expected 5");
    }

    #[test]
    fn malformed_requests() {
        let cases: Vec<(Vec<u8>, ProtoError, &str, Reply)> = vec![
            (
                vec![0x04, 0x01, 0x00, 0x01, 10, 0, 0, 1, 0, 80],
                ProtoError::BadVersion {
                    message: MessageKind::Request,
                    got: 4,
                    expected: 5,
                },
                "request version 4, expected 5",
                Reply::GeneralFailure,
            ),
            (
                vec![0x05, 0x01, 0x01, 0x01, 10, 0, 0, 1, 0, 80],
                ProtoError::BadReserved(1),
                "reserved byte is 0x01, expected 0",
                Reply::GeneralFailure,
            ),
            (
                vec![0x05, 0x01, 0x00, 0x02, 10, 0, 0, 1, 0, 80],
                ProtoError::UnknownAddrType(2),
                "unknown address type 0x02",
                Reply::GeneralFailure,
            ),
            (
                vec![0x05, 0x01, 0x00, 0x03, 0x00, 0, 80],
                ProtoError::EmptyDomain,
                "domain name of length 0",
                Reply::GeneralFailure,
            ),
            (
                vec![0x05, 0x01, 0x00, 0x03, 0x02, 0xff, 0xfe, 0, 80],
                ProtoError::DomainNotUtf8,
                "domain name is not valid UTF-8",
                Reply::GeneralFailure,
            ),
            (
                vec![0x05, 0x07, 0x00, 0x01, 10, 0, 0, 1, 0, 80],
                ProtoError::UnknownCommand(7),
                "unknown command 0x07",
                Reply::CommandNotSupported,
            ),
        ];
        for (bytes, err, text, reply) in cases {
            assert_eq!(parse_request(&bytes), Err(err.clone()), "{bytes:02x?}");
            assert_eq!(err.to_string(), text);
            assert_eq!(err.reply(), reply);
        }
        // Errors are reported as soon as the offending byte has arrived.
        assert!(parse_request(&[0x04]).is_err());
        assert_eq!(
            parse_request(&[0x05, 0x03]),
            Err(ProtoError::UnknownCommand(3))
        );
        assert_eq!(
            parse_request(&[0x05, 0x01, 0x02]),
            Err(ProtoError::BadReserved(2))
        );
        assert_eq!(
            parse_request(&[0x05, 0x01, 0x00, 0x05]),
            Err(ProtoError::UnknownAddrType(5))
        );
        assert_eq!(
            parse_request(&[0x05, 0x01, 0x00, 0x03, 0x00]),
            Err(ProtoError::EmptyDomain)
        );
    }

    #[test]
    fn malformed_replies() {
        assert_eq!(
            parse_reply(&[0x05, 0x0B, 0x00, 0x01, 0, 0, 0, 0, 0, 0]),
            Err(ProtoError::UnknownReply(0x0B))
        );
        assert_eq!(
            parse_reply(&[0x00, 0x5A]).unwrap_err().to_string(),
            "reply version 0, expected 5"
        );
        assert_eq!(
            parse_reply(&[0x05, 0x00, 0x01]),
            Err(ProtoError::BadReserved(1))
        );
        assert_eq!(
            parse_reply(&[0x05, 0x00, 0x00, 0x00]),
            Err(ProtoError::UnknownAddrType(0))
        );
    }

    #[test]
    fn frame_len_needs_header() {
        assert_eq!(frame_len(&[0x05, 0x00, 0x00]), Ok(None));
        assert_eq!(frame_len(&[0x05, 0x00, 0x00, 0x01]), Ok(Some(10)));
        assert_eq!(frame_len(&[0x05, 0x00, 0x00, 0x04]), Ok(Some(22)));
        assert_eq!(frame_len(&[0x05, 0x00, 0x00, 0x03]), Ok(None));
        assert_eq!(frame_len(&[0x05, 0x00, 0x00, 0x03, 7]), Ok(Some(14)));
        assert_eq!(
            frame_len(&[0x05, 0x00, 0x00, 0x09]),
            Err(ProtoError::UnknownAddrType(9))
        );
    }

    #[test]
    fn encoding_bad_domains_fails_cleanly() {
        let mut buf = vec![0xAA];
        assert_eq!(
            encode_request(&mut buf, Command::Connect, &Addr::Domain(String::new(), 1)),
            Err(ProtoError::EmptyDomain)
        );
        assert_eq!(
            encode_reply(
                &mut buf,
                Reply::Succeeded,
                &Addr::Domain("x".repeat(256), 1)
            ),
            Err(ProtoError::DomainTooLong(256))
        );
        assert_eq!(buf, [0xAA]);
    }

    #[test]
    fn reply_error_kinds() {
        use io::ErrorKind as K;
        let table = [
            (0x01, K::Other),
            (0x02, K::PermissionDenied),
            (0x03, K::NetworkUnreachable),
            (0x04, K::HostUnreachable),
            (0x05, K::ConnectionRefused),
            (0x06, K::TimedOut),
            (0x07, K::Unsupported),
            (0x08, K::Unsupported),
            (0x09, K::NotFound),
            (0x0A, K::AddrInUse),
        ];
        for (code, kind) in table {
            assert_eq!(Reply::from_u8(code).unwrap().to_io_error_kind(), kind);
        }
        assert_eq!(Reply::from_u8(0x0B), None);
    }

    #[test]
    fn reply_from_io_error() {
        let os = io::Error::from_raw_os_error;
        assert_eq!(
            Reply::from_io_error(&os(libc::ECONNREFUSED)),
            Reply::ConnectionRefused
        );
        assert_eq!(
            Reply::from_io_error(&os(libc::ENETUNREACH)),
            Reply::NetworkUnreachable
        );
        assert_eq!(
            Reply::from_io_error(&os(libc::EHOSTUNREACH)),
            Reply::HostUnreachable
        );
        assert_eq!(
            Reply::from_io_error(&os(libc::ETIMEDOUT)),
            Reply::TtlExpired
        );
        assert_eq!(
            Reply::from_io_error(&os(libc::EADDRINUSE)),
            Reply::AddrInUse
        );
        assert_eq!(Reply::from_io_error(&os(libc::EACCES)), Reply::NotAllowed);
        assert_eq!(Reply::from_io_error(&os(libc::EPERM)), Reply::NotAllowed);
        assert_eq!(
            Reply::from_io_error(&os(libc::EMFILE)),
            Reply::GeneralFailure
        );
        let timeout = io::Error::new(io::ErrorKind::TimedOut, "connect timed out");
        assert_eq!(Reply::from_io_error(&timeout), Reply::TtlExpired);
        let other = io::Error::other("boom");
        assert_eq!(Reply::from_io_error(&other), Reply::GeneralFailure);
    }

    #[test]
    fn token_hex() {
        let t = Token::from_hex("00112233445566778899AABBCCDDEEFF\n").unwrap();
        assert_eq!(t.0[0], 0x00);
        assert_eq!(t.0[15], 0xFF);
        assert_eq!(t.to_hex(), "00112233445566778899aabbccddeeff");
        assert_eq!(Token::from_hex(&t.to_hex()), Some(t));
        assert_eq!(Token::from_hex("0011"), None);
        assert_eq!(Token::from_hex("g0112233445566778899aabbccddeeff"), None);
        assert_eq!(format!("{t:?}"), "Token(0011…)");
        assert!(t.ct_eq(&t));
        assert!(!t.ct_eq(&Token([0; 16])));
    }

    #[test]
    fn addr_display() {
        assert_eq!(v4("10.0.0.1:80").to_string(), "10.0.0.1:80");
        assert_eq!(
            Addr::Ip("[::1]:80".parse().unwrap()).to_string(),
            "[::1]:80"
        );
        assert_eq!(
            Addr::Domain("fh.example".into(), 80).to_string(),
            "fh.example:80"
        );
    }
}
