//! Packets held during a handoff instead of dropped. While an MH's connections are
//! frozen, msrd's hold rules (`intercept`) hand every TCP packet that arrives from or
//! for the MH to one netfilter queue (NFQUEUE); msrd keeps them here, and when the hold
//! ends each one is
//! * run through the rules again (`settle`), when its connection runs here (the new
//!   MSR after its restart, the old MSR after a rollback), so the socket takes it;
//! * sent on to the MSR the connection moved to (`forward`, at the old MSR): the FH's
//!   segments that reached the old MSR during the freeze, and those that still do until
//!   the fixed LAN has learnt the move (the MH's own from its old cell too), reach the
//!   restored sockets. A copy of each goes as soon as the images are out and the new
//!   MSR says it holds the MH's flows (`send_ahead`), so it waits there and reaches the
//!   restored socket before what the FH sends once the new MSR took the MH's address
//!   over (`deliver_restarted`, per restart group): sent only
//!   after the acknowledgement, it came after those, the restored socket saw a hole,
//!   the FH retransmitted, and the late copy met a closed connection's TIME_WAIT,
//!   whose ACK the FH answered with an RST;
//! * or dropped, as every held packet was before: one of no connection that runs here,
//!   or one that waited [`MAX_HELD`].
//!
//! So a segment the FH sends into a freeze is acknowledged as soon as the connection
//! runs again, and the FH does not wait for its retransmission timeout.
//!
//! The kernel keeps the packets (at most [`QUEUE_MAXLEN`]: beyond, it drops them); a
//! copy of each comes here, to be forwarded. Without a listener on the queue (msrd not
//! yet up, or an upgrade in progress) the kernel drops them, as before.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{recv, send, MsgFlags};
use tokio::io::unix::AsyncFd;
use tracing::{debug, info};

use itcp_handoff::packet::forget_acks;
use itcp_wire::tcp::{self, FIN, SYN};
use itcp_wire::{tcp_in_head, IpPacket};

use crate::netlink::{
    attrs, begin_msg, end_msg, kernel_error, messages, next_seq, nl_exchange, nl_socket, put_attr,
    put_nfgenmsg, NFGENMSG_LEN,
};

// From linux/netfilter/nfnetlink_queue.h.
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_MARK: u16 = 3;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;

/// What happens to a held packet (netfilter verdicts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Drop = 0,
    /// Through the hold rules again (`NF_REPEAT`): the hold is over by then, so it
    /// meets the rules a packet arriving now would.
    Repeat = 4,
}

/// Packets the kernel keeps at most for this queue (a few MB of segments).
pub const QUEUE_MAXLEN: u32 = 4096;
/// How long a packet is held at most: a handoff that takes longer has failed, and its
/// packets are dropped as they always were.
pub const MAX_HELD: Duration = Duration::from_secs(5);

/// Where a unit test's frames go (see `Holding::sink`).
#[cfg(test)]
type Sink = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// One queued packet, as the kernel reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub id: u32,
    pub packet: Vec<u8>,
}

/// A held packet's ends (ports 0 for anything but TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ends {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// The ends of an IPv4 or IPv6 packet, or of its head (IPv6: TCP right after the fixed
/// header); ports 0 when no TCP header starts in it.
pub fn ends(p: &[u8]) -> Option<Ends> {
    let ip = IpPacket::new_head(p).ok()?;
    let (sport, dport) = match tcp_in_head(p) {
        Ok((_, seg)) => (seg.src_port(), seg.dst_port()),
        Err(_) => (0, 0),
    };
    Some(Ends {
        src: SocketAddr::new(ip.src_addr(), sport),
        dst: SocketAddr::new(ip.dst_addr(), dport),
    })
}

/// The acknowledgement number of a TCP segment with ACK set (not SYN, not RST).
pub fn tcp_ack(p: &[u8]) -> Option<u32> {
    let (_, seg) = tcp_in_head(p).ok()?;
    (seg.flags() & (tcp::ACK | SYN | tcp::RST) == tcp::ACK).then(|| seg.ack_number())
}

/// The sequence number of a TCP segment.
pub fn tcp_seq(p: &[u8]) -> Option<u32> {
    tcp_in_head(p).ok().map(|(_, seg)| seg.seq_number())
}

/// Puts each flow direction's held packets in sequence order (stable: pure ACKs keep
/// the order they came in), and sets apart the retransmissions: of the held copies of
/// one segment (same sequence number, length and SYN/FIN), only the last goes on. They
/// do not always come in order: the old MSR's copies of segments the FH sent it just
/// before the takeover reach the new MSR after the FH's newer ones sent straight here,
/// and wait behind them at the gate; delivered so, the socket saw a hole and the FH
/// went into recovery. And a peer retransmits into the freeze: each copy delivered
/// draws one more duplicate ACK, which after a FIN meets a peer that has closed and
/// answers with RST.
fn in_sequence(held: Vec<Held>) -> (Vec<Held>, Vec<Held>) {
    // Each direction's sequence numbers, relative to the first that came (wrapping).
    let mut first: HashMap<(SocketAddr, SocketAddr), u32> = HashMap::new();
    let mut keyed: Vec<_> = held
        .into_iter()
        .map(|h| {
            let dir = h.ends.map(|e| (e.src, e.dst));
            let rel = match (dir, tcp_seq(&h.packet)) {
                (Some(d), Some(seq)) => seq.wrapping_sub(*first.entry(d).or_insert(seq)) as i32,
                _ => 0,
            };
            ((dir, rel), h)
        })
        .collect();
    // Stable.
    keyed.sort_by_key(|(k, _)| *k);
    // The last copy of each segment that carries something (data, SYN or FIN).
    let segment = |(k, h): &(_, Held)| {
        let (len, flags) = tcp_extent(&h.packet)?;
        (len > 0 || flags & (SYN | FIN) != 0).then_some((*k, len, flags & (SYN | FIN)))
    };
    let mut last = HashMap::new();
    for (i, x) in keyed.iter().enumerate() {
        if let Some(id) = segment(x) {
            last.insert(id, i);
        }
    }
    let (go, again): (Vec<_>, Vec<_>) = keyed
        .into_iter()
        .enumerate()
        .partition(|(i, x)| segment(x).is_none_or(|id| last[&id] == *i));
    let strip = |v: Vec<(usize, (_, Held))>| v.into_iter().map(|(_, (_, h))| h).collect();
    (strip(go), strip(again))
}

