//! Lists the TCP handshakes half-open at this MSR (request sockets in SYN_RECV), over
//! NETLINK_SOCK_DIAG: the kernel keeps them out of reach of accept and TCP_REPAIR, so
//! a handoff waits for its MH's to complete, or completes them
//! (`crate::handshakes`), before it freezes the MH (see `Action::CompleteHandshakes`).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{recv, send, MsgFlags};

use crate::netlink::NLMSG_HDRLEN;

/// linux/sock_diag.h, linux/inet_diag.h, net/tcp_states.h (not in libc).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const TCP_SYN_RECV: u8 = 3;
const TCP_NEW_SYN_RECV: u8 = 12;
/// struct inet_diag_req_v2: family, protocol, ext, pad, states, sockid (48 bytes).
const REQ_LEN: usize = 8 + SOCKID_LEN;
const SOCKID_LEN: usize = 48;
/// struct inet_diag_msg: family, state, timer, retrans, sockid, then five u32.
const MSG_LEN: usize = 4 + SOCKID_LEN + 20;

/// The dump request for TCP sockets of `family` in SYN_RECV (request sockets included).
fn request(family: u8, seq: u32) -> Vec<u8> {
    let len = NLMSG_HDRLEN + REQ_LEN;
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    b.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    let states: u32 = (1 << TCP_SYN_RECV) | (1 << TCP_NEW_SYN_RECV);
    b.extend_from_slice(&states.to_ne_bytes());
    b.resize(len, 0);
    b
}

/// One half-open handshake: our end (the listener's address as the MH reached it) and
/// the MH's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HalfOpen {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// An address of a sockid (IPv4-mapped as IPv4).
fn ip_of(family: u8, b: &[u8]) -> Option<IpAddr> {
    match family as i32 {
        libc::AF_INET => Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
        libc::AF_INET6 => {
            let a = Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).ok()?);
            Some(a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4))
        }
        _ => None,
    }
}

/// What one datagram of the dump says: the sockets in SYN_RECV, and whether the dump
/// is over.
fn parse(dgram: &[u8], out: &mut Vec<HalfOpen>) -> io::Result<bool> {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= dgram.len() {
        let h = &dgram[off..];
        let len = u32::from_ne_bytes(h[0..4].try_into().unwrap()) as usize;
        let ty = u16::from_ne_bytes(h[4..6].try_into().unwrap());
        if len < NLMSG_HDRLEN || off + len > dgram.len() {
            return Err(io::Error::other("sock_diag: truncated message"));
        }
        match ty as i32 {
            libc::NLMSG_DONE => return Ok(true),
            libc::NLMSG_ERROR => {
                let e = h
                    .get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)
                    .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap()));
                return Err(io::Error::from_raw_os_error(-e));
            }
            _ if len >= NLMSG_HDRLEN + MSG_LEN => {
                let m = &h[NLMSG_HDRLEN..len];
                let (family, state) = (m[0], m[1]);
                // sockid: sport, dport (2 each, big-endian), src[16], dst[16], if, cookie.
                let sport = u16::from_be_bytes([m[4], m[5]]);
                let dport = u16::from_be_bytes([m[6], m[7]]);
                let ends = ip_of(family, &m[8..24]).zip(ip_of(family, &m[24..40]));
                if let (Some((src, dst)), TCP_SYN_RECV | TCP_NEW_SYN_RECV) = (ends, state) {
                    out.push(HalfOpen {
                        local: SocketAddr::new(src, sport),
                        remote: SocketAddr::new(dst, dport),
                    });
                }
            }
            _ => {}
        }
        off += len.next_multiple_of(4);
    }
    Ok(false)
}

