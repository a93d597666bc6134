//! Interception rules owned by msrd: one nftables table of its own and one fwmark policy
//! route, installed at start (replacing any leftovers of an earlier run atomically) and
//! removed at exit. Nothing else on the router is touched.
//!
//! * Packets that belong to a transparent socket of msrd — fixed-side sockets bound to an
//!   MH's address, MH listeners, transparent wireless-side sockets bound to an FH's
//!   address — are marked, and the mark routes them to the local stack instead of
//!   forwarding them.
//! * In transparent mode, new connections from the MH prefixes to the intercepted ports
//!   are diverted with TPROXY to msrd's transparent listener.
//!
//! Each step is one batched command (`nft -f -`, `ip -batch -`): one nft call costs
//! ~6 ms, so nothing here runs per connection.

use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use itcp_config::IpPrefix;

/// What the rules need to know.
#[derive(Debug, Clone)]
pub struct Rules {
    pub table: String,
    pub fwmark: u32,
    pub route_table: u32,
    /// Transparent mode: MH prefixes, ports and the local TPROXY port.
    pub transparent: Option<Transparent>,
    /// Network detection on some cells.
    pub detect: Option<Detection>,
    /// The MHs' prefixes (`[access] mh_prefixes`).
    pub mh_prefixes: Vec<IpPrefix>,
    /// The netfilter queue of held packets (`[interception] hold_queue`).
    pub hold_queue: u16,
    /// The NFLOG group SYN-ACKs sent to MHs are reported on (`crate::handshakes`),
    /// when handoff is on: `[interception] nflog_group` + 1.
    pub handshake_group: Option<u16>,
    /// msrd's own TCP ports that are not for the MHs (the metrics listener, the
    /// handoff channel): connections to them arriving on the cells are dropped.
    pub cell_guard: Option<CellGuard>,
}

/// Drops TCP to this router's addresses at `ports` arriving on `interfaces` (the
/// cells): the MHs reach msrd's SOCKS and greeting ports only, never its management
/// or MSR⇄MSR ports, whatever address those listen on.
#[derive(Debug, Clone)]
pub struct CellGuard {
    pub interfaces: Vec<String>,
    pub ports: Vec<u16>,
}

/// How often at most a station's frames that prove no address are reported (network
/// detection): each report asks every peer which MHs it is.
pub const STATION_ASK_MS: u64 = 1000;

/// How long a station no MSR served when asked is not asked about again.
pub const STATION_UNKNOWN_MS: u64 = 60_000;

/// How long after the last SYN-ACK sent to an MH a handoff still looks for its
/// half-open handshakes (see the `synack` sets).
pub const SYNACK_RECENT: Duration = Duration::from_secs(3);

/// Network detection, in a `netdev` table of the same name hooked at the cells'
/// ingress: the first frame of an MH that is not present here (sets `present4`,
/// `present6`) on one of `interfaces` — an IP packet, or an ARP or neighbour discovery
/// packet it sends (a host announcing itself or resolving its gateway on association)
/// — is reported on NFLOG group `group`. Its other packets are then dropped (never
/// answered) until msrd marks it present, at most `hold_ms` per report (sets
/// `arriving4`, `arriving6`); ARP and neighbour discovery pass. Greetings (UDP to
/// `greet_port`) pass unreported: an agent broadcasts them into every cell it hears,
/// and only the MSR a greeting names acts on it.
#[derive(Debug, Clone)]
pub struct Detection {
    pub interfaces: Vec<String>,
    pub mh_prefixes: Vec<IpPrefix>,
    /// The router's own cell addresses (in the MH prefixes, but no MH).
    pub gateways: Vec<IpAddr>,
    pub group: u16,
    pub hold_ms: u64,
    pub greet_port: u16,
}

#[derive(Debug, Clone)]
pub struct Transparent {
    pub mh_prefixes: Vec<IpPrefix>,
    pub ports: Vec<u16>,
    pub listen_port: u16,
}

/// A flow, or a flow with its timeout: the MH's end comes first.
trait Flow: Copy {
    fn is_ipv4(&self) -> bool;
}

impl Flow for (SocketAddr, SocketAddr) {
    fn is_ipv4(&self) -> bool {
        self.0.is_ipv4()
    }
}

impl Flow for (SocketAddr, SocketAddr, Duration) {
    fn is_ipv4(&self) -> bool {
        self.0.is_ipv4()
    }
}

/// `flows` split by address family, each non-empty part handed to `f` with its set's
/// name (`base` + 4 or 6).
fn by_family<T: Flow>(
    flows: &[T],
    base: &str,
    mut f: impl FnMut(&str, &[T]) -> io::Result<()>,
) -> io::Result<()> {
    let (v4, v6): (Vec<T>, Vec<T>) = flows.iter().partition(|x| x.is_ipv4());
    for (v, part) in [("4", v4), ("6", v6)] {
        if !part.is_empty() {
            f(&format!("{base}{v}"), &part)?;
        }
    }
    Ok(())
}

/// A flow set's key read from a packet both ways (the set holds each flow once).
fn flow_keys(ip: &str) -> [String; 2] {
    [
        format!("{ip} saddr . tcp sport . {ip} daddr . tcp dport"),
        format!("{ip} daddr . tcp dport . {ip} saddr . tcp sport"),
    ]
}

fn set<T: ToString>(items: &[T]) -> String {
    let v: Vec<String> = items.iter().map(T::to_string).collect();
    format!("{{ {} }}", v.join(", "))
}

