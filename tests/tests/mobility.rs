//! End-to-end pieces of mobility on the lab: msrd's beacons reach the MH only while it
//! is in that MSR's cell, and mh-lib's detector turns them into moves. Needs root.

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use itcp_mh::mobility::{Beacon, Decision, Detector, Policy};
use itcp_testbed::lab::{Host, Lab, LabConfig};
use itcp_testbed::sys::{in_netns, mono_ns};

fn lab_with_two_msrds() -> Lab {
    let mut lab = Lab::new(LabConfig::default()).unwrap();
    for k in 1..=2 {
        let cfg = lab.msrd_config(k, "[beacon]\ninterval_ms = 200\nlifetime_ms = 600\n");
        lab.start_msrd(k, &cfg).unwrap();
    }
    lab
}

/// Beacons the MH hears during `d`.
fn hear(sock: &UdpSocket, d: Duration) -> Vec<Beacon> {
    let end = Instant::now() + d;
    let mut out = Vec::new();
    let mut buf = [0u8; 1500];
    while Instant::now() < end {
        if let Ok(n) = sock.recv(&mut buf) {
            out.push(serde_json::from_slice(&buf[..n]).expect("a beacon"));
        }
    }
    out
}

fn names(b: &[Beacon]) -> BTreeSet<String> {
    b.iter().map(|b| b.msr.clone()).collect()
}

#[test]
fn beacons_reach_the_mh_only_in_that_msrs_cell() {
    let lab = lab_with_two_msrds();
    let sock = in_netns(&lab.ns(Host::Mh), || {
        UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 4345)))
    })
    .unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let settle = |s: &UdpSocket| {
        hear(s, Duration::from_millis(250));
    };
    for (cells, expect) in [
        (vec![1], vec!["msr1"]),
        (vec![2], vec!["msr2"]),
        (vec![], vec![]),
        (vec![1, 2], vec!["msr1", "msr2"]),
    ] {
        lab.assoc(&cells).unwrap();
        settle(&sock);
        let heard = hear(&sock, Duration::from_secs(1));
        let expect: BTreeSet<String> = expect.into_iter().map(String::from).collect();
        assert_eq!(
            names(&heard),
            expect,
            "in cells {cells:?}; msrd1 log:\n{}",
            std::fs::read_to_string(lab.dir.join("msrd1.log")).unwrap_or_default()
        );
        if !heard.is_empty() {
            // About one per 200 ms per MSR, with the MSR's real cell MAC.
            assert!(heard.len() >= 4 * expect.len(), "{} beacons", heard.len());
            for b in &heard {
                let k: usize = b.msr[3..].parse().unwrap();
                assert_eq!(b.mac, itcp_testbed::lab::addr::msr_cell_mac(k));
                assert_eq!(b.lifetime_ms, 600);
            }
        }
    }
}

#[test]
fn the_detector_follows_the_mh_across_cells() {
    let lab = lab_with_two_msrds();
    let sock = in_netns(&lab.ns(Host::Mh), || {
        UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 4345)))
    })
    .unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut det = Detector::new(
        Policy::Eager,
        Duration::from_millis(200),
        Duration::from_millis(400),
    );
    let mut moves = Vec::new();
    let mut run = |det: &mut Detector, d: Duration| {
        let end = Instant::now() + d;
        let mut buf = [0u8; 1500];
        while Instant::now() < end {
            if let Ok(n) = sock.recv(&mut buf) {
                let b: Beacon = serde_json::from_slice(&buf[..n]).unwrap();
                if let Some(Decision::Move { to, .. }) = det.on_beacon(mono_ns(), &b) {
                    moves.push(to);
                }
            }
            if let Some(Decision::Move { to, .. }) = det.on_tick(mono_ns()) {
                moves.push(to);
            }
        }
    };
    lab.assoc(&[1]).unwrap();
    run(&mut det, Duration::from_millis(800));
    lab.assoc(&[1, 2]).unwrap(); // overlap: eager moves to the newcomer
    run(&mut det, Duration::from_millis(800));
    lab.assoc(&[2]).unwrap();
    run(&mut det, Duration::from_millis(800));
    lab.assoc(&[1]).unwrap(); // non-overlapped switch back
    run(&mut det, Duration::from_millis(800));
    assert_eq!(
        moves,
        vec!["msr1", "msr2", "msr1"],
        "no ping-pong, every move seen"
    );
}
