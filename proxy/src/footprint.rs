//! Everything msrd changes on the router, and how it is undone: at exit, and at the
//! next start after a crash (SIGKILL, OOM, power cut) left it behind.
//!
//! | change | made by | undone |
//! |---|---|---|
//! | nftables table `[interception] nft_table` | start | exit; replaced at start |
//! | fwmark policy rule and route table `[interception] route_table` | start | exit; replaced at start |
//! | proxy-ARP/NDP entries for MH addresses on `[handoff] lan_interface` | takeovers | handoff out; exit; start |
//! | host routes for MHs with a large `initcwnd` (protocol [`ROUTE_PROTO`]) | restores | after restart; exit; start |
//! | `net.ipv4.neigh.<lan_interface>.proxy_delay` = 0 | start | exit; start (original value kept in the state file) |
//! | with IPv6 MH prefixes: `net.ipv6.conf.<lan_interface>.proxy_ndp` = 1 and `net.ipv6.neigh.<lan_interface>.proxy_delay` = 0 | start | exit; start (original values kept in the state file) |
//! | the cell interfaces' MAC address = `[msr] gateway_mac` | start | exit; start (original kept in the state file) |
//!
//! The state file (`<control_socket>.state`) holds what cannot be found again from
//! the kernel alone: the sysctls' original values, the cells' original MACs. It is
//! msrd's own file (mode 0600, in its runtime directory under the unit): a symbolic
//! link planted at its path is never followed, on reading or on writing.

use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use itcp_config::IpPrefix;
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use crate::intercept::Rules;

/// Routing protocol number marking msrd's temporary host routes (`ip route … proto 73`),
/// so that they can be found and flushed after a crash.
pub const ROUTE_PROTO: u8 = 73;

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// (path under /proc/sys, original value)
    sysctls: Vec<(String, String)>,
    /// (interface, original MAC address)
    #[serde(default)]
    macs: Vec<(String, String)>,
}

/// msrd's footprint on this router.
#[derive(Debug, Clone)]
pub struct Footprint {
    pub state_file: PathBuf,
    pub rules: Rules,
    pub lan_interface: Option<String>,
    pub mh_prefixes: Vec<IpPrefix>,
}

impl Footprint {
    /// The state file's contents (none yet: empty). A symbolic link there is refused,
    /// never followed: msrd writes its own file, in its own directory.
    fn load(&self) -> io::Result<State> {
        let bytes = match read_nofollow(&self.state_file) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
            Err(e) => return Err(self.state_error(e)),
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::other(format!("state file {}: {e}", self.state_file.display())))
    }

    /// Writes the state file whole or not at all, never through a link: a new file
    /// (mode 0600) next to it, renamed over it.
    fn store(&self, st: &State) -> io::Result<()> {
        if let Some(d) = self.state_file.parent() {
            std::fs::create_dir_all(d)?;
        }
        let path = &self.state_file;
        if path
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
        {
            return Err(self.state_error(io::Error::from_raw_os_error(libc::ELOOP)));
        }
        let tmp = temp_path(path);
        let bytes = serde_json::to_vec(st).map_err(io::Error::other)?;
        write_new(&tmp, &bytes).map_err(|e| self.state_error(e))?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    /// An error about the state file, naming it; a link is said to be one.
    fn state_error(&self, e: io::Error) -> io::Error {
        let p = self.state_file.display();
        if e.raw_os_error() == Some(libc::ELOOP) {
            return io::Error::new(
                e.kind(),
                format!("state file {p} (or its .tmp) is a symbolic link: not followed; remove it"),
            );
        }
        io::Error::new(e.kind(), format!("state file {p}: {e}"))
    }

    /// At start, before anything is installed: undoes what a dead msrd left.
    pub fn recover(&self) {
        let left = self.state_file.symlink_metadata().is_ok();
        self.undo_kernel_state();
        if left {
            info!(state = %self.state_file.display(), "cleaned up after an msrd that did not exit cleanly");
        }
    }

    /// Sets a sysctl (a path under /proc/sys), remembering its original value first.
    pub fn set_sysctl(&self, path: &str, value: &str) -> io::Result<()> {
        let old = std::fs::read_to_string(path)?.trim().to_string();
        let mut st = self.load()?;
        if !st.sysctls.iter().any(|(p, _)| p == path) {
            st.sysctls.push((path.to_string(), old));
            self.store(&st)?;
        }
        std::fs::write(path, value)
    }

    /// Gives interface `ifname` the MAC address `mac`, remembering its own first.
    pub fn set_mac(&self, ifname: &str, mac: [u8; 6]) -> io::Result<()> {
        let old = crate::netlink::link_mac(ifname)?;
        if old == mac {
            return Ok(());
        }
        let mut st = self.load()?;
        if !st.macs.iter().any(|(i, _)| i == ifname) {
            st.macs
                .push((ifname.to_string(), itcp_proto::hex::mac(&old)));
            self.store(&st)?;
        }
        crate::netlink::set_link_mac(ifname, mac)
    }

    /// At exit: removes every change (errors are logged; exit goes on).
    pub fn undo(&self) {
        self.rules.remove();
        self.undo_kernel_state();
    }

    fn undo_kernel_state(&self) {
        let st = self.load().unwrap_or_else(|e| {
            error!(error = %e, "sysctls and MAC addresses not restored");
            State::default()
        });
        for (path, old) in &st.sysctls {
            if let Err(e) = std::fs::write(path, old) {
                warn!(%path, error = %e, "sysctl not restored");
            }
        }
        for (ifname, old) in &st.macs {
            let r = itcp_proto::hex::parse_mac(old)
                .ok_or_else(|| io::Error::other(format!("bad MAC {old:?} in the state file")))
                .and_then(|m| crate::netlink::set_link_mac(ifname, m));
            if let Err(e) = r {
                warn!(interface = %ifname, error = %e, "MAC address not restored");
            }
        }
        if let Some(lan) = &self.lan_interface {
            for ip in proxy_entries(lan) {
                if self.mh_prefixes.iter().any(|p| p.contains(ip)) {
                    if let Err(e) = crate::netlink::proxy_neigh(lan, ip, false) {
                        warn!(%ip, interface = %lan, error = %e, "proxy entry not removed");
                    }
                }
            }
        }
        for v in ["-4", "-6"] {
            let _ = Command::new("ip")
                .args([v, "route", "flush", "proto", &ROUTE_PROTO.to_string()])
                .output();
        }
        if (st.sysctls.is_empty() && st.macs.is_empty())
            || std::fs::remove_file(&self.state_file).is_ok()
        {
            return;
        }
        warn!(state = %self.state_file.display(), "state file not removed");
    }
}

