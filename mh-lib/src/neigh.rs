//! The MH's neighbour entry for its gateway, set over rtnetlink (like `ip neigh replace
//! GW lladdr MAC dev IF nud permanent`, without running a process on the move's path).
//! [`neigh_msg`] is pure; [`replace_permanent`] sends it and reads the kernel's ack.

use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::net::if_::if_nametoindex;
use nix::sys::socket::{
    recv, send, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType,
};

const NLMSG_HDRLEN: usize = 16;

fn put_attr(b: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    b.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    b.extend_from_slice(&ty.to_ne_bytes());
    b.extend_from_slice(payload);
    b.resize((b.len() + 3) & !3, 0);
}

/// RTM_NEWNEIGH (create or replace, acked): `ip` at `mac` on interface `ifindex`,
/// permanent.
pub fn neigh_msg(seq: u32, ifindex: u32, ip: IpAddr, mac: [u8; 6]) -> Vec<u8> {
    let (family, addr) = match ip {
        IpAddr::V4(a) => (libc::AF_INET, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6, a.octets().to_vec()),
    };
    let flags = libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_REPLACE;
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&0u32.to_ne_bytes()); // length, below
    b.extend_from_slice(&libc::RTM_NEWNEIGH.to_ne_bytes());
    b.extend_from_slice(&(flags as u16).to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    // struct ndmsg: family, 3 pad, ifindex, state, flags, type.
    b.push(family as u8);
    b.extend_from_slice(&[0; 3]);
    b.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    b.extend_from_slice(&libc::NUD_PERMANENT.to_ne_bytes());
    b.extend_from_slice(&[0, 0]);
    put_attr(&mut b, libc::NDA_DST, &addr);
    put_attr(&mut b, libc::NDA_LLADDR, &mac);
    let len = b.len() as u32;
    b[..4].copy_from_slice(&len.to_ne_bytes());
    b
}

/// Points `ip` at `mac` on interface `ifname`, permanently.
pub fn replace_permanent(ip: IpAddr, mac: [u8; 6], ifname: &str) -> io::Result<()> {
    let what = || {
        format!(
            "neighbour {ip} lladdr {} dev {ifname}",
            itcp_proto::hex::mac(&mac)
        )
    };
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", what()));
    let ifindex = if_nametoindex(ifname).map_err(|e| named(e.into()))?;
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    let req = neigh_msg(1, ifindex, ip, mac);
    // An unconnected netlink socket sends to the kernel.
    send(sock.as_raw_fd(), &req, MsgFlags::empty()).map_err(|e| named(e.into()))?;
    let mut buf = [0u8; 1024];
    loop {
        let n = match recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(named(e.into())),
        };
        if let Some(errno) = ack_errno(&buf[..n]) {
            if errno == 0 {
                return Ok(());
            }
            return Err(named(io::Error::from_raw_os_error(errno)));
        }
    }
}

/// The errno of the NLMSG_ERROR in `dgram` (0: success), if there is one.
fn ack_errno(dgram: &[u8]) -> Option<i32> {
    let mut off = 0;
    while off + NLMSG_HDRLEN + 4 <= dgram.len() {
        let len = u32::from_ne_bytes(dgram[off..off + 4].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes(dgram[off + 4..off + 6].try_into().ok()?);
        if len < NLMSG_HDRLEN || off + len > dgram.len() {
            return None;
        }
        if ty == libc::NLMSG_ERROR as u16 {
            let e = i32::from_ne_bytes(dgram[off + 16..off + 20].try_into().ok()?);
            return Some(-e);
        }
        off += (len + 3) & !3;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_layout() {
        let m = neigh_msg(7, 3, "10.2.0.1".parse().unwrap(), [0, 0, 0x5e, 0, 1, 1]);
        assert_eq!(
            u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), libc::RTM_NEWNEIGH);
        // ndmsg: AF_INET, ifindex 3, NUD_PERMANENT.
        assert_eq!(m[16], libc::AF_INET as u8);
        assert_eq!(&m[20..24], &3i32.to_ne_bytes());
        assert_eq!(&m[24..26], &libc::NUD_PERMANENT.to_ne_bytes());
        // NDA_DST 10.2.0.1, NDA_LLADDR (6 bytes, padded).
        assert_eq!(&m[28..36], &[8, 0, 1, 0, 10, 2, 0, 1]);
        assert_eq!(&m[36..46], &[10, 0, 2, 0, 0, 0, 0x5e, 0, 1, 1]);
        assert_eq!(m.len(), 48);
        let v6 = neigh_msg(7, 3, "2001:db8:2::1".parse().unwrap(), [2; 6]);
        assert_eq!(v6[16], libc::AF_INET6 as u8);
    }

    #[test]
    fn acks_are_read() {
        let mut d = vec![0u8; 36];
        d[..4].copy_from_slice(&36u32.to_ne_bytes());
        d[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        d[16..20].copy_from_slice(&(-libc::ENODEV).to_ne_bytes());
        assert_eq!(ack_errno(&d), Some(libc::ENODEV));
        d[16..20].copy_from_slice(&0i32.to_ne_bytes());
        assert_eq!(ack_errno(&d), Some(0));
        assert_eq!(ack_errno(&d[..10]), None);
    }
}
