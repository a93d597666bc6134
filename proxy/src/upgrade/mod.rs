//! Upgrades that keep every connection: a running msrd starts its binary again (the
//! path it was started as, read from disk anew) and hands the new process everything
//! it serves, over a Unix socketpair with `SCM_RIGHTS`:
//!
//! * the listening sockets: request port(s), TPROXY port, control socket, metrics,
//!   MSR⇄MSR channel, greeting sockets (connections waiting in their backlogs, and
//!   datagrams in their queues, travel with them);
//! * every connection: relayed ones (both sockets and the bytes the relay had in
//!   transit), LISTEN control connections, waiting ACCEPTs;
//! * the MH listeners, with the fixed-side connections accepted for no ACCEPT yet;
//! * the handoff state: tokens, replay state, holds due for release.
//!
//! The router footprint (nftables table, policy route, proxy ARP, sysctls) stays as it
//! is: the old process exits without undoing it, the new one neither cleans it up nor
//! installs it again.
//!
//! The steps ([`upgrade`] in the old process, [`adopt`] in the new one; the messages
//! are [`wire`]'s):
//!
//! 1. The old process starts the new one, which loads its configuration and says
//!    `Ready` (or `Failed`: the old one goes on as if nothing happened).
//! 2. The old process stops its accept loops, keeps new handoffs out, waits for those
//!    under way and (briefly) for connections in setup, then pauses every relay.
//! 3. It sends the state. The new process checks it (same footprint and sockets as its
//!    configuration wants), builds everything without serving, and says `Adopted`.
//! 4. The old process says `Commit` and exits; the new one starts serving.
//!
//! Until `Commit`, a failure anywhere (the new process exits, times out, refuses)
//! resumes everything in the old process: nothing was lost, since the new process
//! served nothing.

pub mod fdpass;
pub mod wire;

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use itcp_config::MsrdConfig;
use itcp_proto::control::UpgradeReply;
use itcp_proto::hex::{hex, unhex};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use tokio::net::{TcpListener, TcpStream, UdpSocket, UnixListener};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::clock::now_us;
use crate::daemon::Daemon;
use crate::handoff::sockets::{resume, spawn_service};
use crate::handoff::MhState;
use crate::listeners::{MhListener, Queued};
use crate::relay::Pending;
use crate::sessions::Frozen;
use crate::sessions::{Adopted, Kind};
use wire::{Handover, Msg, Role};

/// The environment variable that gives the new process its end of the socketpair.
pub const FD_ENV: &str = "MSRD_UPGRADE_FD";
/// How long the new process may take to load its configuration.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one packet may take to go out or come in, and the new process to adopt
/// the state once it has it all.
const PACKET_TIMEOUT: Duration = Duration::from_secs(10);
const ADOPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the new process waits for `Commit` after `Adopted`.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long connections in setup (request handshake, fixed-side connect) get to
/// finish: those still in setup then are closed with the old process.
const SETUP_WAIT: Duration = Duration::from_secs(2);
/// How long relays get to pause.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------------------------
// Who we are.

struct Invocation {
    exe: PathBuf,
    args: Vec<OsString>,
}

static INVOCATION: OnceLock<Invocation> = OnceLock::new();

/// Remembers the binary's path (resolved now: a package upgrade renames a new file
/// over it, and that file is what an upgrade starts) and the arguments. Call first
/// thing in `main`.
pub fn remember_invocation() {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let args = std::env::args_os().skip(1).collect();
    let _ = INVOCATION.set(Invocation { exe, args });
}

/// The hand-over socket, if this process was started by an msrd that upgrades
/// (`MSRD_UPGRADE_FD`). The variable is removed, so that nothing this process starts
/// inherits it.
pub fn take_inherited() -> Option<io::Result<OwnedFd>> {
    let v = std::env::var_os(FD_ENV)?;
    std::env::remove_var(FD_ENV);
    let fd: RawFd = match v.to_str().and_then(|s| s.parse().ok()) {
        Some(fd) if fd > 2 => fd,
        _ => {
            return Some(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{FD_ENV}={v:?} is not a file descriptor"),
            )))
        }
    };
    let is_socket = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
    if !is_socket {
        return Some(Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{FD_ENV}={fd} is not a socket (set only by msrd for its successor)"),
        )));
    }
    // SAFETY: the old msrd passed this fd to us alone; we own it from here on, and
    // close-on-exec again keeps it from our own children.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = fcntl(&fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    Some(Ok(fd))
}

