//! End-to-end upgrade tests on the lab: msrd replaced by a new process of its binary
//! (`{"op":"upgrade"}` on its control socket, what `itcpctl upgrade` sends) while
//! transfers run in both directions and MH listeners are open. Every transfer is
//! verified byte for byte, nftables counters at the FH and the MH count RSTs (there
//! must be none), and the listeners accept new connections afterwards. A new process
//! that cannot take over must leave the old one serving. Needs root.

use std::time::{Duration, Instant};

use itcp_proto::control::{Reply, UpgradeReply};
use itcp_testbed::lab::{self, bin_path, Host, Lab, LabConfig};
use itcp_testbed::ttcp::{RecvReport, SendReport};

const FAST_BEACONS: &str = "[beacon]\ninterval_ms = 200\nlifetime_ms = 600\n";
const FAST_AGENT: &[&str] = &["--hysteresis-ms", "0", "--beacon-interval-ms", "200"];
const TRANSPARENT: &str = "[transparent]\nenabled = true\nports = [5002]\n";

/// `msrs` MSRs with msrd and `[handoff]`, fast clean links, the MH in cell 1 with its
/// agent; RSTs watched at the FH and the MH. With `own_binary`, msrd runs from a copy
/// in the lab directory (`<lab>/msrd`), which a test may replace as a package would.
/// Returns the lab and the msrds' indices.
fn lab_with(
    msrs: usize,
    seed: u64,
    env: &[(usize, &str, &str)],
    own_binary: bool,
) -> (Lab, Vec<usize>) {
    let mut lab = Lab::new(LabConfig::clean(msrs, seed)).unwrap();
    if own_binary {
        let copy = lab.dir.join("msrd");
        std::fs::copy(bin_path("msrd"), &copy).unwrap();
        lab.msrd_bin = Some(copy);
    }
    let (msrds, _) = lab
        .start_itcp_mobility_env(&format!("{FAST_BEACONS}{TRANSPARENT}"), FAST_AGENT, env)
        .unwrap();
    lab.watch_rsts(Host::Fh).unwrap();
    lab.watch_rsts(Host::Mh).unwrap();
    (lab, msrds)
}

/// A transfer: (sender index, receiver index, bytes).
type Transfer = (usize, usize, u64);

/// FH → MH through an explicit I-TCP connection (SOCKS CONNECT).
fn download(lab: &mut Lab, port: u16, bytes: u64) -> Transfer {
    let (ttcp, fh, n) = (bin_path("ttcp"), lab::fh_addr(port), bytes.to_string());
    let s = lab
        .spawn(Host::Fh, &ttcp, &["send", "--listen", &fh, "--bytes", &n])
        .unwrap();
    lab.wait_listening(Host::Fh, port).unwrap();
    let r = lab
        .spawn(
            Host::Mh,
            &ttcp,
            &["recv", "--connect", &fh, "--bytes", &n, "--itcp"],
        )
        .unwrap();
    (s, r, bytes)
}

/// MH → FH, explicit (`itcp`) or intercepted (an unmodified app, TPROXY).
fn upload(lab: &mut Lab, port: u16, bytes: u64, itcp: bool) -> Transfer {
    let (ttcp, fh, n) = (bin_path("ttcp"), lab::fh_addr(port), bytes.to_string());
    let r = lab
        .spawn(Host::Fh, &ttcp, &["recv", "--listen", &fh, "--bytes", &n])
        .unwrap();
    lab.wait_listening(Host::Fh, port).unwrap();
    let mut args = vec!["send", "--connect", &fh, "--bytes", &n];
    if itcp {
        args.push("--itcp");
    }
    let s = lab.spawn(Host::Mh, &ttcp, &args).unwrap();
    (s, r, bytes)
}

/// The MH listens on `port` through its MSR (LISTEN; its ACCEPT waits at the MSR).
fn mh_listens(lab: &mut Lab, port: u16, bytes: u64) -> usize {
    let (ttcp, mh, n) = (bin_path("ttcp"), lab::mh_addr(port), bytes.to_string());
    lab.spawn(
        Host::Mh,
        &ttcp,
        &["recv", "--listen", &mh, "--bytes", &n, "--itcp"],
    )
    .unwrap()
}

