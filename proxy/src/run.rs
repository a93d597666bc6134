//! msrd's process: binds its sockets (or adopts them in an upgrade), installs its
//! rules, spawns the servers (requests, greetings, channel, control, metrics, beacons,
//! network detection) and runs until SIGTERM/SIGINT drains it or an upgrade hands
//! everything to a new process.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use itcp_config::MsrdConfig;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::daemon::{listen_socket, Daemon};
use crate::sockopt;
use crate::upgrade::wire::Role;
use crate::upgrade::Services;

/// Runs msrd until SIGTERM/SIGINT, then drains; or until an upgrade hands everything
/// to a new process. `adopt`: this process is that new process ([`crate::upgrade`]).
pub fn run(cfg: MsrdConfig, adopt: Option<OwnedFd>) -> io::Result<()> {
    // Before any thread starts: capabilities are per thread.
    drop_capabilities()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let upgraded = rt.block_on(run_async(cfg, adopt))?;
    if upgraded {
        // Tasks left (connections in setup, metrics requests) end with the process.
        rt.shutdown_background();
    }
    Ok(())
}

/// Keeps only the capabilities msrd needs ([`crate::capabilities`]) and says which.
fn drop_capabilities() -> io::Result<()> {
    use crate::capabilities::{keep_only_needed, names, CAP_SYS_RESOURCE};
    let o = keep_only_needed()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot drop capabilities: {e}")))?;
    info!(
        kept = %names(o.kept),
        dropped = %names(o.dropped),
        bounding_set_cut = o.bounded,
        "capabilities"
    );
    let fatal = o.missing & !(1 << CAP_SYS_RESOURCE);
    if fatal != 0 {
        warn!(
            missing = %names(fatal),
            "without these, interception, handoffs or restores fail (run as root, or \
             with them as ambient capabilities as msrd.service does)"
        );
    }
    if o.missing & (1 << CAP_SYS_RESOURCE) != 0 {
        info!(
            "without CAP_SYS_RESOURCE: the fd limit stays at its hard limit, and splice \
             pipes past fs.pipe-user-pages-soft get 8 KiB instead of [relay] pipe_size"
        );
    }
    Ok(())
}

/// What the fd limit leaves of `[access] max_connections`.
#[derive(Debug, PartialEq, Eq)]
enum FdFit {
    /// The limits at their maximum fit.
    Enough,
    /// Lowered to `to`; `warn` when the operator asked for more than that (the default
    /// is a ceiling, not a demand: lowering it is routine outside systemd, whose unit
    /// raises the limit), or when the limit leaves no room for connections at all.
    Lowered { to: u32, warn: bool },
}

/// Each relayed connection holds two sockets, connections in setup up to
/// `max_handshakes` more, and `RESERVE` covers listeners, channels, pipes' fallbacks and
/// the rest (splice pipes come from a pool that falls back to copying when no fd is
/// left).
fn fd_fit(a: &itcp_config::AccessSection, nofile: u64) -> FdFit {
    const RESERVE: u64 = 128;
    let budget = nofile.saturating_sub(RESERVE + u64::from(a.max_handshakes)) / 2;
    if u64::from(a.max_connections) <= budget {
        return FdFit::Enough;
    }
    let default = itcp_config::AccessSection::default().max_connections;
    FdFit::Lowered {
        to: budget.clamp(1, u64::from(u32::MAX)) as u32,
        warn: a.max_connections != default || budget == 0,
    }
}

/// Caps the connection limit to what the fd limit (already raised to the hard limit)
/// can serve, in one log line: a warning only when the configuration asked for more.
fn fit_to_fd_limit(mut cfg: MsrdConfig, nofile: u64) -> MsrdConfig {
    let a = &mut cfg.access;
    if let FdFit::Lowered { to, warn } = fd_fit(a, nofile) {
        if warn {
            warn!(
                configured = a.max_connections,
                max_handshakes = a.max_handshakes,
                nofile,
                using = to,
                "access.max_connections is more than the fd limit can serve: lowered \
                 (raise LimitNOFILE, or the hard limit, to serve more)"
            );
        } else {
            info!(
                nofile,
                max_connections = to,
                "connection limit set by the fd limit"
            );
        }
        a.max_connections = to;
        a.max_connections_per_mh = a.max_connections_per_mh.min(to);
    }
    cfg
}

