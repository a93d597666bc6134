//! The simulated world: MSRs with their sockets and per-MH records, the channels
//! between them, the event queue and the simulated clock. The drivers ([`super::new_msr`],
//! [`super::old_msr`]) and the MH ([`super::mh`]) act on it; [`super::check`] judges it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;

use itcp_handoff::log::Outcome;
use itcp_handoff::machine::{NewSide, OldSide, Timeouts};
use itcp_proto::channel::{ConnImage, Message};
use itcp_proto::greeting::Greeting;

use super::mh::{Agent, Status};
use super::rng::Rng;
use super::scenario::{Scenario, Script};
use super::Mutation;

pub type Conn = u64;
pub const MS: u64 = 1000;
pub const TOKEN: &[u8] = b"the MH's token..";

pub fn mh_addr() -> IpAddr {
    IpAddr::from([10, 2, 0, 100])
}

/// One copy of a connection at one MSR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sock {
    /// Relaying: the connection is served here.
    Running,
    /// Frozen for the old-side handoff `olds[i]`: recoverable by its unfreeze.
    Frozen(usize),
    /// Restored in repair mode by the new-side handoff `news[i]`, not started.
    Restored(usize),
}

/// What this MSR's msrd knows of the MH (lost with a crash).
#[derive(Debug, Clone, Default)]
pub struct MhRecord {
    pub token: bool,
    pub last_greeting_ts: u64,
    pub last_nonce: Option<String>,
    pub last_reply: Option<Status>,
    pub moved_to: Option<String>,
    pub came_from: Option<String>,
    pub pulling: bool,
}

#[derive(Debug)]
pub struct Msr {
    pub name: String,
    pub up: bool,
    pub socks: BTreeMap<Conn, Sock>,
    pub rec: MhRecord,
    /// The old-side handoff serving a request for the MH now (one at a time).
    pub turn: Option<usize>,
    pub waiting: VecDeque<usize>,
    pub next_id: u64,
}

/// How a connection ended, if it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    Live,
    /// Reset towards both ends (its MSR crashed while it ran).
    Reset,
    /// Closed gracefully (finished while frozen).
    Ended,
}

#[derive(Debug, Clone)]
pub struct Truth {
    pub fate: Fate,
    /// Its only recoverable copy was frozen at an MSR that crashed: gone with it unless
    /// its images restart elsewhere (a crash may break connections; nothing else may).
    pub orphaned: bool,
    /// The channels whose new MSR restarted it.
    pub started: BTreeSet<usize>,
    /// Those of them whose new MSR had heard the channel fail before the restart.
    pub started_after_loss: BTreeSet<usize>,
    /// The channels whose old MSR unfroze it without the new MSR's word.
    pub unfrozen_blind: BTreeSet<usize>,
}

/// The receiving end of a channel message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    New = 0,
    Old = 1,
}

impl End {
    pub fn other(self) -> End {
        match self {
            End::New => End::Old,
            End::Old => End::New,
        }
    }
}

/// One MSR⇄MSR channel (a TCP connection): in order per direction, broken for good
/// by a lost message, closed by either end.
#[derive(Debug)]
pub struct Chan {
    pub new_msr: usize,
    pub old_msr: usize,
    pub new_drv: usize,
    pub old_drv: Option<usize>,
    pub cut: bool,
    pub closed: [bool; 2],
    /// Time of the last delivery scheduled towards each end (TCP keeps order).
    pub fifo: [u64; 2],
    /// The channel's failure reached the new MSR's end (read or not).
    pub new_heard_loss: bool,
}

#[derive(Debug)]
pub enum Inbox {
    Msg(Message),
    Lost,
}

