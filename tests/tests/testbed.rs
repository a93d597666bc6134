//! End-to-end tests of the testbed on real kernels: namespaces, TAP devices, the airlink
//! emulator process and ttcp processes. They need root (CI runs them as root).
//!
//! Every test takes a process-wide lock: timed transfers must not share the 2 cores with
//! another lab, and a lab being built sweeps dead labs, which the cleanup tests inspect.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use itcp_testbed::baseline::MobileIpOpts;
use itcp_testbed::emu::{Crossing, Dir, LinkParams, Loss, Request, Schedule};
use itcp_testbed::lab::{self, addr, bin_path, Host, Lab, LabConfig};
use itcp_testbed::scenario::{self, Cells, Mode, Net, Run, Traffic};
use itcp_testbed::sys;
use itcp_testbed::ttcp::{RecvReport, RrReport};
use serde_json::json;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn mbit(rate: u64) -> LinkParams {
    lab::link(rate, 0.0, 0.0)
}

/// FH sends `bytes` to the MH (MH listens); returns the receiver's report.
fn transfer(lab: &mut Lab, bytes: u64, extra: &[&str]) -> RecvReport {
    let ttcp = bin_path("ttcp");
    let n = bytes.to_string();
    let mut ra = vec!["recv", "--listen", "10.2.0.100:5001", "--bytes", &n];
    ra.extend_from_slice(extra);
    let mut sa = vec!["send", "--connect", "10.2.0.100:5001", "--bytes", &n];
    sa.extend_from_slice(extra);
    let r = lab.spawn(Host::Mh, &ttcp, &ra).unwrap();
    let s = lab.spawn(Host::Fh, &ttcp, &sa).unwrap();
    let (_, out, err) = lab.wait(r, Duration::from_secs(120)).unwrap();
    let _ = lab.wait(s, Duration::from_secs(10));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("no report ({e}): {err}"))
}

#[test]
fn rate_2mbit_gives_ideal_goodput() {
    let _g = serial();
    let mut lab = Lab::new(LabConfig {
        cell_down: mbit(2_000_000),
        ..LabConfig::default()
    })
    .unwrap();
    let r = transfer(&mut lab, 2_500_000, &[]);
    assert!(r.ok, "{:?}", r.error);
    let mbps = r.goodput_bps / 1e6;
    // 1448 payload bytes per 1500-byte packet at 2 Mbit/s = 1.9307 Mbit/s.
    assert!(
        (mbps - 1.93).abs() <= 0.03 * 1.93,
        "goodput {mbps:.4} Mbit/s is not within 3 % of 1.93"
    );
    eprintln!("2 Mbit/s link: goodput {mbps:.4} Mbit/s");
}

#[test]
fn delay_100ms_gives_200ms_rtt() {
    let _g = serial();
    let mut lab = Lab::new(LabConfig {
        wan_down: lab::link(0, 100.0, 0.0),
        wan_up: lab::link(0, 100.0, 0.0),
        ..LabConfig::default()
    })
    .unwrap();
    let ttcp = bin_path("ttcp");
    lab.spawn(Host::Fh, &ttcp, &["echo", "--listen", "10.0.0.1:7"])
        .unwrap();
    let rr = lab
        .spawn(
            Host::Mh,
            &ttcp,
            &[
                "rr",
                "--connect",
                "10.0.0.1:7",
                "--count",
                "20",
                "--size",
                "64",
            ],
        )
        .unwrap();
    let (ok, out, err) = lab.wait(rr, Duration::from_secs(60)).unwrap();
    assert!(ok, "{err}");
    let r: RrReport = serde_json::from_str(out.trim()).unwrap();
    let p50_ms = r.p50_us / 1000.0;
    assert!(
        (p50_ms - 200.0).abs() <= 2.0,
        "RTT p50 {p50_ms:.3} ms is not within ±2 ms of 200 ms"
    );
    eprintln!(
        "100 ms one-way: RTT p50 {p50_ms:.3} ms, max {:.3} ms",
        r.max_us / 1000.0
    );
}

