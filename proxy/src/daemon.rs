//! msrd's shared state ([`Daemon`]: configuration, session table, admission, rules,
//! handoff state) and the request server on it: the request protocol
//! (docs/protocol.md), transparent interception, relaying, and graceful drain.
//! [`crate::run`] starts it; the handoff glue, network detection and upgrades work on
//! it from above (no module below imports it).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use itcp_config::{MsrdConfig, TcpTuning};
use itcp_proto::socks::{self, Addr, Command, Method, ProtoError, Reply, Token};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn, Instrument};

use crate::admission::{Admission, Admitted, Refusal, Setups};
use crate::cells::CellMap;
use crate::control::UpgradeAsk;
use crate::handoff::Handoffs;
use crate::intercept::Rules;
use crate::listeners::{Listeners, Lookup};
use crate::relay::{self, End, Pending, RelayOpts};
use crate::sessions::{Frozen, Kind, Session, Sessions};
use crate::setup::{Connecting, Inflight, Transcript};
use crate::sockopt;

/// How long a client may take for the whole request handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest handshake message we buffer (a request with a 255-byte domain is 262).
const MAX_HANDSHAKE: usize = 1024;

mod routes;

/// Shared state of the daemon.
pub struct Daemon {
    pub cfg: MsrdConfig,
    pub sessions: Arc<Sessions>,
    pub listeners: Listeners,
    admission: Arc<Mutex<Admission>>,
    /// Connections in setup (handshake, fixed-side connect), limited per source.
    setups: Arc<Mutex<Setups>>,
    /// Log lines about refused or malformed input, per source: a flood is counted in
    /// full but logged at a bounded rate.
    noisy: Mutex<itcp_handoff::greet::PerAddr>,
    cells: CellMap,
    relay_opts: RelayOpts,
    /// The wireless side's congestion control when msrd sizes it for the cell.
    wireless_cc: Option<String>,
    /// msrd's nftables table and policy route (flow holds live here).
    pub rules: Rules,
    /// Handoff state, when `[handoff]` is on.
    pub handoff: Option<Handoffs>,
    /// Fixed-side setups in flight per MH, which a handoff waits for.
    pub inflight: Arc<Inflight>,
    /// Flows of each MH that closed here lately (handed over with its images).
    pub strays: crate::strays::Strays,
    /// Flips to true when draining: accept loops stop.
    pub(crate) draining: watch::Sender<bool>,
    /// Accepted connections without a session yet (an upgrade waits for them).
    /// Upgrade requests from the control socket, and where the main loop takes them.
    pub(crate) upgrades: mpsc::UnboundedSender<UpgradeAsk>,
    pub(crate) upgrade_asks: Mutex<Option<mpsc::UnboundedReceiver<UpgradeAsk>>>,
    /// The beacons on the cells (when `[beacon]` is on and a cell could be opened),
    /// which also answer solicitations.
    pub beacons: std::sync::OnceLock<Arc<crate::beacon::Advertiser>>,
    /// Packets held while an MH's connections are frozen (`[handoff]` on).
    pub holding: Arc<crate::holding::Holding>,
    /// The SYN-ACKs sent to MHs lately (`[handoff]` on).
    pub handshakes: crate::handshakes::Recent,
}

/// A connection counted as in setup until dropped.
pub struct SetupSlot {
    setups: Arc<Mutex<Setups>>,
    ip: IpAddr,
    station: Option<[u8; 6]>,
    /// Until the connection is in the session table, where a handoff finds it.
    arriving: Option<crate::setup::Arriving>,
}

impl SetupSlot {
    /// The connection is in the session table now.
    fn registered(&mut self) {
        self.arriving = None;
    }
}

impl Drop for SetupSlot {
    fn drop(&mut self) {
        self.setups.lock().unwrap().end(self.ip, self.station);
    }
}

impl Daemon {
    pub fn new(cfg: MsrdConfig) -> io::Result<Arc<Daemon>> {
        let a = &cfg.access;
        let admission = Admission::new(
            a.mh_prefixes.clone(),
            a.max_connections as usize,
            a.max_connections_per_mh as usize,
            a.accept_rate as f64,
            a.accept_burst as f64,
            crate::clock::mono_ns(),
        );
        let relay_opts = RelayOpts {
            splice: cfg.relay.splice,
            pipe_size: cfg.relay.pipe_size,
            buffer_size: cfg.relay.buffer_size,
            size_fixed: false,
        };
        let wireless_cc = crate::sizing::pick_congestion();
        let cells = CellMap::read(cfg.cells.iter().map(|c| c.interface.as_str()));
        let handoff = if cfg.handoff.enabled() {
            Some(Handoffs::new(&cfg.msr.id, &cfg.handoff)?)
        } else {
            None
        };
        let setups = Setups::new(
            a.max_handshakes as usize,
            a.max_handshakes_per_mh as usize,
            a.handshakes_per_station() as usize,
        );
        let (upgrades, asks) = mpsc::unbounded_channel();
        let sessions = Arc::new(Sessions::default());
        let holding = Arc::new(crate::holding::Holding::new(
            cfg.interception.hold_queue,
            cfg.handoff.lan_interface.clone(),
            crate::intercept::pass_mark(cfg.interception.fwmark),
            sessions.clone(),
        ));
        Ok(Arc::new(Daemon {
            holding,
            handshakes: Default::default(),
            upgrades,
            upgrade_asks: Mutex::new(Some(asks)),
            beacons: std::sync::OnceLock::new(),
            admission: Arc::new(Mutex::new(admission)),
            setups: Arc::new(Mutex::new(setups)),
            // 3 lines at once per source, then one every 10 s.
            noisy: Mutex::new(itcp_handoff::greet::PerAddr::new(3, 0.1, 4096)),
            sessions,
            listeners: Listeners::default(),
            cells,
            relay_opts,
            wireless_cc,
            rules: crate::intercept::rules_of(&cfg),
            handoff,
            inflight: Arc::default(),
            strays: Default::default(),
            draining: watch::channel(false).0,
            cfg,
        }))
    }

