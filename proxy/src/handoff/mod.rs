//! msrd's side of handoffs (paper §5.4): thin I/O around the sans-IO decisions and
//! machines of `itcp_handoff` (`greet`, `machine`).
//!
//! * [`greeting`] — the greeting server on the cells: what a greeting may do is
//!   decided by `itcp_handoff::greet::decide`.
//! * [`frames`] — which link-layer address carried each greeting, so the new MSR
//!   needs no ARP/NDP round trip to answer the MH and restart its connections.
//! * [`channel`] — the MSR⇄MSR channel: challenge, hello, authenticated frames.
//! * [`spares`] — channels to the peers opened ahead of need.
//! * [`old_side`] — serves the channel: freeze, capture, ship, delete or unfreeze.
//! * [`new_side`] — pulls an MH's connections: hold, restore, take over, restart, ack.
//! * [`gate`] — lets an MH's segments reach its restored connections only once each
//!   restarts.
//! * [`sockets`] — the socket work both sides share: capture, restore, restart,
//!   delete, resume.

pub mod channel;
pub mod frames;
pub mod gate;
pub mod greeting;
pub mod handshakes;
pub mod new_side;
pub mod old_side;
pub mod sockets;
pub mod spares;
pub mod tls;

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use itcp_config::HandoffSection;
use itcp_handoff::greet::{PerAddr, PullBudget, Sender};
use itcp_handoff::machine::Timeouts;
use itcp_proto::greeting::{GreetReply, GreetStatus, Greeting};

use crate::clock::now_us;

pub use greeting::serve_greetings;
pub use old_side::serve_peers;

/// Sends a reply to an MH's greeting (best effort: the MH greets again). The greeting
/// server and a pull both answer greetings.
pub(crate) async fn reply(sock: &tokio::net::UdpSocket, to: std::net::SocketAddr, r: &GreetReply) {
    let b = serde_json::to_vec(r).expect("replies serialize");
    if let Err(e) = sock.send_to(&b, to).await {
        tracing::debug!(%to, error = %e, "greeting reply not sent");
    }
}

/// What this MSR knows about one MH.
#[derive(Default)]
pub(crate) struct MhState {
    /// The MH's session token: bound by its first SOCKS session with one (TCP from
    /// its own address on our cell), or shipped with its connections by the old MSR.
    /// Never by a greeting.
    pub token: Option<Vec<u8>>,
    /// Timestamp of the newest *proven* greeting: older ones are replays.
    pub last_greeting_ts: u64,
    /// Bumped by every hold; a delayed release applies only to its own hold.
    pub hold_gen: u64,
    /// The last greeting answered and the answer, repeated for retransmissions.
    pub last_nonce: Option<String>,
    pub last_reply: Option<GreetReply>,
    /// A pull of this MH's connections is under way here.
    pub pulling: bool,
    /// We answer ARP for this MH on the fixed LAN.
    pub claimed: bool,
    /// The link-layer address bound to the MH (network detection: as first seen at
    /// the MSR that served it, then shipped with its connections).
    pub mac: Option<[u8; 6]>,
    /// When `mac` was bound (`clock::mono_ns`; 0 if carried over an upgrade): the
    /// station's longest-bound idle address goes first past its cap.
    pub bound_ns: u64,
    /// A delayed release of the hold made by hold generation `.0`, due at `.1` (µs
    /// since the epoch): an upgrade carries it on.
    pub release_at: Option<(u64, u64)>,
    /// The peer the MH's connections last left here for, and the one they last came
    /// from: a greeting that names the MSR the MH knew, after a pull it never heard of
    /// (held up by the channel), is sent on or accepted by them (`MovedOn`).
    pub moved_to: Option<String>,
    pub came_from: Option<String>,
    /// The MH's connections left this MSR: what its frames must show to count as its
    /// return here (network detection).
    pub departure: Option<crate::departed::Departure>,
}