/// Tells the old process that this one cannot take over (best effort).
pub fn refuse(ch: &OwnedFd, error: &str) {
    let _ = send_msg(
        ch.as_fd(),
        &Msg::Failed {
            error: error.to_string(),
        },
    );
}

// ---------------------------------------------------------------------------------
// The listening sockets and their tasks.

struct Service {
    role: Role,
    name: String,
    /// The socket; its task serves a duplicate, so it can be stopped and restarted.
    fd: OwnedFd,
    task: Option<JoinHandle<()>>,
}

/// msrd's listening sockets and the tasks serving them: an upgrade stops them and
/// hands the sockets over (or restarts them when it fails).
#[derive(Default)]
pub struct Services {
    list: Mutex<Vec<Service>>,
}

impl Services {
    /// Starts serving a bound socket.
    pub fn add(&self, d: &Arc<Daemon>, role: Role, name: String, fd: OwnedFd) -> io::Result<()> {
        let task = Some(spawn(d, role, fd.try_clone()?)?);
        self.list.lock().unwrap().push(Service {
            role,
            name,
            fd,
            task,
        });
        Ok(())
    }

    /// Stops every task: connections and datagrams wait in the sockets' queues.
    async fn stop_all(&self) {
        let tasks: Vec<JoinHandle<()>> = self
            .list
            .lock()
            .unwrap()
            .iter_mut()
            .filter_map(|s| s.task.take())
            .collect();
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
    }

    /// Restarts the stopped tasks.
    fn start_all(&self, d: &Arc<Daemon>) {
        for s in self.list.lock().unwrap().iter_mut() {
            if s.task.is_none() {
                match s.fd.try_clone().and_then(|fd| spawn(d, s.role, fd)) {
                    Ok(t) => s.task = Some(t),
                    Err(e) => warn!(role = ?s.role, name = %s.name, error = %e, "not restarted"),
                }
            }
        }
    }

    /// Waits for the accept loops, which end when draining starts.
    pub async fn stop_accepting(&self) {
        let tasks: Vec<JoinHandle<()>> = self
            .list
            .lock()
            .unwrap()
            .iter_mut()
            .filter(|s| matches!(s.role, Role::Socks | Role::Transparent))
            .filter_map(|s| s.task.take())
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    }

    /// The names of the sockets serving `role`.
    pub fn sockets_of(&self, role: Role) -> Vec<String> {
        let l = self.list.lock().unwrap();
        l.iter()
            .filter(|s| s.role == role)
            .map(|s| s.name.clone())
            .collect()
    }

    /// Stops every task at once (exit).
    pub fn abort_all(&self) {
        for s in self.list.lock().unwrap().iter_mut() {
            if let Some(t) = s.task.take() {
                t.abort();
            }
        }
    }

    fn sockets(&self) -> Vec<(Role, String, RawFd)> {
        let l = self.list.lock().unwrap();
        l.iter()
            .map(|s| (s.role, s.name.clone(), s.fd.as_raw_fd()))
            .collect()
    }
}

fn spawn(d: &Arc<Daemon>, role: Role, fd: OwnedFd) -> io::Result<JoinHandle<()>> {
    let tcp = |fd: OwnedFd| {
        let l = std::net::TcpListener::from(fd);
        l.set_nonblocking(true)?;
        TcpListener::from_std(l)
    };
    let d = d.clone();
    Ok(match role {
        Role::Socks | Role::Transparent => {
            let l = tcp(fd)?;
            tokio::spawn(crate::daemon::accept_loop(d, l, role == Role::Transparent))
        }
        Role::Control => {
            let l = std::os::unix::net::UnixListener::from(fd);
            l.set_nonblocking(true)?;
            let l = UnixListener::from_std(l)?;
            let (id, s, up) = (d.cfg.msr.id.clone(), d.sessions.clone(), d.upgrades.clone());
            tokio::spawn(crate::control::serve_on(l, id, s, Some(up)))
        }
        Role::Metrics => {
            let l = tcp(fd)?;
            let (s, id) = (d.sessions.clone(), d.cfg.msr.id.clone());
            let hosts = d.cfg.metrics.hosts.clone();
            tokio::spawn(crate::http::serve(l, s, id, hosts))
        }
        Role::Channel => {
            let l = tcp(fd)?;
            tokio::spawn(crate::handoff::serve_peers(d, l))
        }
        Role::Greeting => {
            let s = std::net::UdpSocket::from(fd);
            s.set_nonblocking(true)?;
            let s = UdpSocket::from_std(s)?;
            tokio::spawn(crate::handoff::serve_greetings(d, s))
        }
    })
}

