//! End-to-end tests of msrd's split connections on the lab: real namespaces, real
//! nftables TPROXY and transparent sockets, real msrd and ttcp processes, and mh-lib
//! driven from threads inside the MH's namespace. Needs root.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use itcp_mh::{ItcpListener, ItcpStream, MhOptions, Token};
use itcp_testbed::lab::{addr, bin_path, Host, Lab, LabConfig};
use itcp_testbed::sys::in_netns;
use itcp_testbed::ttcp::{RecvReport, SendReport};

/// A lab (no emulated impairments) with msrd running on MSR1.
fn lab_with_msrd(extra: &str) -> Lab {
    let mut lab = Lab::new(LabConfig::default()).unwrap();
    let cfg = lab.msrd_config(1, extra);
    lab.start_msrd(1, &cfg).unwrap();
    lab
}

fn mh_opts() -> MhOptions {
    MhOptions::new()
        .gateway(SocketAddr::from((addr::CELL_GW, 1080)))
        .token(Token([7; 16]))
        .connect_timeout(Duration::from_secs(5))
}

fn fh(port: u16) -> SocketAddr {
    SocketAddr::from((addr::FH, port))
}

/// A listener on the FH, bound before anyone connects (no start-up race).
/// An echo server at the FH on `port`, a thread per connection, for the test's life.
fn fh_echo(lab: &Lab, port: u16) {
    let echo = fh_listen(lab, port);
    std::thread::spawn(move || {
        for c in echo.incoming() {
            let Ok(mut c) = c else { break };
            std::thread::spawn(move || {
                let mut b = [0u8; 64];
                while let Ok(n) = c.read(&mut b) {
                    if n == 0 || c.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

fn fh_listen(lab: &Lab, port: u16) -> TcpListener {
    in_netns(&lab.ns(Host::Fh), || TcpListener::bind(fh(port))).unwrap()
}

/// Runs `f` on a thread inside host `h`'s namespace.
fn on<T: Send + 'static>(
    lab: &Lab,
    h: Host,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let ns = lab.ns(h);
    std::thread::spawn(move || in_netns(&ns, || Ok(f())).unwrap())
}

/// ttcp sender in `from`, receiver in `to`; returns both reports.
/// Waits until the `--listen ADDR:PORT` of `args` is bound in `h`.
fn wait_listening(lab: &Lab, h: Host, args: &[&str]) {
    if let Some(port) = args
        .iter()
        .position(|a| *a == "--listen")
        .and_then(|i| args.get(i + 1))
        .and_then(|a| a.rsplit(':').next()?.parse().ok())
    {
        lab.wait_listening(h, port).unwrap();
    }
}

fn ttcp_pair(
    lab: &mut Lab,
    send: (Host, &[&str]),
    recv: (Host, &[&str]),
    bytes: &str,
) -> (SendReport, RecvReport) {
    let ttcp = bin_path("ttcp");
    let mut sa = vec!["send", "--bytes", bytes];
    sa.extend_from_slice(send.1);
    let mut ra = vec!["recv", "--bytes", bytes];
    ra.extend_from_slice(recv.1);
    // Listener first, and bound before the other side connects: a connection through
    // msrd in transparent mode is accepted by msrd at once, and if the FH then refuses,
    // the MH's ttcp sees a reset rather than a refused connect it would retry.
    let (s_idx, r_idx) = if sa.contains(&"--listen") {
        let s = lab.spawn(send.0, &ttcp, &sa).unwrap();
        wait_listening(lab, send.0, send.1);
        (s, lab.spawn(recv.0, &ttcp, &ra).unwrap())
    } else {
        let r = lab.spawn(recv.0, &ttcp, &ra).unwrap();
        wait_listening(lab, recv.0, recv.1);
        (lab.spawn(send.0, &ttcp, &sa).unwrap(), r)
    };
    let (_, rout, rerr) = lab.wait(r_idx, Duration::from_secs(60)).unwrap();
    let (_, sout, serr) = lab.wait(s_idx, Duration::from_secs(60)).unwrap();
    let log = || std::fs::read_to_string(lab.dir.join("msrd1.log")).unwrap_or_default();
    let r: RecvReport = serde_json::from_str(rout.trim())
        .unwrap_or_else(|e| panic!("recv: {e}: {rerr}\nmsrd log:\n{}", log()));
    let s: SendReport = serde_json::from_str(sout.trim()).unwrap_or_else(|e| {
        panic!(
            "send: {e}: {serr}\nreceiver: {}\nmsrd log:\n{}",
            rout.trim(),
            log()
        )
    });
    (s, r)
}

fn port_of(a: &str) -> u16 {
    a.parse::<SocketAddr>().unwrap().port()
}

/// A start with the default configuration under a shell's fd limit (msrd raises the
/// soft limit to the hard one) warns of nothing: the default connection limit is a
/// ceiling, lowered quietly to what the fd limit serves.
#[test]
fn msrd_starts_with_the_default_limits_without_a_warning() {
    let lab = lab_with_msrd("");
    let log = std::fs::read_to_string(lab.dir.join("msrd1.log")).unwrap();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
    assert!(warnings.is_empty(), "msrd warned at start: {warnings:#?}");
    assert!(log.contains("msrd ready"), "{log}");
}

#[test]
fn explicit_mode_bulk_both_ways_fh_sees_the_mh() {
    let mut lab = lab_with_msrd("");
    // FH → MH: the MH opens the I-TCP connection, the FH sends.
    let (s, r) = ttcp_pair(
        &mut lab,
        (Host::Fh, &["--listen", "10.0.0.1:5001"]),
        (Host::Mh, &["--connect", "10.0.0.1:5001", "--itcp"]),
        "20M",
    );
    assert!(r.ok && s.ok, "{:?} {:?}", r.error, s.error);
    let seen: SocketAddr = s.peer.parse().unwrap();
    assert_eq!(
        seen.ip(),
        std::net::IpAddr::V4(addr::MH),
        "FH must see the MH's address"
    );
    assert_eq!(
        seen.port(),
        port_of(&r.local),
        "FH must see the MH's own port"
    );
    // MH → FH.
    let (s, r) = ttcp_pair(
        &mut lab,
        (Host::Mh, &["--connect", "10.0.0.1:5002", "--itcp"]),
        (Host::Fh, &["--listen", "10.0.0.1:5002"]),
        "20M",
    );
    assert!(r.ok && s.ok, "{:?} {:?}", r.error, s.error);
    let seen: SocketAddr = r.peer.parse().unwrap();
    assert_eq!(seen, SocketAddr::new(addr::MH.into(), port_of(&s.local)));
}

#[test]
fn transparent_mode_bulk_both_ways_for_unmodified_apps() {
    let mut lab = lab_with_msrd("[transparent]\nenabled = true\nports = [5001, 5002]\n");
    let (s, r) = ttcp_pair(
        &mut lab,
        (Host::Fh, &["--listen", "10.0.0.1:5001"]),
        (Host::Mh, &["--connect", "10.0.0.1:5001"]),
        "20M",
    );
    assert!(r.ok && s.ok, "{:?} {:?}", r.error, s.error);
    assert_eq!(s.peer, r.local, "FH sees exactly the MH's socket address");
    let (s, r) = ttcp_pair(
        &mut lab,
        (Host::Mh, &["--connect", "10.0.0.1:5002"]),
        (Host::Fh, &["--listen", "10.0.0.1:5002"]),
        "20M",
    );
    assert!(r.ok && s.ok, "{:?} {:?}", r.error, s.error);
    assert_eq!(r.peer, s.local);
    // It really went through msrd, as a transparent session.
    let st = lab.msrd_stats(1).unwrap();
    assert_eq!(st.stats.connections_total, 2, "{st:?}");
    assert!(st.stats.bytes_up >= 20 << 20);
}

#[test]
fn passive_open_accepts_several_connections_on_one_listen() {
    let lab = lab_with_msrd("");
    let (tx, rx) = std::sync::mpsc::channel();
    let mh = on(&lab, Host::Mh, move || {
        let l = ItcpListener::bind_with(&mh_opts(), 6000).unwrap();
        tx.send(l.local_addr().unwrap()).unwrap();
        let mut peers = Vec::new();
        for _ in 0..3 {
            let (mut s, peer) = l.accept().unwrap();
            let mut msg = String::new();
            s.read_to_string(&mut msg).unwrap();
            s.write_all(format!("ack {msg}").as_bytes()).unwrap();
            peers.push(peer);
        }
        peers
    });
    let bound = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(bound, SocketAddr::from((addr::MH, 6000)));
    let fh_side = on(&lab, Host::Fh, move || {
        let mut locals = Vec::new();
        for i in 0..3 {
            let mut s = TcpStream::connect(bound).unwrap();
            s.write_all(format!("hello {i}").as_bytes()).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let mut back = String::new();
            s.read_to_string(&mut back).unwrap();
            assert_eq!(back, format!("ack hello {i}"));
            locals.push(s.local_addr().unwrap());
        }
        locals
    });
    let locals = fh_side.join().unwrap();
    let peers = mh.join().unwrap();
    assert_eq!(peers, locals, "the MH learns each FH peer address");
}

#[test]
fn curl_socks5_fetches_from_the_fh() {
    let lab = lab_with_msrd("");
    let l = fh_listen(&lab, 8080);
    let server = on(&lab, Host::Fh, move || {
        let (mut s, peer) = l.accept().unwrap();
        let mut req = [0u8; 1024];
        let _ = s.read(&mut req).unwrap();
        s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 17\r\n\r\nhello from the FH")
            .unwrap();
        peer
    });
    let out = lab
        .run(
            Host::Mh,
            "curl",
            &[
                "-sS",
                "--max-time",
                "10",
                "--socks5",
                "10.2.0.1:1080",
                "http://10.0.0.1:8080/",
            ],
        )
        .expect("curl must be installed (scripts/setup.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from the FH");
    assert_eq!(server.join().unwrap().ip(), std::net::IpAddr::V4(addr::MH));
}

#[test]
fn half_close_keeps_the_other_direction_flowing() {
    let lab = lab_with_msrd("");
    let l = fh_listen(&lab, 7001);
    let server = on(&lab, Host::Fh, move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap(); // ends with the MH's FIN
                                          // The FH→MH direction still works after the MH half-closed.
        for _ in 0..100 {
            s.write_all(&[b'x'; 1000]).unwrap();
        }
        s.write_all(format!("got {} bytes", got.len()).as_bytes())
            .unwrap();
    });
    let reply = on(&lab, Host::Mh, || {
        let mut s = ItcpStream::connect_with(&mh_opts(), fh(7001)).unwrap();
        s.write_all(&vec![1u8; 100_000]).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).unwrap();
        back
    })
    .join()
    .unwrap();
    server.join().unwrap();
    assert_eq!(reply.len(), 100_000 + "got 100000 bytes".len());
    assert!(reply.ends_with(b"got 100000 bytes"));
}

fn abort(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setting SO_LINGER on an open socket.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

#[test]
fn a_reset_on_one_side_becomes_a_reset_on_the_other() {
    let lab = lab_with_msrd("");
    // FH aborts → the MH sees a reset.
    let l = fh_listen(&lab, 7002);
    let server = on(&lab, Host::Fh, move || {
        let (s, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        abort(&s);
        drop(s);
        // Then the other way round: the MH aborts, the FH sees a reset.
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 16];
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.read(&mut buf).map(|_| ()).unwrap_err().kind()
    });
    let mh_saw = on(&lab, Host::Mh, || {
        let mut s = ItcpStream::connect_with(&mh_opts(), fh(7002)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 16];
        let first = s.read(&mut buf).map(|_| ()).unwrap_err().kind();
        let s2 = ItcpStream::connect_with(&mh_opts(), fh(7002))
            .unwrap()
            .into_inner();
        std::thread::sleep(Duration::from_millis(200));
        abort(&s2);
        drop(s2);
        first
    })
    .join()
    .unwrap();
    assert_eq!(mh_saw, ErrorKind::ConnectionReset);
    assert_eq!(server.join().unwrap(), ErrorKind::ConnectionReset);
}

#[test]
fn refused_and_unreachable_become_the_right_errors() {
    let lab = lab_with_msrd("");
    let kinds = on(&lab, Host::Mh, || {
        let refused = ItcpStream::connect_with(&mh_opts(), fh(9)).unwrap_err();
        // Nothing routes 10.9.9.9: the GW answers with ICMP unreachable.
        let unreachable =
            ItcpStream::connect_with(&mh_opts(), SocketAddr::from(([10, 9, 9, 9], 80)))
                .unwrap_err();
        (refused, unreachable)
    })
    .join()
    .unwrap();
    assert_eq!(kinds.0.kind(), ErrorKind::ConnectionRefused, "{}", kinds.0);
    assert!(kinds.0.to_string().contains("10.0.0.1:9"), "{}", kinds.0);
    assert!(
        matches!(
            kinds.1.kind(),
            ErrorKind::NetworkUnreachable | ErrorKind::HostUnreachable
        ),
        "{:?}: {}",
        kinds.1.kind(),
        kinds.1
    );
}

#[test]
fn an_mh_outside_the_prefixes_is_refused() {
    let mut lab = Lab::new(LabConfig::default()).unwrap();
    let cfg = lab
        .msrd_config(1, "")
        .replace("10.2.0.0/24", "10.2.0.200/32");
    lab.start_msrd(1, &cfg).unwrap();
    let e = on(&lab, Host::Mh, || {
        ItcpStream::connect_with(&mh_opts(), fh(5001)).unwrap_err()
    })
    .join()
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    let st = lab.msrd_stats(1).unwrap();
    assert_eq!(st.stats.refused_not_mh, 1);
}

#[test]
fn malformed_requests_get_an_error_reply_and_others_are_still_served() {
    let lab = lab_with_msrd("");
    let l = fh_listen(&lab, 7003);
    let server = on(&lab, Host::Fh, move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(b"still here").unwrap();
    });
    let replies = on(&lab, Host::Mh, || {
        let gw = SocketAddr::from((addr::CELL_GW, 1080));
        let exchange = |bytes: &[u8]| {
            let mut s = TcpStream::connect(gw).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(bytes).unwrap();
            let mut r = Vec::new();
            let _ = s.read_to_end(&mut r);
            r
        };
        let http = exchange(b"GET / HTTP/1.0\r\n\r\n");
        // Greeting, then a request with a non-zero reserved byte.
        let reserved = exchange(&[5, 1, 0, 5, 1, 7, 1, 10, 0, 0, 1, 0, 80]);
        // Unknown command 0x09.
        let unknown = exchange(&[5, 1, 0, 5, 9, 0, 1, 10, 0, 0, 1, 0, 80]);
        // Someone well-behaved right after.
        let mut ok = ItcpStream::connect_with(&mh_opts(), fh(7003)).unwrap();
        let mut got = String::new();
        ok.read_to_string(&mut got).unwrap();
        (http, reserved, unknown, got)
    })
    .join()
    .unwrap();
    server.join().unwrap();
    assert_eq!(
        &replies.0[..2],
        &[5, 1],
        "general failure for a non-SOCKS greeting"
    );
    assert_eq!(
        &replies.1[2..4],
        &[5, 1],
        "general failure after method choice 05 00"
    );
    assert_eq!(&replies.2[2..4], &[5, 7], "command not supported");
    assert_eq!(replies.3, "still here");
    let st = lab.msrd_stats(1).unwrap();
    assert_eq!(st.stats.malformed_requests, 3);
}

#[test]
fn itcpctl_shows_live_sessions_and_sigterm_drains() {
    let mut lab = Lab::new(LabConfig::default()).unwrap();
    let cfg = lab.msrd_config(1, "");
    let msrd = lab.start_msrd(1, &cfg).unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let l = fh_listen(&lab, 7004);
    let server = on(&lab, Host::Fh, move || {
        let (mut s, peer) = l.accept().unwrap();
        go_rx.recv().unwrap();
        s.write_all(b"after SIGTERM").unwrap();
        peer
    });
    let (conn_tx, conn_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let client = on(&lab, Host::Mh, move || {
        let mut s = ItcpStream::connect_with(&mh_opts(), fh(7004)).unwrap();
        conn_tx.send(s.local_addr().unwrap()).unwrap();
        done_rx.recv().unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        got
    });
    let _mh_local = conn_rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = lab
        .run(
            Host::Msr(1),
            bin_path("itcpctl").to_str().unwrap(),
            &[
                "--socket",
                lab.msrd_control(1).to_str().unwrap(),
                "sessions",
            ],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("1 session(s)") && text.contains("connect") && text.contains("10.0.0.1:7004"),
        "{text}"
    );
    // Every row says what its connection does, an ordinary one too.
    let row = text.lines().find(|l| l.contains("10.0.0.1:7004")).unwrap();
    assert!(row.trim_end().ends_with("  relaying"), "no state: {text}");
    // SIGTERM: no new connections, but the open one keeps working until it ends.
    lab.terminate(msrd);
    std::thread::sleep(Duration::from_millis(300));
    go_tx.send(()).unwrap();
    done_tx.send(()).unwrap();
    assert_eq!(client.join().unwrap(), "after SIGTERM");
    server.join().unwrap();
    let mut lab = lab;
    let (ok, _, _) = lab.wait(msrd, Duration::from_secs(10)).unwrap();
    assert!(ok, "msrd must exit cleanly after draining");
    // Its interception rules are gone with it.
    let nft = lab.run(Host::Msr(1), "nft", &["list", "tables"]).unwrap();
    assert!(!String::from_utf8_lossy(&nft.stdout).contains("itcp_msrd"));
}

#[test]
fn example_configs_pass_check_config_and_broken_ones_name_the_key() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/examples");
    let mut n = 0;
    for e in std::fs::read_dir(examples).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml")
            && !p.file_name().unwrap().to_string_lossy().starts_with("mh")
        {
            let out = Command::new(bin_path("msrd"))
                .arg("--check-config")
                .arg(&p)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                p.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            n += 1;
        }
    }
    assert!(n >= 2, "expected msrd examples in {examples}");
    let dir = std::env::temp_dir().join(format!("itcp-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (text, key) in [
        (
            "[access]\nmh_prefixes = [\"10.2.0.0/24\"]\nmax_conections = 5\n",
            "max_conections",
        ),
        ("[access]\nmh_prefixes = [\"10.2.0.0/33\"]\n", "mh_prefixes"),
        ("[msr]\ngateway = [\"10.2.0.1\"]\n", "mh_prefixes"),
        (
            "[access]\nmh_prefixes = [\"10.2.0.0/24\"]\n[relay]\npipe_size = \"big\"\n",
            "pipe_size",
        ),
    ] {
        let f = dir.join("bad.toml");
        std::fs::write(&f, text).unwrap();
        let out = Command::new(bin_path("msrd"))
            .arg("--check-config")
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(key) && err.contains("bad.toml"), "{err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `itcp-lab ARGS`, requires success, returns its stdout.
fn itcp_lab(args: &[&str]) -> String {
    let out = Command::new(bin_path("itcp-lab"))
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "itcp-lab {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The benchmark commands must keep working; their figures are not judged here.
#[test]
fn bench_commands_run_smoke() {
    let text = itcp_lab(&["bench", "conns", "--count", "200", "--bytes", "4096"]);
    assert!(
        text.contains("200/200 connections established, 200 intact"),
        "{text}"
    );
    let text = itcp_lab(&["bench", "churn", "--total", "3000", "--concurrency", "200"]);
    assert!(
        text.contains("3000/3000 intact") && text.contains("0 sessions left"),
        "{text}"
    );
    let text = itcp_lab(&["bench", "relay", "--seconds", "1", "--rounds", "1"]);
    for peer in ["direct", "msrd", "HAProxy", "socat"] {
        assert!(text.contains(peer), "{text}");
    }
}

#[test]
fn socks_bind_gets_one_connection_with_two_replies() {
    let lab = lab_with_msrd("");
    let (tx, rx) = std::sync::mpsc::channel::<u16>();
    let mh = on(&lab, Host::Mh, move || {
        let mut s = TcpStream::connect(SocketAddr::from((addr::CELL_GW, 1080))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&[5, 1, 0]).unwrap();
        let mut choice = [0u8; 2];
        s.read_exact(&mut choice).unwrap();
        assert_eq!(choice, [5, 0]);
        // BIND, any expected peer, any port.
        s.write_all(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]).unwrap();
        let mut first = [0u8; 10];
        s.read_exact(&mut first).unwrap();
        assert_eq!(&first[..2], &[5, 0]);
        assert_eq!(
            &first[4..8],
            &addr::MH.octets(),
            "listening on the MH's own address"
        );
        tx.send(u16::from_be_bytes([first[8], first[9]])).unwrap();
        let mut second = [0u8; 10];
        s.read_exact(&mut second).unwrap();
        assert_eq!(&second[..2], &[5, 0]);
        assert_eq!(
            &second[4..8],
            &addr::FH.octets(),
            "the second reply names the peer"
        );
        let mut data = String::new();
        s.read_to_string(&mut data).unwrap();
        data
    });
    let port = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    on(&lab, Host::Fh, move || {
        let mut s = TcpStream::connect(SocketAddr::from((addr::MH, port))).unwrap();
        s.write_all(b"bound and delivered").unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(mh.join().unwrap(), "bound and delivered");
}

/// msrd's flow hold (used by the handoff): while an MH is held, its relayed connection
/// carries nothing and nobody answers with RST; after release it resumes intact.
#[test]
fn a_flow_hold_stalls_the_mh_silently_and_release_resumes_it() {
    let lab = lab_with_msrd("");
    let l = fh_listen(&lab, 7005);
    let sender = on(&lab, Host::Fh, move || {
        let (mut s, _) = l.accept().unwrap();
        for i in 0..300u32 {
            s.write_all(&[(i % 251) as u8; 1000]).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let receiver = on(&lab, Host::Mh, || {
        let mut s = ItcpStream::connect_with(&mh_opts(), fh(7005)).unwrap();
        let (mut got, mut gap, mut last) = (Vec::new(), Duration::ZERO, std::time::Instant::now());
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            gap = gap.max(last.elapsed());
            last = std::time::Instant::now();
            got.extend_from_slice(&buf[..n]);
        }
        (got, gap)
    });
    std::thread::sleep(Duration::from_secs(1));
    let rules = itcp_proxy::intercept::Rules {
        table: "itcp_msrd".into(),
        fwmark: 0x4954,
        route_table: 4954,
        transparent: None,
        detect: None,
        mh_prefixes: vec!["10.2.0.0/24".parse().unwrap()],
        hold_queue: 4954,
        handshake_group: Some(4955),
        cell_guard: None,
    };
    let mh: std::net::IpAddr = addr::MH.into();
    in_netns(&lab.ns(Host::Msr(1)), || rules.hold(mh)).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    in_netns(&lab.ns(Host::Msr(1)), || rules.release(mh)).unwrap();
    sender.join().unwrap();
    let (got, gap) = receiver.join().unwrap();
    assert_eq!(got.len(), 300_000, "every byte arrives after the hold");
    for (i, chunk) in got.chunks(1000).enumerate() {
        assert!(
            chunk.iter().all(|&b| b == (i % 251) as u8),
            "chunk {i} out of order or corrupt"
        );
    }
    assert!(
        gap >= Duration::from_millis(500),
        "the hold must stop the flow, longest gap {gap:?}"
    );
    // Releasing what is not held is fine.
    in_netns(&lab.ns(Host::Msr(1)), || rules.release(mh)).unwrap();
}

/// Open fds and the fd limit of a process.
fn fds_of(pid: u32) -> (usize, usize) {
    let n = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let max = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap();
    (n, max)
}

/// A SOCKS5 CONNECT without authentication from `src`, through the MSR, then an echo
/// of a few bytes: a stock client on another MH.
fn stock_socks_echo(src: std::net::IpAddr, to: SocketAddr) -> std::io::Result<()> {
    use itcp_proto::socks::{self, Addr, Command as Cmd, Method};
    let sock = match src {
        std::net::IpAddr::V4(_) => TcpSocketBuilder::v4()?,
        std::net::IpAddr::V6(_) => TcpSocketBuilder::v6()?,
    };
    let mut s = sock.bind_connect(
        SocketAddr::new(src, 0),
        SocketAddr::from((addr::CELL_GW, 1080)),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = Vec::new();
    socks::encode_greeting(&mut out, &[Method::NO_AUTH]);
    socks::encode_request(&mut out, Cmd::Connect, &Addr::Ip(to)).unwrap();
    s.write_all(&out)?;
    let mut buf = vec![0u8; 2 + 10];
    s.read_exact(&mut buf)?;
    if buf[1] != 0 || buf[3] != 0 {
        return Err(std::io::Error::other(format!("refused: {buf:?}")));
    }
    s.write_all(b"ping")?;
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    assert_eq!(&b, b"ping");
    Ok(())
}

/// Just enough of a socket builder to bind a source address before connecting.
struct TcpSocketBuilder(std::os::fd::OwnedFd);

impl TcpSocketBuilder {
    fn new(family: i32) -> std::io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the fd is owned from here on.
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor owned by nobody else.
        Ok(Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }
    fn v4() -> std::io::Result<Self> {
        Self::new(libc::AF_INET)
    }
    fn v6() -> std::io::Result<Self> {
        Self::new(libc::AF_INET6)
    }
    fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match a {
            SocketAddr::V4(v) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(*v.ip()).to_be(),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_in fits in sockaddr_storage.
                unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr {
                        s6_addr: v.ip().octets(),
                    },
                    sin6_scope_id: 0,
                };
                // SAFETY: sockaddr_in6 fits in sockaddr_storage.
                unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        (ss, len as libc::socklen_t)
    }
    /// Binds `from`, starts a non-blocking connect to `to` and returns the fd.
    fn bind_start(self, from: SocketAddr, to: SocketAddr) -> std::io::Result<std::os::fd::OwnedFd> {
        let fd = self.0.as_raw_fd();
        let (a, l) = Self::sockaddr(from);
        // SAFETY: valid fd and sockaddr for the duration of each call.
        unsafe {
            if libc::bind(fd, (&a as *const libc::sockaddr_storage).cast(), l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            let (b, l) = Self::sockaddr(to);
            if libc::connect(fd, (&b as *const libc::sockaddr_storage).cast(), l) != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINPROGRESS) {
                    return Err(e);
                }
            }
        }
        Ok(self.0)
    }
    fn bind_connect(self, from: SocketAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
        let fd = self.bind_start(from, to)?;
        let s = TcpStream::from(fd);
        // Wait for the connect, then back to blocking.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match s.peer_addr() {
                Ok(_) => break,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => return Err(e),
            }
        }
        s.set_nonblocking(false)?;
        Ok(s)
    }
}

#[test]
fn half_open_connections_from_one_mh_cannot_starve_the_others() {
    // Plain veth links: the emulator's queues would drop most of a burst of 20,000
    // SYNs and spread the flood over retransmissions.
    let mut lab = Lab::new(LabConfig {
        veth: true,
        msrs: 1,
        ..LabConfig::default()
    })
    .unwrap();
    let cfg = lab.msrd_config(1, "");
    lab.start_msrd(1, &cfg).unwrap();
    // A second MH on the same cell: another station (a MAC of its own; addresses of
    // the flooding station share its setup slots).
    let sta = lab
        .add_station("sta", "10.2.0.101".parse().unwrap(), "02:00:00:00:00:65")
        .unwrap();
    fh_echo(&lab, 7007);
    // The flooding MH: 20,000 connections to the request port that never say a word
    // (two processes: one process's fd limit is 20,000 here).
    let flood = r#"
import select, socket, sys, time
socks = []
for _ in range(10000):
    x = socket.socket()
    x.setblocking(False)
    x.bind(("10.2.0.100", 0))
    try:
        x.connect(("10.2.0.1", 1080))
    except BlockingIOError:
        pass
    socks.append(x)
# Until every connect has an outcome (accepted, or refused by msrd), at most 30 s.
p = select.epoll()
for x in socks:
    p.register(x.fileno(), select.EPOLLOUT)
left, t0 = len(socks), time.time()
while left and time.time() - t0 < 30:
    for fd, _ in p.poll(1):
        p.unregister(fd)
        left -= 1
# The first byte of a SOCKS greeting, and nothing more: half-open at msrd (this also
# completes connections the kernel answered with a SYN cookie).
for x in socks:
    try:
        x.send(b"\x05")
    except OSError:
        pass
open(sys.argv[1], "w").write("ready %d" % left)
time.sleep(60)
"#;
    // msrd with a small fd limit (lowered while it runs), so that the flood is far
    // beyond it: a router's limit is finite, whatever it is.
    let pid = lab.pid(0);
    let ok = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=4096:4096"])
        .status()
        .unwrap();
    assert!(ok.success());
    let marks: Vec<_> = (0..2)
        .map(|i| lab.dir.join(format!("flood{i}.ready")))
        .collect();
    let floods: Vec<usize> = marks
        .iter()
        .map(|m| {
            lab.spawn(Host::Mh, "python3", &["-c", flood, m.to_str().unwrap()])
                .unwrap()
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !marks.iter().all(|m| m.exists()) {
        assert!(std::time::Instant::now() < deadline, "flood did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (open, max) = fds_of(pid);
    assert!(
        open < max / 2,
        "msrd holds {open} fds of {max} during the flood"
    );
    // Another MH is served, and the operator socket answers.
    let served = in_netns(&sta, || {
        Ok(stock_socks_echo("10.2.0.101".parse().unwrap(), fh(7007)))
    })
    .unwrap();
    let st = lab.msrd_stats(1);
    for f in floods {
        lab.terminate(f);
    }
    served.unwrap_or_else(|e| {
        let log = std::fs::read_to_string(lab.dir.join("msrd1.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        panic!(
            "another MH was not served: {e}; stats {st:?}\n{}",
            tail.join("\n")
        )
    });
    let st = st.unwrap_or_else(|e| panic!("itcpctl's socket did not answer: {e}"));
    assert!(st.stats.refused_handshakes > 0, "{st:?}");
}

/// One station (one MAC on the cell) with five addresses in the MH prefix and 300
/// half-open connections per address: without a bound per station it holds every
/// setup slot (`max_handshakes`, 1024) and other stations' connections are reset.
#[test]
fn one_station_with_many_addresses_cannot_take_every_setup_slot() {
    let mut lab = Lab::new(LabConfig {
        veth: true,
        msrs: 1,
        ..LabConfig::default()
    })
    .unwrap();
    let cfg = lab.msrd_config(1, "");
    lab.start_msrd(1, &cfg).unwrap();
    // The other station: a MAC of its own on the same cell.
    let victim: std::net::IpAddr = "10.2.0.101".parse().unwrap();
    let sta = lab
        .add_station("sta", "10.2.0.101".parse().unwrap(), "02:00:00:00:00:65")
        .unwrap();
    // The flooding station's five addresses, all on the MH's air0 (one MAC).
    let mut b = String::new();
    for i in 102..=106 {
        b += &format!("addr add 10.2.0.{i}/24 dev air0\n");
    }
    let ok = Command::new("ip")
        .args(["-n", &lab.ns(Host::Mh), "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(b.as_bytes())?;
            c.wait()
        })
        .unwrap();
    assert!(ok.success());
    fh_echo(&lab, 7008);
    // 300 connections per address that send one byte of a SOCKS greeting and stop;
    // then counts those msrd still holds open (the others it reset at accept).
    let flood = r#"
import errno, select, socket, sys, time
socks = []
for i in range(102, 107):
    for _ in range(300):
        x = socket.socket()
        x.setblocking(False)
        x.bind(("10.2.0.%d" % i, 0))
        try:
            x.connect(("10.2.0.1", 1080))
        except BlockingIOError:
            pass
        socks.append(x)
p = select.epoll()
for x in socks:
    p.register(x.fileno(), select.EPOLLOUT)
left, t0 = len(socks), time.time()
while left and time.time() - t0 < 20:
    for fd, _ in p.poll(1):
        p.unregister(fd)
        left -= 1
for x in socks:
    try:
        x.send(b"\x05")
    except OSError:
        pass
time.sleep(2)
held = 0
for x in socks:
    try:
        if x.recv(1) != b"":
            pass
    except BlockingIOError:
        held += 1
    except OSError:
        pass
open(sys.argv[1] + ".tmp", "w").write("%d" % held)
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"#;
    let mark = lab.dir.join("flood.held");
    let pid = lab
        .spawn(Host::Mh, "python3", &["-c", flood, mark.to_str().unwrap()])
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while !mark.exists() {
        assert!(std::time::Instant::now() < deadline, "flood did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let held: usize = std::fs::read_to_string(&mark).unwrap().parse().unwrap();
    // The other station is served while the flood holds its connections.
    let served = in_netns(&sta, || Ok(stock_socks_echo(victim, fh(7008)))).unwrap();
    let st = lab.msrd_stats(1).unwrap();
    lab.terminate(pid);
    eprintln!(
        "flooding station holds {held} of 1500 half-open; refused_handshakes {}; other station: {served:?}",
        st.stats.refused_handshakes
    );
    served.unwrap_or_else(|e| panic!("the other station was not served: {e}"));
    // The station's share: max_handshakes_per_station, by default max_handshakes_per_mh.
    assert!(held <= 256, "one station holds {held} setup slots");
}

/// curl in the MH, through msrd; its exit status and stderr.
fn curl_mh(lab: &Lab, args: &[&str]) -> (Option<i32>, String, Duration) {
    let t0 = std::time::Instant::now();
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.ns(Host::Mh),
            "curl",
            "-sS",
            "--max-time",
            "8",
        ])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t0.elapsed(),
    )
}

#[test]
fn stock_clients_get_errors_they_understand() {
    let lab = lab_with_msrd("[relay]\nresolve_names = false\n");
    // SOCKS4: a SOCKS4 rejection (91), not a SOCKS5 reply read as a wrong version.
    let (code, err, took) = curl_mh(
        &lab,
        &["--socks4", "10.2.0.1:1080", "http://10.0.0.1:7009/"],
    );
    eprintln!("socks4: {code:?} {err}");
    assert!(err.contains("91") || err.contains("rejected"), "{err}");
    assert!(!err.to_lowercase().contains("version"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // An IPv6 destination from an IPv4 MH: "address type not supported" (08) at once.
    let (code, err, took) = curl_mh(
        &lab,
        &["--socks5", "10.2.0.1:1080", "http://[2001:db8::1]:80/"],
    );
    eprintln!("ipv6: {code:?} {err}");
    assert!(
        err.contains("(8)") || err.to_lowercase().contains("address type"),
        "{err}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Names refused by configuration: 08 too, at once.
    let (code, err, took) = curl_mh(
        &lab,
        &["--socks5-hostname", "10.2.0.1:1080", "http://fh.example/"],
    );
    eprintln!("name: {code:?} {err}");
    assert!(
        err.contains("(8)") || err.to_lowercase().contains("address type"),
        "{err}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn an_unresolvable_name_answers_host_unreachable_within_the_resolve_timeout() {
    // Names are resolved with the router's resolver; in the lab nothing answers (the
    // MSR has no route to any nameserver), so every name fails.
    let lab = lab_with_msrd("[relay]\nresolve_timeout_ms = 1000\n");
    let (code, err, took) = curl_mh(
        &lab,
        &[
            "--socks5-hostname",
            "10.2.0.1:1080",
            "http://nosuch.invalid/",
        ],
    );
    eprintln!("unresolvable: {code:?} {err} in {took:?}");
    assert!(
        err.contains("(4)") || err.to_lowercase().contains("host unreachable"),
        "{err}"
    );
    assert!(took < Duration::from_millis(2500), "{took:?}");
    let log = std::fs::read_to_string(lab.dir.join("msrd1.log")).unwrap_or_default();
    assert!(
        log.contains("nosuch.invalid"),
        "the failure is logged:\n{log}"
    );
}

/// Counts the RSTs the MH and the FH send and receive from now on.
fn watch_rsts(lab: &Lab) {
    lab.watch_rsts(Host::Mh).unwrap();
    lab.watch_rsts(Host::Fh).unwrap();
}

/// No RST sent or received at the MH or the FH since [`watch_rsts`].
fn assert_no_rsts(lab: &Lab) {
    let (mh, fh) = (lab.rsts(Host::Mh).unwrap(), lab.rsts(Host::Fh).unwrap());
    assert_eq!(
        (mh, fh),
        ((0, 0), (0, 0)),
        "RSTs (in, out) at the MH, at the FH"
    );
}

/// Stray segments of a relay that ended gracefully meet silence. A wireless socket in
/// LAST_ACK whose FIN went out again (a tail-loss probe on a cell whose queue delays
/// the answer) closes on the MH's first ACK; the MH's TIME_WAIT answers the second
/// FIN too, and that ACK found no socket: the MSR answered it with an RST (explicit
/// mode), or forwarded it to the FH, which did (transparent mode). Found by the
/// short-connections test over a 100 ms fixed path (1 run in 10). Here the MH's late
/// ACK is sent by hand, once each relay has ended.
#[test]
fn stray_segments_of_an_ended_relay_draw_no_reset() {
    let lab = lab_with_msrd("[transparent]\nenabled = true\nports = [7010]\n");
    watch_rsts(&lab);
    let l = fh_listen(&lab, 7010);
    let server = on(&lab, Host::Fh, move || {
        for _ in 0..2 {
            let (mut s, _) = l.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
        }
    });
    // The MH closes first (the MSR's wireless socket ends in LAST_ACK), reads the
    // echo to its end, and keeps the flow's two ends.
    let flows = on(&lab, Host::Mh, || {
        let mut flows = Vec::new();
        for explicit in [true, false] {
            let mut s = if explicit {
                ItcpStream::connect_with(&mh_opts(), fh(7010))
                    .unwrap()
                    .into_inner()
            } else {
                TcpStream::connect(fh(7010)).unwrap()
            };
            flows.push((s.local_addr().unwrap(), s.peer_addr().unwrap()));
            s.write_all(&[7u8; 3000]).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let mut back = Vec::new();
            s.read_to_end(&mut back).unwrap();
            assert_eq!(back.len(), 3000);
        }
        flows
    })
    .join()
    .unwrap();
    server.join().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !lab.msrd_sessions(1).unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "relays still open");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(lab.rsts(Host::Mh).unwrap(), (0, 0), "before the strays");
    for (mh, peer) in flows {
        lab.send_stray_ack(Host::Mh, mh, peer).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_no_rsts(&lab);
}

/// Segments of an intercepted flow that no socket of the MSR takes (a connection that
/// lives at another MSR, or one that ended here during its move) are dropped, never
/// routed on: in transparent mode the other host's connection on that 4-tuple has
/// other sequence numbers, and takes such a segment for garbage. Found by the
/// overlapped short-connections test (handoff.rs, ~1 run in 10): a held ACK of the
/// MH's, let go after its restored connection had finished, reached the FH, which
/// reset the connection. Here the strays are sent by hand, both ways, on flows the
/// MSR never had.
#[test]
fn segments_of_intercepted_flows_no_socket_takes_are_not_forwarded() {
    let lab = lab_with_msrd("[transparent]\nenabled = true\nports = [7012]\n");
    watch_rsts(&lab);
    let _l = fh_listen(&lab, 7012);
    let mh = SocketAddr::from((addr::MH, 41012));
    lab.send_stray_ack(Host::Mh, mh, fh(7012)).unwrap();
    let mh2 = SocketAddr::from((addr::MH, 41013));
    lab.send_stray_ack(Host::Fh, fh(7012), mh2).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_no_rsts(&lab);
}

/// An unmodified MH reusing its port for a new connection to the same FH port (as its
/// kernel does with ephemeral ports) while msrd's wireless socket of the last one is
/// still in TIME_WAIT (the FH closed first). Found with the port-reuse handoff test:
/// the TIME_WAIT socket took the MH's SYN and, finding no listener on the FH's address,
/// answered with an ACK, which the MH's kernel reset before sending its SYN again
/// (one RST per reuse). A direct path has no such RST: there the FH's TIME_WAIT
/// hands the SYN to its listener. Transparent SYNs go to the TPROXY listener first.
#[test]
fn a_new_connection_on_a_time_wait_flow_opens_without_reset() {
    const PORT: u16 = 7011;
    const CONNS: usize = 5;
    let lab = lab_with_msrd(&format!(
        "[transparent]\nenabled = true\nports = [{PORT}]\n"
    ));
    watch_rsts(&lab);
    let l = fh_listen(&lab, PORT);
    // The FH answers each request and closes first.
    let server = on(&lab, Host::Fh, move || {
        for _ in 0..CONNS {
            let (mut s, _) = l.accept().unwrap();
            let mut got = [0u8; 100];
            s.read_exact(&mut got).unwrap();
            s.write_all(&got).unwrap();
        }
    });
    let mh = on(&lab, Host::Mh, move || {
        let me = SocketAddr::from((addr::MH, 47011));
        for k in 0..CONNS {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            sock.set_reuse_address(true)?;
            sock.bind(&me.into())?;
            sock.connect_timeout(&fh(PORT).into(), Duration::from_secs(5))?;
            let mut s: TcpStream = sock.into();
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(&[k as u8; 100])?;
            let mut back = Vec::new();
            s.read_to_end(&mut back)?;
            if back != [k as u8; 100] {
                return Err(std::io::Error::other(format!("connection {k}: {back:?}")));
            }
            // The MH's close follows the FH's: msrd's wireless socket is in TIME_WAIT.
            drop(s);
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok::<_, std::io::Error>(())
    });
    mh.join().unwrap().unwrap();
    server.join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (mh, fh) = (lab.rsts(Host::Mh).unwrap(), lab.rsts(Host::Fh).unwrap());
    assert_eq!(
        (mh, fh),
        ((0, 0), (0, 0)),
        "RSTs (in, out) at the MH, at the FH over {CONNS} connections from one port"
    );
    assert_eq!(
        lab.msrd_stats(1).unwrap().stats.connections_total,
        CONNS as u64
    );
}

/// The bytes one end writes: runs of pattern bytes, each run followed by one byte sent
/// as urgent data (MSG_OOB), the last run plain. Returns the whole stream as a reader
/// with SO_OOBINLINE must see it: every byte, in order.
fn send_with_urgent(s: &TcpStream, seed: u8, runs: &[usize]) -> std::io::Result<Vec<u8>> {
    let mut all = Vec::new();
    for (k, &n) in runs.iter().enumerate() {
        let run: Vec<u8> = (0..n).map(|i| seed.wrapping_add((i % 251) as u8)).collect();
        (&*s).write_all(&run)?;
        all.extend_from_slice(&run);
        if k + 1 < runs.len() {
            let b = [0xF0 | k as u8];
            // SAFETY: one byte of a live buffer on an open socket.
            let r = unsafe { libc::send(s.as_raw_fd(), b.as_ptr().cast(), 1, libc::MSG_OOB) };
            if r != 1 {
                return Err(std::io::Error::last_os_error());
            }
            all.push(b[0]);
            // Apart, so that each is its own urgent mark at the reader.
            std::thread::sleep(Duration::from_millis(30));
        }
    }
    s.shutdown(Shutdown::Write)?;
    Ok(all)
}

/// Reads to EOF with SO_OOBINLINE (urgent bytes stay in the stream at their place).
fn read_inline(s: &TcpStream) -> std::io::Result<Vec<u8>> {
    socket2::SockRef::from(s).set_out_of_band_inline(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut v = Vec::new();
    (&*s).read_to_end(&mut v)?;
    Ok(v)
}

/// Urgent data (MSG_OOB: telnet's interrupt, FTP's ABOR) crosses msrd both ways as it
/// crosses a router: in order, each urgent byte at its place for a reader that keeps
/// urgent bytes inline, nothing lost after it. Found by sending it: a splice(2) relay
/// never gets past an urgent mark (splice stops there and says EAGAIN), so the stream
/// stalled at the first urgent byte and ended there with the writer's FIN; the copying
/// relay dropped the urgent byte itself.
fn urgent_data_crosses(splice: bool, port: u16) {
    let lab = lab_with_msrd(&format!(
        "[transparent]\nenabled = true\nports = [{port}]\n\n[relay]\nsplice = {splice}\n"
    ));
    let l = fh_listen(&lab, port);
    let up_runs = [5usize, 70_000, 1, 300_000];
    let down_runs = [3usize, 200_000, 4_000];
    let fh_end = on(&lab, Host::Fh, move || {
        let (s, _) = l.accept()?;
        let r = s.try_clone()?;
        let reader = std::thread::spawn(move || read_inline(&r));
        let sent = send_with_urgent(&s, 7, &down_runs)?;
        Ok::<_, std::io::Error>((sent, reader.join().unwrap()?))
    });
    let mh_end = on(&lab, Host::Mh, move || {
        let s = TcpStream::connect_timeout(&fh(port), Duration::from_secs(5))?;
        let r = s.try_clone()?;
        let reader = std::thread::spawn(move || read_inline(&r));
        let sent = send_with_urgent(&s, 3, &up_runs)?;
        Ok::<_, std::io::Error>((sent, reader.join().unwrap()?))
    });
    let (mh_sent, mh_got) = mh_end.join().unwrap().expect("MH end");
    let (fh_sent, fh_got) = fh_end.join().unwrap().expect("FH end");
    for (what, sent, got) in [
        ("MH -> FH", &mh_sent, &fh_got),
        ("FH -> MH", &fh_sent, &mh_got),
    ] {
        let first_diff = sent.iter().zip(got.iter()).position(|(a, b)| a != b);
        assert!(
            sent == got,
            "{what} (splice {splice}): sent {} bytes, {} arrived, first difference at {:?}",
            sent.len(),
            got.len(),
            first_diff
        );
    }
}

#[test]
fn urgent_data_crosses_the_splice_relay() {
    urgent_data_crosses(true, 7012);
}

#[test]
fn urgent_data_crosses_the_copying_relay() {
    urgent_data_crosses(false, 7013);
}
