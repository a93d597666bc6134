//! Kernel state changes on the handoff path without exec'ing `nft`/`ip` (~6 ms each):
//! nftables set elements and proxy neighbours over raw netlink, gratuitous ARP over
//! AF_PACKET, and the `proxy_delay` sysctl. All calls are synchronous (blocking) and act
//! in the calling thread's network namespace. Each thread keeps its netlink sockets open
//! between calls (see `NL_SOCKS`). Measured on Linux 6.18 (`timing` in tests/netlink.rs):
//! ~9 µs per set-element change, ~13 µs per proxy-neighbour change.

use std::cell::RefCell;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use itcp_wire::arp::{ArpPacket, REPLY as ARPOP_REPLY, REQUEST as ARPOP_REQUEST};
use itcp_wire::ethernet::{self, EthernetFrame};
use nix::errno::Errno;
use nix::sys::socket::{recv, send, MsgFlags};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU32, Ordering};

// From linux/netfilter/nf_tables.h; libc does not carry the attribute enums.
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_DATA_VALUE: u16 = 1;

// Extended-ack TLVs after an NLMSG_ERROR (linux/netlink.h), also missing from libc.
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLMSGERR_ATTR_OFFS: u16 = 2;

/// From linux/rtnetlink.h (not in libc): the initial congestion window route metric.
const RTAX_INITCWND: u16 = 11;

pub(crate) const NLMSG_HDRLEN: usize = 16;
pub(crate) const NLA_HDRLEN: usize = 4;
pub(crate) const NFGENMSG_LEN: usize = 4;
/// Minimum Ethernet frame without FCS; short frames are padded by us, not left to drivers.
const ETH_ZLEN: usize = 60;

/// How long to wait for the kernel's ack before giving up (it normally takes µs).
const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// Adds or deletes one address in a named set of an nftables table of family `inet`
/// (sets typed ipv4_addr / ipv6_addr). One NETLINK_NETFILTER batch (NFNL_MSG_BATCH_BEGIN,
/// NFT_MSG_NEWSETELEM or NFT_MSG_DELSETELEM with NLM_F_ACK, NFNL_MSG_BATCH_END), waits for the ack.
/// Adding an element already present is Ok; deleting one that is absent is Ok (ENOENT ignored).
pub fn nft_set_element(table: &str, set: &str, ip: IpAddr, add: bool) -> io::Result<()> {
    set_element(libc::NFPROTO_INET as u8, "inet", table, set, ip, add)
}

/// [`nft_set_element`] for a table of family `netdev`.
pub fn nft_netdev_set_element(table: &str, set: &str, ip: IpAddr, add: bool) -> io::Result<()> {
    set_element(libc::NFPROTO_NETDEV as u8, "netdev", table, set, ip, add)
}

/// Adds (for `timeout_ms`, or until deleted) or deletes link-layer address `mac` in set
/// `set` (type `ether_addr`) of netdev table `table`.
pub fn nft_netdev_mac_element(
    table: &str,
    set: &str,
    mac: [u8; 6],
    add: bool,
    timeout_ms: Option<u64>,
) -> io::Result<()> {
    let m = itcp_proto::hex::mac(&mac);
    let what = if add {
        format!("nft: add element {m} to set {set} of table netdev {table}")
    } else {
        format!("nft: delete element {m} from set {set} of table netdev {table}")
    };
    let elem = (mac.to_vec(), timeout_ms.filter(|_| add));
    let family = libc::NFPROTO_NETDEV as u8;
    setelem_batch(family, table, set, &[elem], add, &what).map(|_| ())
}

fn set_element(
    family: u8,
    family_name: &str,
    table: &str,
    set: &str,
    ip: IpAddr,
    add: bool,
) -> io::Result<()> {
    let what = if add {
        format!("nft: add element {ip} to set {set} of table {family_name} {table}")
    } else {
        format!("nft: delete element {ip} from set {set} of table {family_name} {table}")
    };
    // A delete of an element that is not there means it was already gone.
    setelem_batch(family, table, set, &[(ip_bytes(ip), None)], add, &what).map(|_| ())
}

/// Adds (replacing) or deletes a host route to `dst` out of `ifname` in the main
/// table, like `ip route replace DST/32 dev IFNAME initcwnd N proto P` (or `ip route
/// del DST dev IFNAME`): RTM_NEWROUTE / RTM_DELROUTE on NETLINK_ROUTE, NLM_F_ACK.
/// Deleting an absent route is Ok. No process runs on the handoff path.
pub fn host_route(
    dst: IpAddr,
    ifname: &str,
    initcwnd: u32,
    proto: u8,
    add: bool,
) -> io::Result<()> {
    let what = format!(
        "ip route: {} {dst} dev {ifname}",
        if add { "replace" } else { "del" }
    );
    let ifindex = ifindex(ifname, &what)?;
    let seq = next_seq(1);
    let req = route_msg(add, seq, dst, ifindex, initcwnd, proto);
    let ack = nl_request(libc::NETLINK_ROUTE, &req, seq, 1, seq).map_err(|e| context(&what, e))?;
    match ack.errno {
        0 => Ok(()),
        libc::ESRCH | libc::ENOENT if !add => Ok(()),
        e => Err(kernel_error(&what, e, None, &ack)),
    }
}

fn route_msg(add: bool, seq: u32, dst: IpAddr, ifindex: u32, initcwnd: u32, proto: u8) -> Vec<u8> {
    let (ty, flags) = if add {
        (libc::RTM_NEWROUTE, libc::NLM_F_CREATE | libc::NLM_F_REPLACE)
    } else {
        (libc::RTM_DELROUTE, 0)
    };
    let (family, len) = match dst {
        IpAddr::V4(_) => (libc::AF_INET, 32),
        IpAddr::V6(_) => (libc::AF_INET6, 128),
    };
    let mut b = Vec::with_capacity(64);
    let m = begin_msg(
        &mut b,
        ty,
        (libc::NLM_F_REQUEST | libc::NLM_F_ACK | flags) as u16,
        seq,
    );
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type; flags.
    b.extend_from_slice(&[
        family as u8,
        len,
        0,
        0,
        libc::RT_TABLE_MAIN,
        if add { proto } else { 0 },
        if add {
            libc::RT_SCOPE_LINK
        } else {
            libc::RT_SCOPE_NOWHERE
        },
        if add { libc::RTN_UNICAST } else { 0 },
    ]);
    b.extend_from_slice(&0u32.to_ne_bytes());
    put_attr(&mut b, libc::RTA_DST, &ip_bytes(dst));
    put_attr(&mut b, libc::RTA_OIF, &ifindex.to_ne_bytes());
    if add {
        let metrics = begin_nested(&mut b, libc::RTA_METRICS);
        put_attr(&mut b, RTAX_INITCWND, &initcwnd.to_ne_bytes());
        end_nested(&mut b, metrics);
    }
    end_msg(&mut b, m);
    b
}

/// Adds or removes a proxy-neighbour entry (like `ip neigh add proxy IP dev IFNAME`):
/// RTM_NEWNEIGH / RTM_DELNEIGH on NETLINK_ROUTE with ndm_flags = NTF_PROXY, NLM_F_ACK.
/// Add uses NLM_F_CREATE|NLM_F_REPLACE (idempotent); deleting an absent entry is Ok.
pub fn proxy_neigh(ifname: &str, ip: IpAddr, add: bool) -> io::Result<()> {
    let what = format!(
        "ip neigh: {} proxy {ip} dev {ifname}",
        if add { "add" } else { "delete" }
    );
    let ifindex = ifindex(ifname, &what)?;
    let seq = next_seq(1);
    let req = neigh_msg(add, seq, ifindex, ip);
    let ack = nl_request(libc::NETLINK_ROUTE, &req, seq, 1, seq).map_err(|e| context(&what, e))?;
    match ack.errno {
        0 => Ok(()),
        libc::ENOENT if !add => Ok(()),
        e => Err(kernel_error(&what, e, None, &ack)),
    }
}