/// The FH connects to the MH's listener on `port` and sends.
fn fh_connects(lab: &mut Lab, port: u16, bytes: u64, receiver: usize) -> Transfer {
    let (ttcp, mh, n) = (bin_path("ttcp"), lab::mh_addr(port), bytes.to_string());
    let s = lab
        .spawn(Host::Fh, &ttcp, &["send", "--connect", &mh, "--bytes", &n])
        .unwrap();
    (s, receiver, bytes)
}

/// An MH app that LISTENs on `port` through its MSR but sends its ACCEPT only once
/// the file `go` exists (meanwhile the MSR queues what the FH connects), then
/// forwards the accepted stream to a local `ttcp recv`, which verifies it. Returns the
/// indices of the app and of the receiver.
fn late_acceptor(lab: &mut Lab, port: u16, bytes: u64, go: &std::path::Path) -> (usize, usize) {
    const APP: &str = r#"
import os, socket, struct, sys, time
port, go, fwd = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def recvn(s, n):
    b = b''
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            sys.exit('closed after %d of %d bytes' % (len(b), n))
        b += c
    return b
def request(cmd):  # docs/protocol.md: method 00, then LISTEN (80) or ACCEPT (81)
    s = socket.create_connection(('10.2.0.1', 1080))
    s.sendall(b'\x05\x01\x00')
    assert recvn(s, 2) == b'\x05\x00'
    s.sendall(b'\x05' + bytes([cmd]) + b'\x00\x01' + bytes(4) + struct.pack('>H', port))
    r = recvn(s, 10)
    if r[1] != 0:
        sys.exit('reply %d to command %x' % (r[1], cmd))
    return s
listener = request(0x80)
while not os.path.exists(go):
    time.sleep(0.02)
a = request(0x81)
out = socket.create_connection(('127.0.0.1', fwd))
while True:
    b = a.recv(65536)
    if not b:
        break
    out.sendall(b)
out.close()
"#;
    let app = lab.dir.join("late_acceptor.py");
    std::fs::write(&app, APP).unwrap();
    let fwd = port + 1000;
    let (ttcp, n) = (bin_path("ttcp"), bytes.to_string());
    let local = format!("127.0.0.1:{fwd}");
    let r = lab
        .spawn(
            Host::Mh,
            &ttcp,
            &["recv", "--listen", &local, "--bytes", &n],
        )
        .unwrap();
    lab.wait_listening(Host::Mh, fwd).unwrap();
    let (p, f) = (port.to_string(), fwd.to_string());
    let go = go.display().to_string();
    let a = lab
        .spawn(Host::Mh, "python3", &[app.to_str().unwrap(), &p, &go, &f])
        .unwrap();
    // The MSR listens on the MH's address for it.
    lab.wait_listening(Host::Msr(1), port).unwrap();
    (a, r)
}

fn finish(lab: &mut Lab, (s, r, bytes): Transfer) {
    let (_, rout, rerr) = lab.wait(r, Duration::from_secs(120)).unwrap();
    let (_, sout, serr) = lab.wait(s, Duration::from_secs(30)).unwrap();
    let recv: RecvReport = serde_json::from_str(rout.trim())
        .unwrap_or_else(|e| panic!("receiver: {e}: {rerr}\n{}", diag(lab)));
    let send: SendReport = serde_json::from_str(sout.trim())
        .unwrap_or_else(|e| panic!("sender: {e}: {serr}\n{}", diag(lab)));
    assert!(recv.ok, "receiver: {:?}\n{}", recv.error, diag(lab));
    assert!(send.ok, "sender: {:?}\n{}", send.error, diag(lab));
    assert!(recv.verified);
    assert_eq!(recv.bytes, bytes);
}

