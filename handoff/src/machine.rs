//! The handoff between two MSRs as plain state machines (paper §5.4, steps 2–10), with
//! no sockets, clocks or syscalls (quinn-proto style): the daemon feeds events in with
//! the current time, carries the actions out (hold the MH's flows, freeze and capture
//! sockets, send a message, restore, restart, reroute, delete, roll back) and reports
//! their results back as events. [`NewSide::poll_timeout`] / [`OldSide::poll_timeout`]
//! give the next absolute deadline; the daemon calls `handle_timeout` once it passes.
//! Tests drive both sides against each other.
//!
//! New MSR: greeting → ask the old MSR → `Accepted` (the proof verified) → hold the
//! MH's flows → images → restore → reroute, release, restart → acknowledge the
//! connections that really resumed.
//! Old MSR: request (proof checked against the MH's session token, greeting not used
//! before) → `Accepted`, freeze and capture → images → acknowledgement → delete the
//! resumed copies silently, keep (unfreeze) the ones that did not resume. Once the
//! images are out, only the new MSR knows which connections run there: without an
//! acknowledgement in time the old MSR calls the handoff off (`Abort`) and waits for
//! the new MSR's final word — an acknowledgement of what it restarted before it heard,
//! or of nothing if it had not restarted yet — so a late acknowledgement never leaves
//! a connection running at both MSRs. Only a new MSR that stays silent, or a channel
//! that fails, leaves the old MSR to unfreeze and serve on. No connection is lost
//! because a handoff failed, and none is deleted that did not resume at the new MSR.
//!
//! Nothing an unauthenticated greeting says makes the new MSR hold anything: the hold
//! goes up only once the old MSR (which holds the MH's token) has accepted the proof.

use std::net::IpAddr;

use itcp_proto::channel::{ConnImage, Message};
use itcp_proto::greeting::Greeting;

use crate::log::{Outcome, Phases, Record, Role};

/// What the daemon must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Hold (queue or drop, never answer) every packet of this MH's I-TCP flows until
    /// released; tell the MH it may send through us.
    Hold(IpAddr),
    /// Tell the greeting MH it is attached here with nothing to move (the previous MSR
    /// holds nothing of it). Nothing else changes: the greeting is unproven here.
    Attached,
    Release(IpAddr),
    /// A proven greeting was used: later greetings of this MH must be newer.
    GreetingUsed {
        mh: IpAddr,
        ts_ms: u64,
    },
    /// Block the MH's flows at the netfilter level, then capture every socket of its
    /// connections (the daemon answers with [`OldEvent::Captured`] or
    /// [`OldEvent::CaptureFailed`]).
    FreezeAndCapture(IpAddr),
    /// Complete the MH's TCP handshakes half-open here before the freeze: a request
    /// socket in SYN_RECV cannot be captured. With `wait_for_ack`, first wait
    /// (bounded) for the MH's own ACK: until a greeting MH hears `accepted` it still
    /// sends through us. Then, or at once, replay the ACK the MH sent for the ones
    /// still half-open (a detected MH sends through the new MSR already, so its ACK
    /// never comes here), so that every one of them moves.
    CompleteHandshakes {
        mh: IpAddr,
        wait_for_ack: bool,
    },
    /// Leave repair mode and unblock every connection of this MH still frozen here:
    /// the old MSR keeps serving them.
    Unfreeze(IpAddr),
    /// Close these frozen copies while still in repair mode (no FIN, no RST).
    Delete(Vec<u64>),
    /// Restore these connections in repair mode (the daemon answers with
    /// [`NewEvent::Restored`], for these and those of every [`Action::RestoreAhead`]).
    Restore(Vec<ConnImage>),
    /// Restore these connections in repair mode now, as their part of the images came
    /// (`ImagesPart`), while the old MSR captures the rest: no answer; the results
    /// come with those of the final [`Action::Restore`].
    RestoreAhead(Vec<ConnImage>),
    /// Close these restored connections without a packet, still in repair mode: the
    /// old MSR called the handoff off before their restart and keeps them.
    Discard(Vec<u64>),
    /// Until the [`Action::Restart`] that follows is over, drop silently the TCP
    /// segments that reach this MH's restored connections (from it, and for it from the
    /// fixed side) except those of connections already restarted: a socket in repair
    /// mode takes and acknowledges what it is sent, lost if its restart then failed.
    Gate(IpAddr),
    /// Restart these restored connections and start relaying (the daemon answers with
    /// [`NewEvent::Restarted`]; one that fails is closed silently, still in repair).
    Restart(Vec<u64>),
    /// Make the fixed network deliver the MH's traffic here (proxy ARP + gratuitous ARP).
    Reroute(IpAddr),
    /// Stop answering for the MH on the fixed network (nothing of it runs here).
    Unroute(IpAddr),
    /// Drop the MH's TCP silently for a while (`hold_after_ms`), without telling it
    /// anything: its segments for connections that did not resume here (or never came:
    /// a pull that failed after the old MSR accepted) must not draw RSTs while it goes
    /// back to the old MSR or greets again.
    Quarantine(IpAddr),
    /// The MH is served here now: no detection for it while it stays, and (if known)
    /// its link-layer address is the one bound to it.
    Arrived {
        mh: IpAddr,
        mac: Option<[u8; 6]>,
    },
    /// The MH is in another MSR's cell now: forget that it was here and the address
    /// bound to it.
    Forget(IpAddr),
    /// Send to the other MSR.
    Send(Message),
    /// Old MSR: the new MSR holds the MH's flows. Send it a copy of each packet held
    /// here of the frozen connections, and of each that arrives until the handoff
    /// ends (the originals stay held: dropped at `Delete`, delivered at `Unfreeze`).
    SendAhead(IpAddr),
    /// The MH's connections are at this peer now: drop the channel to the old MSR and
    /// send what follows to it (its address is the daemon's business).
    AskInstead(String),
    /// One handoff log record.
    Log(Record),
}

/// How long each side waits for the other (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// New MSR: from the request to the images.
    pub images_us: u64,
    /// Old MSR: from the images sent to the acknowledgement.
    pub ack_us: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            images_us: 5_000_000,
            ack_us: 5_000_000,
        }
    }
}

/// Events at the new MSR.
#[derive(Debug, Clone)]
pub enum NewEvent {
    Message(Message),
    /// Restore results: restored ids, and failures with reasons.
    Restored {
        restored: Vec<u64>,
        failed: Vec<(u64, String)>,
    },
    /// Restart results: ids now running here, and failures with reasons.
    Restarted {
        resumed: Vec<u64>,
        failed: Vec<(u64, String)>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NewState {
    WaitingAccept,
    WaitingImages,
    Restoring,
    Restarting,
    Done,
}

/// What started a pull at the new MSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The MH greeted us naming its previous MSR, which checks the proof.
    Greeting(Greeting),
    /// Network detection: the MH's first packet here came from link-layer address
    /// `mac`. Every peer is asked; the one serving the MH checks `mac` against the
    /// address bound to it there.
    Detected { mh: IpAddr, mac: [u8; 6] },
}

/// The new MSR's side of one handoff.
#[derive(Debug, Clone)]
pub struct NewSide {
    pub handoff_id: u64,
    me: String,
    trigger: Trigger,
    mh: IpAddr,
    old_msr: String,
    /// The link-layer address bound to the MH (detected here, or shipped by the old MSR).
    mac: Option<[u8; 6]>,
    state: NewState,
    phases: Phases,
    token: Option<String>,
    deadline: u64,
    restore_failed: Vec<(u64, String)>,
    /// The old MSR called the handoff off (its reason) while the connections were
    /// being restored: they are discarded, not restarted.
    called_off: Option<String>,
    /// Our acknowledgement, once sent: the answer to a call-off that comes after it.
    ack: Option<Message>,
    /// The peers asked so far after `MovedOn` answers (never one twice, at most
    /// [`MAX_REDIRECTS`]).
    asked: Vec<String>,
    /// Where the old MSR says the MH's other connections went (`Accepted.also_at`).
    also_at: Option<String>,
    /// Connections restored ahead of the images' final message (`ImagesPart`): a
    /// handoff given up before it discards them.
    ahead: std::collections::HashSet<u64>,
}

/// How many `MovedOn` answers one pull follows: one per pull that completed after the
/// MH had moved on, so more than two means peers that disagree.
pub const MAX_REDIRECTS: usize = 2;

impl NewSide {
    /// An MH greeted us naming its previous MSR: ask that MSR (which holds the MH's
    /// token and checks the proof). Nothing is held yet.
    pub fn start(
        handoff_id: u64,
        me: &str,
        greeting: Greeting,
        now_us: u64,
        t: Timeouts,
    ) -> (NewSide, Vec<Action>) {
        let msg = Message::HandoffRequest {
            handoff_id,
            greeting: greeting.clone(),
            parts: true,
        };
        Self::begin(handoff_id, me, Trigger::Greeting(greeting), msg, now_us, t)
    }

    /// Network detection: MH `mh` sent its first packet here from `mac`. The request
    /// goes to every peer (the driver sends it to each and feeds back the answer of
    /// the one that serves the MH, or `NotHere` when none does). Nothing is held yet.
    pub fn detected(
        handoff_id: u64,
        me: &str,
        mh: IpAddr,
        mac: [u8; 6],
        now_us: u64,
        t: Timeouts,
    ) -> (NewSide, Vec<Action>) {
        let msg = Message::Detected {
            handoff_id,
            mh,
            mac: itcp_proto::hex::mac(&mac),
            parts: true,
        };
        Self::begin(
            handoff_id,
            me,
            Trigger::Detected { mh, mac },
            msg,
            now_us,
            t,
        )
    }

