//! The handoff between two MSRs as plain state machines (paper §5.4, steps 2–10), with
//! no sockets, clocks or syscalls: the daemon feeds events in and carries the actions
//! out (install a flow hold, freeze and capture sockets, send a message, restore,
//! reroute, delete, roll back). Tests drive both sides against each other.
//!
//! New MSR: greeting → hold the MH's flows, ask the old MSR → images → restore and
//! restart → reroute the MH to us, release the holds, acknowledge.
//! Old MSR: request (proof checked against the MH's session token) → freeze and capture
//! → send images → acknowledgement → delete the old copies silently. If the
//! acknowledgement does not come in time (or an abort does), unfreeze and keep serving:
//! no connection is lost because a handoff failed.

use std::net::IpAddr;

use crate::log::{Outcome, Phases, Record, Role};
use itcp_proto::channel::{ConnImage, Message};
use itcp_proto::greeting::Greeting;

/// What the daemon must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Hold (queue or drop, never answer) every packet of this MH's I-TCP flows until
    /// released; re-create its listeners.
    Hold(IpAddr),
    Release(IpAddr),
    /// Block the MH's flows at the netfilter level, then capture every socket of its
    /// connections (the daemon answers with [`OldEvent::Captured`]).
    FreezeAndCapture(IpAddr),
    /// Leave repair mode and unblock: the old MSR keeps serving (rollback).
    Unfreeze(IpAddr),
    /// Close the frozen copies while still in repair mode (no FIN, no RST).
    Delete(Vec<u64>),
    /// Restore and restart these connections (the daemon answers with
    /// [`NewEvent::Restored`]).
    Restore(Vec<ConnImage>),
    /// Make the fixed network deliver the MH's traffic here (proxy ARP + gratuitous ARP).
    Reroute(IpAddr),
    /// Send to the other MSR.
    Send(Message),
    /// One handoff log record.
    Log(Record),
}

/// Phases are stamped in µs since the UNIX epoch (`now_us` everywhere).
fn now_phase(p: &mut Option<u64>, now_us: u64) {
    *p = Some(now_us);
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
    Timeout,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum NewState {
    WaitingImages,
    Restoring,
    Done,
}

/// The new MSR's side of one handoff.
#[derive(Debug, Clone)]
pub struct NewSide {
    pub handoff_id: u64,
    me: String,
    greeting: Greeting,
    state: NewState,
    phases: Phases,
    images: Vec<ConnImage>,
    token: Option<String>,
}

impl NewSide {
    /// An MH greeted us (the proof is checked by the old MSR, which holds the token).
    pub fn start(
        handoff_id: u64,
        me: &str,
        greeting: Greeting,
        now_us: u64,
    ) -> (NewSide, Vec<Action>) {
        let mut phases = Phases::default();
        now_phase(&mut phases.greeting, now_us);
        now_phase(&mut phases.mh_in, now_us);
        let mh = greeting.mh;
        let s = NewSide {
            handoff_id,
            me: me.into(),
            greeting: greeting.clone(),
            state: NewState::WaitingImages,
            phases,
            images: Vec::new(),
            token: None,
        };
        let acts = vec![
            Action::Hold(mh),
            Action::Send(Message::HandoffRequest {
                handoff_id,
                greeting,
            }),
        ];
        (s, acts)
    }

    pub fn done(&self) -> bool {
        self.state == NewState::Done
    }

    /// The MH's session token as the old MSR sent it (hex), once the images are in.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The greeting this handoff started with.
    pub fn greeting(&self) -> &Greeting {
        &self.greeting
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
            mh: self.greeting.mh,
            old_msr: self.greeting.prev_msr.clone(),
            new_msr: self.me.clone(),
            outcome,
            reason,
            connections: Vec::new(),
            failed,
            phases: self.phases.clone(),
        }
    }

    fn give_up(&mut self, reason: String) -> Vec<Action> {
        self.state = NewState::Done;
        vec![
            Action::Release(self.greeting.mh),
            Action::Log(self.record(Outcome::RolledBack, Some(reason), vec![])),
        ]
    }

    pub fn handle(&mut self, ev: NewEvent, now_us: u64) -> Vec<Action> {
        match (&self.state, ev) {
            (
                NewState::WaitingImages,
                NewEvent::Message(Message::Images {
                    handoff_id,
                    images,
                    token,
                }),
            ) if handoff_id == self.handoff_id => {
                now_phase(&mut self.phases.images_sent, now_us);
                self.token = token;
                self.state = NewState::Restoring;
                self.images = images.clone();
                vec![Action::Restore(images)]
            }
            (NewState::Restoring, NewEvent::Restored { restored, failed }) => {
                now_phase(&mut self.phases.restored, now_us);
                now_phase(&mut self.phases.resumed, now_us);
                now_phase(&mut self.phases.acknowledged, now_us);
                self.state = NewState::Done;
                let outcome = if failed.is_empty() {
                    Outcome::Moved
                } else {
                    Outcome::Partial
                };
                vec![
                    Action::Reroute(self.greeting.mh),
                    Action::Release(self.greeting.mh),
                    Action::Send(Message::Ack {
                        handoff_id: self.handoff_id,
                        restored,
                        failed: failed.clone(),
                    }),
                    Action::Log(self.record(outcome, None, failed)),
                ]
            }
            (NewState::WaitingImages, NewEvent::Message(Message::Abort { handoff_id, reason }))
                if handoff_id == self.handoff_id =>
            {
                self.give_up(format!("old MSR refused: {reason}"))
            }
            (NewState::WaitingImages, NewEvent::Timeout) => {
                self.give_up("old MSR did not send the images in time".into())
            }
            // Anything else (late or duplicate messages) changes nothing.
            _ => vec![],
        }
    }
}

