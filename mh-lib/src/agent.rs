//! The MH's mobility agent (paper §5.4 steps 1–2): it listens to MSR beacons, decides
//! when to move with the [`Detector`], and greets the new MSR with proof of the MH's
//! session token. Once the new MSR says it holds the MH's flows, the agent points the
//! shared gateway address at that MSR's MAC, so the MH's packets go to it; the MSR
//! fetches the connections from the previous MSR meanwhile.
//!
//! The greeting is a UDP broadcast on the cell (every MSR in range hears it; only the
//! one it names acts), retransmitted until answered: the answer is kept by the MSR and
//! repeated, so a retransmission doubles as a status poll.
//!
//! The agent does not wait for the next beacon when its interface associates with a
//! cell: it watches the interface's carrier ([`crate::link`], rtnetlink) and, when it
//! comes up, broadcasts a [`Solicitation`] to the greeting port at once and twice more
//! 20 ms apart unless a beacon arrives first ([`Solicitor`]); the MSRs in the cell
//! answer with their beacon at once (docs/architecture.md §7). [`AgentConfig::solicit`] turns it
//! off.
//!
//! Applications see [`Event`]s: attached, moved, move failed, lost (no MSR heard),
//! refused, regained. `itcp-mh-agent` prints them as JSON lines.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use itcp_proto::beacon::Solicitation;
use itcp_proto::greeting::{GreetMsg, GreetReply, GreetStatus, Greeting};
use serde::Serialize;

use crate::answers::{self, AfterFailure, SiblingVerdict, Verdict};
use crate::link::{LinkEvent, LinkWatch};
use crate::mobility::{Beacon, Decision, Detector, Policy, Solicitor};
use crate::socks::Token;

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The MH's wireless interface (`air0`).
    pub interface: String,
    /// The MH's address (what its connections use).
    pub mh: IpAddr,
    /// The MH's other addresses (a dual-stack MH's IPv6 address): each is greeted
    /// alongside `mh` at every move, so the connections that use it move too.
    pub more_mh: Vec<IpAddr>,
    /// The cell gateway address every MSR shares (`10.2.0.1`).
    pub gateway: IpAddr,
    /// The gateway's address in the other family (a dual-stack MH): pointed at the new
    /// MSR once that MSR holds the MH's address of its family.
    pub more_gateways: Vec<IpAddr>,
    /// The MH's session token (proof in greetings).
    pub token: Token,
    /// UDP port beacons arrive on (4345).
    pub beacon_port: u16,
    /// UDP port greetings go to (4346).
    pub greet_port: u16,
    /// When to move.
    pub policy: Policy,
    /// No eager move this soon after the last.
    pub hysteresis: Duration,
    /// The MSRs' beacon interval.
    pub beacon_interval: Duration,
    /// Greeting retransmission interval.
    pub greet_retry: Duration,
    /// Give up a move after this long without a final answer.
    pub greet_timeout: Duration,
    /// Solicit a beacon when the interface's carrier comes up (on by default).
    pub solicit: bool,
    /// Solicitations after the first one of a link-up, unless a beacon arrives (2).
    pub solicit_repeats: u32,
    /// Between those solicitations (20 ms).
    pub solicit_spacing: Duration,
    /// The MSRs' SOCKS port (1080): the agent registers its token there at each MSR
    /// that answers `attached` ([`crate::register`]), so connections opened without
    /// I-TCP move with its greetings too (after a move the token came with the
    /// connections). `None`: no registration.
    pub register_port: Option<u16>,
}

impl AgentConfig {
    /// Defaults for `interface`, `mh`, `gateway` and `token`: ports 4345/4346, eager,
    /// 2 s hysteresis, 1 s beacons, 200 ms retransmission, 10 s timeout, solicitation on
    /// link-up (3 × 20 ms).
    pub fn new(interface: &str, mh: IpAddr, gateway: IpAddr, token: Token) -> Self {
        AgentConfig {
            interface: interface.into(),
            mh,
            more_mh: Vec::new(),
            gateway,
            more_gateways: Vec::new(),
            token,
            beacon_port: 4345,
            greet_port: 4346,
            policy: Policy::Eager,
            hysteresis: Duration::from_secs(2),
            beacon_interval: Duration::from_secs(1),
            greet_retry: Duration::from_millis(200),
            greet_timeout: Duration::from_secs(10),
            solicit: true,
            solicit_repeats: 2,
            solicit_spacing: Duration::from_millis(20),
            register_port: Some(1080),
        }
    }
}

