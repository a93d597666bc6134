//! What an MSR does with an MH's greeting, decided without I/O.
//!
//! A greeting is a UDP datagram anyone on a cell can send with any source address, so
//! what it can cause is bounded by what it proves:
//!
//! * **Unproven** (no token bound here, or a proof that does not verify): a reply at
//!   most. It adds no proxy-ARP entry, sends no gratuitous ARP, installs and releases
//!   no hold, binds no token and changes no replay state. An MH's token is bound only
//!   through its SOCKS session (TCP from its own address on our cell), never by a
//!   greeting.
//! * **Proven here** (the MH's connections are here and the proof verifies under their
//!   token, with a timestamp newer than any accepted before): the MH is back with us —
//!   take its address over on the fixed LAN, release any hold. Unless the MH's
//!   connections left here for a peer since (a pull it never heard answered): then ask
//!   that peer for them with this greeting ([`Decision::Follow`]).
//! * **Naming a previous MSR** (a peer; also when some of the MH's connections are
//!   here after a partial handoff, once the proof verifies here): ask that MSR, which holds the token and checks the
//!   proof ([`crate::machine`]); nothing is held until it has. At most one pull per MH
//!   is in flight, and pulls are rate-limited per sender (link-layer source) and per
//!   MH; a pull whose proof the old MSR refused does not count against the MH
//!   ([`PullBudget`]).

use std::collections::HashMap;
use std::net::IpAddr;

use itcp_proto::greeting::Greeting;

/// What this MSR knows about the MH a greeting names.
#[derive(Debug, Clone, Copy, Default)]
pub struct MhView<'a> {
    /// The token the MH's connections here were opened with (bound over TCP).
    pub token: Option<&'a [u8]>,
    /// Connections of this MH served here.
    pub local: usize,
    /// Some of them are frozen for a handoff to another MSR right now.
    pub frozen: bool,
    /// A pull of this MH's connections from another MSR is under way here.
    pub pulling: bool,
    /// Timestamp of the newest proven greeting of this MH.
    pub last_greeting_ts: u64,
    /// The nonce of the last greeting answered (a retransmission gets the same answer).
    pub last_nonce: Option<&'a str>,
    /// The peer this MH's connections last left here for (none came back since).
    pub moved_to: Option<&'a str>,
}

/// The greeting's context beyond the MH: who sent it and what we are.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub me: &'a str,
    /// The datagram's source address is the MH's address the greeting names.
    pub from_mh: bool,
    /// That address is in our MH prefixes.
    pub is_mh: bool,
    /// `prev_msr` is a configured peer.
    pub prev_is_peer: bool,
    /// A pull for this MH is allowed by the rate limit now.
    pub pull_allowed: bool,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Meant for another MSR whose cell overlaps ours.
    Ignore,
    /// Not from the MH it names, or not an MH of ours: count, log (rate-limited), no
    /// reply.
    Drop(&'static str),
    /// A retransmission of the greeting answered last: repeat that answer.
    Repeat,
    /// A handoff of this MH's connections (away from us, or towards us) is under way:
    /// answer once it settles (the MH retransmits).
    Defer,
    /// Reply "attached". `proven`: the MH proved its token and is back with us — take
    /// its address over and release holds, and mark `ts_ms` used.
    Attach { proven: bool },
    /// Reply "refused" with the reason.
    Refuse(String),
    /// Ask `prev_msr` for the MH's connections.
    Pull,
    /// The MH names us as its last MSR, but its connections left here for this peer
    /// without its knowing (that peer's pull completed after the MH had come back):
    /// ask that peer for them, with this greeting.
    Follow(String),
}