impl Rules {
    /// The nft script that (re)creates msrd's table. `add` + `delete` first makes the
    /// replacement atomic and idempotent whether or not the table existed.
    pub fn nft_script(&self) -> String {
        let t = &self.table;
        let mark = format!("{:#x}", self.fwmark);
        let mut s = format!("add table inet {t}\ndelete table inet {t}\ntable inet {t} {{\n");
        // Flows of relays that ended gracefully here (see `Rules::end_flows`). Their
        // stray segments (the peer's answer to our FIN, retransmitted after the socket
        // that sent it took the first answer and closed) must meet silence, not an RST:
        // none is sent on them, and none is forwarded (transparent mode, where the
        // other host's connection has other sequence numbers). A SYN on the 4-tuple
        // takes it back.
        for (set, ty) in [("ended4", "ipv4_addr"), ("ended6", "ipv6_addr")] {
            s += &format!(
                "  set {set} {{\n    type {ty} . inet_service . {ty} . inet_service;\n    flags timeout;\n    size 262144;\n  }}\n"
            );
        }
        s += "  chain prerouting {\n    type filter hook prerouting priority mangle; policy accept;\n";
        for (ip, v) in [("ip", "4"), ("ip6", "6")] {
            for k in flow_keys(ip) {
                s += &format!(
                    "    tcp flags & (syn | ack) == syn {k} @ended{v} delete @ended{v} {{ {k} }}\n"
                );
            }
        }
        // An MH's SYN to an intercepted port goes to the TPROXY listener before any
        // socket lookup: a TIME_WAIT socket of ours on its 4-tuple (the MH reused its
        // port) would take it, find no listener on the FH's address and answer with
        // an ACK, which the MH resets. TPROXY itself passes a SYN that meets a
        // TIME_WAIT socket to the listener, and one of a live connection to that.
        if let Some(tp) = &self.transparent {
            let v4: Vec<&IpPrefix> = tp.mh_prefixes.iter().filter(|p| p.is_ipv4()).collect();
            let v6: Vec<&IpPrefix> = tp.mh_prefixes.iter().filter(|p| !p.is_ipv4()).collect();
            let ports = set(&tp.ports);
            let lp = tp.listen_port;
            if !v4.is_empty() {
                s += &format!(
                    "    ip saddr {} tcp dport {ports} tcp flags & (syn | ack) == syn tproxy ip to :{lp} meta mark set {mark} accept\n",
                    set(&v4)
                );
            }
            if !v6.is_empty() {
                s += &format!(
                    "    ip6 saddr {} tcp dport {ports} tcp flags & (syn | ack) == syn tproxy ip6 to :{lp} meta mark set {mark} accept\n",
                    set(&v6)
                );
            }
        }
        s += &format!(
            "    meta l4proto {{ tcp, icmp, ipv6-icmp }} socket transparent 1 meta mark set {mark} accept\n"
        );
        // Here no socket of ours took the segment (that rule accepted it). In
        // transparent mode the MH's connection and the FH's are two with one 4-tuple
        // and other sequence numbers: a segment of either side of an intercepted flow
        // that no socket takes here (a connection that lives at another MSR, or one that
        // finished here during its move) must not be forwarded to the other host, whose
        // connection would take it for garbage and answer with an RST (a held ACK of
        // the MH's, replayed after its restored connection closed, would reach the FH).
        if let Some(tp) = &self.transparent {
            let ports = set(&tp.ports);
            for (ip, v4) in [("ip", true), ("ip6", false)] {
                let p: Vec<&IpPrefix> = tp
                    .mh_prefixes
                    .iter()
                    .filter(|p| p.is_ipv4() == v4)
                    .collect();
                if p.is_empty() {
                    continue;
                }
                let p = set(&p);
                for (mh, port) in [("saddr", "dport"), ("daddr", "sport")] {
                    s += &format!(
                        "    iifname != \"lo\" tcp flags & syn == 0 {ip} {mh} {p} tcp {port} {ports} fib daddr type != local drop\n"
                    );
                }
            }
        }
        // One of an ended flow that would be forwarded goes nowhere. Segments for this router's
        // own addresses are left to their sockets (explicit mode: the kernel's RST, if
        // any, is dropped in `hold_out`).
        for (ip, v) in [("ip", "4"), ("ip6", "6")] {
            for k in flow_keys(ip) {
                s += &format!(
                    "    iifname != \"lo\" tcp flags & syn == 0 {k} @ended{v} fib daddr type != local drop\n"
                );
            }
        }
        s += "  }\n";
        // Flow holds (handoff): every TCP packet from or to a held MH is dropped — never
        // answered — in both directions, for forwarded and local traffic. Loopback is
        // exempt: a restored socket may be handed a replayed FIN through it.
        s += "  set held4 {\n    type ipv4_addr;\n  }\n  set held6 {\n    type ipv6_addr;\n  }\n";
        // A handoff about to freeze an MH stops answering its new SYNs first (the MH
        // retransmits them to the new MSR): a handshake answered here after the MH has
        // turned to the new MSR could not complete anywhere.
        s += "  set nosyn4 {\n    type ipv4_addr;\n  }\n  set nosyn6 {\n    type ipv6_addr;\n  }\n";
        // MHs that were sent a SYN-ACK lately: only they can have a handshake half-open
        // here (SYN_RECV) that completes within a handoff's wait for it. Listing
        // request sockets walks the kernel's whole connection hash (~4 ms on a large
        // machine), so a handoff asks this set first. Full (an MH prefix flooding SYNs
        // from 65536 addresses in 3 s), an MH would be missed: its handshake half-open
        // at the freeze stays here, as one older than 3 s does.
        for (set, ty) in [("synack4", "ipv4_addr"), ("synack6", "ipv6_addr")] {
            s += &format!(
                "  set {set} {{\n    type {ty};\n    flags dynamic, timeout;\n    timeout {}s;\n    size 65536;\n  }}\n",
                SYNACK_RECENT.as_secs()
            );
        }
        // Flows of MHs that moved here, closed at the old MSR (their TIME_WAIT and
        // closing states stay there): their stray segments are dropped, not answered
        // with RST, until the element times out. A new connection on the same 4-tuple
        // (a SYN either way) takes the tuple back.
        // A new MSR restarting an MH's restored connections gates the MH's inbound TCP:
        // only flows marked running (restarted) get through. A socket still in repair
        // mode would take and acknowledge segments, lost if its restart then failed.
        // The others are held (queued for msrd): a restarted connection's go to its
        // socket, after those held before them (`Holding::deliver_restarted`); the
        // rest are dropped when the gate opens (`Holding::settle`), as they were here.
        // Marks only expire (a delete costs the kernel far more than an add).
        s += "  set gated4 {\n    type ipv4_addr;\n  }\n  set gated6 {\n    type ipv6_addr;\n  }\n";
        for (set, ty) in [("running4", "ipv4_addr"), ("running6", "ipv6_addr")] {
            s += &format!(
                "  set {set} {{\n    type {ty} . inet_service . {ty} . inet_service;\n    flags timeout;\n    size 262144;\n  }}\n"
            );
        }
        // Flows of connections that moved in after the old MSR completed their handshake
        // with the MH's ACK replayed (`crate::handshakes`): the MH's SYN on one means our
        // SYN-ACK was lost, and is reported so that msrd sends it again.
        for (set, ty) in [("resyn4", "ipv4_addr"), ("resyn6", "ipv6_addr")] {
            s += &format!(
                "  set {set} {{\n    type {ty} . inet_service . {ty} . inet_service;\n    flags timeout;\n    size 65536;\n  }}\n"
            );
        }
        // Flows of connections that live at another MSR now (a partial handoff): their
        // segments are dropped silently. Flows that closed at another MSR (`closed`,
        // their TIME_WAIT there) likewise, but a FIN on one is reported first, to be
        // answered as that TIME_WAIT socket would. Never the former's: the connection
        // is alive elsewhere, and a FIN taken for acknowledged there would never reach it.
        for (set, ty) in [
            ("strays4", "ipv4_addr"),
            ("strays6", "ipv6_addr"),
            ("closed4", "ipv4_addr"),
            ("closed6", "ipv6_addr"),
        ] {
            s += &format!(
                "  set {set} {{\n    type {ty} . inet_service . {ty} . inet_service;\n    flags dynamic, timeout;\n    size 262144;\n  }}\n"
            );
        }
        // msrd inserts the rule that queues to `hold_queue` ahead of the drop
        // (`Rules::install`: an xt NFQUEUE target, which nft's syntax cannot express).
        s += "  chain held {\n    drop\n  }\n";
        for (chain, hook, lo) in [
            ("hold_in", "prerouting", "iifname"),
            ("hold_out", "output", "oifname"),
        ] {
            s += &format!(
                "  chain {chain} {{\n    type filter hook {hook} priority mangle - 10; policy accept;\n    {lo} \"lo\" accept\n"
            );
            if chain == "hold_out" {
                // No RST on a flow that ended gracefully here (see the `ended` sets).
                for (ip, v) in [("ip", "4"), ("ip6", "6")] {
                    for k in flow_keys(ip) {
                        s += &format!("    tcp flags rst {k} @ended{v} drop\n");
                    }
                }
                // Before the hold: a SYN-ACK dropped by it still has a request socket.
                // With handoff on, each is reported (`crate::handshakes`).
                let (v4, v6): (Vec<&IpPrefix>, Vec<&IpPrefix>) =
                    self.mh_prefixes.iter().partition(|p| p.is_ipv4());
                let log = self
                    .handshake_group
                    .map_or(String::new(), |g| format!(" log group {g}"));
                for (ip, v, p) in [("ip", "4", v4), ("ip6", "6", v6)] {
                    if !p.is_empty() {
                        s += &format!(
                            "    tcp flags & (syn | ack) == syn | ack {ip} daddr {} update @synack{v} {{ {ip} daddr }}{log}\n",
                            set(&p)
                        );
                    }
                }
            }
            // Inbound, held packets go to the `held` chain: queued for msrd (which
            // delivers, forwards or drops them when the hold ends), or dropped if the
            // queue rule is missing. Outbound ones come from this router's own sockets
            // (frozen ones among them): dropped.
            let verdict = if chain == "hold_in" {
                "jump held"
            } else {
                "drop"
            };
            if let (Some(g), "hold_in") = (self.handshake_group, chain) {
                for (ip, v) in [("ip", "4"), ("ip6", "6")] {
                    s += &format!(
                        "    tcp flags & (syn | ack) == syn {ip} saddr . tcp sport . {ip} daddr . tcp dport @resyn{v} log group {g} drop\n"
                    );
                }
            }
            for (ip, v) in [("ip", "4"), ("ip6", "6")] {
                for dir in ["saddr", "daddr"] {
                    s += &format!("    meta l4proto tcp {ip} {dir} @held{v} {verdict}\n");
                }
            }
            if chain == "hold_in" {
                s += &format!("    meta mark {:#x} accept\n", pass_mark(self.fwmark));
                s += "    tcp flags & (syn | ack) == syn ip saddr @nosyn4 drop\n    tcp flags & (syn | ack) == syn ip6 saddr @nosyn6 drop\n";
                for (ip, v) in [("ip", "4"), ("ip6", "6")] {
                    s += &format!(
                        "    meta l4proto tcp {ip} saddr @gated{v} {ip} saddr . tcp sport . {ip} daddr . tcp dport != @running{v} jump held\n\
                         \x20   meta l4proto tcp {ip} daddr @gated{v} {ip} daddr . tcp dport . {ip} saddr . tcp sport != @running{v} jump held\n"
                    );
                }
            }
            for (ip, set) in [
                ("ip", "strays4"),
                ("ip6", "strays6"),
                ("ip", "closed4"),
                ("ip6", "closed6"),
            ] {
                let keys = flow_keys(ip);
                for k in &keys {
                    s += &format!(
                        "    tcp flags & (syn | ack) == syn {k} @{set} delete @{set} {{ {k} }}\n"
                    );
                }
                if chain == "hold_in" {
                    // A FIN of a closed flow is reported first: msrd answers it as the
                    // flow's TIME_WAIT socket would (`crate::strays::time_wait_ack`).
                    if let (Some(g), true) = (self.handshake_group, set.starts_with("closed")) {
                        for k in &keys {
                            s += &format!(
                                "    tcp flags & (fin | syn | rst) == fin {k} @{set} log group {g} drop\n"
                            );
                        }
                    }
                    for k in &keys {
                        s += &format!("    meta l4proto tcp {k} @{set} drop\n");
                    }
                }
            }
            s += "  }\n";
        }
        if let Some(g) = &self.cell_guard {
            // Local destinations only: a TPROXY'd connection to an FH's port passes.
            let ifs: Vec<String> = g.interfaces.iter().map(|i| format!("\"{i}\"")).collect();
            s += &format!(
                "  chain input {{\n    type filter hook input priority filter; policy accept;\n    iifname {} fib daddr type local tcp dport {} drop\n  }}\n",
                set(&ifs),
                set(&g.ports)
            );
        }
        s += "}\n";
        if let Some(dt) = &self.detect {
            s += &dt.nft_table(t);
        }
        s
    }