/// Binds the sockets of a fresh start: request and TPROXY ports, then (once the
/// rules are ours, see below) the rest.
fn bind_accept(cfg: &MsrdConfig) -> io::Result<Vec<(Role, String, OwnedFd)>> {
    let mut bound = Vec::new();
    for addr in cfg.msr.socks_addrs() {
        let l = listen_socket(addr, &cfg.wireless, false).map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::AddrNotAvailable => {
                    "; is the gateway address configured on the cell interface?"
                }
                io::ErrorKind::AddrInUse => "; is another msrd running?",
                _ => "",
            };
            io::Error::new(
                e.kind(),
                format!("cannot listen on {addr} ([msr] gateway, socks_port): {e}{hint}"),
            )
        })?;
        info!(%addr, "request listener up");
        bound.push((Role::Socks, addr.to_string(), OwnedFd::from(l.into_std()?)));
    }
    if cfg.transparent.enabled {
        for addr in crate::upgrade::transparent_addrs(cfg) {
            let l = listen_socket(addr, &cfg.wireless, true).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot listen on {addr} ([transparent] listen_port): {e}"),
                )
            })?;
            info!(%addr, ports = ?cfg.transparent.ports, "transparent interception up");
            bound.push((
                Role::Transparent,
                addr.to_string(),
                OwnedFd::from(l.into_std()?),
            ));
        }
    }
    Ok(bound)
}

/// Binds the other sockets of a fresh start; the footprint is ours already.
async fn bind_rest(
    cfg: &MsrdConfig,
    footprint: &crate::footprint::Footprint,
) -> io::Result<Vec<(Role, String, OwnedFd)>> {
    let mut bound = Vec::new();
    let path = &cfg.msr.control_socket;
    match crate::control::bind(path) {
        Ok(l) => bound.push((Role::Control, path.display().to_string(), OwnedFd::from(l))),
        Err(e) => warn!(path = %path.display(), error = %e, "control socket failed"),
    }
    if let Some(addr) = cfg.metrics.listen {
        let l = TcpListener::bind(addr).await.map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::AddrNotAvailable => "; is that address configured on this router?",
                io::ErrorKind::AddrInUse => "; is another msrd or exporter on that port?",
                _ => "",
            };
            io::Error::new(
                e.kind(),
                format!("cannot listen on {addr} ([metrics] listen): {e}{hint}"),
            )
        })?;
        info!(%addr, "metrics and status page up");
        bound.push((
            Role::Metrics,
            addr.to_string(),
            OwnedFd::from(l.into_std()?),
        ));
    }
    if let Some(listen) = cfg.handoff.listen {
        let l = TcpListener::bind(listen).await.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on {listen} ([handoff] listen): {e}"),
            )
        })?;
        bound.push((
            Role::Channel,
            listen.to_string(),
            OwnedFd::from(l.into_std()?),
        ));
        let port = cfg.handoff.greet_port;
        // Greetings are heard on the cells only, never from the fixed LAN.
        let socks = crate::handoff::greeting::sockets_of(cfg);
        let greeters = crate::handoff::greeting::bind(&socks, port)
            .map_err(|e| io::Error::new(e.kind(), format!("[handoff] greet_port: {e}")))?;
        for (gs, g) in socks.iter().zip(greeters) {
            bound.push((Role::Greeting, gs.name(), OwnedFd::from(g.into_std()?)));
        }
        if let Some(lan) = &cfg.handoff.lan_interface {
            // Proxied ARP replies are otherwise delayed by up to 0.8 s.
            let r =
                crate::netlink::proxy_delay_path(lan).and_then(|p| footprint.set_sysctl(&p, "0"));
            if let Err(e) = r {
                warn!(interface = %lan, error = %e, "proxied ARP replies may be delayed");
            }
            // Proxy neighbour entries answer IPv6 solicitations only with proxy_ndp on,
            // and (as for ARP) up to 0.8 s late unless proxy_delay is 0.
            if cfg.access.mh_prefixes.iter().any(|p| !p.is_ipv4()) {
                let r =
                    crate::netlink::proxy_ndp_path(lan).and_then(|p| footprint.set_sysctl(&p, "1"));
                if let Err(e) = r {
                    warn!(interface = %lan, error = %e, "no proxy NDP: IPv6 MHs cannot move here");
                }
                let r = crate::netlink::proxy_delay6_path(lan)
                    .and_then(|p| footprint.set_sysctl(&p, "0"));
                if let Err(e) = r {
                    warn!(interface = %lan, error = %e, "proxied neighbour advertisements may be delayed");
                }
            }
        }
        info!(%listen, greet_port = port, peers = cfg.handoff.peers.len(), "handoff up");
    }
    Ok(bound)
}