/// Decides what to do with greeting `g`; see the module docs.
pub fn decide(g: &Greeting, cx: Context<'_>, mh: MhView<'_>) -> Decision {
    if g.new_msr != cx.me {
        return Decision::Ignore;
    }
    if !cx.from_mh || !cx.is_mh {
        return Decision::Drop("sender is not the MH it names, or not an MH of ours");
    }
    if mh.last_nonce == Some(g.nonce.as_str()) {
        return Decision::Repeat;
    }
    if mh.frozen || mh.pulling {
        return Decision::Defer;
    }
    let elsewhere = !g.prev_msr.is_empty() && g.prev_msr != cx.me;
    if let (false, Some(peer), Some(t)) = (elsewhere, mh.moved_to, mh.token) {
        // Back with us as far as the MH knows; its connections are at `peer`. The
        // proof is checked here first (and again there): an unproven greeting moves
        // nothing.
        if peer != cx.me && g.verify(t) && g.ts_ms > mh.last_greeting_ts {
            return if cx.pull_allowed {
                Decision::Follow(peer.into())
            } else {
                Decision::Defer
            };
        }
    }
    // With connections here and a peer named as the last MSR, the MH's connections
    // are split (some stayed here when a handoff was partial): pull the rest, once the
    // proof verifies here too.
    let split = elsewhere && mh.local > 0 && cx.prev_is_peer;
    if !elsewhere || mh.local > 0 {
        let proven = match (mh.token, mh.local) {
            (Some(t), _) if g.verify(t) && g.ts_ms > mh.last_greeting_ts => true,
            (Some(t), _) if g.verify(t) => return Decision::Refuse("greeting already used".into()),
            (Some(_), _) => {
                return Decision::Refuse("proof does not match the MH's session token".into())
            }
            // Nothing here to prove ownership of: an attachment with no effect.
            (None, 0) => false,
            (None, _) => {
                return Decision::Refuse(
                    "no session token of this MH here (its connections were opened \
                     without one): its agent registers it on attaching; until then \
                     they move only by network detection"
                        .into(),
                )
            }
        };
        if !split {
            return Decision::Attach { proven };
        }
    }
    if !cx.prev_is_peer {
        return Decision::Refuse(format!(
            "previous MSR {:?} is not a peer of {}",
            g.prev_msr, cx.me
        ));
    }
    if !cx.pull_allowed {
        return Decision::Defer;
    }
    Decision::Pull
}

/// A token bucket per key (an MH, a source address): `burst` events at once, then
/// `per_s` per second. Keys idle long enough to have refilled are forgotten, so the
/// table stays bounded by the keys active in the last `burst / per_s` seconds.
#[derive(Debug, Clone)]
pub struct RateLimit<K> {
    burst: f64,
    per_ms: f64,
    buckets: HashMap<K, (f64, u64)>,
    max_keys: usize,
}

impl<K: std::hash::Hash + Eq + Clone> RateLimit<K> {
    pub fn new(burst: u32, per_s: f64, max_keys: usize) -> Self {
        RateLimit {
            burst: burst as f64,
            per_ms: per_s / 1000.0,
            buckets: HashMap::new(),
            max_keys,
        }
    }

    fn level(&self, b: (f64, u64), now_ms: u64) -> f64 {
        (b.0 + now_ms.saturating_sub(b.1) as f64 * self.per_ms).min(self.burst)
    }

    /// Takes one event for `k` at `now_ms` if the bucket allows it.
    pub fn allow(&mut self, k: &K, now_ms: u64) -> bool {
        if !self.buckets.contains_key(k) && self.buckets.len() >= self.max_keys {
            let (burst, per_ms) = (self.burst, self.per_ms);
            self.buckets
                .retain(|_, b| b.0 + now_ms.saturating_sub(b.1) as f64 * per_ms < burst);
            if self.buckets.len() >= self.max_keys {
                return false; // Too many sources at once: refuse rather than grow.
            }
        }
        let b = self.buckets.get(k).copied().unwrap_or((self.burst, now_ms));
        let lvl = self.level(b, now_ms);
        let ok = lvl >= 1.0;
        self.buckets
            .insert(k.clone(), (if ok { lvl - 1.0 } else { lvl }, now_ms));
        ok
    }

    /// Gives back one event taken for `k` (what it paid for turned out not to count),
    /// up to the burst.
    pub fn refund(&mut self, k: &K, now_ms: u64) {
        if let Some(b) = self.buckets.get(k).copied() {
            let lvl = (self.level(b, now_ms) + 1.0).min(self.burst);
            self.buckets.insert(k.clone(), (lvl, now_ms));
        }
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

/// Rate limit for per-MH pulls and log lines: a type alias for the common key.
pub type PerAddr = RateLimit<IpAddr>;

/// Who asked for a pull at the link layer: the source MAC of the greeting's frame (or
/// of the detected packet), or its IP address when the frame was not seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sender {
    Mac([u8; 6]),
    Addr(IpAddr),
}

/// The budgets a pull is charged to. A greeting naming another MSR proves nothing
/// here (that MSR holds the token), so its pull is charged to its sender, and to the
/// MH only while the proof may still be good: a pull whose proof the old MSR refused
/// gives the MH's token back ([`PullBudget::refused`]). Greetings forged from an MH's
/// address by another station use up that station's budget, not the MH's.
#[derive(Debug, Clone)]
pub struct PullBudget {
    per_mh: PerAddr,
    per_sender: RateLimit<Sender>,
}

impl PullBudget {
    /// `burst` pulls at once per MH and per sender, then `per_s` per second.
    pub fn new(burst: u32, per_s: f64, max_keys: usize) -> Self {
        PullBudget {
            per_mh: PerAddr::new(burst, per_s, max_keys),
            per_sender: RateLimit::new(burst, per_s, max_keys),
        }
    }

