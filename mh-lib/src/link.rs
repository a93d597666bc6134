//! The MH's link state from the kernel, so that the mobility agent learns at once when
//! its wireless interface associates with a cell: a NIC turns its carrier on when it
//! associates (the testbed's emulator does the same on the MH's TAP device), and the
//! kernel announces it on rtnetlink (RTM_NEWLINK with `IFF_LOWER_UP`).
//!
//! [`LinkWatch`] is the thin I/O: a `NETLINK_ROUTE` socket subscribed to `RTMGRP_LINK`,
//! non-blocking, in the caller's network namespace. What the messages mean is decided
//! without I/O by [`parse_link_messages`] and [`CarrierEdge`].
//!
//! The kernel reports carrier changes through its link-watch work, which sends carrier
//! *losses* at most once a second (system-wide) but gains at once. A loss and a gain
//! that fall in the same second may therefore come as one message that only says "up":
//! [`CarrierEdge`] also treats a grown carrier-up count (`IFLA_CARRIER_UP_COUNT`, Linux
//! ≥ 4.19) as a new association.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    bind, recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};

const NLMSG_HDRLEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTMGRP_LINK: u32 = 1;
const IFLA_CARRIER_UP_COUNT: u16 = 47;
const IFF_UP: u32 = 0x1;
const IFF_LOWER_UP: u32 = 0x1_0000;

/// One report about the watched interface, as the kernel sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkReport {
    /// Administratively up with carrier (`IFF_UP` and `IFF_LOWER_UP`); false when the
    /// interface was deleted.
    pub carrier: bool,
    /// How many times its carrier came up so far (`IFLA_CARRIER_UP_COUNT`), if the
    /// kernel says.
    pub up_count: Option<u32>,
}

/// A change worth acting on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// The carrier came up (or was up when first seen): the MH just associated.
    Up,
    /// The carrier went away: the MH is in no cell.
    Down,
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The reports about interface `ifindex` in one datagram read from a `NETLINK_ROUTE`
/// socket (RTM_NEWLINK and RTM_DELLINK; anything else, another interface's messages
/// and truncated messages are skipped).
pub fn parse_link_messages(buf: &[u8], ifindex: u32) -> Vec<LinkReport> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let len = u32_at(buf, off) as usize;
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            break;
        }
        let ty = u16_at(buf, off + 4);
        let msg = &buf[off..off + len];
        off += align4(len);
        if (ty != RTM_NEWLINK && ty != RTM_DELLINK) || msg.len() < NLMSG_HDRLEN + IFINFOMSG_LEN {
            continue;
        }
        let ifi = &msg[NLMSG_HDRLEN..];
        if u32_at(ifi, 4) != ifindex {
            continue;
        }
        let flags = u32_at(ifi, 8);
        let mut up_count = None;
        let mut a = NLMSG_HDRLEN + IFINFOMSG_LEN;
        while a + 4 <= msg.len() {
            let alen = u16_at(msg, a) as usize;
            let aty = u16_at(msg, a + 2) & 0x3fff;
            if alen < 4 || a + alen > msg.len() {
                break;
            }
            if aty == IFLA_CARRIER_UP_COUNT && alen >= 8 {
                up_count = Some(u32_at(msg, a + 4));
            }
            a += align4(alen);
        }
        out.push(LinkReport {
            carrier: ty == RTM_NEWLINK && flags & IFF_UP != 0 && flags & IFF_LOWER_UP != 0,
            up_count,
        });
    }
    out
}

/// Turns reports into [`LinkEvent`]s: `Up` when the carrier is up and was not (or was
/// never seen), or came up again unseen (its up count grew); `Down` when it goes away.
#[derive(Debug, Clone, Default)]
pub struct CarrierEdge {
    carrier: Option<bool>,
    up_count: Option<u32>,
}

impl CarrierEdge {
    /// Nothing seen yet: the first report with carrier is an `Up`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forget the state (after lost messages): the next report with carrier is an `Up`.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// The carrier as last reported.
    pub fn carrier(&self) -> Option<bool> {
        self.carrier
    }