    /// The cell interface an MH is reached through (from the routing table at start).
    pub fn cell_interface(&self, mh: IpAddr) -> Option<String> {
        self.cells.interface_for(mh).map(str::to_string)
    }

    /// Our address on cell interface `ifname` that an MH at `mh` routes through.
    pub fn cell_gateway(&self, ifname: &str, mh: IpAddr) -> Option<IpAddr> {
        self.cells.gateway_for(ifname, mh)
    }

    pub fn handoff_cfg(&self) -> &itcp_config::HandoffSection {
        &self.cfg.handoff
    }

    pub fn is_mh(&self, ip: IpAddr) -> bool {
        self.admission.lock().unwrap().is_mh(ip)
    }

    /// Counts a connection that arrived in a handoff.
    pub fn admit_moved(&self, ip: IpAddr) -> Admitted {
        self.admission.lock().unwrap().admit_moved(ip);
        Admitted::new(&self.admission, ip)
    }

    /// True if a line about refused or malformed input from `src` may be logged now.
    pub fn may_log(&self, src: IpAddr) -> bool {
        self.noisy
            .lock()
            .unwrap()
            .allow(&src, crate::clock::mono_ns() / 1_000_000)
    }

    /// Counts a new connection as in setup, unless its source address, its station or
    /// everyone already has too many half-open ones.
    fn begin_setup(&self, ip: IpAddr) -> Option<SetupSlot> {
        let ip = crate::admission::canonical(ip);
        let station = self.station_of(ip);
        if !self.setups.lock().unwrap().begin(ip, station) {
            self.sessions
                .stats
                .refused_handshakes
                .fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(SetupSlot {
            setups: self.setups.clone(),
            ip,
            station,
            arriving: Some(self.inflight.arriving(ip)),
        })
    }

    /// The station (link-layer address) that `ip` is on, from the neighbour table of
    /// its cell: the MAC the kernel resolved to send the SYN-ACK, which the station
    /// answered from (the cell's link layer delivers a frame to its station only), so
    /// addresses of one station count as one. None off a cell or without an entry
    /// (a routed MH): only the per-address bound applies. One netlink round trip.
    /// A station that rewrites the entry by ARP/NDP between its handshake and this
    /// lookup escapes the bound: the cell must bind addresses to stations (proxy ARP,
    /// ARP/ND inspection at the AP), as network detection assumes too.
    fn station_of(&self, ip: IpAddr) -> Option<[u8; 6]> {
        let ifname = self.cells.interface_for(ip)?;
        crate::netlink::neigh_mac(ifname, ip).ok().flatten()
    }

    fn admit(&self, ip: IpAddr) -> Result<Admitted, Refusal> {
        let r = self
            .admission
            .lock()
            .unwrap()
            .admit(ip, crate::clock::mono_ns());
        if let Err(why) = r {
            let st = &self.sessions.stats;
            let c = match why {
                Refusal::NotAnMh => &st.refused_not_mh,
                Refusal::RateLimited => &st.refused_rate,
                _ => &st.refused_limit,
            };
            c.fetch_add(1, Ordering::Relaxed);
            return Err(why);
        }
        Ok(Admitted::new(&self.admission, ip))
    }

    /// Whether msrd sizes the wireless side of an MH at `mh` for its cell
    /// ([`crate::sizing`]).
    fn sized_for_cell(&self, mh: IpAddr) -> bool {
        let t = self.cfg.wireless_tuning_for(self.cells.interface_for(mh));
        t.sizing.unwrap_or_default() == itcp_config::Sizing::Cell
    }

    /// How to relay a connection of the MH at `mh`.
    fn relay_opts_for(&self, mh: IpAddr) -> RelayOpts {
        RelayOpts {
            size_fixed: crate::sizing::sizes_fixed(self.sized_for_cell(mh), &self.cfg.fixed),
            ..self.relay_opts.clone()
        }
    }

    fn wireless_tuning(&self, mh: IpAddr) -> TcpTuning {
        let mut t = self.cfg.wireless_tuning_for(self.cells.interface_for(mh));
        if t.sizing.unwrap_or_default() == itcp_config::Sizing::Cell {
            crate::sizing::fill_wireless(&mut t, self.wireless_cc.as_deref());
        }
        // [handoff] linger_s: an MH that went away for good (out of every cell, never
        // greeting another MSR) has its connections closed after the linger, idle ones
        // too (keepalive), unless [wireless] says otherwise.
        let linger = self.cfg.handoff.linger_s;
        if self.cfg.handoff.enabled() && linger > 0 {
            let ms = (linger * 1000).min(i32::MAX as u64) as u32;
            t.user_timeout_ms.get_or_insert(ms);
            if t.keepalive_idle_s.is_none() {
                t.keepalive_idle_s = Some((linger as u32 / 2).clamp(1, 32767));
                t.keepalive_interval_s.get_or_insert(10);
            }
        }
        t
    }

    /// Relays one admitted connection and records it in the session table and the log.
    /// A fixed-side setup in flight (`connecting`) ends once the session is in the
    /// table, where a handoff finds it.
    ///
    /// The relay runs as a task of its own, and the setup's task ends here: its future
    /// (the SOCKS handshake, the fixed-side connect) is several times the relay's size,
    /// and would otherwise stay allocated for the connection's whole life
    /// (`bench conns`: ~4.7 KB of the ~7 KB msrd held per idle relayed connection).
    #[allow(clippy::too_many_arguments)]
    fn run_session(
        self: &Arc<Self>,
        kind: Kind,
        wireless: TcpStream,
        fixed: TcpStream,
        mh: SocketAddr,
        fh: SocketAddr,
        adm: Admitted,
        connecting: Option<Connecting>,
    ) {
        let wl = wireless.local_addr().unwrap_or(mh);
        let s: Arc<Session> = self.sessions.open(kind, mh, fh, wl);
        drop(connecting);
        info!(conn = s.id, kind = ?kind, mh = %mh.ip(), mh_port = mh.port(), %fh, "connection open");
        let d = self.clone();
        tokio::spawn(async move {
            d.relay_session(s, wireless, fixed, Pending::default(), adm)
                .await
        });
    }

    /// Gives a paused connection to the handoff that asked for it; if nobody waits any
    /// more (the freeze gave up), it comes back to be resumed.
    fn hand_over(&self, f: Frozen) -> Option<Frozen> {
        let to = f.session.frozen_to.lock().unwrap().take();
        match to {
            Some(tx) => tx.send(f).err(),
            None => Some(f),
        }
        .inspect(|f| {
            f.session.pause.send_replace(false);
        })
    }

    /// A LISTEN's control connection: the listener lives while the MH keeps it open
    /// (or until drain); a handoff freezes it and moves it with the listener.
    pub async fn listen_wait(&self, sess: Arc<Session>, s: TcpStream, addr: SocketAddr) {
        let mut drain = self.draining.subscribe();
        let mut pause = sess.pause.subscribe();
        let paused = tokio::select! {
            _ = closed_by_client(&s) => false,
            _ = drain.wait_for(|&x| x) => false,
            _ = pause.wait_for(|&p| p) => true,
        };
        if paused {
            let f = Frozen {
                session: sess,
                wireless: s,
                fixed: None,
                listen: Some(addr),
                pending: Pending::default(),
                admitted: None,
            };
            if let Some(f) = self.hand_over(f) {
                Box::pin(self.listen_wait(f.session, f.wireless, addr)).await;
            }
            return;
        }
        self.listeners.remove(addr);
        self.sessions.close(&sess);
        info!(mh = %addr.ip(), %addr, "listener closed");
    }

    /// An ACCEPT waiting for a connection on the MH's listener `addr`.
    pub async fn accept_wait(
        self: &Arc<Self>,
        sess: Arc<Session>,
        mut s: TcpStream,
        addr: SocketAddr,
        adm: Admitted,
    ) -> io::Result<()> {
        let peer = s.peer_addr()?;
        let l = match self.listeners.get(sess.mh_ip(), addr) {
            Ok(l) => l,
            Err(_) => {
                self.sessions.close(&sess);
                return send_reply(&mut s, Reply::NoSuchListener, &unspecified_like(peer)).await;
            }
        };
        let mut pause = sess.pause.subscribe();
        let next = tokio::select! {
            c = l.next() => c,
            _ = closed_by_client(&s) => {
                self.sessions.close(&sess);
                return Ok(());
            }
            _ = async { let _ = pause.wait_for(|&p| p).await; } => {
                let f = Frozen {
                    session: sess,
                    wireless: s,
                    fixed: None,
                    listen: Some(addr),
                    pending: Pending::default(),
                    admitted: Some(adm),
                };
                if let Some(f) = self.hand_over(f) {
                    let adm = f.admitted.unwrap();
                    return Box::pin(self.accept_wait(f.session, f.wireless, addr, adm)).await;
                }
                return Ok(());
            }
        };
        self.sessions.close(&sess);
        let Some((fixed, fh)) = next else {
            // The listener closed while we waited.
            return send_reply(&mut s, Reply::NoSuchListener, &unspecified_like(peer)).await;
        };
        sockopt::apply_post_connect(&fixed, &self.cfg.fixed)?;
        sockopt::apply_post_connect(&s, &self.wireless_tuning(peer.ip()))?;
        send_reply(&mut s, Reply::Succeeded, &Addr::Ip(fh)).await?;
        self.run_session(Kind::Accept, s, fixed, l.addr, fh, adm, None);
        Ok(())
    }

    /// Relays a session until it ends (then closes it) or is paused for a handoff
    /// (then hands its sockets to the handoff, which deletes or resumes them).
    pub async fn relay_session(
        &self,
        s: Arc<Session>,
        wireless: TcpStream,
        fixed: TcpStream,
        pending: Pending,
        adm: Admitted,
    ) {
        // A crash must look like a crash: if msrd dies, the kernel resets both halves
        // (a plain close would end them with FIN, and an application without its own
        // framing would take a truncated stream for a complete one). Graceful ends
        // below clear this first.
        sockopt::abort_on_close(&wireless);
        sockopt::abort_on_close(&fixed);
        let span = tracing::info_span!("conn", conn = s.id, mh = %s.mh.ip());
        let opts = self.relay_opts_for(s.mh_ip());
        let end = relay::relay(&wireless, &fixed, &opts, &s.counters, &s.pause, pending)
            .instrument(span)
            .await;
        match end {
            End::Paused(pending) => {
                let f = Frozen {
                    session: s,
                    wireless,
                    fixed: Some(fixed),
                    listen: None,
                    pending,
                    admitted: Some(adm),
                };
                if let Some(f) = self.hand_over(f) {
                    let (x, a) = (f.fixed.unwrap(), f.admitted.unwrap());
                    Box::pin(self.relay_session(f.session, f.wireless, x, f.pending, a)).await;
                }
                return;
            }
            // The other half was reset or failed: reset this one (linger 0 is on).
            End::WirelessAborted | End::FixedAborted => {}
            // The MH stayed away past the linger: the FH gets a clean end of stream.
            End::WirelessTimedOut => {
                info!(conn = s.id, mh = %s.mh.ip(), "the MH stayed away past the linger: closing");
                sockopt::close_gracefully(&fixed);
                let _ = sockopt::shutdown_write(&fixed);
            }
            End::Closed => {
                if crate::faults::fault("slow_relay_end") {
                    // Test hook: a relay slow to act on its end (a busy runtime), so
                    // that a handoff's freeze can list it first (`freeze_race`).
                    let ms = crate::faults::fault_delay().unwrap_or(Duration::from_millis(100));
                    info!(conn = s.id, "MSRD_FAULT=slow_relay_end: the relay ended");
                    tokio::time::sleep(ms).await;
                }
                if !delivered(&wireless) || !delivered(&fixed) {
                    // Bytes (or a FIN) are still on their way: a handoff now must
                    // move them, so the connection stays in the table until they land.
                    let c = self
                        .sessions
                        .open(Kind::Closing, s.mh, s.fh, s.wireless_local);
                    self.sessions.close(&s);
                    log_closed(&s, &end);
                    // A handoff or an upgrade that paused this relay as it ended waits
                    // for it (and will not see the new session): it gets the closing one.
                    let waiting = s.frozen_to.lock().unwrap().take();
                    let (mut wireless, mut fixed, mut adm) = (wireless, Some(fixed), Some(adm));
                    if let Some(tx) = waiting {
                        let f = Frozen {
                            session: c.clone(),
                            wireless,
                            fixed,
                            listen: None,
                            pending: Pending::default(),
                            admitted: adm,
                        };
                        match tx.send(f) {
                            Ok(()) => return,
                            Err(f) => (wireless, fixed, adm) = (f.wireless, f.fixed, f.admitted),
                        }
                    }
                    return Box::pin(self.drain(c, wireless, fixed, adm)).await;
                }
                self.note_ended(&s, &wireless, Some(&fixed));
                self.note_closed(&s, Some(&wireless), Some(&fixed));
                sockopt::close_gracefully(&wireless);
                sockopt::close_gracefully(&fixed);
            }
        }
        if end != End::Closed {
            self.sessions.stats.aborted.fetch_add(1, Ordering::Relaxed);
            self.note_closed(&s, Some(&wireless), Some(&fixed));
        }
        drop((wireless, fixed, adm));
        self.sessions.close(&s);
        log_closed(&s, &end);
    }

    /// Records a relay's flows as closed (see [`crate::strays`]).
    /// Call it as a socket closes, not before: a closing connection still moves.
    /// A socket whose connection is over (TIME_WAIT) has no peer address any more:
    /// session `s` says what it was.
    pub(crate) fn note_closed(
        &self,
        s: &Session,
        wireless: Option<&TcpStream>,
        fixed: Option<&TcpStream>,
    ) {
        if !self.cfg.handoff.enabled() {
            return;
        }
        let window = Duration::from_secs(self.cfg.handoff.closed_window_s);
        let flows = relay_flows(s, wireless, fixed);
        if let Some((a, _)) = flows.first() {
            let mh = crate::admission::canonical(a.ip());
            self.strays.closed(mh, &flows, window);
        }
    }

    /// Tells the kernel that relay `s` ended gracefully, as its FINs go out: once its
    /// sockets are gone, stray segments of its flows meet silence, not an RST (see
    /// `Rules::end_flows`). A socket in LAST_ACK that retransmitted its FIN closes on
    /// the peer's first ACK; the peer's answer to the retransmission (a tail-loss
    /// probe re-sends the FIN on a long path) follows, and would draw an RST.
    pub(crate) fn note_ended(&self, s: &Session, wireless: &TcpStream, fixed: Option<&TcpStream>) {
        let window = Duration::from_secs(self.cfg.handoff.closed_window_s);
        if window.is_zero() {
            return;
        }
        let flows: Vec<_> = relay_flows(s, Some(wireless), fixed)
            .into_iter()
            .map(|(a, z)| (a, z, window))
            .collect();
        if let Err(e) = self.rules.end_flows(&flows) {
            debug!(conn = s.id, error = %e, "ended flows not recorded: a stray segment may draw an RST");
        }
    }

    /// A closed relay whose sockets still deliver queued bytes or a FIN: each socket is
    /// closed once the peer has acknowledged everything (the kernel keeps TIME_WAIT
    /// without us). Until then a handoff moves it (kind `closing`).
    pub async fn drain(
        &self,
        c: Arc<Session>,
        mut wireless: TcpStream,
        mut fixed: Option<TcpStream>,
        mut adm: Option<Admitted>,
    ) {
        // The kernel gives up on a peer that stays silent (TCP_USER_TIMEOUT, the
        // linger); this only bounds a socket that would never report it.
        const MOST: Duration = Duration::from_secs(900);
        self.note_ended(&c, &wireless, fixed.as_ref());
        let mut pause = c.pause.subscribe();
        let mut delay = Duration::from_millis(1);
        let start = Instant::now();
        loop {
            if fixed.as_ref().is_some_and(delivered) {
                let x = fixed.take().unwrap();
                self.note_closed(&c, None, Some(&x));
                sockopt::close_gracefully(x);
            }
            if (delivered(&wireless) && fixed.is_none()) || start.elapsed() > MOST {
                break;
            }
            let paused = tokio::select! {
                _ = tokio::time::sleep(delay) => false,
                _ = pause.wait_for(|&p| p) => true,
            };
            delay = (delay * 2).min(Duration::from_millis(100));
            if !paused {
                continue;
            }
            let f = Frozen {
                session: c.clone(),
                wireless,
                fixed,
                listen: None,
                pending: Pending::default(),
                admitted: adm,
            };
            let Some(f) = self.hand_over(f) else {
                return; // The handoff has it.
            };
            (wireless, fixed, adm) = (f.wireless, f.fixed, f.admitted);
            pause = c.pause.subscribe();
        }
        self.note_closed(&c, Some(&wireless), fixed.as_ref());
        sockopt::close_gracefully(&wireless);
        if let Some(x) = &fixed {
            sockopt::close_gracefully(x);
        }
        drop((wireless, fixed, adm));
        self.sessions.close(&c);
    }
}

/// The flows of relay `s` (each this end, the other end; the wireless one the MH's
/// end first), once each: in transparent mode the fixed flow is the wireless one. A
/// socket whose connection is over (TIME_WAIT) has no peer address any more: the
/// session says what it was.
fn relay_flows(
    s: &Session,
    wireless: Option<&TcpStream>,
    fixed: Option<&TcpStream>,
) -> Vec<(SocketAddr, SocketAddr)> {
    let w = wireless.map(|w| {
        let mh = w.peer_addr().unwrap_or(s.mh);
        (mh, w.local_addr().unwrap_or(s.wireless_local))
    });
    let x = fixed.and_then(|x| Some((x.local_addr().ok()?, x.peer_addr().unwrap_or(s.fh))));
    let mut flows = Vec::with_capacity(2);
    for flow in w.into_iter().chain(x) {
        if !flows.contains(&flow) {
            flows.push(flow);
        }
    }
    flows
}

/// True when the peer has acknowledged everything sent on `s`, FIN included (or the
/// socket is dead): nothing is left to deliver.
fn delivered(s: &TcpStream) -> bool {
    use std::os::fd::AsFd;
    itcp_handoff::repair::outq(s.as_fd()).map_or(true, |n| n == 0)
        || s.take_error().ok().flatten().is_some()
}

fn log_closed(s: &Session, end: &End) {
    info!(
        conn = s.id,
        end = ?end,
        bytes_up = s.counters.up.load(Ordering::Relaxed),
        bytes_down = s.counters.down.load(Ordering::Relaxed),
        secs = s.started.elapsed().map(|d| d.as_secs_f64()).unwrap_or(0.0),
        "connection closed"
    );
}

/// Handshake failures: what to log; the reply (if any) has been sent.
#[derive(Debug)]
enum Failed {
    Io(io::Error),
    Proto(ProtoError),
    Closed,
    TooLong,
    /// Paused for a handoff while waiting for the MH.
    Frozen,
    /// A resumed handshake would not send what was sent before the handoff.
    Replay(String),
    /// The MH's sealed token does not open under our key share.
    Token(itcp_proto::token_kx::OpenError),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Io(e) => write!(f, "{e}"),
            Failed::Proto(e) => write!(f, "malformed request: {e}"),
            Failed::Closed => f.write_str("client closed during the handshake"),
            Failed::TooLong => f.write_str("handshake message too long"),
            Failed::Frozen => f.write_str("frozen for a handoff"),
            Failed::Replay(e) => f.write_str(e),
            Failed::Token(e) => write!(f, "session token refused: {e}"),
        }
    }
}

