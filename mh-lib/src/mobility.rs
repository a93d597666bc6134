//! Movement detection for the MH's mobility agent, sans-IO.
//!
//! Every MSR advertises itself on its cell (a [`Beacon`] every interval, default 1 s,
//! valid for `lifetime_ms`). The [`Detector`] turns the beacons the MH hears into
//! decisions, with the two policies seed 003 compares:
//!
//! * **eager** — move on the first beacon of an MSR that was not being heard (it just
//!   came into range), without waiting for the current MSR to fade;
//! * **lazy** — stay until the current MSR's advertisement expires, then move to the
//!   MSR heard most recently.
//!
//! Hysteresis: after a move, no eager move for `hysteresis` (an MH at a cell edge must
//! not ping-pong); an expired current MSR always allows a move.
//!
//! An MH need not wait for the next beacon: when its link comes up in a new cell the
//! agent solicits one ([`Solicitor`], docs/architecture.md §7), and the answer goes through the
//! same [`Detector`].

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use itcp_proto::beacon::Beacon;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
/// When to move (seed 003: eager vs lazy cell switching).
pub enum Policy {
    /// Move on the first beacon of a newly heard MSR.
    Eager,
    /// Move only once the current MSR's advertisement has expired.
    Lazy,
}

/// What the agent should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Point the gateway at `to` and greet it (naming `from`, the previous MSR).
    Move {
        /// The MSR being left (none at the first attachment).
        from: Option<String>,
        /// The MSR to move to.
        to: String,
    },
    /// The current MSR expired and no other is heard: disconnected.
    Lost {
        /// The MSR that faded.
        from: String,
    },
}

#[derive(Debug, Clone)]
struct Heard {
    last_ns: u64,
    lifetime_ns: u64,
}

/// Turns heard beacons into move decisions; see the module docs.
#[derive(Debug, Clone)]
pub struct Detector {
    policy: Policy,
    interval_ns: u64,
    hysteresis_ns: u64,
    current: Option<String>,
    last_move_ns: Option<u64>,
    heard: HashMap<String, Heard>,
    lost_reported: bool,
}

impl Detector {
    /// A detector for beacons sent every `interval`.
    pub fn new(policy: Policy, interval: Duration, hysteresis: Duration) -> Self {
        Self {
            policy,
            interval_ns: interval.as_nanos() as u64,
            hysteresis_ns: hysteresis.as_nanos() as u64,
            current: None,
            last_move_ns: None,
            heard: HashMap::new(),
            lost_reported: false,
        }
    }

    /// Back to `msr` after a move to another MSR failed (the connections stayed there).
    pub fn set_current(&mut self, msr: &str) {
        self.current = Some(msr.to_string());
    }

    /// The MSR the MH is attached to.
    pub fn current(&self) -> Option<&str> {
        self.current.as_deref()
    }

    /// True if a beacon of `msr` was heard within its lifetime before `now`.
    pub fn alive(&self, msr: &str, now: u64) -> bool {
        self.heard
            .get(msr)
            .is_some_and(|h| now.saturating_sub(h.last_ns) <= h.lifetime_ns)
    }

    fn move_to(&mut self, now: u64, to: &str) -> Decision {
        let from = self.current.replace(to.to_string());
        self.last_move_ns = Some(now);
        self.lost_reported = false;
        Decision::Move {
            from,
            to: to.to_string(),
        }
    }

    /// The MH's link went down (carrier lost: it is in no cell). Every MSR but the
    /// current one is out of range: forget them, so that none is moved to when the
    /// current one's advertisement expires (that is a loss), and the next beacon of any
    /// of them is a fresh arrival. The current one expires as usual.
    pub fn link_lost(&mut self) {
        let cur = self.current.clone();
        self.heard.retain(|m, _| Some(m) == cur.as_ref());
    }

    /// A beacon arrived at `now` (ns on a monotonic clock).
    pub fn on_beacon(&mut self, now: u64, b: &Beacon) -> Option<Decision> {
        let prev = self.heard.insert(
            b.msr.clone(),
            Heard {
                last_ns: now,
                lifetime_ns: b.lifetime_ms * 1_000_000,
            },
        );
        if self.current.as_deref() == Some(b.msr.as_str()) {
            self.lost_reported = false;
            return None;
        }
        let Some(cur) = self.current.clone() else {
            return Some(self.move_to(now, &b.msr));
        };
        if !self.alive(&cur, now) {
            return Some(self.move_to(now, &b.msr));
        }
        if self.policy == Policy::Lazy {
            return None;
        }
        // Eager: a fresh arrival (missed 1.5 intervals or never heard), outside the
        // hysteresis period after the last move.
        let fresh = prev.is_none_or(|h| now.saturating_sub(h.last_ns) > self.interval_ns * 3 / 2);
        let settled = self
            .last_move_ns
            .is_none_or(|t| now.saturating_sub(t) >= self.hysteresis_ns);
        (fresh && settled).then(|| self.move_to(now, &b.msr))
    }