/// Where the state file is written before it is renamed into place.
fn temp_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".tmp");
    p.into()
}

/// Reads a file, failing with ELOOP if `path` is a symbolic link.
fn read_nofollow(path: &Path) -> io::Result<Vec<u8>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut b = Vec::new();
    f.read_to_end(&mut b)?;
    Ok(b)
}

/// Creates `path` (mode 0600) with `bytes`, flushed to disk. Never opens an existing
/// file or follows a link: a regular file left there by a crash is removed first, a
/// link is an error (ELOOP).
fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    };
    let mut f = match create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if path.symlink_metadata()?.file_type().is_symlink() {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            std::fs::remove_file(path)?;
            create()?
        }
        r => r?,
    };
    f.write_all(bytes)?;
    f.sync_all()
}

/// The addresses of the proxy neighbour entries on `ifname` (`ip neigh show proxy`).
fn proxy_entries(ifname: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for v in ["-4", "-6"] {
        let Ok(o) = Command::new("ip")
            .args([v, "neigh", "show", "proxy", "dev", ifname])
            .output()
        else {
            continue;
        };
        out.extend(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next()?.parse::<IpAddr>().ok()),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("itcp-footprint-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn footprint(state_file: PathBuf) -> Footprint {
        Footprint {
            state_file,
            rules: Rules {
                table: "itcp_test".into(),
                fwmark: 1,
                route_table: 1,
                transparent: None,
                detect: None,
                mh_prefixes: Vec::new(),
                hold_queue: 1,
                handshake_group: None,
                cell_guard: None,
            },
            lan_interface: None,
            mh_prefixes: Vec::new(),
        }
    }

    /// A "sysctl" that is a plain file, so that set_sysctl runs unprivileged.
    fn fake_sysctl(d: &Path) -> String {
        let p = d.join("proxy_delay");
        std::fs::write(&p, "80\n").unwrap();
        p.display().to_string()
    }

    #[test]
    fn a_link_planted_at_the_state_files_path_is_not_followed() {
        let d = scratch("link");
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let state = d.join("control.sock.state");
        symlink(&victim, &state).unwrap();
        let fp = footprint(state.clone());
        let sysctl = fake_sysctl(&d);
        let e = fp.set_sysctl(&sysctl, "0").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        // Nothing changed that could not be undone: the sysctl was left alone.
        assert_eq!(std::fs::read_to_string(&sysctl).unwrap(), "80\n");
        // Nor is it read through.
        let e = fp.load().unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(state.symlink_metadata().unwrap().file_type().is_symlink());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_link_planted_at_the_temporary_path_is_not_followed() {
        let d = scratch("tmplink");
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let state = d.join("control.sock.state");
        symlink(&victim, temp_path(&state)).unwrap();
        let fp = footprint(state.clone());
        let e = fp.set_sysctl(&fake_sysctl(&d), "0").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(state.symlink_metadata().is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_state_file_is_private_and_survives_a_left_temporary() {
        let d = scratch("plain");
        let state = d.join("control.sock.state");
        // A temporary file left by a crash between create and rename.
        std::fs::write(temp_path(&state), "half").unwrap();
        let fp = footprint(state.clone());
        let sysctl = fake_sysctl(&d);
        fp.set_sysctl(&sysctl, "0").unwrap();
        assert_eq!(std::fs::read_to_string(&sysctl).unwrap(), "0");
        let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(temp_path(&state).symlink_metadata().is_err());
        assert_eq!(fp.load().unwrap().sysctls, vec![(sysctl, "80".into())]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