/// What happened, for applications (and the agent's JSON-line output).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[allow(missing_docs)] // Field names say it: MSR ids, counts, times in ms, reasons.
pub enum Event {
    /// Attached to an MSR with nothing to move.
    Attached { msr: String, connections: usize },
    /// The greeting for the MH's address of its other family (a dual-stack MH greets
    /// once per address; the events above are the main address's) ended at `msr`:
    /// `status` is the final answer (`attached`, `moved`, `failed`, `refused`), or
    /// `unanswered` when none came within the greeting timeout.
    OtherAddress {
        mh: IpAddr,
        msr: String,
        status: String,
        connections: usize,
        reason: String,
    },
    /// The MH's connections moved `from` → `to`; times from the greeting, in ms.
    Moved {
        from: String,
        to: String,
        connections: usize,
        holding_ms: f64,
        moved_ms: f64,
    },
    /// The handoff failed: the connections stayed with `from`.
    MoveFailed {
        from: String,
        to: String,
        reason: String,
    },
    /// The MSR refused the greeting.
    Refused { msr: String, reason: String },
    /// The MSR refused a retransmitted greeting, or its handoff failed: the agent
    /// greets it afresh once (a greeting whose handoff rolled back is a replay to the
    /// old MSR).
    GreetedAfresh { msr: String, reason: String },
    /// An answer "from" `msr` was dropped: forged, or untagged where a tag is due
    /// (reported once per greeting).
    AnswerDropped { msr: String, reason: String },
    /// No MSR heard any more.
    Lost { from: String },
    /// The MH's token is bound at `msr` for `mh` (registration): its greetings prove
    /// every connection of `mh` there.
    Registered { msr: String, mh: IpAddr },
    /// Registering at `msr` failed: connections of `mh` opened without I-TCP there
    /// move only by network detection until a later registration succeeds.
    RegisterFailed {
        msr: String,
        mh: IpAddr,
        error: String,
    },
    /// After [`Event::Lost`], beacons of the MSR the MH was attached to are heard again
    /// (the MH came back into its cell; nothing to greet or move). A return to another
    /// MSR is reported as [`Event::Moved`] (or [`Event::Attached`]) instead.
    Regained { msr: String },
}

struct Pending {
    from: String,
    to: String,
    mac: String,
    msg: Vec<u8>,
    nonce: String,
    /// The nonce of the greeting this one replaced (see [`answers::greet_afresh`]): an
    /// answer to it other than a refusal still counts.
    old_nonce: Option<String>,
    /// Times `msg` went out, and whether it replaced a refused greeting.
    sends: u32,
    refreshed: bool,
    t0: Instant,
    last_sent: Option<Instant>,
    holding_ms: Option<f64>,
    /// An untagged answer kept aside (see [`crate::answers`]), and when it came.
    fallback: Option<(GreetReply, Instant)>,
    /// A dropped answer was reported for this greeting (once is enough).
    dropped: bool,
    /// `to` answered a greeting for another of the MH's addresses genuinely (tagged)
    /// with its connections: its untagged `attached` to this one is acted on at once.
    vouched: bool,
}

/// How long an untagged answer waits for a tagged one before it may act.
const FALLBACK_GRACE: Duration = Duration::from_secs(1);

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn nonce() -> io::Result<[u8; 16]> {
    Ok(crate::token::random_token()?.0)
}

/// Points the gateway address at `mac` (a permanent neighbour entry, set over
/// rtnetlink: no process runs on the move's path).
pub fn point_gateway(gateway: IpAddr, mac: &str, interface: &str) -> io::Result<()> {
    let m = itcp_proto::hex::parse_mac(mac).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("beacon MAC {mac:?} is not a MAC address"),
        )
    })?;
    crate::neigh::replace_permanent(gateway, m, interface)
}