/// A codec parser: a message and the bytes it took, or `None` for "need more".
type Parser<T> = fn(&[u8]) -> Result<Option<(T, usize)>, ProtoError>;

/// The socket of a request handshake, what it read and wrote so far, and the pause
/// of a handoff, which stops it whenever it waits for the MH.
struct Handshake<'a> {
    s: &'a mut TcpStream,
    /// The MH's address (the connection's source): sealed tokens are bound to it.
    mh: IpAddr,
    t: &'a mut Transcript,
    pause: &'a mut watch::Receiver<bool>,
}

impl Handshake<'_> {
    /// Reads until `parse` yields a message; surplus bytes stay unparsed.
    async fn read_msg<T>(&mut self, parse: Parser<T>) -> Result<T, Failed> {
        loop {
            if let Some((m, n)) = parse(self.t.unparsed()).map_err(Failed::Proto)? {
                self.t.consume(n);
                return Ok(m);
            }
            if self.t.unparsed().len() >= MAX_HANDSHAKE {
                return Err(Failed::TooLong);
            }
            let mut chunk = [0u8; 512];
            // Reads are cancel-safe: a pause loses no byte.
            let n = tokio::select! {
                r = self.s.read(&mut chunk) => r.map_err(Failed::Io)?,
                _ = self.pause.wait_for(|&p| p) => return Err(Failed::Frozen),
            };
            if n == 0 {
                return Err(Failed::Closed);
            }
            self.t.received(&chunk[..n]);
        }
    }

    /// Sends a reply, except what a run before a handoff already sent.
    async fn send(&mut self, out: &[u8]) -> Result<(), Failed> {
        let rest = self.t.reply(out).map_err(Failed::Replay)?;
        self.s.write_all(rest).await.map_err(Failed::Io)
    }
}