/// A TCP segment's payload length and flags (IPv4, or IPv6 with TCP right after the
/// fixed header).
fn tcp_extent(p: &[u8]) -> Option<(usize, u8)> {
    let (ip, seg) = tcp_in_head(p).ok()?;
    Some((ip.payload_len().checked_sub(seg.header_len())?, seg.flags()))
}

/// Binds queue `queue`, full packets copied, at most [`QUEUE_MAXLEN`] kept.
fn config_msgs(queue: u16, seq: u32) -> [Vec<u8>; 2] {
    let ty = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG;
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    let mut bind = Vec::new();
    let m = begin_msg(&mut bind, ty, flags, seq);
    put_nfgenmsg(&mut bind, libc::AF_UNSPEC as u8, queue);
    // struct nfqnl_msg_config_cmd: command, pad, be16 pf (unused since Linux 3.8).
    put_attr(&mut bind, NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]);
    end_msg(&mut bind, m);
    let mut params = Vec::new();
    let m = begin_msg(&mut params, ty, flags, seq.wrapping_add(1));
    put_nfgenmsg(&mut params, libc::AF_UNSPEC as u8, queue);
    // struct nfqnl_msg_config_params: be32 copy_range, copy_mode (packed: 5 bytes).
    let mut p = 0xffffu32.to_be_bytes().to_vec();
    p.push(NFQNL_COPY_PACKET);
    put_attr(&mut params, NFQA_CFG_PARAMS, &p);
    put_attr(
        &mut params,
        NFQA_CFG_QUEUE_MAXLEN,
        &QUEUE_MAXLEN.to_be_bytes(),
    );
    end_msg(&mut params, m);
    [bind, params]
}

/// A verdict on packet `id` (`batch`: on every packet up to `id`).
fn verdict_msg(queue: u16, id: u32, v: Verdict, batch: bool) -> Vec<u8> {
    verdict_msg_marked(queue, id, v, batch, None)
}

/// [`verdict_msg`], setting the packet's mark.
fn verdict_msg_marked(queue: u16, id: u32, v: Verdict, batch: bool, mark: Option<u32>) -> Vec<u8> {
    verdict_msg_with(queue, id, v, batch, mark, None)
}

/// A verdict that may also set the packet's mark and replace its bytes (`payload`,
/// checksums filled in: the kernel checks them again).
fn verdict_msg_with(
    queue: u16,
    id: u32,
    v: Verdict,
    batch: bool,
    mark: Option<u32>,
    payload: Option<&[u8]>,
) -> Vec<u8> {
    let ty = if batch {
        NFQNL_MSG_VERDICT_BATCH
    } else {
        NFQNL_MSG_VERDICT
    };
    let mut b = Vec::with_capacity(32);
    let m = begin_msg(
        &mut b,
        (NFNL_SUBSYS_QUEUE << 8) | ty,
        libc::NLM_F_REQUEST as u16,
        0,
    );
    put_nfgenmsg(&mut b, libc::AF_UNSPEC as u8, queue);
    // struct nfqnl_msg_verdict_hdr: be32 verdict, be32 id.
    let mut h = (v as u32).to_be_bytes().to_vec();
    h.extend_from_slice(&id.to_be_bytes());
    put_attr(&mut b, NFQA_VERDICT_HDR, &h);
    if let Some(mark) = mark {
        put_attr(&mut b, NFQA_MARK, &mark.to_be_bytes());
    }
    if let Some(p) = payload {
        put_attr(&mut b, NFQA_PAYLOAD, p);
    }
    end_msg(&mut b, m);
    b
}