/// The TPROXY listening addresses of a configuration.
pub fn transparent_addrs(cfg: &MsrdConfig) -> Vec<SocketAddr> {
    let port = cfg.transparent.listen_port;
    let mut addrs = vec![SocketAddr::from(([0, 0, 0, 0], port))];
    if cfg.access.mh_prefixes.iter().any(|p| p.is_ipv6()) {
        addrs.push(SocketAddr::from(([0u16; 8], port)));
    }
    addrs
}

/// The listening sockets a configuration asks for, as [`Services`] names them.
pub fn expected_sockets(cfg: &MsrdConfig) -> Vec<(Role, String)> {
    let mut v: Vec<(Role, String)> = cfg
        .msr
        .socks_addrs()
        .iter()
        .map(|a| (Role::Socks, a.to_string()))
        .collect();
    if cfg.transparent.enabled {
        v.extend(
            transparent_addrs(cfg)
                .iter()
                .map(|a| (Role::Transparent, a.to_string())),
        );
    }
    v.push((Role::Control, cfg.msr.control_socket.display().to_string()));
    if let Some(a) = cfg.metrics.listen {
        v.push((Role::Metrics, a.to_string()));
    }
    if let Some(a) = cfg.handoff.listen {
        v.push((Role::Channel, a.to_string()));
        v.extend(
            crate::handoff::greeting::sockets_of(cfg)
                .iter()
                .map(|g| (Role::Greeting, g.name())),
        );
    }
    v.sort();
    v
}

/// What msrd installs on the router for a configuration, as one string: the old and
/// the new process must agree on it.
pub fn footprint_of(cfg: &MsrdConfig) -> String {
    let r = crate::intercept::rules_of(cfg);
    format!(
        "{}{}lan_interface {:?}\n",
        r.nft_script(),
        r.ip_install().concat(),
        cfg.handoff.lan_interface
    )
}

/// Why a configuration cannot take over a hand-over: its footprint or its listening
/// sockets differ (those changes need a restart). `sockets` are the handed-over ones.
pub fn incompatible(
    cfg: &MsrdConfig,
    footprint: &str,
    sockets: &[(Role, String)],
) -> Option<String> {
    if footprint != footprint_of(cfg) {
        return Some(
            "the new configuration changes msrd's interception rules ([interception], \
             [transparent], [handoff] lan_interface, or the cells or ports closed to them: \
             [[cell]], [metrics] and [handoff] listen): restart msrd to apply it"
                .into(),
        );
    }
    let mut want = expected_sockets(cfg);
    let mut have: Vec<(Role, String)> = sockets.to_vec();
    have.sort();
    // The old msrd may have failed to bind its control socket: the new one binds it.
    if !have.iter().any(|(r, _)| *r == Role::Control) {
        want.retain(|(r, _)| *r != Role::Control);
    }
    if want != have {
        let show = |v: &[(Role, String)], other: &[(Role, String)]| {
            v.iter()
                .filter(|x| !other.contains(x))
                .map(|(r, n)| format!("{r:?} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Some(format!(
            "the new configuration changes msrd's listening sockets (new: [{}]; gone: [{}]): \
             restart msrd to apply it",
            show(&want, &have),
            show(&have, &want)
        ));
    }
    None
}

// ---------------------------------------------------------------------------------
// The hand-over socket.

fn send_msg(ch: BorrowedFd<'_>, m: &Msg) -> io::Result<()> {
    let p = wire::encode(m, &[]).map_err(io::Error::other)?;
    fdpass::send(ch, &p, &[])
}

/// The next message, its payload and fds. End of stream is an error: the other
/// process went away.
fn recv_msg(ch: BorrowedFd<'_>) -> io::Result<(Msg, Vec<u8>, Vec<OwnedFd>)> {
    let Some((p, fds)) = fdpass::recv(ch)? else {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the other msrd closed the hand-over (it exited?)",
        ));
    };
    let (m, payload) =
        wire::decode(&p).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    wire::check_fds(&m, fds.len()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((m, payload.to_vec(), fds))
}

/// Runs blocking hand-over I/O off the runtime's threads.
async fn blocking<T: Send + 'static>(
    ch: &Arc<OwnedFd>,
    f: impl FnOnce(BorrowedFd<'_>) -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let ch = ch.clone();
    tokio::task::spawn_blocking(move || f(ch.as_fd()))
        .await
        .map_err(io::Error::other)?
}