/// Local work a driver awaits (capture, restore, restart).
#[derive(Debug)]
pub enum Work {
    Capture,
    Restore(Vec<ConnImage>),
    Restart(Vec<u64>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    Active,
    /// Done and acknowledged: the channel stays open to answer a late call-off.
    Answering {
        until: u64,
    },
    Finished,
}

/// A new-side handoff as `proxy/src/handoff/new_side.rs::run` drives it.
#[derive(Debug)]
pub struct NewDrv {
    pub msr: usize,
    pub m: NewSide,
    pub chan: Option<usize>,
    pub peer: usize,
    /// The MH greeted this MSR and is answered (not for `also_at` pulls).
    pub greeter: Option<Greeting>,
    pub busy: Option<Work>,
    pub rest: VecDeque<crate::sim::Action>,
    pub inbox: VecDeque<Inbox>,
    pub next: Option<itcp_handoff::machine::NewEvent>,
    pub lost: Option<String>,
    pub down: Option<String>,
    pub astray: bool,
    /// Restored ahead: (connection, restored).
    pub ahead: Vec<(Conn, bool)>,
    pub accepted: bool,
    pub moved_any: bool,
    pub life: Life,
}

/// An old-side handoff as `proxy/src/handoff/old_side.rs::old_side` drives it.
#[derive(Debug)]
pub struct OldDrv {
    pub msr: usize,
    pub m: Option<OldSide>,
    pub chan: usize,
    pub from: usize,
    pub request: Message,
    pub busy: Option<Work>,
    pub rest: VecDeque<crate::sim::Action>,
    pub inbox: VecDeque<Inbox>,
    pub next: Option<itcp_handoff::machine::OldEvent>,
    /// The MH's connections running here when the request was served.
    pub snapshot: BTreeSet<Conn>,
    /// Frozen here by this handoff, still to delete or unfreeze.
    pub frozen: BTreeSet<Conn>,
    pub sent_ahead: BTreeSet<Conn>,
    pub outcome: Option<Outcome>,
    /// How the machine reached its last event: a channel loss or a timeout.
    pub blind: bool,
    pub finished: bool,
}

#[derive(Debug)]
pub enum Ev {
    Deliver { chan: usize, to: End, msg: Message },
    Lost { chan: usize, to: End },
    NewWork { drv: usize },
    OldWork { drv: usize },
    Greeting { msr: usize, g: Greeting },
    Answer { from: usize, status: Status },
    Regreet { nonce: String },
    Retry { to: usize },
    Script(Script),
}

pub struct World {
    pub now: u64,
    pub rng: Rng,
    pub sc: Scenario,
    pub mutation: Mutation,
    pub timeouts: Timeouts,
    pub msrs: Vec<Msr>,
    pub conns: BTreeMap<Conn, Truth>,
    pub chans: Vec<Chan>,
    pub news: Vec<NewDrv>,
    pub olds: Vec<OldDrv>,
    pub mh: Agent,
    queue: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    pub trace: Option<Vec<String>>,
    pub violation: Option<String>,
    /// Connections run twice after a failed channel (accepted by design): the
    /// acknowledgement lost after the restart, and restarts after the new MSR had
    /// heard of the failure.
    pub hazards: [u32; 2],
    pub steps: u64,
    /// What happened, by kind: the paths the scenarios reached (`ITCP_SIM_VERBOSE`).
    pub seen: BTreeMap<String, u64>,
}

impl World {
    pub fn new(seed: u64, mutation: Mutation, trace: bool) -> World {
        let sc = super::scenario::generate(seed);
        let msrs = (0..sc.msrs)
            .map(|i| Msr {
                name: format!("msr{}", i + 1),
                up: true,
                socks: BTreeMap::new(),
                rec: MhRecord::default(),
                turn: None,
                waiting: VecDeque::new(),
                next_id: 1,
            })
            .collect();
        let mut w = World {
            now: 0,
            rng: Rng::new(seed),
            mutation,
            timeouts: Timeouts::default(),
            msrs,
            conns: BTreeMap::new(),
            chans: Vec::new(),
            news: Vec::new(),
            olds: Vec::new(),
            mh: Agent::new(),
            queue: BTreeMap::new(),
            seq: 0,
            trace: trace.then(Vec::new),
            violation: None,
            hazards: [0; 2],
            seen: BTreeMap::new(),
            steps: 0,
            sc,
        };
        w.trace_line(format!("scenario {:?}", w.sc));
        for _ in 0..w.sc.conns {
            w.open_at(0);
        }
        for (t, s) in w.sc.script.clone() {
            w.at(t, Ev::Script(s));
        }
        w
    }

    pub fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((t, self.seq), ev);
    }