async fn send_reply(s: &mut TcpStream, reply: Reply, addr: &Addr) -> io::Result<()> {
    let mut out = Vec::with_capacity(22);
    socks::encode_reply(&mut out, reply, addr).map_err(io::Error::from)?;
    s.write_all(&out).await
}

fn unspecified_like(peer: SocketAddr) -> Addr {
    Addr::unspecified(peer.is_ipv6(), 0)
}

/// Serves one connection on the request port. While it waits for the MH it is a
/// `handshake` session, which a handoff freezes and moves with its transcript; a
/// handshake that moved here (`moved`) is replayed from its transcript.
pub(crate) async fn serve_request(
    d: Arc<Daemon>,
    mut s: TcpStream,
    peer: SocketAddr,
    setup: Option<SetupSlot>,
    moved: Option<(Arc<Session>, Transcript)>,
) {
    let mh = crate::admission::canonical(peer.ip());
    let mut setup = setup;
    let (sess, mut t) = moved.unwrap_or_else(|| {
        let local = s.local_addr().unwrap_or(peer);
        let sess = d.sessions.open(Kind::Handshake, peer, local, local);
        (sess, Transcript::default())
    });
    if let Some(x) = setup.as_mut() {
        x.registered();
    }
    let mut pause = sess.pause.subscribe();
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let mut done = None;
    let connecting = loop {
        if done.is_none() {
            let hs = Handshake {
                s: &mut s,
                mh,
                t: &mut t,
                pause: &mut pause,
            };
            match tokio::time::timeout_at(deadline, hs.run()).await {
                Ok(Ok(r)) => done = Some(r),
                Ok(Err(Failed::Frozen)) => {}
                Err(_) => {
                    debug!(mh = %peer.ip(), mh_port = peer.port(), "request handshake timed out");
                    return d.sessions.close(&sess);
                }
                Ok(Err(e)) => {
                    d.sessions.close(&sess);
                    return handshake_failed(&d, &mut s, peer, &t, e).await;
                }
            }
        }
        if done.is_some() {
            // The request is complete: its fixed side may start, unless a handoff is
            // freezing the MH (then the request moves with it, to be served there).
            if let Some(c) = d.inflight.begin(mh) {
                break c;
            }
            if !d.inflight.wait(mh, &mut pause).await {
                continue;
            }
        }
        let f = Frozen {
            session: sess.clone(),
            wireless: s,
            fixed: None,
            listen: None,
            pending: std::mem::take(&mut t).into_pending(),
            admitted: None,
        };
        let Some(f) = d.hand_over(f) else {
            return; // The handoff has it.
        };
        // Nobody took it (the handoff gave up first): replay it here.
        s = f.wireless;
        t = Transcript::from_pending(f.pending);
        done = None;
    };
    drop(setup);
    d.sessions.close(&sess);
    let Some((req, token)) = done else {
        unreachable!("the loop ends with a complete request")
    };
    // The MH proves ownership of its connections in handoff greetings with it.
    let bound = match (&token, &d.handoff) {
        (Some(t), Some(h)) => h.bind_token(mh, &t.0),
        _ => false,
    };
    let early = t.unparsed().to_vec();
    let c = Some(connecting);
    let r = match req.command {
        Command::Connect => do_connect(&d, s, peer, req.addr, early, c).await,
        Command::Listen => do_listen(&d, s, peer, req.addr, c).await,
        Command::Accept => do_accept(&d, s, peer, req.addr, c).await,
        // The token, bound above, is all a registration asks for.
        Command::Register => {
            let r = if bound {
                debug!(%mh, "session token registered");
                Reply::Succeeded
            } else {
                if d.may_log(mh) {
                    warn!(%mh, "registration refused: no token, or another one is bound to this address");
                }
                Reply::NotAllowed
            };
            send_reply(&mut s, r, &unspecified_like(peer)).await
        }
        Command::Bind => {
            // A BIND waits for the FH for as long as it takes: not a setup a handoff
            // should wait for (a waiting BIND stays here).
            drop(c);
            do_bind(&d, s, peer, req.addr).await
        }
    };
    if let Err(e) = r {
        debug!(mh = %peer.ip(), mh_port = peer.port(), error = %e, "request ended with an error");
    }
}