/// Handoff state shared by the daemon's tasks.
pub struct Handoffs {
    pub me: String,
    pub cfg: HandoffSection,
    keys: HashMap<String, Vec<u8>>,
    /// `[handoff.tls]`: the channel runs over mutual TLS instead of per-pair keys.
    pub(crate) tls: Option<tls::ChannelTlsConfig>,
    next_id: AtomicU64,
    pub(crate) mhs: Mutex<HashMap<IpAddr, MhState>>,
    /// One request at a time per MH on the old side (see [`Handoffs::old_side_turn`]).
    old_turns: Mutex<HashMap<IpAddr, Arc<tokio::sync::Mutex<()>>>>,
    /// Pulls per MH and per sender (spoofed greetings cannot make us ask peers without
    /// bound, nor use up a genuine MH's pulls).
    pulls: Mutex<PullBudget>,
    /// The gates on restored connections while they restart.
    pub(crate) gates: gate::Gates,
    /// Log lines for rejected input, per source (quiet under a flood).
    noisy: Mutex<PerAddr>,
    /// Channel connections not yet authenticated.
    pub(crate) unauthenticated: Mutex<Authenticating>,
    /// Authenticated channel connections waiting for their first message, by peer.
    pub(crate) idle: Mutex<HashMap<String, u32>>,
    /// Channels to the peers opened ahead of need.
    pub(crate) spares: spares::Spares,
    /// Handoffs under way here, either side (an upgrade waits for none).
    busy: Arc<AtomicU64>,
    /// No new handoff starts (an upgrade is handing everything over).
    closed: std::sync::atomic::AtomicBool,
    /// Stations being asked about ([`Handoffs::ask_about_station`]), and the rate
    /// at which new questions may start.
    asking: Mutex<(
        std::collections::HashSet<[u8; 6]>,
        crate::admission::TokenBucket,
    )>,
}

/// Stations asked about at once, and new questions per second (burst twice that):
/// each question goes to every peer, and a station sending from many link-layer
/// addresses must not make this MSR ask without bound. Well above what arrivals need
/// (a cell's stations arrive a few per second).
pub const MAX_STATION_QUESTIONS: usize = 16;
pub const STATION_QUESTIONS_PER_S: f64 = 50.0;

/// Channel connections authenticating at once from sources that are no configured
/// peer's address (each costs a task and 182 bytes until its hello or 2 s)...
pub const MAX_UNAUTHENTICATED: usize = 64;
/// ...and from any one such source: one LAN host cannot take them all.
pub const MAX_UNAUTHENTICATED_PER_SOURCE: usize = 4;
/// Authenticating at once from each configured peer's address: a burst of handoffs
/// opens one channel each.
pub const MAX_UNAUTHENTICATED_PER_PEER: usize = 64;

/// Channel connections still authenticating, counted per source. Connections from a
/// configured peer's address have slots of their own, so no other host can take a
/// peer's turn (a stranger — a host on the LAN, or a CA-signed MSR that is not listed
/// — cannot open connections from a peer's address without that address's traffic).
#[derive(Debug)]
pub struct Authenticating {
    peers: std::collections::HashSet<IpAddr>,
    from_peers: crate::admission::Setups,
    from_strangers: crate::admission::Setups,
}

impl Authenticating {
    pub fn new(peers: impl IntoIterator<Item = IpAddr>) -> Self {
        let peers: std::collections::HashSet<IpAddr> =
            peers.into_iter().map(crate::admission::canonical).collect();
        let n = peers.len().max(1);
        Authenticating {
            peers,
            from_peers: crate::admission::Setups::new(
                n * MAX_UNAUTHENTICATED_PER_PEER,
                MAX_UNAUTHENTICATED_PER_PEER,
                usize::MAX,
            ),
            from_strangers: crate::admission::Setups::new(
                MAX_UNAUTHENTICATED,
                MAX_UNAUTHENTICATED_PER_SOURCE,
                usize::MAX,
            ),
        }
    }