/// Sends `n` UDP datagrams FH → MH, paced so no queue anywhere overflows, and returns
/// the counters of cell 1's downlink.
fn udp_through_lossy_cell(seed: u64, n: usize) -> (u64, u64, u64) {
    let lab = Lab::new(LabConfig {
        seed,
        cell_down: LinkParams {
            loss: Loss::Bernoulli { p: 0.01 },
            ..Default::default()
        },
        ..LabConfig::default()
    })
    .unwrap();
    let rx = sys::in_netns(&lab.ns(Host::Mh), || {
        UdpSocket::bind(SocketAddr::from((addr::MH, 9000)))
    })
    .unwrap();
    let tx = sys::in_netns(&lab.ns(Host::Fh), || {
        UdpSocket::bind(SocketAddr::from((addr::FH, 0)))
    })
    .unwrap();
    // Resolve neighbours first so ARP frames do not interleave with the datagrams.
    tx.send_to(b"warm-up", (addr::MH, 9000)).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 2048];
    let _ = rx.recv(&mut buf);
    lab.emu(Request::ResetCounters).unwrap();
    let payload = [7u8; 200];
    for i in 0..n {
        tx.send_to(&payload, (addr::MH, 9000)).unwrap();
        if i % 50 == 49 {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let c = lab.counters().unwrap();
    let d = &c.links["cell1"].down;
    (d.pkts_in, d.drop_loss, d.drop_queue)
}

#[test]
fn configured_loss_is_measured_and_seeded() {
    let _g = serial();
    let n = 20_000;
    let (pkts, lost, qdrop) = udp_through_lossy_cell(42, n);
    assert_eq!(pkts, n as u64, "every datagram must reach the emulator");
    assert_eq!(qdrop, 0);
    let rate = lost as f64 / pkts as f64;
    assert!(
        (rate - 0.01).abs() <= 0.003,
        "measured loss {:.4} % is not within 1 % ± 0.3 %",
        rate * 100.0
    );
    let again = udp_through_lossy_cell(42, n);
    assert_eq!(
        (pkts, lost, qdrop),
        again,
        "the same seed must give identical drop counters"
    );
    eprintln!(
        "1 % loss: measured {:.3} % over {pkts} packets, twice identical",
        rate * 100.0
    );
}

fn cell_lab(seed: u64) -> LabConfig {
    LabConfig {
        seed,
        cell_down: mbit(2_000_000),
        cell_up: mbit(2_000_000),
        ..LabConfig::default()
    }
}

#[test]
fn blackout_shows_as_a_stall_of_at_least_the_gap() {
    let _g = serial();
    let gap = 1.5;
    let mut lab = Lab::new(cell_lab(3)).unwrap();
    // MH leaves cell 1 at 2 s, enters cell 2 at 3.5 s; routes follow at the gap's end.
    lab.emu(Request::Schedule {
        schedule: Schedule {
            cells: vec![1, 2],
            period_s: 2.0,
            crossing: Crossing::Gap { gap_s: gap },
            max_switches: Some(1),
        },
        start_in_s: 0.0,
    })
    .unwrap();
    let start = Instant::now();
    let ns = (lab.ns(Host::Gw), lab.ns(Host::Mh));
    let mover = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs_f64(2.0 + gap) - start.elapsed());
        lab::reroute(&ns.0, &ns.1, 2).unwrap();
    });
    let r = transfer(&mut lab, 1_500_000, &[]);
    mover.join().unwrap();
    assert!(r.ok, "{:?}", r.error);
    assert!(
        r.longest_stall_s >= gap,
        "longest stall {:.3} s is shorter than the {gap} s blackout",
        r.longest_stall_s
    );
    // The stall is the blackout's: it starts near the 2 s mark.
    assert!(
        (r.longest_stall_at_s - 2.0).abs() < 0.5,
        "{}",
        r.longest_stall_at_s
    );
}