/// The packets reported in one datagram (anything else, or malformed, is skipped).
pub fn parse(dgram: &[u8]) -> Vec<Queued> {
    messages(dgram, (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET)
        .into_iter()
        .filter_map(parse_packet)
        .collect()
}

fn parse_packet(body: &[u8]) -> Option<Queued> {
    let (mut id, mut packet) = (None, None);
    for (ty, p) in attrs(body, NFGENMSG_LEN)? {
        match ty {
            // struct nfqnl_msg_packet_hdr: be32 packet_id, be16 hw_protocol, hook.
            NFQA_PACKET_HDR if p.len() >= 4 => {
                id = Some(u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
            }
            NFQA_PAYLOAD => packet = Some(p.to_vec()),
            _ => {}
        }
    }
    Some(Queued {
        id: id?,
        packet: packet.unwrap_or_default(),
    })
}

/// Where an MH's held packets go once its connections moved (the old MSR's side).
#[derive(Debug, Clone)]
struct Forward {
    /// The new MSR: its address, and its link-layer address once looked up.
    via: IpAddr,
    mac: Option<[u8; 6]>,
    /// The flows that moved, as (MH's end, other end).
    flows: HashSet<(SocketAddr, SocketAddr)>,
    until: Instant,
    /// The handoff is not acknowledged yet: copies go, the packets stay held here.
    ahead: bool,
}

struct Held {
    id: u32,
    at: Instant,
    ends: Option<Ends>,
    packet: Vec<u8>,
    /// A copy went to the new MSR already (`send_ahead`).
    copied: bool,
}

/// Whether a held packet belongs to one of `flows` (MH's end, other end), either way:
/// the FH's segments and the MH's own.
fn of_flows(flows: &HashSet<(SocketAddr, SocketAddr)>, e: &Ends) -> bool {
    flows.contains(&(e.dst, e.src)) || flows.contains(&(e.src, e.dst))
}

#[derive(Default)]
struct State {
    held: Vec<Held>,
    forward: HashMap<IpAddr, Forward>,
    /// The highest packet id read (ids only grow).
    max_seen: Option<u32>,
    /// Reports were lost (the socket overran): the kernel holds packets we never saw.
    lost: bool,
}

/// The held packets and the queue's socket.
pub struct Holding {
    queue: u16,
    /// Where the fates of held packets are counted (`held_*`).
    stats: Arc<crate::sessions::Sessions>,
    /// The fixed LAN's interface (forwarding goes out on it).
    lan: Option<String>,
    /// The mark that gets a held packet past the gate ([`crate::intercept::pass_mark`]).
    pass_mark: u32,
    fd: Mutex<Option<Arc<AsyncFd<OwnedFd>>>>,
    st: Mutex<State>,
    /// Held while reports are read and taken in (its buffer): a restart that reads
    /// the queue's pending reports first waits for one being taken in.
    reading: Mutex<Vec<u8>>,
    /// Held while packets go on to a new MSR (taken before `st`): those of a moved
    /// flow leave in the order they came, the backlog `send_ahead` and `forward` send
    /// before any packet that arrives meanwhile.
    sending: Mutex<()>,
    /// Where frames go instead of the LAN (unit tests).
    #[cfg(test)]
    sink: Option<Sink>,
}

/// What reading the queue's pending reports came to.
enum Drained {
    /// Nothing more to read now.
    Empty,
    /// The queue's socket is gone.
    Closed,
    /// Reading failed (logged): the reader waits a little before it tries again.
    Failed,
}

impl Holding {
    pub fn new(
        queue: u16,
        lan: Option<String>,
        pass_mark: u32,
        stats: Arc<crate::sessions::Sessions>,
    ) -> Holding {
        Holding {
            queue,
            stats,
            lan,
            pass_mark,
            fd: Mutex::new(None),
            st: Mutex::new(State::default()),
            reading: Mutex::new(Vec::new()),
            sending: Mutex::new(()),
            #[cfg(test)]
            sink: None,
        }
    }

    fn raw_fd(&self) -> Option<(RawFd, Arc<AsyncFd<OwnedFd>>)> {
        let g = self.fd.lock().unwrap();
        g.as_ref().map(|f| (f.get_ref().as_raw_fd(), f.clone()))
    }

    /// Verdicts on many packets: several messages per datagram (a handoff's held
    /// packets are let go in a few system calls, not one each).
    fn verdicts(&self, ids: impl IntoIterator<Item = u32>, v: Verdict) {
        let msgs: Vec<Vec<u8>> = ids
            .into_iter()
            .map(|id| verdict_msg(self.queue, id, v, false))
            .collect();
        self.send_verdicts(&msgs);
    }

    fn send_verdicts(&self, msgs: &[Vec<u8>]) {
        let Some((fd, _keep)) = self.raw_fd() else {
            return;
        };
        let mut buf = Vec::with_capacity(32 << 10);
        let mut at = 0;
        while at < msgs.len() {
            buf.clear();
            while at < msgs.len() && buf.len() + msgs[at].len() <= 32 << 10 {
                buf.extend_from_slice(&msgs[at]);
                at += 1;
            }
            loop {
                match send(fd, &buf, MsgFlags::empty()) {
                    Err(Errno::EINTR) => continue,
                    // The kernel drops a packet whose verdict never comes when the
                    // socket closes, or keeps it until then: either way it is not
                    // delivered.
                    Err(e) => debug!(error = %e, "verdicts on held packets not sent"),
                    Ok(_) => {}
                }
                break;
            }
        }
    }

    /// The hold on `mh` is over: its held packets of `live` flows (MH's end, other
    /// end: connections that run here now) go through the rules again, to their
    /// sockets; the others are dropped, as every held packet was before. A packet
    /// delivered where its connection does not live would be routed on to the MH,
    /// which would answer the FH with an RST.
    pub fn settle(&self, mh: IpAddr, live: &[(SocketAddr, SocketAddr)]) {
        let live: HashSet<(SocketAddr, SocketAddr)> = live.iter().copied().collect();
        let (go, drop): (Vec<u32>, Vec<u32>) = {
            let mut st = self.st.lock().unwrap();
            st.forward.remove(&mh);
            let (mine, rest): (Vec<Held>, Vec<Held>) = std::mem::take(&mut st.held)
                .into_iter()
                .partition(|h| h.ends.is_some_and(|e| e.src.ip() == mh || e.dst.ip() == mh));
            st.held = rest;
            let (go, drop): (Vec<Held>, Vec<Held>) = mine
                .into_iter()
                .partition(|h| h.ends.is_some_and(|e| of_flows(&live, &e)));
            (
                go.into_iter().map(|h| h.id).collect(),
                drop.into_iter().map(|h| h.id).collect(),
            )
        };
        if !go.is_empty() || !drop.is_empty() {
            debug!(%mh, delivered = go.len(), dropped = drop.len(), "held packets let go");
        }
        let st = &self.stats.stats;
        st.held_delivered
            .fetch_add(go.len() as u64, Ordering::Relaxed);
        st.held_dropped
            .fetch_add(drop.len() as u64, Ordering::Relaxed);
        self.verdicts(go, Verdict::Repeat);
        self.verdicts(drop, Verdict::Drop);
    }

    /// The acknowledgement numbers in the held TCP segments to or from `mh`, by
    /// (sender, receiver): what the peers of connections being restored here have
    /// acknowledged during the freeze (the queue's pending reports are read first).
    pub fn acks(&self, mh: IpAddr) -> HashMap<(SocketAddr, SocketAddr), Vec<u32>> {
        self.drain();
        let st = self.st.lock().unwrap();
        let mut acks: HashMap<(SocketAddr, SocketAddr), Vec<u32>> = HashMap::new();
        for h in &st.held {
            let Some(e) = h.ends.filter(|e| e.src.ip() == mh || e.dst.ip() == mh) else {
                continue;
            };
            if let Some(a) = tcp_ack(&h.packet) {
                acks.entry((e.src, e.dst)).or_default().push(a);
            }
        }
        acks
    }

    /// `flows` (MH's end, other end) belong to connections that just restarted here,
    /// their gate still closed: their held packets go to the sockets now, marked to
    /// get past the gate, before any newer packet of theirs can (what arrives until
    /// they are marked running is held by the gate: called again after the mark for
    /// those; delivered by the final [`Holding::settle`] instead, the held ones would
    /// come after the newer ones: a late ACK meeting a closed socket was routed on to
    /// the FH, which reset it).
    ///
    /// `resent`: the sockets, by (peer, socket's end), that re-sent their bytes in
    /// flight as new data at their restart, with their `snd_una` and, if they re-sent
    /// a FIN, one past it; the held segments their peers sent them are rewritten so as
    /// to acknowledge nothing of those bytes, unless they acknowledge the FIN
    /// ([`itcp_handoff::packet::forget_acks`]).
    pub fn deliver_restarted(
        &self,
        flows: &[(SocketAddr, SocketAddr)],
        resent: &HashMap<(SocketAddr, SocketAddr), (u32, Option<u32>)>,
    ) {
        // The hold is lifted: nothing more is queued for them, but what was may not
        // have been read yet.
        self.drain();
        let flows: HashSet<(SocketAddr, SocketAddr)> = flows.iter().copied().collect();
        let go: Vec<Held> = {
            let mut st = self.st.lock().unwrap();
            let (go, keep): (Vec<Held>, Vec<Held>) = std::mem::take(&mut st.held)
                .into_iter()
                .partition(|h| h.ends.is_some_and(|e| of_flows(&flows, &e)));
            st.held = keep;
            let (go, again) = in_sequence(go);
            self.stats
                .stats
                .held_dropped
                .fetch_add(again.len() as u64, Ordering::Relaxed);
            self.verdicts(again.iter().map(|h| h.id), Verdict::Drop);
            go
        };
        if go.is_empty() {
            return;
        }
        let st = &self.stats.stats;
        st.held_delivered
            .fetch_add(go.len() as u64, Ordering::Relaxed);
        let msgs: Vec<Vec<u8>> = go
            .into_iter()
            .map(|mut h| {
                let sent = h.ends.and_then(|e| resent.get(&(e.src, e.dst)));
                let rewritten =
                    sent.is_some_and(|&(una, fin)| forget_acks(&mut h.packet, una, fin));
                let payload = rewritten.then_some(&h.packet[..]);
                let mark = Some(self.pass_mark);
                verdict_msg_with(self.queue, h.id, Verdict::Repeat, false, mark, payload)
            })
            .collect();
        self.send_verdicts(&msgs);
    }

    /// The MH's `flows` (MH's end, other end) are being restored at the MSR at `via`,
    /// which holds them until they restart: a copy of each of their held packets goes
    /// there now, and of each that arrives until the handoff ends. The packets stay
    /// held here: [`Holding::forward`] drops them once the move is acknowledged,
    /// [`Holding::settle`] delivers them here after a rollback.
    pub fn send_ahead(&self, mh: IpAddr, via: IpAddr, flows: &[(SocketAddr, SocketAddr)]) {
        // Taken before the forward is set: a packet that arrives meanwhile finds it
        // set and waits for the backlog to be out.
        let _order = self.sending.lock().unwrap();
        let f = Forward {
            via,
            mac: None,
            flows: flows.iter().copied().collect(),
            until: Instant::now() + MAX_HELD,
            ahead: true,
        };
        let out: Vec<(u32, Vec<u8>)> = {
            let mut st = self.st.lock().unwrap();
            let out = st
                .held
                .iter()
                .filter(|h| !h.copied && h.ends.is_some_and(|e| of_flows(&f.flows, &e)))
                .map(|h| (h.id, h.packet.clone()))
                .collect();
            st.forward.insert(mh, f);
            out
        };
        let sent: HashSet<u32> = out
            .iter()
            .filter(|(_, p)| self.count_copy(self.send_on(mh, p)))
            .map(|(id, _)| *id)
            .collect();
        if !out.is_empty() {
            debug!(%mh, %via, packets = out.len(), copied = sent.len(), "held packets copied to the new MSR");
        }
        let mut st = self.st.lock().unwrap();
        for h in st.held.iter_mut().filter(|h| sent.contains(&h.id)) {
            h.copied = true;
        }
    }

    /// Counts a copy sent ahead (a failed one is retried by `forward`).
    fn count_copy(&self, sent: bool) -> bool {
        if sent {
            let st = &self.stats.stats;
            st.held_forwarded.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    /// The MH's `flows` (MH's end, other end) moved to the MSR at `via`: their held
    /// packets, and those that arrive for `window`, go there (those copied there
    /// already are not sent again). Others stay held.
    pub fn forward(
        &self,
        mh: IpAddr,
        via: IpAddr,
        flows: &[(SocketAddr, SocketAddr)],
        window: Duration,
    ) {
        let _order = self.sending.lock().unwrap();
        let f = Forward {
            via,
            mac: None,
            flows: flows.iter().copied().collect(),
            until: Instant::now() + window,
            ahead: false,
        };
        let out: Vec<Held> = {
            let mut st = self.st.lock().unwrap();
            let (out, keep): (Vec<Held>, Vec<Held>) = std::mem::take(&mut st.held)
                .into_iter()
                .partition(|h| h.ends.is_some_and(|e| of_flows(&f.flows, &e)));
            st.held = keep;
            // The link-layer address found for the copies holds for the rest.
            let mac = st
                .forward
                .get(&mh)
                .filter(|a| a.via == via)
                .and_then(|a| a.mac);
            st.forward.insert(mh, Forward { mac, ..f });
            out
        };
        if !out.is_empty() {
            debug!(%mh, %via, packets = out.len(), "held packets of connections that moved disposed of");
        }
        self.dispose(mh, &out);
    }

    /// Sends packets of `mh`'s moved flows on to the new MSR (but not again those
    /// copied there already). The caller holds `sending`.
    fn dispose(&self, mh: IpAddr, held: &[Held]) {
        for h in held.iter().filter(|h| !h.copied) {
            self.count_sent(self.send_on(mh, &h.packet));
        }
        // Sent on or not (then lost, as without the hold), they do not go on here.
        self.verdicts(held.iter().map(|h| h.id), Verdict::Drop);
    }

    fn count_sent(&self, sent: bool) {
        let st = &self.stats.stats;
        let c = if sent {
            &st.held_forwarded
        } else {
            &st.held_dropped
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends `packet` to the new MSR of `mh`, as a router would: an Ethernet frame to
    /// its link-layer address on the fixed LAN. False if that cannot be done.
    fn send_on(&self, mh: IpAddr, packet: &[u8]) -> bool {
        // Test hook: each packet goes on `MSRD_FAULT_DELAY_MS` late, as from a busy
        // router (it blocks the queue's reader, so they stay in order).
        if crate::faults::fault("slow_copy") {
            std::thread::sleep(crate::faults::fault_delay().unwrap_or(Duration::from_millis(1)));
        }
        #[cfg(test)]
        if let Some(sink) = &self.sink {
            return self.st.lock().unwrap().forward.contains_key(&mh) && sink(packet);
        }
        let Some(lan) = &self.lan else { return false };
        let (via, mac) = {
            let st = self.st.lock().unwrap();
            let Some(f) = st.forward.get(&mh) else {
                return false;
            };
            (f.via, f.mac)
        };
        let mac = match mac {
            Some(m) => m,
            None => match crate::netlink::neigh_mac(lan, via) {
                Ok(Some(m)) => {
                    if let Some(f) = self.st.lock().unwrap().forward.get_mut(&mh) {
                        f.mac = Some(m);
                    }
                    m
                }
                Ok(None) => {
                    debug!(%via, "held packets not forwarded: no neighbour entry for the new MSR");
                    return false;
                }
                Err(e) => {
                    debug!(%via, error = %e, "held packets not forwarded");
                    return false;
                }
            },
        };
        match send_frame(lan, mac, packet) {
            Ok(()) => true,
            Err(e) => {
                debug!(%via, error = %e, "held packet not forwarded");
                false
            }
        }
    }

    /// Reads and takes in every report pending on the queue's socket.
    fn drain(&self) -> Drained {
        let Some((fd, _keep)) = self.raw_fd() else {
            return Drained::Closed;
        };
        let mut buf = self.reading.lock().unwrap();
        if buf.is_empty() {
            buf.resize(256 << 10, 0);
        }
        loop {
            // The socket does not block (`open`).
            match recv(fd, &mut buf, MsgFlags::empty()) {
                Ok(n) => {
                    for q in parse(&buf[..n]) {
                        self.on_packet(q);
                    }
                }
                Err(Errno::EAGAIN) => return Drained::Empty,
                Err(Errno::EINTR) => {}
                Err(Errno::ENOBUFS) => {
                    self.st.lock().unwrap().lost = true;
                    debug!("hold queue reports overran");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "hold queue read failed");
                    return Drained::Failed;
                }
            }
        }
    }

    /// One packet from the kernel.
    fn on_packet(&self, q: Queued) {
        let e = ends(&q.packet);
        let now = Instant::now();
        let mut st = self.st.lock().unwrap();
        st.max_seen = Some(st.max_seen.map_or(q.id, |m| m.max(q.id)));
        let moved = e.and_then(|e| {
            [e.dst.ip(), e.src.ip()].into_iter().find_map(|ip| {
                st.forward
                    .get(&ip)
                    .filter(|f| f.until > now && of_flows(&f.flows, &e))
                    .map(|f| (ip, f.ahead))
            })
        });
        let mut h = Held {
            id: q.id,
            at: now,
            ends: e,
            packet: q.packet,
            copied: false,
        };
        match moved {
            Some((mh, false)) => {
                drop(st);
                let _order = self.sending.lock().unwrap();
                self.dispose(mh, std::slice::from_ref(&h));
            }
            Some((mh, true)) => {
                drop(st);
                let _order = self.sending.lock().unwrap();
                h.copied = self.count_copy(self.send_on(mh, &h.packet));
                self.st.lock().unwrap().held.push(h);
            }
            None => st.held.push(h),
        }
    }

    /// Drops what waited too long, forgets lapsed forwards, and drops the packets the
    /// kernel holds whose reports were lost.
    fn sweep(&self) {
        let now = Instant::now();
        let (old, lost_upto) = {
            let mut st = self.st.lock().unwrap();
            st.forward.retain(|_, f| f.until > now);
            let (old, keep): (Vec<Held>, Vec<Held>) = std::mem::take(&mut st.held)
                .into_iter()
                .partition(|h| now.duration_since(h.at) >= MAX_HELD);
            st.held = keep;
            // Every id below the oldest one still held, up to the last one seen, is a
            // packet the kernel holds and we do not know: drop them all in one verdict.
            let lost_upto = if st.lost {
                st.lost = false;
                let below = st
                    .held
                    .iter()
                    .map(|h| h.id)
                    .min()
                    .map(|m| m.wrapping_sub(1));
                match (st.max_seen, below) {
                    (Some(m), Some(b)) => Some(m.min(b)),
                    (m, None) => m,
                    (None, Some(_)) => None,
                }
            } else {
                None
            };
            (old, lost_upto)
        };
        if !old.is_empty() {
            debug!(
                packets = old.len(),
                "held packets dropped after waiting too long"
            );
        }
        self.verdicts(old.iter().map(|h| h.id), Verdict::Drop);
        if let Some(id) = lost_upto {
            self.send_verdicts(&[verdict_msg(self.queue, id, Verdict::Drop, true)]);
        }
    }

    /// A new hold on `mh` (its connections are in a new handoff): what arrives for it
    /// is held here again, no longer sent on to the MSR they went to last time.
    pub fn unforward(&self, mh: IpAddr) {
        self.st.lock().unwrap().forward.remove(&mh);
    }

    /// Lets the queue go (the kernel drops what is still held).
    pub fn close(&self) {
        self.fd.lock().unwrap().take();
    }

    /// Held packets now (for tests and the status).
    pub fn held(&self) -> usize {
        self.st.lock().unwrap().held.len()
    }
}

/// Sends one IP packet as an Ethernet frame to `mac` on `ifname` (AF_PACKET): it does
/// not pass this router's routing or netfilter, so a hold here cannot stop it.
fn send_frame(ifname: &str, mac: [u8; 6], packet: &[u8]) -> io::Result<()> {
    thread_local! {
        static SOCK: std::cell::RefCell<Option<OwnedFd>> = const { std::cell::RefCell::new(None) };
    }
    let idx = nix::net::if_::if_nametoindex(ifname).map_err(io::Error::from)?;
    let proto: u16 = if packet.first().is_some_and(|b| b >> 4 == 6) {
        libc::ETH_P_IPV6 as u16
    } else {
        libc::ETH_P_IP as u16
    };
    SOCK.with(|s| {
        let mut s = s.borrow_mut();
        if s.is_none() {
            *s = Some(crate::netlink::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM,
                0,
            )?);
        }
        let fd = s.as_ref().unwrap().as_raw_fd();
        // SAFETY: sockaddr_ll is plain data; all-zero is valid before the fields are set.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto.to_be();
        sll.sll_ifindex = idx as i32;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&mac);
        // SAFETY: the buffer and the address are live for the call, with their sizes.
        let n = unsafe {
            libc::sendto(
                fd,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    })
}

/// Opens the queue: fails with EBUSY while another socket (an msrd being upgraded)
/// holds it.
fn open(queue: u16) -> io::Result<OwnedFd> {
    let fd = nl_socket(libc::NETLINK_NETFILTER)?;
    let seq = next_seq(2);
    for (i, m) in config_msgs(queue, seq).iter().enumerate() {
        let s = seq.wrapping_add(i as u32);
        let ack = nl_exchange(fd.as_raw_fd(), m, s, 1, s)?;
        if ack.errno != 0 {
            return Err(kernel_error(
                &format!("NFQUEUE {queue}"),
                ack.errno,
                (ack.errno == libc::EBUSY).then_some("another program listens on it"),
                &ack,
            ));
        }
    }
    // Room for a burst of full-sized packets: an overrun loses reports, not packets
    // (they are dropped later, see `sweep`).
    let _ = socket2::SockRef::from(&fd).set_recv_buffer_size(8 << 20);
    socket2::SockRef::from(&fd).set_nonblocking(true)?;
    Ok(fd)
}

/// Reads the queue until the daemon ends. The queue is retried while another process
/// holds it (an msrd being upgraded still runs).
pub async fn run(h: Arc<Holding>) {
    let q = h.queue;
    let fd = crate::netlink::open_reports(
        || open(q),
        "hold queue",
        "packets held during handoffs are dropped until their queue opens",
    )
    .await;
    let fd = Arc::new(fd);
    *h.fd.lock().unwrap() = Some(fd.clone());
    info!(queue = h.queue, "hold queue up");
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            r = fd.readable() => {
                let Ok(mut ready) = r else { return };
                match h.drain() {
                    Drained::Empty => ready.clear_ready(),
                    Drained::Closed => return,
                    // As `netlink::read_reports` does: no busy loop on a lasting error.
                    Drained::Failed => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            _ = tick.tick() => h.sweep(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{align4, u16_at, u32_at};
    use std::net::Ipv6Addr;

    /// A TCP segment without data (lengths and data offset consistent: itcp-wire
    /// refuses a total length or data offset of zero).
    fn tcp4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[3] = 40;
        p[9] = 6;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p[32] = 5 << 4;
        p
    }

    #[test]
    fn ends_of_ipv4_and_ipv6_tcp() {
        let e = ends(&tcp4([10, 1, 0, 1], 5001, [10, 2, 0, 100], 40000)).unwrap();
        assert_eq!(e.src, "10.1.0.1:5001".parse().unwrap());
        assert_eq!(e.dst, "10.2.0.100:40000".parse().unwrap());
        let mut p = vec![0u8; 60];
        p[0] = 0x60;
        p[6] = 6;
        p[8..24].copy_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        p[24..40].copy_from_slice(&"2001:db8:2::100".parse::<Ipv6Addr>().unwrap().octets());
        p[5] = 20;
        p[40..42].copy_from_slice(&80u16.to_be_bytes());
        p[42..44].copy_from_slice(&443u16.to_be_bytes());
        p[52] = 0x50;
        let e = ends(&p).unwrap();
        assert_eq!(e.src, "[2001:db8::1]:80".parse().unwrap());
        assert_eq!(e.dst, "[2001:db8:2::100]:443".parse().unwrap());
        assert_eq!(ends(&[0x45, 0, 0]), None);
        assert_eq!(ends(&[]), None);
    }

    #[test]
    fn acks_of_segments_with_ack_set_only() {
        let mut p = tcp4([10, 1, 0, 1], 5001, [10, 2, 0, 100], 40000);
        p[28..32].copy_from_slice(&0xfeed_f00du32.to_be_bytes());
        p[32] = 0x50;
        for (flags, want) in [
            (0x10, Some(0xfeed_f00d)),
            (0x18, Some(0xfeed_f00d)),
            (0x11, Some(0xfeed_f00d)),
            (0x12, None), // SYN-ACK
            (0x14, None), // RST-ACK
            (0x02, None), // SYN
        ] {
            p[33] = flags;
            assert_eq!(tcp_ack(&p), want, "flags {flags:#x}");
        }
        let mut u = p.clone();
        u[9] = 17;
        assert_eq!(tcp_ack(&u), None, "UDP");
        assert_eq!(tcp_ack(&p[..30]), None, "truncated");
        let mut v6 = vec![0u8; 60];
        v6[0] = 0x60;
        v6[5] = 20;
        v6[6] = 6;
        v6[48..52].copy_from_slice(&7u32.to_be_bytes());
        v6[52] = 0x50;
        v6[53] = 0x10;
        assert_eq!(tcp_ack(&v6), Some(7));
    }

    #[test]
    fn packet_reports_parse_and_junk_is_skipped() {
        let payload = tcp4([10, 1, 0, 1], 5001, [10, 2, 0, 100], 40000);
        let mut b = Vec::new();
        let m = begin_msg(&mut b, (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET, 0, 1);
        put_nfgenmsg(&mut b, 2, 4954);
        put_attr(&mut b, NFQA_PACKET_HDR, &[0, 0, 1, 7, 8, 0, 0]);
        put_attr(&mut b, NFQA_PAYLOAD, &payload);
        end_msg(&mut b, m);
        // Another message type, then a truncated one.
        let m = begin_msg(&mut b, 0x0303, 0, 2);
        put_nfgenmsg(&mut b, 2, 4954);
        end_msg(&mut b, m);
        let got = parse(&b);
        assert_eq!(
            got,
            vec![Queued {
                id: 263,
                packet: payload.clone()
            }]
        );
        let mut cut = b.clone();
        cut.truncate(30);
        assert!(parse(&cut).is_empty());
    }

    #[test]
    fn verdict_layout() {
        let m = verdict_msg(4954, 263, Verdict::Repeat, false);
        assert_eq!(u16_at(&m, 4), (3 << 8) | 1);
        // nfgenmsg: family, version, be16 queue.
        assert_eq!(&m[18..20], &4954u16.to_be_bytes());
        // attribute: len 12, type 2, be32 verdict, be32 id.
        assert_eq!(u16_at(&m, 20), 12);
        assert_eq!(u16_at(&m, 22), NFQA_VERDICT_HDR);
        assert_eq!(&m[24..28], &4u32.to_be_bytes());
        assert_eq!(&m[28..32], &263u32.to_be_bytes());
        let b = verdict_msg(4954, 9, Verdict::Drop, true);
        assert_eq!(u16_at(&b, 4), (3 << 8) | 3);
        // A mark set with the verdict: one more attribute, len 8, type 3, be32.
        let m = verdict_msg_marked(4954, 263, Verdict::Repeat, false, Some(0x80004954));
        assert_eq!(u16_at(&m, 32), 8);
        assert_eq!(u16_at(&m, 34), NFQA_MARK);
        assert_eq!(&m[36..40], &0x80004954u32.to_be_bytes());
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        // New bytes for the packet: NFQA_PAYLOAD after the mark, padded to 4.
        let m = verdict_msg_with(4954, 263, Verdict::Repeat, false, Some(1), Some(&[9; 5]));
        assert_eq!(u16_at(&m, 40), 9);
        assert_eq!(u16_at(&m, 42), NFQA_PAYLOAD);
        assert_eq!(&m[44..49], &[9; 5]);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(m.len(), 52);
    }

    #[test]
    fn packets_of_moved_flows_go_on_both_ways_and_others_stay() {
        let mh: SocketAddr = "10.2.0.100:40000".parse().unwrap();
        let fh: SocketAddr = "10.1.0.1:5001".parse().unwrap();
        let other: SocketAddr = "10.1.0.1:5002".parse().unwrap();
        let f = Forward {
            via: "10.1.0.12".parse().unwrap(),
            mac: None,
            flows: [(mh, fh)].into_iter().collect(),
            until: Instant::now() + Duration::from_secs(1),
            ahead: false,
        };
        assert!(of_flows(&f.flows, &Ends { src: fh, dst: mh }));
        assert!(of_flows(&f.flows, &Ends { src: mh, dst: fh }));
        assert!(!of_flows(
            &f.flows,
            &Ends {
                src: other,
                dst: mh
            }
        ));
    }

    #[test]
    fn a_settled_or_forwarded_mh_leaves_the_others_held() {
        // No queue open: verdicts go nowhere, the bookkeeping is what is tested.
        let h = Holding::new(4954, None, 0x80004954, Arc::default());
        let pkt = |id, p: Vec<u8>| Queued { id, packet: p };
        // MH .100: a live flow (both ways) and a dead one; MH .101: one flow.
        h.on_packet(pkt(1, tcp4([10, 1, 0, 1], 5001, [10, 2, 0, 100], 40000)));
        h.on_packet(pkt(2, tcp4([10, 2, 0, 100], 40000, [10, 1, 0, 1], 5001)));
        h.on_packet(pkt(3, tcp4([10, 1, 0, 1], 5002, [10, 2, 0, 100], 40001)));
        h.on_packet(pkt(4, tcp4([10, 1, 0, 1], 5001, [10, 2, 0, 101], 40000)));
        assert_eq!(h.held(), 4);
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let live = [(
            "10.2.0.100:40000".parse().unwrap(),
            "10.1.0.1:5001".parse().unwrap(),
        )];
        h.forward(
            mh,
            "10.1.0.12".parse().unwrap(),
            &live,
            Duration::from_secs(1),
        );
        // The moved flow's two packets went on; the dead one waits for the release.
        assert_eq!(h.held(), 2);
        // Arriving now, a moved flow's packet goes on at once; another one waits.
        h.on_packet(pkt(5, tcp4([10, 1, 0, 1], 5001, [10, 2, 0, 100], 40000)));
        h.on_packet(pkt(6, tcp4([10, 1, 0, 1], 5003, [10, 2, 0, 100], 40002)));
        assert_eq!(h.held(), 3);
        h.settle(mh, &[]);
        assert_eq!(h.held(), 1, "only MH .101's packet is left");
        // No LAN to send on: the moved flows' packets count as dropped, like the rest.
        let st = h.stats.stats.snapshot();
        assert_eq!(
            (st.held_delivered, st.held_forwarded, st.held_dropped),
            (0, 0, 5)
        );
        assert_eq!(h.st.lock().unwrap().max_seen, Some(6));
    }

    /// A TCP segment of the flow 10.1.0.1:5001 → 10.2.0.100:40000 whose sequence
    /// number is `n`.
    fn numbered(n: u32) -> Vec<u8> {
        let mut p = tcp4([10, 1, 0, 1], 5001, [10, 2, 0, 100], 40000);
        p[24..28].copy_from_slice(&n.to_be_bytes());
        p
    }

    #[test]
    fn copies_to_the_new_msr_leave_in_the_order_their_packets_came() {
        use std::sync::mpsc;
        // The sink notes each copy's number once it is out; the first one it is given
        // (the backlog `send_ahead` sends) takes until the test lets it go.
        let out = Arc::new(Mutex::new(Vec::new()));
        let (started, is_started) = mpsc::channel();
        let (go, wait_go) = mpsc::channel::<()>();
        let wait_go = Mutex::new(Some(wait_go));
        let o = out.clone();
        let mut h = Holding::new(4954, None, 0x80004954, Arc::default());
        h.sink = Some(Box::new(move |p: &[u8]| {
            let first = wait_go.lock().unwrap().take();
            if let Some(w) = first {
                started.send(()).unwrap();
                w.recv().unwrap();
            }
            o.lock().unwrap().push(u32_at_be(p, 24));
            true
        }));
        let h = Arc::new(h);
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let flow = (
            "10.2.0.100:40000".parse().unwrap(),
            "10.1.0.1:5001".parse().unwrap(),
        );
        let pkt = |id, n| Queued {
            id,
            packet: numbered(n),
        };
        h.on_packet(pkt(1, 1));
        h.on_packet(pkt(2, 2));
        let h2 = h.clone();
        let ahead = std::thread::spawn(move || {
            h2.send_ahead(mh, "10.1.0.12".parse().unwrap(), &[flow]);
        });
        is_started.recv().unwrap();
        // Segment 3 reaches the queue while the backlog is going out.
        let h3 = h.clone();
        let arrival = std::thread::spawn(move || h3.on_packet(pkt(3, 3)));
        std::thread::sleep(Duration::from_millis(100));
        go.send(()).unwrap();
        ahead.join().unwrap();
        arrival.join().unwrap();
        assert_eq!(*out.lock().unwrap(), vec![1, 2, 3]);
        assert_eq!(h.held(), 3, "copies all: the packets stay held here");
    }

    #[test]
    fn held_segments_are_delivered_in_each_directions_sequence() {
        let held = |id, p: Vec<u8>| Held {
            id,
            at: Instant::now(),
            ends: ends(&p),
            packet: p,
            copied: false,
        };
        let mut up = tcp4([10, 2, 0, 100], 40000, [10, 1, 0, 1], 5001);
        up[24..28].copy_from_slice(&7u32.to_be_bytes());
        // Down, from u32::MAX - 999 (across the wrap): +0, +2000 (straight here),
        // +1000 (a late copy), the MH's segment (the other direction, left out below),
        // +2000 again (a duplicate: after the first), +3000.
        let near_wrap = u32::MAX - 999;
        let seqs = [
            near_wrap,
            near_wrap.wrapping_add(2000),
            near_wrap.wrapping_add(1000),
        ];
        let mut v: Vec<Held> = seqs
            .iter()
            .zip(1..)
            .map(|(&s, id)| held(id, numbered(s)))
            .collect();
        v.push(held(4, up));
        v.push(held(5, numbered(near_wrap.wrapping_add(2000))));
        v.push(held(6, numbered(near_wrap.wrapping_add(3000))));
        let down: Vec<u32> = in_sequence(v)
            .0
            .iter()
            .filter(|h| h.ends.unwrap().dst.port() == 40000)
            .map(|h| h.id)
            .collect();
        assert_eq!(down, vec![1, 3, 2, 5, 6]);
    }

    #[test]
    fn of_the_held_copies_of_a_segment_only_the_last_is_delivered() {
        // From the FH, all with valid lengths: (id, seq, payload length, flags).
        let seg = |id, seq: u32, len: u16, flags: u8| {
            let mut p = tcp4([10, 1, 0, 1], 5001, [10, 2, 0, 100], 40000);
            p[2..4].copy_from_slice(&(40 + len).to_be_bytes());
            p[24..28].copy_from_slice(&seq.to_be_bytes());
            p[32] = 5 << 4;
            p[33] = flags | 0x10;
            p.resize(40 + usize::from(len), 0);
            Held {
                id,
                at: Instant::now(),
                ends: ends(&p),
                packet: p,
                copied: false,
            }
        };
        let v = vec![
            seg(1, 1000, 100, 0),
            // Retransmitted into the freeze, with a newer ACK: this copy goes.
            seg(2, 1000, 100, 0),
            seg(3, 1100, 0, FIN),
            seg(4, 1100, 0, FIN),
            // Pure ACKs: each is news.
            seg(5, 1101, 0, 0),
            seg(6, 1101, 0, 0),
            // Part of the first segment again: another segment.
            seg(7, 1000, 50, 0),
        ];
        let (go, again) = in_sequence(v);
        let ids = |v: &[Held]| v.iter().map(|h| h.id).collect::<Vec<_>>();
        assert_eq!(ids(&go), vec![2, 7, 4, 5, 6]);
        assert_eq!(ids(&again), vec![1, 3]);
        // IPv6: the payload length counts from the end of the fixed header.
        let mut p6 = vec![0u8; 40 + 20 + 10];
        p6[0] = 0x60;
        p6[4..6].copy_from_slice(&30u16.to_be_bytes());
        p6[6] = 6;
        p6[52] = 5 << 4;
        p6[53] = 0x18;
        assert_eq!(tcp_extent(&p6), Some((10, 0x18)));
        assert_eq!(tcp_extent(&p6[..50]), None);
    }

    fn u32_at_be(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn bind_and_params_messages() {
        let [bind, params] = config_msgs(4954, 10);
        assert_eq!(u16_at(&bind, 4), (3 << 8) | 2);
        assert_eq!(&bind[18..20], &4954u16.to_be_bytes());
        assert_eq!(u16_at(&bind, 22), NFQA_CFG_CMD);
        assert_eq!(bind[24], NFQNL_CFG_CMD_BIND);
        assert_eq!(u32_at(&params, 8), 11);
        // copy range 0xffff, copy mode packet, then the queue's length.
        assert_eq!(&params[24..29], &[0, 0, 0xff, 0xff, NFQNL_COPY_PACKET]);
        let at = 20 + align4(4 + 5);
        assert_eq!(u16_at(&params, at + 2), NFQA_CFG_QUEUE_MAXLEN);
        assert_eq!(&params[at + 4..at + 8], &QUEUE_MAXLEN.to_be_bytes());
    }
}