fn assert_no_rsts(lab: &Lab) {
    let (fh_in, fh_out) = lab.rsts(Host::Fh).unwrap();
    let (mh_in, mh_out) = lab.rsts(Host::Mh).unwrap();
    assert_eq!(
        (fh_in, fh_out, mh_in, mh_out),
        (0, 0, 0, 0),
        "RSTs (FH in, FH out, MH in, MH out)\n{}",
        diag(lab)
    );
}

/// Logs worth seeing when a test fails.
fn diag(lab: &Lab) -> String {
    let mut s = String::new();
    for f in ["msrd1.log", "msrd2.log", "agent.log", "agent.events"] {
        let t = std::fs::read_to_string(lab.dir.join(f)).unwrap_or_default();
        let tail: Vec<&str> = t.lines().rev().take(40).collect();
        s += &format!(
            "--- {f} (last lines)\n{}\n",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    s
}

/// Asks MSR `k`'s msrd to upgrade, as `itcpctl upgrade` does.
fn upgrade(lab: &Lab, k: usize) -> Result<UpgradeReply, String> {
    let t = Instant::now();
    let line = lab
        .msrd_line(k, r#"{"op":"upgrade"}"#)
        .map_err(|e| e.to_string())?;
    let r = Reply::parse(&line)?.upgrade();
    eprintln!("upgrade of MSR{k}: {r:?} after {:?}", t.elapsed());
    r
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) is not alive.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// Waits until an msrd that upgraded exits, and reaps it: the lab makes us the
/// subreaper of its processes' orphans, and that msrd is one.
fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: waitpid for one specific pid, no status wanted.
        let r = unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), libc::WNOHANG) };
        if r == pid as i32 || (r < 0 && !alive(pid)) {
            return;
        }
        assert!(Instant::now() < deadline, "pid {pid} still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes in host `h`'s namespace.
fn pids_in(lab: &Lab, h: Host) -> Vec<u32> {
    let out = std::process::Command::new("ip")
        .args(["netns", "pids", &lab.ns(h)])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|&p| alive(p))
        .collect()
}

/// Runs a command in host `h`'s namespace; its stdout.
fn sh(lab: &Lab, h: Host, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &lab.ns(h)])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What msrd set up on MSR `k`: its nftables table with rule handles (a table made
/// again would have new ones), policy rules, proxy-ARP entries, `proxy_delay` and
/// its state file.
fn footprint(lab: &Lab, k: usize) -> String {
    let h = Host::Msr(k);
    let state = lab.msrd_control(k).display().to_string() + ".state";
    [
        stable_table(&sh(
            lab,
            h,
            &["nft", "-a", "list", "table", "inet", "itcp_msrd"],
        )),
        sh(lab, h, &["ip", "rule", "show"]),
        sh(lab, h, &["ip", "neigh", "show", "proxy"]),
        sh(
            lab,
            h,
            &["cat", "/proc/sys/net/ipv4/neigh/lan0/proxy_delay"],
        ),
        std::fs::read_to_string(state).unwrap_or_default(),
    ]
    .join("\n")
}

/// msrd's table without what changes by itself: the elements of the `synack` sets (the
/// MHs msrd sent a SYN-ACK lately, which traffic updates) and the time left on timed
/// elements.
fn stable_table(listing: &str) -> String {
    let mut out = Vec::new();
    let (mut in_synack, mut in_elements) = (false, false);
    for line in listing.lines() {
        let t = line.trim_start();
        if t.starts_with("set ") {
            in_synack = t.starts_with("set synack");
        }
        if in_elements || (in_synack && t.starts_with("elements = {")) {
            in_elements = !t.ends_with('}');
            continue;
        }
        // "… expires 2s868ms, …": drop the word after each "expires".
        let mut kept = Vec::new();
        let mut words = line.split(' ');
        while let Some(w) = words.next() {
            if w == "expires" {
                if let Some(v) = words.next() {
                    // Keep what follows the duration in the same word (",", "}").
                    kept.push(
                        v.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '.'),
                    );
                }
            } else {
                kept.push(w);
            }
        }
        out.push(kept.join(" "));
    }
    out.join("\n")
}