    pub fn after(&mut self, d: u64, ev: Ev) {
        self.at(self.now + d, ev);
    }

    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    pub fn trace_line(&mut self, s: String) {
        let now = self.now;
        if let Some(t) = self.trace.as_mut() {
            t.push(format!("{:>10.3} ms  {s}", now as f64 / 1000.0));
        }
    }

    pub fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.trace_line(format!("VIOLATION: {what}"));
            self.violation = Some(what);
        }
    }

    pub fn saw(&mut self, what: String) {
        *self.seen.entry(what).or_default() += 1;
    }

    pub fn msr_index(&self, name: &str) -> Option<usize> {
        self.msrs.iter().position(|m| m.name == name)
    }

    /// A connection of the MH opened through `msr` (its token bound there).
    pub fn open_at(&mut self, msr: usize) {
        let id = self.conns.len() as u64 + 1;
        self.conns.insert(
            id,
            Truth {
                fate: Fate::Live,
                orphaned: false,
                started: BTreeSet::new(),
                started_after_loss: BTreeSet::new(),
                unfrozen_blind: BTreeSet::new(),
            },
        );
        self.msrs[msr].socks.insert(id, Sock::Running);
        self.msrs[msr].rec.token = true;
        let name = self.msrs[msr].name.clone();
        self.trace_line(format!("MH opens connection {id} at {name}"));
    }

    /// Runs the scenario to quiescence, checking after every step.
    pub fn run(&mut self) {
        const MAX_STEPS: u64 = 20_000;
        while self.violation.is_none() {
            if self.steps >= MAX_STEPS {
                self.violate(format!("no quiescence after {MAX_STEPS} steps"));
                break;
            }
            self.steps += 1;
            if !self.step() {
                break;
            }
            super::check::after_step(self);
        }
        if self.violation.is_none() {
            super::check::at_rest(self);
        }
    }

    /// One step: the next event or the earliest deadline, whichever comes first
    /// (an event due at a deadline goes first, as a ready channel read would).
    fn step(&mut self) -> bool {
        let ev_at = self.queue.first_key_value().map(|(k, _)| k.0);
        let timer = self.earliest_timer();
        match (ev_at, timer) {
            (None, None) => false,
            (Some(e), Some((t, who))) if t < e => self.fire(t, who),
            (Some(_), _) => {
                let ((t, _), ev) = self.queue.pop_first().expect("an event");
                self.now = t;
                self.handle(ev);
                true
            }
            (None, Some((t, who))) => self.fire(t, who),
        }
    }

    fn fire(&mut self, t: u64, who: Timer) -> bool {
        self.now = self.now.max(t);
        match who {
            Timer::New(i) => super::new_msr::timeout(self, i),
            Timer::Old(i) => super::old_msr::timeout(self, i),
        }
        true
    }

    /// The earliest deadline of the machines waiting on their peer (the driver's
    /// answerer of a late call-off included).
    fn earliest_timer(&self) -> Option<(u64, Timer)> {
        let news = self.news.iter().enumerate().filter_map(|(i, d)| {
            let t = match d.life {
                Life::Answering { until } => Some(until),
                Life::Active if d.busy.is_none() => d.m.poll_timeout(),
                _ => None,
            };
            t.map(|t| (t, Timer::New(i)))
        });
        let olds = self.olds.iter().enumerate().filter_map(|(i, d)| {
            let m = d.m.as_ref().filter(|_| !d.finished && d.busy.is_none())?;
            m.poll_timeout().map(|t| (t, Timer::Old(i)))
        });
        news.chain(olds).min_by_key(|(t, _)| *t)
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { chan, to, msg } => self.deliver(chan, to, Inbox::Msg(msg)),
            Ev::Lost { chan, to } => self.deliver(chan, to, Inbox::Lost),
            Ev::NewWork { drv } => super::new_msr::work_done(self, drv),
            Ev::OldWork { drv } => super::old_msr::work_done(self, drv),
            Ev::Greeting { msr, g } => super::mh::greeting_at(self, msr, g),
            Ev::Answer { from, status } => super::mh::answer(self, from, status),
            Ev::Regreet { nonce } => super::mh::regreet(self, &nonce),
            Ev::Retry { to } => super::mh::retry(self, to),
            Ev::Script(s) => self.script(s),
        }
    }

    fn script(&mut self, s: Script) {
        match s {
            Script::Cells(cells) => super::mh::cells(self, cells),
            Script::Crash(m) => self.crash(m),
            Script::Restart(m) => self.restart(m),
            Script::Open => super::mh::open(self),
            Script::Replay => super::mh::replay(self),
            Script::Forge(m) => super::mh::forge(self, m),
        }
    }

    // ---- the channel ----------------------------------------------------------

    pub fn open_chan(&mut self, new_msr: usize, old_msr: usize, new_drv: usize) -> usize {
        self.chans.push(Chan {
            new_msr,
            old_msr,
            new_drv,
            old_drv: None,
            cut: false,
            closed: [false; 2],
            fifo: [0; 2],
            new_heard_loss: false,
        });
        self.chans.len() - 1
    }

    fn msg_delay(&mut self) -> u64 {
        if self.rng.chance(self.sc.faults.slow_msg) {
            self.rng.range(100 * MS, 7000 * MS)
        } else {
            self.rng.range(50, 3 * MS)
        }
    }

    /// Sends on the channel: in order, possibly late, twice, or lost (which breaks
    /// the stream there, as a TCP connection breaks).
    pub fn send(&mut self, chan: usize, to: End, msg: Message) {
        let c = &self.chans[chan];
        if c.cut || c.closed[to.other() as usize] || c.closed[to as usize] {
            let line = format!(
                "  (not delivered: channel {chan} closed or cut) {}",
                brief(&msg)
            );
            self.trace_line(line);
            return;
        }
        if self.rng.chance(self.sc.faults.msg_loss) {
            self.trace_line(format!("  channel {chan} cut: {} lost", brief(&msg)));
            return self.cut(chan);
        }
        let copies = if self.rng.chance(self.sc.faults.dup) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let t = (self.now + self.msg_delay()).max(self.chans[chan].fifo[to as usize]);
            self.chans[chan].fifo[to as usize] = t;
            self.at(
                t,
                Ev::Deliver {
                    chan,
                    to,
                    msg: msg.clone(),
                },
            );
        }
    }

    /// The stream breaks: each end hears of it after a while (a reset, a keepalive),
    /// or never (a partition: its timers end its wait).
    fn cut(&mut self, chan: usize) {
        self.chans[chan].cut = true;
        for to in [End::New, End::Old] {
            if !self.rng.chance(self.sc.faults.silent_cut) {
                let d = self.rng.range(MS, 500 * MS);
                self.after(d, Ev::Lost { chan, to });
            }
        }
    }

    /// This end closes (its handoff ended, or its msrd died): the other end reads
    /// the end of the stream after what was sent before.
    pub fn close_end(&mut self, chan: usize, end: End) {
        let c = &mut self.chans[chan];
        if c.closed[end as usize] {
            return;
        }
        c.closed[end as usize] = true;
        let to = end.other();
        if c.cut || c.closed[to as usize] {
            return;
        }
        let t = (self.now + 100).max(c.fifo[to as usize]);
        c.fifo[to as usize] = t;
        self.at(t, Ev::Lost { chan, to });
    }

    fn deliver(&mut self, chan: usize, to: End, item: Inbox) {
        if to == End::New && matches!(item, Inbox::Lost) {
            self.chans[chan].new_heard_loss = true;
        }
        if self.chans[chan].closed[to as usize] {
            return;
        }
        match to {
            End::New => super::new_msr::receive(self, self.chans[chan].new_drv, item),
            End::Old => match (self.chans[chan].old_drv, item) {
                (Some(j), item) => super::old_msr::receive(self, j, item),
                (None, Inbox::Msg(m)) => super::old_msr::request(self, chan, m),
                (None, Inbox::Lost) => self.chans[chan].closed[to as usize] = true,
            },
        }
    }

    // ---- crashes ----------------------------------------------------------------

    /// msrd dies: the kernel resets its running connections, closes its repair-mode
    /// copies silently, and resets its channels; its memory is gone.
    pub fn crash(&mut self, m: usize) {
        if !self.msrs[m].up {
            return;
        }
        let name = self.msrs[m].name.clone();
        self.trace_line(format!("CRASH {name}"));
        self.saw("crash".into());
        let socks = std::mem::take(&mut self.msrs[m].socks);
        for (c, s) in socks {
            match s {
                Sock::Running => self.conns.get_mut(&c).expect("known").fate = Fate::Reset,
                Sock::Frozen(_) if !self.running_anywhere(c) => {
                    self.conns.get_mut(&c).expect("known").orphaned = true
                }
                _ => {}
            }
        }
        let msr = &mut self.msrs[m];
        msr.up = false;
        msr.rec = MhRecord::default();
        msr.turn = None;
        msr.waiting.clear();
        self.kill_drivers(m);
        self.mh.msr_crashed(m);
    }

    fn kill_drivers(&mut self, m: usize) {
        for i in 0..self.news.len() {
            if self.news[i].msr == m && self.news[i].life != Life::Finished {
                self.news[i].life = Life::Finished;
                self.news[i].busy = None;
                if let Some(c) = self.news[i].chan {
                    self.close_end(c, End::New);
                }
            }
        }
        for j in 0..self.olds.len() {
            if self.olds[j].msr == m && !self.olds[j].finished {
                self.olds[j].finished = true;
                self.olds[j].busy = None;
                let c = self.olds[j].chan;
                self.close_end(c, End::Old);
            }
        }
        // Requests not read yet die with the listener's backlog.
        for c in 0..self.chans.len() {
            if self.chans[c].old_msr == m && self.chans[c].old_drv.is_none() {
                self.close_end(c, End::Old);
            }
        }
    }

    pub fn restart(&mut self, m: usize) {
        if !self.msrs[m].up {
            self.msrs[m].up = true;
            let name = self.msrs[m].name.clone();
            self.trace_line(format!("RESTART {name}"));
        }
    }

    pub fn running_anywhere(&self, c: Conn) -> bool {
        self.msrs
            .iter()
            .any(|m| m.socks.get(&c) == Some(&Sock::Running))
    }

    /// How long local socket work takes: usually a few ms, sometimes seconds.
    pub fn work_delay(&mut self) -> u64 {
        if self.rng.chance(self.sc.faults.slow_work) {
            self.rng.range(500 * MS, 6000 * MS)
        } else {
            self.rng.range(50, 5 * MS)
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Timer {
    New(usize),
    Old(usize),
}

/// A message in a trace: images by connection id only.
pub fn brief(m: &Message) -> String {
    let ids = |v: &[ConnImage]| v.iter().map(|i| i.id).collect::<Vec<_>>();
    match m {
        Message::HandoffRequest {
            handoff_id,
            greeting,
            ..
        } => format!(
            "HandoffRequest#{handoff_id}({}→{}, ts {})",
            greeting.prev_msr, greeting.new_msr, greeting.ts_ms
        ),
        Message::Images {
            handoff_id, images, ..
        } => format!("Images#{handoff_id}{:?}", ids(images)),
        Message::ImagesPart { handoff_id, images } => {
            format!("ImagesPart#{handoff_id}{:?}", ids(images))
        }
        Message::Accepted {
            handoff_id,
            also_at,
            ..
        } => format!("Accepted#{handoff_id}(also_at {also_at:?})"),
        other => format!("{other:?}"),
    }
}

/// An action in a trace, as briefly.
pub fn brief_action(a: &crate::sim::Action) -> String {
    use crate::sim::Action as A;
    match a {
        A::Send(m) => format!("Send {}", brief(m)),
        A::Restore(v) | A::RestoreAhead(v) => {
            let ids: Vec<_> = v.iter().map(|i| i.id).collect();
            let what = if matches!(a, A::Restore(_)) {
                "Restore"
            } else {
                "RestoreAhead"
            };
            format!("{what}{ids:?}")
        }
        A::Discard(v) | A::Delete(v) => {
            let mut ids = v.clone();
            ids.sort();
            let what = if matches!(a, A::Discard(_)) {
                "Discard"
            } else {
                "Delete"
            };
            format!("{what}{ids:?}")
        }
        A::Log(r) => format!("Log {:?} {:?}", r.outcome, r.reason),
        other => format!("{other:?}"),
    }
}