    fn of(&mut self, ip: IpAddr) -> &mut crate::admission::Setups {
        if self.peers.contains(&ip) {
            &mut self.from_peers
        } else {
            &mut self.from_strangers
        }
    }

    /// Counts a connection from `ip` authenticating, unless its share is taken.
    pub fn begin(&mut self, ip: IpAddr) -> bool {
        let ip = crate::admission::canonical(ip);
        self.of(ip).begin(ip, None)
    }

    /// Its authentication ended (either way).
    pub fn end(&mut self, ip: IpAddr) {
        let ip = crate::admission::canonical(ip);
        self.of(ip).end(ip, None)
    }
}

/// A handoff under way, counted until dropped.
pub(crate) struct Busy(Arc<AtomicU64>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Handoffs {
    /// Reads the peers' keys; errors name the peer.
    pub fn new(me: &str, cfg: &HandoffSection) -> io::Result<Handoffs> {
        let mut keys = HashMap::new();
        let tls = match &cfg.tls {
            Some(t) => Some(tls::ChannelTlsConfig::load(t, me)?),
            None => {
                for p in &cfg.peers {
                    let k = p
                        .key_bytes()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                    keys.insert(p.id.clone(), k);
                }
                None
            }
        };
        Ok(Handoffs {
            me: me.into(),
            cfg: cfg.clone(),
            keys,
            tls,
            // Unique across restarts: handoff ids start at the clock.
            next_id: AtomicU64::new(now_us()),
            mhs: Mutex::new(HashMap::new()),
            old_turns: Mutex::new(HashMap::new()),
            // A genuine MH moves at most a few times a second; 5 at once, 2/s after.
            pulls: Mutex::new(PullBudget::new(5, 2.0, 4096)),
            gates: gate::Gates::default(),
            // One log line per source every 10 s after a burst of 3.
            noisy: Mutex::new(PerAddr::new(3, 0.1, 4096)),
            unauthenticated: Mutex::new(Authenticating::new(
                cfg.peers.iter().map(|p| p.address.ip()),
            )),
            idle: Mutex::new(HashMap::new()),
            spares: spares::Spares::default(),
            busy: Arc::new(AtomicU64::new(0)),
            closed: std::sync::atomic::AtomicBool::new(false),
            asking: Mutex::new((
                Default::default(),
                crate::admission::TokenBucket::new(
                    STATION_QUESTIONS_PER_S,
                    2.0 * STATION_QUESTIONS_PER_S,
                    crate::clock::mono_ns(),
                ),
            )),
        })
    }

    /// Counts a handoff under way until the guard drops; None while an upgrade keeps
    /// new handoffs out.
    pub(crate) fn try_busy(&self) -> Option<Busy> {
        // Count first, then look: an upgrade that closes after this sees the count.
        self.busy.fetch_add(1, Ordering::SeqCst);
        let b = Busy(self.busy.clone());
        (!self.closed.load(Ordering::SeqCst)).then_some(b)
    }

    /// Keeps new handoffs out (or lets them in again), and returns how many are
    /// under way now.
    pub fn close(&self, closed: bool) -> u64 {
        self.closed.store(closed, Ordering::SeqCst);
        self.busy.load(Ordering::SeqCst)
    }

    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            images_us: self.cfg.images_timeout_ms * 1000,
            ack_us: self.cfg.ack_timeout_ms * 1000,
        }
    }

    pub(crate) fn key(&self, peer: &str) -> Option<Vec<u8>> {
        self.keys.get(peer).cloned()
    }

    /// Binds an MH's token when it has none yet: only from its SOCKS session (TCP,
    /// from its own address), never from a greeting. False if another token is bound.
    pub fn bind_token(&self, mh: IpAddr, token: &[u8]) -> bool {
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        st.token.get_or_insert_with(|| token.to_vec()) == token
    }

    /// Takes the MH's token (hex) as the old MSR sent it on the authenticated channel:
    /// its greeting proofs are checked, and our answers to it tagged, under it.
    pub(crate) fn adopt_token(&self, mh: IpAddr, hex: Option<&str>) {
        if let Some(t) = hex.and_then(itcp_proto::hex::unhex) {
            self.mhs.lock().unwrap().entry(mh).or_default().token = Some(t);
        }
    }

    pub(crate) fn next_handoff_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes one pull of `mh`'s connections asked for by `sender`, if its budgets
    /// allow one now.
    pub(crate) fn pull_allowed(&self, mh: IpAddr, sender: Sender) -> bool {
        self.pulls.lock().unwrap().take(mh, sender, now_us() / 1000)
    }

    /// The old MSR refused a pull of `mh`'s: it does not count against the MH.
    pub(crate) fn pull_refused(&self, mh: IpAddr) {
        self.pulls.lock().unwrap().refused(mh, now_us() / 1000)
    }

    /// True if a line about rejected input from `src` may be logged now.
    pub(crate) fn may_log(&self, src: IpAddr) -> bool {
        self.noisy.lock().unwrap().allow(&src, now_us() / 1000)
    }

    pub(crate) fn hold_gen_bump(&self, mh: IpAddr) -> u64 {
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        st.hold_gen += 1;
        st.hold_gen
    }

    pub(crate) fn hold_gen(&self, mh: IpAddr) -> u64 {
        self.mhs.lock().unwrap().get(&mh).map_or(0, |s| s.hold_gen)
    }

    /// The answer to greeting `g` (`mac`: ours on the MH's cell), tagged under the
    /// MH's token if we hold it, and remembered so that a retransmitted greeting gets
    /// it again.
    pub(crate) fn answer(
        &self,
        mh: IpAddr,
        g: &Greeting,
        status: GreetStatus,
        reason: Option<String>,
        connections: usize,
        mac: Option<String>,
    ) -> GreetReply {
        let mut r = GreetReply {
            msr: self.me.clone(),
            nonce: g.nonce.clone(),
            status,
            reason,
            connections,
            mac,
            tag: None,
        };
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        // Tagged whenever we hold the MH's token: the MH then acts on no answer
        // that is not (anyone on the cell can send one).
        if let Some(t) = &st.token {
            r.seal(t);
        }
        st.last_nonce = Some(r.nonce.clone());
        st.last_reply = Some(r.clone());
        r
    }

    /// Starts a question about station `mac` unless one is under way,
    /// [`MAX_STATION_QUESTIONS`] are, or the rate is spent;
    /// [`Handoffs::asked_about_station`] ends it.
    pub(crate) fn ask_about_station(&self, mac: [u8; 6]) -> bool {
        let (under_way, rate) = &mut *self.asking.lock().unwrap();
        under_way.len() < MAX_STATION_QUESTIONS
            && !under_way.contains(&mac)
            && rate.take(crate::clock::mono_ns())
            && under_way.insert(mac)
    }

    pub(crate) fn asked_about_station(&self, mac: [u8; 6]) {
        self.asking.lock().unwrap().0.remove(&mac);
    }

    /// The MH addresses bound to station `mac` that this MSR answers for.
    pub(crate) fn served_of_station(&self, mac: [u8; 6]) -> Vec<IpAddr> {
        let m = self.mhs.lock().unwrap();
        let mut v: Vec<IpAddr> = m
            .iter()
            .filter(|(_, s)| s.mac == Some(mac) && s.claimed)
            .map(|(a, _)| *a)
            .collect();
        v.sort();
        v
    }

    pub(crate) fn set_pulling(&self, mh: IpAddr, on: bool) {
        self.mhs.lock().unwrap().entry(mh).or_default().pulling = on;
    }

    /// The MH's connections left for `peer`.
    pub(crate) fn moved_away(&self, mh: IpAddr, peer: &str) {
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        st.moved_to = Some(peer.into());
    }

    /// The MH's connections left for another MSR: until `stale_window_ms` has passed,
    /// only frames that prove its return count as one ([`crate::departed`]).
    pub(crate) fn departed(&self, mh: IpAddr, d: crate::departed::Departure) {
        self.mhs.lock().unwrap().entry(mh).or_default().departure = Some(d);
    }

    /// What a frame from `mh` reported by network detection says: `Stale` while it
    /// cannot be told from one sent before the MH's connections left.
    pub(crate) fn judge_arrival(&self, mh: IpAddr, packet: &[u8]) -> crate::departed::Evidence {
        use crate::departed::Evidence;
        let window = self.cfg.stale_window_ms * 1000;
        let mut m = self.mhs.lock().unwrap();
        let Some(st) = m.get_mut(&mh) else {
            return Evidence::Expired;
        };
        let e = st.departure.as_ref().map_or(Evidence::Expired, |d| {
            d.judge(packet, crate::clock::mono_us(), window)
        });
        if e != Evidence::Stale {
            st.departure = None;
        }
        e
    }

    /// The MH's connections came here from `peer`.
    pub(crate) fn moved_in(&self, mh: IpAddr, peer: &str) {
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        st.came_from = Some(peer.into());
        st.moved_to = None;
    }

    /// Waits until no other peer's request for `mh` is being served here. A request
    /// that came while the MH's connections were being handed to another peer would
    /// see them as not here and answer as if the MH had none (a pull the channel held
    /// up completing while the MH greets its next MSR): served after, it sees where
    /// they went (`moved_on`, `also_at`).
    pub(crate) async fn old_side_turn(&self, mh: IpAddr) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = {
            let mut t = self.old_turns.lock().unwrap();
            // Forget the MHs no request waits for (the table stays as small as the
            // handoffs under way).
            t.retain(|_, m| Arc::strong_count(m) > 1);
            t.entry(mh).or_default().clone()
        };
        turn.lock_owned().await
    }

    pub(crate) fn greeting_used(&self, mh: IpAddr, ts_ms: u64) {
        let mut m = self.mhs.lock().unwrap();
        let st = m.entry(mh).or_default();
        st.last_greeting_ts = st.last_greeting_ts.max(ts_ms);
    }
}