    /// Takes one pull of `mh`'s connections asked for by `sender`, if both budgets
    /// allow it (the sender's first: one that is out of pulls takes nothing of the
    /// MH's).
    pub fn take(&mut self, mh: IpAddr, sender: Sender, now_ms: u64) -> bool {
        self.per_sender.allow(&sender, now_ms) && self.per_mh.allow(&mh, now_ms)
    }

    /// The old MSR refused a pull taken for `mh` (its proof, or link-layer address,
    /// did not verify there): it does not count against the MH.
    pub fn refused(&mut self, mh: IpAddr, now_ms: u64) {
        self.per_mh.refund(&mh, now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_pulls_of_a_forging_station_leave_the_mhs_budget_alone() {
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let (forger, genuine) = (
            Sender::Mac([2, 0, 0, 0, 0, 0x65]),
            Sender::Mac([2, 0, 0, 0, 0, 0x64]),
        );
        let mut b = PullBudget::new(5, 2.0, 4096);
        // 500 forged greetings a second for 3 s, each pull refused by the old MSR.
        let mut taken = 0;
        for t in (0..3000).step_by(2) {
            if b.take(mh, forger, t) {
                taken += 1;
                b.refused(mh, t + 1);
            }
        }
        // The forger's own budget: its burst and 2/s.
        assert_eq!(taken, 5 + 5);
        // The MH's genuine greetings find its whole burst.
        assert_eq!((0..5).filter(|_| b.take(mh, genuine, 3000)).count(), 5);
        assert!(!b.take(mh, genuine, 3000));
        // Pulls that were not refused count against the MH whoever asked.
        let mut b = PullBudget::new(5, 2.0, 4096);
        for i in 0..5u8 {
            assert!(b.take(mh, Sender::Mac([2, 0, 0, 0, 1, i]), 0));
        }
        assert!(!b.take(mh, genuine, 0));
    }

    #[test]
    fn a_refund_stops_at_the_burst_and_needs_a_bucket() {
        let k: IpAddr = "10.2.0.7".parse().unwrap();
        let mut r = PerAddr::new(2, 1.0, 16);
        r.refund(&k, 0);
        assert!(r.is_empty(), "no bucket made by a refund");
        assert!(r.allow(&k, 0));
        r.refund(&k, 0);
        r.refund(&k, 0);
        assert_eq!((0..5).filter(|_| r.allow(&k, 0)).count(), 2);
    }

    const TOKEN: &[u8] = b"0123456789abcdef";

    fn g(prev: &str, token: &[u8], ts: u64) -> Greeting {
        Greeting::new(
            token,
            "10.2.0.100".parse().unwrap(),
            prev,
            "msr2",
            ts,
            [ts as u8; 16],
        )
    }

    fn cx() -> Context<'static> {
        Context {
            me: "msr2",
            from_mh: true,
            is_mh: true,
            prev_is_peer: true,
            pull_allowed: true,
        }
    }

    #[test]
    fn an_unproven_first_greeting_attaches_without_effect() {
        let d = decide(&g("", b"anything at all.", 5), cx(), MhView::default());
        assert_eq!(d, Decision::Attach { proven: false });
    }

    #[test]
    fn a_greeting_naming_us_follows_connections_that_left_without_the_mh_knowing() {
        // msr2's connections of the MH left for msr3 (a pull that completed after the
        // MH had come back); the MH greets msr2 naming msr2.
        let mh = MhView {
            token: Some(TOKEN),
            last_greeting_ts: 4,
            moved_to: Some("msr3"),
            ..MhView::default()
        };
        let follow = Decision::Follow("msr3".into());
        assert_eq!(decide(&g("msr2", TOKEN, 5), cx(), mh), follow);
        // Also with connections opened here since: they stay, the rest come.
        let some = MhView { local: 1, ..mh };
        assert_eq!(decide(&g("msr2", TOKEN, 5), cx(), some), follow);
        // With pulls rate-limited: later.
        let limited = Context {
            pull_allowed: false,
            ..cx()
        };
        assert_eq!(decide(&g("msr2", TOKEN, 5), limited, mh), Decision::Defer);
        // Unproven, or not newer than the last greeting: nothing moves.
        assert!(matches!(
            decide(&g("msr2", b"a forged token..", 5), cx(), mh),
            Decision::Refuse(_)
        ));
        assert!(matches!(
            decide(&g("msr2", TOKEN, 4), cx(), some),
            Decision::Refuse(_)
        ));
        // Nothing left anywhere else: attach as before.
        let home = MhView {
            moved_to: None,
            local: 1,
            ..mh
        };
        assert_eq!(
            decide(&g("msr2", TOKEN, 5), cx(), home),
            Decision::Attach { proven: true }
        );
    }

    #[test]
    fn a_proven_greeting_attaches_once() {
        let mh = MhView {
            token: Some(TOKEN),
            local: 2,
            ..MhView::default()
        };
        assert_eq!(
            decide(&g("msr2", TOKEN, 5), cx(), mh),
            Decision::Attach { proven: true }
        );
        let used = MhView {
            last_greeting_ts: 5,
            ..mh
        };
        assert!(matches!(
            decide(&g("msr2", TOKEN, 5), cx(), used),
            Decision::Refuse(_)
        ));
        // Wrong token: refused, even naming no previous MSR.
        assert!(matches!(
            decide(&g("", b"a forged token..", 6), cx(), mh),
            Decision::Refuse(_)
        ));
    }

    #[test]
    fn an_mh_split_between_msrs_is_pulled_together_once_proven_here() {
        let mh = MhView {
            token: Some(TOKEN),
            local: 1,
            last_greeting_ts: 4,
            ..MhView::default()
        };
        assert_eq!(decide(&g("msr1", TOKEN, 5), cx(), mh), Decision::Pull);
        // Not proven here: nothing is asked of the peer.
        assert!(matches!(
            decide(&g("msr1", b"a forged token..", 5), cx(), mh),
            Decision::Refuse(_)
        ));
        assert!(matches!(
            decide(&g("msr1", TOKEN, 4), cx(), mh),
            Decision::Refuse(_)
        ));
        // A previous MSR that is no peer: what is here is all there is.
        let mut c = cx();
        c.prev_is_peer = false;
        assert_eq!(
            decide(&g("msr9", TOKEN, 5), c, mh),
            Decision::Attach { proven: true }
        );
    }

    #[test]
    fn connections_opened_without_a_token_never_move_by_greeting() {
        let mh = MhView {
            local: 1,
            ..MhView::default()
        };
        assert!(matches!(
            decide(&g("", TOKEN, 5), cx(), mh),
            Decision::Refuse(_)
        ));
        assert!(matches!(
            decide(&g("msr1", TOKEN, 5), cx(), mh),
            Decision::Refuse(_)
        ));
    }

    #[test]
    fn spoofed_senders_are_dropped_and_others_ignored() {
        let mut c = cx();
        c.from_mh = false;
        assert!(matches!(
            decide(&g("msr1", TOKEN, 5), c, MhView::default()),
            Decision::Drop(_)
        ));
        let mut other = g("msr1", TOKEN, 5);
        other.new_msr = "msr3".into();
        assert_eq!(decide(&other, cx(), MhView::default()), Decision::Ignore);
    }

    #[test]
    fn pulls_are_one_at_a_time_and_rate_limited() {
        assert_eq!(
            decide(&g("msr1", TOKEN, 5), cx(), MhView::default()),
            Decision::Pull
        );
        let pulling = MhView {
            pulling: true,
            ..MhView::default()
        };
        assert_eq!(decide(&g("msr1", TOKEN, 6), cx(), pulling), Decision::Defer);
        let mut c = cx();
        c.pull_allowed = false;
        assert_eq!(
            decide(&g("msr1", TOKEN, 7), c, MhView::default()),
            Decision::Defer
        );
        c = cx();
        c.prev_is_peer = false;
        assert!(matches!(
            decide(&g("msr9", TOKEN, 8), c, MhView::default()),
            Decision::Refuse(_)
        ));
    }

    #[test]
    fn rate_limit_refills_and_stays_bounded() {
        let mut r: RateLimit<u32> = RateLimit::new(2, 10.0, 3);
        assert!(r.allow(&1, 0) && r.allow(&1, 0));
        assert!(!r.allow(&1, 0));
        assert!(r.allow(&1, 100)); // 10/s: one more after 100 ms.
        for k in 2..=3 {
            assert!(r.allow(&k, 100));
        }
        // A fourth key while three are active: refused, the table does not grow.
        assert!(!r.allow(&4, 100));
        assert_eq!(r.len(), 3);
        // Once the others have refilled, they are forgotten.
        assert!(r.allow(&4, 10_000));
        assert!(r.len() <= 3);
    }
}