/// Enters `ip` at `mac` on `ifname` in the neighbour table as the kernel does for an
/// address it learns in passing (NUD_STALE: used at once, confirmed by the traffic).
/// NLM_F_CREATE without NLM_F_REPLACE: a valid entry is never overridden (the kernel
/// drops the override flag), an absent, incomplete or failed one takes `mac`.
pub fn neigh_learn(ifname: &str, ip: IpAddr, mac: [u8; 6]) -> io::Result<()> {
    let what = format!(
        "ip neigh: learn {ip} at {} dev {ifname}",
        itcp_proto::hex::mac(&mac)
    );
    let ifindex = ifindex(ifname, &what)?;
    let seq = next_seq(1);
    let req = learn_msg(seq, ifindex, ip, mac);
    let ack = nl_request(libc::NETLINK_ROUTE, &req, seq, 1, seq).map_err(|e| context(&what, e))?;
    match ack.errno {
        0 => Ok(()),
        e => Err(kernel_error(&what, e, None, &ack)),
    }
}

fn learn_msg(seq: u32, ifindex: u32, ip: IpAddr, mac: [u8; 6]) -> Vec<u8> {
    let family = match ip {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    };
    let mut b = Vec::with_capacity(56);
    let flags = libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE;
    let m = begin_msg(&mut b, libc::RTM_NEWNEIGH, flags as u16, seq);
    // struct ndmsg: family, 3 pad bytes, ifindex, state, flags, type.
    b.push(family as u8);
    b.extend_from_slice(&[0; 3]);
    b.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    b.extend_from_slice(&libc::NUD_STALE.to_ne_bytes());
    b.extend_from_slice(&[0, 0]);
    put_attr(&mut b, libc::NDA_DST, &ip_bytes(ip));
    put_attr(&mut b, libc::NDA_LLADDR, &mac);
    end_msg(&mut b, m);
    b
}

thread_local! {
    /// AF_PACKET sockets bound to an interface (by index), kept open for the next
    /// announcement: closing one waits for an RCU grace period (`synchronize_net` in
    /// the kernel's packet_release), 8–30 ms measured on a handoff's path. Per thread,
    /// as the netlink sockets are: a socket belongs to its thread's namespace.
    static ARP_SOCKS: RefCell<Vec<(u32, OwnedFd)>> = const { RefCell::new(Vec::new()) };
}

/// A packet socket bound to `ifindex` (sending only: protocol 0 queues no frame).
fn arp_socket(ifindex: u32) -> io::Result<OwnedFd> {
    let sock = socket(libc::AF_PACKET, libc::SOCK_RAW, 0)?;
    bind_packet(sock.as_raw_fd(), ifindex, 0)?;
    Ok(sock)
}

/// Binds packet socket `fd` to `ifindex`; from then on it receives the frames of
/// `protocol` (an ETH_P_* value; 0: none).
pub(crate) fn bind_packet(fd: RawFd, ifindex: u32, protocol: u16) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex as libc::c_int;
    // SAFETY: sll is a live sockaddr_ll and its size is passed along.
    let r = unsafe {
        libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(context("bind", io::Error::last_os_error()));
    }
    Ok(())
}

/// Announces that `ip` is reachable at `ifname`'s MAC: sends a gratuitous ARP request
/// (sender IP = target IP = ip, sender MAC = ifname's MAC, target MAC 0, Ethernet
/// broadcast) and a gratuitous ARP reply (op 2, target MAC = sender MAC, broadcast)
/// through a packet socket bound to ifname (kept open: see `ARP_SOCKS`).
pub fn send_garp(ifname: &str, ip: Ipv4Addr) -> io::Result<()> {
    let what = format!("garp: announce {ip} on {ifname}");
    let frames = |mac| {
        [ARPOP_REQUEST, ARPOP_REPLY].map(|op| {
            let tha = if op == ARPOP_REPLY { mac } else { [0; 6] };
            arp_frame(op, [0xff; 6], (mac, ip), (tha, ip))
        })
    };
    send_arp(ifname, frames).map_err(|e| context(&what, e))
}

/// Asks `to` (at `to_mac` on `ifname`) for its link-layer address, from our address
/// `from`: a unicast ARP request or neighbour solicitation carrying `ifname`'s MAC
/// ([`ASKS`] copies).
/// The asked host enters the asker in its neighbour table (RFC 826's merge, RFC 4861
/// §7.2.3), with no entry of its own needed first: this gives an MH its gateway's
/// address after its OS flushed its entries (a carrier drop on a move) and before it
/// has anything to send, so that its first ACKs do not wait for a resolution that
/// would queue behind the restored connections' first flight in the cell.
pub fn ask_neighbour(ifname: &str, from: IpAddr, to: IpAddr, to_mac: [u8; 6]) -> io::Result<()> {
    let what = format!(
        "ask {to} at {} on {ifname} from {from}",
        itcp_proto::hex::mac(&to_mac)
    );
    match (from, to) {
        (IpAddr::V4(from), IpAddr::V4(to)) => send_arp(ifname, |mac| {
            [arp_frame(ARPOP_REQUEST, to_mac, (mac, from), ([0; 6], to)); ASKS]
        }),
        (IpAddr::V6(from), IpAddr::V6(to)) => solicit(ifname, from, to),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "mixed families",
        )),
    }
    .map_err(|e| context(&what, e))
}

/// Copies of each request [`ask_neighbour`] sends: a cell loses frames (1 % on the
/// lab's profiles), and an MH that missed the only one would resolve its gateway only
/// behind the first flight.
const ASKS: usize = 2;

/// A unicast neighbour solicitation for `to` from `from` (bound: the MH enters the
/// address it routes through), source link-layer address option `ifname`'s MAC.
fn solicit(ifname: &str, from: Ipv6Addr, to: Ipv6Addr) -> io::Result<()> {
    let mac = link_mac(ifname)?;
    let sock = socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6)?;
    let s = socket2::SockRef::from(&sock);
    // Neighbour discovery is only valid with hop limit 255.
    s.set_unicast_hops_v6(255)?;
    s.bind(&SocketAddr::from((from, 0)).into())?;
    let (m, to) = (ns_message(to, mac), SocketAddr::from((to, 0)).into());
    for _ in 0..ASKS {
        s.send_to(&m, &to)?;
    }
    Ok(())
}

/// An ICMPv6 neighbour solicitation for `target` with a source link-layer address
/// option `mac`.
fn ns_message(target: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    nd_message(135, 0, target, 1, mac)
}

/// A neighbour discovery message of ICMPv6 type `kind` with flags byte `flags`, for
/// `target`, with one link-layer address option (`option`: 1 source, 2 target) of
/// `mac`. The kernel fills in the checksum of a raw ICMPv6 socket.
fn nd_message(kind: u8, flags: u8, target: Ipv6Addr, option: u8, mac: [u8; 6]) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 0, flags, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    // The option's length is 1 (8 bytes).
    m.extend_from_slice(&[option, 1]);
    m.extend_from_slice(&mac);
    m
}

/// Sends the ARP frames `frames(ifname's MAC)` on `ifname` through a packet socket
/// bound to it (kept open: see `ARP_SOCKS`).
fn send_arp<const N: usize>(
    ifname: &str,
    frames: impl Fn([u8; 6]) -> [[u8; ETH_ZLEN]; N],
) -> io::Result<()> {
    let ifindex = ifindex(ifname, "ARP")?;
    ARP_SOCKS.with(|socks| {
        let mut socks = socks.borrow_mut();
        let at = match socks.iter().position(|(i, _)| *i == ifindex) {
            Some(at) => at,
            None => {
                socks.push((ifindex, arp_socket(ifindex)?));
                socks.len() - 1
            }
        };
        let fd = socks[at].1.as_raw_fd();
        // Read each time: the interface's address may have changed.
        let r = hwaddr(fd, ifname).and_then(|mac| {
            frames(mac)
                .iter()
                .try_for_each(|f| send_frame(fd, ifindex, f))
        });
        if r.is_err() {
            // The interface may be gone or replaced: the next call binds afresh.
            socks.swap_remove(at);
        }
        r
    })
}