/// The MH's air0 has carrier exactly while the MH is in a cell, and the MH's kernel
/// says so on rtnetlink at once when the MH joins a cell (what the agent's link-up
/// solicitation relies on; a carrier loss may be announced up to 1 s late, the kernel's
/// link-watch rate limit). A move straight from one cell into another is a new
/// association: announced as a carrier-up (the kernel may merge the instant of no
/// carrier into it; the grown carrier-up count tells).
#[test]
fn the_mhs_carrier_follows_its_association_and_is_announced_at_once() {
    use itcp_mh::link::{LinkEvent, LinkWatch};
    let _g = serial();
    let lab = Lab::new(LabConfig::default()).unwrap();
    let mut w = sys::in_netns(&lab.ns(Host::Mh), || LinkWatch::open("air0")).unwrap();
    let flags = || {
        let out = lab
            .run(Host::Mh, "ip", &["-o", "link", "show", "air0"])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Reads every event until `want` comes, and returns how long after `t0` it came.
    // Before an Up, a Down may come first: a straight switch drops the carrier for an
    // instant, and the kernel announces that instant when its link-watch work runs
    // between the two changes (a real NIC's reassociation looks the same; the agent
    // treats Down then Up as an Up). Anything else before `want` fails.
    let until = |w: &mut LinkWatch, t0: u64, want: LinkEvent, what: &str| -> f64 {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            for e in w.read().unwrap() {
                if e == want {
                    return (sys::mono_ns() - t0) as f64 / 1e6;
                }
                assert!(
                    want == LinkEvent::Up && e == LinkEvent::Down,
                    "{what}: {e:?} while waiting for {want:?}"
                );
            }
            assert!(Instant::now() < deadline, "{what}: no {want:?} in 3 s");
            sys::poll_readable(
                &[std::os::fd::AsRawFd::as_raw_fd(&w.as_fd())],
                Some(10_000_000),
            )
            .unwrap();
        }
    };
    until(
        &mut w,
        sys::mono_ns(),
        LinkEvent::Up,
        "up at start (cell 1)",
    );
    assert!(flags().contains("LOWER_UP"), "{}", flags());
    let mut ups = Vec::new();
    // Each association change and the event it must bring (None: nothing to announce).
    for (cells, want) in [
        // Into an overlap and out of it: still associated, nothing to announce. (First:
        // the lab's own setup may hold the kernel's next non-urgent link-watch run,
        // which a loss is, for up to a second.)
        (vec![1, 2], None),
        (vec![1], None),
        (vec![], Some(LinkEvent::Down)),
        (vec![1], Some(LinkEvent::Up)),
        (vec![], Some(LinkEvent::Down)),
        (vec![1, 2], Some(LinkEvent::Up)),
        (vec![1], None),
        // Straight from one cell into the other: a new association each time.
        (vec![2], Some(LinkEvent::Up)),
        (vec![1], Some(LinkEvent::Up)),
        (vec![2], Some(LinkEvent::Up)),
    ] {
        // More than a second apart, so that the kernel's rate limit on losses (one
        // link-watch run per second, system-wide) does not merge a loss with a gain.
        std::thread::sleep(Duration::from_millis(1100));
        let t0 = sys::mono_ns();
        lab.assoc(&cells).unwrap();
        let Some(want) = want else {
            std::thread::sleep(Duration::from_millis(200));
            assert!(w.read().unwrap().is_empty(), "{cells:?}: no event");
            assert!(flags().contains("LOWER_UP"));
            continue;
        };
        let ms = until(&mut w, t0, want, &format!("{cells:?}"));
        if cells.is_empty() {
            assert!(flags().contains("NO-CARRIER"), "{}", flags());
        } else {
            assert!(flags().contains("LOWER_UP"), "{}", flags());
            ups.push(ms);
        }
    }
    eprintln!("association → carrier up announced: {ups:.2?} ms");
    assert!(ups.iter().all(|&ms| ms < 20.0), "{ups:?}");
}

