//! The packets msrd's own nftables rules report on NFLOG groups (nfnetlink_log):
//! network detection's "an MH not present here sent a packet on a cell", and the
//! SYN-ACKs sent to MHs (`crate::handshakes`). Opening binds a group with the
//! packet's first bytes copied and no batching (each report is sent at once, not after
//! a second or 100 packets); [`parse`] and [`payloads`] are pure.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use itcp_wire::arp::ArpPacket;
use itcp_wire::{Ipv4Packet, Ipv6Packet};

use crate::netlink::{
    attrs, begin_msg, end_msg, kernel_error, messages, next_seq, nl_exchange, nl_socket, put_attr,
    put_nfgenmsg, NFGENMSG_LEN,
};

// From linux/netfilter/nfnetlink_log.h.
const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_PACKET_HDR: u16 = 1;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_HWADDR: u16 = 8;
const NFULA_PAYLOAD: u16 = 9;

/// Bytes of each packet copied for detection: the IPv4 header is all it needs.
pub const DETECT_COPY: u32 = 64;

/// One reported packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// Interface it came in on.
    pub ifindex: u32,
    /// The sender's link-layer address (None if the kernel gave none).
    pub mac: Option<[u8; 6]>,
    /// The packet's source address.
    pub src: IpAddr,
    /// The packet's first bytes (up to the copy range the group was opened with).
    pub head: Vec<u8>,
}

/// Opens a non-blocking netlink socket bound to NFLOG group `group`, copying the first
/// `copy` bytes of each packet. Fails with EBUSY while another socket (an msrd being
/// upgraded) holds the group.
pub fn open(group: u16, copy: u32) -> io::Result<OwnedFd> {
    let fd = nl_socket(libc::NETLINK_NETFILTER)?;
    let seq = next_seq(1);
    let req = config_msg(group, copy, seq);
    let ack = nl_exchange(fd.as_raw_fd(), &req, seq, 1, seq)?;
    if ack.errno != 0 {
        return Err(kernel_error(
            &format!("NFLOG group {group}"),
            ack.errno,
            (ack.errno == libc::EBUSY).then_some("another program listens on it"),
            &ack,
        ));
    }
    // Reports are read by an async task from here on.
    socket2::SockRef::from(&fd).set_nonblocking(true)?;
    Ok(fd)
}

/// Binds `group`, copies `copy` bytes of each packet, flushes every packet at once
/// (queue threshold 1, no timer).
fn config_msg(group: u16, copy: u32, seq: u32) -> Vec<u8> {
    let ty = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
    let mut b = Vec::new();
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    let m = begin_msg(&mut b, ty, flags, seq);
    put_nfgenmsg(&mut b, libc::AF_UNSPEC as u8, group);
    put_attr(&mut b, NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]);
    let mut mode = copy.to_be_bytes().to_vec();
    mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
    put_attr(&mut b, NFULA_CFG_MODE, &mode);
    put_attr(&mut b, NFULA_CFG_QTHRESH, &1u32.to_be_bytes());
    put_attr(&mut b, NFULA_CFG_TIMEOUT, &0u32.to_be_bytes());
    end_msg(&mut b, m);
    b
}