/// Events at the old MSR.
#[derive(Debug, Clone)]
pub enum OldEvent {
    /// Our sockets, frozen and captured.
    Captured(Vec<ConnImage>),
    /// A socket could not be captured: the handoff is off (moving only some of the
    /// MH's connections would strand the rest here).
    CaptureFailed(String),
    Message(Message),
    Timeout,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum OldState {
    Capturing,
    WaitingAck,
    Done,
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
    ids: Vec<u64>,
    token: Option<String>,
}

impl OldSide {
    /// A handoff request arrived from `from` (already authenticated as that peer).
    /// `token` is the session token the MH presented when it opened its connections
    /// here; None if we serve no connection of this MH.
    pub fn start(
        me: &str,
        from: &str,
        handoff_id: u64,
        greeting: &Greeting,
        token: Option<&[u8]>,
        now_us: u64,
    ) -> (OldSide, Vec<Action>) {
        let mut s = OldSide {
            handoff_id,
            me: me.into(),
            new_msr: from.into(),
            mh: greeting.mh,
            state: OldState::Capturing,
            phases: Phases::default(),
            ids: Vec::new(),
            token: token.map(itcp_proto::hex::hex),
        };
        now_phase(&mut s.phases.mh_in, now_us);
        let refuse = |s: &mut OldSide, reason: &str| {
            s.state = OldState::Done;
            vec![
                Action::Send(Message::Abort {
                    handoff_id,
                    reason: reason.into(),
                }),
                Action::Log(s.record(Outcome::Rejected, Some(reason.into()))),
            ]
        };
        let acts = if greeting.new_msr != from || greeting.prev_msr != me {
            refuse(
                &mut s,
                "greeting names other MSRs than the ones exchanging it",
            )
        } else if let Some(t) = token {
            if greeting.verify(t) {
                now_phase(&mut s.phases.freeze, now_us);
                vec![Action::FreezeAndCapture(greeting.mh)]
            } else {
                refuse(
                    &mut s,
                    "greeting proof does not match the MH's session token",
                )
            }
        } else {
            refuse(&mut s, "no I-TCP connection of this MH here")
        };
        (s, acts)
    }

    pub fn done(&self) -> bool {
        self.state == OldState::Done
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
        }
    }

    fn roll_back(&mut self, reason: String) -> Vec<Action> {
        self.state = OldState::Done;
        vec![
            Action::Unfreeze(self.mh),
            Action::Log(self.record(Outcome::RolledBack, Some(reason))),
        ]
    }