    /// Marks `mh` present here (no more detection for it) or not, and ends its
    /// arrival hold. No-ops without detection.
    pub fn set_present(&self, mh: IpAddr, present: bool) -> io::Result<()> {
        let Some(dt) = &self.detect else {
            return Ok(());
        };
        if !dt.mh_prefixes.iter().any(|p| p.contains(mh)) {
            return Ok(());
        }
        let (p, a) = if mh.is_ipv4() {
            ("present4", "arriving4")
        } else {
            ("present6", "arriving6")
        };
        let t = &self.table;
        crate::netlink::nft_netdev_set_element(t, p, mh, present)?;
        if present {
            crate::netlink::nft_netdev_set_element(t, a, mh, false)?;
        }
        Ok(())
    }

    /// Marks station `mac` as served here, or not: while it is, its frames that prove
    /// no address (link-local, unspecified source) are not reported. Either way it
    /// is no longer unknown ([`Rules::set_station_unknown`]): it is here, or it was
    /// and left, and its return must be reported. No-op without detection.
    pub fn set_station_here(&self, mac: [u8; 6], here: bool) -> io::Result<()> {
        if self.detect.is_none() {
            return Ok(());
        }
        let t = &self.table;
        crate::netlink::nft_netdev_mac_element(t, "unknown", mac, false, None)?;
        crate::netlink::nft_netdev_mac_element(t, "stations", mac, here, None)
    }

