//! The operator socket: JSON lines over a Unix socket, read by `itcpctl`. The
//! requests and replies are the typed ones of [`itcp_proto::control`].
//!
//! Requests: `{"op":"sessions"}`, `{"op":"stats"}`, `{"op":"metrics"}`,
//! `{"op":"upgrade"}` (answered once the upgrade is over: [`crate::upgrade`]). A
//! malformed request gets `{"ok":false,"reply":"error","error":…}` and the connection
//! stays usable.

use std::path::Path;
use std::sync::Arc;

use itcp_proto::control::{
    Body, MetricsReply, Reply, Request, SessionsReply, StatsReply, UpgradeReply,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};

use crate::sessions::Sessions;

/// Longest request line read (requests are tens of bytes): a longer one is answered
/// with an error and the connection closed, so nothing buffers without bound.
pub const MAX_LINE: usize = 64 << 10;

/// Reads one line of at most [`MAX_LINE`] bytes. Ok(None) at the end of the stream;
/// Err(()) when the line is too long.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<String>, ()> {
    use tokio::io::AsyncReadExt;
    buf.clear();
    let n = match (&mut *r)
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', buf)
        .await
    {
        Ok(n) => n,
        Err(_) => return Ok(None),
    };
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE {
        return Err(());
    }
    while buf.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
        buf.pop();
    }
    Ok(Some(String::from_utf8_lossy(buf).into_owned()))
}

/// An operator's upgrade request: the outcome goes back on `reply`; `written` tells
/// the daemon that the answer is out (an old msrd exits only then).
pub struct UpgradeAsk {
    pub reply: oneshot::Sender<Result<UpgradeReply, String>>,
    pub written: oneshot::Receiver<()>,
}

/// Answers one request.
pub fn answer(sessions: &Sessions, id: &str, req: Request) -> Reply {
    match req {
        Request::Sessions => Body::Sessions(SessionsReply {
            msr: id.to_string(),
            sessions: sessions.list(),
        }),
        Request::Stats => Body::Stats(StatsReply {
            msr: id.to_string(),
            active: sessions.len() as u64,
            stats: sessions.stats.snapshot(),
        }),
        Request::Metrics => Body::Metrics(MetricsReply {
            text: sessions.metrics(),
        }),
        Request::Upgrade => return Reply::error("upgrades are not served on this socket"),
    }
    .into()
}

/// Answers one request line (malformed ones with an error reply).
pub fn answer_line(sessions: &Sessions, id: &str, line: &str) -> Reply {
    match Request::parse(line) {
        Ok(req) => answer(sessions, id, req),
        Err(e) => Reply::error(e),
    }
}