#[test]
fn overlapped_handoff_shows_no_stall() {
    let _g = serial();
    let mut lab = Lab::new(cell_lab(4)).unwrap();
    // Both cells from 2.5 s to 4.5 s; traffic moves to cell 2 at 3.5 s.
    lab.emu(Request::Schedule {
        schedule: Schedule {
            cells: vec![1, 2],
            period_s: 2.5,
            crossing: Crossing::Overlap { overlap_s: 2.0 },
            max_switches: Some(1),
        },
        start_in_s: 0.0,
    })
    .unwrap();
    let start = Instant::now();
    let ns = (lab.ns(Host::Gw), lab.ns(Host::Mh));
    let mover = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs_f64(3.5) - start.elapsed());
        lab::reroute(&ns.0, &ns.1, 2).unwrap();
    });
    // A 16 KiB window (as in the paper) keeps the cell queue from overflowing, so any
    // stall would be the handoff's.
    let r = transfer(&mut lab, 1_500_000, &["--buf", "16K"]);
    mover.join().unwrap();
    assert!(r.ok, "{:?}", r.error);
    eprintln!(
        "overlapped handoff: longest stall {:.3} s",
        r.longest_stall_s
    );
    let c = lab.counters().unwrap();
    assert!(
        c.links["cell2"].down.pkts_out > 100,
        "the transfer must really have moved to cell 2"
    );
    assert!(
        r.longest_stall_s < 0.2,
        "overlapped cells must not stall the flow, got {:.3} s at {:.2} s",
        r.longest_stall_s,
        r.longest_stall_at_s
    );
}

#[test]
fn delivery_trace_sets_the_rate() {
    let _g = serial();
    let lab_cfg = LabConfig::default();
    let mut lab = Lab::new(lab_cfg).unwrap();
    // One 1500-byte opportunity every 6 ms = 2 Mbit/s.
    let trace = lab.dir.join("2mbit.trace");
    let lines: String = (1..=100).map(|i| format!("{}\n", i * 6)).collect();
    std::fs::write(&trace, lines).unwrap();
    lab.emu(Request::Link {
        link: "cell1".into(),
        dir: Dir::Down,
        params: LinkParams {
            trace_file: Some(trace),
            queue_bytes: 65536,
            ..Default::default()
        },
    })
    .unwrap();
    let r = transfer(&mut lab, 1_500_000, &[]);
    assert!(r.ok, "{:?}", r.error);
    let mbps = r.goodput_bps / 1e6;
    assert!((mbps - 1.93).abs() < 0.05 * 1.93, "trace goodput {mbps:.3}");
}

#[test]
fn control_socket_rejects_bad_requests_and_keeps_serving() {
    let _g = serial();
    let lab = Lab::new(LabConfig::default()).unwrap();
    // Raw lines, as any client could send them: typed errors come back.
    for (req, needle) in [
        (json!({"op": "assoc", "cells": [7]}), "cell 7"),
        (json!({"op": "teleport"}), "unknown variant"),
        (
            json!({"op": "link", "link": "cell9", "dir": "up", "params": {}}),
            "unknown link",
        ),
        (
            json!({"op": "link", "link": "wan", "dir": "up", "params": {"loss": {"model": "bernoulli", "p": 2.0}}}),
            "probability",
        ),
        (
            json!({"op": "link", "link": "wan", "dir": "up", "params": {"trace_file": "/nonexistent.trace"}}),
            "trace file /nonexistent.trace",
        ),
    ] {
        let r = lab.emu_line(&req.to_string()).unwrap();
        assert!(!r.ok, "{r:?}");
        let e = r.into_result().unwrap_err();
        assert!(e.contains(needle), "{e}");
    }
    // Not even JSON: answered with an error, and the next request still works.
    let out = Command::new(bin_path("itcp-lab"))
        .args(["ctl", "--control"])
        .arg(lab.control_path())
        .arg("{not json")
        .output()
        .unwrap();
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(reply.contains("not JSON"), "{reply}");
    lab.assoc(&[1, 2]).unwrap();
    let st = lab.emu_status().unwrap();
    assert_eq!(st.cells, vec![1, 2]);
}