/// Answers a failed handshake as the client understands, and logs it (rate-limited).
async fn handshake_failed(
    d: &Daemon,
    s: &mut TcpStream,
    peer: SocketAddr,
    t: &Transcript,
    e: Failed,
) {
    if let Failed::Token(_) = &e {
        d.sessions
            .stats
            .malformed_requests
            .fetch_add(1, Ordering::Relaxed);
        if d.may_log(peer.ip()) {
            warn!(mh = %peer.ip(), mh_port = peer.port(), error = %e, "request refused");
        }
        return;
    }
    let Failed::Proto(p) = &e else {
        return debug!(mh = %peer.ip(), mh_port = peer.port(), error = %e, "request handshake failed");
    };
    d.sessions
        .stats
        .malformed_requests
        .fetch_add(1, Ordering::Relaxed);
    let log = d.may_log(peer.ip());
    if socks::is_socks4(&t.read) {
        // A SOCKS4 client understands only a SOCKS4 rejection.
        let _ = s.write_all(&socks::SOCKS4_REJECTION).await;
        if log {
            warn!(mh = %peer.ip(), mh_port = peer.port(), "SOCKS4 request refused: msrd speaks SOCKS5 (RFC 1928)");
        }
    } else {
        let _ = send_reply(s, p.reply(), &unspecified_like(peer)).await;
        if log {
            warn!(mh = %peer.ip(), mh_port = peer.port(), error = %e, "request rejected");
        }
    }
}