    fn begin(
        handoff_id: u64,
        me: &str,
        trigger: Trigger,
        request: Message,
        now_us: u64,
        t: Timeouts,
    ) -> (NewSide, Vec<Action>) {
        let phases = Phases {
            greeting: Some(now_us),
            mh_in: Some(now_us),
            ..Phases::default()
        };
        let (mh, old_msr, mac) = match &trigger {
            Trigger::Greeting(g) => (g.mh, g.prev_msr.clone(), None),
            Trigger::Detected { mh, mac } => (*mh, String::new(), Some(*mac)),
        };
        let s = NewSide {
            handoff_id,
            me: me.into(),
            trigger,
            mh,
            old_msr,
            mac,
            state: NewState::WaitingAccept,
            phases,
            token: None,
            deadline: now_us + t.images_us,
            restore_failed: Vec::new(),
            called_off: None,
            ack: None,
            asked: Vec::new(),
            also_at: None,
            ahead: Default::default(),
        };
        (s, vec![Action::Send(request)])
    }

    /// Network detection: the peer that answered for the MH (for the log).
    pub fn set_old_msr(&mut self, id: &str) {
        self.old_msr = id.into();
    }

    pub fn done(&self) -> bool {
        self.state == NewState::Done
    }

    /// Whether the old MSR has been sent our acknowledgement: the channel stays open
    /// after the handoff until the old MSR closes it, to answer a call-off that crossed
    /// it (closed at once, it met the call-off with an RST, and the old MSR, which
    /// could not tell, unfroze copies of connections running here).
    pub fn acknowledged(&self) -> bool {
        self.ack.is_some()
    }

    /// True once the MH's flows are held here (the proof was accepted).
    pub fn holding(&self) -> bool {
        matches!(
            self.state,
            NewState::WaitingImages | NewState::Restoring | NewState::Restarting
        )
    }

    /// The MH's session token as the old MSR sent it (hex), once it accepted.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The peer the old MSR says holds the MH's other connections, to pull from next
    /// with the same greeting once this handoff moved something (never this MSR, the
    /// old one, or one asked already).
    pub fn also_at(&self) -> Option<&str> {
        let a = self.also_at.as_deref()?;
        let seen = a == self.me || a == self.old_msr || self.asked.iter().any(|p| p == a);
        (!seen && self.greeting().is_some()).then_some(a)
    }

    /// The greeting this handoff started with (None: network detection).
    pub fn greeting(&self) -> Option<&Greeting> {
        match &self.trigger {
            Trigger::Greeting(g) => Some(g),
            Trigger::Detected { .. } => None,
        }
    }

    /// The MH this handoff is for.
    pub fn mh(&self) -> IpAddr {
        self.mh
    }

    /// The next deadline (µs), while waiting for the old MSR.
    pub fn poll_timeout(&self) -> Option<u64> {
        matches!(
            self.state,
            NewState::WaitingAccept | NewState::WaitingImages
        )
        .then_some(self.deadline)
    }

    fn record(
        &self,
        outcome: Outcome,
        reason: Option<String>,
        failed: Vec<(u64, String)>,
    ) -> Record {
        Record {
            handoff_id: self.handoff_id,
            msr: self.me.clone(),
            role: Role::New,
            mh: self.mh,
            old_msr: self.old_msr.clone(),
            new_msr: self.me.clone(),
            outcome,
            reason,
            connections: Vec::new(),
            failed,
            phases: self.phases.clone(),
            bytes_moved: None,
        }
    }

    fn give_up(&mut self, outcome: Outcome, reason: String) -> Vec<Action> {
        let held = self.holding();
        self.state = NewState::Done;
        let mut acts = Vec::new();
        if !self.ahead.is_empty() {
            // Parts restored before the images' final message: nothing runs here.
            acts.push(Action::Discard(self.ahead.drain().collect()));
        }
        if held {
            // The old MSR had accepted: the MH was told to send through us, and may
            // go on doing so until it hears of the failure (or greets again at once).
            // Its connections live on there: their segments must meet a silent drop
            // here for a while, not our kernel, which would reset them.
            acts.push(Action::Quarantine(self.mh));
        }
        acts.push(Action::Log(self.record(outcome, Some(reason), vec![])));
        acts
    }

    fn ask_instead(&mut self, to: String) -> Vec<Action> {
        let Some(g) = self.greeting().cloned() else {
            // Detection asks every peer at once: the one with the MH answers itself.
            return vec![];
        };
        let seen = to == self.me || to == self.old_msr || self.asked.contains(&to);
        if seen || self.asked.len() >= MAX_REDIRECTS {
            let why = format!("{} says the MH's connections are at {to}", self.old_msr);
            return self.give_up(Outcome::Rejected, why);
        }
        self.asked
            .push(std::mem::replace(&mut self.old_msr, to.clone()));
        vec![
            Action::AskInstead(to),
            Action::Send(Message::HandoffRequest {
                handoff_id: self.handoff_id,
                greeting: g,
                parts: true,
            }),
        ]
    }

    /// The deadline passed (the daemon calls this once `now_us >= poll_timeout()`).
    pub fn handle_timeout(&mut self, now_us: u64) -> Vec<Action> {
        match self.poll_timeout() {
            Some(d) if now_us >= d => {
                let why = if self.state == NewState::WaitingAccept {
                    "old MSR did not answer the request in time"
                } else {
                    "old MSR did not send the images in time"
                };
                // Tell the old MSR, which may have frozen already: it rolls back now
                // rather than at its own deadline.
                let mut acts = vec![Action::Send(Message::Abort {
                    handoff_id: self.handoff_id,
                    reason: why.into(),
                })];
                acts.extend(self.give_up(Outcome::RolledBack, why.into()));
                acts
            }
            _ => vec![],
        }
    }

    /// The channel to the old MSR failed (closed, unauthenticated bytes): give up now.
    /// The old MSR refused the channel's connection: its msrd is not running, and a
    /// crashed msrd has reset the MH's connections. Rather than send the MH back to a
    /// dead MSR, it attaches here without them (nothing was held or taken over; the
    /// MH's next connection claims its address here). A channel that cannot be reached
    /// at all (a partition) is [`NewSide::handle_channel_lost`]: the old MSR may still
    /// serve the connections.
    pub fn handle_old_down(&mut self, reason: &str) -> Vec<Action> {
        match self.state {
            NewState::WaitingAccept => {
                self.state = NewState::Done;
                let why = format!("old MSR down ({reason}): attached without its connections");
                vec![Action::Log(self.record(
                    Outcome::OldDown,
                    Some(why),
                    vec![],
                ))]
            }
            _ => self.handle_channel_lost(reason),
        }
    }

    pub fn handle_channel_lost(&mut self, reason: &str) -> Vec<Action> {
        match self.state {
            NewState::WaitingAccept | NewState::WaitingImages => self.give_up(
                Outcome::RolledBack,
                format!("channel to the old MSR: {reason}"),
            ),
            _ => vec![],
        }
    }