/// The packets reported in one datagram (anything else, or malformed, is skipped).
pub fn parse(dgram: &[u8]) -> Vec<Logged> {
    messages(dgram, (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET)
        .into_iter()
        .filter_map(parse_packet)
        .collect()
}

/// The copied bytes (from the IP header on) of each packet reported in one datagram.
pub fn payloads(dgram: &[u8]) -> Vec<&[u8]> {
    messages(dgram, (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET)
        .into_iter()
        .filter_map(|body| {
            attrs(body, NFGENMSG_LEN)?
                .into_iter()
                .find_map(|(ty, p)| (ty == NFULA_PAYLOAD).then_some(p))
        })
        .collect()
}

const ETH_P_IP: u16 = 0x0800;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;

/// The sender of an IPv4 or IPv6 packet (its head, as copied), or of an Ethernet/IPv4
/// ARP packet (and the ARP sender's hardware address).
fn sender(proto: u16, p: &[u8]) -> Option<(IpAddr, Option<[u8; 6]>)> {
    match proto {
        ETH_P_IP => Some((Ipv4Packet::new_head(p).ok()?.src_addr().into(), None)),
        ETH_P_IPV6 => Some((Ipv6Packet::new_head(p).ok()?.src_addr().into(), None)),
        ETH_P_ARP => {
            let arp = ArpPacket::new_checked(p).ok()?;
            Some((arp.sender_addr().into(), Some(arp.sender_hw_addr())))
        }
        _ => None,
    }
}

fn parse_packet(body: &[u8]) -> Option<Logged> {
    let (mut ifindex, mut mac, mut payload, mut proto) = (0, None, None, ETH_P_IP);
    for (ty, p) in attrs(body, NFGENMSG_LEN)? {
        match ty {
            // struct nfulnl_msg_packet_hdr: be16 hw_protocol, hook, pad.
            NFULA_PACKET_HDR if p.len() >= 2 => proto = u16::from_be_bytes([p[0], p[1]]),
            NFULA_IFINDEX_INDEV if p.len() == 4 => {
                ifindex = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
            }
            // struct nfulnl_msg_packet_hw: be16 length, 2 bytes pad, 8 bytes address.
            NFULA_HWADDR if p.len() >= 12 && u16::from_be_bytes([p[0], p[1]]) == 6 => {
                mac = Some([p[4], p[5], p[6], p[7], p[8], p[9]]);
            }
            NFULA_PAYLOAD => payload = Some(p),
            _ => {}
        }
    }
    let payload = payload?;
    let (src, sha) = sender(proto, payload)?;
    Some(Logged {
        ifindex,
        mac: mac.or(sha),
        src,
        head: payload.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{align4, u16_at, NLA_HDRLEN, NLMSG_HDRLEN};

    /// A packet message as the kernel sends it.
    fn packet(ifindex: u32, mac: &[u8; 6], payload: &[u8]) -> Vec<u8> {
        let proto = if payload.len() == 28 {
            ETH_P_ARP
        } else {
            ETH_P_IP
        };
        let mut b = Vec::new();
        let m = begin_msg(&mut b, (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET, 0, 0);
        put_nfgenmsg(&mut b, 5, 4954); // NFPROTO_NETDEV
        let mut hdr = proto.to_be_bytes().to_vec();
        hdr.extend_from_slice(&[0, 0]);
        put_attr(&mut b, NFULA_PACKET_HDR, &hdr);
        put_attr(&mut b, NFULA_IFINDEX_INDEV, &ifindex.to_be_bytes());
        let mut hw = 6u16.to_be_bytes().to_vec();
        hw.extend_from_slice(&[0, 0]);
        hw.extend_from_slice(mac);
        hw.extend_from_slice(&[0, 0]);
        put_attr(&mut b, NFULA_HWADDR, &hw);
        put_attr(&mut b, NFULA_PAYLOAD, payload);
        end_msg(&mut b, m);
        b
    }

    fn ipv4_header(src: [u8; 4]) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 20, 0, 0, 0x40, 0, 64, 6, 0, 0];
        h.extend_from_slice(&src);
        h.extend_from_slice(&[10, 0, 0, 1]);
        h
    }

    #[test]
    fn reports_interface_mac_and_source_of_each_packet() {
        let mac = [2, 0, 0, 0, 0, 0x64];
        let mut d = packet(7, &mac, &ipv4_header([10, 2, 0, 100]));
        d.extend(packet(
            8,
            &[2, 0, 0, 0, 0, 0x65],
            &ipv4_header([10, 2, 0, 101]),
        ));
        let got = parse(&d);
        assert_eq!(
            got,
            vec![
                Logged {
                    ifindex: 7,
                    mac: Some(mac),
                    src: "10.2.0.100".parse().unwrap(),
                    head: ipv4_header([10, 2, 0, 100]),
                },
                Logged {
                    ifindex: 8,
                    mac: Some([2, 0, 0, 0, 0, 0x65]),
                    src: "10.2.0.101".parse().unwrap(),
                    head: ipv4_header([10, 2, 0, 101]),
                }
            ]
        );
    }

    #[test]
    fn an_arp_sender_is_reported_with_its_hardware_address() {
        let sha = [2, 0, 0, 0, 0, 0x66];
        let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
        arp.extend_from_slice(&sha);
        arp.extend_from_slice(&[10, 2, 0, 102, 0, 0, 0, 0, 0, 0, 10, 2, 0, 1]);
        let mut d = packet(3, &sha, &arp);
        // Without NFULA_HWADDR the ARP sender's address stands in.
        let at = d.len() - align4(NLA_HDRLEN + 28) - align4(NLA_HDRLEN + 12);
        d.drain(at..at + align4(NLA_HDRLEN + 12));
        let len = d.len() as u32;
        d[..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(
            parse(&d),
            vec![Logged {
                ifindex: 3,
                mac: Some(sha),
                src: "10.2.0.102".parse().unwrap(),
                head: arp.clone(),
            }]
        );
        // ARP probes (sender 0.0.0.0) and non-Ethernet ARP are reported as such or not at all.
        let mut bad = arp.clone();
        bad[4] = 8;
        assert!(parse(&packet(3, &sha, &bad)).is_empty());
    }

    #[test]
    fn junk_and_truncation_yield_nothing() {
        let d = packet(7, &[2, 0, 0, 0, 0, 1], &ipv4_header([10, 2, 0, 100]));
        for cut in 0..d.len() {
            // Never panics; a cut message is dropped whole.
            assert!(parse(&d[..cut]).len() <= 1);
        }
        let mut v6 = vec![0x60; 40];
        let mh6: std::net::Ipv6Addr = "2001:db8:2::64".parse().unwrap();
        v6[8..24].copy_from_slice(&mh6.octets());
        let mut d6 = packet(7, &[2; 6], &v6);
        // packet() tags 40-byte payloads as IPv4: retag as IPv6.
        let at = NLMSG_HDRLEN + NFGENMSG_LEN + NLA_HDRLEN;
        d6[at..at + 2].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
        assert_eq!(parse(&d6)[0].src, IpAddr::V6(mh6));
        assert!(
            parse(&packet(7, &[2; 6], &[0x60; 40])).is_empty(),
            "an IPv6 header tagged IPv4"
        );
        assert!(parse(b"\xff\xff\xff\xff garbage").is_empty());
    }

    #[test]
    fn config_binds_the_group_without_batching() {
        let b = config_msg(4954, DETECT_COPY, 9);
        assert_eq!(u16_at(&b, 4), 0x0401);
        assert_eq!(
            &b[NLMSG_HDRLEN + 2..NLMSG_HDRLEN + 4],
            &4954u16.to_be_bytes()
        );
        // cmd, mode (range 64, copy packet), qthresh 1, timeout 0.
        let attrs = &b[NLMSG_HDRLEN + NFGENMSG_LEN..];
        assert_eq!(&attrs[..5], &[5, 0, 1, 0, 1]);
        assert_eq!(&attrs[8..18], &[10, 0, 2, 0, 0, 0, 0, 64, 2, 0]);
        assert_eq!(&attrs[20..28], &[8, 0, 5, 0, 0, 0, 0, 1]);
        assert_eq!(&attrs[28..36], &[8, 0, 4, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn payloads_are_the_copied_bytes_of_each_packet() {
        let mut d = packet(3, &[2, 0, 0, 0, 0, 1], &ipv4_header([10, 2, 0, 100]));
        d.extend(packet(
            4,
            &[2, 0, 0, 0, 0, 2],
            &ipv4_header([10, 2, 0, 101]),
        ));
        let p = payloads(&d);
        assert_eq!(p.len(), 2);
        assert_eq!(p[1], &ipv4_header([10, 2, 0, 101])[..]);
    }
}