/// A greeting for one of the MH's other addresses, retransmitted alongside the main
/// one until its MSR answers for good (judged as the main one's answers are).
struct Sibling {
    mh: IpAddr,
    to: String,
    msg: Vec<u8>,
    nonce: String,
    t0: Instant,
    last_sent: Option<Instant>,
    /// An untagged final answer kept aside ([`answers::SiblingVerdict::Fallback`]).
    fallback: Option<GreetReply>,
    /// A dropped answer was reported for this greeting (once is enough).
    dropped: bool,
    /// Its MSR said `holding`: the gateway of its family points there.
    holding: bool,
}

/// The agent: call [`Agent::run`] on a thread of its own.
pub struct Agent {
    cfg: AgentConfig,
    beacons: UdpSocket,
    greet: UdpSocket,
    /// Greetings for the MH's IPv6 address go out from it (the MSR checks the source).
    greet6: Option<UdpSocket>,
    siblings: Vec<Sibling>,
    /// The MH's other addresses whose own answer moved them in the current move: their
    /// gateways stay where their connections went whatever the main move comes to.
    moved_siblings: Vec<IpAddr>,
    det: Detector,
    macs: std::collections::HashMap<String, String>,
    pending: Option<Pending>,
    /// The MSR that answered our last greeting as holding our connections (attached or
    /// moved): a greeting names it as the previous MSR, whatever the detector last
    /// chose, since a move whose greetings went unanswered moved nothing.
    attached: Option<String>,
    /// The gateway MAC of `attached`, as its answer gave it.
    attached_mac: Option<String>,
    t_start: Instant,
    /// `Lost` was reported and nothing heard of the current MSR since.
    lost: bool,
    /// The interface's carrier (None: solicitation is off).
    link: Option<LinkWatch>,
    solicitor: Solicitor,
    /// Outcomes of registrations, which run on threads of their own.
    registered: (mpsc::Sender<Event>, mpsc::Receiver<Event>),
}

/// How long one phase of a registration may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(3);