    pub fn handle(&mut self, ev: NewEvent, now_us: u64) -> Vec<Action> {
        let id = self.handoff_id;
        match (self.state, ev) {
            (
                NewState::WaitingAccept,
                NewEvent::Message(Message::Accepted {
                    handoff_id,
                    token,
                    also_at,
                }),
            ) if handoff_id == id => {
                self.state = NewState::WaitingImages;
                // The MH's token, so the replies to it are tagged from the hold on.
                self.token = token;
                self.also_at = also_at;
                vec![
                    Action::Hold(self.mh),
                    Action::Send(Message::Holding { handoff_id: id }),
                ]
            }
            // A greeting: the previous MSR holds nothing of the MH (no connection, no
            // token), so there is nothing to move or prove. It attaches here.
            (NewState::WaitingAccept, NewEvent::Message(Message::NotHere { handoff_id }))
                if handoff_id == id && self.greeting().is_some() =>
            {
                self.state = NewState::Done;
                vec![Action::Attached]
            }
            // The old MSR's copy moved on to another peer after the MH left (a pull
            // held up by the channel): ask that peer with the same greeting.
            (NewState::WaitingAccept, NewEvent::Message(Message::MovedOn { handoff_id, to }))
                if handoff_id == id =>
            {
                self.ask_instead(to)
            }
            // Network detection: no peer serves the MH. It is ours now, with nothing
            // to move; it needs its address here on the fixed LAN all the same.
            (NewState::WaitingAccept, NewEvent::Message(Message::NotHere { handoff_id }))
                if handoff_id == id && self.greeting().is_none() =>
            {
                self.state = NewState::Done;
                vec![
                    Action::Arrived {
                        mh: self.mh,
                        mac: self.mac,
                    },
                    Action::Reroute(self.mh),
                ]
            }
            (
                NewState::WaitingImages,
                NewEvent::Message(Message::ImagesPart { handoff_id, images }),
            ) if handoff_id == id => {
                // Ids already seen (a misbehaving peer) would be restored twice.
                let fresh: Vec<ConnImage> = images
                    .into_iter()
                    .filter(|i| self.ahead.insert(i.id))
                    .collect();
                vec![Action::RestoreAhead(fresh)]
            }
            (
                NewState::WaitingImages,
                NewEvent::Message(Message::Images {
                    handoff_id,
                    images,
                    token,
                    mac,
                    ..
                }),
            ) if handoff_id == id => {
                self.phases.images_sent = Some(now_us);
                // From here the restore's results account for the parts too.
                let ahead = std::mem::take(&mut self.ahead);
                let images = images
                    .into_iter()
                    .filter(|i| !ahead.contains(&i.id))
                    .collect();
                if token.is_some() {
                    self.token = token;
                }
                if self.mac.is_none() {
                    self.mac = mac.as_deref().and_then(itcp_proto::hex::parse_mac);
                }
                self.state = NewState::Restoring;
                vec![Action::Restore(images)]
            }
            // Heard before the restart (the daemon looks once the restore is done):
            // the old MSR gave up waiting and keeps the connections.
            (NewState::Restoring, NewEvent::Message(Message::Abort { handoff_id, reason }))
                if handoff_id == id =>
            {
                self.called_off = Some(reason);
                vec![]
            }
            (NewState::Restoring, NewEvent::Restored { restored, failed })
                if self.called_off.is_some() =>
            {
                self.phases.restored = Some(now_us);
                let reason = self.called_off.take().unwrap_or_default();
                let why = format!("the old MSR called the handoff off: {reason}");
                let mut all_failed = failed;
                all_failed.extend(restored.iter().map(|c| (*c, why.clone())));
                // Its final word: nothing runs here.
                let ack = Message::Ack {
                    handoff_id: id,
                    restored: vec![],
                    failed: all_failed,
                };
                self.ack = Some(ack.clone());
                let mut acts = vec![Action::Discard(restored), Action::Send(ack)];
                acts.extend(self.give_up(Outcome::RolledBack, why));
                acts
            }
            (NewState::Restoring, NewEvent::Restored { restored, failed }) => {
                self.phases.restored = Some(now_us);
                self.restore_failed = failed;
                self.state = NewState::Restarting;
                let mh = self.mh;
                vec![
                    Action::Reroute(mh),
                    Action::Gate(mh),
                    Action::Release(mh),
                    Action::Restart(restored),
                ]
            }
            (NewState::Restarting, NewEvent::Restarted { resumed, failed }) => {
                self.phases.resumed = Some(now_us);
                self.state = NewState::Done;
                let mut all_failed = std::mem::take(&mut self.restore_failed);
                all_failed.extend(failed);
                self.phases.acknowledged = Some(now_us);
                let none_resumed = resumed.is_empty() && !all_failed.is_empty();
                let ack = Message::Ack {
                    handoff_id: id,
                    restored: resumed,
                    failed: all_failed.clone(),
                };
                self.ack = Some(ack.clone());
                let mut acts = vec![Action::Send(ack)];
                if none_resumed {
                    // Nothing runs here: the old MSR keeps every connection and takes
                    // the MH's address back; the MH is told the move failed.
                    let mh = self.mh;
                    acts.push(Action::Unroute(mh));
                    acts.push(Action::Quarantine(mh));
                    let reason = "no connection resumed here: the old MSR keeps them".into();
                    acts.push(Action::Log(self.record(
                        Outcome::RolledBack,
                        Some(reason),
                        all_failed,
                    )));
                } else {
                    let outcome = if all_failed.is_empty() {
                        Outcome::Moved
                    } else {
                        Outcome::Partial
                    };
                    acts.push(Action::Arrived {
                        mh: self.mh,
                        mac: self.mac,
                    });
                    acts.push(Action::Log(self.record(outcome, None, all_failed)));
                }
                acts
            }
            (
                NewState::WaitingAccept | NewState::WaitingImages,
                NewEvent::Message(Message::Abort { handoff_id, reason }),
            ) if handoff_id == id => {
                let outcome = if self.state == NewState::WaitingAccept {
                    Outcome::Rejected
                } else {
                    Outcome::RolledBack
                };
                self.give_up(outcome, format!("old MSR refused: {reason}"))
            }
            // A call-off that crossed our acknowledgement (late, or held up in the
            // network past the old MSR's deadline): it stands, and is sent again.
            (NewState::Done, NewEvent::Message(Message::Abort { handoff_id, .. }))
                if handoff_id == id && self.ack.is_some() =>
            {
                self.ack.clone().map(Action::Send).into_iter().collect()
            }
            // Anything else (late, duplicate or misplaced messages) changes nothing.
            _ => vec![],
        }
    }
}

/// Events at the old MSR.
#[derive(Debug, Clone)]
pub enum OldEvent {
    /// Our sockets, frozen and captured.
    Captured(Vec<ConnImage>),
    /// Connections that cannot be captured (not a passing state: a transient one is
    /// `CaptureFailed`, tried again with the MH's next greeting), with the reason;
    /// before `Captured`. They stay here, resumed, and are on record as failed: the
    /// rest move (the outcome is partial), rather than every connection of the MH
    /// staying behind with them, unreachable in the MH's new cell.
    Uncaptured(Vec<(u64, String)>),
    /// No socket could be captured, or one changed while it was: the handoff is off.
    CaptureFailed(String),
    Message(Message),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OldState {
    Capturing,
    WaitingAck,
    /// No acknowledgement in time: the handoff was called off, and the new MSR's
    /// answer (what it restarted before it heard) is awaited.
    CallingOff,
    Done,
}

/// How long the old MSR waits for the new MSR's answer to a call-off (µs). Past it,
/// with the channel still up but silent, it cannot know what runs at the new MSR; it
/// unfreezes (a connection that did restart there then runs at both MSRs).
pub const CALL_OFF_WAIT_US: u64 = 30_000_000;

/// What the old MSR knows of the MH a request names.
#[derive(Debug, Clone, Copy, Default)]
pub struct MhKnown<'a> {
    /// The MH's session token, if its connections here were opened with one.
    pub token: Option<&'a [u8]>,
    /// Timestamp of the newest greeting of this MH accepted so far.
    pub last_greeting_ts: u64,
    /// The link-layer address bound to the MH here (network detection), if any.
    pub mac: Option<[u8; 6]>,
    /// The MH's connections here.
    pub local: usize,
    /// The peer the MH's connections last left here for (with `local` 0: where they
    /// are, if nothing came back since).
    pub moved_to: Option<&'a str>,
    /// The peer the MH's connections here came from by the last pull.
    pub came_from: Option<&'a str>,
}

/// What a peer asks of the old MSR.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// The MH greeted the peer: its proof must verify under the MH's token here.
    Greeting(&'a Greeting),
    /// The peer saw the MH's first packet come from `mac`: it must be the address
    /// bound to the MH here.
    Detected { mh: IpAddr, mac: [u8; 6] },
}

/// The old MSR's side of one handoff.
#[derive(Debug, Clone)]
pub struct OldSide {
    pub handoff_id: u64,
    me: String,
    new_msr: String,
    mh: IpAddr,
    state: OldState,
    phases: Phases,
    token: Option<String>,
    mac: Option<[u8; 6]>,
    timeouts: Timeouts,
    deadline: Option<u64>,
    /// The new MSR said it holds the MH's flows (`Holding`).
    peer_holding: bool,
    /// Connections that could not be captured: they stay here (`Uncaptured`).
    uncaptured: Vec<(u64, String)>,
}

/// Why a request is refused, or None.
fn refusal(me: &str, from: &str, req: Request<'_>, known: MhKnown<'_>) -> Option<String> {
    match req {
        Request::Greeting(g) => {
            // The MH names the MSR it last heard from: this one, or the one its
            // connections were pulled here from without it knowing (`MovedOn`).
            let prev_ok = g.prev_msr == me || known.came_from == Some(g.prev_msr.as_str());
            if g.new_msr != from || !prev_ok {
                Some("greeting names other MSRs than the ones exchanging it".into())
            } else if let Some(t) = known.token {
                if !g.verify(t) {
                    Some("greeting proof does not match the MH's session token".into())
                } else if g.ts_ms <= known.last_greeting_ts {
                    Some("greeting already used (replayed)".into())
                } else {
                    None
                }
            } else {
                Some("no I-TCP connection of this MH here opened with a session token".into())
            }
        }
        Request::Detected { mh, mac } => match known.mac {
            Some(bound) if bound != mac => Some(format!(
                "link-layer address {} is not the one bound to {mh} here",
                itcp_proto::hex::mac(&mac)
            )),
            Some(_) => None,
            None => Some(
                "this MH's connections here are bound to no link-layer address \
                 (its cell here has no network detection)"
                    .into(),
            ),
        },
    }
}

impl OldSide {
    /// A handoff request arrived from `from` (already authenticated as that peer).
    /// The greeting must carry a proof under the MH's token and be newer than every
    /// greeting accepted before; only then does anything change here.
    ///
    /// A detected request for an MH with no connection here is answered `NotHere`
    /// (and the MH's presence and address binding here end).
    pub fn start(
        me: &str,
        from: &str,
        handoff_id: u64,
        req: Request<'_>,
        known: MhKnown<'_>,
        now_us: u64,
        timeouts: Timeouts,
    ) -> (OldSide, Vec<Action>) {
        let mh = match req {
            Request::Greeting(g) => g.mh,
            Request::Detected { mh, .. } => mh,
        };
        let mut s = OldSide {
            handoff_id,
            me: me.into(),
            new_msr: from.into(),
            mh,
            state: OldState::Capturing,
            phases: Phases {
                mh_in: Some(now_us),
                ..Phases::default()
            },
            token: known.token.map(itcp_proto::hex::hex),
            mac: known.mac,
            timeouts,
            deadline: None,
            peer_holding: false,
            uncaptured: Vec::new(),
        };
        // A greeting for an MH whose connections left for another peer: the MH never
        // heard of that move (it still names us). The peer is sent there.
        if let (Request::Greeting(_), 0, Some(to)) = (req, known.local, known.moved_to) {
            s.state = OldState::Done;
            if to != from {
                let to = to.to_string();
                return (s, vec![Action::Send(Message::MovedOn { handoff_id, to })]);
            }
            // They all went to the peer asking: a fresh greeting the MH sent it while
            // the move was on its way (a slow handoff). Accepted, it froze nothing here
            // and held the MH's running connections there for a pull that moved none,
            // logged as `moved` with no connection.
            return (s, vec![Action::Send(Message::NotHere { handoff_id })]);
        }
        // A greeting for an MH that has nothing here (no connection, and so no token
        // to check a proof with): nothing to move, nothing changes here.
        if let Request::Greeting(_) = req {
            if known.local == 0 && known.token.is_none() {
                s.state = OldState::Done;
                return (s, vec![Action::Send(Message::NotHere { handoff_id })]);
            }
        }
        // An address with nothing here binds no station: a station that claimed it and
        // opened nothing does not keep another that uses it now (its address given out
        // again) from being served there.
        if let Request::Detected { .. } = req {
            if known.local == 0 {
                s.state = OldState::Done;
                let mut acts = vec![Action::Send(Message::NotHere { handoff_id })];
                if known.mac.is_some() {
                    acts.push(Action::Forget(mh));
                }
                return (s, acts);
            }
        }
        let acts = match refusal(me, from, req, known) {
            Some(reason) => {
                s.state = OldState::Done;
                s.token = None;
                vec![
                    Action::Send(Message::Abort {
                        handoff_id,
                        reason: reason.clone(),
                    }),
                    Action::Log(s.record(Outcome::Rejected, Some(reason))),
                ]
            }
            None => {
                s.phases.freeze = Some(now_us);
                let mut acts = Vec::new();
                let greeting = match req {
                    Request::Greeting(g) => Some(g),
                    Request::Detected { .. } => None,
                };
                if let Some(g) = greeting {
                    acts.push(Action::GreetingUsed { mh, ts_ms: g.ts_ms });
                }
                acts.push(Action::CompleteHandshakes {
                    mh,
                    wait_for_ack: greeting.is_some(),
                });
                // Some of the MH's connections left for another peer after it had
                // moved on, others are here (opened since, or kept by a partial
                // handoff): the new MSR fetches those from there too.
                let also_at = match (req, known.moved_to) {
                    (Request::Greeting(_), Some(to)) if to != from => Some(to.to_string()),
                    _ => None,
                };
                acts.push(Action::Send(Message::Accepted {
                    handoff_id,
                    token: s.token.clone(),
                    also_at,
                }));
                acts.push(Action::FreezeAndCapture(mh));
                acts
            }
        };
        (s, acts)
    }