    /// Time passed: expiry of the current MSR (lazy moves, or loss of contact).
    pub fn on_tick(&mut self, now: u64) -> Option<Decision> {
        let cur = self.current.clone()?;
        if self.alive(&cur, now) {
            return None;
        }
        let best = self
            .heard
            .iter()
            .filter(|(m, h)| **m != cur && now.saturating_sub(h.last_ns) <= h.lifetime_ns)
            .max_by_key(|(_, h)| h.last_ns)
            .map(|(m, _)| m.clone());
        match best {
            Some(to) => Some(self.move_to(now, &to)),
            None if !self.lost_reported => {
                self.lost_reported = true;
                Some(Decision::Lost { from: cur })
            }
            None => None,
        }
    }
}

/// When to solicit an advertisement (docs/architecture.md §7): on link-up, at once and then
/// `repeats` more times `spacing` apart, until any beacon is heard or the link goes
/// down again. A lost solicitation or a lost answer costs `spacing`, not a beacon
/// interval.
#[derive(Debug, Clone)]
pub struct Solicitor {
    spacing_ns: u64,
    repeats: u32,
    /// Solicitations still to send in this burst.
    left: u32,
    next_ns: u64,
    seq: u64,
}

impl Solicitor {
    /// A solicitor that sends 1 + `repeats` solicitations per link-up, `spacing` apart.
    pub fn new(repeats: u32, spacing: Duration) -> Self {
        Self {
            spacing_ns: spacing.as_nanos() as u64,
            repeats,
            left: 0,
            next_ns: 0,
            seq: 0,
        }
    }

    /// The link came up at `now`: start a burst (replacing one under way).
    pub fn link_up(&mut self, now: u64) {
        self.left = 1 + self.repeats;
        self.next_ns = now;
    }

    /// The link went down: nobody would hear us.
    pub fn link_down(&mut self) {
        self.left = 0;
    }

    /// A beacon arrived: an MSR answered (or advertised anyway), stop soliciting.
    pub fn on_beacon(&mut self) {
        self.left = 0;
    }

    /// When the next solicitation is due, if one is.
    pub fn next_due(&self) -> Option<u64> {
        (self.left > 0).then_some(self.next_ns)
    }