    /// No MSR served station `mac` when asked: its frames that prove no address are not
    /// reported for [`STATION_UNKNOWN_MS`]. No-op without detection.
    pub fn set_station_unknown(&self, mac: [u8; 6]) -> io::Result<()> {
        if self.detect.is_none() {
            return Ok(());
        }
        crate::netlink::nft_netdev_mac_element(&self.table, "unknown", mac, true, None)
    }

    /// Ends the arrival hold of `mh` without marking it present: its next frame is
    /// reported again (its last one proved nothing, see [`crate::departed`]).
    pub fn rearm_detection(&self, mh: IpAddr) -> io::Result<()> {
        if self.detect.is_none() {
            return Ok(());
        }
        let a = if mh.is_ipv4() {
            "arriving4"
        } else {
            "arriving6"
        };
        crate::netlink::nft_netdev_set_element(&self.table, a, mh, false)
    }

    fn held_set(&self, mh: IpAddr) -> (&'static str, String) {
        (if mh.is_ipv4() { "held4" } else { "held6" }, mh.to_string())
    }

    /// Holds every TCP packet from and to `mh` (dropped silently, so neither side
    /// answers with RST) until [`Rules::release`]. One netlink message (~10 µs).
    pub fn hold(&self, mh: IpAddr) -> io::Result<()> {
        let (set, _) = self.held_set(mh);
        crate::netlink::nft_set_element(&self.table, set, mh, true)
    }

    /// Drops (`on`) or lets through again the SYNs that `mh` sends, silently: see the
    /// `nosyn` sets. One netlink message.
    pub fn hold_syns(&self, mh: IpAddr, on: bool) -> io::Result<()> {
        let set = if mh.is_ipv4() { "nosyn4" } else { "nosyn6" };
        crate::netlink::nft_set_element(&self.table, set, mh, on)
    }

    /// Drops stray segments of `flows`, connections that live at another MSR (each the
    /// MH's end, the other end, and for how long), silently (see the `strays` sets).
    pub fn drop_strays(&self, flows: &[(SocketAddr, SocketAddr, Duration)]) -> io::Result<()> {
        by_family(flows, "strays", |set, f| {
            crate::netlink::nft_flow_elements(&self.table, set, f)
        })
    }

    /// Drops stray segments of `flows`, closed at the MH's previous MSR (each the MH's
    /// end, the other end, and for how long) silently, but reports their FINs (see the
    /// `closed` sets).
    pub fn drop_closed(&self, flows: &[(SocketAddr, SocketAddr, Duration)]) -> io::Result<()> {
        by_family(flows, "closed", |set, f| {
            crate::netlink::nft_flow_elements(&self.table, set, f)
        })
    }

    /// Lets the segments of `flows` through again (see [`Rules::drop_closed`]); a flow
    /// not dropped is no error.
    pub fn undrop_closed(&self, flows: &[(SocketAddr, SocketAddr)]) -> io::Result<()> {
        by_family(flows, "closed", |set, f| {
            crate::netlink::nft_flow_elements_delete(&self.table, set, f)
        })
    }

    /// Reports the MH's SYNs on `flows` (each the MH's end, ours, and for how long) and
    /// drops them (see the `resyn` sets and `crate::handshakes`).
    pub fn answer_syns(&self, flows: &[(SocketAddr, SocketAddr, Duration)]) -> io::Result<()> {
        by_family(flows, "resyn", |set, f| {
            crate::netlink::nft_flow_elements(&self.table, set, f)
        })
    }

    /// Whether `mh` was sent a SYN-ACK in the last [`SYNACK_RECENT`] (see the
    /// `synack` sets). One netlink round trip.
    pub fn synack_recent(&self, mh: IpAddr) -> io::Result<bool> {
        let set = if mh.is_ipv4() { "synack4" } else { "synack6" };
        crate::netlink::nft_set_has(&self.table, set, mh)
    }

    /// Records `flows` (each one end, the other end, and for how long) as ended
    /// gracefully here: see the `ended` sets. Harmless while their sockets live: only
    /// RSTs and segments no socket of ours takes are dropped.
    pub fn end_flows(&self, flows: &[(SocketAddr, SocketAddr, Duration)]) -> io::Result<()> {
        by_family(flows, "ended", |set, f| {
            crate::netlink::nft_flow_elements(&self.table, set, f)
        })
    }

    /// Lets the segments of `flows` through again (see [`Rules::drop_strays`]); a flow
    /// not dropped is no error.
    pub fn undrop_strays(&self, flows: &[(SocketAddr, SocketAddr)]) -> io::Result<()> {
        by_family(flows, "strays", |set, f| {
            crate::netlink::nft_flow_elements_delete(&self.table, set, f)
        })
    }