    pub fn done(&self) -> bool {
        self.state == OldState::Done
    }

    /// The next deadline (µs), while waiting for the acknowledgement.
    pub fn poll_timeout(&self) -> Option<u64> {
        matches!(self.state, OldState::WaitingAck | OldState::CallingOff)
            .then_some(self.deadline)
            .flatten()
    }

    fn record(&self, outcome: Outcome, reason: Option<String>) -> Record {
        Record {
            handoff_id: self.handoff_id,
            msr: self.me.clone(),
            role: Role::Old,
            mh: self.mh,
            old_msr: self.me.clone(),
            new_msr: self.new_msr.clone(),
            outcome,
            reason,
            connections: Vec::new(),
            failed: Vec::new(),
            phases: self.phases.clone(),
            bytes_moved: None,
        }
    }

    fn roll_back(&mut self, reason: String) -> Vec<Action> {
        self.state = OldState::Done;
        vec![
            Action::Unfreeze(self.mh),
            Action::Log(self.record(Outcome::RolledBack, Some(reason))),
        ]
    }

    /// The deadline passed. Waiting for the acknowledgement: the new MSR may have
    /// restarted the connections and its acknowledgement be on its way, so the
    /// handoff is called off and its answer awaited, the connections still frozen.
    /// Waiting for that answer: serve on.
    pub fn handle_timeout(&mut self, now_us: u64) -> Vec<Action> {
        match self.poll_timeout() {
            Some(d) if now_us >= d => {
                if self.state == OldState::CallingOff {
                    return self.roll_back(
                        "new MSR did not confirm in time, nor answer the call-off".into(),
                    );
                }
                self.state = OldState::CallingOff;
                self.deadline = Some(now_us + CALL_OFF_WAIT_US);
                vec![Action::Send(Message::Abort {
                    handoff_id: self.handoff_id,
                    reason: "no acknowledgement in time".into(),
                })]
            }
            _ => vec![],
        }
    }

    /// The channel to the new MSR failed (closed, crashed, unauthenticated bytes).
    pub fn handle_channel_lost(&mut self, reason: &str) -> Vec<Action> {
        match self.state {
            OldState::WaitingAck | OldState::CallingOff => {
                self.roll_back(format!("channel to the new MSR: {reason}"))
            }
            _ => vec![],
        }
    }