/// Sends one Ethernet frame (its own destination) on a bound packet socket.
fn send_frame(fd: RawFd, ifindex: u32, frame: &[u8; ETH_ZLEN]) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = ifindex as libc::c_int;
    sll.sll_protocol = (libc::ETH_P_ARP as u16).to_be();
    sll.sll_halen = 6;
    let eth = EthernetFrame::new_checked(&frame[..]).expect("ETH_ZLEN holds the header");
    sll.sll_addr[..6].copy_from_slice(&eth.dst_addr());
    // SAFETY: frame and sll are live for the call; their sizes are passed along.
    let n = unsafe {
        libc::sendto(
            fd,
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if n < 0 {
        let op = ArpPacket::new_checked(eth.payload()).map(|a| a.operation());
        let kind = if op == Ok(ARPOP_REQUEST) {
            "request"
        } else {
            "reply"
        };
        return Err(context(
            &format!("send ARP {kind}"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Announces on `ifname` that `ip` is reachable at this interface's MAC: an unsolicited
/// neighbour advertisement (override flag, target link-layer address option) to all
/// nodes, so neighbours (the GW) repoint an entry made for another MSR (RFC 4861 §7.2.6).
pub fn send_unsolicited_na(ifname: &str, ip: Ipv6Addr) -> io::Result<()> {
    let what = format!("unsolicited NA: announce {ip} on {ifname}");
    let ifindex = ifindex(ifname, &what)?;
    let sock = socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6)
        .map_err(|e| context(&what, e))?;
    let mac = link_mac(ifname).map_err(|e| context(&what, e))?;
    let s = socket2::SockRef::from(&sock);
    // Neighbour discovery is only valid with hop limit 255.
    s.set_multicast_hops_v6(255)
        .and_then(|()| s.set_multicast_if_v6(ifindex))
        .map_err(|e| context(&what, e))?;
    let all_nodes = SocketAddrV6::new(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), 0, 0, ifindex);
    s.send_to(&na_message(ip, mac), &all_nodes.into())
        .map_err(|e| context(&what, e))?;
    Ok(())
}

/// An ICMPv6 neighbour advertisement for `target` at `mac`, override flag set, with a
/// target link-layer address option.
fn na_message(target: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    nd_message(136, 0x20, target, 2, mac)
}

/// `/proc/sys/net/ipv6/conf/<ifname>/proxy_ndp`, which proxy neighbour entries need
/// for IPv6.
pub fn proxy_ndp_path(ifname: &str) -> io::Result<String> {
    Ok(proxy_delay_path(ifname)?
        .replace("ipv4/neigh/", "ipv6/conf/")
        .replace("/proxy_delay", "/proxy_ndp"))
}

/// `/proc/sys/net/ipv6/neigh/<ifname>/proxy_delay`: proxied neighbour advertisements
/// answering a multicast solicitation are otherwise delayed by up to 0.8 s.
pub fn proxy_delay6_path(ifname: &str) -> io::Result<String> {
    Ok(proxy_delay_path(ifname)?.replace("ipv4/neigh/", "ipv6/neigh/"))
}

pub fn proxy_delay_path(ifname: &str) -> io::Result<String> {
    // The name becomes a path component: refuse anything that could leave the directory.
    if ifname.is_empty()
        || ifname.len() >= libc::IFNAMSIZ
        || ifname == "."
        || ifname == ".."
        || ifname.contains(['/', '\0'])
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("proxy_delay: invalid interface name {ifname:?}"),
        ));
    }
    // /proc/sys/net follows the calling thread's network namespace.
    Ok(format!("/proc/sys/net/ipv4/neigh/{ifname}/proxy_delay"))
}

// ---- byte builders (pure) ----

pub(crate) const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends an nlmsghdr whose length `end_msg` fills in later; returns its offset.
pub(crate) fn begin_msg(buf: &mut Vec<u8>, ty: u16, flags: u16, seq: u32) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel fills in ours
    start
}

pub(crate) fn end_msg(buf: &mut Vec<u8>, start: usize) {
    buf.resize(align4(buf.len()), 0);
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// struct nfgenmsg; res_id is big-endian on the wire.
pub(crate) fn put_nfgenmsg(buf: &mut Vec<u8>, family: u8, res_id: u16) {
    buf.push(family);
    buf.push(libc::NFNETLINK_V0 as u8);
    buf.extend_from_slice(&res_id.to_be_bytes());
}

/// Appends one attribute (header, payload, padding to 4 bytes).
pub(crate) fn put_attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = (NLA_HDRLEN + payload.len()) as u16;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(align4(buf.len()), 0);
}

/// NUL-terminated string attribute, as the kernel's NLA_STRING policy expects from nft.
fn put_attr_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    let mut v = Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    put_attr(buf, ty, &v);
}

/// Opens a nested attribute (NLA_F_NESTED set); `end_nested` fills in its length.
fn begin_nested(buf: &mut Vec<u8>, ty: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u16.to_ne_bytes());
    buf.extend_from_slice(&(ty | libc::NLA_F_NESTED as u16).to_ne_bytes());
    start
}