    /// Gates (`on`) the inbound TCP of `mh` or lifts the gate: only flows marked
    /// running get through (see the `gated` sets). One netlink message.
    pub fn gate(&self, mh: IpAddr, on: bool) -> io::Result<()> {
        let set = if mh.is_ipv4() { "gated4" } else { "gated6" };
        crate::netlink::nft_set_element(&self.table, set, mh, on)
    }

    /// Marks `flows` (each the MH's end and the other end) running for `ttl`: their
    /// segments pass a gate.
    pub fn mark_running(
        &self,
        flows: &[(SocketAddr, SocketAddr)],
        ttl: Duration,
    ) -> io::Result<()> {
        let timed: Vec<_> = flows.iter().map(|&(a, z)| (a, z, ttl)).collect();
        by_family(&timed, "running", |set, f| {
            crate::netlink::nft_flow_elements(&self.table, set, f)
        })
    }

    /// Takes the running mark off `flows` before it expires (a flow not marked is no
    /// error).
    pub fn unmark_running(&self, flows: &[(SocketAddr, SocketAddr)]) -> io::Result<()> {
        by_family(flows, "running", |set, f| {
            crate::netlink::nft_flow_elements_delete(&self.table, set, f)
        })
    }

    /// Ends a hold (no error if there was none).
    pub fn release(&self, mh: IpAddr) -> io::Result<()> {
        let (set, _) = self.held_set(mh);
        crate::netlink::nft_set_element(&self.table, set, mh, false)
    }

    /// `ip -batch` lines installing the policy route (after removing an old copy).
    /// `ip -4 -batch` and `ip -6 -batch` lines (a batch line cannot carry `-6` itself).
    pub fn ip_install(&self) -> [String; 2] {
        let (m, t) = (self.fwmark, self.route_table);
        ["0.0.0.0/0", "::/0"].map(|any| {
            format!(
                "rule del fwmark {m:#x} lookup {t}\nroute flush table {t}\nrule add fwmark {m:#x} lookup {t}\nroute add local {any} dev lo table {t}\n"
            )
        })
    }

    /// `ip -4 -batch` and `ip -6 -batch` lines removing what `ip_install` made.
    pub fn ip_remove(&self) -> String {
        let (m, t) = (self.fwmark, self.route_table);
        format!("rule del fwmark {m:#x} lookup {t}\nroute flush table {t}\n")
    }

    /// Installs the table and the policy route.
    pub fn install(&self) -> io::Result<()> {
        run("nft", &["-f", "-"], &self.nft_script())?;
        // Held packets are queued for msrd rather than dropped (`crate::holding`).
        if let Err(e) = crate::netlink::nft_queue_rule(&self.table, "held", self.hold_queue) {
            tracing::warn!(error = %e, "packets held during handoffs are dropped, not queued: hosts may wait for a retransmission timeout after one");
        }
        let [v4, v6] = self.ip_install();
        // Deleting what is not there fails harmlessly: -force goes on past it.
        run("ip", &["-4", "-force", "-batch", "-"], &v4).or_else(|e| {
            // -force still reports failure if any line failed; the adds must have worked.
            check_rule(self.fwmark, false).then_some(()).ok_or(e)
        })?;
        // IPv6 may be disabled on the router: then there is nothing to intercept there.
        if let Err(e) = run("ip", &["-6", "-force", "-batch", "-"], &v6) {
            if !check_rule(self.fwmark, true) {
                tracing::info!(error = %e, "no IPv6 policy route (IPv6 off?): IPv6 is not intercepted");
            }
        }
        Ok(())
    }

    /// Removes everything `install` made. Errors are ignored: this runs at exit.
    pub fn remove(&self) {
        let _ = run("nft", &["delete", "table", "inet", &self.table], "");
        if self.detect.is_some() {
            let _ = run("nft", &["delete", "table", "netdev", &self.table], "");
        }
        for v in ["-4", "-6"] {
            let _ = run("ip", &[v, "-force", "-batch", "-"], &self.ip_remove());
        }
    }
}

