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
//! the kernel alone: the sysctls' original values, the cells' original MACs.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;

use itcp_config::IpPrefix;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

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
    fn load(&self) -> State {
        std::fs::read(&self.state_file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn store(&self, st: &State) -> io::Result<()> {
        if let Some(d) = self.state_file.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(
            &self.state_file,
            serde_json::to_vec(st).map_err(io::Error::other)?,
        )
    }

    /// At start, before anything is installed: undoes what a dead msrd left.
    pub fn recover(&self) {
        let left = self.state_file.exists();
        self.undo_kernel_state();
        if left {
            info!(state = %self.state_file.display(), "cleaned up after an msrd that did not exit cleanly");
        }
    }

    /// Sets a sysctl (a path under /proc/sys), remembering its original value first.
    pub fn set_sysctl(&self, path: &str, value: &str) -> io::Result<()> {
        let old = std::fs::read_to_string(path)?.trim().to_string();
        let mut st = self.load();
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
        let mut st = self.load();
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
        let st = self.load();
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
