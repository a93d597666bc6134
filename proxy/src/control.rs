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

/// What an operator asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `{"op":"sessions"}`
    Sessions,
    /// `{"op":"stats"}`
    Stats,
    /// `{"op":"metrics"}`
    Metrics,
}

/// Parses one request line; the error is the message sent back. Pure (no state), so
/// it is fuzzed on its own (`fuzz/fuzz_targets/control_request.rs`).
pub fn parse_request(line: &str) -> Result<Op, String> {
    let req: Value = serde_json::from_str(line).map_err(|e| format!("request is not JSON: {e}"))?;
    match req["op"].as_str() {
        Some("sessions") => Ok(Op::Sessions),
        Some("stats") => Ok(Op::Stats),
        Some("metrics") => Ok(Op::Metrics),
        Some(op) => Err(format!("unknown op {op:?} (sessions, stats, metrics)")),
        None => Err("request needs an \"op\" string".into()),
    }
}

/// Answers one request line.
pub fn answer(sessions: &Sessions, id: &str, line: &str) -> Value {
    match parse_request(line) {
        Ok(Op::Sessions) => json!({"ok": true, "msr": id, "sessions": sessions.list()}),
        Ok(Op::Stats) => {
            json!({"ok": true, "msr": id, "active": sessions.len(), "stats": &sessions.stats})
        }
        Ok(Op::Metrics) => json!({"ok": true, "text": sessions.metrics()}),
        Err(error) => json!({"ok": false, "error": error}),
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
        let (stream, _) = listener.accept().await?;
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