#[test]
fn a_stable_table_leaves_out_what_time_and_traffic_change() {
    let a = "\tset synack4 { # handle 8\n\t\ttype ipv4_addr\n\t\telements = { 10.2.0.100 timeout 3s expires 2s868ms }\n\t}\n\tset strays4 {\n\t\telements = { 10.2.0.100 . 1 . 10.0.0.1 . 2 timeout 1m expires 59s10ms,\n\t\t\t     10.2.0.100 . 3 . 10.0.0.1 . 4 timeout 1m expires 1s }\n\t}";
    let b = "\tset synack4 { # handle 8\n\t\ttype ipv4_addr\n\t}\n\tset strays4 {\n\t\telements = { 10.2.0.100 . 1 . 10.0.0.1 . 2 timeout 1m expires 3s,\n\t\t\t     10.2.0.100 . 3 . 10.0.0.1 . 4 timeout 1m expires 900ms }\n\t}";
    assert_eq!(stable_table(a), stable_table(b));
    assert!(stable_table(a).contains("10.2.0.100 . 3"));
    assert_ne!(stable_table(a), stable_table(&b.replace(". 3 ", ". 5 ")));
}

/// The MH is in MSR `k`'s hold set.
fn held(lab: &Lab, k: usize) -> bool {
    sh(
        lab,
        Host::Msr(k),
        &["nft", "list", "set", "inet", "itcp_msrd", "held4"],
    )
    .contains("10.2.0.100")
}

/// (id, kind) of MSR `k`'s sessions.
fn sessions(lab: &Lab, k: usize) -> Vec<(u64, String)> {
    lab.msrd_sessions(k)
        .unwrap()
        .iter()
        .map(|s| (s.id, s.kind.as_str().to_string()))
        .collect()
}