#[test]
fn regular_tcp_baseline_reroutes_on_beacons() {
    let _g = serial();
    let mut net = Net::lan();
    net.cell.loss = Loss::None;
    let o = scenario::run(&Run {
        net,
        cells: Cells::NonOverlapped {
            period_s: 3.0,
            gap_s: 0.5,
        },
        mode: Mode::RegularTcp(MobileIpOpts::default()),
        traffic: Traffic {
            bytes: 1_500_000,
            buf: Some(16 * 1024),
            cc: Some("reno".into()),
            mh_opens: false,
        },
        seed: 5,
        msrs: 2,
        timeout: Duration::from_secs(120),
    })
    .unwrap();
    assert!(o.recv.ok, "{:?}", o.recv.error);
    assert!(!o.registrations.is_empty(), "no reroute happened");
    for g in &o.registrations {
        // Heard within one beacon interval (plus slack) of entering the cell.
        let entered = o
            .events
            .iter()
            .filter(|e| e.cells == vec![g.msr] && e.t_ns <= g.heard_ns)
            .map(|e| e.t_ns)
            .max()
            .expect("heard an MSR whose cell the MH never entered");
        let after = (g.heard_ns - entered) as f64 / 1e9;
        assert!(
            after <= 1.1,
            "MSR{} heard {after:.2} s after entering",
            g.msr
        );
    }
    assert!(o.coverage < 1.0 && o.coverage > 0.7, "{}", o.coverage);
}

/// With solicitation the baseline's MH hears the new MSR within milliseconds of
/// entering its cell, as the I-TCP agent does, instead of up to a beacon interval.
#[test]
fn regular_tcp_baseline_with_solicitation_hears_the_new_msr_at_once() {
    let _g = serial();
    let mut net = Net::lan();
    net.cell.loss = Loss::None;
    let o = scenario::run(&Run {
        net,
        cells: Cells::NonOverlapped {
            period_s: 2.0,
            gap_s: 0.4,
        },
        mode: Mode::RegularTcp(MobileIpOpts {
            solicit: true,
            ..MobileIpOpts::default()
        }),
        traffic: Traffic {
            bytes: 1_500_000,
            buf: Some(16 * 1024),
            cc: Some("reno".into()),
            mh_opens: false,
        },
        seed: 6,
        msrs: 2,
        timeout: Duration::from_secs(120),
    })
    .unwrap();
    assert!(o.recv.ok, "{:?}", o.recv.error);
    assert!(o.registrations.len() >= 2, "{:?}", o.registrations);
    let mut ms = Vec::new();
    for g in &o.registrations {
        let entered = o
            .events
            .iter()
            .filter(|e| e.cells == vec![g.msr] && e.t_ns <= g.heard_ns)
            .map(|e| e.t_ns)
            .max()
            .expect("heard an MSR whose cell the MH never entered");
        ms.push((g.heard_ns - entered) as f64 / 1e6);
    }
    eprintln!("entered the cell → heard its MSR: {ms:.1?} ms");
    // Solicitation up, advertisement down: two 2 ms hops and a little serialization.
    assert!(ms.iter().all(|&m| m < 30.0), "{ms:?}");
}