impl Agent {
    /// Opens the beacon and greeting sockets, and the link watch if soliciting.
    pub fn new(cfg: AgentConfig) -> io::Result<Agent> {
        let beacons =
            UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], cfg.beacon_port))).map_err(|e| {
                io::Error::new(e.kind(), format!("beacon port {}: {e}", cfg.beacon_port))
            })?;
        let greet = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
        greet.set_broadcast(true)?;
        bind_to_device(&greet, &cfg.interface)?;
        beacons.set_nonblocking(true)?;
        greet.set_nonblocking(true)?;
        let greet6 = match cfg.more_mh.iter().find(|a| a.is_ipv6()) {
            Some(a6) => {
                let s = UdpSocket::bind(SocketAddr::new(*a6, 0)).map_err(|e| {
                    io::Error::new(e.kind(), format!("greeting socket on {a6}: {e}"))
                })?;
                bind_to_device(&s, &cfg.interface)?;
                s.set_nonblocking(true)?;
                Some(s)
            }
            None => None,
        };
        let det = Detector::new(cfg.policy, cfg.beacon_interval, cfg.hysteresis);
        let link = if cfg.solicit {
            Some(LinkWatch::open(&cfg.interface)?)
        } else {
            None
        };
        let solicitor = Solicitor::new(cfg.solicit_repeats, cfg.solicit_spacing);
        Ok(Agent {
            cfg,
            beacons,
            greet,
            greet6,
            siblings: Vec::new(),
            moved_siblings: Vec::new(),
            det,
            macs: Default::default(),
            pending: None,
            attached: None,
            attached_mac: None,
            t_start: Instant::now(),
            lost: false,
            link,
            solicitor,
            registered: mpsc::channel(),
        })
    }

    fn now_ns(&self) -> u64 {
        self.t_start.elapsed().as_nanos() as u64
    }

    /// Runs until `stop` is set, reporting events to `on_event`.
    pub fn run(&mut self, stop: &AtomicBool, mut on_event: impl FnMut(Event)) -> io::Result<()> {
        let mut buf = vec![0u8; 4096];
        while !stop.load(Ordering::Relaxed) {
            let mut wait_ms = match &self.pending {
                Some(p) => p.last_sent.map_or(0, |t| {
                    self.cfg.greet_retry.saturating_sub(t.elapsed()).as_millis() as i32
                }),
                None => 50,
            };
            if let Some(due) = self.solicitor.next_due() {
                let ns = due.saturating_sub(self.now_ns());
                wait_ms = wait_ms.min(ns.div_ceil(1_000_000).min(50) as i32);
            }
            let mut fds = vec![self.beacons.as_fd(), self.greet.as_fd()];
            fds.extend(self.greet6.as_ref().map(|s| s.as_fd()));
            fds.extend(self.link.as_ref().map(|l| l.as_fd()));
            poll_readable(&fds, wait_ms.clamp(0, 50) as u16)?;
            self.watch_link()?;
            self.solicit();
            while let Ok((n, _)) = self.beacons.recv_from(&mut buf) {
                if let Ok(b) = serde_json::from_slice::<Beacon>(&buf[..n]) {
                    self.solicitor.on_beacon();
                    self.macs.insert(b.msr.clone(), b.mac.clone());
                    let now = self.now_ns();
                    if let Some(d) = self.det.on_beacon(now, &b) {
                        self.decide(d, &mut on_event)?;
                    } else if self.lost && self.det.current() == Some(b.msr.as_str()) {
                        self.lost = false;
                        on_event(Event::Regained { msr: b.msr });
                    }
                }
            }
            while let Ok((n, _)) = self.greet.recv_from(&mut buf) {
                if let Ok(r) = serde_json::from_slice::<GreetReply>(&buf[..n]) {
                    self.on_reply(r, &mut on_event)?;
                }
            }
            while let Some(Ok((n, _))) = self.greet6.as_ref().map(|s| s.recv_from(&mut buf)) {
                if let Ok(r) = serde_json::from_slice::<GreetReply>(&buf[..n]) {
                    self.on_reply(r, &mut on_event)?;
                }
            }
            let now = self.now_ns();
            if let Some(d) = self.det.on_tick(now) {
                self.decide(d, &mut on_event)?;
            }
            self.retransmit(&mut on_event)?;
            while let Ok(ev) = self.registered.1.try_recv() {
                on_event(ev);
            }
        }
        Ok(())
    }

    /// Registers the MH's token at `msr`, which the gateway addresses `gateways` point
    /// at now, for the MH's address of each one's family ([`crate::register`]), on
    /// threads so that the loop goes on; the outcomes come back as events.
    fn register_at(&self, msr: &str, gateways: &[IpAddr]) {
        let Some(port) = self.cfg.register_port else {
            return;
        };
        let mhs: Vec<IpAddr> = std::iter::once(self.cfg.mh)
            .chain(self.cfg.more_mh.iter().copied())
            .collect();
        for &gw in gateways {
            let Some(&mh) = mhs.iter().find(|m| m.is_ipv4() == gw.is_ipv4()) else {
                continue;
            };
            let (tx, token, msr) = (self.registered.0.clone(), self.cfg.token, msr.to_string());
            std::thread::spawn(move || {
                let gw = SocketAddr::new(gw, port);
                let ev = match crate::register(mh, gw, token, REGISTER_TIMEOUT) {
                    Ok(()) => Event::Registered { msr, mh },
                    Err(e) => Event::RegisterFailed {
                        msr,
                        mh,
                        error: e.to_string(),
                    },
                };
                let _ = tx.send(ev);
            });
        }
    }

    /// Carrier changes: a link-up starts a burst of solicitations.
    fn watch_link(&mut self) -> io::Result<()> {
        let Some(w) = &mut self.link else {
            return Ok(());
        };
        for ev in w.read()? {
            let now = self.t_start.elapsed().as_nanos() as u64;
            match ev {
                LinkEvent::Up => self.solicitor.link_up(now),
                LinkEvent::Down => {
                    self.solicitor.link_down();
                    self.det.link_lost();
                    // An untagged answer kept aside came from the cell the MH left: it
                    // says nothing of where the MH is now. Leaving the cell also
                    // silences the MSR it is attached to, which would let it act.
                    if let Some(p) = &mut self.pending {
                        p.fallback = None;
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends the solicitation due now, if any (broadcast on the interface).
    fn solicit(&mut self) {
        if let Some(seq) = self.solicitor.poll(self.now_ns()) {
            let dst = SocketAddr::from((Ipv4Addr::BROADCAST, self.cfg.greet_port));
            // A lost one is made up by the next of the burst, or the next beacon.
            let _ = self.greet.send_to(&Solicitation::new(seq).to_bytes(), dst);
        }
    }

    fn greeting(&self, from: Option<&str>, to: &str) -> io::Result<(Vec<u8>, String)> {
        self.greeting_for(self.cfg.mh, from, to)
    }

    fn greeting_for(
        &self,
        mh: IpAddr,
        from: Option<&str>,
        to: &str,
    ) -> io::Result<(Vec<u8>, String)> {
        let prev = from.unwrap_or("");
        let g = Greeting::new(&self.cfg.token.0, mh, prev, to, unix_ms(), nonce()?);
        let nonce = g.nonce.clone();
        let msg = GreetMsg {
            greeting: g,
            // Never sent: the MSR binds the token from the MH's SOCKS session, and a
            // token must not cross the air in clear.
            token: None,
        };
        Ok((
            serde_json::to_vec(&msg).expect("greetings serialize"),
            nonce,
        ))
    }

    fn decide(&mut self, d: Decision, on_event: &mut impl FnMut(Event)) -> io::Result<()> {
        match d {
            Decision::Move { to, .. } => {
                self.lost = false;
                let from = self.attached.clone();
                let mac = self.macs.get(&to).cloned().unwrap_or_default();
                let (msg, nonce) = self.greeting(from.as_deref(), &to)?;
                self.siblings.clear();
                self.moved_siblings.clear();
                for &mh in &self.cfg.more_mh {
                    let (msg, nonce) = self.greeting_for(mh, from.as_deref(), &to)?;
                    self.siblings.push(Sibling {
                        mh,
                        to: to.clone(),
                        msg,
                        nonce,
                        t0: Instant::now(),
                        last_sent: None,
                        fallback: None,
                        dropped: false,
                        holding: false,
                    });
                }
                self.pending = Some(Pending {
                    from: from.unwrap_or_default(),
                    to,
                    mac,
                    msg,
                    nonce,
                    old_nonce: None,
                    sends: 0,
                    refreshed: false,
                    t0: Instant::now(),
                    last_sent: None,
                    holding_ms: None,
                    fallback: None,
                    dropped: false,
                    vouched: false,
                });
                self.retransmit(on_event)
            }
            Decision::Lost { from } => {
                self.lost = true;
                on_event(Event::Lost { from });
                Ok(())
            }
        }
    }

    /// Sends the siblings' greetings that are due; ends those whose main move has
    /// ended with an answer kept aside, and those that timed out.
    fn retransmit_siblings(&mut self, on_event: &mut impl FnMut(Event)) -> io::Result<()> {
        let (retry, timeout) = (self.cfg.greet_retry, self.cfg.greet_timeout);
        let main_done = self.pending.is_none();
        let mut i = 0;
        while i < self.siblings.len() {
            let sib = &self.siblings[i];
            if (main_done && sib.fallback.is_some()) || sib.t0.elapsed() > timeout {
                let sib = self.siblings.remove(i);
                let mh = sib.mh;
                on_event(sib.outcome());
                self.follow_main(mh)?;
            } else {
                i += 1;
            }
        }
        let ifindex = ifindex(&self.cfg.interface);
        for sib in &mut self.siblings {
            if sib.last_sent.is_some_and(|t| t.elapsed() < retry) {
                continue;
            }
            // A lost send is retried at the next interval.
            let _ = match (sib.mh, &self.greet6) {
                (IpAddr::V6(_), Some(s6)) => {
                    let all = std::net::SocketAddrV6::new(
                        std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
                        self.cfg.greet_port,
                        0,
                        ifindex,
                    );
                    s6.send_to(&sib.msg, all)
                }
                _ => {
                    let dst = SocketAddr::from((Ipv4Addr::BROADCAST, self.cfg.greet_port));
                    self.greet.send_to(&sib.msg, dst)
                }
            };
            sib.last_sent = Some(Instant::now());
        }
        Ok(())
    }

    fn retransmit(&mut self, on_event: &mut impl FnMut(Event)) -> io::Result<()> {
        self.retransmit_siblings(on_event)?;
        let Some(p) = &mut self.pending else {
            return Ok(());
        };
        // An untagged answer acts once the MSR we are attached to is silent: it crashed
        // (and its token with it), so the new MSR could not tag. Not while a tagged
        // `holding` says a genuine MSR is at work, and not before a tagged answer had
        // its chance (a station could answer first).
        // And only from an MSR still heard: one out of range cannot be the MH's gateway.
        let now = self.t_start.elapsed().as_nanos() as u64;
        let silent = self
            .attached
            .as_deref()
            .is_none_or(|a| !self.det.alive(a, now));
        let ripe = p
            .fallback
            .as_ref()
            .is_some_and(|(r, at)| at.elapsed() >= FALLBACK_GRACE && self.det.alive(&r.msr, now));
        if ripe && silent && p.holding_ms.is_none() {
            let (r, _) = p.fallback.take().unwrap();
            return self.act(r, on_event);
        }
        if p.t0.elapsed() > self.cfg.greet_timeout {
            let p = self.pending.take().unwrap();
            // Nobody answered: nothing moved, and the next move starts from where the
            // connections are.
            let mac = p.mac.clone();
            self.after_failure(&p, &mac)?;
            on_event(Event::MoveFailed {
                from: p.from,
                to: p.to,
                reason: "no answer from the new MSR".into(),
            });
            return Ok(());
        }
        if p.last_sent
            .is_none_or(|t| t.elapsed() >= self.cfg.greet_retry)
        {
            let dst = SocketAddr::from((Ipv4Addr::BROADCAST, self.cfg.greet_port));
            // A lost send is retried at the next interval.
            let _ = self.greet.send_to(&p.msg, dst);
            p.last_sent = Some(Instant::now());
            p.sends += 1;
        }
        Ok(())
    }

    fn on_reply(&mut self, r: GreetReply, on_event: &mut impl FnMut(Event)) -> io::Result<()> {
        // A sibling's answer: only a genuine final one ends it (holding means: wait).
        if let Some(i) = self
            .siblings
            .iter()
            .position(|s| s.nonce == r.nonce && s.msr_is(&r.msr))
        {
            let attached = self.attached.is_some();
            let mac = || {
                let beacon = self.macs.get(&r.msr).map_or("", String::as_str);
                answers::gateway_mac(&r, beacon)
            };
            match answers::judge_sibling(&r, &self.cfg.token.0, attached) {
                SiblingVerdict::Wait => {
                    let (mh, mac) = (self.siblings[i].mh, mac());
                    if !std::mem::replace(&mut self.siblings[i].holding, true) && !mac.is_empty() {
                        self.point_gateways(mh, &mac)?;
                    }
                }
                SiblingVerdict::Final => {
                    let mac = mac();
                    let mut sib = self.siblings.remove(i);
                    let genuine = answers::vouches(&r, &self.cfg.token.0);
                    let msr = r.msr.clone();
                    let status = r.status;
                    let mh = sib.mh;
                    sib.fallback = Some(r);
                    on_event(sib.outcome());
                    match status {
                        GreetStatus::Moved | GreetStatus::Attached if !mac.is_empty() => {
                            let gws = self.point_gateways(mh, &mac)?;
                            self.moved_siblings.push(mh);
                            if status == GreetStatus::Attached {
                                self.register_at(&msr, &gws);
                            }
                        }
                        _ => self.follow_main(mh)?,
                    }
                    if genuine {
                        return self.vouch(&msr, on_event);
                    }
                }
                SiblingVerdict::Fallback => {
                    self.siblings[i].fallback.get_or_insert(r);
                }
                SiblingVerdict::Drop(reason) => {
                    let sib = &mut self.siblings[i];
                    if !std::mem::replace(&mut sib.dropped, true) {
                        on_event(Event::AnswerDropped {
                            msr: r.msr,
                            reason: reason.into(),
                        });
                    }
                }
            }
            return Ok(());
        }
        let Some(p) = &mut self.pending else {
            return Ok(());
        };
        let current = r.nonce == p.nonce;
        let replaced = p.old_nonce.as_deref() == Some(r.nonce.as_str());
        if !(current || replaced) || r.msr != p.to {
            return Ok(());
        }
        if replaced && matches!(r.status, GreetStatus::Refused | GreetStatus::Failed) {
            return Ok(());
        }
        if current && answers::greet_afresh(&r, p.sends, p.refreshed) {
            let from = (!p.from.is_empty()).then(|| p.from.clone());
            let (to, reason) = (p.to.clone(), r.reason.unwrap_or_default());
            let (msg, nonce) = self.greeting(from.as_deref(), &to)?;
            let p = self.pending.as_mut().expect("pending");
            p.old_nonce = Some(std::mem::replace(&mut p.nonce, nonce));
            p.msg = msg;
            p.sends = 0;
            p.refreshed = true;
            p.last_sent = None;
            on_event(Event::GreetedAfresh { msr: to, reason });
            return self.retransmit(on_event);
        }
        let attached = self.attached.is_some();
        match answers::judge_vouched(&r, &self.cfg.token.0, attached, p.vouched) {
            Verdict::Act => self.act(r, on_event),
            Verdict::Fallback => {
                p.fallback.get_or_insert((r, Instant::now()));
                Ok(())
            }
            Verdict::Drop(reason) => {
                if !p.dropped {
                    p.dropped = true;
                    on_event(Event::AnswerDropped {
                        msr: r.msr,
                        reason: reason.into(),
                    });
                }
                Ok(())
            }
        }
    }

    /// `msr` moved (or holds) the connections of another of the MH's addresses, and
    /// proved it with a tag. The main address may have nothing there, and so no MSR
    /// that could tag its answers (its token is bound under the other family's
    /// address): its untagged `attached` from `msr` would wait for the MSR it left to
    /// fall silent, and the main family's gateway would stay pointed there, its new
    /// connections waiting seconds. So that answer is taken now (or as it comes).
    fn vouch(&mut self, msr: &str, on_event: &mut impl FnMut(Event)) -> io::Result<()> {
        let Some(p) = self.pending.as_mut().filter(|p| p.to == msr) else {
            return Ok(());
        };
        p.vouched = true;
        match p.fallback.take() {
            Some((r, _)) if r.msr == msr && r.status == GreetStatus::Attached => {
                self.act(r, on_event)
            }
            other => {
                p.fallback = other;
                Ok(())
            }
        }
    }

    /// Points the gateway after the move `p` failed ([`answers::after_failure`]): back
    /// to the previous MSR while its cell is in reach (at the MAC it answered with; a
    /// beacon naming it could be anyone's), else at the new one (`new_mac`). The next
    /// greeting still names the previous MSR, which holds the connections.
    fn after_failure(&mut self, p: &Pending, new_mac: &str) -> io::Result<()> {
        let now = self.now_ns();
        let heard = |m: &str| !m.is_empty() && self.det.alive(m, now);
        match answers::after_failure(heard(&p.from), heard(&p.to)) {
            AfterFailure::Back => {
                let back = match &self.attached_mac {
                    Some(m) if self.attached.as_deref() == Some(p.from.as_str()) => Some(m),
                    _ => self.macs.get(&p.from),
                };
                if let Some(mac) = back.cloned() {
                    self.point_gateways(self.cfg.mh, &mac)?;
                    self.det.set_current(&p.from);
                }
            }
            AfterFailure::Here if !new_mac.is_empty() => {
                self.point_gateways(self.cfg.mh, new_mac)?;
                self.attached_mac = None;
                self.det.set_current(&p.to);
            }
            AfterFailure::Here | AfterFailure::Keep => {
                if let Some(a) = &self.attached {
                    self.det.set_current(a);
                }
            }
        }
        Ok(())
    }

    /// Points at `mac` the gateway addresses that an answer for the MH's address `mh`
    /// moves ([`answers::gateways_to_point`]), and returns them.
    fn point_gateways(&self, mh: IpAddr, mac: &str) -> io::Result<Vec<IpAddr>> {
        let all: Vec<IpAddr> = std::iter::once(self.cfg.gateway)
            .chain(self.cfg.more_gateways.iter().copied())
            .collect();
        let own_answer: Vec<IpAddr> = self
            .siblings
            .iter()
            .map(|s| s.mh)
            .chain(self.moved_siblings.iter().copied())
            .collect();
        let main = mh == self.cfg.mh;
        let gws = answers::gateways_to_point(&all, mh, main, &own_answer);
        for &gw in &gws {
            point_gateway(gw, mac, &self.cfg.interface)?;
        }
        Ok(gws)
    }

    /// Points the gateway of a sibling's family where the main move left the MH's
    /// gateway, once both are over: its own answer did not move it (a failure, a
    /// refusal, no answer, or one kept aside).
    fn follow_main(&self, sib: IpAddr) -> io::Result<()> {
        match (&self.pending, &self.attached_mac) {
            (None, Some(mac)) => self.point_gateways(sib, mac).map(drop),
            _ => Ok(()),
        }
    }

    /// Acts on answer `r` to the pending greeting.
    fn act(&mut self, r: GreetReply, on_event: &mut impl FnMut(Event)) -> io::Result<()> {
        let Some(p) = &mut self.pending else {
            return Ok(());
        };
        let mac = answers::gateway_mac(&r, &p.mac);
        match r.status {
            GreetStatus::Holding => {
                if p.holding_ms.is_none() {
                    p.holding_ms = Some(ms_since(p.t0));
                    self.point_gateways(self.cfg.mh, &mac)?;
                }
            }
            GreetStatus::Attached => {
                let gws = self.point_gateways(self.cfg.mh, &mac)?;
                let p = self.pending.take().unwrap();
                self.register_at(&p.to, &gws);
                self.attached = Some(p.to.clone());
                self.attached_mac = Some(mac);
                on_event(Event::Attached {
                    msr: p.to,
                    connections: r.connections,
                });
            }
            GreetStatus::Moved => {
                if p.holding_ms.is_none() {
                    self.point_gateways(self.cfg.mh, &mac)?;
                }
                // No registration: the MH's token came with its connections.
                let p = self.pending.take().unwrap();
                self.attached = Some(p.to.clone());
                self.attached_mac = Some(mac);
                on_event(Event::Moved {
                    holding_ms: p.holding_ms.unwrap_or(0.0),
                    moved_ms: ms_since(p.t0),
                    from: p.from,
                    to: p.to,
                    connections: r.connections,
                });
            }
            GreetStatus::Failed => {
                let p = self.pending.take().unwrap();
                self.after_failure(&p, &mac)?;
                on_event(Event::MoveFailed {
                    from: p.from,
                    to: p.to,
                    reason: r.reason.unwrap_or_default(),
                });
            }
            GreetStatus::Refused => {
                let reason = r.reason.unwrap_or_default();
                on_event(Event::Refused {
                    msr: p.to.clone(),
                    reason,
                });
                // An MSR that does not know the previous one cannot fetch anything:
                // attach to it afresh (the connections are lost either way).
                if !p.from.is_empty() {
                    let to = p.to.clone();
                    let (msg, nonce) = self.greeting(None, &to)?;
                    let p = self.pending.as_mut().unwrap();
                    p.from.clear();
                    p.msg = msg;
                    p.nonce = nonce;
                    p.sends = 0;
                    p.last_sent = None;
                } else {
                    self.pending = None;
                }
            }
        }
        Ok(())
    }
}

impl Sibling {
    fn msr_is(&self, msr: &str) -> bool {
        self.to == msr
    }

    /// The event that ends it: its final answer (or the one kept aside), or none.
    fn outcome(self) -> Event {
        let (status, connections, reason) = match self.fallback {
            Some(r) => (
                serde_json::to_value(r.status)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                r.connections,
                r.reason.unwrap_or_default(),
            ),
            None => ("unanswered".into(), 0, String::new()),
        };
        Event::OtherAddress {
            mh: self.mh,
            msr: self.to,
            status,
            connections,
            reason,
        }
    }
}

/// The interface's index (0 if unknown: the kernel then picks one).
fn ifindex(ifname: &str) -> u32 {
    nix::net::if_::if_nametoindex(ifname).unwrap_or(0)
}

fn bind_to_device(s: &UdpSocket, ifname: &str) -> io::Result<()> {
    socket2::SockRef::from(s)
        .bind_device(Some(ifname.as_bytes()))
        .map_err(|e| io::Error::new(e.kind(), format!("bind to {ifname}: {e}")))
}

/// Waits until one of `fds` is readable or `timeout_ms` passes.
fn poll_readable(fds: &[BorrowedFd<'_>], timeout_ms: u16) -> io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags};
    let mut fds: Vec<PollFd> = fds
        .iter()
        .map(|&fd| PollFd::new(fd, PollFlags::POLLIN))
        .collect();
    match poll(&mut fds, timeout_ms) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