/// Binds the control socket at `path` (replacing a stale one), for operators only:
/// msrd's user and group (mode 0660; under the unit `itcp`, whose group operators
/// join) and root. The mode is the socket's from its creation, not set after it.
pub fn bind(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use socket2::{Domain, SockAddr, Socket, Type};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let sock = Socket::new(Domain::UNIX, Type::STREAM.cloexec(), None)?;
    // Sessions reveal who talks to whom. bind(2) creates the file with the socket's
    // own mode less the umask: set before, it leaves no moment of a wider one.
    nix::sys::stat::fchmod(&sock, nix::sys::stat::Mode::from_bits_truncate(MODE))?;
    sock.bind(&SockAddr::unix(path)?)?;
    // The umask may have taken group bits away: give them back.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(MODE))?;
    sock.listen(128)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// The control socket's mode: msrd's user and group.
const MODE: u32 = 0o660;

/// Serves the control socket until the task is dropped.
pub async fn serve(path: &Path, id: String, sessions: Arc<Sessions>) -> std::io::Result<()> {
    let listener = UnixListener::from_std(bind(path)?)?;
    serve_on(listener, id, sessions, None).await;
    Ok(())
}

/// Serves a bound control socket until the task is dropped; `upgrades` takes the
/// `upgrade` requests (None: refused).
pub async fn serve_on(
    listener: UnixListener,
    id: String,
    sessions: Arc<Sessions>,
    upgrades: Option<mpsc::UnboundedSender<UpgradeAsk>>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: back off and keep serving; operators need this
                // socket most when msrd is under pressure.
                tracing::warn!(error = %e, "control socket accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (sessions, id, upgrades) = (sessions.clone(), id.clone(), upgrades.clone());
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut r = BufReader::new(r);
            let mut buf = Vec::new();
            loop {
                let line = match read_line(&mut r, &mut buf).await {
                    Ok(Some(l)) => l,
                    Ok(None) => break,
                    Err(()) => {
                        let e = format!("request line longer than {MAX_LINE} bytes: closed");
                        let _ = w.write_all(Reply::error(e).to_line().as_bytes()).await;
                        break;
                    }
                };
                let mut written = None;
                let reply = match (Request::parse(&line), &upgrades) {
                    (Ok(Request::Upgrade), Some(up)) => {
                        let (tx, rx) = oneshot::channel();
                        let (wtx, wrx) = oneshot::channel();
                        written = Some(wtx);
                        let ask = UpgradeAsk {
                            reply: tx,
                            written: wrx,
                        };
                        match up.send(ask) {
                            Err(_) => Reply::error("msrd is shutting down"),
                            Ok(()) => match rx.await {
                                Ok(Ok(u)) => Body::Upgrade(u).into(),
                                Ok(Err(e)) => Reply::error(e),
                                Err(_) => Reply::error("msrd is shutting down"),
                            },
                        }
                    }
                    _ => answer_line(&sessions, &id, &line),
                };
                let ok = w.write_all(reply.to_line().as_bytes()).await.is_ok();
                if let Some(wtx) = written {
                    let _ = w.flush().await;
                    let _ = wtx.send(());
                }
                if !ok {
                    break;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_errors() {
        let s = Sessions::default();
        let r = answer_line(&s, "m", r#"{"op":"sessions"}"#);
        assert!(r.ok);
        assert_eq!(r.sessions().unwrap().msr, "m");
        let st = answer_line(&s, "m", r#"{"op":"stats"}"#).stats().unwrap();
        assert_eq!(st.active, 0);
        assert!(answer_line(&s, "m", r#"{"op":"metrics"}"#)
            .metrics()
            .unwrap()
            .contains("msrd_connections_active 0"));
        let e = answer_line(&s, "m", "{nope");
        assert!(!e.ok);
        assert!(e.into_result().unwrap_err().contains("not JSON"));
        let e = answer_line(&s, "m", r#"{"op":"dance"}"#).to_line();
        assert!(e.contains("unknown variant"), "{e}");
        assert!(e.starts_with(r#"{"ok":false,"#), "{e}");
    }

    #[test]
    fn the_socket_is_for_its_user_and_group_only_from_the_start() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("itcp-control-mode-{}", std::process::id()));
        let path = dir.join("c.sock");
        let _l = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_bad_line_leaves_the_connection_usable() {
        let dir = std::env::temp_dir().join(format!("itcp-control-{}", std::process::id()));
        let path = dir.join("c.sock");
        let s = Arc::new(Sessions::default());
        let server = tokio::spawn({
            let path = path.clone();
            async move { serve(&path, "m".into(), s).await }
        });
        let mut c = loop {
            match tokio::net::UnixStream::connect(&path).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        };
        c.write_all(b"garbage\n{\"op\":\"stats\"}\n").await.unwrap();
        let mut lines = BufReader::new(c).lines();
        let first = Reply::parse(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert!(!first.ok);
        let second = Reply::parse(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(second.stats().unwrap().msr, "m");
        server.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn an_endless_line_is_refused_and_the_socket_serves_on() {
        let dir = std::env::temp_dir().join(format!("itcp-control-long-{}", std::process::id()));
        let path = dir.join("c.sock");
        let s = Arc::new(Sessions::default());
        let server = tokio::spawn({
            let path = path.clone();
            async move { serve(&path, "m".into(), s).await }
        });
        let c = loop {
            match tokio::net::UnixStream::connect(&path).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        };
        let (r, mut w) = c.into_split();
        // 4 MiB with no newline: refused after MAX_LINE, not buffered to the end.
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 64 << 10];
            for _ in 0..64 {
                if w.write_all(&chunk).await.is_err() {
                    break;
                }
            }
        });
        let mut lines = BufReader::new(r).lines();
        let reply = Reply::parse(&lines.next_line().await.unwrap().unwrap()).unwrap();
        let e = reply.into_result().unwrap_err();
        assert!(e.contains("longer than"), "{e}");
        // Closed: end of stream, or a reset for the bytes it never read.
        assert!(!matches!(lines.next_line().await, Ok(Some(_))), "closed");
        writer.abort();
        let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
        c.write_all(b"{\"op\":\"stats\"}\n").await.unwrap();
        let mut lines = BufReader::new(c).lines();
        let ok = Reply::parse(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(ok.stats().unwrap().msr, "m");
        server.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
