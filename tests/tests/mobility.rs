//! End-to-end pieces of mobility on the lab: msrd's beacons reach the MH only while it
//! is in that MSR's cell, and mh-lib's detector turns them into moves. Needs root.

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use itcp_mh::mobility::{Beacon, Decision, Detector, Policy};
use itcp_testbed::firstbyte::{self, FirstBytes};
use itcp_testbed::lab::{Host, Lab, LabConfig};
use itcp_testbed::scenario::{Detection, Net};
use itcp_testbed::sys::{in_netns, mono_ns};

/// One test at a time: one of them measures move times, which another lab running
/// alongside on 2 cores would distort (cargo runs a file's tests in parallel).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

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
    let _serial = serial();
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
    let _serial = serial();
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

/// The agent's moves to the first byte on the LAN profile: 10 non-overlapped moves
/// (0.3–0.5 s gaps) during an FH download, seed 21 ([`firstbyte::run`]: every byte
/// verified; here also zero RSTs at the FH and the MH).
fn moves_to_first_byte(d: Detection) -> FirstBytes {
    let r = firstbyte::run(&Net::lan(), d, 10, 21, true).unwrap();
    assert_eq!(r.rsts, ((0, 0), (0, 0)), "RSTs at FH and MH");
    r
}

#[test]
fn solicitation_on_link_up_brings_the_first_byte_within_50_ms_of_association() {
    let _serial = serial();
    let r = moves_to_first_byte(Detection::Solicit);
    eprintln!(
        "solicitation, 10 non-overlapped moves on the LAN profile: association → first byte \
         median {:.1} ms, p95 {:.1} ms (each: {:.1?})",
        r.median_ms, r.p95_ms, r.ms
    );
    assert!(
        r.median_ms < 50.0,
        "median {:.1} ms: {:.1?}",
        r.median_ms,
        r.ms
    );
}

/// The same moves with the agent waiting for the MSRs' beacons (every 1 s): the first
/// byte comes up to a beacon interval later. Shows what solicitation saves; slow, so
/// run on demand (`-- --ignored`).
#[test]
#[ignore]
fn without_solicitation_the_first_byte_waits_for_a_beacon() {
    let _serial = serial();
    let r = moves_to_first_byte(Detection::Beacon);
    eprintln!(
        "beacons only (1 s), 10 non-overlapped moves on the LAN profile: association → first \
         byte median {:.1} ms, p95 {:.1} ms (each: {:.1?})",
        r.median_ms, r.p95_ms, r.ms
    );
    assert!(
        r.median_ms > 100.0,
        "median {:.1} ms: {:.1?}",
        r.median_ms,
        r.ms
    );
}