/// Runs the daemon; true when it ended by handing everything to a new process.
async fn run_async(cfg: MsrdConfig, adopt: Option<OwnedFd>) -> io::Result<bool> {
    // Signals first: until tokio handles SIGUSR2, it would end the process.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    let nofile = sockopt::raise_nofile_limit();
    let d = Daemon::new(fit_to_fd_limit(cfg, nofile))?;
    let cfg = &d.cfg;
    // Before the greeting sockets serve: they pass solicitations to it.
    if cfg.beacon.enabled {
        if let Some(a) = crate::beacon::Advertiser::open(
            &cfg.beacon,
            &cfg.msr.id,
            cfg.msr.gateway_mac(),
            &cfg.beacon_interfaces(),
        ) {
            let _ = d.beacons.set(Arc::new(a));
        }
    }
    let footprint = crate::footprint::Footprint {
        state_file: {
            let mut p = cfg.msr.control_socket.clone().into_os_string();
            p.push(".state");
            p.into()
        },
        rules: d.rules.clone(),
        lan_interface: cfg.handoff.lan_interface.clone(),
        mh_prefixes: cfg.access.mh_prefixes.clone(),
    };
    // From the moment the footprint is ours everything msrd changed must be undone
    // whatever happens, unless an upgrade hands it to a new process.
    struct Undo(crate::footprint::Footprint);
    impl Drop for Undo {
        fn drop(&mut self) {
            self.0.undo();
        }
    }
    let services = Services::default();
    let undo = match adopt {
        None => {
            let bound = bind_accept(cfg)?;
            // Rules only once every listener is ours: a second msrd that cannot bind
            // must not replace (and on exit remove) the first one's rules, nor clean
            // up after it.
            footprint.recover();
            let undo = Undo(footprint);
            d.rules.install().map_err(|e| {
                io::Error::new(e.kind(), format!("installing interception rules: {e}"))
            })?;
            if let Some(mac) = cfg.msr.gateway_mac() {
                for c in &cfg.cells {
                    undo.0.set_mac(&c.interface, mac).map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!("[msr] gateway_mac on {}: {e}", c.interface),
                        )
                    })?;
                }
            }
            let rest = bind_rest(cfg, &undo.0).await?;
            for (role, name, fd) in bound.into_iter().chain(rest) {
                services.add(&d, role, name, fd)?;
            }
            undo
        }
        Some(ch) => {
            // The old msrd's footprint is in place and becomes ours: neither cleaned
            // up nor installed again.
            crate::upgrade::adopt(&d, ch, &services).await?;
            let undo = Undo(footprint);
            if !services
                .sockets_of(Role::Control)
                .contains(&cfg.msr.control_socket.display().to_string())
            {
                let path = &cfg.msr.control_socket;
                match crate::control::bind(path) {
                    Ok(l) => {
                        services.add(&d, Role::Control, path.display().to_string(), l.into())?
                    }
                    Err(e) => warn!(path = %path.display(), error = %e, "control socket failed"),
                }
            }
            undo
        }
    };
    let detection = match (&d.rules.detect, &d.handoff) {
        (Some(dt), Some(_)) => Some(tokio::spawn(crate::detect::run(d.clone(), dt.group))),
        _ => None,
    };
    // Association events from the cells' access points, where configured.
    let access_points: Vec<_> = match detection {
        Some(_) => cfg
            .cells
            .iter()
            .filter_map(|c| Some((c.interface.clone(), c.hostapd.clone()?)))
            .map(|(cell, path)| {
                let dir = cfg
                    .msr
                    .control_socket
                    .parent()
                    .unwrap_or(std::path::Path::new("/run"));
                tokio::spawn(crate::hostapd::run(
                    d.clone(),
                    cell,
                    path,
                    dir.to_path_buf(),
                ))
            })
            .collect(),
        None => Vec::new(),
    };
    let handshakes = d
        .rules
        .handshake_group
        .map(|g| tokio::spawn(crate::handoff::handshakes::run(d.clone(), g)));
    // Packets held during handoffs are kept, not dropped.
    let holding = d
        .handoff
        .as_ref()
        .map(|_| tokio::spawn(crate::holding::run(d.holding.clone())));
    // Channels to the peers, opened ahead of the handoffs that will need them.
    let spares = d
        .handoff
        .as_ref()
        .filter(|h| h.cfg.keep_channels && !h.cfg.peers.is_empty())
        .map(|_| tokio::spawn(crate::handoff::spares::keep(d.clone())));
    let beacons = d.beacons.get().map(|a| {
        tokio::spawn(crate::beacon::run(
            cfg.beacon.clone(),
            a.clone(),
            d.draining.subscribe(),
        ))
    });
    // Memory freed by a crowd of closed connections goes back to the system.
    tokio::spawn(crate::heap::run(d.clone()));
    info!(msr = %cfg.msr.id, nofile, pid = std::process::id(), "msrd ready");
    crate::notify::notify("READY=1");

    let mut asks = d.upgrade_asks.lock().unwrap().take().expect("run once");
    loop {
        let ask = tokio::select! {
            _ = term.recv() => {
                info!("SIGTERM: draining");
                break;
            }
            _ = int.recv() => {
                info!("SIGINT: draining");
                break;
            }
            _ = usr2.recv() => {
                info!("SIGUSR2: upgrading");
                None
            }
            Some(a) = asks.recv() => {
                info!("upgrade requested on the control socket");
                Some(a)
            }
        };
        match crate::upgrade::upgrade(&d, &services).await {
            Ok(reply) => {
                if let Some(a) = ask {
                    let _ = a.reply.send(Ok(reply));
                    // Exit once the operator has the answer (a second at most).
                    let _ = tokio::time::timeout(Duration::from_secs(1), a.written).await;
                }
                // The new process owns the footprint and the control socket now, and
                // takes the hold queue once we let it go.
                for t in [&holding, &handshakes].into_iter().flatten() {
                    t.abort();
                }
                d.holding.close();
                std::mem::forget(undo);
                return Ok(true);
            }
            Err(e) => {
                if let Some(a) = ask {
                    let _ = a
                        .reply
                        .send(Err(format!("upgrade failed, msrd serves on: {e}")));
                }
            }
        }
    }
    crate::notify::notify("STOPPING=1");
    let _ = d.draining.send(true);
    services.stop_accepting().await;
    let deadline = Instant::now() + cfg.relay.drain_timeout();
    while !d.sessions.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = d.sessions.len();
    if left > 0 {
        warn!(left, "drain timeout: closing remaining connections");
    } else {
        info!("drained");
    }
    services.abort_all();
    if let Some(b) = beacons {
        b.abort();
    }
    for t in [detection, spares, holding, handshakes]
        .into_iter()
        .flatten()
        .chain(access_points)
    {
        t.abort();
    }
    // The queue is free for the msrd that follows (an upgrade's).
    d.holding.close();
    let _ = std::fs::remove_file(&cfg.msr.control_socket);
    drop(undo);
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::{fd_fit, FdFit};
    use itcp_config::AccessSection;

    #[test]
    fn the_default_limits_are_lowered_quietly_to_what_the_fd_limit_serves() {
        let a = AccessSection::default();
        // A shell's usual hard limit, outside systemd.
        assert_eq!(
            fd_fit(&a, 20_000),
            FdFit::Lowered {
                to: (20_000 - 128 - 1024) / 2,
                warn: false
            }
        );
        assert_eq!(fd_fit(&a, 1 << 20), FdFit::Enough);
    }

    #[test]
    fn limits_the_operator_set_too_high_are_lowered_with_a_warning() {
        let a = AccessSection {
            max_connections: 50_000,
            ..AccessSection::default()
        };
        assert_eq!(
            fd_fit(&a, 20_000),
            FdFit::Lowered {
                to: 9424,
                warn: true
            }
        );
        let small = AccessSection {
            max_connections: 5_000,
            ..AccessSection::default()
        };
        assert_eq!(fd_fit(&small, 20_000), FdFit::Enough);
        // No room at all: even the default is worth a warning.
        assert_eq!(
            fd_fit(&AccessSection::default(), 1024),
            FdFit::Lowered { to: 1, warn: true }
        );
    }
}