fn timeout_text(e: io::Error, what: &str, t: Duration) -> String {
    if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut {
        format!("the new msrd did not {what} within {} s", t.as_secs())
    } else {
        format!("the new msrd did not {what}: {e}")
    }
}

// ---------------------------------------------------------------------------------
// The old process.

/// What an upgrade paused, to hand over or to resume.
#[derive(Default)]
struct Quiesced {
    services_stopped: bool,
    handoffs_closed: bool,
    listeners_stopped: bool,
    frozen: Vec<Frozen>,
    queued: Vec<(Arc<MhListener>, Vec<Queued>)>,
}

/// Replaces this msrd by a new process of its binary, handing it every connection.
/// `Ok` once the new process serves (the caller then exits without undoing the
/// footprint); `Err` says why this process serves on, with everything resumed.
pub async fn upgrade(d: &Arc<Daemon>, services: &Services) -> Result<UpgradeReply, String> {
    let t0 = Instant::now();
    let inv = INVOCATION
        .get()
        .ok_or("msrd does not know the path of its binary")?;
    let (mine, theirs) =
        fdpass::socketpair().map_err(|e| format!("cannot make the hand-over socket: {e}"))?;
    let child = spawn_successor(inv, &theirs)
        .map_err(|e| format!("cannot start {}: {e}", inv.exe.display()))?;
    drop(theirs);
    let pid = child.id();
    info!(pid, exe = %inv.exe.display(), "upgrade: new msrd started");
    let ch = Arc::new(mine);

    let ready = blocking(&ch, |c| {
        fdpass::set_timeout(c, Some(READY_TIMEOUT))?;
        recv_msg(c)
    })
    .await;
    match ready {
        Ok((Msg::Ready { .. }, ..)) => {}
        Ok((Msg::Failed { error }, ..)) => {
            return Err(reap(child, format!("the new msrd refused: {error}")).await)
        }
        Ok((m, ..)) => return Err(reap(child, format!("the new msrd said {m:?}")).await),
        Err(e) => return Err(reap(child, timeout_text(e, "start", READY_TIMEOUT)).await),
    }

    let q = match quiesce(d, services).await {
        Ok(q) => q,
        Err((q, e)) => {
            let e = reap(child, e).await;
            rollback(d, services, q).await;
            return Err(e);
        }
    };
    let h = handover(d, services, &q);
    let (conns, listeners) = (h.conns.len() as u64, h.mh_listeners.len() as u64);
    let in_transit: usize = h.conns.iter().map(|c| c.up.len() + c.down.len()).sum();
    let queued: usize = h.mh_listeners.iter().map(|l| l.queued.len()).sum();
    let packets = match wire::split(&h) {
        Ok(p) => p,
        Err(e) => {
            let e = reap(child, format!("cannot encode the state: {e}")).await;
            rollback(d, services, q).await;
            return Err(e);
        }
    };
    let adopted = blocking(&ch, move |c| {
        fdpass::set_timeout(c, Some(PACKET_TIMEOUT))?;
        for (p, fds) in &packets {
            fdpass::send(c, p, fds)?;
        }
        fdpass::set_timeout(c, Some(ADOPT_TIMEOUT))?;
        recv_msg(c)
    })
    .await;
    let failed = match adopted {
        Ok((Msg::Adopted { .. }, ..)) => None,
        Ok((Msg::Failed { error }, ..)) => Some(format!("the new msrd refused: {error}")),
        Ok((m, ..)) => Some(format!("the new msrd said {m:?}")),
        Err(e) => Some(timeout_text(e, "adopt the connections", ADOPT_TIMEOUT)),
    };
    if let Some(e) = failed {
        let e = reap(child, e).await;
        rollback(d, services, q).await;
        return Err(e);
    }
    // systemd (Type=notify) follows the new process from here.
    crate::notify::notify(&format!("MAINPID={pid}"));
    if let Err(e) = send_msg(ch.as_fd(), &Msg::Commit) {
        // Nobody read it: the new process is gone, and it never served.
        crate::notify::notify(&format!("MAINPID={}", std::process::id()));
        let e = reap(child, format!("the new msrd went away before serving: {e}")).await;
        rollback(d, services, q).await;
        return Err(e);
    }
    // The new process owns every socket now. Ours are duplicates of the same sockets,
    // so closing them sends nothing; they stay open until this process exits.
    std::mem::forget(q);
    let ms = t0.elapsed().as_millis() as u64;
    info!(
        new_pid = pid,
        connections = conns,
        listeners,
        queued,
        in_transit,
        ms,
        "upgrade: the new msrd serves; exiting"
    );
    Ok(UpgradeReply {
        msr: d.cfg.msr.id.clone(),
        old_pid: std::process::id(),
        new_pid: pid,
        connections: conns,
        listeners,
        ms,
    })
}

