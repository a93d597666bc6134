//! `itcp-mh`: the mobile host's side of I-TCP.
//!
//! An MH application opens its TCP connections *through* its current mobility support
//! router (MSR): the MSR opens the fixed-side connection from the MH's own address and
//! relays, so the fixed host sees an ordinary connection from the MH while the wireless
//! half is a separate, tuned TCP connection between the MH and the MSR. The request
//! protocol is SOCKS5 with I-TCP extensions (`docs/protocol.md`), spoken to the
//! *gateway address* every MSR of the network shares (port 1080 by default).
//!
//! * [`ItcpStream::connect`] — active open; the result reads and writes like a
//!   `TcpStream` to the peer.
//! * [`ItcpListener::bind`] / [`ItcpListener::accept`] — passive open: the MSR listens on
//!   the MH's address and hands each arriving connection over.
//! * [`nonblocking`] — the same for tokio (cargo feature `tokio`, on by default).
//! * [`MhOptions`] — gateway (explicit, `ITCP_GATEWAY`, or the default route's gateway),
//!   session [`token`](mod@token) (explicit, `ITCP_TOKEN`, or a shared token file), timeouts.
//! * [`socks`] — the sans-IO wire codec, used by this library and by `msrd`.
//! * [`mobility`] / [`agent`] — movement detection and the mobility agent that greets
//!   new MSRs (`itcp-mh-agent`); [`link`] — the wireless interface's carrier from
//!   rtnetlink, on which the agent solicits a beacon.
//!
//! # Example: connect
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use itcp_mh::ItcpStream;
//!
//! // Gateway from ITCP_GATEWAY or the default route.
//! let mut s = ItcpStream::connect("10.0.0.1:80")?;
//! s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
//! let mut page = Vec::new();
//! s.read_to_end(&mut page)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Example: listen and accept
//!
//! ```no_run
//! use std::io::Write;
//! use itcp_mh::{ItcpListener, MhOptions};
//!
//! let opts = MhOptions::new().gateway("10.2.0.1:1080".parse().unwrap());
//! let listener = ItcpListener::bind_with(&opts, 5001)?;
//! println!("listening on {}", listener.local_addr()?);
//! loop {
//!     let (mut conn, peer) = listener.accept()?;
//!     writeln!(conn, "hello {peer}")?;
//! }
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Example: async
//!
//! ```no_run
//! # #[cfg(feature = "tokio")]
//! # async fn demo() -> std::io::Result<()> {
//! use tokio::io::AsyncWriteExt;
//! use itcp_mh::nonblocking::{ItcpListener, ItcpStream};
//!
//! let mut s = ItcpStream::connect("10.0.0.1:7").await?;
//! s.write_all(b"ping").await?;
//!
//! let listener = ItcpListener::bind(0).await?;
//! let (conn, peer) = listener.accept().await?;
//! # drop((conn, peer)); Ok(()) }
//! ```
//!
//! # Errors
//!
//! Failures reported by the MSR become `io::Error`s with the `ErrorKind` of the
//! protocol's table (refused → `ConnectionRefused`, unreachable →
//! `NetworkUnreachable`/`HostUnreachable`, timed out → `TimedOut`, not allowed →
//! `PermissionDenied`, port taken → `AddrInUse`, …) and messages such as
//! "I-TCP gateway 10.2.0.1:1080 could not connect to 10.0.0.1:9: connection refused".
//! Failing to reach the gateway itself reads "cannot reach I-TCP gateway …". A
//! handshake that breaks off or times out once connected names our end of the
//! connection, as msrd's logs and handoff records do ("I-TCP gateway 10.2.0.1:1080
//! (from 10.2.0.100:58870) did not answer the method negotiation within 10s").

#![warn(missing_docs)]

pub mod agent;
pub mod answers;
mod blocking;
mod handshake;
pub mod link;
pub mod mobility;
pub mod neigh;
#[cfg(feature = "tokio")]
pub mod nonblocking;
pub mod options;
/// The request protocol's codec (re-exported from `itcp-proto`).
pub use itcp_proto::socks;
pub mod token;

pub use blocking::{register, request_on, Incoming, ItcpListener, ItcpStream};
pub use options::{parse_gateway, MhOptions};
pub use socks::{Addr, Token};
pub use token::token;