impl Handshake<'_> {
    /// Method negotiation, optional token, request.
    async fn run(mut self) -> Result<(socks::Request, Option<Token>), Failed> {
        let offered = self.read_msg(socks::parse_greeting).await?;
        let method = Method::select(&offered);
        let mut out = Vec::new();
        socks::encode_method_choice(&mut out, method);
        self.send(&out).await?;
        if method == Method::NONE_ACCEPTABLE {
            return Err(Failed::Closed);
        }
        let mut token = None;
        if method == Method::ITCP_SESSION {
            // Our key share goes out with the method choice's round trip; its secret
            // stays with the transcript (a moved handshake replays the same share).
            let secret = match self.t.kx {
                Some(k) => k,
                None => *self
                    .t
                    .kx
                    .insert(crate::random::bytes().map_err(Failed::Io)?),
            };
            out.clear();
            socks::encode_key_share(&mut out, &itcp_proto::token_kx::public_key(&secret));
            self.send(&out).await?;
            let sealed = self.read_msg(socks::parse_token).await?;
            let opened = sealed.open(&secret, self.mh);
            out.clear();
            let status = if opened.is_ok() {
                socks::TOKEN_STATUS_OK
            } else {
                0x01
            };
            socks::encode_token_status(&mut out, status);
            self.send(&out).await?;
            token = Some(opened.map_err(Failed::Token)?);
        }
        let req = self.read_msg(socks::parse_request).await?;
        Ok((req, token))
    }
}

/// Refuses with NotAllowed if the admission says no.
async fn refuse(d: &Daemon, s: &mut TcpStream, peer: SocketAddr, why: Refusal) -> io::Result<()> {
    if d.may_log(peer.ip()) {
        warn!(mh = %peer.ip(), mh_port = peer.port(), reason = why.as_str(), "request refused");
    }
    send_reply(s, Reply::NotAllowed, &unspecified_like(peer)).await
}

/// The FH address a request names, in the MH's address family (the fixed side
/// impersonates the MH's own address, so it cannot reach the other family). Names
/// are resolved with the router's resolver, within `[relay] resolve_timeout_ms`.
/// Errors carry the reply that says why.
async fn resolve(d: &Daemon, a: &Addr, mh: SocketAddr) -> Result<SocketAddr, (Reply, String)> {
    let family_ok = |x: &SocketAddr| x.is_ipv6() == mh.is_ipv6();
    match a {
        Addr::Ip(sa) if family_ok(sa) => Ok(*sa),
        Addr::Ip(sa) => Err((
            Reply::AddressTypeNotSupported,
            format!(
                "{sa} is not reachable from the MH's address {}: other address family",
                mh.ip()
            ),
        )),
        Addr::Domain(..) if !d.cfg.relay.resolve_names => Err((
            Reply::AddressTypeNotSupported,
            "domain names are refused here ([relay] resolve_names = false)".into(),
        )),
        Addr::Domain(name, port) => {
            let t = d.cfg.relay.resolve_timeout();
            match tokio::time::timeout(t, tokio::net::lookup_host((name.as_str(), *port))).await {
                Err(_) => Err((
                    Reply::HostUnreachable,
                    format!("{name} did not resolve within {} ms", t.as_millis()),
                )),
                Ok(Err(e)) => Err((
                    Reply::HostUnreachable,
                    format!("{name} does not resolve: {e}"),
                )),
                Ok(Ok(addrs)) => addrs.into_iter().find(family_ok).ok_or_else(|| {
                    (
                        Reply::HostUnreachable,
                        format!("{name} has no address of the MH's family"),
                    )
                }),
            }
        }
    }
}

