//! systemd's readiness protocol (`sd_notify`), for `Type=notify` units: a datagram to
//! `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace). Without the
//! variable (not under systemd) nothing is sent.
//!
//! msrd sends `READY=1` once it serves, `STOPPING=1` when it drains, and during an
//! upgrade the old process sends `MAINPID=<new pid>` before it lets the new one serve
//! (deploy/msrd.service).

use std::os::unix::net::UnixDatagram;

/// Sends one notification; false if there is no systemd to tell, or it failed.
pub fn notify(state: &str) -> bool {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(path) => notify_to(&path, state),
        None => false,
    }
}

/// Sends one notification to the socket `path` (`NOTIFY_SOCKET`'s form).
pub fn notify_to(path: &std::ffi::OsStr, state: &str) -> bool {
    let Ok(sock) = UnixDatagram::unbound() else {
        return false;
    };
    let bytes = path.as_encoded_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
        }
        None => sock.send_to(state.as_bytes(), path),
    };
    if let Err(e) = &sent {
        tracing::debug!(error = %e, state, "systemd notification not sent");
    }
    sent.is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn notifications_reach_the_socket() {
        let dir = std::env::temp_dir().join(format!("itcp-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let rx = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        assert!(super::notify_to(path.as_os_str(), "READY=1"));
        let mut b = [0u8; 64];
        let n = rx.recv(&mut b).unwrap();
        assert_eq!(&b[..n], b"READY=1");
        // The abstract namespace, as systemd uses it.
        let name = format!("itcp-notify-{}", std::process::id());
        let a = {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap()
        };
        let rx2 = std::os::unix::net::UnixDatagram::bind_addr(&a).unwrap();
        assert!(super::notify_to(format!("@{name}").as_ref(), "MAINPID=7"));
        let n = rx2.recv(&mut b).unwrap();
        assert_eq!(&b[..n], b"MAINPID=7");
        assert!(!super::notify_to(dir.join("none").as_os_str(), "READY=1"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