    pub fn handle(&mut self, ev: OldEvent, now_us: u64) -> Vec<Action> {
        match (self.state, ev) {
            (OldState::Capturing, OldEvent::Uncaptured(stay)) => {
                self.uncaptured.extend(stay);
                vec![]
            }
            (OldState::Capturing, OldEvent::Captured(images)) => {
                self.phases.images_sent = Some(now_us);
                self.state = OldState::WaitingAck;
                self.deadline = Some(now_us + self.timeouts.ack_us);
                let mut acts = vec![Action::Send(Message::Images {
                    handoff_id: self.handoff_id,
                    images,
                    token: self.token.clone(),
                    // The driver adds the MH's recently closed flows (socket state).
                    closed: Vec::new(),
                    staying: Vec::new(),
                    mac: self.mac.as_ref().map(itcp_proto::hex::mac),
                })];
                if self.peer_holding {
                    acts.push(Action::SendAhead(self.mh));
                }
                acts
            }
            // Copies of held packets go once the images are out and the new MSR holds.
            (state, OldEvent::Message(Message::Holding { handoff_id }))
                if handoff_id == self.handoff_id && !self.peer_holding =>
            {
                self.peer_holding = true;
                match state {
                    OldState::WaitingAck => vec![Action::SendAhead(self.mh)],
                    _ => vec![],
                }
            }
            (
                OldState::WaitingAck | OldState::CallingOff,
                OldEvent::Message(Message::Ack {
                    handoff_id,
                    restored,
                    failed,
                }),
            ) if handoff_id == self.handoff_id => {
                self.phases.acknowledged = Some(now_us);
                self.state = OldState::Done;
                let mut failed = failed;
                failed.extend(self.uncaptured.iter().cloned());
                if restored.is_empty() && !failed.is_empty() {
                    // Nothing resumed at the new MSR: everything stays here, and the
                    // MH's address comes back to us on the fixed LAN.
                    let mut r = self.record(
                        Outcome::RolledBack,
                        Some("no connection resumed at the new MSR".into()),
                    );
                    r.failed = failed;
                    return vec![
                        Action::Unfreeze(self.mh),
                        Action::Reroute(self.mh),
                        Action::Log(r),
                    ];
                }
                let mut acts = vec![Action::Delete(restored), Action::Forget(self.mh)];
                let outcome = if failed.is_empty() {
                    Outcome::Moved
                } else {
                    // What did not resume at the new MSR stays here, frozen copies
                    // resumed: never deleted without a record.
                    acts.push(Action::Unfreeze(self.mh));
                    Outcome::Partial
                };
                let mut r = self.record(outcome, None);
                r.failed = failed;
                acts.push(Action::Log(r));
                acts
            }
            (OldState::Capturing, OldEvent::CaptureFailed(reason)) => {
                let mut acts = vec![Action::Send(Message::Abort {
                    handoff_id: self.handoff_id,
                    reason: format!("old MSR could not capture: {reason}"),
                })];
                acts.extend(self.roll_back(format!("capture failed: {reason}")));
                acts
            }
            (
                OldState::WaitingAck | OldState::CallingOff | OldState::Capturing,
                OldEvent::Message(Message::Abort { handoff_id, reason }),
            ) if handoff_id == self.handoff_id => {
                self.roll_back(format!("new MSR aborted: {reason}"))
            }
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &[u8] = b"the MH's token..";
    const T: Timeouts = Timeouts {
        images_us: 1000,
        ack_us: 5000,
    };

    fn greeting() -> Greeting {
        Greeting::new(
            TOKEN,
            "10.2.0.100".parse().unwrap(),
            "msr1",
            "msr2",
            10,
            [1; 16],
        )
    }

    fn known() -> MhKnown<'static> {
        MhKnown {
            local: 1,
            mac: None,
            token: Some(TOKEN),
            last_greeting_ts: 0,
            ..MhKnown::default()
        }
    }

    fn img(id: u64) -> ConnImage {
        ConnImage {
            id,
            kind: "connect".into(),
            wireless: b"00".to_vec(),
            fixed: b"00".to_vec(),
            ..Default::default()
        }
    }

    fn sent(acts: &[Action]) -> Message {
        acts.iter()
            .find_map(|a| match a {
                Action::Send(m) => Some(m.clone()),
                _ => None,
            })
            .expect("a message to send")
    }

    fn log(acts: &[Action]) -> Record {
        acts.iter()
            .find_map(|a| match a {
                Action::Log(r) => Some(r.clone()),
                _ => None,
            })
            .expect("a log record")
    }

    /// A new side that asked msr1 and heard `accepted`: waiting for the images.
    fn waiting_images() -> NewSide {
        let (mut new, acts) = NewSide::start(9, "msr2", greeting(), 100, T);
        assert!(
            matches!(sent(&acts), Message::HandoffRequest { parts: true, .. }),
            "the request takes parts"
        );
        let accepted = Message::Accepted {
            handoff_id: 9,
            token: None,
            also_at: None,
        };
        new.handle(NewEvent::Message(accepted), 101);
        new
    }

    fn part(ids: &[u64]) -> NewEvent {
        NewEvent::Message(Message::ImagesPart {
            handoff_id: 9,
            images: ids.iter().map(|&i| img(i)).collect(),
        })
    }

    fn images(ids: &[u64]) -> NewEvent {
        NewEvent::Message(Message::Images {
            handoff_id: 9,
            images: ids.iter().map(|&i| img(i)).collect(),
            token: None,
            closed: vec![],
            staying: vec![],
            mac: None,
        })
    }

    #[test]
    fn parts_of_the_images_are_restored_as_they_come_and_the_rest_with_the_last() {
        let mut new = waiting_images();
        assert_eq!(
            new.handle(part(&[1, 2]), 102),
            vec![Action::RestoreAhead(vec![img(1), img(2)])]
        );
        // An id seen before is not restored twice; another part's handoff is not ours.
        assert_eq!(
            new.handle(part(&[2, 3]), 103),
            vec![Action::RestoreAhead(vec![img(3)])]
        );
        let other = NewEvent::Message(Message::ImagesPart {
            handoff_id: 8,
            images: vec![img(7)],
        });
        assert_eq!(new.handle(other, 103), vec![]);
        // The last message repeats none of them (an old MSR's may: not restored twice).
        assert_eq!(
            new.handle(images(&[3, 4]), 104),
            vec![Action::Restore(vec![img(4)])]
        );
        // A part after the last message changes nothing.
        assert_eq!(new.handle(part(&[5]), 105), vec![]);
        let acts = new.handle(
            NewEvent::Restored {
                restored: vec![1, 2, 3, 4],
                failed: vec![],
            },
            106,
        );
        assert_eq!(acts.last(), Some(&Action::Restart(vec![1, 2, 3, 4])));
        assert!(
            !acts.iter().any(|a| matches!(a, Action::Discard(_))),
            "{acts:?}"
        );
    }

    #[test]
    fn a_handoff_given_up_before_the_last_part_discards_those_restored_ahead() {
        let ids = |a: &[Action]| {
            let mut d: Vec<u64> = a
                .iter()
                .find_map(|a| match a {
                    Action::Discard(d) => Some(d.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no discard: {a:?}"));
            d.sort();
            d
        };
        // Called off by the old MSR (a connection changed while it was captured).
        let mut new = waiting_images();
        new.handle(part(&[1, 2]), 102);
        let abort = Message::Abort {
            handoff_id: 9,
            reason: "could not capture".into(),
        };
        let acts = new.handle(NewEvent::Message(abort), 103);
        assert_eq!(ids(&acts), vec![1, 2]);
        assert!(
            acts.contains(&Action::Quarantine(greeting().mh)),
            "{acts:?}"
        );
        // The channel lost.
        let mut new = waiting_images();
        new.handle(part(&[3]), 102);
        assert_eq!(ids(&new.handle_channel_lost("reset")), vec![3]);
        // No final message in time.
        let mut new = waiting_images();
        new.handle(part(&[4, 5]), 102);
        assert_eq!(ids(&new.handle_timeout(100 + T.images_us)), vec![4, 5]);
        // Nothing came ahead: nothing to discard.
        let mut new = waiting_images();
        let acts = new.handle_channel_lost("reset");
        assert!(
            !acts.iter().any(|a| matches!(a, Action::Discard(_))),
            "{acts:?}"
        );
    }

    #[test]
    fn both_sides_complete_a_handoff_with_every_phase_stamped_where_it_happens() {
        let mh = greeting().mh;
        let (mut new, acts) = NewSide::start(9, "msr2", greeting(), 100, T);
        assert_eq!(
            acts.len(),
            1,
            "nothing but the request before the proof: {acts:?}"
        );
        let Message::HandoffRequest {
            handoff_id,
            greeting: g,
            ..
        } = sent(&acts)
        else {
            panic!()
        };
        let (mut old, acts) = OldSide::start(
            "msr1",
            "msr2",
            handoff_id,
            Request::Greeting(&g),
            known(),
            101,
            T,
        );
        assert_eq!(
            acts,
            vec![
                Action::GreetingUsed { mh, ts_ms: 10 },
                Action::CompleteHandshakes {
                    mh,
                    wait_for_ack: true
                },
                Action::Send(Message::Accepted {
                    handoff_id: 9,
                    token: Some(itcp_proto::hex::hex(TOKEN)),
                    also_at: None,
                }),
                Action::FreezeAndCapture(mh)
            ]
        );
        let holding = new.handle(NewEvent::Message(sent(&acts)), 102);
        assert_eq!(
            holding,
            vec![
                Action::Hold(mh),
                Action::Send(Message::Holding { handoff_id: 9 })
            ]
        );
        let acts = old.handle(OldEvent::Captured(vec![img(1), img(2)]), 103);
        assert_eq!(old.poll_timeout(), Some(103 + 5000));
        // The new MSR holds, the images are out: the held packets' copies go, once.
        let ahead = old.handle(OldEvent::Message(sent(&holding)), 103);
        assert_eq!(ahead, vec![Action::SendAhead(mh)]);
        assert_eq!(old.handle(OldEvent::Message(sent(&holding)), 103), vec![]);
        let acts = new.handle(NewEvent::Message(sent(&acts)), 104);
        assert_eq!(acts, vec![Action::Restore(vec![img(1), img(2)])]);
        let acts = new.handle(
            NewEvent::Restored {
                restored: vec![1, 2],
                failed: vec![],
            },
            110,
        );
        assert_eq!(
            acts,
            vec![
                Action::Reroute(mh),
                Action::Gate(mh),
                Action::Release(mh),
                Action::Restart(vec![1, 2])
            ]
        );
        let acts = new.handle(
            NewEvent::Restarted {
                resumed: vec![1, 2],
                failed: vec![],
            },
            115,
        );
        let r = log(&acts);
        assert_eq!(r.outcome, Outcome::Moved);
        assert_eq!(
            (r.phases.images_sent, r.phases.restored, r.phases.resumed),
            (Some(104), Some(110), Some(115))
        );
        let acts = old.handle(OldEvent::Message(sent(&acts)), 118);
        assert_eq!(acts[0], Action::Delete(vec![1, 2]));
        assert_eq!(log(&acts).outcome, Outcome::Moved);
        assert_eq!(log(&acts).phases.acknowledged, Some(118));
        assert!(new.done() && old.done());
    }

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x64];
    const SPOOF: [u8; 6] = [2, 0, 0, 0, 0, 0x99];

    fn bound(local: usize) -> MhKnown<'static> {
        MhKnown {
            token: None,
            last_greeting_ts: 0,
            mac: Some(MAC),
            local,
            ..MhKnown::default()
        }
    }

    #[test]
    fn a_detected_move_hands_over_when_the_mac_matches_the_one_bound_at_the_old_msr() {
        let mh = greeting().mh;
        let (mut new, acts) = NewSide::detected(4, "msr2", mh, MAC, 100, T);
        assert!(new.greeting().is_none());
        let req = sent(&acts);
        let Message::Detected {
            handoff_id, mac, ..
        } = &req
        else {
            panic!("{req:?}")
        };
        assert_eq!(mac, "02:00:00:00:00:64");
        let r = Request::Detected { mh, mac: MAC };
        let (mut old, acts) = OldSide::start("msr1", "msr2", *handoff_id, r, bound(2), 101, T);
        // No greeting, so no replay state changes. The MH sends through the new MSR
        // already: its handshakes half-open here are completed at once, not waited for.
        assert_eq!(
            acts,
            vec![
                Action::CompleteHandshakes {
                    mh,
                    wait_for_ack: false
                },
                Action::Send(Message::Accepted {
                    handoff_id: 4,
                    token: None,
                    also_at: None,
                }),
                Action::FreezeAndCapture(mh)
            ]
        );
        new.set_old_msr("msr1");
        assert_eq!(
            new.handle(NewEvent::Message(sent(&acts)), 102)[0],
            Action::Hold(mh)
        );
        let acts = old.handle(OldEvent::Captured(vec![img(1)]), 103);
        let Message::Images { mac, .. } = sent(&acts) else {
            panic!()
        };
        assert_eq!(
            mac.as_deref(),
            Some("02:00:00:00:00:64"),
            "the binding travels"
        );
        new.handle(NewEvent::Message(sent(&acts)), 104);
        new.handle(
            NewEvent::Restored {
                restored: vec![1],
                failed: vec![],
            },
            105,
        );
        let acts = new.handle(
            NewEvent::Restarted {
                resumed: vec![1],
                failed: vec![],
            },
            106,
        );
        assert!(
            acts.contains(&Action::Arrived { mh, mac: Some(MAC) }),
            "{acts:?}"
        );
        let r = log(&acts);
        assert_eq!((r.outcome, r.old_msr.as_str()), (Outcome::Moved, "msr1"));
        let acts = old.handle(OldEvent::Message(sent(&acts)), 107);
        assert!(acts.contains(&Action::Forget(mh)), "{acts:?}");
    }

    #[test]
    fn an_address_with_nothing_here_binds_no_station() {
        // A station claimed the address here (network detection) and opened nothing:
        // another station that uses the address in another cell (DHCP gave it out
        // again) is not refused. Nothing is frozen; the binding here ends.
        let mh = greeting().mh;
        let r = Request::Detected { mh, mac: SPOOF };
        let (old, acts) = OldSide::start("msr1", "msr2", 1, r, bound(0), 0, T);
        assert!(old.done());
        assert_eq!(
            acts,
            vec![
                Action::Send(Message::NotHere { handoff_id: 1 }),
                Action::Forget(mh)
            ]
        );
    }

    #[test]
    fn a_detected_move_from_another_mac_moves_nothing_and_keeps_the_victim_here() {
        let mh = greeting().mh;
        for local in [1, 3] {
            let r = Request::Detected { mh, mac: SPOOF };
            let (old, acts) = OldSide::start("msr1", "msr2", 1, r, bound(local), 0, T);
            assert!(old.done());
            assert!(
                matches!(sent(&acts), Message::Abort { ref reason, .. } if reason.contains("02:00:00:00:00:99"))
            );
            assert_eq!(log(&acts).outcome, Outcome::Rejected);
            assert_eq!(acts.len(), 2, "no freeze, no forget: {acts:?}");
        }
        // Connections opened on a cell without detection are bound to no address.
        let unbound = MhKnown {
            mac: None,
            ..bound(1)
        };
        let (_, acts) = OldSide::start(
            "msr1",
            "msr2",
            1,
            Request::Detected { mh, mac: MAC },
            unbound,
            0,
            T,
        );
        assert_eq!(log(&acts).outcome, Outcome::Rejected);
        // The new MSR gives up and holds nothing.
        let (mut new, _) = NewSide::detected(1, "msr2", mh, SPOOF, 0, T);
        let acts = new.handle(NewEvent::Message(sent(&acts)), 1);
        assert!(new.done());
        assert!(
            !acts.iter().any(|a| matches!(
                a,
                Action::Hold(_) | Action::Arrived { .. } | Action::Reroute(_)
            )),
            "{acts:?}"
        );
    }

    #[test]
    fn a_detected_mh_served_nowhere_arrives_with_its_address_and_the_last_msr_forgets_it() {
        let mh = greeting().mh;
        // Idle at the old MSR with this MAC: it forgets the MH.
        let r = Request::Detected { mh, mac: MAC };
        let (_, acts) = OldSide::start("msr1", "msr2", 5, r, bound(0), 0, T);
        assert_eq!(
            acts,
            vec![
                Action::Send(Message::NotHere { handoff_id: 5 }),
                Action::Forget(mh)
            ]
        );
        // Never seen there: nothing to forget.
        let (_, acts) = OldSide::start("msr1", "msr2", 5, r, MhKnown::default(), 0, T);
        assert_eq!(acts, vec![Action::Send(Message::NotHere { handoff_id: 5 })]);
        let (mut new, _) = NewSide::detected(5, "msr2", mh, MAC, 0, T);
        let acts = new.handle(NewEvent::Message(sent(&acts)), 1);
        assert_eq!(
            acts,
            vec![Action::Arrived { mh, mac: Some(MAC) }, Action::Reroute(mh)]
        );
        assert!(new.done());
        // A greeting's pull never takes "not here" for an arrival (no address taken
        // over): the MH is only told it is attached.
        let (mut g, _) = NewSide::start(5, "msr2", greeting(), 0, T);
        assert_eq!(
            g.handle(NewEvent::Message(Message::NotHere { handoff_id: 5 }), 1),
            vec![Action::Attached]
        );
    }

    #[test]
    fn held_packets_are_sent_ahead_only_once_the_images_are_out_and_the_new_msr_holds() {
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let (mut old, _) = OldSide::start(
            "msr1",
            "msr2",
            3,
            Request::Greeting(&greeting()),
            known(),
            0,
            T,
        );
        // `holding` can overtake the capture: it waits for the images.
        let holding = OldEvent::Message(Message::Holding { handoff_id: 3 });
        assert_eq!(old.handle(holding, 1), vec![]);
        let acts = old.handle(OldEvent::Captured(vec![img(1)]), 2);
        assert!(matches!(acts[0], Action::Send(Message::Images { .. })));
        assert_eq!(acts[1..], [Action::SendAhead(mh)]);
        // Another handoff's `holding` changes nothing.
        let other = OldEvent::Message(Message::Holding { handoff_id: 4 });
        let (mut old, _) = OldSide::start(
            "msr1",
            "msr2",
            3,
            Request::Greeting(&greeting()),
            known(),
            0,
            T,
        );
        old.handle(OldEvent::Captured(vec![img(1)]), 2);
        assert_eq!(old.handle(other, 3), vec![]);
    }

    #[test]
    fn connections_split_by_a_late_pull_are_all_fetched() {
        // msr2's pull took the MH's connections from msr1 after the MH had moved on to
        // msr3 naming msr1; msr1 has one more of the MH's since (a partial handoff).
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let g = Greeting::new(TOKEN, mh, "msr1", "msr3", 20, [2; 16]);
        let split = MhKnown {
            local: 1,
            moved_to: Some("msr2"),
            ..known()
        };
        let (_, acts) = OldSide::start("msr1", "msr3", 7, Request::Greeting(&g), split, 0, T);
        let accepted = Message::Accepted {
            handoff_id: 7,
            token: Some(itcp_proto::hex::hex(TOKEN)),
            also_at: Some("msr2".into()),
        };
        assert!(acts.contains(&Action::Send(accepted.clone())), "{acts:?}");
        let (mut new, _) = NewSide::start(7, "msr3", g.clone(), 0, T);
        assert_eq!(new.also_at(), None);
        new.handle(NewEvent::Message(accepted), 1);
        assert_eq!(new.also_at(), Some("msr2"), "msr3 pulls from msr2 next");
        // Never from itself or from the MSR it pulls from now.
        for at in ["msr3", "msr1"] {
            let (mut new, _) = NewSide::start(8, "msr3", g.clone(), 0, T);
            let m = Message::Accepted {
                handoff_id: 8,
                token: None,
                also_at: Some(at.into()),
            };
            new.handle(NewEvent::Message(m), 1);
            assert_eq!(new.also_at(), None, "{at}");
        }
        // The MH's connections here came back from msr2 since: nothing else to fetch.
        let (_, acts) = OldSide::start("msr1", "msr3", 9, Request::Greeting(&g), known(), 0, T);
        assert!(
            acts.iter()
                .any(|a| matches!(a, Action::Send(Message::Accepted { also_at: None, .. }))),
            "{acts:?}"
        );
    }

    #[test]
    fn a_greeting_for_connections_that_moved_on_is_followed_to_where_they_are() {
        // msr2's pull, held up by the channel, took the MH's connections from msr1
        // after the MH had moved on to msr3, still naming msr1.
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let g = Greeting::new(TOKEN, mh, "msr1", "msr3", 20, [2; 16]);
        let gone = MhKnown {
            local: 0,
            moved_to: Some("msr2"),
            ..known()
        };
        // msr1 sends msr3 on and changes nothing (no freeze, no greeting used).
        let (old, acts) = OldSide::start("msr1", "msr3", 7, Request::Greeting(&g), gone, 0, T);
        let on = |to: &str| Message::MovedOn {
            handoff_id: 7,
            to: to.into(),
        };
        assert_eq!(acts, vec![Action::Send(on("msr2"))]);
        assert!(old.done());
        // msr3 asks msr2 with the same greeting.
        let (mut new, _) = NewSide::start(7, "msr3", g.clone(), 0, T);
        let acts = new.handle(NewEvent::Message(on("msr2")), 1);
        let request = Message::HandoffRequest {
            handoff_id: 7,
            greeting: g.clone(),
            parts: true,
        };
        assert_eq!(
            acts,
            vec![
                Action::AskInstead("msr2".into()),
                Action::Send(request.clone())
            ]
        );
        // msr2 takes a greeting naming msr1, where its connections came from...
        let there = MhKnown {
            came_from: Some("msr1"),
            last_greeting_ts: 10,
            ..known()
        };
        let (_, acts) = OldSide::start("msr2", "msr3", 7, Request::Greeting(&g), there, 2, T);
        assert!(acts.contains(&Action::FreezeAndCapture(mh)), "{acts:?}");
        // ...but not one naming an MSR it took nothing from.
        let unrelated = MhKnown {
            came_from: Some("msr4"),
            ..there
        };
        let (_, acts) = OldSide::start("msr2", "msr3", 7, Request::Greeting(&g), unrelated, 2, T);
        assert!(matches!(sent(&acts), Message::Abort { .. }), "{acts:?}");
        // Peers that send the pull round in circles: it gives up, holding nothing.
        let acts = new.handle(NewEvent::Message(on("msr1")), 3);
        assert_eq!(log(&acts).outcome, Outcome::Rejected);
        assert!(new.done());
        let (mut new, _) = NewSide::start(8, "msr3", g.clone(), 0, T);
        let to_me = Message::MovedOn {
            handoff_id: 8,
            to: "msr3".into(),
        };
        assert_eq!(
            log(&new.handle(NewEvent::Message(to_me), 1)).outcome,
            Outcome::Rejected
        );
    }

    #[test]
    fn a_greeting_for_connections_already_at_the_asking_msr_moves_nothing() {
        // Every connection of the MH left msr1 for msr2; the MH greets msr2 again,
        // afresh, naming msr1 (it had not heard of the move yet).
        let g = Greeting::new(TOKEN, greeting().mh, "msr1", "msr2", 20, [3; 16]);
        let gone = MhKnown {
            local: 0,
            moved_to: Some("msr2"),
            ..known()
        };
        let (old, acts) = OldSide::start("msr1", "msr2", 6, Request::Greeting(&g), gone, 0, T);
        assert_eq!(acts, vec![Action::Send(Message::NotHere { handoff_id: 6 })]);
        assert!(old.done());
        // msr2 holds nothing for it and tells the MH it is attached there.
        let (mut new, _) = NewSide::start(6, "msr2", g, 0, T);
        let acts = new.handle(NewEvent::Message(sent(&acts)), 1);
        assert_eq!(acts, vec![Action::Attached]);
    }

    #[test]
    fn an_mh_with_nothing_at_the_old_msr_attaches_at_the_new_one() {
        // The old MSR holds no connection and no token of the MH: it says so, and
        // nothing changes there (no freeze, no replay state, no record).
        let (old, acts) = OldSide::start(
            "msr1",
            "msr2",
            5,
            Request::Greeting(&greeting()),
            MhKnown::default(),
            0,
            T,
        );
        assert_eq!(acts, vec![Action::Send(Message::NotHere { handoff_id: 5 })]);
        assert!(old.done());
        // The new MSR tells the MH it is attached; it holds nothing and takes no
        // address over (the greeting is unproven here).
        let (mut new, _) = NewSide::start(5, "msr2", greeting(), 0, T);
        let acts = new.handle(NewEvent::Message(Message::NotHere { handoff_id: 5 }), 1);
        assert_eq!(acts, vec![Action::Attached]);
        assert!(new.done());
    }

    #[test]
    fn a_greeting_without_valid_proof_or_already_used_changes_nothing() {
        let only_refusal = |acts: &[Action]| {
            assert!(matches!(sent(acts), Message::Abort { .. }));
            assert_eq!(log(acts).outcome, Outcome::Rejected);
            assert_eq!(acts.len(), 2, "{acts:?}");
        };
        let other = MhKnown {
            local: 1,
            mac: None,
            token: Some(b"some other token"),
            last_greeting_ts: 0,
            ..MhKnown::default()
        };
        only_refusal(
            &OldSide::start(
                "msr1",
                "msr2",
                1,
                Request::Greeting(&greeting()),
                other,
                0,
                T,
            )
            .1,
        );
        // Connections of that MH here, opened without a token (a stock SOCKS client).
        let tokenless = MhKnown {
            local: 2,
            ..MhKnown::default()
        };
        only_refusal(
            &OldSide::start(
                "msr1",
                "msr2",
                1,
                Request::Greeting(&greeting()),
                tokenless,
                0,
                T,
            )
            .1,
        );
        // A greeting meant for another pair of MSRs.
        only_refusal(
            &OldSide::start(
                "msr1",
                "msr3",
                1,
                Request::Greeting(&greeting()),
                known(),
                0,
                T,
            )
            .1,
        );
        // A greeting not newer than the last accepted one: a replay.
        let used = MhKnown {
            local: 1,
            mac: None,
            last_greeting_ts: 10,
            ..known()
        };
        only_refusal(
            &OldSide::start(
                "msr1",
                "msr2",
                1,
                Request::Greeting(&greeting()),
                used,
                0,
                T,
            )
            .1,
        );
    }

    #[test]
    fn new_msr_holds_nothing_for_a_refused_greeting() {
        let (mut new, _) = NewSide::start(4, "msr2", greeting(), 0, T);
        let acts = new.handle(
            NewEvent::Message(Message::Abort {
                handoff_id: 4,
                reason: "no".into(),
            }),
            1,
        );
        assert!(!acts
            .iter()
            .any(|a| matches!(a, Action::Hold(_) | Action::Release(_))));
        assert_eq!(log(&acts).outcome, Outcome::Rejected);
        assert!(new.done());
    }

    #[test]
    fn the_mhs_token_comes_with_the_acceptance() {
        let (mut new, _) = NewSide::start(8, "msr2", greeting(), 0, T);
        assert_eq!(new.token(), None);
        let accepted = Message::Accepted {
            handoff_id: 8,
            token: Some("aa".into()),
            also_at: None,
        };
        new.handle(NewEvent::Message(accepted), 1);
        assert_eq!(
            new.token(),
            Some("aa"),
            "replies from the hold on are tagged"
        );
        // Images without a token do not make the new MSR forget it.
        let images = Message::Images {
            handoff_id: 8,
            images: vec![],
            token: None,
            closed: vec![],
            staying: Vec::new(),
            mac: None,
        };
        new.handle(NewEvent::Message(images), 2);
        assert_eq!(new.token(), Some("aa"));
    }

    #[test]
    fn a_refused_channel_attaches_the_mh_without_its_connections() {
        let (mut new, _) = NewSide::start(6, "msr2", greeting(), 0, T);
        let acts = new.handle_old_down("Connection refused");
        assert_eq!(acts.len(), 1, "{acts:?}");
        let r = log(&acts);
        assert_eq!(r.outcome, Outcome::OldDown);
        assert!(r.reason.unwrap().contains("refused"));
        assert!(new.done());
        // Once the old MSR has answered, a lost channel is a rollback as before.
        let (mut new, _) = NewSide::start(7, "msr2", greeting(), 0, T);
        new.handle(
            NewEvent::Message(Message::Accepted {
                handoff_id: 7,
                token: None,
                also_at: None,
            }),
            1,
        );
        assert_eq!(
            log(&new.handle_old_down("Connection refused")).outcome,
            Outcome::RolledBack
        );
    }

    #[test]
    fn new_msr_times_out_at_its_own_deadline_and_keeps_the_mh_from_its_kernel() {
        let mh = greeting().mh;
        let (mut new, _) = NewSide::start(5, "msr2", greeting(), 0, T);
        assert_eq!(new.poll_timeout(), Some(1000));
        // Too early: nothing.
        assert!(new.handle_timeout(999).is_empty());
        // Unrelated messages do not move the deadline.
        new.handle(
            NewEvent::Message(Message::Images {
                handoff_id: 7,
                images: vec![],
                token: None,
                closed: Vec::new(),
                staying: Vec::new(),
                mac: None,
            }),
            500,
        );
        new.handle(
            NewEvent::Message(Message::Accepted {
                handoff_id: 5,
                token: None,
                also_at: None,
            }),
            600,
        );
        assert_eq!(new.poll_timeout(), Some(1000));
        let acts = new.handle_timeout(1000);
        assert!(matches!(sent(&acts), Message::Abort { .. }));
        assert!(acts.contains(&Action::Quarantine(mh)));
        assert!(!acts.contains(&Action::Release(mh)));
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
        assert_eq!(new.poll_timeout(), None);
    }

    fn waiting_old() -> OldSide {
        let (mut old, _) = OldSide::start(
            "msr1",
            "msr2",
            1,
            Request::Greeting(&greeting()),
            known(),
            0,
            T,
        );
        assert_eq!(old.poll_timeout(), None);
        old.handle(OldEvent::Captured(vec![img(1), img(2)]), 1);
        old
    }

    /// The old MSR's deadline passed: it calls the handoff off and keeps waiting.
    fn calling_off() -> OldSide {
        let mut old = waiting_old();
        assert!(old.handle_timeout(5000).is_empty());
        let acts = old.handle_timeout(5001);
        assert_eq!(acts.len(), 1, "{acts:?}");
        assert!(matches!(sent(&acts), Message::Abort { handoff_id: 1, .. }));
        assert!(!old.done());
        assert_eq!(old.poll_timeout(), Some(5001 + CALL_OFF_WAIT_US));
        old
    }

    #[test]
    fn old_msr_rolls_back_when_the_new_one_stays_silent() {
        let mut old = calling_off();
        assert!(old.handle_timeout(5000 + CALL_OFF_WAIT_US).is_empty());
        let acts = old.handle_timeout(5001 + CALL_OFF_WAIT_US);
        assert_eq!(acts[0], Action::Unfreeze(greeting().mh));
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
        // Anything later changes nothing: the connections run here.
        let ack = Message::Ack {
            handoff_id: 1,
            restored: vec![1, 2],
            failed: vec![],
        };
        assert!(old.handle(OldEvent::Message(ack), 6000).is_empty());
    }

    /// The soak (30 minutes, seed 43): an acknowledgement 3 s late met an old MSR that
    /// had rolled back at its deadline; the connections ran at both MSRs, and the next
    /// move back found their 4-tuples taken ("Cannot assign requested address").
    #[test]
    fn a_late_acknowledgement_after_the_call_off_still_moves_the_connections() {
        let mut old = calling_off();
        let acts = old.handle(
            OldEvent::Message(Message::Ack {
                handoff_id: 1,
                restored: vec![1, 2],
                failed: vec![],
            }),
            3_000_000,
        );
        assert_eq!(acts[0], Action::Delete(vec![1, 2]));
        assert!(!acts.contains(&Action::Unfreeze(greeting().mh)), "{acts:?}");
        assert_eq!(log(&acts).outcome, Outcome::Moved);
        assert!(old.done());
    }

    /// A new MSR (handoff 1) that has the old MSR's `images` and restores them.
    fn restoring(images: Vec<ConnImage>) -> NewSide {
        let (mut new, _) = NewSide::start(1, "msr2", greeting(), 0, T);
        let accepted = Message::Accepted {
            handoff_id: 1,
            token: None,
            also_at: None,
        };
        new.handle(NewEvent::Message(accepted), 1);
        let images = Message::Images {
            handoff_id: 1,
            images,
            token: None,
            closed: vec![],
            staying: vec![],
            mac: None,
        };
        let acts = new.handle(NewEvent::Message(images), 2);
        assert!(matches!(acts[..], [Action::Restore(_)]), "{acts:?}");
        new
    }

    /// The old MSR's call-off of handoff `id`.
    fn call_off(id: u64) -> Message {
        Message::Abort {
            handoff_id: id,
            reason: "no acknowledgement in time".into(),
        }
    }

    #[test]
    fn a_call_off_heard_before_the_restart_discards_the_restored_copies() {
        let mh = greeting().mh;
        let mut old = calling_off();
        let mut new = restoring(vec![img(1), img(2)]);
        // The old MSR's call-off, read once the restore is done.
        assert!(new.handle(NewEvent::Message(call_off(1)), 3).is_empty());
        let acts = new.handle(
            NewEvent::Restored {
                restored: vec![1],
                failed: vec![(2, "bad image".into())],
            },
            4,
        );
        assert_eq!(acts[0], Action::Discard(vec![1]));
        assert!(!acts
            .iter()
            .any(|a| matches!(a, Action::Restart(_) | Action::Reroute(_) | Action::Gate(_))));
        assert!(acts.contains(&Action::Quarantine(mh)));
        let ack = sent(&acts);
        match &ack {
            Message::Ack {
                restored, failed, ..
            } => {
                assert!(restored.is_empty());
                assert_eq!(failed.len(), 2, "{failed:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
        assert!(new.done());
        // The old MSR keeps everything and takes the MH back.
        let acts = old.handle(OldEvent::Message(ack), 5);
        assert!(acts.contains(&Action::Unfreeze(mh)));
        assert!(!acts.iter().any(|a| matches!(a, Action::Delete(_))));
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
    }

    #[test]
    fn a_call_off_after_the_restart_changes_nothing_at_the_new_msr() {
        let mut new = restoring(vec![img(1)]);
        let acts = new.handle(
            NewEvent::Restored {
                restored: vec![1],
                failed: vec![],
            },
            3,
        );
        assert!(acts.contains(&Action::Restart(vec![1])));
        assert!(new.handle(NewEvent::Message(call_off(1)), 4).is_empty());
        let acts = new.handle(
            NewEvent::Restarted {
                resumed: vec![1],
                failed: vec![],
            },
            5,
        );
        let ack = sent(&acts);
        assert!(matches!(ack, Message::Ack { ref restored, .. } if restored == &vec![1]));
        assert_eq!(log(&acts).outcome, Outcome::Moved);
        assert!(new.done() && new.acknowledged());
        // A call-off that crossed the acknowledgement (the soak, seed 37: the channel
        // cut for 1.6 s, the acknowledgement held up past the old MSR's deadline) is
        // answered with the acknowledgement again.
        let acts = new.handle(NewEvent::Message(call_off(1)), 6);
        assert_eq!(acts, vec![Action::Send(ack)]);
        assert!(new.handle(NewEvent::Message(call_off(2)), 7).is_empty());
    }

    #[test]
    fn a_failed_capture_aborts_and_unfreezes() {
        let (mut old, _) = OldSide::start(
            "msr1",
            "msr2",
            1,
            Request::Greeting(&greeting()),
            known(),
            0,
            T,
        );
        let acts = old.handle(OldEvent::CaptureFailed("changed".into()), 1);
        assert!(matches!(sent(&acts), Message::Abort { .. }));
        assert!(acts.contains(&Action::Unfreeze(greeting().mh)));
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
        assert!(old.done());
    }

    #[test]
    fn when_nothing_resumes_the_old_msr_keeps_everything_and_takes_the_mh_back() {
        let mh = greeting().mh;
        let (mut new, _) = NewSide::start(3, "msr2", greeting(), 0, T);
        new.handle(
            NewEvent::Message(Message::Accepted {
                handoff_id: 3,
                token: None,
                also_at: None,
            }),
            1,
        );
        new.handle(
            NewEvent::Message(Message::Images {
                handoff_id: 3,
                images: vec![img(1)],
                token: None,
                closed: Vec::new(),
                staying: Vec::new(),
                mac: None,
            }),
            2,
        );
        new.handle(
            NewEvent::Restored {
                restored: vec![1],
                failed: vec![],
            },
            3,
        );
        let acts = new.handle(
            NewEvent::Restarted {
                resumed: vec![],
                failed: vec![(1, "restart: injected".into())],
            },
            4,
        );
        assert!(acts.contains(&Action::Unroute(mh)));
        assert!(acts.contains(&Action::Quarantine(mh)));
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
        assert_eq!(log(&acts).failed.len(), 1);
        let (mut old, _) = OldSide::start(
            "msr1",
            "msr2",
            3,
            Request::Greeting(&greeting()),
            known(),
            0,
            T,
        );
        old.handle(OldEvent::Captured(vec![img(1)]), 1);
        let acts = old.handle(OldEvent::Message(sent(&acts)), 5);
        assert_eq!(&acts[..2], &[Action::Unfreeze(mh), Action::Reroute(mh)]);
        assert!(!acts.iter().any(|a| matches!(a, Action::Delete(_))));
        assert_eq!(log(&acts).failed.len(), 1, "the failure is on record");
    }

    #[test]
    fn a_connection_that_fails_to_restart_is_not_acknowledged_and_stays_at_the_old_msr() {
        let mh = greeting().mh;
        let (mut new, _) = NewSide::start(3, "msr2", greeting(), 0, T);
        new.handle(
            NewEvent::Message(Message::Accepted {
                handoff_id: 3,
                token: None,
                also_at: None,
            }),
            1,
        );
        new.handle(
            NewEvent::Message(Message::Images {
                handoff_id: 3,
                images: vec![img(1), img(2), img(3)],
                token: None,
                closed: Vec::new(),
                staying: Vec::new(),
                mac: None,
            }),
            2,
        );
        new.handle(
            NewEvent::Restored {
                restored: vec![1, 2],
                failed: vec![(3, "bind: address in use".into())],
            },
            3,
        );
        let acts = new.handle(
            NewEvent::Restarted {
                resumed: vec![1],
                failed: vec![(2, "restart: injected".into())],
            },
            4,
        );
        let Message::Ack {
            restored, failed, ..
        } = sent(&acts)
        else {
            panic!()
        };
        assert_eq!(restored, vec![1]);
        assert_eq!(failed.len(), 2);
        assert_eq!(log(&acts).outcome, Outcome::Partial);
        let (mut old, _) = OldSide::start(
            "msr1",
            "msr2",
            3,
            Request::Greeting(&greeting()),
            known(),
            0,
            T,
        );
        old.handle(OldEvent::Captured(vec![img(1), img(2), img(3)]), 1);
        let acts = old.handle(OldEvent::Message(sent(&acts)), 5);
        assert_eq!(acts[0], Action::Delete(vec![1]));
        assert!(acts.contains(&Action::Unfreeze(mh)));
        let r = log(&acts);
        assert_eq!(r.outcome, Outcome::Partial);
        assert_eq!(r.failed.len(), 2, "the failures are on record: {r:?}");
    }

    #[test]
    fn a_connection_that_cannot_be_captured_stays_and_the_rest_move() {
        let mh = greeting().mh;
        let (mut old, _) = OldSide::start(
            "msr1",
            "msr2",
            4,
            Request::Greeting(&greeting()),
            known(),
            0,
            T,
        );
        assert!(old
            .handle(OldEvent::Uncaptured(vec![(3, "urgent data".into())]), 1)
            .is_empty());
        let acts = old.handle(OldEvent::Captured(vec![img(1), img(2)]), 1);
        let Message::Images { images, .. } = sent(&acts) else {
            panic!("{acts:?}")
        };
        assert_eq!(images.len(), 2, "only the captured ones go");
        let ack = Message::Ack {
            handoff_id: 4,
            restored: vec![1, 2],
            failed: vec![],
        };
        let acts = old.handle(OldEvent::Message(ack), 5);
        assert_eq!(acts[0], Action::Delete(vec![1, 2]));
        assert!(
            acts.contains(&Action::Unfreeze(mh)),
            "the stuck one resumes here"
        );
        let r = log(&acts);
        assert_eq!(r.outcome, Outcome::Partial);
        assert_eq!(r.failed, vec![(3, "urgent data".to_string())]);
    }
}