impl Detection {
    fn nft_table(&self, t: &str) -> String {
        let ifs: Vec<String> = self.interfaces.iter().map(|i| format!("{i:?}")).collect();
        let v4: Vec<&IpPrefix> = self.mh_prefixes.iter().filter(|p| p.is_ipv4()).collect();
        let gw: Vec<&IpAddr> = self.gateways.iter().filter(|g| g.is_ipv4()).collect();
        let v6: Vec<&IpPrefix> = self.mh_prefixes.iter().filter(|p| !p.is_ipv4()).collect();
        let gw6: Vec<&IpAddr> = self.gateways.iter().filter(|g| !g.is_ipv4()).collect();
        let g = self.group;
        let mut s = format!(
            "add table netdev {t}\ndelete table netdev {t}\ntable netdev {t} {{\n\
             \x20 set present4 {{\n    type ipv4_addr;\n    size 65536;\n  }}\n\
             \x20 set arriving4 {{\n    type ipv4_addr;\n    flags dynamic, timeout;\n    timeout {0}ms;\n    size 65536;\n  }}\n\
             \x20 set present6 {{\n    type ipv6_addr;\n    size 65536;\n  }}\n\
             \x20 set arriving6 {{\n    type ipv6_addr;\n    flags dynamic, timeout;\n    timeout {0}ms;\n    size 65536;\n  }}\n\
             \x20 set stations {{\n    type ether_addr;\n    size 65536;\n  }}\n\
             \x20 set unknown {{\n    type ether_addr;\n    flags timeout;\n    timeout {4}ms;\n    size 65536;\n  }}\n\
             \x20 set asking {{\n    type ether_addr;\n    flags dynamic, timeout;\n    timeout {3}ms;\n    size 4096;\n  }}\n\
             \x20 chain cells {{\n    type filter hook ingress devices = {1} priority -500; policy accept;\n\
             \x20   ether type arp jump arp_in\n\
             \x20   ether type ip6 ip6 saddr {{ ::, fe80::/10 }} jump station\n\
             {2}    ether type != ip accept\n\
             \x20   ip saddr 0.0.0.0 jump station\n",
            self.hold_ms,
            set(&ifs),
            if v6.is_empty() { "" } else { "    ether type ip6 jump ip6_in\n" },
            STATION_ASK_MS,
            STATION_UNKNOWN_MS,
        );
        let not_mh = |key: &str| {
            let mut r = String::new();
            if v4.is_empty() {
                r += "    accept\n";
            } else {
                r += &format!("    {key} != {} accept\n", set(&v4));
            }
            if !gw.is_empty() {
                r += &format!("    {key} {} accept\n", set(&gw));
            }
            r += &format!("    {key} @present4 accept\n");
            r
        };
        s += &not_mh("ip saddr");
        let gp = self.greet_port;
        s += &format!(
            "    ip protocol udp udp dport {gp} accept\n\
             \x20   ip saddr @arriving4 counter drop\n\
             \x20   add @arriving4 {{ ip saddr }} counter log group {g} drop\n  }}\n"
        );
        // A frame that proves no address (an IPv6 link-local or unspecified source,
        // DHCP, an ARP probe): what a host's OS sends first on link-up. Only its
        // link-layer address counts: reported once per STATION_ASK_MS, never held.
        s += &format!(
            "  chain station {{\n    ether saddr @stations accept\n    ether saddr @unknown accept\n    ether saddr @asking accept\n\
             \x20   add @asking {{ ether saddr }} counter log group {g} accept\n    accept\n  }}\n"
        );
        s += "  chain arp_in {\n    arp saddr ip 0.0.0.0 jump station\n";
        s += &not_mh("arp saddr ip");
        s += &format!(
            "    arp saddr ip @arriving4 accept\n\
             \x20   add @arriving4 {{ arp saddr ip }} counter log group {g} accept\n  }}\n"
        );
        if !v6.is_empty() {
            s += &format!("  chain ip6_in {{\n    ip6 saddr != {} accept\n", set(&v6));
            if !gw6.is_empty() {
                s += &format!("    ip6 saddr {} accept\n", set(&gw6));
            }
            s += &format!(
                "    ip6 saddr @present6 accept\n\
                 \x20   ip6 nexthdr udp udp dport {gp} accept\n\
                 \x20   icmpv6 type {{ nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert }} jump nd_in\n\
                 \x20   ip6 saddr @arriving6 counter drop\n\
                 \x20   add @arriving6 {{ ip6 saddr }} counter log group {g} drop\n  }}\n\
                 \x20 chain nd_in {{\n    ip6 saddr @arriving6 accept\n\
                 \x20   add @arriving6 {{ ip6 saddr }} counter log group {g} accept\n  }}\n"
            );
        }
        s += "}\n";
        s
    }
}

/// The mark a held packet is delivered with once its connection restarted here: it
/// gets past the gate, which still drops what arrives on that flow meanwhile, so the
/// held packets reach the socket before any newer one (`crate::holding`).
pub fn pass_mark(fwmark: u32) -> u32 {
    fwmark ^ 0x8000_0000
}

/// True if a rule for this mark is in place.
fn check_rule(mark: u32, v6: bool) -> bool {
    let mut c = Command::new("ip");
    if v6 {
        c.arg("-6");
    }
    c.args(["rule", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("fwmark {mark:#x}")))
        .unwrap_or(false)
}

fn run(prog: &str, args: &[&str], stdin: &str) -> io::Result<()> {
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run {prog}: {e} (is it installed?)"),
            )
        })?;
    child.stdin.take().unwrap().write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{prog} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// msrd's rules as the configuration asks for them.