    /// One report.
    pub fn on_report(&mut self, r: LinkReport) -> Option<LinkEvent> {
        let was = self.carrier.replace(r.carrier);
        let grew = match (self.up_count, r.up_count) {
            (Some(a), Some(b)) => b != a,
            _ => false,
        };
        if r.up_count.is_some() {
            self.up_count = r.up_count;
        }
        match (was, r.carrier) {
            (Some(true), true) if grew => Some(LinkEvent::Up),
            (Some(true), true) => None,
            (_, true) => Some(LinkEvent::Up),
            (Some(false), false) => None,
            (_, false) => Some(LinkEvent::Down),
        }
    }
}

/// Watches one interface's carrier over rtnetlink; see the module docs.
#[derive(Debug)]
pub struct LinkWatch {
    fd: OwnedFd,
    ifname: String,
    ifindex: u32,
    edge: CarrierEdge,
    seq: u32,
    buf: Vec<u8>,
}

impl LinkWatch {
    /// Subscribes to link changes in the calling thread's network namespace and asks
    /// for `ifname`'s current state (reported by the first [`LinkWatch::read`]).
    pub fn open(ifname: &str) -> io::Result<LinkWatch> {
        let what = |e: io::Error| io::Error::new(e.kind(), format!("link state of {ifname}: {e}"));
        let ifindex = nix::net::if_::if_nametoindex(ifname).map_err(|e| what(e.into()))?;
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )
        .map_err(|e| what(e.into()))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, RTMGRP_LINK)).map_err(|e| what(e.into()))?;
        let mut w = LinkWatch {
            fd,
            ifname: ifname.into(),
            ifindex,
            edge: CarrierEdge::new(),
            seq: 0,
            buf: vec![0u8; 64 * 1024],
        };
        w.request_state().map_err(what)?;
        Ok(w)
    }

    /// The socket, for poll(2): readable when [`LinkWatch::read`] has something.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The interface watched.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The carrier as last reported (None before the first report).
    pub fn carrier(&self) -> Option<bool> {
        self.edge.carrier()
    }

    /// Asks the kernel for the interface's state now (RTM_GETLINK); the answer arrives
    /// like any change.
    fn request_state(&mut self) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut m = Vec::with_capacity(NLMSG_HDRLEN + IFINFOMSG_LEN);
        m.extend_from_slice(&((NLMSG_HDRLEN + IFINFOMSG_LEN) as u32).to_ne_bytes());
        m.extend_from_slice(&RTM_GETLINK.to_ne_bytes());
        m.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
        m.extend_from_slice(&self.seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        // ifinfomsg: family, pad, type, index, flags, change.
        m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
        m.extend_from_slice(&self.ifindex.to_ne_bytes());
        m.extend_from_slice(&[0; 8]);
        // Port 0 is the kernel.
        sendto(
            self.fd.as_raw_fd(),
            &m,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )?;
        Ok(())
    }

    /// Reads every pending message (non-blocking) and returns the events, in order.
    /// If the kernel dropped messages (our socket overflowed), the state is asked
    /// again and the next report with carrier counts as an `Up`.
    pub fn read(&mut self) -> io::Result<Vec<LinkEvent>> {
        let mut events = Vec::new();
        loop {
            let n = match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EAGAIN) => return Ok(events),
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOBUFS) => {
                    self.edge.reset();
                    self.request_state()?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if n >= NLMSG_HDRLEN && u16_at(&self.buf, 4) == NLMSG_ERROR {
                // Our request failed (the interface went away?): nothing to report.
                continue;
            }
            for r in parse_link_messages(&self.buf[..n], self.ifindex) {
                events.extend(self.edge.on_report(r));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One RTM_NEWLINK (or another type) for `ifindex` with `flags` and, if given, an
    /// IFLA_CARRIER_UP_COUNT attribute after an IFLA_IFNAME.
    fn msg(ty: u16, ifindex: u32, flags: u32, up_count: Option<u32>) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&0u32.to_ne_bytes()); // length, below
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&[0; 8]);
        m.extend_from_slice(&[0, 0, 1, 0]);
        m.extend_from_slice(&ifindex.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        // IFLA_IFNAME "air0\0": length 9, padded to 12.
        m.extend_from_slice(&9u16.to_ne_bytes());
        m.extend_from_slice(&3u16.to_ne_bytes());
        m.extend_from_slice(b"air0\0\0\0\0");
        if let Some(c) = up_count {
            m.extend_from_slice(&8u16.to_ne_bytes());
            m.extend_from_slice(&IFLA_CARRIER_UP_COUNT.to_ne_bytes());
            m.extend_from_slice(&c.to_ne_bytes());
        }
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    const UP: u32 = IFF_UP | IFF_LOWER_UP | 0x40 /* IFF_RUNNING */;

    #[test]
    fn reports_of_our_interface_are_parsed_others_skipped() {
        let mut d = msg(RTM_NEWLINK, 7, UP, Some(3));
        d.extend(msg(RTM_NEWLINK, 8, 0, None)); // another interface
        d.extend(msg(20, 7, 0, None)); // RTM_NEWADDR
        d.extend(msg(RTM_NEWLINK, 7, IFF_UP, None)); // no carrier
        d.extend(msg(RTM_DELLINK, 7, UP, None));
        assert_eq!(
            parse_link_messages(&d, 7),
            vec![
                LinkReport {
                    carrier: true,
                    up_count: Some(3)
                },
                LinkReport {
                    carrier: false,
                    up_count: None
                },
                LinkReport {
                    carrier: false,
                    up_count: None
                },
            ]
        );
        // Administratively down with carrier is no carrier.
        assert!(!parse_link_messages(&msg(RTM_NEWLINK, 7, IFF_LOWER_UP, None), 7)[0].carrier);
    }

    #[test]
    fn truncated_and_junk_datagrams_yield_nothing_and_do_not_panic() {
        let m = msg(RTM_NEWLINK, 7, UP, Some(1));
        for k in 0..m.len() {
            assert!(parse_link_messages(&m[..k], 7).is_empty(), "prefix {k}");
        }
        // A bad attribute length ends the attributes, not the message.
        let mut bad = m.clone();
        let attr = NLMSG_HDRLEN + IFINFOMSG_LEN;
        bad[attr..attr + 2].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(
            parse_link_messages(&bad, 7),
            vec![LinkReport {
                carrier: true,
                up_count: None
            }]
        );
        let mut x = 0x9e37_79b9u32;
        for _ in 0..2000 {
            let junk: Vec<u8> = (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            let _ = parse_link_messages(&junk, 7);
        }
    }

    fn rep(carrier: bool, up_count: Option<u32>) -> LinkReport {
        LinkReport { carrier, up_count }
    }

    #[test]
    fn edges_are_reported_once() {
        let mut e = CarrierEdge::new();
        // Up when first seen: the agent solicits at start.
        assert_eq!(e.on_report(rep(true, Some(1))), Some(LinkEvent::Up));
        assert_eq!(e.on_report(rep(true, Some(1))), None);
        assert_eq!(e.on_report(rep(false, Some(1))), Some(LinkEvent::Down));
        assert_eq!(e.on_report(rep(false, Some(1))), None);
        assert_eq!(e.on_report(rep(true, Some(2))), Some(LinkEvent::Up));
        // A loss and a gain reported as one "up": the count grew.
        assert_eq!(e.on_report(rep(true, Some(3))), Some(LinkEvent::Up));
        // Without counts, only transitions.
        assert_eq!(e.on_report(rep(true, None)), None);
        let mut e = CarrierEdge::new();
        assert_eq!(e.on_report(rep(false, None)), Some(LinkEvent::Down));
        assert_eq!(e.on_report(rep(true, None)), Some(LinkEvent::Up));
        assert_eq!(e.on_report(rep(true, None)), None);
        e.reset();
        assert_eq!(e.on_report(rep(true, None)), Some(LinkEvent::Up));
    }

    #[test]
    fn loopback_is_watched_in_this_namespace() {
        // Needs no privileges: lo exists everywhere and is up with carrier.
        let Ok(mut w) = LinkWatch::open("lo") else {
            return; // no netlink in this sandbox
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut ev = Vec::new();
        while ev.is_empty() && std::time::Instant::now() < deadline {
            ev = w.read().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(ev, vec![LinkEvent::Up]);
        assert_eq!(w.carrier(), Some(true));
        assert!(LinkWatch::open("no-such-if0")
            .unwrap_err()
            .to_string()
            .contains("no-such-if0"));
    }
}