fn end_nested(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Adds elements with a timeout to a set whose key is `ADDR . PORT . ADDR . PORT`
/// (the flows of `pairs`, each `(a, b)`), like `nft add element ... timeout`.
pub fn nft_flow_elements(
    table: &str,
    set: &str,
    pairs: &[(SocketAddr, SocketAddr, std::time::Duration)],
) -> io::Result<()> {
    let what = format!(
        "nft: add {} flows to set {set} of table inet {table}",
        pairs.len()
    );
    let elems: Vec<_> = pairs
        .iter()
        .map(|(a, z, t)| (flow_key(*a, *z), Some(t.as_millis().max(1) as u64)))
        .collect();
    for chunk in elems.chunks(64) {
        flow_batch(table, set, chunk, true, &what)?;
    }
    Ok(())
}

/// Deletes the flows of `pairs` from a set made for [`nft_flow_elements`]; one that
/// is not there (timed out, or taken back by a SYN) is no error.
pub fn nft_flow_elements_delete(
    table: &str,
    set: &str,
    pairs: &[(SocketAddr, SocketAddr)],
) -> io::Result<()> {
    let what = format!(
        "nft: delete {} flows from set {set} of table inet {table}",
        pairs.len()
    );
    let elems: Vec<_> = pairs
        .iter()
        .map(|(a, z)| (flow_key(*a, *z), None))
        .collect();
    for chunk in elems.chunks(64) {
        // One missing element fails its whole batch: then the others one at a time.
        if !flow_batch(table, set, chunk, false, &what)? {
            for one in chunk.chunks(1) {
                flow_batch(table, set, one, false, &what)?;
            }
        }
    }
    Ok(())
}

/// [`setelem_batch`] on an `inet` table's flow set.
fn flow_batch(
    table: &str,
    set: &str,
    elems: &[(Vec<u8>, Option<u64>)],
    add: bool,
    what: &str,
) -> io::Result<bool> {
    setelem_batch(libc::NFPROTO_INET as u8, table, set, elems, add, what)
}

/// One batch adding or deleting `elems` (at most a few dozen: one message). A delete
/// that meets an element not in the set (the kernel's ENOENT without naming the table
/// or set) changes nothing and returns false.
fn setelem_batch(
    family: u8,
    table: &str,
    set: &str,
    elems: &[(Vec<u8>, Option<u64>)],
    add: bool,
    what: &str,
) -> io::Result<bool> {
    check_name(table, "table", what)?;
    check_name(set, "set", what)?;
    let seq = next_seq(3);
    let b = nft_setelem_batch(family, table, set, elems, add, seq);
    let ack = nl_request(libc::NETLINK_NETFILTER, &b, seq, 3, seq.wrapping_add(1))
        .map_err(|e| context(what, e))?;
    element_answer(table, what, &ack, !add)
}

/// `a . port . z . port` in nftables' concatenation layout: each field padded to a
/// multiple of 4 bytes, ports in network order.
fn flow_key(a: SocketAddr, z: SocketAddr) -> Vec<u8> {
    let mut k = Vec::with_capacity(40);
    for x in [a, z] {
        k.extend_from_slice(&ip_bytes(x.ip()));
        k.extend_from_slice(&x.port().to_be_bytes());
        k.extend_from_slice(&[0, 0]);
    }
    k
}

/// The whole batch for one set-element change: BATCH_BEGIN (seq), the element
/// message (seq + 1, the one that is acked), BATCH_END (seq + 2).
fn nft_setelem_batch(
    family: u8,
    table: &str,
    set: &str,
    elems: &[(Vec<u8>, Option<u64>)],
    add: bool,
    seq: u32,
) -> Vec<u8> {
    let (op, flags) = if add {
        (
            libc::NFT_MSG_NEWSETELEM,
            libc::NLM_F_CREATE | libc::NLM_F_ACK,
        )
    } else {
        (libc::NFT_MSG_DELSETELEM, libc::NLM_F_ACK)
    };
    nft_batch(seq, op, flags, |b| {
        put_setelem_list(b, family, table, set, elems)
    })
}

/// One nf_tables batch of a single message: BATCH_BEGIN (`seq`), message `op` with
/// `flags` (`seq + 1`, the one acked) whose body `body` writes, BATCH_END (`seq + 2`).
fn nft_batch(
    seq: u32,
    op: libc::c_int,
    flags: libc::c_int,
    body: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    let subsys = libc::NFNL_SUBSYS_NFTABLES as u16;
    let req = libc::NLM_F_REQUEST as u16;
    let mut b = Vec::with_capacity(192);
    let m = begin_msg(&mut b, libc::NFNL_MSG_BATCH_BEGIN as u16, req, seq);
    put_nfgenmsg(&mut b, libc::AF_UNSPEC as u8, subsys);
    end_msg(&mut b, m);
    let m = begin_msg(
        &mut b,
        (subsys << 8) | op as u16,
        req | flags as u16,
        seq.wrapping_add(1),
    );
    body(&mut b);
    end_msg(&mut b, m);
    let m = begin_msg(
        &mut b,
        libc::NFNL_MSG_BATCH_END as u16,
        req,
        seq.wrapping_add(2),
    );
    put_nfgenmsg(&mut b, libc::AF_UNSPEC as u8, subsys);
    end_msg(&mut b, m);
    b
}

/// The body of a set-element message: nfgenmsg, table, set, and the elements.
fn put_setelem_list(
    b: &mut Vec<u8>,
    family: u8,
    table: &str,
    set: &str,
    elems: &[(Vec<u8>, Option<u64>)],
) {
    put_nfgenmsg(b, family, 0);
    put_attr_str(b, NFTA_SET_ELEM_LIST_TABLE, table);
    put_attr_str(b, NFTA_SET_ELEM_LIST_SET, set);
    let elements = begin_nested(b, NFTA_SET_ELEM_LIST_ELEMENTS);
    for (k, timeout_ms) in elems {
        let elem = begin_nested(b, NFTA_LIST_ELEM);
        let key = begin_nested(b, NFTA_SET_ELEM_KEY);
        put_attr(b, NFTA_DATA_VALUE, k);
        end_nested(b, key);
        if let Some(ms) = timeout_ms {
            put_attr(b, NFTA_SET_ELEM_TIMEOUT, &ms.to_be_bytes());
        }
        end_nested(b, elem);
    }
    end_nested(b, elements);
}

/// Inserts, at the head of chain `chain` of table `inet table`, a rule that hands every
/// packet to netfilter queue `queue` (`iptables -j NFQUEUE --queue-num`): the xt
/// NFQUEUE target through nft's compat layer, which nft's own syntax cannot express on
/// kernels without the native `queue` statement. No listener on the queue: the packet
/// is dropped (no bypass).
pub fn nft_queue_rule(table: &str, chain: &str, queue: u16) -> io::Result<()> {
    let what = format!("nft: queue rule (NFQUEUE {queue}) in chain {chain} of table inet {table}");
    check_name(table, "table", &what)?;
    check_name(chain, "chain", &what)?;
    let seq = next_seq(3);
    let b = queue_rule_batch(table, chain, queue, seq);
    let ack = nl_request(libc::NETLINK_NETFILTER, &b, seq, 3, seq.wrapping_add(1))
        .map_err(|e| context(&what, e))?;
    match ack.errno {
        0 => Ok(()),
        e => Err(kernel_error(
            &what,
            e,
            (e == libc::ENOENT).then_some("no xt NFQUEUE target (nft_compat, xt_NFQUEUE)?"),
            &ack,
        )),
    }
}

/// The batch of [`nft_queue_rule`]: BATCH_BEGIN, NEWRULE (acked), BATCH_END.
fn queue_rule_batch(table: &str, chain: &str, queue: u16, seq: u32) -> Vec<u8> {
    const NFTA_RULE_TABLE: u16 = 1;
    const NFTA_RULE_CHAIN: u16 = 2;
    const NFTA_RULE_EXPRESSIONS: u16 = 4;
    const NFTA_EXPR_NAME: u16 = 1;
    const NFTA_EXPR_DATA: u16 = 2;
    const NFTA_TARGET_NAME: u16 = 1;
    const NFTA_TARGET_REV: u16 = 2;
    const NFTA_TARGET_INFO: u16 = 3;
    // No NLM_F_APPEND: the rule goes first in the chain.
    let flags = libc::NLM_F_CREATE | libc::NLM_F_ACK;
    nft_batch(seq, libc::NFT_MSG_NEWRULE, flags, |b| {
        put_nfgenmsg(b, libc::NFPROTO_INET as u8, 0);
        put_attr_str(b, NFTA_RULE_TABLE, table);
        put_attr_str(b, NFTA_RULE_CHAIN, chain);
        let exprs = begin_nested(b, NFTA_RULE_EXPRESSIONS);
        let e = begin_nested(b, NFTA_LIST_ELEM);
        put_attr_str(b, NFTA_EXPR_NAME, "target");
        let data = begin_nested(b, NFTA_EXPR_DATA);
        put_attr_str(b, NFTA_TARGET_NAME, "NFQUEUE");
        put_attr(b, NFTA_TARGET_REV, &3u32.to_be_bytes());
        // struct xt_NFQ_info_v3 {queuenum, queues_total, flags}, padded to 8 bytes
        // (XT_ALIGN), in host order as xtables passes it.
        let mut info = [0u8; 8];
        info[..2].copy_from_slice(&queue.to_ne_bytes());
        info[2..4].copy_from_slice(&1u16.to_ne_bytes());
        put_attr(b, NFTA_TARGET_INFO, &info);
        end_nested(b, data);
        end_nested(b, e);
        end_nested(b, exprs);
    })
}

/// The link-layer address the neighbour table has for `ip` on `ifname` (RTM_GETNEIGH):
/// None if there is no entry with one (never resolved, or failed).
pub fn neigh_mac(ifname: &str, ip: IpAddr) -> io::Result<Option<[u8; 6]>> {
    let what = format!("neighbour {ip} on {ifname}");
    let idx = ifindex(ifname, &what)?;
    let fd = nl_socket(libc::NETLINK_ROUTE)?;
    let seq = next_seq(1);
    let mut b = Vec::with_capacity(64);
    let m = begin_msg(&mut b, libc::RTM_GETNEIGH, libc::NLM_F_REQUEST as u16, seq);
    // struct ndmsg: family, pad, pad, ifindex, state, flags, type.
    let family = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    b.extend_from_slice(&[family as u8, 0, 0, 0]);
    b.extend_from_slice(&(idx as i32).to_ne_bytes());
    b.extend_from_slice(&[0, 0, 0, 0]);
    put_attr(&mut b, libc::NDA_DST, &ip_bytes(ip));
    end_msg(&mut b, m);
    send(fd.as_raw_fd(), &b, MsgFlags::empty()).map_err(|e| context(&what, e.into()))?;
    let mut buf = [0u8; 1024];
    let n =
        recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(|e| context(&what, e.into()))?;
    Ok(neigh_answer(&buf[..n]))
}

/// The NDA_LLADDR of an RTM_NEWNEIGH answer (an NLMSG_ERROR, ENOENT: None).
fn neigh_answer(d: &[u8]) -> Option<[u8; 6]> {
    const NDMSG_LEN: usize = 12;
    if d.len() < NLMSG_HDRLEN + NDMSG_LEN || u16_at(d, 4) != libc::RTM_NEWNEIGH {
        return None;
    }
    let len = (u32_at(d, 0) as usize).min(d.len());
    let mut a = NLMSG_HDRLEN + NDMSG_LEN;
    while a + NLA_HDRLEN <= len {
        let alen = u16_at(d, a) as usize;
        if alen < NLA_HDRLEN || a + alen > len {
            return None;
        }
        if u16_at(d, a + 2) == libc::NDA_LLADDR && alen == NLA_HDRLEN + 6 {
            return d[a + NLA_HDRLEN..a + alen].try_into().ok();
        }
        a += align4(alen);
    }
    None
}

/// Whether `ip` is in set `set` of table `inet table` now (an element past its
/// timeout is not), like `nft get element`. One netlink round trip.
pub fn nft_set_has(table: &str, set: &str, ip: IpAddr) -> io::Result<bool> {
    let what = format!("nft: get element {ip} of set {set} of table inet {table}");
    check_name(table, "table", &what)?;
    check_name(set, "set", &what)?;
    let seq = next_seq(1);
    let subsys = libc::NFNL_SUBSYS_NFTABLES as u16;
    let mut b = Vec::with_capacity(96);
    let m = begin_msg(
        &mut b,
        (subsys << 8) | libc::NFT_MSG_GETSETELEM as u16,
        (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16,
        seq,
    );
    let elems = [(ip_bytes(ip), None)];
    put_setelem_list(&mut b, libc::NFPROTO_INET as u8, table, set, &elems);
    end_msg(&mut b, m);
    let ack =
        nl_request(libc::NETLINK_NETFILTER, &b, seq, 1, seq).map_err(|e| context(&what, e))?;
    element_answer(table, &what, &ack, true)
}

/// The kernel's answer to a set-element request: done (true), or, when `missing_ok`,
/// the element was not there (false: ENOENT that names neither the table nor the set,
/// which the extended ack would point at).
fn element_answer(table: &str, what: &str, ack: &Ack, missing_ok: bool) -> io::Result<bool> {
    let (table_off, set_off) = nft_setelem_attr_offsets(table);
    let hint = match ack.bad_attr {
        Some(o) if o == table_off => Some("table not found"),
        Some(o) if o == set_off => Some("set not found"),
        _ => None,
    };
    match ack.errno {
        0 => Ok(true),
        libc::ENOENT if missing_ok && hint.is_none() => Ok(false),
        e => Err(kernel_error(what, e, hint, ack)),
    }
}

/// Offsets, from the element message's header, of its table and set attributes: what
/// the kernel's extended ack points at when the table or the set does not exist.
fn nft_setelem_attr_offsets(table: &str) -> (u32, u32) {
    let table_off = NLMSG_HDRLEN + NFGENMSG_LEN;
    let set_off = table_off + align4(NLA_HDRLEN + table.len() + 1);
    (table_off as u32, set_off as u32)
}

/// RTM_NEWNEIGH/RTM_DELNEIGH for a proxy entry: nlmsghdr, struct ndmsg, NDA_DST.
fn neigh_msg(add: bool, seq: u32, ifindex: u32, ip: IpAddr) -> Vec<u8> {
    let (ty, flags, state) = if add {
        (
            libc::RTM_NEWNEIGH,
            libc::NLM_F_CREATE | libc::NLM_F_REPLACE,
            libc::NUD_PERMANENT,
        )
    } else {
        (libc::RTM_DELNEIGH, 0, 0)
    };
    let family = match ip {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    };
    let mut b = Vec::with_capacity(48);
    let m = begin_msg(
        &mut b,
        ty,
        (libc::NLM_F_REQUEST | libc::NLM_F_ACK | flags) as u16,
        seq,
    );
    // struct ndmsg: family, 3 pad bytes, ifindex, state, flags, type.
    b.push(family as u8);
    b.extend_from_slice(&[0; 3]);
    b.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    b.extend_from_slice(&state.to_ne_bytes());
    b.push(libc::NTF_PROXY);
    b.push(0);
    put_attr(&mut b, libc::NDA_DST, &ip_bytes(ip));
    end_msg(&mut b, m);
    b
}

/// A broadcast Ethernet frame carrying a gratuitous ARP `op` for `ip` at `mac`, padded
/// to the Ethernet minimum. Replies carry target MAC = sender MAC, which Linux requires
/// to treat a reply as gratuitous.
/// An Ethernet/IPv4 ARP frame to `dst`: operation `op`, sender and target (hardware
/// address, IP address).
fn arp_frame(
    op: u16,
    dst: [u8; 6],
    (sha, spa): ([u8; 6], Ipv4Addr),
    (tha, tpa): ([u8; 6], Ipv4Addr),
) -> [u8; ETH_ZLEN] {
    let mut f = [0u8; ETH_ZLEN];
    let mut eth = EthernetFrame::emit(&mut f[..], dst, sha, ethernet::ETHERTYPE_ARP)
        .expect("ETH_ZLEN holds the header");
    ArpPacket::emit(eth.payload_mut(), op, (sha, spa), (tha, tpa))
        .expect("ETH_ZLEN holds an ARP packet");
    f
}

// ---- netlink transport ----

/// The kernel's answer to the acked message: errno 0 = success.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Ack {
    pub(crate) errno: i32,
    /// Offset of the offending attribute from the request's nlmsghdr (extended ack).
    bad_attr: Option<u32>,
    /// Extended-ack message, if the kernel gave one.
    msg: Option<String>,
}

/// Finds the answer in one received datagram: the NLMSG_ERROR for `ack_seq`, or a
/// nonzero one for any of our `count` messages from `first` (a refused batch header).
fn parse_ack(dgram: &[u8], first: u32, count: u32, ack_seq: u32) -> Option<Ack> {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= dgram.len() {
        let len = u32_at(dgram, off) as usize;
        if len < NLMSG_HDRLEN || off + len > dgram.len() {
            return None;
        }
        let ty = u16_at(dgram, off + 4);
        let flags = u16_at(dgram, off + 6) as libc::c_int;
        let seq = u32_at(dgram, off + 8);
        if ty == libc::NLMSG_ERROR as u16 && len >= NLMSG_HDRLEN + 4 + NLMSG_HDRLEN {
            let error = u32_at(dgram, off + NLMSG_HDRLEN) as i32;
            if seq == ack_seq || (error != 0 && seq.wrapping_sub(first) < count) {
                let mut ack = Ack {
                    errno: -error,
                    ..Ack::default()
                };
                if flags & libc::NLM_F_ACK_TLVS != 0 {
                    // TLVs follow the echoed request: its header only if capped.
                    let echoed = if flags & libc::NLM_F_CAPPED != 0 {
                        NLMSG_HDRLEN
                    } else {
                        align4(u32_at(dgram, off + NLMSG_HDRLEN + 4) as usize)
                    };
                    let end = off + len;
                    let mut a = off + NLMSG_HDRLEN + 4 + echoed;
                    while a + NLA_HDRLEN <= end {
                        let alen = u16_at(dgram, a) as usize;
                        if alen < NLA_HDRLEN || a + alen > end {
                            break;
                        }
                        let payload = &dgram[a + NLA_HDRLEN..a + alen];
                        match u16_at(dgram, a + 2) {
                            NLMSGERR_ATTR_OFFS if payload.len() == 4 => {
                                ack.bad_attr = Some(u32_at(payload, 0));
                            }
                            NLMSGERR_ATTR_MSG => {
                                let s = payload.split(|&c| c == 0).next().unwrap_or(&[]);
                                ack.msg = Some(String::from_utf8_lossy(s).into_owned());
                            }
                            _ => {}
                        }
                        a += align4(alen);
                    }
                }
                return Some(ack);
            }
        }
        off += align4(len);
    }
    None
}

/// A socket the kernel reports on (NFLOG, NFQUEUE), opened by `open`; retried every
/// 100 ms while it fails (another process holds the group or queue: an msrd being
/// upgraded still runs), with one warning, `waits`, naming `what`.
pub(crate) async fn open_reports(
    open: impl Fn() -> io::Result<OwnedFd>,
    what: &str,
    waits: &str,
) -> tokio::io::unix::AsyncFd<OwnedFd> {
    let mut warned = false;
    loop {
        let opened = open().and_then(|fd| {
            // SAFETY: the OwnedFd is valid, open and owned by the AsyncFd from here on.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
            .map_err(|e| io::Error::other(e.to_string()))
        });
        match opened {
            Ok(fd) => return fd,
            Err(e) => {
                if !warned {
                    tracing::warn!(what, error = %e, "{waits}");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// What one read of a report socket gave.
pub(crate) enum Reports {
    /// A datagram of this many bytes.
    Read(usize),
    /// Reports were lost (the socket's buffer overran).
    Overrun,
    /// The socket is gone.
    Closed,
}

/// Waits for and reads one datagram of reports from `fd`. Interruptions are retried;
/// a failed read is logged (naming `what`) and retried after 50 ms.
pub(crate) async fn read_reports(
    fd: &tokio::io::unix::AsyncFd<OwnedFd>,
    buf: &mut [u8],
    what: &str,
) -> Reports {
    loop {
        let Ok(mut ready) = fd.readable().await else {
            return Reports::Closed;
        };
        match recv(fd.get_ref().as_raw_fd(), buf, MsgFlags::empty()) {
            Ok(n) => return Reports::Read(n),
            Err(Errno::EAGAIN) => ready.clear_ready(),
            Err(Errno::EINTR) => {}
            Err(Errno::ENOBUFS) => return Reports::Overrun,
            Err(e) => {
                tracing::warn!(what, error = %e, "read failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The bodies (what follows each nlmsghdr) of the messages of type `ty` in one
/// datagram, up to the first malformed one.
pub(crate) fn messages(dgram: &[u8], ty: u16) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= dgram.len() {
        let len = u32_at(dgram, off) as usize;
        if len < NLMSG_HDRLEN || off + len > dgram.len() {
            break;
        }
        if u16_at(dgram, off + 4) == ty {
            out.push(&dgram[off + NLMSG_HDRLEN..off + len]);
        }
        off += align4(len);
    }
    out
}

/// The attributes of `body` from offset `start`, as (type without its flag bits,
/// payload); None if one is malformed.
pub(crate) fn attrs(body: &[u8], start: usize) -> Option<Vec<(u16, &[u8])>> {
    let mut out = Vec::new();
    let mut a = start;
    while a + NLA_HDRLEN <= body.len() {
        let alen = u16_at(body, a) as usize;
        if alen < NLA_HDRLEN || a + alen > body.len() {
            return None;
        }
        out.push((
            u16_at(body, a + 2) & 0x3fff,
            &body[a + NLA_HDRLEN..a + alen],
        ));
        a += align4(alen);
    }
    Some(out)
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub(crate) fn next_seq(n: u32) -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    SEQ.fetch_add(n, Ordering::Relaxed)
}

/// A netlink socket kept for reuse by one thread, with the network namespace it lives in.
struct NlSock {
    protocol: libc::c_int,
    netns: (u64, u64),
    fd: OwnedFd,
}

thread_local! {
    // Reused because closing a NETLINK_NETFILTER socket waits for nf_tables' deferred
    // cleanup (an RCU grace period: ~14 ms after a delete). Per thread, since the
    // namespace is per thread too.
    static NL_SOCKS: RefCell<Vec<NlSock>> = const { RefCell::new(Vec::new()) };
}

/// Identity (dev, inode) of the calling thread's network namespace.
fn thread_netns() -> io::Result<(u64, u64)> {
    let m = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| context("netlink: /proc/thread-self/ns/net", e))?;
    Ok((m.dev(), m.ino()))
}

/// Sends `req` as one datagram (batches must arrive in one piece) and waits for the
/// answer: the NLMSG_ERROR for `ack_seq`, or an error for any of the `count` sequence
/// numbers from `first`. Err only for local failures; kernel refusals are in Ack.
fn nl_request(
    protocol: libc::c_int,
    req: &[u8],
    first: u32,
    count: u32,
    ack_seq: u32,
) -> io::Result<Ack> {
    let netns = thread_netns()?;
    NL_SOCKS.with(|socks| {
        let mut socks = socks.borrow_mut();
        let i = match socks.iter().position(|s| s.protocol == protocol) {
            Some(i) if socks[i].netns == netns => i,
            found => {
                let s = NlSock {
                    protocol,
                    netns,
                    fd: nl_socket(protocol)?,
                };
                match found {
                    Some(i) => {
                        socks[i] = s;
                        i
                    }
                    None => {
                        socks.push(s);
                        socks.len() - 1
                    }
                }
            }
        };
        let r = nl_exchange(socks[i].fd.as_raw_fd(), req, first, count, ack_seq);
        if r.is_err() {
            // A late ack or an overrun could confuse the next request: start afresh.
            socks.swap_remove(i);
        }
        r
    })
}

pub(crate) fn nl_socket(protocol: libc::c_int) -> io::Result<OwnedFd> {
    let sock = socket(libc::AF_NETLINK, libc::SOCK_RAW, protocol)?;
    let fd = sock.as_raw_fd();
    // Best effort: extended acks name the bad attribute; capped acks keep replies short.
    let one: libc::c_int = 1;
    for opt in [libc::NETLINK_EXT_ACK, libc::NETLINK_CAP_ACK] {
        // SAFETY: `one` is a live c_int and its size is passed along.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_NETLINK,
                opt,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    socket2::SockRef::from(&sock)
        .set_read_timeout(Some(ACK_TIMEOUT))
        .map_err(|e| context("netlink: SO_RCVTIMEO", e))?;
    Ok(sock)
}

pub(crate) fn nl_exchange(
    fd: RawFd,
    req: &[u8],
    first: u32,
    count: u32,
    ack_seq: u32,
) -> io::Result<Ack> {
    loop {
        // An unconnected netlink socket sends to the kernel (port 0).
        match send(fd, req, MsgFlags::empty()) {
            Ok(_) => break,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(context("netlink: send", e.into())),
        }
    }

    let mut buf = [0u8; 8192];
    loop {
        let n = match recv(fd, &mut buf, MsgFlags::empty()) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "netlink: no ack from the kernel",
                ))
            }
            Err(e) => return Err(context("netlink: recv", e.into())),
        };
        if let Some(ack) = parse_ack(&buf[..n], first, count, ack_seq) {
            return Ok(ack);
        }
    }
}

// ---- small helpers ----

pub(crate) fn socket(
    domain: libc::c_int,
    ty: libc::c_int,
    protocol: libc::c_int,
) -> io::Result<OwnedFd> {
    // socket2 opens it close-on-exec.
    socket2::Socket::new_raw(domain.into(), ty.into(), Some(protocol.into()))
        .map(OwnedFd::from)
        .map_err(|e| context("socket", e))
}

fn ifindex(ifname: &str, what: &str) -> io::Result<u32> {
    nix::net::if_::if_nametoindex(ifname)
        .map_err(|e| context(&format!("{what}: interface {ifname}"), e.into()))
}

/// The Ethernet address of interface `ifname`.
pub fn link_mac(ifname: &str) -> io::Result<[u8; 6]> {
    let s = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    hwaddr(s.as_raw_fd(), ifname)
}

/// Gives interface `ifname` the Ethernet address `mac` (SIOCSIFHWADDR; most drivers
/// take it while up).
pub fn set_link_mac(ifname: &str, mac: [u8; 6]) -> io::Result<()> {
    let s = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { zeroed() };
    if ifname.len() >= ifr.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {ifname} too long"),
        ));
    }
    for (d, c) in ifr.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = c as libc::c_char;
    }
    // SAFETY: writing the hwaddr member of the union, which SIOCSIFHWADDR reads.
    unsafe {
        ifr.ifr_ifru.ifru_hwaddr.sa_family = libc::ARPHRD_ETHER;
        for (d, b) in ifr.ifr_ifru.ifru_hwaddr.sa_data.iter_mut().zip(mac) {
            *d = b as libc::c_char;
        }
    }
    // SAFETY: ifr is a live ifreq with a NUL-terminated name and the new address.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFHWADDR, &ifr) } != 0 {
        return Err(context(
            &format!("setting the MAC address of {ifname}"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The interface's Ethernet address, by ioctl (not /sys, which may be another
/// namespace's).
pub(crate) fn hwaddr(fd: RawFd, ifname: &str) -> io::Result<[u8; 6]> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { zeroed() };
    if ifname.len() >= ifr.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {ifname} too long"),
        ));
    }
    for (d, s) in ifr.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: ifr is a live ifreq with a NUL-terminated name, as SIOCGIFHWADDR expects.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut ifr) } != 0 {
        return Err(context(
            &format!("SIOCGIFHWADDR {ifname}"),
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: SIOCGIFHWADDR filled in the hwaddr member of the union.
    let sa = unsafe { ifr.ifr_ifru.ifru_hwaddr };
    if sa.sa_family != libc::ARPHRD_ETHER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{ifname} is not an Ethernet interface (hardware type {})",
                sa.sa_family
            ),
        ));
    }
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data) {
        *d = s as u8;
    }
    Ok(mac)
}

