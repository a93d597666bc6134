//! msrd with only the privileges it needs, end to end on the lab: started as root it
//! keeps only its capabilities (CAP_NET_ADMIN, CAP_NET_RAW, CAP_NET_BIND_SERVICE,
//! CAP_SYS_RESOURCE) in every set, also in the process an upgrade starts; started as a
//! user of its own with those as ambient capabilities (as `deploy/msrd.service` does)
//! it hands a transparently intercepted connection to a well-known port over to the
//! next MSR, and upgrades.

use std::time::Duration;

use itcp_proto::control::{Reply, UpgradeReply};
use itcp_testbed::lab::{self, bin_path, Host, Lab, LabConfig};
use itcp_testbed::msrd_user::{MsrdUser, UNIT_CAPS};

/// The capabilities msrd keeps (linux/capability.h numbers).
const KEPT: u64 = 1 << 10 | 1 << 12 | 1 << 13 | 1 << 24;
/// A uid and gid with no passwd entry: the lab's stand-in for the `itcp` user.
const UID: u32 = 64123;

/// A capability set of `/proc/PID/status` (`CapEff`, `CapBnd`, …).
fn cap_set(pid: u32, set: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{set}:\t")))
        .unwrap_or_else(|| panic!("no {set} in /proc/{pid}/status"));
    u64::from_str_radix(line.trim(), 16).unwrap()
}

/// The real uid of a process.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
    uids.split_whitespace().next().unwrap().parse().unwrap()
}

/// What msrd can keep here: [`KEPT`] less what this test itself lacks (a container's
/// bounding set may leave out CAP_SYS_RESOURCE).
fn keepable() -> u64 {
    KEPT & cap_set(std::process::id(), "CapBnd")
}

/// Every set of `pid` holds exactly what msrd keeps; ambient too, so that what it
/// starts (`nft`, `ip`, the msrd of an upgrade) has them as a non-root user.
fn assert_only_kept(pid: u32) {
    for set in ["CapPrm", "CapEff", "CapInh", "CapAmb", "CapBnd"] {
        assert_eq!(
            cap_set(pid, set),
            keepable(),
            "{set} of msrd (pid {pid}): {:#x}, want {:#x}",
            cap_set(pid, set),
            keepable()
        );
    }
}

fn upgrade(lab: &Lab, k: usize) -> UpgradeReply {
    let line = lab.msrd_line(k, r#"{"op":"upgrade"}"#).unwrap();
    Reply::parse(&line).unwrap().upgrade().unwrap()
}

fn log_tail(lab: &Lab) -> String {
    let mut s = String::new();
    for f in ["msrd1.log", "msrd2.log", "agent.log", "agent.events"] {
        let t = std::fs::read_to_string(lab.dir.join(f)).unwrap_or_default();
        let tail: Vec<&str> = t.lines().rev().take(30).collect();
        s += &format!(
            "--- {f}\n{}\n",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    s
}

#[test]
fn msrd_keeps_only_the_capabilities_it_needs_also_after_an_upgrade() {
    let mut lab = Lab::new(LabConfig::clean(1, 7)).unwrap();
    let cfg = lab.msrd_config(1, "");
    let idx = lab.start_msrd(1, &cfg).unwrap();
    let pid = lab.pid(idx);
    assert_only_kept(pid);
    let u = upgrade(&lab, 1);
    assert_ne!(u.new_pid, pid);
    assert_only_kept(u.new_pid);
    assert_eq!(uid_of(u.new_pid), uid_of(pid));
}

#[test]
fn msrd_as_its_own_user_hands_off_a_connection_to_a_well_known_port() {
    let mut lab = Lab::new(LabConfig::clean(2, 11)).unwrap();
    if lab.msrd_user.is_none() {
        lab.msrd_user = Some(MsrdUser {
            uid: UID,
            gid: UID,
            caps: KEPT,
        });
    }
    eprintln!(
        "msrd as {:?} ({UNIT_CAPS} unless ITCP_LAB_MSRD_CAPS)",
        lab.msrd_user
    );
    // Port 80 transparently: the new MSR restores the MH's socket bound to FH:80.
    let extra = "[beacon]\ninterval_ms = 200\nlifetime_ms = 600\n\
                 [transparent]\nenabled = true\nports = [80]\n";
    let agent = ["--hysteresis-ms", "0", "--beacon-interval-ms", "200"];
    let (msrds, _) = lab.start_itcp_mobility(extra, &agent).unwrap();
    let pid = lab.pid(msrds[0]);
    assert_eq!(uid_of(pid), lab.msrd_user.as_ref().unwrap().uid);
    let (web, other) = (lab::fh_addr(80), lab::fh_addr(5006));
    for (a, port) in [(&web, 80), (&other, 5006)] {
        lab.spawn(Host::Fh, bin_path("ttcp"), &["echo", "--listen", a])
            .unwrap();
        lab.wait_listening(Host::Fh, port).unwrap();
    }
    // An I-TCP connection gives MSR1 the MH's token, so that its greeting moves both.
    let rr = |lab: &mut Lab, to: &str, itcp: bool| {
        let mut a = vec!["rr", "--connect", to, "--count", "60", "--size", "100"];
        a.extend(["--interval-ms", "50"]);
        if itcp {
            a.push("--itcp");
        }
        lab.spawn(Host::Mh, bin_path("ttcp"), &a).unwrap()
    };
    let explicit = rr(&mut lab, &other, true);
    std::thread::sleep(Duration::from_millis(300));
    let transparent = rr(&mut lab, &web, false);
    std::thread::sleep(Duration::from_millis(500));
    lab.assoc(&[1, 2]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    lab.assoc(&[2]).unwrap();
    for (i, what) in [(transparent, "port 80"), (explicit, "explicit")] {
        let (_, out, err) = lab.wait(i, Duration::from_secs(20)).unwrap();
        let r: itcp_testbed::ttcp::RrReport = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{what} rr: {e}: {err}\n{}", log_tail(&lab)));
        assert!(r.ok && r.count == 60, "{what}: {r:?}\n{}", log_tail(&lab));
    }
    let moved: Vec<_> = lab.handoff_records(2);
    assert!(
        moved.iter().any(|r| r.ok() && r.connections.len() >= 2),
        "both connections should have moved: {moved:?}\n{}",
        log_tail(&lab)
    );
    assert!(
        moved.iter().all(|r| r.failed.is_empty()),
        "failed: {moved:?}\n{}",
        log_tail(&lab)
    );
    // The new MSR's msrd upgrades as its own user: ambient capabilities carry over.
    let pid2 = lab.pid(msrds[1]);
    let u = upgrade(&lab, 2);
    assert_eq!(uid_of(u.new_pid), uid_of(pid2));
    assert_eq!(cap_set(u.new_pid, "CapEff"), cap_set(pid2, "CapEff"));
}
