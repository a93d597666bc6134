//! Interactive traffic through msrd on emulated links (issue 11 item 4): an application
//! that sends a small message every 50 ms across a 150 ms WAN and a 2 Mbit/s cell,
//! several messages in flight, must not have its replies batched once per round trip
//! by Nagle's algorithm on msrd's relay sockets (msrd cannot see the application's
//! TCP_NODELAY). Compared in the same lab with direct routing. Needs root.

use std::time::Duration;

use itcp_testbed::lab::{self, bin_path, Host, Lab, LabConfig};
use itcp_testbed::ttcp::RrReport;

fn rr(lab: &mut Lab, port: u16) -> RrReport {
    let fh = lab::fh_addr(port);
    let args = [
        "rr",
        "--connect",
        &fh,
        "--pipeline",
        "--size",
        "100",
        "--interval-ms",
        "50",
        "--count",
        "110",
        // The first ones through msrd also wait for its fixed-side connect (one WAN
        // round trip), which direct routing pays inside connect(): steady state only.
        "--warmup",
        "10",
    ];
    let i = lab.spawn(Host::Mh, bin_path("ttcp"), &args).unwrap();
    let (_, out, err) = lab.wait(i, Duration::from_secs(60)).unwrap();
    let r: RrReport =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("rr {port}: {e}: {err}"));
    assert!(r.ok, "rr {port}: {r:?}");
    r
}

/// 75 ms each way on the WAN, 5 ms each way on a 2 Mbit/s cell (64 KB queue); echo
/// servers on 5008 (split by msrd: transparent, the application runs nothing of ours)
/// and 5009 (routed through the same MSR untouched); 5010 and 5011 are left for bulk
/// transfers, split and routed.
fn echo_lab(seed: u64) -> Lab {
    let wan = lab::link(100_000_000, 75.0, 0.0);
    let cell = lab::link(2_000_000, 5.0, 0.0);
    let mut lab = Lab::new(LabConfig::links(1, seed, wan, cell)).unwrap();
    let cfg = lab.msrd_config(1, "[transparent]\nenabled = true\nports = [5008, 5010]\n");
    lab.start_msrd(1, &cfg).unwrap();
    for port in [5008u16, 5009] {
        let a = lab::fh_addr(port);
        lab.spawn(Host::Fh, bin_path("ttcp"), &["echo", "--listen", &a])
            .unwrap();
        lab.wait_listening(Host::Fh, port).unwrap();
    }
    lab
}

/// The echo on `port` while a download on `bulk_port` keeps the cell's queue full.
fn rr_beside_a_download(lab: &mut Lab, port: u16, bulk_port: u16) -> RrReport {
    let a = lab::fh_addr(bulk_port);
    let secs = "12";
    let send = lab
        .spawn(
            Host::Fh,
            bin_path("ttcp"),
            &["send", "--listen", &a, "--duration", secs],
        )
        .unwrap();
    lab.wait_listening(Host::Fh, bulk_port).unwrap();
    let recv = lab
        .spawn(Host::Mh, bin_path("ttcp"), &["recv", "--connect", &a])
        .unwrap();
    // Long enough for the download to fill the cell's queue before the first message.
    std::thread::sleep(Duration::from_secs(2));
    let r = rr(lab, port);
    for i in [recv, send] {
        let (ok, out, err) = lab.wait(i, Duration::from_secs(60)).unwrap();
        assert!(ok, "bulk on {bulk_port}: {out} {err}");
    }
    r
}

#[test]
fn pipelined_small_messages_are_not_batched_by_the_split() {
    let mut lab = echo_lab(91);
    let direct = rr(&mut lab, 5009);
    let split = rr(&mut lab, 5008);
    check(&direct, &split, "idle link");
}

/// The same echo while a bulk download shares the cell, each through the same path
/// as its echo (split beside split, routed beside routed): the relay must not add
/// its own queue to the cell's.
#[test]
fn small_messages_beside_a_download_wait_no_longer_than_routed_ones() {
    let mut lab = echo_lab(92);
    let direct = rr_beside_a_download(&mut lab, 5009, 5011);
    let split = rr_beside_a_download(&mut lab, 5008, 5010);
    check(&direct, &split, "beside a download");
}

fn check(direct: &RrReport, split: &RrReport, what: &str) {
    let ms = |us: f64| us / 1000.0;
    eprintln!(
        "echo RTT ({what}), 100-byte messages every 50 ms: direct p50 {:.1} ms p99 {:.1} ms; \
         through msrd p50 {:.1} ms ({:.2}x) p99 {:.1} ms ({:.2}x)",
        ms(direct.p50_us),
        ms(direct.p99_us),
        ms(split.p50_us),
        split.p50_us / direct.p50_us,
        ms(split.p99_us),
        split.p99_us / direct.p99_us
    );
    // The path's round trip is what direct routing measures on the same links.
    assert!(
        split.p50_us <= 1.1 * direct.p50_us,
        "{what}: p50 through msrd {:.1} ms > 1.1 x direct {:.1} ms",
        ms(split.p50_us),
        ms(direct.p50_us)
    );
    assert!(
        split.p99_us <= 1.2 * direct.p99_us,
        "{what}: p99 through msrd {:.1} ms > 1.2 x direct {:.1} ms",
        ms(split.p99_us),
        ms(direct.p99_us)
    );
}
