//! Association events from the access point of a cell (`[[cell]] hostapd = PATH`).
//!
//! Where the MSR runs the cell's access point, hostapd knows of an arriving station
//! before the station's OS has said anything: its control interface reports
//! `AP-STA-CONNECTED <mac>` to every attached monitor. Each such event is handled as a
//! frame from that station that proves no address ([`crate::detect::station_seen`]):
//! the peers are asked which MHs the station is, and those are pulled.
//!
//! The protocol (hostapd's `ctrl_iface`, as `hostapd_cli` speaks it): a Unix datagram
//! socket of ours sends `ATTACH` to hostapd's socket and gets `OK`; events then come
//! as datagrams `<level>EVENT args…`. `PING` is answered `PONG`: sent every
//! [`KEEPALIVE`], it notices a hostapd that restarted (and forgot us), and we attach
//! again.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixDatagram;
use tracing::{debug, info, warn};

use crate::daemon::Daemon;

/// How often hostapd is pinged, and how long an answer may take.
const KEEPALIVE: Duration = Duration::from_secs(5);
const ANSWER: Duration = Duration::from_secs(1);
/// The wait before attaching again after hostapd was unreachable.
const RETRY: Duration = Duration::from_secs(1);

/// A station that associated, from one event datagram; None for anything else.
pub fn connected_station(event: &[u8]) -> Option<[u8; 6]> {
    let text = std::str::from_utf8(event).ok()?.trim_end();
    // `<3>` and the like: the message level.
    let text = match text.strip_prefix('<') {
        Some(rest) => &rest[rest.find('>')? + 1..],
        None => text,
    };
    let mut words = text.split_ascii_whitespace();
    if words.next()? != "AP-STA-CONNECTED" {
        return None;
    }
    itcp_proto::hex::parse_mac(words.next()?)
}

/// Our end of the control interface, as hostapd_cli makes its own: a socket file, in
/// `dir` (msrd's runtime directory), unique per cell and process. A file rather than an
/// abstract name: hostapd may live in another network namespace, which abstract
/// names do not cross.
fn local_path(dir: &Path, cell: &str) -> PathBuf {
    dir.join(format!("hostapd-{cell}-{}.sock", std::process::id()))
}

/// Attaches to hostapd at `path` as a monitor from `local`: the socket events come on.
async fn attach(local: &Path, path: &Path) -> io::Result<UnixDatagram> {
    let _ = std::fs::remove_file(local);
    let sock = UnixDatagram::bind(local)?;
    sock.connect(path)?;
    sock.send(b"ATTACH").await?;
    let mut buf = [0u8; 256];
    loop {
        let n = tokio::time::timeout(ANSWER, sock.recv(&mut buf))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to ATTACH"))??;
        match &buf[..n] {
            b"OK\n" | b"OK" => return Ok(sock),
            b"FAIL\n" | b"FAIL" => return Err(io::Error::other("hostapd refused ATTACH")),
            // An event or a stale answer: not ours yet.
            _ => {}
        }
    }
}

/// Follows the association events of the hostapd of cell `cell` (its control socket
/// `path`) until the daemon ends, attaching again whenever hostapd is gone. Our end's
/// socket file goes in `dir`.
pub async fn run(d: Arc<Daemon>, cell: String, path: PathBuf, dir: PathBuf) {
    let local = local_path(&dir, &cell);
    let _cleanup = RemoveOnDrop(local.clone());
    let mut said_down = false;
    loop {
        let sock = match attach(&local, &path).await {
            Ok(s) => s,
            Err(e) => {
                if !std::mem::replace(&mut said_down, true) {
                    warn!(%cell, path = %path.display(), error = %e, "hostapd not reachable: association events wait for it");
                }
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        said_down = false;
        info!(%cell, path = %path.display(), "hostapd attached: association events on");
        let why = follow(&d, &sock).await;
        warn!(%cell, path = %path.display(), reason = %why, "hostapd lost: attaching again");
    }
}

/// Removes our socket file when the task ends (aborted at shutdown).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Handles events from an attached socket until hostapd stops answering.
async fn follow(d: &Arc<Daemon>, sock: &UnixDatagram) -> String {
    let mut buf = vec![0u8; 4096];
    let mut ping = tokio::time::interval(KEEPALIVE);
    ping.tick().await;
    let mut awaiting_pong = false;
    loop {
        tokio::select! {
            r = sock.recv(&mut buf) => match r {
                Ok(n) => {
                    let msg = &buf[..n];
                    if msg.starts_with(b"PONG") {
                        awaiting_pong = false;
                    } else if let Some(mac) = connected_station(msg) {
                        debug!(mac = %itcp_proto::hex::mac(&mac), "hostapd: station associated");
                        crate::detect::station_seen(d, mac, Vec::new());
                    }
                }
                Err(e) => return e.to_string(),
            },
            _ = ping.tick() => {
                if awaiting_pong {
                    return "no PONG".into();
                }
                if let Err(e) = sock.send(b"PING").await {
                    return e.to_string();
                }
                awaiting_pong = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn association_events_name_the_station() {
        let mac = Some([2, 0, 0, 0, 0, 0x64]);
        assert_eq!(
            connected_station(b"<3>AP-STA-CONNECTED 02:00:00:00:00:64"),
            mac
        );
        assert_eq!(
            connected_station(b"<3>AP-STA-CONNECTED 02:00:00:00:00:64 keyid=home\n"),
            mac
        );
        assert_eq!(
            connected_station(b"AP-STA-CONNECTED 02:00:00:00:00:64"),
            mac
        );
    }

    #[test]
    fn other_messages_name_none() {
        for m in [
            &b"<3>AP-STA-DISCONNECTED 02:00:00:00:00:64"[..],
            b"<3>AP-STA-CONNECTED",
            b"<3>AP-STA-CONNECTED 02:00:00:00:00",
            b"<3AP-STA-CONNECTED 02:00:00:00:00:64",
            b"PONG\n",
            b"OK\n",
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(connected_station(m), None, "{m:?}");
        }
    }
}