fn spawn_successor(inv: &Invocation, theirs: &OwnedFd) -> io::Result<Child> {
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(&inv.exe);
    cmd.args(&inv.args).env(FD_ENV, fd.to_string());
    // SAFETY: between fork and exec only fcntl(2), which is async-signal-safe: the
    // child's copy of its end of the socketpair survives the exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            fcntl(
                BorrowedFd::borrow_raw(fd),
                FcntlArg::F_SETFD(FdFlag::empty()),
            )?;
            Ok(())
        });
    }
    cmd.spawn()
}

/// Ends a new process that will not take over, and logs why.
async fn reap(mut child: Child, why: String) -> String {
    warn!(pid = child.id(), reason = %why, "upgrade failed: serving on");
    let _ = child.kill();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    why
}

/// Stops taking new work and pauses every connection.
async fn quiesce(d: &Arc<Daemon>, services: &Services) -> Result<Quiesced, (Quiesced, String)> {
    let mut q = Quiesced::default();
    services.stop_all().await;
    q.services_stopped = true;
    if let Some(h) = &d.handoff {
        q.handoffs_closed = true;
        let c = &h.cfg;
        let wait = Duration::from_millis(c.images_timeout_ms + c.ack_timeout_ms + 1000);
        let deadline = Instant::now() + wait;
        while h.close(true) > 0 {
            if Instant::now() > deadline {
                return Err((q, "a handoff is under way: try again".into()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Fixed-side setups in flight finish and become relays; connections in setup that
    // wait for the MH are sessions (handshake, intercepted) and are paused below.
    // Connections accepted and not yet sessions count too (Inflight's arriving).
    let busy = d.inflight.settle_all(SETUP_WAIT).await;
    if busy > 0 {
        warn!(
            busy,
            "upgrade: connections still in setup (accepted, or connecting to the fixed host) end with this process"
        );
    }
    let mut seen = HashSet::new();
    if let Err(e) = pause_all(d, &mut seen, &mut q.frozen).await {
        return Err((q, e));
    }
    // New fixed-side connections wait in the listening sockets' backlogs from here;
    // those already accepted are taken out of the queues.
    d.listeners.stop_all().await;
    q.listeners_stopped = true;
    for l in d.listeners.all() {
        // Free once every ACCEPT waiting on it is paused.
        match tokio::time::timeout(PAUSE_TIMEOUT, d.listeners.take_queued(&l)).await {
            Ok(queued) => q.queued.push((l, queued)),
            Err(_) => {
                let e = format!("MH listener {} is busy", l.addr);
                return Err((q, e));
            }
        }
    }
    // Sessions opened meanwhile (a connection that just left setup) go too.
    if let Err(e) = pause_all(d, &mut seen, &mut q.frozen).await {
        return Err((q, e));
    }
    Ok(q)
}

/// Pauses every session not `seen` yet (relays stop at their next wait and hand their
/// sockets and bytes in transit over), including those opened meanwhile.
async fn pause_all(
    d: &Daemon,
    seen: &mut HashSet<u64>,
    out: &mut Vec<Frozen>,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + PAUSE_TIMEOUT;
    loop {
        let fresh: Vec<_> = d
            .sessions
            .all()
            .into_iter()
            .filter(|s| seen.insert(s.id))
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let mut waits = Vec::new();
        for s in fresh {
            let (tx, rx) = oneshot::channel();
            *s.frozen_to.lock().unwrap() = Some(tx);
            s.pause.send_replace(true);
            waits.push((s.id, rx));
        }
        for (id, rx) in waits {
            match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(f)) => out.push(f),
                // Ended meanwhile (or turned into another session, seen next round).
                Ok(Err(_)) => {}
                Err(_) => return Err(format!("connection {id} did not pause")),
            }
        }
    }
}

/// Puts everything back to work (the upgrade failed).
async fn rollback(d: &Arc<Daemon>, services: &Services, q: Quiesced) {
    for (l, queued) in q.queued {
        d.listeners.requeue(&l, queued).await;
    }
    if q.listeners_stopped {
        d.listeners.start_all();
    }
    resume(d, q.frozen);
    d.inflight.thaw_all();
    if let (true, Some(h)) = (q.handoffs_closed, &d.handoff) {
        h.close(false);
    }
    if q.services_stopped {
        services.start_all(d);
    }
}

fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The state to hand over, with our fds (they stay ours: the receiver gets copies).
fn handover(d: &Daemon, services: &Services, q: &Quiesced) -> Handover<RawFd> {
    let now = now_us();
    let mhs = d.handoff.as_ref().map_or_else(Vec::new, |h| {
        let m = h.mhs.lock().unwrap();
        m.iter()
            .map(|(ip, st)| wire::MhRecord {
                mh: *ip,
                token: st.token.as_deref().map(hex),
                last_greeting_ts: st.last_greeting_ts,
                hold_gen: st.hold_gen,
                last_nonce: st.last_nonce.clone(),
                last_reply: st.last_reply.clone(),
                claimed: st.claimed,
                mac: st.mac.as_ref().map(itcp_proto::hex::mac),
                release_hold_in_ms: st
                    .release_at
                    .filter(|(gen, _)| *gen == st.hold_gen)
                    .map(|(_, at)| at.saturating_sub(now) / 1000),
                moved_to: st.moved_to.clone(),
                came_from: st.came_from.clone(),
            })
            .collect()
    });
    // Listeners of LISTEN sessions (a SOCKS BIND's listener is not one).
    let listening: HashSet<SocketAddr> = q
        .frozen
        .iter()
        .filter(|f| f.session.kind == Kind::Listen)
        .filter_map(|f| f.listen)
        .collect();
    let mh_listeners = q
        .queued
        .iter()
        .filter(|(l, _)| listening.contains(&l.addr))
        .map(|(l, queued)| wire::MhListener {
            addr: l.addr,
            fd: l.fd().as_raw_fd(),
            queued: queued.iter().map(|(s, a)| (*a, s.as_raw_fd())).collect(),
        })
        .collect();
    let conns = q
        .frozen
        .iter()
        .map(|f| {
            let s = &f.session;
            wire::Conn {
                meta: wire::ConnMeta {
                    id: s.id,
                    kind: s.kind,
                    mh: s.mh,
                    fh: s.fh,
                    wireless_local: s.wireless_local,
                    started_us: micros(s.started),
                    bytes_up: s.counters.up.load(Ordering::Relaxed),
                    bytes_down: s.counters.down.load(Ordering::Relaxed),
                    moved_in: s.moved_in,
                    up_idle_at_move: s.up_idle_at_move,
                    before: s.before,
                    listen: f.listen,
                    admitted: f.admitted.is_some(),
                    fixed: f.fixed.is_some(),
                    up_pending: f.pending.up.len(),
                    down_pending: f.pending.down.len(),
                    kx: f.pending.kx,
                },
                wireless: f.wireless.as_raw_fd(),
                fixed: f.fixed.as_ref().map(|x| x.as_raw_fd()),
                up: f.pending.up.clone(),
                down: f.pending.down.clone(),
            }
        })
        .collect();
    Handover {
        header: wire::Header {
            old_pid: std::process::id(),
            msr: d.cfg.msr.id.clone(),
            footprint: footprint_of(&d.cfg),
            stats: d.sessions.stats.snapshot(),
            last_session_id: d.sessions.last_id(),
            handoffs: d.sessions.handoffs.history(),
        },
        mhs,
        sockets: services.sockets(),
        mh_listeners,
        conns,
    }
}

// ---------------------------------------------------------------------------------
// The new process.

/// What the new process built from the hand-over, not serving yet.
struct Staged {
    sockets: Vec<(Role, String, OwnedFd)>,
    frozen: Vec<Frozen>,
    holds: Vec<(std::net::IpAddr, u64)>,
    conns: usize,
    old_pid: u32,
}

/// Takes over from the msrd that started this process: receives and checks its
/// state, adopts it, and once the old process commits, serves it (sockets in
/// `services`). An error means the old process serves on: exit without touching
/// anything.
pub async fn adopt(d: &Arc<Daemon>, ch: OwnedFd, services: &Services) -> io::Result<()> {
    let ch = Arc::new(ch);
    // Test hook (docs/testing.md): a new process that never says it is ready.
    if std::env::var("MSRD_FAULT").as_deref() == Ok("upgrade_hang_ready") {
        tracing::error!("MSRD_FAULT=upgrade_hang_ready: hanging before ready");
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let state = blocking(&ch, |c| {
        send_msg(
            c,
            &Msg::Ready {
                pid: std::process::id(),
            },
        )?;
        fdpass::set_timeout(c, Some(PACKET_TIMEOUT))?;
        let mut a = wire::Assembler::new();
        loop {
            let (m, payload, fds) = recv_msg(c)?;
            if a.push(m, &payload, fds)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
            {
                break;
            }
        }
        Ok(a.finish().expect("complete"))
    })
    .await?;
    let staged = match stage(d, state) {
        Ok(s) => s,
        Err(e) => {
            refuse(&ch, &e);
            return Err(io::Error::other(e));
        }
    };
    // Test hooks (docs/testing.md): a new process that dies, or hangs, holding the
    // whole state, adopted; the old one must serve on.
    match std::env::var("MSRD_FAULT").as_deref() {
        Ok("upgrade_exit") => {
            tracing::error!("MSRD_FAULT=upgrade_exit: exiting with the state");
            std::process::exit(70);
        }
        Ok("upgrade_hang") => {
            tracing::error!("MSRD_FAULT=upgrade_hang: hanging with the state");
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        _ => {}
    }

    let committed = blocking(&ch, |c| {
        send_msg(
            c,
            &Msg::Adopted {
                pid: std::process::id(),
            },
        )?;
        fdpass::set_timeout(c, Some(COMMIT_TIMEOUT))?;
        recv_msg(c)
    })
    .await;
    match committed {
        Ok((Msg::Commit, ..)) => {}
        Ok((m, ..)) => {
            return Err(io::Error::other(format!(
                "the old msrd said {m:?}, not commit: it serves on"
            )))
        }
        Err(e) => {
            return Err(io::Error::other(format!(
                "no commit from the old msrd ({e}): it serves on"
            )))
        }
    }
    start(d, services, staged);
    Ok(())
}

/// Builds the daemon's state from a hand-over, serving nothing yet.
fn stage(d: &Arc<Daemon>, h: Handover<OwnedFd>) -> Result<Staged, String> {
    let names: Vec<(Role, String)> = h.sockets.iter().map(|(r, n, _)| (*r, n.clone())).collect();
    if let Some(why) = incompatible(&d.cfg, &h.header.footprint, &names) {
        return Err(why);
    }
    let st = &d.sessions.stats;
    st.restore(&h.header.stats);
    d.sessions.handoffs.restore(&h.header.handoffs);
    d.sessions.continue_after(h.header.last_session_id);
    let mut holds = Vec::new();
    if let Some(ho) = &d.handoff {
        let mut m = ho.mhs.lock().unwrap();
        for r in &h.mhs {
            let mh = crate::admission::canonical(r.mh);
            m.insert(
                mh,
                MhState {
                    token: r.token.as_deref().and_then(unhex),
                    last_greeting_ts: r.last_greeting_ts,
                    hold_gen: r.hold_gen,
                    last_nonce: r.last_nonce.clone(),
                    last_reply: r.last_reply.clone(),
                    pulling: false,
                    claimed: r.claimed,
                    mac: r.mac.as_deref().and_then(itcp_proto::hex::parse_mac),
                    // Not carried: bindings from before the upgrade count as oldest.
                    bound_ns: 0,
                    release_at: None,
                    moved_to: r.moved_to.clone(),
                    came_from: r.came_from.clone(),
                    // Not carried: an upgrade just after a move forgets its stale window.
                    departure: None,
                },
            );
            if let Some(ms) = r.release_hold_in_ms {
                holds.push((mh, ms));
            }
        }
    }
    let stream = |fd: OwnedFd| -> Result<TcpStream, String> {
        let s = std::net::TcpStream::from(fd);
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        TcpStream::from_std(s).map_err(|e| e.to_string())
    };
    for l in h.mh_listeners {
        let mut queued = Vec::new();
        for (fh, fd) in l.queued {
            queued.push((stream(fd)?, fh));
        }
        d.listeners
            .adopt(l.addr, l.fd, queued)
            .map_err(|e| format!("MH listener {}: {e}", l.addr))?;
    }
    let conns = h.conns.len();
    let mut frozen = Vec::with_capacity(conns);
    for c in h.conns {
        let m = c.meta;
        let wireless = stream(c.wireless)?;
        let fixed = c.fixed.map(stream).transpose()?;
        let session = d.sessions.adopt(Adopted {
            id: m.id,
            kind: m.kind,
            mh: m.mh,
            fh: m.fh,
            wireless_local: m.wireless_local,
            started: UNIX_EPOCH + Duration::from_micros(m.started_us),
            bytes_up: m.bytes_up,
            bytes_down: m.bytes_down,
            moved_in: m.moved_in,
            up_idle_at_move: m.up_idle_at_move,
            before: m.before,
        });
        let admitted = m.admitted.then(|| d.admit_moved(session.mh_ip()));
        frozen.push(Frozen {
            session,
            wireless,
            fixed,
            listen: m.listen,
            pending: Pending {
                up: c.up,
                down: c.down,
                kx: m.kx,
            },
            admitted,
        });
    }
    Ok(Staged {
        sockets: h.sockets,
        frozen,
        holds,
        conns,
        old_pid: h.header.old_pid,
    })
}

/// Serves what was staged: listening sockets, MH listeners, connections, holds.
/// Past the commit, nothing may fail as a whole: what cannot start is logged.
fn start(d: &Arc<Daemon>, services: &Services, s: Staged) {
    let n = s.sockets.len();
    for (role, name, fd) in s.sockets {
        if let Err(e) = services.add(d, role, name.clone(), fd) {
            tracing::error!(role = ?role, %name, error = %e, "upgrade: socket not served");
        }
    }
    d.listeners.start_all();
    // Listeners' control connections first, so that waiting ACCEPTs find them.
    let mut frozen = s.frozen;
    frozen.sort_by_key(|f| f.session.kind != Kind::Listen);
    for f in frozen {
        spawn_service(d, f);
    }
    for (mh, ms) in s.holds {
        d.release_later(mh, Duration::from_millis(ms));
    }
    info!(
        old_pid = s.old_pid,
        connections = s.conns,
        listeners = d.listeners.len(),
        sockets = n,
        "upgrade: took over from the old msrd"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> MsrdConfig {
        let text = format!(
            "[msr]\nid = \"msr1\"\ngateway = [\"10.2.0.1\"]\ncontrol_socket = \"/run/m.sock\"\n\n\
             [access]\nmh_prefixes = [\"10.2.0.0/24\"]\n\n[[cell]]\ninterface = \"cell0\"\n\n{extra}"
        );
        MsrdConfig::from_str(&text, "t.toml").unwrap()
    }

    #[test]
    fn the_same_configuration_takes_over() {
        let c = cfg("[handoff]\nlisten = \"10.1.0.11:4347\"\nlan_interface = \"lan0\"\n");
        let names = expected_sockets(&c);
        assert_eq!(
            names,
            vec![
                (Role::Socks, "10.2.0.1:1080".to_string()),
                (Role::Control, "/run/m.sock".to_string()),
                (Role::Channel, "10.1.0.11:4347".to_string()),
                (Role::Greeting, "cell0".to_string()),
            ]
        );
        assert_eq!(incompatible(&c, &footprint_of(&c), &names), None);
        // Limits, tuning and logs may change with an upgrade.
        let c2 = cfg(
            "[handoff]\nlisten = \"10.1.0.11:4347\"\nlan_interface = \"lan0\"\n\
             [relay]\ndrain_timeout_ms = 100\n",
        );
        assert_eq!(incompatible(&c2, &footprint_of(&c), &names), None);
        // A control socket the old msrd could not bind: the new one binds it.
        let some: Vec<_> = names
            .iter()
            .filter(|(r, _)| *r != Role::Control)
            .cloned()
            .collect();
        assert_eq!(incompatible(&c, &footprint_of(&c), &some), None);
    }

    #[test]
    fn changed_sockets_or_rules_need_a_restart() {
        let old = cfg("");
        let names = expected_sockets(&old);
        let moved = cfg("[metrics]\nlisten = \"10.1.0.11:9473\"\n");
        let e = incompatible(&moved, &footprint_of(&moved), &names).unwrap();
        assert!(e.contains("new: [Metrics 10.1.0.11:9473]; gone: []"), "{e}");
        assert!(e.contains("restart msrd"), "{e}");
        // The cells' rules close the new port to them too.
        let e = incompatible(&moved, &footprint_of(&old), &names).unwrap();
        assert!(e.contains("interception rules"), "{e}");
        let tp = cfg("[transparent]\nenabled = true\nports = [80]\n");
        let e = incompatible(&tp, &footprint_of(&old), &names).unwrap();
        assert!(e.contains("interception rules"), "{e}");
    }
}