    /// If a solicitation is due at `now`, its sequence number (send it now).
    pub fn poll(&mut self, now: u64) -> Option<u64> {
        if self.left == 0 || now < self.next_ns {
            return None;
        }
        self.left -= 1;
        self.next_ns = now + self.spacing_ns;
        self.seq += 1;
        Some(self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn b(msr: &str) -> Beacon {
        Beacon {
            msr: msr.into(),
            mac: "02:00:00:00:01:01".into(),
            lifetime_ms: 3000,
            seq: 0,
        }
    }

    fn det(p: Policy) -> Detector {
        Detector::new(p, Duration::from_secs(1), Duration::from_secs(2))
    }

    #[test]
    fn first_beacon_attaches() {
        let mut d = det(Policy::Lazy);
        assert_eq!(
            d.on_beacon(0, &b("msr1")),
            Some(Decision::Move {
                from: None,
                to: "msr1".into()
            })
        );
        assert_eq!(d.on_beacon(S, &b("msr1")), None);
    }

    #[test]
    fn eager_moves_on_arrival_and_does_not_ping_pong() {
        let mut d = det(Policy::Eager);
        d.on_beacon(0, &b("msr1"));
        for t in 1..10 {
            d.on_beacon(t * S, &b("msr1"));
        }
        // Overlap: msr2 appears at 10.3 s.
        assert_eq!(
            d.on_beacon(10 * S + S / 3, &b("msr2")),
            Some(Decision::Move {
                from: Some("msr1".into()),
                to: "msr2".into()
            })
        );
        // msr1 is still heard during the overlap: it is not an arrival.
        assert_eq!(d.on_beacon(11 * S, &b("msr1")), None);
        assert_eq!(d.on_beacon(12 * S, &b("msr1")), None);
    }

    #[test]
    fn eager_respects_hysteresis() {
        let mut d = det(Policy::Eager);
        d.on_beacon(0, &b("msr1"));
        d.on_beacon(S / 2, &b("msr2")); // fresh, but within 2 s of the first move
        assert_eq!(d.current(), Some("msr1"));
        d.on_beacon(S, &b("msr1"));
        // msr3 arrives after the hysteresis period.
        assert!(d.on_beacon(3 * S, &b("msr3")).is_some());
    }

    #[test]
    fn lazy_waits_for_expiry() {
        let mut d = det(Policy::Lazy);
        d.on_beacon(0, &b("msr1"));
        d.on_beacon(S, &b("msr1"));
        // The MH leaves cell 1 at 1.5 s and hears msr2 from 2 s on.
        for t in 2..=4 {
            assert_eq!(
                d.on_beacon(t * S, &b("msr2")),
                None,
                "lazy must not move at {t} s"
            );
            assert_eq!(d.on_tick(t * S), None);
        }
        // msr1's advertisement (heard at 1 s, lifetime 3 s) expires after 4 s.
        assert_eq!(
            d.on_tick(4 * S + S / 10),
            Some(Decision::Move {
                from: Some("msr1".into()),
                to: "msr2".into()
            })
        );
    }

    #[test]
    fn solicitations_burst_on_link_up_until_a_beacon() {
        const MS: u64 = 1_000_000;
        let mut s = Solicitor::new(2, Duration::from_millis(20));
        assert_eq!((s.next_due(), s.poll(0)), (None, None));
        s.link_up(100 * MS);
        assert_eq!(s.next_due(), Some(100 * MS));
        assert_eq!(s.poll(99 * MS), None);
        assert_eq!(s.poll(100 * MS), Some(1));
        assert_eq!(s.poll(100 * MS), None);
        assert_eq!(s.next_due(), Some(120 * MS));
        assert_eq!(s.poll(121 * MS), Some(2));
        assert_eq!(s.poll(141 * MS), Some(3));
        // Three in all.
        assert_eq!((s.poll(500 * MS), s.next_due()), (None, None));
        // A beacon stops the burst; so does the link going down.
        s.link_up(600 * MS);
        assert_eq!(s.poll(600 * MS), Some(4));
        s.on_beacon();
        assert_eq!((s.poll(700 * MS), s.next_due()), (None, None));
        s.link_up(800 * MS);
        s.link_down();
        assert_eq!(s.poll(800 * MS), None);
    }

    #[test]
    fn after_a_carrier_loss_only_new_beacons_count() {
        let mut d = det(Policy::Eager);
        d.on_beacon(0, &b("msr1"));
        // Overlap: msr2 heard, but no move within the hysteresis period.
        d.on_beacon(S, &b("msr2"));
        d.on_beacon(S + S / 2, &b("msr1"));
        d.on_beacon(S + S / 2 + 10, &b("msr2"));
        assert_eq!(d.current(), Some("msr1"));
        // The MH loses its link: msr2, heard last, must not be moved to when msr1
        // expires; that is a loss.
        d.link_lost();
        assert_eq!(
            d.on_tick(5 * S),
            Some(Decision::Lost {
                from: "msr1".into()
            })
        );
        // Back in msr1's cell shortly after: a fresh arrival, even though msr1 was
        // heard within 1.5 intervals before the loss (no hysteresis here).
        let mut d = Detector::new(Policy::Eager, Duration::from_secs(1), Duration::ZERO);
        d.on_beacon(0, &b("msr1"));
        d.on_beacon(2 * S, &b("msr1"));
        d.on_beacon(2 * S + 100, &b("msr2")); // overlap: moves to the newcomer
        assert_eq!(d.current(), Some("msr2"));
        d.on_beacon(2 * S + 200, &b("msr1")); // still heard: no move back
        assert_eq!(d.current(), Some("msr2"));
        d.link_lost();
        assert!(
            d.on_beacon(2 * S + S / 2, &b("msr1")).is_some(),
            "fresh again"
        );
    }

    #[test]
    fn losing_every_msr_is_reported_once() {
        let mut d = det(Policy::Eager);
        d.on_beacon(0, &b("msr1"));
        assert_eq!(
            d.on_tick(4 * S),
            Some(Decision::Lost {
                from: "msr1".into()
            })
        );
        assert_eq!(d.on_tick(5 * S), None);
        // Back in range: an expired current MSR always allows the move.
        assert!(d.on_beacon(6 * S, &b("msr2")).is_some());
    }
}
