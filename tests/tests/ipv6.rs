//! IPv6 end to end on a dual-stack lab (static addresses, no router advertisements,
//! no DAD): explicit mode (SOCKS ATYP 04 over IPv6), transparent mode (TPROXY for
//! `ip6`) and passive open, each checked byte for byte with the FH seeing the MH's own
//! IPv6 address. Needs root.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use itcp_mh::{ItcpListener, MhOptions, Token};
use itcp_testbed::lab::{addr6, bin_path, Host, Lab, LabConfig};
use itcp_testbed::sys::in_netns;
use itcp_testbed::ttcp::{RecvReport, SendReport};

fn lab6(extra: &str) -> Lab {
    let mut cfg = LabConfig::clean(1, 61);
    cfg.ipv6 = true;
    let mut lab = Lab::new(cfg).unwrap();
    let c = lab.msrd_config(1, extra);
    lab.start_msrd(1, &c).unwrap();
    lab
}

fn fh6(port: u16) -> String {
    SocketAddr::new(addr6::FH.into(), port).to_string()
}

/// The MH's I-TCP gateway over IPv6.
fn gw6() -> String {
    SocketAddr::new(addr6::CELL_GW.into(), 1080).to_string()
}

/// ttcp `send` at `from`, `recv` at `to` (the listener started first), `extra_*` flags;
/// returns both reports.
fn transfer(
    lab: &mut Lab,
    (from, send): (Host, &[&str]),
    (to, recv): (Host, &[&str]),
    env: &[(&str, &str)],
) -> (SendReport, RecvReport) {
    let ttcp = bin_path("ttcp");
    let mut sa = vec!["send", "--bytes", "8M"];
    sa.extend_from_slice(send);
    let mut ra = vec!["recv", "--bytes", "8M"];
    ra.extend_from_slice(recv);
    let (listener, lh) = if sa.contains(&"--listen") {
        (&sa, from)
    } else {
        (&ra, to)
    };
    let port: u16 = listener
        .iter()
        .skip_while(|a| **a != "--listen")
        .nth(1)
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.port())
        .unwrap();
    let (s, r) = if listener == &sa {
        let s = lab.spawn_env(from, &ttcp, &sa, env).unwrap();
        lab.wait_listening(lh, port).unwrap();
        (s, lab.spawn_env(to, &ttcp, &ra, env).unwrap())
    } else {
        let r = lab.spawn_env(to, &ttcp, &ra, env).unwrap();
        lab.wait_listening(lh, port).unwrap();
        (lab.spawn_env(from, &ttcp, &sa, env).unwrap(), r)
    };
    let (_, rout, rerr) = lab.wait(r, Duration::from_secs(60)).unwrap();
    let (_, sout, serr) = lab.wait(s, Duration::from_secs(60)).unwrap();
    let log = std::fs::read_to_string(lab.dir.join("msrd1.log")).unwrap_or_default();
    let r: RecvReport =
        serde_json::from_str(rout.trim()).unwrap_or_else(|e| panic!("recv: {e}: {rerr}\n{log}"));
    let s: SendReport =
        serde_json::from_str(sout.trim()).unwrap_or_else(|e| panic!("send: {e}: {serr}\n{log}"));
    assert!(
        r.ok && s.ok && r.verified,
        "{:?} {:?}\n{log}",
        r.error,
        s.error
    );
    (s, r)
}