fn check_name(name: &str, kind: &str, what: &str) -> io::Result<()> {
    // nftables names are at most 255 bytes; a NUL would cut the attribute short.
    if name.is_empty() || name.len() > 255 || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what}: invalid {kind} name"),
        ));
    }
    Ok(())
}

/// The error's text without std's " (os error N)" suffix, which says nothing new here.
fn describe(e: &io::Error) -> String {
    let s = e.to_string();
    match e.raw_os_error() {
        Some(n) => s
            .strip_suffix(&format!(" (os error {n})"))
            .map_or(s.clone(), str::to_owned),
        None => s,
    }
}

pub(crate) fn context(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {}", describe(&e)))
}

pub(crate) fn kernel_error(what: &str, errno: i32, hint: Option<&str>, ack: &Ack) -> io::Error {
    let e = io::Error::from_raw_os_error(errno);
    let mut s = format!("{what}: {}", describe(&e));
    for extra in [hint, ack.msg.as_deref()].into_iter().flatten() {
        s.push_str(&format!(" ({extra})"));
    }
    io::Error::new(e.kind(), s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ne16(v: u16) -> [u8; 2] {
        v.to_ne_bytes()
    }

    fn ne32(v: u32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    #[test]
    fn host_route_layout() {
        let b = route_msg(true, 7, "10.2.0.100".parse().unwrap(), 3, 40, 73);
        assert_eq!(u16_at(&b, 4), libc::RTM_NEWROUTE);
        let r = &b[NLMSG_HDRLEN..];
        // AF_INET, /32, main table, proto 73, link scope, unicast.
        assert_eq!(&r[..8], &[2, 32, 0, 0, 254, 73, 253, 1]);
        // RTA_DST, RTA_OIF, RTA_METRICS { RTAX_INITCWND 40 }.
        assert_eq!(&r[12..20], &[8, 0, 1, 0, 10, 2, 0, 100]);
        assert_eq!(&r[20..28], &[8, 0, 4, 0, 3, 0, 0, 0]);
        assert_eq!(&r[28..32], &[12, 0, 8, 0x80], "RTA_METRICS, nested");
        assert_eq!(&r[32..40], &[8, 0, 11, 0, 40, 0, 0, 0]);
        let d = route_msg(false, 8, "2001:db8:2::64".parse().unwrap(), 3, 0, 73);
        assert_eq!(u16_at(&d, 4), libc::RTM_DELROUTE);
        assert_eq!(d[NLMSG_HDRLEN + 1], 128);
        assert!(d.len() < b.len() + 12, "no metrics on delete");
    }

    #[test]
    fn neighbour_advertisement_layout() {
        let t: Ipv6Addr = "2001:db8:2::64".parse().unwrap();
        let m = na_message(t, [2, 0, 0, 0, 1, 1]);
        assert_eq!(m.len(), 32);
        assert_eq!(
            &m[..8],
            &[136, 0, 0, 0, 0x20, 0, 0, 0],
            "override, not solicited"
        );
        assert_eq!(&m[8..24], &t.octets());
        assert_eq!(&m[24..], &[2, 1, 2, 0, 0, 0, 1, 1]);
        assert_eq!(
            proxy_ndp_path("lan0").unwrap(),
            "/proc/sys/net/ipv6/conf/lan0/proxy_ndp"
        );
    }

    #[test]
    fn attr_is_padded_and_length_excludes_padding() {
        let mut b = Vec::new();
        put_attr(&mut b, 7, &[1, 2, 3, 4, 5]);
        assert_eq!(b.len(), 12);
        assert_eq!(&b[0..2], &ne16(9));
        assert_eq!(&b[2..4], &ne16(7));
        assert_eq!(&b[4..9], &[1, 2, 3, 4, 5]);
        assert_eq!(&b[9..], &[0, 0, 0]);
    }

    #[test]
    fn string_attr_is_nul_terminated() {
        let mut b = Vec::new();
        put_attr_str(&mut b, 1, "abcd");
        assert_eq!(&b[0..2], &ne16(9));
        assert_eq!(&b[4..9], b"abcd\0");
        assert_eq!(b.len(), 12);
    }

    #[test]
    fn nested_sets_flag_and_covers_children() {
        let mut b = Vec::new();
        let n = begin_nested(&mut b, 3);
        put_attr(&mut b, 1, &[9; 4]);
        end_nested(&mut b, n);
        assert_eq!(&b[0..2], &ne16(12));
        assert_eq!(&b[2..4], &ne16(3 | 0x8000));
    }

    #[test]
    fn header_and_nfgenmsg_layout() {
        let mut b = Vec::new();
        let m = begin_msg(&mut b, 0x10, 1, 42);
        put_nfgenmsg(&mut b, 0, 10);
        end_msg(&mut b, m);
        let mut want = Vec::new();
        want.extend_from_slice(&ne32(20));
        want.extend_from_slice(&ne16(0x10));
        want.extend_from_slice(&ne16(1));
        want.extend_from_slice(&ne32(42));
        want.extend_from_slice(&ne32(0));
        want.extend_from_slice(&[0, 0, 0, 10]); // res_id big-endian
        assert_eq!(b, want);
    }

    /// Splits a buffer of netlink messages into (type, flags, seq, payload).
    fn split(b: &[u8]) -> Vec<(u16, u16, u32, &[u8])> {
        let mut v = Vec::new();
        let mut off = 0;
        while off < b.len() {
            let len = u32_at(b, off) as usize;
            assert_eq!(len % 4, 0);
            v.push((
                u16_at(b, off + 4),
                u16_at(b, off + 6),
                u32_at(b, off + 8),
                &b[off + 16..off + len],
            ));
            off += len;
        }
        assert_eq!(off, b.len());
        v
    }

    #[test]
    fn setelem_batch_v4_layout() {
        let b = nft_setelem_batch(
            libc::NFPROTO_INET as u8,
            "itcp_msrd",
            "held4",
            &[(ip_bytes("10.2.0.100".parse().unwrap()), None)],
            true,
            5,
        );
        let msgs = split(&b);
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[0].0, 0x10);
        assert_eq!(msgs[0].1, 1);
        assert_eq!(msgs[0].2, 5);
        assert_eq!(msgs[0].3, &[0, 0, 0, 10]);
        assert_eq!(msgs[2].0, 0x11);
        assert_eq!(msgs[2].2, 7);
        assert_eq!(msgs[2].3, &[0, 0, 0, 10]);

        let (ty, flags, seq, p) = msgs[1];
        assert_eq!(ty, (10 << 8) | 12);
        assert_eq!(flags, 1 | 4 | 0x400);
        assert_eq!(seq, 6);
        let mut want = vec![1, 0, 0, 0]; // NFPROTO_INET, v0, res_id 0
        want.extend_from_slice(&ne16(14));
        want.extend_from_slice(&ne16(1));
        want.extend_from_slice(b"itcp_msrd\0\0\0");
        want.extend_from_slice(&ne16(10));
        want.extend_from_slice(&ne16(2));
        want.extend_from_slice(b"held4\0\0\0");
        // ELEMENTS > LIST_ELEM > KEY > DATA_VALUE (4 address bytes)
        want.extend_from_slice(&ne16(20));
        want.extend_from_slice(&ne16(3 | 0x8000));
        want.extend_from_slice(&ne16(16));
        want.extend_from_slice(&ne16(1 | 0x8000));
        want.extend_from_slice(&ne16(12));
        want.extend_from_slice(&ne16(1 | 0x8000));
        want.extend_from_slice(&ne16(8));
        want.extend_from_slice(&ne16(1));
        want.extend_from_slice(&[10, 2, 0, 100]);
        assert_eq!(p, &want[..]);

        let (t, s) = nft_setelem_attr_offsets("itcp_msrd");
        assert_eq!(&b[20 + t as usize + 4..][..9], b"itcp_msrd");
        assert_eq!(&b[20 + s as usize + 4..][..5], b"held4");
    }

    #[test]
    fn setelem_batch_v6_delete() {
        let ip: IpAddr = "2001:db8::64".parse().unwrap();
        let b = nft_setelem_batch(
            libc::NFPROTO_INET as u8,
            "t",
            "held6",
            &[(ip_bytes(ip), None)],
            false,
            100,
        );
        let msgs = split(&b);
        let (ty, flags, _, p) = msgs[1];
        assert_eq!(ty, (10 << 8) | 14);
        assert_eq!(flags, 1 | 4);
        // Innermost attribute: 4-byte header + 16 address bytes, at the very end.
        assert_eq!(
            &p[p.len() - 20..p.len() - 16],
            &[&ne16(20)[..], &ne16(1)].concat()
        );
        assert_eq!(&p[p.len() - 16..], &ip_bytes(ip)[..]);
    }

    #[test]
    fn learn_msg_creates_a_stale_entry_and_never_replaces() {
        let mac = [2, 0, 0, 0, 0, 0x64];
        let b = learn_msg(9, 3, "10.2.0.100".parse().unwrap(), mac);
        let (ty, flags, seq, p) = split(&b)[0];
        assert_eq!((ty, seq), (28, 9));
        // REQUEST | ACK | CREATE, and no REPLACE (0x100): a valid entry stays.
        assert_eq!(flags, 1 | 4 | 0x400);
        let mut want = vec![2, 0, 0, 0];
        want.extend_from_slice(&3i32.to_ne_bytes());
        want.extend_from_slice(&ne16(0x04)); // NUD_STALE
        want.extend_from_slice(&[0, 0]);
        want.extend_from_slice(&ne16(8));
        want.extend_from_slice(&ne16(1)); // NDA_DST
        want.extend_from_slice(&[10, 2, 0, 100]);
        want.extend_from_slice(&ne16(10));
        want.extend_from_slice(&ne16(2)); // NDA_LLADDR
        want.extend_from_slice(&mac);
        want.extend_from_slice(&[0, 0]);
        assert_eq!(p, &want[..]);
    }

    #[test]
    fn neigh_msg_layout() {
        let b = neigh_msg(true, 9, 3, "10.0.0.7".parse().unwrap());
        let msgs = split(&b);
        assert_eq!(msgs.len(), 1);
        let (ty, flags, seq, p) = msgs[0];
        assert_eq!(ty, 28);
        assert_eq!(flags, 1 | 4 | 0x400 | 0x100);
        assert_eq!(seq, 9);
        let mut want = vec![2, 0, 0, 0];
        want.extend_from_slice(&3i32.to_ne_bytes());
        want.extend_from_slice(&ne16(0x80));
        want.extend_from_slice(&[0x08, 0]);
        want.extend_from_slice(&ne16(8));
        want.extend_from_slice(&ne16(1));
        want.extend_from_slice(&[10, 0, 0, 7]);
        assert_eq!(p, &want[..]);

        let b = neigh_msg(false, 9, 3, "2001:db8::7".parse().unwrap());
        let (ty, flags, _, p) = split(&b)[0];
        assert_eq!(ty, 29);
        assert_eq!(flags, 1 | 4);
        assert_eq!(p[0], 10); // AF_INET6
        assert_eq!(p.len(), 12 + 20);
    }

    #[test]
    fn arp_frames() {
        let mac = [2, 0, 0, 0, 0, 1];
        let ip = Ipv4Addr::new(10, 9, 0, 100);
        let f = arp_frame(ARPOP_REQUEST, [0xff; 6], (mac, ip), ([0; 6], ip));
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(&f[6..12], &mac);
        assert_eq!(&f[12..22], &[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        assert_eq!(&f[22..28], &mac);
        assert_eq!(&f[28..32], &[10, 9, 0, 100]);
        assert_eq!(&f[32..38], &[0; 6]);
        assert_eq!(&f[38..42], &[10, 9, 0, 100]);
        assert!(f[42..].iter().all(|&b| b == 0));
        let r = arp_frame(ARPOP_REPLY, [0xff; 6], (mac, ip), (mac, ip));
        assert_eq!(&r[20..22], &[0, 2]);
        assert_eq!(&r[32..38], &mac);
        // A unicast request: to the asked host's MAC, from our address to its.
        let mh = [2, 0, 0, 0, 0, 0x64];
        let gw = Ipv4Addr::new(10, 2, 0, 1);
        let q = arp_frame(ARPOP_REQUEST, mh, (mac, gw), ([0; 6], ip));
        assert_eq!(&q[0..6], &mh);
        assert_eq!(&q[20..22], &[0, 1]);
        assert_eq!(&q[28..32], &[10, 2, 0, 1]);
        assert_eq!(&q[38..42], &[10, 9, 0, 100]);
    }

    #[test]
    fn neighbour_solicitation_layout() {
        let target: Ipv6Addr = "2001:db8:2::100".parse().unwrap();
        let m = ns_message(target, [2, 0, 0x5e, 0, 1, 1]);
        assert_eq!(m.len(), 32);
        assert_eq!(&m[..8], &[135, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&m[8..24], &target.octets());
        assert_eq!(&m[24..], &[1, 1, 2, 0, 0x5e, 0, 1, 1]);
    }

    fn error_msg(seq: u32, error: i32, flags: u16, tlvs: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        let m = begin_msg(&mut b, libc::NLMSG_ERROR as u16, flags, seq);
        b.extend_from_slice(&error.to_ne_bytes());
        // Capped echo of the request header.
        b.extend_from_slice(&ne32(40));
        b.extend_from_slice(&[0; 12]);
        b.extend_from_slice(tlvs);
        end_msg(&mut b, m);
        b
    }

    #[test]
    fn error_text() {
        let e = kernel_error(
            "nft: x",
            libc::ENOENT,
            Some("table not found"),
            &Ack::default(),
        );
        assert_eq!(
            e.to_string(),
            "nft: x: No such file or directory (table not found)"
        );
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn ack_parsing() {
        assert_eq!(
            parse_ack(&error_msg(3, 0, 0, &[]), 3, 1, 3),
            Some(Ack::default())
        );
        // A zero ack for another message is not ours.
        assert_eq!(parse_ack(&error_msg(2, 0, 0, &[]), 1, 3, 3), None);
        // An error for a message of the same batch answers; one for an older request not.
        let e = error_msg(1, -libc::EPERM, 0, &[]);
        assert_eq!(parse_ack(&e, 1, 3, 2).map(|a| a.errno), Some(libc::EPERM));
        assert_eq!(parse_ack(&e, 4, 3, 5), None);

        let mut tlvs = Vec::new();
        put_attr(&mut tlvs, NLMSGERR_ATTR_OFFS, &ne32(20));
        put_attr_str(&mut tlvs, NLMSGERR_ATTR_MSG, "oops");
        let flags = (libc::NLM_F_CAPPED | libc::NLM_F_ACK_TLVS) as u16;
        let mut two = error_msg(1, 0, 0, &[]);
        two.extend(error_msg(2, -libc::ENOENT, flags, &tlvs));
        assert_eq!(
            parse_ack(&two, 1, 3, 2),
            Some(Ack {
                errno: libc::ENOENT,
                bad_attr: Some(20),
                msg: Some("oops".into()),
            })
        );
    }
}