    pub fn handle(&mut self, ev: OldEvent, now_us: u64) -> Vec<Action> {
        match (&self.state, ev) {
            (OldState::Capturing, OldEvent::Captured(images)) => {
                now_phase(&mut self.phases.images_sent, now_us);
                self.ids = images.iter().map(|i| i.id).collect();
                self.state = OldState::WaitingAck;
                vec![Action::Send(Message::Images {
                    handoff_id: self.handoff_id,
                    images,
                    token: self.token.clone(),
                })]
            }
            (
                OldState::WaitingAck,
                OldEvent::Message(Message::Ack {
                    handoff_id,
                    restored,
                    failed,
                }),
            ) if handoff_id == self.handoff_id => {
                now_phase(&mut self.phases.acknowledged, now_us);
                self.state = OldState::Done;
                let mut acts = vec![Action::Delete(restored)];
                let outcome = if failed.is_empty() {
                    Outcome::Moved
                } else {
                    // What the new MSR could not restore is lost unless we keep it:
                    // those stay frozen here and are resumed.
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
                OldState::WaitingAck | OldState::Capturing,
                OldEvent::Message(Message::Abort { handoff_id, reason }),
            ) if handoff_id == self.handoff_id => {
                self.roll_back(format!("new MSR aborted: {reason}"))
            }
            (OldState::WaitingAck | OldState::Capturing, OldEvent::Timeout) => {
                self.roll_back("new MSR did not confirm in time".into())
            }
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &[u8] = b"the MH's token..";

    fn greeting() -> Greeting {
        Greeting::new(
            TOKEN,
            "10.2.0.100".parse().unwrap(),
            "msr1",
            "msr2",
            1,
            [1; 16],
        )
    }

    fn img(id: u64) -> ConnImage {
        ConnImage {
            id,
            kind: "connect".into(),
            wireless: "00".into(),
            fixed: "00".into(),
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

    #[test]
    fn both_sides_complete_a_handoff() {
        let mh = greeting().mh;
        let (mut new, acts) = NewSide::start(9, "msr2", greeting(), 100);
        assert_eq!(acts[0], Action::Hold(mh));
        let Message::HandoffRequest {
            handoff_id,
            greeting: g,
        } = sent(&acts)
        else {
            panic!()
        };
        let (mut old, acts) = OldSide::start("msr1", "msr2", handoff_id, &g, Some(TOKEN), 101);
        assert_eq!(acts, vec![Action::FreezeAndCapture(mh)]);
        let acts = old.handle(OldEvent::Captured(vec![img(1), img(2)]), 102);
        let images = sent(&acts);
        let acts = new.handle(NewEvent::Message(images), 103);
        assert_eq!(acts, vec![Action::Restore(vec![img(1), img(2)])]);
        let acts = new.handle(
            NewEvent::Restored {
                restored: vec![1, 2],
                failed: vec![],
            },
            110,
        );
        assert_eq!(&acts[..2], &[Action::Reroute(mh), Action::Release(mh)]);
        assert_eq!(log(&acts).outcome, Outcome::Moved);
        assert_eq!(log(&acts).duration_us(), Some(10));
        let acts = old.handle(OldEvent::Message(sent(&acts)), 111);
        assert_eq!(acts[0], Action::Delete(vec![1, 2]));
        assert_eq!(log(&acts).outcome, Outcome::Moved);
        assert!(new.done() && old.done());
    }

    #[test]
    fn a_greeting_without_valid_proof_is_refused() {
        let (_, acts) =
            OldSide::start("msr1", "msr2", 1, &greeting(), Some(b"some other token"), 0);
        assert!(matches!(sent(&acts), Message::Abort { .. }));
        assert_eq!(log(&acts).outcome, Outcome::Rejected);
        assert!(!acts
            .iter()
            .any(|a| matches!(a, Action::FreezeAndCapture(_))));
        // No connections of that MH here at all.
        let (_, acts) = OldSide::start("msr1", "msr2", 1, &greeting(), None, 0);
        assert_eq!(log(&acts).outcome, Outcome::Rejected);
        // A greeting meant for another pair of MSRs.
        let (_, acts) = OldSide::start("msr1", "msr3", 1, &greeting(), Some(TOKEN), 0);
        assert_eq!(log(&acts).outcome, Outcome::Rejected);
    }

    #[test]
    fn old_msr_rolls_back_when_the_new_one_goes_silent() {
        let (mut old, _) = OldSide::start("msr1", "msr2", 1, &greeting(), Some(TOKEN), 0);
        old.handle(OldEvent::Captured(vec![img(1)]), 1);
        let acts = old.handle(OldEvent::Timeout, 5000);
        assert_eq!(acts[0], Action::Unfreeze(greeting().mh));
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
        // A late ack changes nothing: the connection stays here.
        assert!(old
            .handle(
                OldEvent::Message(Message::Ack {
                    handoff_id: 1,
                    restored: vec![1],
                    failed: vec![]
                }),
                6000
            )
            .is_empty());
    }

    #[test]
    fn new_msr_releases_its_hold_when_the_old_one_refuses_or_times_out() {
        let mh = greeting().mh;
        let (mut new, _) = NewSide::start(4, "msr2", greeting(), 0);
        let acts = new.handle(
            NewEvent::Message(Message::Abort {
                handoff_id: 4,
                reason: "no".into(),
            }),
            1,
        );
        assert_eq!(acts[0], Action::Release(mh));
        let (mut new, _) = NewSide::start(5, "msr2", greeting(), 0);
        let acts = new.handle(NewEvent::Timeout, 1);
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
        // Images for another handoff are ignored.
        let (mut new, _) = NewSide::start(6, "msr2", greeting(), 0);
        assert!(new
            .handle(
                NewEvent::Message(Message::Images {
                    handoff_id: 7,
                    images: vec![],
                    token: None,
                }),
                1
            )
            .is_empty());
    }

    #[test]
    fn a_failed_capture_aborts_and_unfreezes() {
        let (mut old, _) = OldSide::start("msr1", "msr2", 1, &greeting(), Some(TOKEN), 0);
        let acts = old.handle(OldEvent::CaptureFailed("changed".into()), 1);
        assert!(matches!(sent(&acts), Message::Abort { .. }));
        assert!(acts.contains(&Action::Unfreeze(greeting().mh)));
        assert_eq!(log(&acts).outcome, Outcome::RolledBack);
        assert!(old.done());
    }

    #[test]
    fn partial_restore_keeps_the_rest_at_the_old_msr() {
        let (mut old, _) = OldSide::start("msr1", "msr2", 1, &greeting(), Some(TOKEN), 0);
        old.handle(OldEvent::Captured(vec![img(1), img(2)]), 1);
        let acts = old.handle(
            OldEvent::Message(Message::Ack {
                handoff_id: 1,
                restored: vec![1],
                failed: vec![(2, "bind: address in use".into())],
            }),
            2,
        );
        assert_eq!(acts[0], Action::Delete(vec![1]));
        assert!(acts.contains(&Action::Unfreeze(greeting().mh)));
        assert_eq!(log(&acts).outcome, Outcome::Partial);
    }
}