/// The last 25 lines of each of the lab's `files`, for a failure message.
fn tails(lab: &Lab, files: &[&str]) -> String {
    files
        .iter()
        .map(|f| {
            let t = std::fs::read_to_string(lab.dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = t.lines().rev().take(25).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("--- {f}\n{}\n", tail.join("\n"))
        })
        .collect()
}

fn ip_of(a: &str) -> IpAddr {
    a.parse::<SocketAddr>().unwrap().ip()
}

#[test]
fn explicit_mode_over_ipv6_both_ways() {
    let mut lab = lab6("");
    let env = [("ITCP_GATEWAY", gw6())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let fh = fh6(5001);
    let (s, r) = transfer(
        &mut lab,
        (Host::Fh, &["--listen", &fh]),
        (Host::Mh, &["--connect", &fh, "--itcp"]),
        &env,
    );
    assert_eq!(ip_of(&s.peer), IpAddr::V6(addr6::MH), "the FH sees the MH");
    assert_eq!(s.peer, r.local);
    let fh = fh6(5002);
    let (s, r) = transfer(
        &mut lab,
        (Host::Mh, &["--connect", &fh, "--itcp"]),
        (Host::Fh, &["--listen", &fh]),
        &env,
    );
    assert_eq!(r.peer, s.local);
    let sessions = lab.msrd_stats(1).unwrap();
    assert_eq!(sessions.stats.connections_total, 2, "{sessions:?}");
}

#[test]
fn transparent_mode_over_ipv6_both_ways() {
    let mut lab = lab6("[transparent]\nenabled = true\nports = [5001, 5002]\n");
    let fh = fh6(5001);
    let (s, r) = transfer(
        &mut lab,
        (Host::Fh, &["--listen", &fh]),
        (Host::Mh, &["--connect", &fh]),
        &[],
    );
    assert_eq!(s.peer, r.local, "the FH sees exactly the MH's socket");
    let fh = fh6(5002);
    let (s, r) = transfer(
        &mut lab,
        (Host::Mh, &["--connect", &fh]),
        (Host::Fh, &["--listen", &fh]),
        &[],
    );
    assert_eq!(r.peer, s.local);
    let st = lab.msrd_stats(1).unwrap();
    assert_eq!(st.stats.connections_total, 2, "through msrd: {st:?}");
}

#[test]
fn passive_open_over_ipv6() {
    let lab = lab6("");
    let opts = MhOptions::new()
        .gateway(SocketAddr::new(addr6::CELL_GW.into(), 1080))
        .token(Token([9; 16]))
        .connect_timeout(Duration::from_secs(5));
    let (tx, rx) = std::sync::mpsc::channel();
    let ns = lab.ns(Host::Mh);
    let mh = std::thread::spawn(move || {
        in_netns(&ns, || {
            let l = ItcpListener::bind_with(&opts, 6000)?;
            tx.send(l.local_addr()?).unwrap();
            let (mut s, peer) = l.accept()?;
            let mut msg = String::new();
            s.read_to_string(&mut msg)?;
            s.write_all(format!("ack {msg}").as_bytes())?;
            Ok((peer, msg))
        })
        .unwrap()
    });
    let bound = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(bound, SocketAddr::new(addr6::MH.into(), 6000));
    let local = in_netns(&lab.ns(Host::Fh), || {
        let mut s = TcpStream::connect_timeout(&bound, Duration::from_secs(5))?;
        s.write_all(b"hello over v6")?;
        s.shutdown(Shutdown::Write)?;
        let mut back = String::new();
        s.read_to_string(&mut back)?;
        assert_eq!(back, "ack hello over v6");
        s.local_addr()
    })
    .unwrap();
    let (peer, msg) = mh.join().unwrap();
    assert_eq!(msg, "hello over v6");
    assert_eq!(peer, local, "the MH learns the FH's IPv6 address");
}

/// Explicit connections of MH 1 at MSR `k`: (IPv4, IPv6).
fn explicit_at(lab: &Lab, k: usize) -> (usize, usize) {
    let s = lab.msrd_sessions(k).unwrap_or_default();
    let n = |v6: bool| {
        s.iter()
            .filter(|s| s.kind == itcp_proto::control::Kind::Connect && s.mh.is_ipv6() == v6)
            .count()
    };
    (n(false), n(true))
}

/// Two MSRs with handoff, a dual-stack MH with its agent (fast beacons), RSTs counted
/// at the FH and the MH.
fn dual_stack_mobile_lab(seed: u64) -> Lab {
    dual_stack_mobile_lab_with(seed, "")
}

/// [`dual_stack_mobile_lab`] with `extra` in msrd's configuration.
fn dual_stack_mobile_lab_with(seed: u64, extra: &str) -> Lab {
    let mut cfg = LabConfig::clean(2, seed);
    cfg.ipv6 = true;
    let mut lab = Lab::new(cfg).unwrap();
    lab.start_itcp_mobility(
        &format!("[beacon]\ninterval_ms = 200\nlifetime_ms = 600\n{extra}"),
        &["--hysteresis-ms", "0", "--beacon-interval-ms", "200"],
    )
    .unwrap();
    lab.watch_rsts(Host::Fh).unwrap();
    lab.watch_rsts(Host::Mh).unwrap();
    lab
}

#[test]
fn a_dual_stack_agent_moves_its_ipv4_and_ipv6_connections_together() {
    let mut lab = dual_stack_mobile_lab(67);
    let ttcp = bin_path("ttcp");
    let (fh4, fh6) = (
        SocketAddr::from((itcp_testbed::lab::addr::FH, 5001)).to_string(),
        fh6(5002),
    );
    let s4 = lab
        .spawn(
            Host::Fh,
            &ttcp,
            &["send", "--listen", &fh4, "--duration", "6"],
        )
        .unwrap();
    let s6 = lab
        .spawn(
            Host::Fh,
            &ttcp,
            &["send", "--listen", &fh6, "--duration", "6"],
        )
        .unwrap();
    lab.wait_listening(Host::Fh, 5001).unwrap();
    lab.wait_listening(Host::Fh, 5002).unwrap();
    let g4 = SocketAddr::from((itcp_testbed::lab::addr::CELL_GW, 1080)).to_string();
    let r4 = lab
        .spawn_env(
            Host::Mh,
            &ttcp,
            &["recv", "--connect", &fh4, "--itcp"],
            &[("ITCP_GATEWAY", &g4)],
        )
        .unwrap();
    let g6 = gw6();
    let r6 = lab
        .spawn_env(
            Host::Mh,
            &ttcp,
            &["recv", "--connect", &fh6, "--itcp"],
            &[("ITCP_GATEWAY", &g6)],
        )
        .unwrap();
    let log = |lab: &Lab| {
        tails(
            lab,
            &["msrd1.log", "msrd2.log", "agent.events", "agent.log"],
        )
    };
    let wait_for = |lab: &Lab, k: usize, what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(6);
        while explicit_at(lab, k) != (1, 1) {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: at MSR{k} {:?}\n{}",
                explicit_at(lab, k),
                log(lab)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(&lab, 1, "before moving");
    // A proxied neighbour advertisement answering a multicast solicitation (the GW
    // resolving the MH's IPv6 address) goes out at once, not up to 0.8 s later.
    for k in 1..=2 {
        let o = lab
            .run(
                Host::Msr(k),
                "cat",
                &["/proc/sys/net/ipv6/neigh/lan0/proxy_delay"],
            )
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0", "MSR{k}");
    }
    // MSR2 has never heard from the MH: it learns the MH's link-layer addresses from
    // the frames of its greetings, with no ARP request or neighbour solicitation.
    let resolutions = format!(
        "table arp arpwatch {{\n  counter who {{ }}\n  chain o {{ type filter hook output priority 0; \
         arp operation request arp daddr ip {} counter name \"who\"; }}\n}}\n\
         table ip6 nswatch {{\n  counter who {{ }}\n  chain o {{ type filter hook output priority 0; \
         ip6 daddr {} icmpv6 type nd-neighbor-solicit counter name \"who\"; }}\n}}\n",
        itcp_testbed::lab::addr::MH,
        solicited_node(addr6::MH)
    );
    lab.nft(Host::Msr(2), &resolutions).unwrap();
    let mut at = 1;
    for n in 1..=2 {
        let to = 3 - at;
        lab.assoc(&[]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        lab.assoc(&[to]).unwrap();
        wait_for(&lab, to, &format!("move {n}"));
        if n == 1 {
            let mut text = String::new();
            for (family, table) in [("arp", "arpwatch"), ("ip6", "nswatch")] {
                let o = lab
                    .run(
                        Host::Msr(2),
                        "nft",
                        &["list", "counter", family, table, "who"],
                    )
                    .unwrap();
                text += &String::from_utf8_lossy(&o.stdout);
            }
            assert_eq!(
                text.matches("packets 0 ").count(),
                2,
                "MSR2 resolved the MH's addresses on its first visit: {text}\n{}",
                log(&lab)
            );
        }
        at = to;
        std::thread::sleep(Duration::from_millis(500));
    }
    for (what, idx) in [("IPv4", r4), ("IPv6", r6)] {
        let (_, out, err) = lab.wait(idx, Duration::from_secs(30)).unwrap();
        let r: RecvReport = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{what} receiver: {e}: {err}\n{}", log(&lab)));
        assert!(r.ok && r.verified && r.bytes > 0, "{what}: {:?}", r.error);
    }
    let _ = (
        lab.wait(s4, Duration::from_secs(10)),
        lab.wait(s6, Duration::from_secs(10)),
    );
    let rsts = (lab.rsts(Host::Fh).unwrap(), lab.rsts(Host::Mh).unwrap());
    assert_eq!(rsts, ((0, 0), (0, 0)), "RSTs at FH and MH\n{}", log(&lab));
    // The agent reports its IPv6 address's moves too (its events are otherwise the
    // IPv4 address's): one per move, to the MSR it moved to.
    let other: Vec<(String, String)> = lab
        .agent_events()
        .iter()
        .filter(|e| e["event"] == "other_address" && e["mh"] == addr6::MH.to_string())
        .map(|e| {
            (
                e["msr"].as_str().unwrap_or("").into(),
                e["status"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    let moves: Vec<_> = other.iter().filter(|(_, s)| s == "moved").collect();
    assert_eq!(
        moves.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(),
        ["msr2", "msr1"],
        "the agent's reports for its IPv6 address: {other:?}"
    );
    // Each move: one handoff per address, both moved.
    let recs = lab.handoff_records(2);
    for ip in [
        IpAddr::V4(itcp_testbed::lab::addr::MH),
        IpAddr::V6(addr6::MH),
    ] {
        assert!(
            recs.iter()
                .any(|r| r.mh == ip && r.outcome == itcp_handoff::log::Outcome::Moved),
            "no move of {ip} into MSR2: {recs:?}"
        );
    }
}

/// The solicited-node multicast address of `a` (RFC 4291 §2.7.1).
fn solicited_node(a: std::net::Ipv6Addr) -> std::net::Ipv6Addr {
    let o = a.octets();
    std::net::Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// Sessions of `kind` for the MH's IPv6 address at MSR `k`.
fn v6_sessions_at(lab: &Lab, k: usize, kind: itcp_proto::control::Kind) -> usize {
    lab.msrd_sessions(k)
        .unwrap_or_default()
        .iter()
        .filter(|s| s.kind == kind && s.mh.ip() == IpAddr::V6(addr6::MH))
        .count()
}

/// Passive open over IPv6 through a handoff: the MH listens through MSR1 (mh-lib over
/// IPv6), the FH connects to the MH's IPv6 address and streams while the MH moves to
/// MSR2; the listener moves too, so a second connection after the move is accepted
/// through MSR2. Every byte is checked, and no RST is seen at FH or MH. This failed
/// while the agent pointed only its IPv4 gateway at the new MSR: the MH's IPv6 gateway
/// entry still named the old MSR's MAC, so its answers to the new MSR's neighbour
/// solicitations went to the old cell and the moved connection carried nothing.
#[test]
fn passive_open_over_ipv6_moves_with_the_mh() {
    use itcp_proto::control::Kind;
    let mut lab = dual_stack_mobile_lab(69);
    // A dual-stack MH's app also has an IPv4 connection through I-TCP.
    let ttcp = bin_path("ttcp");
    let fh4 = SocketAddr::from((itcp_testbed::lab::addr::FH, 5001)).to_string();
    let s4 = lab
        .spawn(
            Host::Fh,
            &ttcp,
            &["send", "--listen", &fh4, "--duration", "5"],
        )
        .unwrap();
    lab.wait_listening(Host::Fh, 5001).unwrap();
    let r4 = lab
        .spawn(Host::Mh, &ttcp, &["recv", "--connect", &fh4, "--itcp"])
        .unwrap();
    let opts = MhOptions::new()
        .gateway(SocketAddr::new(addr6::CELL_GW.into(), 1080))
        .token_file(lab.dir.join("mh-token"))
        .connect_timeout(Duration::from_secs(5));
    let (tx, rx) = std::sync::mpsc::channel();
    let ns = lab.ns(Host::Mh);
    // The MH: accepts two connections; each must carry bytes i % 251, and is answered
    // with how many arrived intact.
    let mh = std::thread::spawn(move || {
        in_netns(&ns, || {
            let l = ItcpListener::bind_with(&opts, 6001)?;
            tx.send(l.local_addr()?).unwrap();
            let mut got = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = l.accept()?;
                let mut b = Vec::new();
                s.read_to_end(&mut b)?;
                let intact = b.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8);
                s.write_all(format!("{} {intact}", b.len()).as_bytes())?;
                got.push((b.len(), intact));
            }
            Ok(got)
        })
    });
    let bound = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(bound, SocketAddr::new(addr6::MH.into(), 6001));
    let diag = |lab: &Lab| {
        tails(lab, &["msrd1.log", "msrd2.log", "agent.events"])
            + &[
                (Host::Gw, "ip", vec!["-6", "neigh"]),
                (Host::Gw, "ip", vec!["-6", "route"]),
                (Host::Msr(1), "ip", vec!["-6", "neigh", "show", "proxy"]),
                (Host::Msr(1), "ss", vec!["-tan6"]),
                (Host::Fh, "ss", vec!["-tan6"]),
            ]
            .iter()
            .map(|(h, p, a)| {
                let o = lab
                    .run(*h, p, a)
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
                format!("--- {h:?} {p} {a:?}\n{}\n", o.unwrap_or_default())
            })
            .collect::<String>()
    };
    let wait_listener_at = |lab: &Lab, k: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(6);
        while v6_sessions_at(lab, k, Kind::Listen) != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the MH's IPv6 listener is not at MSR{k}\n{}",
                diag(lab)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_listener_at(&lab, 1);
    // Sends `chunks` × 8 KiB of the pattern, `pause` apart, then reads the answer.
    let send = move |chunks: usize, pause: Duration| {
        move || -> std::io::Result<(usize, String)> {
            let mut s = TcpStream::connect_timeout(&bound, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(15)))?;
            s.set_write_timeout(Some(Duration::from_secs(15)))?;
            let mut n = 0usize;
            for _ in 0..chunks {
                let c: Vec<u8> = (n..n + 8192).map(|i| (i % 251) as u8).collect();
                s.write_all(&c)?;
                n += c.len();
                std::thread::sleep(pause);
            }
            s.shutdown(Shutdown::Write)?;
            let mut back = String::new();
            s.read_to_string(&mut back)?;
            Ok((n, back))
        }
    };
    // The GW resolves the MH's address by a multicast solicitation, which MSR1's
    // proxy entry answers: at once, not up to 0.8 s later (the kernel's default
    // proxy_delay, which msrd zeroes for IPv6 as for ARP).
    let delay = lab
        .run(
            Host::Msr(1),
            "cat",
            &["/proc/sys/net/ipv6/neigh/lan0/proxy_delay"],
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&delay.stdout).trim(), "0");
    let fh_ns = lab.ns(Host::Fh);
    let first = {
        let (ns, f) = (fh_ns.clone(), send(60, Duration::from_millis(50)));
        std::thread::spawn(move || in_netns(&ns, f))
    };
    let t0 = std::time::Instant::now();
    while v6_sessions_at(&lab, 1, Kind::Accept) != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{:?}\n{}",
            lab.msrd_sessions(1),
            diag(&lab)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let accepted_ms = t0.elapsed().as_secs_f64() * 1000.0;
    eprintln!("the FH's first connection was accepted through MSR1 after {accepted_ms:.0} ms");
    std::thread::sleep(Duration::from_millis(300));
    lab.assoc(&[]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    lab.assoc(&[2]).unwrap();
    wait_listener_at(&lab, 2);
    let (n, back) = first
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("the first connection: {e}\n{}", diag(&lab)));
    assert_eq!(
        back,
        format!("{n} true"),
        "the first connection\n{}",
        diag(&lab)
    );
    // Accepted through MSR2 now.
    let (n2, back2) = in_netns(&fh_ns, send(16, Duration::ZERO)).unwrap();
    assert_eq!(
        back2,
        format!("{n2} true"),
        "after the move\n{}",
        diag(&lab)
    );
    let got = mh.join().unwrap().unwrap();
    assert_eq!(got, vec![(n, true), (n2, true)]);
    let (_, out, err) = lab.wait(r4, Duration::from_secs(30)).unwrap();
    let r: RecvReport = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("IPv4 receiver: {e}: {err}\n{}", diag(&lab)));
    assert!(r.ok && r.verified && r.bytes > 0, "IPv4: {:?}", r.error);
    let _ = lab.wait(s4, Duration::from_secs(10));
    let rsts = (lab.rsts(Host::Fh).unwrap(), lab.rsts(Host::Mh).unwrap());
    assert_eq!(rsts, ((0, 0), (0, 0)), "RSTs at FH and MH\n{}", diag(&lab));
    let moved = lab
        .handoff_records(2)
        .into_iter()
        .any(|r| r.mh == IpAddr::V6(addr6::MH) && r.outcome == itcp_handoff::log::Outcome::Moved);
    assert!(
        moved,
        "no move of the MH's IPv6 address into MSR2\n{}",
        diag(&lab)
    );
}

/// A dual-stack mobile lab intercepting port 5009, with echo servers on the FH's IPv6
/// address at 5009 (intercepted) and 5006 (for explicit connections).
fn echo_lab6(seed: u64) -> Lab {
    let mut lab =
        dual_stack_mobile_lab_with(seed, "[transparent]\nenabled = true\nports = [5009]\n");
    let ttcp = bin_path("ttcp");
    for port in [5009, 5006] {
        lab.spawn(Host::Fh, &ttcp, &["echo", "--listen", &fh6(port)])
            .unwrap();
        lab.wait_listening(Host::Fh, port).unwrap();
    }
    lab
}

/// Starts `ttcp rr` on the MH to the FH's IPv6 port `port`: `n` exchanges of 100 bytes,
/// `interval_ms` apart, through I-TCP when `itcp`. Returns its process index.
fn spawn_rr6(lab: &mut Lab, port: u16, n: usize, interval_ms: u64, itcp: bool) -> usize {
    let (to, n, interval) = (fh6(port), n.to_string(), interval_ms.to_string());
    let mut a = vec!["rr", "--connect", &to, "--count", &n, "--size", "100"];
    a.extend(["--interval-ms", &interval]);
    if itcp {
        a.push("--itcp");
    }
    lab.spawn_env(Host::Mh, bin_path("ttcp"), &a, &[("ITCP_GATEWAY", &gw6())])
        .unwrap()
}

/// Keeps the MH's segments other than SYNs to the FH's IPv6 port 5009 from leaving
/// (table `air`): a handshake's ACK is lost, so it stays half-open at the MSR.
fn lose_acks_to_5009(lab: &Lab) {
    let rule = format!(
        "table inet air {{\n  chain c {{ type filter hook output priority 0; ip6 daddr {} tcp dport 5009 tcp flags & syn == 0 drop; }}\n}}\n",
        addr6::FH
    );
    lab.nft(Host::Mh, &rule).unwrap();
}

/// Each `ttcp rr` of `runs` (index, what, exchanges) completed all its exchanges, and
/// neither the FH nor the MH saw an RST; `log` for the failure messages.
fn assert_rrs_done_without_rsts(
    lab: &mut Lab,
    runs: &[(usize, &str, u64)],
    log: impl Fn(&Lab) -> String,
) {
    for &(idx, what, n) in runs {
        let (_, out, err) = lab.wait(idx, Duration::from_secs(30)).unwrap();
        let r: itcp_testbed::ttcp::RrReport = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{what} rr: {e}: {err}\n{}", log(lab)));
        assert!(r.ok && r.count == n, "{what}: {r:?}\n{}", log(lab));
    }
    let rsts = (lab.rsts(Host::Fh).unwrap(), lab.rsts(Host::Mh).unwrap());
    assert_eq!(rsts, ((0, 0), (0, 0)), "RSTs at FH and MH\n{}", log(lab));
}

/// A TCP handshake over IPv6 still half-open at the old MSR when the MH leaves its cell
/// (our SYN-ACK reached it, its ACK was lost in the air) is completed there with the
/// MH's ACK replayed, and moves (handoff.rs has the IPv4 tests, of both losses).
#[test]
fn an_ipv6_handshake_half_open_when_the_mh_leaves_its_cell_moves_with_it() {
    let mut lab = echo_lab6(71);
    // An I-TCP connection over IPv6 gives MSR1 the session token of the MH's IPv6
    // address.
    let explicit = spawn_rr6(&mut lab, 5006, 100, 50, true);
    std::thread::sleep(Duration::from_millis(300));
    lose_acks_to_5009(&lab);
    let transparent = spawn_rr6(&mut lab, 5009, 5, 50, false);
    std::thread::sleep(Duration::from_millis(150));
    lab.assoc(&[]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    lab.assoc(&[2]).unwrap();
    let log = |lab: &Lab| tails(lab, &["msrd1.log", "msrd2.log", "agent.events"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let moved6 = |lab: &Lab| {
        lab.handoff_records(2)
            .iter()
            .any(|r| r.mh == IpAddr::V6(addr6::MH) && !r.connections.is_empty())
    };
    while !moved6(&lab) {
        assert!(
            std::time::Instant::now() < deadline,
            "the MH's IPv6 connection did not move\n{}",
            log(&lab)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    lab.nft(Host::Mh, "delete table inet air\n").unwrap();
    let runs = [
        (transparent, "IPv6 transparent", 5),
        (explicit, "IPv6 explicit", 100),
    ];
    assert_rrs_done_without_rsts(&mut lab, &runs, log);
}

/// A dual-stack MH whose IPv4 address has nothing to move is handed over at once,
/// while its IPv6 address's move takes longer (here the old MSR waits for a handshake
/// half-open there). Until the new MSR holds the IPv6 address, none of the MH's IPv6
/// segments may reach it: it knows none of those connections, and its SOCKS port
/// answers a segment of one with an RST. So each family's gateway follows its own
/// address's move.
#[test]
fn each_family_s_gateway_follows_its_own_address_s_move() {
    use itcp_handoff::log::{Outcome, Record, Role};
    let mut lab = echo_lab6(73);
    // Four explicit IPv6 connections exchanging every 20 ms: at any moment one of them
    // sends a request. Registration gives MSR1 the token of the MH's IPv4 address,
    // which has no connection: its move needs no wait.
    let explicit: Vec<usize> = (0..4)
        .map(|_| spawn_rr6(&mut lab, 5006, 150, 20, true))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while explicit_at(&lab, 1).1 < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "no connections at MSR1"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // MSR1 waits for the lost ACK (then replays it) before it freezes the MH's IPv6
    // connections.
    lose_acks_to_5009(&lab);
    let transparent = spawn_rr6(&mut lab, 5009, 5, 50, false);
    std::thread::sleep(Duration::from_millis(150));
    lab.assoc(&[2]).unwrap();
    let log = |lab: &Lab| tails(lab, &["msrd1.log", "msrd2.log", "agent.events"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let new_side = |lab: &Lab, mh: IpAddr| {
        lab.handoff_records(2)
            .into_iter()
            .find(|r| r.mh == mh && r.role == Role::New && r.outcome == Outcome::Moved)
    };
    let moved6 = loop {
        if let Some(r) = new_side(&lab, IpAddr::V6(addr6::MH)) {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the MH's IPv6 connections did not move\n{}",
            log(&lab)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    lab.nft(Host::Mh, "delete table inet air\n").unwrap();
    // The premise: the IPv4 address moved well before the IPv6 one.
    let mh4 = IpAddr::V4(itcp_testbed::lab::addr::MH);
    let moved4 = new_side(&lab, mh4).unwrap_or_else(|| panic!("no IPv4 move\n{}", log(&lab)));
    let ended = |r: &Record| {
        let p = &r.phases;
        [p.greeting, p.mh_in, p.restored, p.resumed, p.acknowledged]
            .into_iter()
            .flatten()
            .max()
    };
    let (e4, e6) = (ended(&moved4).unwrap(), ended(&moved6).unwrap());
    assert!(
        e6 > e4 + 100_000 && !moved6.connections.is_empty(),
        "the IPv6 move ended {} µs after the IPv4 one\n{}",
        e6 as i64 - e4 as i64,
        log(&lab)
    );
    let mut runs: Vec<(usize, &str, u64)> = explicit
        .into_iter()
        .map(|i| (i, "IPv6 explicit", 150))
        .collect();
    runs.push((transparent, "IPv6 transparent", 5));
    assert_rrs_done_without_rsts(&mut lab, &runs, log);
}
