//! The fixed side: sockets that impersonate the MH towards the FH. They are transparent
//! (IP_TRANSPARENT) so they can bind the MH's own address; the interception rules route
//! the FH's packets for them to the local stack.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use itcp_config::TcpTuning;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::sockopt;

fn transparent_socket(addr: SocketAddr, tuning: &TcpTuning) -> io::Result<TcpSocket> {
    let s = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    let fd = &s;
    sockopt::set_transparent(fd, addr.is_ipv6())?;
    sockopt::set_reuseaddr(fd)?;
    sockopt::apply_pre_connect(fd, tuning)?;
    Ok(s)
}

/// Opens a connection to `fh` from `mh` (the MH's address and, if free, port).
/// Errors keep their OS error kind, so the caller can map them to reply codes;
/// a timeout becomes `ErrorKind::TimedOut`.
pub async fn connect_as(
    mh: SocketAddr,
    fh: SocketAddr,
    tuning: &TcpTuning,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let s = transparent_socket(mh, tuning)?;
    if s.bind(mh).is_err() {
        // The MH's port is taken here (e.g. an old connection in TIME_WAIT): let the
        // kernel pick one; the FH still sees the MH's address.
        let s = transparent_socket(mh, tuning)?;
        let mut any = mh;
        any.set_port(0);
        s.bind(any)?;
        return finish_connect(s, fh, tuning, timeout).await;
    }
    finish_connect(s, fh, tuning, timeout).await
}

async fn finish_connect(
    s: TcpSocket,
    fh: SocketAddr,
    tuning: &TcpTuning,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, s.connect(fh))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {fh} timed out after {timeout:?}"),
            )
        })??;
    sockopt::apply_post_connect(&stream, tuning)?;
    Ok(stream)
}

/// Listens on the MH's address (port 0: an ephemeral one) on the MH's behalf.
pub fn listen_as(mh: SocketAddr, tuning: &TcpTuning, backlog: u32) -> io::Result<TcpListener> {
    let s = transparent_socket(mh, tuning)?;
    s.bind(mh)?;
    s.listen(backlog)
}
