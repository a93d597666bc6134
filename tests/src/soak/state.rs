//! What msrd holds and what it changed on its router, read at the start and the end of
//! the soak: file descriptors by type, RSS, sessions, the elements of every set in its
//! nftables table, neighbour and proxy entries, routes (all tables), its temporary host
//! routes and policy rules.

use std::io;

use serde::Serialize;

use crate::lab::{Host, Lab};

/// One MSR's state at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MsrState {
    pub pid: u32,
    pub fds: usize,
    pub sockets: usize,
    pub pipes: usize,
    pub other_fds: usize,
    pub rss_kib: u64,
    /// Live connections in msrd's session table (None: it did not answer).
    pub sessions: Option<usize>,
    /// The same, in words (for the report when some are left).
    #[serde(skip)]
    pub session_list: Vec<String>,
    /// Elements of msrd's flow-hold sets (`held4`, `held6`). The `strays` sets of
    /// closed flows are not counted: their elements time out by themselves.
    pub nft_elements: usize,
    /// Neighbour entries (not proxy).
    pub neigh: usize,
    /// The same, as `ip neigh` lists them (for the report when they grew).
    #[serde(skip)]
    pub neigh_list: Vec<String>,
    /// Addresses this MSR answers ARP for (proxy entries).
    pub proxy: Vec<String>,
    /// Routes in all tables (IPv4).
    pub routes: usize,
    /// msrd's temporary host routes (`proto 73`).
    pub host_routes: usize,
    pub rules: usize,
}

fn lines(lab: &Lab, k: usize, args: &[&str]) -> io::Result<Vec<String>> {
    let out = lab.run(Host::Msr(k), args[0], &args[1..])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect())
}

/// Counts the elements of every `elements = { … }` block of an `nft list` output.
pub fn count_nft_elements(text: &str) -> usize {
    let mut n = 0;
    let mut rest = text;
    while let Some(i) = rest.find("elements = {") {
        let after = &rest[i + "elements = {".len()..];
        let end = after.find('}').unwrap_or(after.len());
        n += after[..end]
            .split(',')
            .filter(|e| !e.trim().is_empty())
            .count();
        rest = &after[end..];
    }
    n
}

/// Reads MSR `k`'s state; `pid` is its msrd.
pub fn snapshot(lab: &Lab, k: usize, pid: u32) -> io::Result<MsrState> {
    let mut s = MsrState {
        pid,
        ..Default::default()
    };
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            s.fds += 1;
            let t = std::fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            if t.starts_with("socket:") {
                s.sockets += 1;
            } else if t.starts_with("pipe:") {
                s.pipes += 1;
            } else {
                s.other_fds += 1;
            }
        }
    }
    s.rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    if let Ok(v) = lab.msrd_sessions(k) {
        s.sessions = Some(v.len());
        s.session_list = v
            .iter()
            .map(|x| {
                format!(
                    "{} {} ⇄ {} {} age {:.0} s, {} B up, {} B down{}",
                    x.id,
                    x.mh,
                    x.fh,
                    x.state(),
                    x.age_s,
                    x.bytes_up,
                    x.bytes_down,
                    if x.moved_in { ", moved in" } else { "" }
                )
            })
            .collect();
    }
    s.nft_elements = 0;
    for set in ["held4", "held6"] {
        let out = lab.run(
            Host::Msr(k),
            "nft",
            &["list", "set", "inet", "itcp_msrd", set],
        )?;
        s.nft_elements += count_nft_elements(&String::from_utf8_lossy(&out.stdout));
    }
    s.neigh_list = lines(lab, k, &["ip", "-4", "neigh", "show"])?;
    s.neigh = s.neigh_list.len();
    s.proxy = lines(lab, k, &["ip", "-4", "neigh", "show", "proxy"])?
        .iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    s.routes = lines(lab, k, &["ip", "-4", "route", "show", "table", "all"])?.len();
    s.host_routes = lines(
        lab,
        k,
        &["ip", "-4", "route", "show", "table", "all", "proto", "73"],
    )?
    .len();
    s.rules = lines(lab, k, &["ip", "-4", "rule", "show"])?.len();
    Ok(s)
}

/// Pooled relay pipes msrd may keep (256 empty pipes, two fds each): not a leak.
pub const PIPE_POOL_FDS: usize = 512;
/// RSS growth over the soak that counts as growth (allocator caches stay warm after
/// load; a leak in a long soak grows past this).
pub const RSS_SLACK_KIB: u64 = 64 * 1024;

