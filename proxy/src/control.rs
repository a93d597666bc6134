//! The operator socket: JSON lines over a Unix socket, read by `itcpctl`.
//!
//! Requests: `{"op":"sessions"}`, `{"op":"stats"}`, `{"op":"metrics"}`. A malformed
//! request gets `{"ok":false,"error":…}` and the connection stays usable.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

use crate::sessions::Sessions;

/// Answers one request line.
pub fn answer(sessions: &Sessions, id: &str, line: &str) -> Value {
    let req: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return json!({"ok": false, "error": format!("request is not JSON: {e}")}),
    };
    match req["op"].as_str() {
        Some("sessions") => json!({"ok": true, "msr": id, "sessions": sessions.list()}),
        Some("stats") => {
            json!({"ok": true, "msr": id, "active": sessions.len(), "stats": &sessions.stats})
        }
        Some("metrics") => json!({"ok": true, "text": sessions.metrics()}),
        Some(op) => {
            json!({"ok": false, "error": format!("unknown op {op:?} (sessions, stats, metrics)")})
        }
        None => json!({"ok": false, "error": "request needs an \"op\" string"}),
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
                let mut out = serde_json::to_vec(&answer(&sessions, &id, line.trim())).unwrap();
                out.push(b'\n');
                if w.write_all(&out).await.is_err() {
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
        assert_eq!(answer(&s, "m", r#"{"op":"sessions"}"#)["ok"], true);
        assert_eq!(answer(&s, "m", r#"{"op":"stats"}"#)["active"], 0);
        assert!(answer(&s, "m", r#"{"op":"metrics"}"#)["text"]
            .as_str()
            .unwrap()
            .contains("msrd_connections_active 0"));
        assert!(answer(&s, "m", "{nope").to_string().contains("not JSON"));
        assert!(answer(&s, "m", r#"{"op":"dance"}"#)
            .to_string()
            .contains("unknown op"));
    }
}