/// Waits until the agent reports `n` moves.
fn wait_moves(lab: &Lab, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ev = lab.agent_events();
        if let Some(bad) = ev
            .iter()
            .find(|e| e["event"] == "move_failed" || e["event"] == "refused")
        {
            panic!("handoff failed: {bad}\n{}", diag(lab));
        }
        if ev.iter().filter(|e| e["event"] == "moved").count() >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} moves not seen: {ev:?}\n{}",
            diag(lab)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn upgrades_mid_transfer_keep_every_connection_and_listener() {
    let (mut lab, msrds) = lab_with(2, 91, &[], true);
    let big = 12u64 << 20;
    // Explicit download and upload, an intercepted upload, an accepted connection,
    // and a listener whose ACCEPT waits at the MSR through everything below.
    let down = download(&mut lab, 5001, big);
    let up = upload(&mut lab, 5005, big, true);
    let tp = upload(&mut lab, 5002, big, false);
    let r3 = mh_listens(&mut lab, 5003, big);
    let r4 = mh_listens(&mut lab, 5004, 1 << 20);
    // And a listener with a connection queued at the MSR: no ACCEPT for it yet.
    let go = lab.dir.join("accept-now");
    let (app, r7) = late_acceptor(&mut lab, 5007, 4 << 20, &go);
    let queued = fh_connects(&mut lab, 5007, 4 << 20, r7);
    std::thread::sleep(Duration::from_millis(500));
    let accepted = fh_connects(&mut lab, 5003, big, r3);
    std::thread::sleep(Duration::from_millis(700));
    let before = sessions(&lab, 1);
    eprintln!("MSR1 sessions before: {before:?}");
    let mut kinds: Vec<&str> = before.iter().map(|(_, k)| k.as_str()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "accept",
            "accept_wait",
            "connect",
            "connect",
            "listen",
            "listen",
            "transparent"
        ],
        "{}",
        diag(&lab)
    );
    let old_pid = lab.pid(msrds[0]);

    // A new binary is installed as dpkg does it: renamed over the old file. The
    // running msrd's own file is gone; the upgrade starts the one now at its path.
    let bin = lab.dir.join("msrd");
    std::fs::copy(bin_path("msrd"), lab.dir.join("msrd.new")).unwrap();
    std::fs::rename(lab.dir.join("msrd.new"), &bin).unwrap();
    let exe = |pid: u32| std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(exe(old_pid).to_string_lossy().ends_with(" (deleted)"));
    let fp = footprint(&lab, 1);
    assert!(fp.contains("10.2.0.100"), "the MH's proxy-ARP entry: {fp}");

    // First upgrade: every connection moves to the new process.
    let u = upgrade(&lab, 1).unwrap_or_else(|e| panic!("{e}\n{}", diag(&lab)));
    assert_eq!(exe(u.new_pid), bin, "the new process runs the new file");
    assert_eq!(u.old_pid, old_pid);
    assert_ne!(u.new_pid, old_pid);
    assert_eq!(u.connections, before.len() as u64, "{u:?}");
    // 5004 and 5007 (ttcp closed 5003 once it accepted).
    assert_eq!(u.listeners, 2, "{u:?}");
    let (ok, _, _) = lab.wait(msrds[0], Duration::from_secs(10)).unwrap();
    assert!(ok, "the old msrd exits cleanly\n{}", diag(&lab));
    assert!(alive(u.new_pid));
    let after = sessions(&lab, 1);
    assert_eq!(after, before, "same sessions, same ids, in the new process");
    assert_eq!(footprint(&lab, 1), fp, "the router footprint is untouched");

    // A new connection through the upgraded msrd (the request port was handed over).
    let fresh = download(&mut lab, 5006, 1 << 20);
    finish(&mut lab, fresh);

    // Second upgrade, of the upgraded process, while the transfers still run: by
    // SIGUSR2 this time (the outcome is only logged).
    // SAFETY: signalling the msrd this test started (through its predecessor).
    unsafe { libc::kill(u.new_pid as i32, libc::SIGUSR2) };
    wait_gone(u.new_pid);
    let now = pids_in(&lab, Host::Msr(1));
    assert!(
        now.len() == 1 && now[0] != u.new_pid,
        "{now:?}\n{}",
        diag(&lab)
    );
    assert_eq!(sessions(&lab, 1), after);

    // The connection queued at the MSR through both upgrades is accepted now.
    std::fs::write(&go, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let accepted_7 = |lab: &Lab| {
        lab.msrd_sessions(1)
            .unwrap()
            .iter()
            .any(|s| s.kind.as_str() == "accept" && s.mh.port() == 5007)
    };
    while !accepted_7(&lab) {
        assert!(
            Instant::now() < deadline,
            "no ACCEPT on 5007\n{}",
            diag(&lab)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A handoff after the upgrades: the MH's token and the channel survived.
    lab.assoc(&[1, 2]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    lab.assoc(&[2]).unwrap();
    wait_moves(&lab, 1);
    let recs = lab.handoff_records(1);
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0].outcome, itcp_handoff::log::Outcome::Moved);
    // MSR1 holds the MH's stray TCP for [handoff] hold_after_ms (3 s) after the move;
    // an upgrade within that time hands the release over: the new process does it.
    let t = Instant::now();
    assert!(held(&lab, 1));
    let u3 = upgrade(&lab, 1).unwrap_or_else(|e| panic!("{e}\n{}", diag(&lab)));
    assert_eq!(u3.connections, 0, "everything moved to MSR2");
    wait_gone(u3.old_pid);
    assert!(held(&lab, 1), "still held after the upgrade");
    while held(&lab, 1) {
        assert!(t.elapsed() < Duration::from_secs(5), "hold never released");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("hold released {:?} after the upgrade began", t.elapsed());

    // Only now does the FH connect to the listener that lived through it all.
    let late = fh_connects(&mut lab, 5004, 1 << 20, r4);
    for t in [down, up, tp, accepted, queued, late] {
        finish(&mut lab, t);
    }
    let (ok, _, err) = lab.wait(app, Duration::from_secs(10)).unwrap();
    assert!(ok, "the late acceptor: {err}");
    assert_no_rsts(&lab);
    // Counters carried over: the connections relayed before the upgrades count (the
    // late one went to MSR2, with the listener).
    let st = lab.msrd_stats(1).unwrap();
    assert_eq!(st.stats.connections_total, 6, "{st:?}");
    assert!(st.stats.handoffs_out >= 1, "{st:?}");

    // The footprint is the last msrd's now: SIGTERM undoes it all.
    let last = pids_in(&lab, Host::Msr(1));
    assert_eq!(last, vec![u3.new_pid]);
    // SAFETY: signalling the msrd this test started (through its predecessors).
    unsafe { libc::kill(u3.new_pid as i32, libc::SIGTERM) };
    wait_gone(u3.new_pid);
    let h = Host::Msr(1);
    assert!(!sh(&lab, h, &["nft", "list", "tables"]).contains("itcp_msrd"));
    assert!(!sh(&lab, h, &["ip", "rule", "show"]).contains("0x4954"));
    let delay = |i: &str| {
        sh(
            &lab,
            h,
            &["cat", &format!("/proc/sys/net/ipv4/neigh/{i}/proxy_delay")],
        )
    };
    assert_eq!(delay("lan0"), delay("cell0"), "proxy_delay restored");
    assert!(!lab.dir.join("msrd1.sock.state").exists());
    assert!(!lab.msrd_control(1).exists());
}

/// A channel a peer keeps open ahead of need (`[handoff] keep_channels`) can be dead
/// without the peer knowing: here the old MSR's msrd is upgraded, so the process
/// holding the channel's far end exits, and its FIN is lost on the LAN. The handoff
/// that takes the channel next is answered with a reset; it must ask again on a new
/// channel and move the MH's connections at the first attempt.
#[test]
fn a_kept_channel_that_died_unseen_costs_the_handoff_nothing() {
    let (mut lab, msrds) = lab_with(2, 94, &[], false);
    let down = download(&mut lab, 5001, 16 << 20);
    // Time for MSR2 to open its channel to MSR1 and for the download to run.
    std::thread::sleep(Duration::from_millis(1500));
    let kept = |lab: &Lab| lab.msrd_stats(2).unwrap().stats;
    let st = kept(&lab);
    assert_eq!((st.channels_kept_used, st.channels_kept_stale), (0, 0));
    // From here MSR1's FINs on the channel port are lost; its RSTs get through.
    let lossy = "add table inet lossy\nadd chain inet lossy out { type filter hook output \
                 priority 0; }\nadd rule inet lossy out tcp sport 4347 tcp flags & fin == fin \
                 drop\n";
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &lab.ns(Host::Msr(1)), "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(lossy.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "nft: {out:?}");
    let old = lab.pid(msrds[0]);
    let u = upgrade(&lab, 1).unwrap_or_else(|e| panic!("{e}\n{}", diag(&lab)));
    assert_eq!(u.old_pid, old);
    let (ok, _, _) = lab.wait(msrds[0], Duration::from_secs(10)).unwrap();
    assert!(ok, "the old msrd exits cleanly\n{}", diag(&lab));
    std::thread::sleep(Duration::from_millis(300));

    lab.assoc(&[1, 2]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    lab.assoc(&[2]).unwrap();
    // wait_moves fails on the agent's first failed move.
    wait_moves(&lab, 1);
    let recs = lab.handoff_records(2);
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0].outcome, itcp_handoff::log::Outcome::Moved);
    let st = kept(&lab);
    eprintln!(
        "MSR2: kept channels used {}, found dead {}",
        st.channels_kept_used, st.channels_kept_stale
    );
    assert_eq!(st.channels_kept_used, 1, "the dead channel was taken");
    assert_eq!(st.channels_kept_stale, 1, "and found dead when used");
    finish(&mut lab, down);
    assert_no_rsts(&lab);
}

#[test]
fn a_new_msrd_that_fails_leaves_the_old_one_serving() {
    // The new process inherits this: it exits once it has adopted the whole state.
    let (mut lab, msrds) = lab_with(1, 93, &[(1, "MSRD_FAULT", "upgrade_exit")], false);
    let big = 12u64 << 20;
    let down = download(&mut lab, 5001, big);
    let up = upload(&mut lab, 5005, big, true);
    let r4 = mh_listens(&mut lab, 5004, 1 << 20);
    std::thread::sleep(Duration::from_millis(1000));
    let before = sessions(&lab, 1);
    let fp = footprint(&lab, 1);
    let pid = lab.pid(msrds[0]);
    let cfg_path = lab.dir.join("msr1.toml");
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();

    // 1. A configuration that does not load: refused before anything pauses.
    std::fs::write(&cfg_path, format!("{cfg}\n[relay]\nbogus = 1\n")).unwrap();
    let e = upgrade(&lab, 1).unwrap_err();
    assert!(e.contains("msr1.toml") && e.contains("bogus"), "{e}");
    assert!(e.contains("serves on"), "{e}");

    // 2. A configuration that moves a listening socket: that needs a restart.
    std::fs::write(
        &cfg_path,
        format!("{cfg}\n[metrics]\nlisten = \"10.1.0.11:9473\"\n"),
    )
    .unwrap();
    let e = upgrade(&lab, 1).unwrap_err();
    assert!(e.contains("restart msrd"), "{e}");
    std::fs::write(&cfg_path, &cfg).unwrap();

    // 3. A new process that dies holding everything, after the old one paused every
    //    relay and handed it all over.
    let t = Instant::now();
    let e = upgrade(&lab, 1).unwrap_err();
    assert!(e.contains("exited"), "{e}");
    eprintln!(
        "failed upgrade with everything paused took {:?}",
        t.elapsed()
    );

    serves_on(&mut lab, pid, (&before, &fp), r4, vec![down, up]);
}

/// The old msrd (`pid`) still serves: its sessions are `before`, no other msrd is
/// left, a new connection works, the MH listener on 5004 (ACCEPT waiting in `r4`)
/// accepts, and every transfer ends byte-exact without an RST.
fn serves_on(
    lab: &mut Lab,
    pid: u32,
    (before, fp): (&[(u64, String)], &str),
    r4: usize,
    ts: Vec<Transfer>,
) {
    assert!(alive(pid));
    assert_eq!(footprint(lab, 1), fp, "the router footprint is untouched");
    assert_eq!(
        pids_in(lab, Host::Msr(1)),
        vec![pid],
        "failed successors are gone"
    );
    assert_eq!(sessions(lab, 1), before);
    let fresh = download(lab, 5006, 1 << 20);
    finish(lab, fresh);
    let late = fh_connects(lab, 5004, 1 << 20, r4);
    for t in ts.into_iter().chain([late]) {
        finish(lab, t);
    }
    assert_no_rsts(lab);
}

/// A new process that hangs (`hook`): the old one gives up after `secs`, kills it and
/// serves on.
fn a_hung_new_msrd(hook: &str, seed: u64, secs: u64) {
    let (mut lab, msrds) = lab_with(1, seed, &[(1, "MSRD_FAULT", hook)], false);
    // Long enough to outlast the wait (nothing pauses before the new process is ready).
    let down = download(&mut lab, 5001, 32 << 20);
    let r4 = mh_listens(&mut lab, 5004, 1 << 20);
    std::thread::sleep(Duration::from_millis(1000));
    let before = sessions(&lab, 1);
    let fp = footprint(&lab, 1);
    let t = Instant::now();
    let e = upgrade(&lab, 1).unwrap_err();
    assert!(e.contains(&format!("within {secs} s")), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(secs + 2),
        "{:?}",
        t.elapsed()
    );
    let pid = lab.pid(msrds[0]);
    serves_on(&mut lab, pid, (&before, &fp), r4, vec![down]);
}

#[test]
fn a_new_msrd_that_never_gets_ready_is_killed_and_the_old_one_serves_on() {
    a_hung_new_msrd("upgrade_hang_ready", 95, 5);
}

#[test]
fn a_new_msrd_that_hangs_holding_the_state_is_killed_and_the_old_one_serves_on() {
    a_hung_new_msrd("upgrade_hang", 97, 5);
}

/// Sends `len` bytes on connection `c` and checks that the same come back.
async fn echo(s: &mut tokio::net::TcpStream, c: usize, len: usize) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let data: Vec<u8> = (0..len).map(|i| ((c * 31) ^ (i * 7)) as u8).collect();
    s.write_all(&data).await?;
    let mut back = vec![0; len];
    s.read_exact(&mut back).await?;
    if back != data {
        return Err(std::io::Error::other(format!(
            "connection {c}: echo differs"
        )));
    }
    Ok(())
}