// ---------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lan_host_takes_a_few_authentication_slots_and_never_a_peers() {
        let peer: IpAddr = "10.1.0.12".parse().unwrap();
        let mut a = Authenticating::new([peer]);
        let host: IpAddr = "10.1.0.1".parse().unwrap();
        let held = (0..80).filter(|_| a.begin(host)).count();
        assert_eq!(held, MAX_UNAUTHENTICATED_PER_SOURCE);
        // Strangers together: the global bound.
        let many = (0..100u8)
            .filter(|&i| a.begin(IpAddr::from([10, 1, 1, i / 2])))
            .count();
        assert_eq!(held + many, MAX_UNAUTHENTICATED);
        // The peer still gets in, a burst of handoffs' worth, and from a mapped address.
        let mapped: IpAddr = "::ffff:10.1.0.12".parse().unwrap();
        assert!(a.begin(mapped));
        assert_eq!(
            (1..80).filter(|_| a.begin(peer)).count(),
            MAX_UNAUTHENTICATED_PER_PEER - 1
        );
        a.end(host);
        assert!(a.begin(host), "ending frees the host's slot");
        assert!(!a.begin(host));
    }

    #[test]
    fn the_first_token_bound_to_an_address_stays_and_another_is_refused() {
        let h = Handoffs::new("msr1", &HandoffSection::default()).unwrap();
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        assert!(h.bind_token(mh, b"first token....."));
        // The same token again (a registration after a SOCKS session): accepted.
        assert!(h.bind_token(mh, b"first token....."));
        // Another one (REGISTER answers 02): refused, the first stays.
        assert!(!h.bind_token(mh, b"second token...."));
        let m = h.mhs.lock().unwrap();
        assert_eq!(m[&mh].token.as_deref(), Some(&b"first token....."[..]));
    }
}