async fn do_connect(
    d: &Arc<Daemon>,
    mut s: TcpStream,
    peer: SocketAddr,
    target: Addr,
    early: Vec<u8>,
    connecting: Option<Connecting>,
) -> io::Result<()> {
    let adm = match d.admit(peer.ip()) {
        Ok(a) => a,
        Err(why) => return refuse(d, &mut s, peer, why).await,
    };
    sockopt::apply_post_connect(&s, &d.wireless_tuning(peer.ip()))?;
    // The FH's answers must reach us on the fixed LAN before we connect.
    d.claim(crate::admission::canonical(peer.ip()));
    let fh = match resolve(d, &target, peer).await {
        Ok(a) => a,
        Err((reply, why)) => {
            d.sessions
                .stats
                .connections_failed
                .fetch_add(1, Ordering::Relaxed);
            info!(mh = %peer.ip(), mh_port = peer.port(), target = %target, reply = reply.description(), reason = %why, "request refused");
            return send_reply(&mut s, reply, &unspecified_like(peer)).await;
        }
    };
    let fixed = match crate::fixed::connect_as(
        peer,
        fh,
        &d.cfg.fixed,
        d.cfg.relay.connect_timeout(),
    )
    .await
    {
        Ok(f) => f,
        Err(e) => {
            d.sessions
                .stats
                .connections_failed
                .fetch_add(1, Ordering::Relaxed);
            let reply = Reply::from_io_error(&e);
            info!(mh = %peer.ip(), mh_port = peer.port(), %fh, error = %e, reply = reply.description(), "connect failed");
            send_reply(&mut s, reply, &unspecified_like(peer)).await?;
            return Ok(());
        }
    };
    let bound = fixed.local_addr()?;
    send_reply(&mut s, Reply::Succeeded, &Addr::Ip(bound)).await?;
    // Bytes the client sent right behind its request belong to the stream.
    if !early.is_empty() {
        let mut f = fixed;
        f.write_all(&early).await?;
        d.run_session(Kind::Connect, s, f, bound, fh, adm, connecting);
    } else {
        d.run_session(Kind::Connect, s, fixed, bound, fh, adm, connecting);
    }
    Ok(())
}

/// The MH address:port a LISTEN/ACCEPT/BIND refers to: always the requester's own IP.
fn mh_listen_addr(peer: SocketAddr, a: &Addr) -> Result<SocketAddr, Reply> {
    match a {
        Addr::Ip(sa) if sa.ip().is_unspecified() || sa.ip() == peer.ip() => {
            Ok(SocketAddr::new(peer.ip(), sa.port()))
        }
        Addr::Ip(_) => Err(Reply::NotAllowed),
        Addr::Domain(..) => Err(Reply::AddressTypeNotSupported),
    }
}

/// Waits until the client closes (or errors) its end of `s`.
async fn closed_by_client(s: &TcpStream) {
    let mut b = [0u8; 64];
    loop {
        match s.peek(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                // Nothing is expected here; consume it so peek does not spin.
                let _ = s.try_read(&mut b);
            }
        }
    }
}

async fn do_listen(
    d: &Daemon,
    mut s: TcpStream,
    peer: SocketAddr,
    a: Addr,
    connecting: Option<Connecting>,
) -> io::Result<()> {
    if !d.admission.lock().unwrap().is_mh(peer.ip()) {
        return refuse(d, &mut s, peer, Refusal::NotAnMh).await;
    }
    let addr = match mh_listen_addr(peer, &a) {
        Ok(x) => x,
        Err(r) => return send_reply(&mut s, r, &unspecified_like(peer)).await,
    };
    d.claim(crate::admission::canonical(peer.ip()));
    let l = match d.listeners.listen(addr, &d.cfg.fixed) {
        Ok(l) => l,
        Err(e) => {
            info!(mh = %peer.ip(), mh_port = peer.port(), %addr, error = %e, "listen failed");
            return send_reply(&mut s, Reply::from_io_error(&e), &unspecified_like(peer)).await;
        }
    };
    info!(mh = %peer.ip(), mh_port = peer.port(), addr = %l.addr, "listening for the MH");
    send_reply(&mut s, Reply::Succeeded, &Addr::Ip(l.addr)).await?;
    let wl = s.local_addr().unwrap_or(l.addr);
    let sess = d.sessions.open(Kind::Listen, l.addr, l.addr, wl);
    drop(connecting);
    d.listen_wait(sess, s, l.addr).await;
    Ok(())
}

async fn do_accept(
    d: &Arc<Daemon>,
    mut s: TcpStream,
    peer: SocketAddr,
    a: Addr,
    connecting: Option<Connecting>,
) -> io::Result<()> {
    let adm = match d.admit(peer.ip()) {
        Ok(x) => x,
        Err(why) => return refuse(d, &mut s, peer, why).await,
    };
    let addr = match mh_listen_addr(peer, &a) {
        Ok(x) => x,
        Err(r) => return send_reply(&mut s, r, &unspecified_like(peer)).await,
    };
    let l = match d.listeners.get(peer.ip(), addr) {
        Ok(l) => l,
        Err(Lookup::NoSuchListener) => {
            return send_reply(&mut s, Reply::NoSuchListener, &unspecified_like(peer)).await
        }
        Err(Lookup::NotOwner) => {
            return send_reply(&mut s, Reply::NotAllowed, &unspecified_like(peer)).await
        }
    };
    let wl = s.local_addr().unwrap_or(l.addr);
    let sess = d.sessions.open(Kind::AcceptWait, l.addr, l.addr, wl);
    drop(connecting);
    d.accept_wait(sess, s, l.addr, adm).await
}

