//! End-to-end pieces of mobility on the lab: msrd's beacons reach the MH only while it
//! is in that MSR's cell, and mh-lib's detector turns them into moves. Needs root.

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use itcp_mh::mobility::{Beacon, Decision, Detector, Policy};
use itcp_testbed::lab::{Host, Lab, LabConfig};
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

/// msrd's socket buffers for [`moves_to_first_byte`]: 64 KB each way, as in the handoff
/// benchmark. A handoff ships every byte queued at the old MSR; with autotuned buffers
/// a bulk download at 10 Mbit/s into a 2 Mbit/s cell piles up ~10 MB there, and
/// moving that (60-90 ms) would hide the detection this test is about.
const MSRD_64K: &str = "[wireless]\nsend_buffer = 65536\nrecv_buffer = 65536\n\
[fixed]\nsend_buffer = 65536\nrecv_buffer = 65536\n";

/// What [`moves_to_first_byte`] measured.
struct FirstBytes {
    /// Per move: association with the new cell → first byte read at the MH, ms.
    ms: Vec<f64>,
    median_ms: f64,
    p95_ms: f64,
}

/// An FH download through I-TCP to a reader in this process (in the MH's namespace,
/// verifying every byte and timestamping every read) across `moves` non-overlapped
/// moves between two cells (leave, 0.3–0.5 s without a cell, join the other), on the
/// paper's LAN profile, with msrd's default beacons (1 s) and the agent run with
/// `agent_args`. The FH sends with a 16 KB socket buffer (the paper's era), msrd with
/// [`MSRD_64K`]. Measures, per move, the time from the association with the new cell
/// (the emulator's history) to the first byte the MH reads after it, and prints where
/// that time went (the new MSR's handoff record).
fn moves_to_first_byte(seed: u64, n_moves: usize, agent_args: &[&str]) -> FirstBytes {
    use itcp_testbed::lab::{self, bin_path};
    use itcp_testbed::moves;
    use itcp_testbed::scenario::Net;
    use itcp_testbed::ttcp::SendReport;

    let net = Net::lan();
    let mut lab = Lab::new(LabConfig::links(2, seed, net.wan, net.cell)).unwrap();
    let mut args = vec!["--hysteresis-ms", "0"];
    args.extend_from_slice(agent_args);
    lab.start_itcp_mobility(MSRD_64K, &args).unwrap();
    lab.watch_rsts(Host::Fh).unwrap();
    lab.watch_rsts(Host::Mh).unwrap();
    let diag = |lab: &Lab| {
        let mut s = String::new();
        for f in [
            "agent.events",
            "agent.log",
            "msrd1.log",
            "msrd2.log",
            "airlink.log",
        ] {
            let t = std::fs::read_to_string(lab.dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = t.lines().rev().take(30).collect();
            s += &format!(
                "--- {f}\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        s
    };

    // Long enough for every move: 1.2 s in each cell, ≤ 0.5 s gaps, the moves' own time
    // (up to a beacon interval more without solicitation).
    let secs = 2 + n_moves as u64 * 3;
    let fh = lab::fh_addr(5001);
    let sender = lab
        .spawn(
            Host::Fh,
            bin_path("ttcp"),
            &[
                "send",
                "--listen",
                &fh,
                "--duration",
                &secs.to_string(),
                "--seed",
                &seed.to_string(),
                "--buf",
                "16384",
            ],
        )
        .unwrap();
    lab.wait_listening(Host::Fh, 5001).unwrap();
    let (mh_ns, token) = (lab.ns(Host::Mh), lab.mh_token_file(1));
    let reader = std::thread::spawn(move || -> Result<(u64, Vec<u64>), String> {
        let opts = itcp_mh::MhOptions::new()
            .gateway(SocketAddr::from((lab::addr::CELL_GW, 1080)))
            .token_file(token);
        let s = in_netns(&mh_ns, || {
            itcp_mh::ItcpStream::connect_with(&opts, fh.as_str())
        })
        .map_err(|e| format!("connect: {e}"))?;
        moves::read_timestamped(s, seed)
    });

    std::thread::sleep(Duration::from_millis(1000));
    let mut at = 1;
    for i in 0..n_moves {
        let to = 3 - at;
        let gap = Duration::from_millis(300 + 50 * (i as u64 % 5));
        lab.assoc(&[]).unwrap();
        std::thread::sleep(gap);
        lab.assoc(&[to]).unwrap();
        // The move completes (the agent reports it), then the MH stays a while: long
        // enough that the other MSR counts as newly heard at the next move.
        let deadline = Instant::now() + Duration::from_secs(10);
        while lab
            .agent_events()
            .iter()
            .filter(|e| e["event"] == "moved")
            .count()
            <= i
        {
            assert!(
                Instant::now() < deadline,
                "move {} not seen\n{}",
                i + 1,
                diag(&lab)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(1200));
        at = to;
    }
    let (total, reads) = reader
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("reader: {e}\n{}", diag(&lab)));
    let (_, out, err) = lab.wait(sender, Duration::from_secs(30)).unwrap();
    let send: SendReport =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("sender: {e}: {err}"));
    assert!(send.ok, "sender: {:?}\n{}", send.error, diag(&lab));
    // The FH's link has no loss: its retransmission timeouts come from the handoffs
    // (its segments are dropped while the connection is frozen).
    if let Some(ti) = &send.tcp_info {
        eprintln!(
            "FH: {} retransmission timeouts in {n_moves} moves, {} ms in them ({} bytes retransmitted)",
            ti.total_rto, ti.total_rto_time_ms, ti.bytes_retrans
        );
    }
    assert_eq!(total, send.bytes, "every byte sent was read, verified");
    let rsts = (lab.rsts(Host::Fh).unwrap(), lab.rsts(Host::Mh).unwrap());
    assert_eq!(rsts, ((0, 0), (0, 0)), "RSTs at FH and MH\n{}", diag(&lab));

    // Joins: an association with a cell right after a blackout.
    let joins = moves::joins(&lab.emu_status().unwrap().events);
    assert_eq!(joins.len(), n_moves, "one join per move");
    let ms: Vec<f64> = moves::to_first_byte(&joins, &reads)
        .into_iter()
        .map(|m| m.expect("bytes after every move"))
        .collect();
    moves::print_phases(&lab, &joins, &ms);
    let (median_ms, p95_ms) = moves::median_p95(&ms);
    FirstBytes {
        ms,
        median_ms,
        p95_ms,
    }
}

#[test]
fn solicitation_on_link_up_brings_the_first_byte_within_50_ms_of_association() {
    let _serial = serial();
    let r = moves_to_first_byte(21, 10, &[]);
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
    let r = moves_to_first_byte(21, 10, &["--no-solicit"]);
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
