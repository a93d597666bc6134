//! The operator socket: JSON lines over a Unix socket, read by `itcpctl`. The
//! requests and replies are the typed ones of [`itcp_proto::control`].
//!
//! Requests: `{"op":"sessions"}`, `{"op":"stats"}`, `{"op":"metrics"}`. A malformed
//! request gets `{"ok":false,"reply":"error","error":…}` and the connection stays
//! usable.

use std::path::Path;
use std::sync::Arc;

use itcp_proto::control::{Body, MetricsReply, Reply, Request, SessionsReply, StatsReply};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

use crate::sessions::Sessions;

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

/// Serves the control socket until the task is dropped.
pub async fn serve(path: &Path, id: String, sessions: Arc<Sessions>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    // Sessions reveal who talks to whom: operators only.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
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
        let (sessions, id) = (sessions.clone(), id.clone());
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut lines = BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let out = answer_line(&sessions, &id, &line).to_line();
                if w.write_all(out.as_bytes()).await.is_err() {
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
}