/// What grew between `start` and `end` beyond what msrd may keep (empty: nothing).
/// `mhs` is the number of MHs, `msrs` of MSRs (neighbour entries are bounded by the
/// hosts an MSR talks to).
pub fn growth(start: &MsrState, end: &MsrState, mhs: usize, msrs: usize) -> Vec<String> {
    let mut g = Vec::new();
    // Per peer: the channel msrd keeps open to it and the one it keeps to msrd
    // (`keep_channels`), and as many again being replaced or carrying a handoff.
    // Plus the sockets the runtime's threads keep for their own use once they have
    // restarted a few connections (raw segment replay, packet, netlink; 2 workers
    // here): a fixed number, where a leak grows with the soak.
    let socket_slack = 4 * msrs.saturating_sub(1) + 8;
    if end.sockets > start.sockets + socket_slack {
        g.push(format!(
            "sockets {} → {} (more than {socket_slack} over the start)",
            start.sockets, end.sockets
        ));
    }
    if end.pipes > start.pipes + PIPE_POOL_FDS {
        g.push(format!(
            "pipes {} → {} (more than the pool's {PIPE_POOL_FDS})",
            start.pipes, end.pipes
        ));
    }
    if end.other_fds > start.other_fds + 4 {
        g.push(format!("other fds {} → {}", start.other_fds, end.other_fds));
    }
    if end.rss_kib > start.rss_kib + RSS_SLACK_KIB {
        g.push(format!(
            "RSS {} → {} KiB (more than {} MiB over the start)",
            start.rss_kib,
            end.rss_kib,
            RSS_SLACK_KIB / 1024
        ));
    }
    match end.sessions {
        Some(0) => {}
        Some(n) => g.push(format!(
            "{n} sessions left after every connection ended: {}",
            end.session_list.join(" | ")
        )),
        None => g.push("msrd did not answer its control socket".into()),
    }
    if end.nft_elements > start.nft_elements {
        g.push(format!(
            "nftables set elements {} → {}",
            start.nft_elements, end.nft_elements
        ));
    }
    // An entry per MH on the cell and on the fixed LAN, the GW, the other MSRs.
    let neigh_bound = (2 * mhs + msrs).max(start.neigh);
    if end.neigh > neigh_bound {
        g.push(format!(
            "neighbour entries {} → {} (more than the {neigh_bound} the {mhs} MHs, the GW and the other MSRs explain: {})",
            start.neigh,
            end.neigh,
            end.neigh_list.join(" | ")
        ));
    }
    if end.proxy.len() > mhs {
        g.push(format!("{} proxy entries for {mhs} MHs", end.proxy.len()));
    }
    if end.routes > start.routes {
        g.push(format!("routes {} → {}", start.routes, end.routes));
    }
    if end.host_routes > 0 {
        g.push(format!("{} temporary host routes left", end.host_routes));
    }
    if end.rules > start.rules {
        g.push(format!("policy rules {} → {}", start.rules, end.rules));
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_set_elements_across_lines() {
        let t = "table inet itcp_msrd {\n  set held4 {\n    type ipv4_addr\n    elements = { 10.2.0.100, 10.2.0.101,\n      10.2.0.102 }\n  }\n  set held6 {\n    type ipv6_addr\n  }\n}\n";
        assert_eq!(count_nft_elements(t), 3);
        assert_eq!(count_nft_elements("table inet x {\n}\n"), 0);
    }

    #[test]
    fn growth_allows_the_pool_and_flags_leaks() {
        let start = MsrState {
            sockets: 10,
            pipes: 0,
            rss_kib: 5000,
            sessions: Some(0),
            neigh: 3,
            routes: 8,
            rules: 4,
            ..Default::default()
        };
        let mut end = start.clone();
        end.pipes = 40;
        end.sockets = 14;
        assert!(growth(&start, &end, 8, 3).is_empty());
        end.sessions = Some(2);
        end.host_routes = 1;
        end.proxy = (0..9).map(|i| format!("10.2.0.{i}")).collect();
        let g = growth(&start, &end, 8, 3);
        assert_eq!(g.len(), 3, "{g:?}");
        // Two peers: 4 each and 8 for the runtime's threads; one more is a leak.
        end.sockets = start.sockets + 16;
        assert_eq!(growth(&start, &end, 8, 3).len(), 3);
        end.sockets += 1;
        assert_eq!(growth(&start, &end, 8, 3).len(), 4);
    }
}