/// This namespace's TCP sockets of one family in SYN_RECV. One dump walks the
/// kernel's whole established hash, whose size follows the machine's memory (7–10 ms
/// for both families on a 24 GiB machine): ask only for the family wanted.
pub fn syn_recv(ipv6: bool) -> io::Result<Vec<HalfOpen>> {
    let s = crate::netlink::nl_socket(libc::NETLINK_SOCK_DIAG)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    let family = if ipv6 { libc::AF_INET6 } else { libc::AF_INET } as u8;
    // The kernel is the default peer of a netlink socket.
    send(s.as_raw_fd(), &request(family, 1), MsgFlags::empty())?;
    loop {
        let n = recv(s.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        if parse(&buf[..n], &mut out)? {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(family: u8, state: u8, dst: &[u8]) -> Vec<u8> {
        let len = NLMSG_HDRLEN + MSG_LEN;
        let mut b = vec![0u8; len];
        b[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        b[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        b[NLMSG_HDRLEN] = family;
        b[NLMSG_HDRLEN + 1] = state;
        // sport 1080, dport 40000; src 10.0.0.1 (or its mapped form).
        b[NLMSG_HDRLEN + 4..NLMSG_HDRLEN + 8].copy_from_slice(&[4, 56, 0x9c, 0x40]);
        let src: &[u8] = if dst.len() == 4 {
            &[10, 0, 0, 1]
        } else {
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]
        };
        b[NLMSG_HDRLEN + 8..NLMSG_HDRLEN + 8 + src.len()].copy_from_slice(src);
        b[NLMSG_HDRLEN + 24..NLMSG_HDRLEN + 24 + dst.len()].copy_from_slice(dst);
        b
    }

    fn done() -> Vec<u8> {
        let mut b = vec![0u8; NLMSG_HDRLEN + 4];
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        b
    }

    #[test]
    fn peers_of_half_open_handshakes_are_read_from_a_dump() {
        let mut mapped = [0u8; 16];
        mapped[10..12].copy_from_slice(&[0xff, 0xff]);
        mapped[12..].copy_from_slice(&[10, 2, 0, 100]);
        let v6: Ipv6Addr = "fd00:2::64".parse().unwrap();
        let mut d = msg(libc::AF_INET as u8, TCP_SYN_RECV, &[10, 2, 0, 100]);
        d.extend(msg(libc::AF_INET6 as u8, TCP_SYN_RECV, &mapped));
        d.extend(msg(libc::AF_INET6 as u8, TCP_NEW_SYN_RECV, &v6.octets()));
        d.extend(msg(libc::AF_INET as u8, 1, &[10, 2, 0, 101])); // established: not counted
        let mut out = Vec::new();
        assert!(!parse(&d, &mut out).unwrap(), "no NLMSG_DONE yet");
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let remotes: Vec<IpAddr> = out.iter().map(|h| h.remote.ip()).collect();
        assert_eq!(remotes, vec![mh, mh, IpAddr::V6(v6)]);
        let ours: SocketAddr = "10.0.0.1:1080".parse().unwrap();
        assert_eq!(out[1].local, ours, "IPv4-mapped read as IPv4");
        assert_eq!(out[0].remote.port(), 40000);
        assert!(parse(&done(), &mut out).unwrap());
        let mut cut = msg(libc::AF_INET as u8, TCP_SYN_RECV, &[10, 2, 0, 100]);
        cut.truncate(40);
        assert!(parse(&cut, &mut out).is_err());
    }

    #[test]
    fn the_request_asks_for_tcp_in_syn_recv() {
        let r = request(libc::AF_INET as u8, 7);
        assert_eq!(r.len(), NLMSG_HDRLEN + REQ_LEN);
        assert_eq!(
            u32::from_ne_bytes(r[0..4].try_into().unwrap()) as usize,
            r.len()
        );
        assert_eq!(r[NLMSG_HDRLEN + 1], libc::IPPROTO_TCP as u8);
        let states = u32::from_ne_bytes(r[NLMSG_HDRLEN + 4..NLMSG_HDRLEN + 8].try_into().unwrap());
        assert_eq!(states, (1 << 3) | (1 << 12));
    }
}