#[test]
fn bench_baseline_command_prints_a_table() {
    let _g = serial();
    let out = Command::new(bin_path("itcp-lab"))
        .args(["bench", "baseline", "--nets", "lan", "--scale", "0.03"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| LAN (ours) |"), "{stdout}");
    assert!(
        stdout.contains("| LAN (paper) | 65.49 | 62.59 | 38.66 | 23.73 |"),
        "{stdout}"
    );
}

// ---- cleanup: a child process (this test binary, re-run on one ignored test) builds a
// lab and then panics, waits for a signal, or is SIGKILLed. The parent checks that
// nothing the child made is left.

const CHILD_ENV: &str = "ITCP_CLEANUP_CHILD";

/// Builds a lab with a running process in it, records what it made, then does what
/// `ITCP_CLEANUP_CHILD` says. Only meaningful when run by the tests below.
#[test]
#[ignore = "helper: run by the cleanup tests in a child process"]
fn cleanup_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (action, file) = spec.split_once(':').unwrap();
    let mut lab = Lab::new(LabConfig::default()).unwrap();
    lab.spawn(
        Host::Mh,
        bin_path("ttcp"),
        &["echo", "--listen", "10.2.0.100:7"],
    )
    .unwrap();
    let pids: Vec<String> = lab.pids().iter().map(u32::to_string).collect();
    std::fs::write(file, format!("{} {}", lab.id, pids.join(" "))).unwrap();
    match action {
        "panic" => panic!("deliberate failure while a lab is up"),
        _ => std::thread::sleep(Duration::from_secs(60)),
    }
}

fn spawn_child(action: &str, file: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "cleanup_child", "--nocapture"])
        .env(CHILD_ENV, format!("{action}:{}", file.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_for_record(file: &Path) -> (String, Vec<i32>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = std::fs::read_to_string(file) {
            if !s.is_empty() {
                let mut it = s.split_whitespace();
                let id = it.next().unwrap().to_string();
                return (id, it.map(|p| p.parse().unwrap()).collect());
            }
        }
        assert!(Instant::now() < deadline, "child never built its lab");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_nothing_left(id: &str, pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ns_left = lab::list_lab_namespaces().contains_key(id);
        let procs_left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if !ns_left && procs_left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind by {id}: namespaces {ns_left}, processes {procs_left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!Path::new(&std::env::temp_dir().join(id)).exists());
    // TAP devices live in the lab's namespaces; none may have leaked into ours.
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    for dev in ["air0", "cell0", "wan0"] {
        assert!(
            !links.contains(&format!(": {dev}:")),
            "{dev} in the root namespace"
        );
    }
}

/// A process that exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.contains(") Z "),
        Err(_) => false,
    }
}

fn record_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("itcp-cleanup-{}-{name}", std::process::id()))
}

#[test]
fn panicking_test_leaves_nothing_behind() {
    let _g = serial();
    let file = record_file("panic");
    let status = spawn_child("panic", &file).wait().unwrap();
    assert!(!status.success(), "the child was meant to fail");
    let (id, pids) = wait_for_record(&file);
    assert_nothing_left(&id, &pids);
    let _ = std::fs::remove_file(file);
}

#[test]
fn interrupted_run_leaves_nothing_behind() {
    let _g = serial();
    let file = record_file("sigint");
    let mut child = spawn_child("wait", &file);
    let (id, pids) = wait_for_record(&file);
    assert!(lab::list_lab_namespaces().contains_key(&id));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert_nothing_left(&id, &pids);
    let _ = std::fs::remove_file(file);
}

#[test]
fn killed_run_is_swept_by_the_next_lab() {
    let _g = serial();
    let file = record_file("sigkill");
    let mut child = spawn_child("wait", &file);
    let (id, pids) = wait_for_record(&file);
    child.kill().unwrap();
    child.wait().unwrap();
    // SIGKILL allows no cleanup: processes die with their parent, namespaces remain…
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        pids.iter().all(|&p| !alive(p)),
        "processes outlived their lab"
    );
    assert!(lab::list_lab_namespaces().contains_key(&id));
    // …until the next lab (or `itcp-lab cleanup`) sweeps them.
    let removed = lab::sweep(false);
    assert!(removed.contains(&id), "{removed:?}");
    assert_nothing_left(&id, &pids);
    let _ = std::fs::remove_file(file);
}