async fn do_bind(
    d: &Arc<Daemon>,
    mut s: TcpStream,
    peer: SocketAddr,
    expected: Addr,
) -> io::Result<()> {
    let adm = match d.admit(peer.ip()) {
        Ok(x) => x,
        Err(why) => return refuse(d, &mut s, peer, why).await,
    };
    // RFC 1928 BIND: DST is the expected peer; we listen on the MH's address at DST.PORT
    // (0: any port). Connections from other hosts than an expected one are dropped.
    let want_port = expected.port();
    let expected_ip = expected
        .socket_addr()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified());
    d.claim(crate::admission::canonical(peer.ip()));
    let l = match d
        .listeners
        .listen(SocketAddr::new(peer.ip(), want_port), &d.cfg.fixed)
    {
        Ok(l) => l,
        Err(e) => {
            return send_reply(&mut s, Reply::from_io_error(&e), &unspecified_like(peer)).await
        }
    };
    send_reply(&mut s, Reply::Succeeded, &Addr::Ip(l.addr)).await?;
    let got = loop {
        let c = tokio::select! {
            c = l.next() => c,
            _ = closed_by_client(&s) => None,
        };
        match c {
            Some((f, fh)) if expected_ip.is_none_or(|ip| ip == fh.ip()) => break Some((f, fh)),
            Some(_) => continue,
            None => break None,
        }
    };
    d.listeners.remove(l.addr);
    let Some((fixed, fh)) = got else {
        return Ok(());
    };
    sockopt::apply_post_connect(&fixed, &d.cfg.fixed)?;
    send_reply(&mut s, Reply::Succeeded, &Addr::Ip(fh)).await?;
    d.run_session(Kind::Bind, s, fixed, l.addr, fh, adm, None);
    Ok(())
}

/// Serves one intercepted connection: `s` impersonates the FH towards the MH. Until its
/// fixed side starts it is an `intercepted` session, which a handoff freezes and moves
/// (to be connected there); a fixed-side connect in flight is waited for by a handoff.
pub(crate) async fn serve_transparent(
    d: Arc<Daemon>,
    mut s: TcpStream,
    mh: SocketAddr,
    setup: Option<SetupSlot>,
    moved: Option<(Arc<Session>, Admitted)>,
) {
    let fh = match s.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    let mh_ip = crate::admission::canonical(mh.ip());
    let mut setup = setup;
    let (sess, mut adm) = match moved {
        Some(m) => m,
        None => match d.admit(mh.ip()) {
            Ok(a) => (d.sessions.open(Kind::Intercepted, mh, fh, fh), a),
            Err(why) => {
                if d.may_log(mh.ip()) {
                    warn!(%mh, %fh, reason = why.as_str(), "intercepted connection refused");
                }
                sockopt::abort_on_close(&s);
                return;
            }
        },
    };
    if let Some(x) = setup.as_mut() {
        x.registered();
    }
    let _ = sockopt::apply_post_connect(&s, &d.wireless_tuning(mh.ip()));
    d.claim(mh_ip);
    let mut pause = sess.pause.subscribe();
    let connecting = loop {
        if let Some(c) = d.inflight.begin(mh_ip) {
            break c;
        }
        if !d.inflight.wait(mh_ip, &mut pause).await {
            continue;
        }
        let f = Frozen {
            session: sess.clone(),
            wireless: s,
            fixed: None,
            listen: None,
            pending: Pending::default(),
            admitted: Some(adm),
        };
        let Some(f) = d.hand_over(f) else {
            return; // The handoff has it.
        };
        s = f.wireless;
        adm = f.admitted.expect("an intercepted connection is admitted");
    };
    d.sessions.close(&sess);
    let connected =
        crate::fixed::connect_as(mh, fh, &d.cfg.fixed, d.cfg.relay.connect_timeout()).await;
    drop(setup);
    match connected {
        Ok(fixed) => {
            let bound = fixed.local_addr().unwrap_or(mh);
            d.run_session(
                Kind::Transparent,
                s,
                fixed,
                bound,
                fh,
                adm,
                Some(connecting),
            );
        }
        Err(e) => {
            // The MH's handshake already completed with us: a reset is how it learns.
            info!(%mh, %fh, error = %e, "intercepted connection: fixed side failed");
            d.sessions
                .stats
                .connections_failed
                .fetch_add(1, Ordering::Relaxed);
            sockopt::abort_on_close(&s);
        }
    }
}

pub(crate) fn listen_socket(
    addr: SocketAddr,
    tuning: &TcpTuning,
    transparent: bool,
) -> io::Result<TcpListener> {
    let s = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    let fd = &s;
    sockopt::set_reuseaddr(fd)?;
    if addr.is_ipv6() {
        sockopt::set_v6only(fd)?;
    }
    if transparent {
        sockopt::set_transparent(fd, addr.is_ipv6())?;
    }
    // Accepted sockets inherit buffers (and with them the window scale).
    sockopt::apply_pre_connect(fd, tuning)?;
    s.bind(addr)?;
    s.listen(4096)
}

/// Accepts on the request port or the TPROXY port until draining starts (or an
/// upgrade stops the task: cancel-safe).
pub(crate) async fn accept_loop(d: Arc<Daemon>, l: TcpListener, transparent: bool) {
    d.inflight.add_listener(l.as_raw_fd());
    let mut drain = d.draining.subscribe();
    loop {
        let r = tokio::select! {
            r = l.accept() => r,
            _ = drain.wait_for(|&x| x) => return d.inflight.remove_listener(l.as_raw_fd()),
        };
        match r {
            Ok((s, peer)) => {
                let Some(setup) = d.begin_setup(peer.ip()) else {
                    // Too many half-open connections from there: close at once, with
                    // a reset (nothing to finish, no TIME_WAIT kept here).
                    sockopt::abort_on_close(&s);
                    continue;
                };
                let d = d.clone();
                // The slot counts it as in setup until its session exists (handoffs
                // and upgrades wait for it).
                if transparent {
                    tokio::spawn(serve_transparent(d, s, peer, Some(setup), None));
                } else {
                    tokio::spawn(serve_request(d, s, peer, Some(setup), None));
                }
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