pub fn rules_of(cfg: &itcp_config::MsrdConfig) -> Rules {
    let i = &cfg.interception;
    Rules {
        table: i.nft_table.clone(),
        fwmark: i.fwmark,
        route_table: i.route_table,
        transparent: cfg.transparent.enabled.then(|| Transparent {
            mh_prefixes: cfg.access.mh_prefixes.clone(),
            ports: cfg.transparent.ports.clone(),
            listen_port: cfg.transparent.listen_port,
        }),
        detect: {
            let ifs: Vec<String> = cfg
                .cells
                .iter()
                .filter(|c| c.detect == itcp_config::Detect::Network)
                .map(|c| c.interface.clone())
                .collect();
            (!ifs.is_empty()).then(|| crate::intercept::Detection {
                interfaces: ifs,
                mh_prefixes: cfg.access.mh_prefixes.clone(),
                gateways: cfg.msr.gateway.clone(),
                group: i.nflog_group,
                hold_ms: cfg.handoff.detect_hold_ms,
                greet_port: cfg.handoff.greet_port,
            })
        },
        mh_prefixes: cfg.access.mh_prefixes.clone(),
        hold_queue: i.hold_queue,
        handshake_group: cfg.handoff.listen.map(|_| i.nflog_group.wrapping_add(1)),
        cell_guard: {
            let mut ports: Vec<u16> = [cfg.metrics.listen, cfg.handoff.listen]
                .into_iter()
                .flatten()
                .map(|a| a.port())
                .collect();
            ports.dedup();
            let ifs: Vec<String> = cfg.cells.iter().map(|c| c.interface.clone()).collect();
            (!ports.is_empty() && !ifs.is_empty()).then_some(CellGuard {
                interfaces: ifs,
                ports,
            })
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(tp: bool) -> Rules {
        Rules {
            table: "itcp_msrd".into(),
            fwmark: 0x4954,
            route_table: 4954,
            transparent: tp.then(|| Transparent {
                mh_prefixes: vec![
                    "10.2.0.0/24".parse().unwrap(),
                    "2001:db8::/64".parse().unwrap(),
                ],
                ports: vec![80, 443],
                listen_port: 1081,
            }),
            detect: None,
            hold_queue: 4954,
            handshake_group: Some(4955),
            mh_prefixes: vec![
                "10.2.0.0/24".parse().unwrap(),
                "2001:db8::/64".parse().unwrap(),
            ],
            cell_guard: None,
        }
    }

    #[test]
    fn the_cells_cannot_reach_msrds_own_ports() {
        assert!(!rules(true).nft_script().contains("chain input"));
        let mut r = rules(true);
        r.cell_guard = Some(CellGuard {
            interfaces: vec!["cell0".into(), "cell1".into()],
            ports: vec![4347, 9473],
        });
        let s = r.nft_script();
        let chain = &s[s.find("chain input {").expect("an input chain")..];
        let chain = &chain[..chain.find("  }").unwrap()];
        assert!(chain.contains("type filter hook input priority filter; policy accept;"));
        // One rule for every cell and port, local destinations only.
        assert_eq!(
            chain.lines().filter(|l| l.contains("drop")).collect::<Vec<_>>(),
            ["    iifname { \"cell0\", \"cell1\" } fib daddr type local tcp dport { 4347, 9473 } drop"]
        );
        let mut cfg = itcp_config::MsrdConfig::from_str(
            "[msr]\ngateway = [\"10.2.0.1\"]\n[access]\nmh_prefixes = [\"10.2.0.0/24\"]\n\
             [metrics]\nlisten = \"10.1.0.11:9473\"\n[[cell]]\ninterface = \"cell0\"\n",
            "t",
        )
        .unwrap();
        let g = rules_of(&cfg).cell_guard.expect("guarded");
        assert_eq!(
            (g.interfaces, g.ports),
            (vec!["cell0".to_string()], vec![9473])
        );
        cfg.metrics.listen = None;
        assert!(
            rules_of(&cfg).cell_guard.is_none(),
            "no port of ours to guard"
        );
    }

    #[test]
    fn network_detection_reports_an_mh_once_and_drops_its_packets_until_present() {
        let mut r = rules(true);
        r.detect = Some(Detection {
            interfaces: vec!["cell0".into(), "cell1".into()],
            mh_prefixes: r.transparent.as_ref().unwrap().mh_prefixes.clone(),
            gateways: vec!["10.2.0.1".parse().unwrap(), "2001:db8::1".parse().unwrap()],
            group: 77,
            hold_ms: 500,
            greet_port: 4346,
        });
        let s = r.nft_script();
        let t = &s[s
            .find("add table netdev itcp_msrd")
            .expect("a netdev table")..];
        let chain = |name: &str| -> Vec<String> {
            let c = &t[t.find(&format!("chain {name} {{")).unwrap()..];
            let c = &c[..c.find("  }").unwrap()];
            c.lines().skip(1).map(|l| l.trim().to_string()).collect()
        };
        assert_eq!(
            chain("cells"),
            [
                "type filter hook ingress devices = { \"cell0\", \"cell1\" } priority -500; policy accept;",
                "ether type arp jump arp_in",
                "ether type ip6 ip6 saddr { ::, fe80::/10 } jump station",
                "ether type ip6 jump ip6_in",
                "ether type != ip accept",
                "ip saddr 0.0.0.0 jump station",
                "ip saddr != { 10.2.0.0/24 } accept",
                "ip saddr { 10.2.0.1 } accept",
                "ip saddr @present4 accept",
                "ip protocol udp udp dport 4346 accept",
                "ip saddr @arriving4 counter drop",
                "add @arriving4 { ip saddr } counter log group 77 drop",
            ]
        );
        // ARP reports an arrival too, and always passes.
        assert_eq!(
            chain("arp_in"),
            [
                "arp saddr ip 0.0.0.0 jump station",
                "arp saddr ip != { 10.2.0.0/24 } accept",
                "arp saddr ip { 10.2.0.1 } accept",
                "arp saddr ip @present4 accept",
                "arp saddr ip @arriving4 accept",
                "add @arriving4 { arp saddr ip } counter log group 77 accept",
            ]
        );
        // IPv6: neighbour discovery reports and passes, like ARP.
        assert_eq!(
            chain("ip6_in"),
            [
                "ip6 saddr != { 2001:db8::/64 } accept",
                "ip6 saddr { 2001:db8::1 } accept",
                "ip6 saddr @present6 accept",
                "ip6 nexthdr udp udp dport 4346 accept",
                "icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } jump nd_in",
                "ip6 saddr @arriving6 counter drop",
                "add @arriving6 { ip6 saddr } counter log group 77 drop",
            ]
        );
        // A frame that proves no address names its station only: reported once a
        // second per MAC unless the station is here or unknown, and never dropped.
        assert_eq!(
            chain("station"),
            [
                "ether saddr @stations accept",
                "ether saddr @unknown accept",
                "ether saddr @asking accept",
                "add @asking { ether saddr } counter log group 77 accept",
                "accept",
            ]
        );
        assert!(t.contains("timeout 500ms;"));
        assert!(!rules(true).nft_script().contains("netdev"));
    }

    #[test]
    fn a_closed_flows_fin_is_reported_before_its_segments_are_dropped() {
        let chain = |s: &str| -> Vec<String> {
            let c = &s[s.find("chain hold_in {").unwrap()..];
            let c = &c[..c.find("  }").unwrap()];
            c.lines().map(|l| l.trim().to_string()).collect()
        };
        let with = chain(&rules(true).nft_script());
        let pos = |want: &str| with.iter().position(|l| l == want);
        let k = "ip saddr . tcp sport . ip daddr . tcp dport";
        let report = pos(&format!(
            "tcp flags & (fin | syn | rst) == fin {k} @closed4 log group 4955 drop"
        ))
        .expect("the FIN report");
        let drop = pos(&format!("meta l4proto tcp {k} @closed4 drop")).expect("the drop");
        assert!(report < drop);
        // A connection alive at another MSR: its FIN is only dropped.
        assert!(pos(&format!("meta l4proto tcp {k} @strays4 drop")).is_some());
        assert!(!with.iter().any(|l| l.contains("@strays4 log")));
        let mut no_group = rules(true);
        no_group.handshake_group = None;
        assert!(!chain(&no_group.nft_script())
            .iter()
            .any(|l| l.contains(" log ")));
    }

    #[test]
    fn explicit_mode_marks_transparent_sockets_only() {
        let s = rules(false).nft_script();
        assert!(s.starts_with("add table inet itcp_msrd\ndelete table inet itcp_msrd\n"));
        assert!(s.contains("meta l4proto { tcp, icmp, ipv6-icmp } socket transparent 1 meta mark set 0x4954 accept"));
        assert!(!s.contains("tproxy"));
    }

    #[test]
    fn ended_flows_draw_no_rst_and_are_not_forwarded() {
        let s = rules(true).nft_script();
        let chain = |name: &str| {
            let c = &s[s.find(&format!("chain {name} {{")).unwrap()..];
            c[..c.find("\n  }").unwrap()].to_string()
        };
        // Declared before the chains that use them.
        assert!(s.find("set ended4 {").unwrap() < s.find("chain prerouting").unwrap());
        let (pre, out) = (chain("prerouting"), chain("hold_out"));
        let k = "ip saddr . tcp sport . ip daddr . tcp dport";
        let r = "ip6 daddr . tcp dport . ip6 saddr . tcp sport";
        // A SYN takes the tuple back before anything else sees it...
        let back = pre
            .find(&format!(
                "tcp flags & (syn | ack) == syn {k} @ended4 delete @ended4 {{ {k} }}"
            ))
            .expect("take back");
        assert!(back < pre.find("socket transparent 1").unwrap(), "{pre}");
        // ...and a segment no socket of ours took is not forwarded, after the tproxy.
        let drop = pre
            .find(&format!(
                "iifname != \"lo\" tcp flags & syn == 0 {r} @ended6 fib daddr type != local drop"
            ))
            .expect("no forwarding");
        assert!(drop > pre.find("tproxy ip6").unwrap(), "{pre}");
        assert!(
            out.contains(&format!("    tcp flags rst {k} @ended4 drop\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("    tcp flags rst {r} @ended6 drop\n")),
            "{out}"
        );
    }

    #[test]
    fn intercepted_segments_no_socket_took_are_never_forwarded() {
        let s = rules(true).nft_script();
        let pre = &s[s.find("chain prerouting {").unwrap()..];
        let pre = &pre[..pre.find("\n  }").unwrap()];
        let sock = pre.find("socket transparent 1").unwrap();
        for rule in [
            "iifname != \"lo\" tcp flags & syn == 0 ip saddr { 10.2.0.0/24 } tcp dport { 80, 443 } fib daddr type != local drop",
            "iifname != \"lo\" tcp flags & syn == 0 ip daddr { 10.2.0.0/24 } tcp sport { 80, 443 } fib daddr type != local drop",
            "iifname != \"lo\" tcp flags & syn == 0 ip6 saddr { 2001:db8::/64 } tcp dport { 80, 443 } fib daddr type != local drop",
            "iifname != \"lo\" tcp flags & syn == 0 ip6 daddr { 2001:db8::/64 } tcp sport { 80, 443 } fib daddr type != local drop",
        ] {
            let at = pre.find(rule).unwrap_or_else(|| panic!("{rule}\n{pre}"));
            assert!(at > sock, "after the socket lookup: {pre}");
        }
        // Without transparent mode, nothing of the kind.
        let s = rules(false).nft_script();
        assert!(!s.contains("tcp sport { 80, 443 }"), "{s}");
    }

    #[test]
    fn transparent_mode_diverts_syns_per_family() {
        let s = rules(true).nft_script();
        assert!(
            s.contains("ip saddr { 10.2.0.0/24 } tcp dport { 80, 443 }"),
            "{s}"
        );
        assert!(s.contains("tproxy ip to :1081"));
        assert!(s.contains("ip6 saddr { 2001:db8::/64 }"));
        assert!(s.contains("tproxy ip6 to :1081"));
        // Before any socket lookup, which a TIME_WAIT socket of ours would answer.
        let sock = s.find("socket transparent 1").unwrap();
        assert!(s.find("tproxy ip to").unwrap() < sock, "{s}");
        assert!(s.find("tproxy ip6 to").unwrap() < sock, "{s}");
    }

    #[test]
    fn hold_sets_and_chains() {
        let s = rules(false).nft_script();
        assert!(s.contains("set held4 {\n    type ipv4_addr;"), "{s}");
        assert!(s.contains("chain hold_in {\n    type filter hook prerouting priority mangle - 10; policy accept;\n    iifname \"lo\" accept\n"), "{s}");
        assert!(
            s.contains("chain hold_out {\n    type filter hook output"),
            "{s}"
        );
        // Inbound held packets go to the queue's chain, outbound ones are dropped.
        let chain = |name: &str| {
            let c = &s[s.find(&format!("chain {name} {{")).unwrap()..];
            c[..c.find("\n  }").unwrap()].to_string()
        };
        let (hin, hout) = (chain("hold_in"), chain("hold_out"));
        for rule in [
            "meta l4proto tcp ip daddr @held4",
            "meta l4proto tcp ip saddr @held4",
            "meta l4proto tcp ip6 daddr @held6",
            "meta l4proto tcp ip6 saddr @held6",
        ] {
            assert!(hin.contains(&format!("    {rule} jump held\n")), "{hin}");
            assert!(hout.contains(&format!("    {rule} drop\n")), "{hout}");
        }
        assert!(s.contains("  chain held {\n    drop\n  }\n"), "{s}");
        // A held packet delivered after its restart gets past the gate, and only then.
        let pass = hin
            .find("    meta mark 0x80004954 accept\n")
            .expect("pass rule");
        assert!(pass > hin.find("@held4 jump held").unwrap(), "{hin}");
        assert!(pass < hin.find("@gated4").unwrap(), "{hin}");
        // What the gate stops is held, not dropped.
        for ip in ["ip", "ip6"] {
            let v = if ip == "ip" { "4" } else { "6" };
            assert!(hin.contains(&format!("    meta l4proto tcp {ip} saddr @gated{v} {ip} saddr . tcp sport . {ip} daddr . tcp dport != @running{v} jump held\n")), "{hin}");
        }
    }

    #[test]
    fn policy_route_lines() {
        let [v4, v6] = rules(false).ip_install();
        assert!(v4.contains("rule add fwmark 0x4954 lookup 4954"));
        assert!(v4.contains("route add local 0.0.0.0/0 dev lo table 4954"));
        assert!(v6.contains("route add local ::/0 dev lo table 4954"));
        assert!(v6.contains("rule add fwmark 0x4954 lookup 4954"));
        // ip's batch mode takes no options per line: the family is the caller's flag.
        assert!(!v6.contains("-6") && !v4.contains("-4"), "{v6}");
        assert!(rules(false).ip_remove().contains("route flush table 4954"));
    }
}
