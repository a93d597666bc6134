//! Fuzz entry point, shared by the cargo-fuzz target `wire_views` (fuzz/) and the
//! stable smoke test (tests/fuzz_smoke.rs): every view over the input, every accessor
//! called, and what the constructors promise asserted.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::arp::ArpPacket;
use crate::ethernet::EthernetFrame;
use crate::{
    checksum, ipv4, ipv6, tcp_in_head, IpPacket, Ipv4Packet, Ipv6Packet, TcpSegment, UdpDatagram,
};

pub fn views(data: &[u8]) {
    ip(data);
    tcp(data);
    if let Ok(u) = UdpDatagram::new_checked(data) {
        assert!(u.payload().len() + 8 <= data.len());
    }
    if let Ok(a) = ArpPacket::new_checked(data) {
        let _ = (a.sender_hw_addr(), a.sender_addr(), a.operation());
    }
    if let Ok(e) = EthernetFrame::new_checked(data) {
        assert_eq!(e.payload().len() + 14, data.len());
        let _ = e.dst_addr();
    }
    emit(data);
    ip_headers(data);
    if let Ok((ip, seg)) = tcp_in_head(data) {
        assert!(ip.starts_payload());
        let _ = (seg.src_port(), seg.ack_number());
    }
    rewrite(data);
}

/// A whole packet is a head too, and its payload is all there.
fn ip(data: &[u8]) {
    let head = IpPacket::new_head(data);
    let Ok(whole) = IpPacket::new_checked(data) else {
        if let Ok(h) = head {
            assert!(h.payload().len() <= h.payload_len());
        }
        return;
    };
    assert!(head.is_ok());
    assert_eq!(whole.payload().len(), whole.payload_len());
    let _ = (
        whole.src_addr(),
        whole.dst_addr(),
        whole.protocol(),
        whole.is_fragment(),
    );
    if let Ok(v4) = Ipv4Packet::new_checked(data) {
        assert!(v4.header_len() >= 20 && v4.header_len() <= usize::from(v4.total_len()));
    }
    if let Ok(v6) = Ipv6Packet::new_checked(data) {
        assert!(40 + v6.payload_len() <= data.len());
    }
}

/// Options lie within the header, one after another, and end the walk once failed.
fn tcp(data: &[u8]) {
    let Ok(s) = TcpSegment::new_head(data) else {
        assert!(TcpSegment::new_checked(data).is_err());
        return;
    };
    assert!(s.header_len() >= 20);
    let _ = (
        s.src_port(),
        s.dst_port(),
        s.seq_number(),
        s.ack_number(),
        s.flags(),
    );
    let mut next = 0;
    let mut failed = false;
    for o in s.options() {
        assert!(!failed, "an option after an error");
        match o {
            Ok(o) => {
                assert_eq!(o.at.start, next);
                assert!(o.at.end <= s.header_len() - 20 && o.data.len() <= o.at.len());
                next = o.at.end;
            }
            Err(_) => failed = true,
        }
    }
    if TcpSegment::new_checked(data).is_ok() {
        assert!(s.header_len() <= data.len());
    }
}

/// What is written reads back, into a buffer of the input's length.
fn emit(data: &[u8]) {
    let mut buf = vec![0u8; data.len()];
    let mac = |i: usize| [data.get(i).copied().unwrap_or(0); 6];
    let ip = Ipv4Addr::new(10, 0, 0, data.len() as u8);
    let Ok(mut eth) = EthernetFrame::emit(&mut buf[..], mac(0), mac(1), 0x0806) else {
        assert!(data.len() < 14);
        return;
    };
    let op = u16::from(data.get(2).copied().unwrap_or(0));
    if ArpPacket::emit(eth.payload_mut(), op, (mac(3), ip), (mac(4), ip)).is_ok() {
        let arp = ArpPacket::new_checked(&buf[14..]).unwrap();
        assert_eq!((arp.operation(), arp.sender_hw_addr()), (op, mac(3)));
    } else {
        assert!(data.len() < 14 + 28);
    }
    assert_eq!(
        EthernetFrame::new_checked(&buf[..]).unwrap().dst_addr(),
        mac(0)
    );
}

/// IP headers written for a payload of the input's length read back as heads.
fn ip_headers(data: &[u8]) {
    let proto = data.first().copied().unwrap_or(0);
    let ip = Ipv4Addr::new(10, 0, 0, proto);
    if let Ok(h) = ipv4::header(ip, ip, proto, data.len(), proto & 1 == 1) {
        let v = Ipv4Packet::new_head(&h[..]).unwrap();
        assert_eq!((v.protocol(), v.payload_len()), (proto, data.len()));
        assert_eq!(checksum::internet(&h), 0);
    } else {
        assert!(data.len() > 65535 - 20);
    }
    if let Ok(h) = ipv6::header(ip.to_ipv6_mapped(), Ipv6Addr::LOCALHOST, proto, data.len()) {
        let v = Ipv6Packet::new_head(&h[..]).unwrap();
        assert_eq!((v.next_header(), v.payload_len()), (proto, data.len()));
    }
}

/// Filled in, checksums verify.
fn rewrite(data: &[u8]) {
    let mut copy = data.to_vec();
    let Ok(mut ip) = IpPacket::new_checked(&mut copy[..]) else {
        return;
    };
    ip.fill_checksum();
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    if let Ok(mut seg) = TcpSegment::new_checked(ip.payload_mut()) {
        seg.set_ack_number(seg.ack_number().wrapping_add(1));
        seg.options_mut().fill(1);
        seg.fill_checksum(src, dst);
        let payload = ip.payload();
        let acc = checksum::pseudo_header(src, dst, 6, payload.len() as u32);
        assert_eq!(checksum::fold(checksum::sum(acc, payload)), 0);
    }
    let v4_header = match &ip {
        IpPacket::V4(v4) => Some(v4.header_len()),
        IpPacket::V6(_) => None,
    };
    if let Some(n) = v4_header {
        assert_eq!(checksum::internet(&copy[..n]), 0);
    }
}