/// 1000 relayed connections across an upgrade, each closed by the MH right after.
/// (Ignored until stop 29: 1-3 RSTs at the MH in some runs under load, as the
/// connections closed; the pattern of the LAST_ACK race fixed by the `ended` sets.
/// 8 of 8 runs of the whole file passed since.)
#[test]
fn an_upgrade_moves_a_thousand_connections_intact() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const N: usize = 1000;
    itcp_testbed::sys::raise_nofile_limit();
    let mut lab = Lab::new(LabConfig {
        msrs: 1,
        veth: true,
        ..LabConfig::default()
    })
    .unwrap();
    lab.watch_rsts(Host::Fh).unwrap();
    lab.watch_rsts(Host::Mh).unwrap();
    let cfg = lab.msrd_config(1, "").replace(
        "mh_prefixes = [\"10.2.0.0/24\"]",
        &format!(
            "mh_prefixes = [\"10.2.0.0/24\"]\nmax_connections_per_mh = {N}\n\
             max_handshakes_per_mh = {N}"
        ),
    );
    let msrd = lab.start_msrd(1, &cfg).unwrap();
    lab.start_fh_echo(9000).unwrap();
    // The MH: N connections, each echoes 1 KiB before the upgrade and 64 KiB after.
    let (opened_tx, opened_rx) = std::sync::mpsc::channel::<usize>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let mh_ns = lab.ns(Host::Mh);
    let client = std::thread::spawn(move || {
        itcp_testbed::sys::in_netns(&mh_ns, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let opts = itcp_mh::MhOptions::new()
                    .gateway(std::net::SocketAddr::from(([10, 2, 0, 1], 1080)))
                    .token(itcp_mh::Token([7; 16]));
                let fh = std::net::SocketAddr::from(([10, 0, 0, 1], 9000));
                let mut streams = Vec::with_capacity(N);
                for c in 0..N {
                    let s = itcp_mh::nonblocking::ItcpStream::connect_with(&opts, fh).await?;
                    let mut s = s.into_inner();
                    echo(&mut s, c, 1024).await?;
                    streams.push(s);
                }
                let _ = opened_tx.send(streams.len());
                let _ = go_rx.recv();
                let mut tasks = Vec::new();
                for (c, mut s) in streams.into_iter().enumerate() {
                    tasks.push(tokio::spawn(async move {
                        echo(&mut s, c, 64 << 10).await?;
                        s.shutdown().await?;
                        let mut rest = Vec::new();
                        s.read_to_end(&mut rest).await?;
                        Ok::<usize, std::io::Error>(rest.len())
                    }));
                }
                let mut intact = 0;
                for t in tasks {
                    if let Ok(Ok(0)) = t.await {
                        intact += 1;
                    }
                }
                Ok(intact)
            })
        })
    });
    let opened = opened_rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("the MH did not open {N} connections\n{}", diag(&lab)));
    assert_eq!(opened, N);
    let old_pid = lab.pid(msrd);
    let u = upgrade(&lab, 1).unwrap_or_else(|e| panic!("{e}\n{}", diag(&lab)));
    eprintln!("{N} connections handed over in {} ms", u.ms);
    assert_eq!(u.connections, N as u64);
    assert_eq!(u.old_pid, old_pid);
    let (ok, _, _) = lab.wait(msrd, Duration::from_secs(10)).unwrap();
    assert!(ok);
    assert_eq!(lab.msrd_stats(1).unwrap().active, N as u64);
    go_tx.send(()).unwrap();
    let intact = client.join().unwrap().unwrap();
    assert_eq!(intact, N, "{}", diag(&lab));
    assert_no_rsts(&lab);
}
