//! Socket images on real kernels: live TCP connections are captured in one network
//! namespace (the "old MSR"), deleted there without a packet, restored in another (the
//! "new MSR") and restarted, while the peer — an unmodified socket in a third namespace
//! — keeps its connection and never sees an RST.
//!
//! Topology, built per test with unique names and torn down by a Drop guard:
//!
//! ```text
//!   A (peer, 10.77.0.1) ──veth── M1 (old MSR, 10.77.0.2)      M2 (new MSR, empty)
//! ```
//!
//! The move: the flow is blocked in M1 (nftables drop of its 4-tuple, both directions),
//! the socket captured and deleted, M2 holds the flow (nftables drop of packets from
//! outside, so nothing reaches M2 without a socket and gets an RST), M1's veth end is
//! moved into M2 (`ip link set netns`, same MAC, address re-added), the socket restored
//! in M2, the hold released and the socket restarted.
//!
//! Needs root (CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_ADMIN for setns), `ip` and `nft`.
//! Tests run one at a time so that the timing figures they print are not disturbed.

use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::size_of;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use itcp_handoff::{
    capture, delete, first_flight, restart, restore, unfreeze, RestoreOptions, SendFin,
    SocketImage, TcpState, UnackedRestore,
};

static SERIAL: Mutex<()> = Mutex::new(());
static COUNTER: AtomicU32 = AtomicU32::new(0);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------------------------------------ commands

fn run(args: &[&str], stdin: Option<&str>) -> String {
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")));
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        panic!(
            "`{}` failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            stdin.map(|s| format!("\ninput:\n{s}")).unwrap_or_default()
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(ns: &str, args: &str) {
    let mut v = vec!["ip", "-n", ns];
    v.extend(args.split_whitespace());
    run(&v, None);
}

fn nft(ns: &str, script: &str) {
    run(&["ip", "netns", "exec", ns, "nft", "-f", "-"], Some(script));
}

/// Runs `f` with this thread in network namespace `ns`; sockets made inside stay there.
fn in_ns<T>(ns: &str, f: impl FnOnce() -> T) -> T {
    struct Back(File);
    impl Drop for Back {
        fn drop(&mut self) {
            // SAFETY: an open namespace file; only this thread is affected.
            let r = unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "could not return to the original network namespace");
        }
    }
    let home = Back(File::open("/proc/thread-self/ns/net").unwrap());
    let target = File::open(format!("/run/netns/{ns}")).unwrap();
    // SAFETY: an open namespace file; only this thread is affected.
    let r = unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {ns}: {}", io::Error::last_os_error());
    let out = f();
    drop(home);
    out
}

// ------------------------------------------------------------------ the lab

struct Lab {
    a: String,
    m1: String,
    m2: String,
    v6: bool,
    /// Which namespace holds the MSR end of the veth now.
    msr_side_in_m2: bool,
}

impl Lab {
    fn new(v6: bool) -> Lab {
        if unsafe { libc::geteuid() } != 0 {
            panic!("these tests need root (network namespaces, TCP_REPAIR)");
        }
        remove_stale_namespaces();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let base = format!("ihr-{}-{n}", std::process::id());
        let lab = Lab {
            a: format!("{base}-a"),
            m1: format!("{base}-m1"),
            m2: format!("{base}-m2"),
            v6,
            msr_side_in_m2: false,
        };
        for ns in [&lab.a, &lab.m1, &lab.m2] {
            run(&["ip", "netns", "add", ns], None);
        }
        run(
            &[
                "ip",
                "link",
                "add",
                "va",
                "netns",
                &lab.a,
                "address",
                "02:00:00:00:77:01",
                "type",
                "veth",
                "peer",
                "name",
                "vm",
                "netns",
                &lab.m1,
                "address",
                "02:00:00:00:77:02",
            ],
            None,
        );
        for ns in [&lab.a, &lab.m1, &lab.m2] {
            ip(ns, "link set lo up");
        }
        if v6 {
            ip(&lab.a, "addr add fd77::1/64 dev va nodad");
        } else {
            ip(&lab.a, "addr add 10.77.0.1/24 dev va");
        }
        ip(&lab.a, "link set va up");
        lab.msr_addr_up(&lab.m1);
        // Watch the peer for RSTs in both directions.
        nft(
            &lab.a,
            "table inet watch {\n\
               chain in { type filter hook input priority 0; tcp flags & rst == rst counter; }\n\
               chain out { type filter hook output priority 0; tcp flags & rst == rst counter; }\n\
             }\n",
        );
        lab
    }

    fn msr_addr_up(&self, ns: &str) {
        if self.v6 {
            ip(ns, "addr add fd77::2/64 dev vm nodad");
        } else {
            ip(ns, "addr add 10.77.0.2/24 dev vm");
        }
        ip(ns, "link set vm up");
    }

    fn peer_ip(&self) -> &'static str {
        if self.v6 {
            "fd77::1"
        } else {
            "10.77.0.1"
        }
    }

    fn msr_addr(&self, port: u16) -> SocketAddr {
        if self.v6 {
            format!("[fd77::2]:{port}").parse().unwrap()
        } else {
            format!("10.77.0.2:{port}").parse().unwrap()
        }
    }

    fn fam(&self) -> &'static str {
        if self.v6 {
            "ip6"
        } else {
            "ip"
        }
    }

    /// Drops the flow (peer port `pp`, MSR port `mp`) in `ns`: ingress, egress or both.
    fn block(&self, ns: &str, pp: u16, mp: u16, ingress: bool, egress: bool) {
        let (f, peer) = (self.fam(), self.peer_ip());
        let mut s = String::from("table inet block {\n");
        if ingress {
            s += &format!(
                "chain in {{ type filter hook prerouting priority -300; iifname != \"lo\" {f} saddr {peer} tcp sport {pp} tcp dport {mp} counter drop; }}\n"
            );
        }
        if egress {
            s += &format!(
                "chain out {{ type filter hook output priority -300; {f} daddr {peer} tcp dport {pp} tcp sport {mp} counter drop; }}\n"
            );
        }
        s += "}\n";
        nft(ns, &s);
    }

    /// Loses the MSR's segments of the flow on the way to the peer (dropped as they
    /// arrive in A, like a loss on the air): the MSR's TCP counts them as sent. A drop
    /// in the MSR's own output hook would not do: TCP sees the error and keeps the
    /// bytes unsent.
    fn lose(&self, pp: u16, mp: u16) {
        let (f, peer) = (self.fam(), self.peer_ip());
        nft(
            &self.a,
            &format!(
                "table inet lose {{\n\
                 chain in {{ type filter hook prerouting priority -300; {f} daddr {peer} tcp dport {pp} tcp sport {mp} counter drop; }}\n}}\n"
            ),
        );
    }

    fn unlose(&self) {
        nft(&self.a, "delete table inet lose\n");
    }

    /// Blocks every flow to/from the MSR port `mp` (many connections at once).
    fn block_port(&self, ns: &str, mp: u16) {
        nft(
            ns,
            &format!(
                "table inet block {{\n\
                 chain in {{ type filter hook prerouting priority -300; iifname != \"lo\" tcp dport {mp} drop; }}\n\
                 chain out {{ type filter hook output priority -300; tcp sport {mp} drop; }}\n}}\n"
            ),
        );
    }

    fn unblock(&self, ns: &str) {
        nft(ns, "delete table inet block\n");
    }

    /// Moves the MSR's veth end (and its address) from M1 to M2.
    fn move_to_m2(&mut self) {
        ip(&self.m1, &format!("link set vm netns {}", self.m2));
        self.msr_addr_up(&self.m2.clone());
        self.msr_side_in_m2 = true;
    }

    /// RST segments the peer received and sent so far.
    fn peer_rsts(&self) -> u64 {
        let out = run(
            &[
                "ip", "netns", "exec", &self.a, "nft", "list", "table", "inet", "watch",
            ],
            None,
        );
        out.split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "packets")
            .map(|w| w[1].parse::<u64>().unwrap())
            .sum()
    }
}

/// Deletes namespaces left by test runs that were killed (no Drop on SIGKILL): names
/// `ihr-<pid>-…` whose process is gone.
fn remove_stale_namespaces() {
    let Ok(rd) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("ihr-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip")
                .args(["netns", "del", &name])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in [&self.a, &self.m1, &self.m2] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

// ------------------------------------------------------------------ sockets

fn setopt(fd: &impl AsRawFd, level: i32, name: i32, v: i32) {
    // SAFETY: a live int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        0,
        "setsockopt {level}/{name}: {}",
        io::Error::last_os_error()
    );
}

fn set_cc(fd: &impl AsRawFd, cc: &str) {
    // SAFETY: the bytes of `cc`.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr().cast(),
            cc.len() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "TCP_CONGESTION {cc}: {}", io::Error::last_os_error());
}

#[derive(Default, Clone)]
struct Tune {
    rcvbuf: Option<i32>,
    sndbuf: Option<i32>,
    cc: Option<&'static str>,
}

/// MSR sockets: a send buffer large enough for the queues the tests build.
fn msr_tune() -> Tune {
    Tune {
        sndbuf: Some(1 << 20),
        ..Tune::default()
    }
}

fn raw_socket(addr: &SocketAddr, t: &Tune) -> OwnedFd {
    let fam = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall; we own the result.
    let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(v) = t.rcvbuf {
        setopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v);
    }
    if let Some(v) = t.sndbuf {
        setopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v);
    }
    if let Some(cc) = t.cc {
        set_cc(&fd, cc);
    }
    fd
}

fn listen(lab_ns: &str, addr: SocketAddr, t: &Tune) -> TcpListener {
    in_ns(lab_ns, || {
        let fd = raw_socket(&addr, t);
        setopt(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
        let s = socket2::SockRef::from(&fd);
        s.bind(&addr.into())
            .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        s.listen(1024).unwrap();
        TcpListener::from(fd)
    })
}

fn connect(ns: &str, to: SocketAddr, t: &Tune) -> TcpStream {
    in_ns(ns, || {
        let fd = raw_socket(&to, t);
        socket2::SockRef::from(&fd)
            .connect(&to.into())
            .unwrap_or_else(|e| panic!("connect {to}: {e}"));
        TcpStream::from(fd)
    })
}

/// A connected pair: (peer side in A, MSR side in M1).
fn pair(lab: &Lab, l: &TcpListener, port: u16, peer: &Tune) -> (TcpStream, TcpStream) {
    let a = connect(&lab.a, lab.msr_addr(port), peer);
    let (m, _) = l.accept().unwrap();
    (a, m)
}

fn ioctl_u32(s: &impl AsRawFd, req: libc::Ioctl) -> u32 {
    let mut v: libc::c_int = 0;
    // SAFETY: one int out.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), req, &mut v as *mut libc::c_int) };
    assert_eq!(r, 0);
    v as u32
}

fn tcp_state(s: &impl AsFd) -> u8 {
    itcp_handoff::repair::tcp_info(s.as_fd()).unwrap().state
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

// ------------------------------------------------------------------ byte patterns

/// Byte `i` of stream `seed`: a hash, so any lost, duplicated or shifted byte shows.
fn pat(seed: u64, i: u64) -> u8 {
    let mut x = i ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 29;
    x as u8
}

/// The writing end of a pattern stream.
struct Gen {
    seed: u64,
    off: u64,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen { seed, off: 0 }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let v = (0..n as u64)
            .map(|i| pat(self.seed, self.off + i))
            .collect();
        self.off += n as u64;
        v
    }
    /// Writes `n` bytes (blocking).
    fn write(&mut self, s: &mut TcpStream, n: usize) {
        let b = self.bytes(n);
        s.write_all(&b).unwrap();
    }
    /// Writes up to `n` bytes without blocking; returns how many went in.
    fn write_nb(&mut self, s: &mut TcpStream, n: usize) -> usize {
        s.set_nonblocking(true).unwrap();
        let b: Vec<u8> = (0..n as u64)
            .map(|i| pat(self.seed, self.off + i))
            .collect();
        let mut done = 0;
        while done < n {
            match s.write(&b[done..]) {
                Ok(k) => done += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("write: {e}"),
            }
        }
        s.set_nonblocking(false).unwrap();
        self.off += done as u64;
        done
    }
}

/// Checks `data` against stream `seed` from offset `off`.
fn check(seed: u64, off: u64, data: &[u8], what: &str) {
    if let Some(i) = (0..data.len()).find(|&i| data[i] != pat(seed, off + i as u64)) {
        panic!(
            "{what}: byte {} (stream offset {}) is wrong: got {:#04x}, want {:#04x}",
            i,
            off + i as u64,
            data[i],
            pat(seed, off + i as u64)
        );
    }
}

fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    s.read_exact(&mut v).unwrap();
    v
}

/// Reads until EOF in a thread; returns the bytes and the time the `mark`-th byte came.
fn reader(mut s: TcpStream, mark: usize) -> JoinHandle<io::Result<(Vec<u8>, Option<Instant>)>> {
    thread::spawn(move || {
        let mut v = Vec::new();
        let mut at = None;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok((v, at));
            }
            v.extend_from_slice(&buf[..n]);
            if at.is_none() && v.len() >= mark {
                at = Some(Instant::now());
            }
        }
    })
}

/// Reads exactly `n` bytes in a thread; returns them and when the last one came.
fn reader_n(mut s: TcpStream, n: usize) -> JoinHandle<io::Result<(Vec<u8>, Instant)>> {
    thread::spawn(move || {
        let mut v = vec![0; n];
        s.read_exact(&mut v)?;
        Ok((v, Instant::now()))
    })
}

fn describe(img: &SocketImage) -> String {
    format!(
        "state {:?}, unacked {} B, unsent {} B, fin {:?}, recv {} B{}, mss {}, wscale {:?}, sack {}, ts {}, snd_wnd {}",
        img.state,
        img.send.unacked.len(),
        img.send.unsent.len(),
        img.send.fin,
        img.recv.data.len(),
        if img.recv.fin { " + FIN" } else { "" },
        img.options.mss,
        img.options.wscale.map(|w| (w.snd, w.rcv)),
        img.options.sack,
        img.options.timestamps,
        img.window.snd_wnd,
    )
}

/// Captures `m` in M1 (flow already blocked), deletes it, moves the MSR into M2 behind
/// a hold, restores there. Returns the image and the restored socket (repair mode).
fn hand_over(
    lab: &mut Lab,
    m: TcpStream,
    pp: u16,
    mp: u16,
    opts: &RestoreOptions,
) -> (SocketImage, TcpStream) {
    let orig_mss = itcp_handoff::repair::tcp_info(m.as_fd()).unwrap().snd_mss;
    let t = Instant::now();
    let img = capture(m.as_fd()).unwrap();
    let t_cap = t.elapsed();
    // The image goes over the wire in its binary form.
    let wire = img.to_bytes();
    let img = SocketImage::from_bytes(&wire).unwrap();
    delete(OwnedFd::from(m)).unwrap();
    lab.block(&lab.m2.clone(), pp, mp, true, false);
    lab.move_to_m2();
    let t = Instant::now();
    let fd = in_ns(&lab.m2.clone(), || restore(&img, opts)).unwrap();
    let t_res = t.elapsed();
    eprintln!(
        "  image: {} ({} B on the wire); capture {:?}, restore {:?}",
        describe(&img),
        wire.len(),
        t_cap,
        t_res
    );
    // The restored socket segments like the original (TCP_MAXSEG before connect), its
    // timestamp clock continues from the captured value, its window is the captured one.
    let info = itcp_handoff::repair::tcp_info(fd.as_fd()).unwrap();
    assert_eq!(info.snd_mss, orig_mss, "restored MSS");
    let ts = itcp_handoff::repair::timestamp(fd.as_fd()).unwrap();
    assert!(
        ts.wrapping_sub(img.timestamp) < 100,
        "timestamp clock {ts} vs captured {}",
        img.timestamp
    );
    let w = itcp_handoff::repair::repair_window(fd.as_fd()).unwrap();
    assert_eq!(
        (w.snd_wl1, w.snd_wnd, w.max_window, w.rcv_wnd, w.rcv_wup),
        (
            img.window.snd_wl1,
            img.window.snd_wnd,
            img.window.max_window,
            img.window.rcv_wnd,
            img.window.rcv_wup
        ),
        "restored window"
    );
    (img, TcpStream::from(fd))
}

/// Restarts a restored socket from namespace `ns`, the socket's own: restart replays a
/// segment to it through a raw socket of the calling thread's namespace.
fn restart_in(ns: &str, r: &TcpStream, img: &SocketImage, opts: &RestoreOptions) {
    in_ns(ns, || restart(r.as_fd(), img, opts)).unwrap();
}

// ------------------------------------------------------------------ tests

/// Test 1: data flowing both ways, bytes in both queues (unacked ones the peer has,
/// unacked ones it lacks, unsent ones), moved; every byte arrives once, in order, both
/// ways, and the connection keeps going. No RST.
#[test]
fn live_connection_moves_with_both_queues() {
    let _g = serial();
    for policy in [UnackedRestore::Auto, UnackedRestore::AsSent] {
        eprintln!("move with both queues, unacked restore policy {policy:?}:");
        let mut lab = Lab::new(false);
        let mp = 7000;
        let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
        // A small receive buffer at the peer keeps its window (and so what is in
        // flight) small, leaving most of the MSR's bytes unsent.
        let (mut a, mut m) = pair(
            &lab,
            &l,
            mp,
            &Tune {
                rcvbuf: Some(8192),
                ..Tune::default()
            },
        );
        let pp = a.local_addr().unwrap().port();
        let (mut down, mut up) = (Gen::new(1), Gen::new(2)); // MSR->peer, peer->MSR

        // Phase 1: plain exchange.
        down.write(&mut m, 100_000);
        check(1, 0, &read_n(&mut a, 100_000), "phase 1 down");
        up.write(&mut a, 50_000);
        check(2, 0, &read_n(&mut m, 50_000), "phase 1 up");

        // Phase 2: queue bytes everywhere. The peer sends 30 kB the MSR does not read.
        up.write(&mut a, 30_000);
        wait_until(
            "30 kB in the MSR's receive queue",
            Duration::from_secs(2),
            || ioctl_u32(&m, libc::FIONREAD) == 30_000,
        );
        // 3 kB reach the peer but its ACKs are dropped: unacked bytes the peer has.
        lab.block(&lab.m1.clone(), pp, mp, true, false);
        down.write(&mut m, 3_000);
        thread::sleep(Duration::from_millis(20));
        // Then segments are lost on the way: what the window allows is sent into the
        // void (unacked bytes the peer lacks), the rest stays unsent.
        lab.lose(pp, mp);
        let w = down.write_nb(&mut m, 200_000);
        assert_eq!(w, 200_000, "send buffer too small for the test");
        thread::sleep(Duration::from_millis(10));
        // Freeze: the flow is blocked at the MSR in both directions.
        lab.unblock(&lab.m1.clone());
        lab.block(&lab.m1.clone(), pp, mp, true, true);
        lab.unlose();

        let opts = RestoreOptions {
            unacked: policy,
            ..RestoreOptions::default()
        };
        let (img, mut r) = hand_over(&mut lab, m, pp, mp, &opts);
        assert_eq!(img.state, TcpState::Established);
        assert!(
            img.send.unacked.len() > 3_000,
            "unacked: {}",
            img.send.unacked.len()
        );
        assert!(!img.send.unsent.is_empty());
        assert_eq!(img.recv.data.len(), 30_000);
        assert_eq!(
            img.send.unacked.len() + img.send.unsent.len(),
            203_000,
            "the MSR's send queue"
        );

        // Release the hold, restart.
        lab.unblock(&lab.m2.clone());
        let t = Instant::now();
        restart_in(&lab.m2, &r, &img, &opts);
        eprintln!("  restart {:?}", t.elapsed());

        // The peer reads everything; the restored socket reads the peer's 30 kB + more.
        let ra = reader(a.try_clone().unwrap(), 0);
        let mut rr = r.try_clone().unwrap();
        let up_total = 30_000 + 100_000;
        let rm = thread::spawn(move || {
            let mut v = vec![0; up_total];
            rr.read_exact(&mut v).map(|_| v)
        });
        up.write(&mut a, 100_000);
        down.write(&mut r, 100_000);
        r.shutdown(Shutdown::Write).unwrap();
        let (got, _) = ra.join().unwrap().expect("peer read failed (RST?)");
        // The 3 kB the peer had received before the move were still unread.
        assert_eq!(
            got.len(),
            203_000 + 100_000,
            "bytes the peer got after phase 1"
        );
        check(1, 100_000, &got, "down after the move");
        let got_up = rm.join().unwrap().expect("restored socket read failed");
        check(2, 50_000, &got_up, "up after the move");
        a.shutdown(Shutdown::Write).unwrap();
        let mut end = [0u8; 1];
        assert_eq!(r.read(&mut end).unwrap(), 0, "EOF after the peer's FIN");
        assert_eq!(lab.peer_rsts(), 0, "the peer saw or sent an RST");
    }
}

/// Test 2: half-closed connections move and finish cleanly.
#[test]
fn half_closed_connections_move() {
    let _g = serial();

    // (a) The peer had sent FIN; the MSR had not read it (nor 20 kB before it).
    {
        eprintln!("peer FIN received (CLOSE_WAIT):");
        let mut lab = Lab::new(false);
        let mp = 7001;
        let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
        let (mut a, m) = pair(&lab, &l, mp, &Tune::default());
        let pp = a.local_addr().unwrap().port();
        let mut up = Gen::new(3);
        up.write(&mut a, 20_000);
        a.shutdown(Shutdown::Write).unwrap();
        wait_until("CLOSE_WAIT", Duration::from_secs(2), || tcp_state(&m) == 8);
        lab.block(&lab.m1.clone(), pp, mp, true, true);
        let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
        assert_eq!(img.state, TcpState::CloseWait);
        assert!(img.recv.fin);
        assert_eq!(tcp_state(&r), 8, "restored socket in CLOSE_WAIT");
        lab.unblock(&lab.m2.clone());
        restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 20_000, "bytes before EOF");
        check(3, 0, &got, "queued bytes before the peer's FIN");
        let mut down = Gen::new(4);
        down.write(&mut r, 50_000);
        r.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        a.read_to_end(&mut got).unwrap();
        check(4, 0, &got, "reply after the move");
        assert_eq!(got.len(), 50_000);
        wait_until("restored socket closed", Duration::from_secs(2), || {
            tcp_state(&r) == 7
        });
        assert_eq!(lab.peer_rsts(), 0);
    }

    // (b) We had sent FIN behind 40 kB the peer had not read (FIN_WAIT1, FIN queued).
    {
        eprintln!("our FIN queued (FIN_WAIT1):");
        let mut lab = Lab::new(false);
        let mp = 7002;
        let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
        let (mut a, mut m) = pair(
            &lab,
            &l,
            mp,
            &Tune {
                rcvbuf: Some(4096),
                ..Tune::default()
            },
        );
        let pp = a.local_addr().unwrap().port();
        let mut down = Gen::new(5);
        assert_eq!(down.write_nb(&mut m, 40_000), 40_000);
        m.shutdown(Shutdown::Write).unwrap();
        thread::sleep(Duration::from_millis(20));
        assert_eq!(tcp_state(&m), 4, "FIN_WAIT1");
        lab.block(&lab.m1.clone(), pp, mp, true, true);
        let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
        assert_eq!(img.state, TcpState::FinWait1);
        assert_eq!(img.send.fin, SendFin::Queued);
        lab.unblock(&lab.m2.clone());
        restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
        let mut got = Vec::new();
        a.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 40_000);
        check(5, 0, &got, "bytes before our FIN");
        let mut up = Gen::new(6);
        up.write(&mut a, 30_000);
        a.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 30_000);
        check(6, 0, &got, "the peer's bytes after our FIN");
        assert_eq!(lab.peer_rsts(), 0);
    }

    // (c) Our FIN acknowledged (FIN_WAIT2); the peer keeps sending.
    {
        eprintln!("our FIN acknowledged (FIN_WAIT2):");
        let mut lab = Lab::new(false);
        let mp = 7003;
        let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
        let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
        let pp = a.local_addr().unwrap().port();
        let mut down = Gen::new(7);
        down.write(&mut m, 10_000);
        m.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        a.read_to_end(&mut got).unwrap();
        check(7, 0, &got, "before the move");
        wait_until("FIN_WAIT2", Duration::from_secs(2), || tcp_state(&m) == 5);
        let mut up = Gen::new(8);
        up.write(&mut a, 10_000);
        wait_until("10 kB queued", Duration::from_secs(2), || {
            ioctl_u32(&m, libc::FIONREAD) == 10_000
        });
        lab.block(&lab.m1.clone(), pp, mp, true, true);
        let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
        assert_eq!(img.state, TcpState::FinWait2);
        assert_eq!(img.send.fin, SendFin::Acked);
        lab.unblock(&lab.m2.clone());
        restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
        up.write(&mut a, 10_000);
        a.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 20_000);
        check(8, 0, &got, "the peer's bytes");
        wait_until("restored socket closed", Duration::from_secs(2), || {
            tcp_state(&r) == 7
        });
        assert_eq!(lab.peer_rsts(), 0);
    }

    // (d) Both FINs, ours (and 3 kB before it) sent but lost (LAST_ACK); re-sent as new
    // or restored as sent.
    for policy in [UnackedRestore::Auto, UnackedRestore::AsSent] {
        eprintln!("LAST_ACK with unacknowledged bytes and FIN, {policy:?}:");
        let mut lab = Lab::new(false);
        let mp = 7004;
        let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
        let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
        let pp = a.local_addr().unwrap().port();
        a.shutdown(Shutdown::Write).unwrap();
        let mut nothing = Vec::new();
        m.read_to_end(&mut nothing).unwrap();
        lab.lose(pp, mp);
        let mut down = Gen::new(9);
        down.write(&mut m, 3_000);
        m.shutdown(Shutdown::Write).unwrap();
        thread::sleep(Duration::from_millis(10));
        lab.block(&lab.m1.clone(), pp, mp, true, true);
        lab.unlose();
        assert_eq!(tcp_state(&m), 9, "LAST_ACK");
        let opts = RestoreOptions {
            unacked: policy,
            ..RestoreOptions::default()
        };
        let (img, r) = hand_over(&mut lab, m, pp, mp, &opts);
        assert_eq!(img.state, TcpState::LastAck);
        assert_eq!(img.send.fin, SendFin::Sent);
        assert_eq!(img.send.unacked.len(), 3_000);
        lab.unblock(&lab.m2.clone());
        restart_in(&lab.m2, &r, &img, &opts);
        let t = Instant::now();
        let mut got = Vec::new();
        a.read_to_end(&mut got).unwrap();
        eprintln!("  restart -> peer EOF {:?}", t.elapsed());
        assert_eq!(got.len(), 3_000);
        check(9, 0, &got, "bytes before our FIN");
        wait_until("restored socket closed", Duration::from_secs(10), || {
            tcp_state(&r) == 7
        });
        assert_eq!(lab.peer_rsts(), 0);
    }
}

/// Test 3: restored unacknowledged bytes the peer lacks reach it within milliseconds of
/// restart (re-sent as new data), instead of waiting for a probe or RTO.
#[test]
fn unacked_bytes_reach_the_peer_at_once() {
    let _g = serial();
    let mut figures = Vec::new();
    for policy in [UnackedRestore::Auto, UnackedRestore::AsSent] {
        let mut lab = Lab::new(false);
        let mp = 7010;
        let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
        let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
        let pp = a.local_addr().unwrap().port();
        let mut down = Gen::new(10);
        down.write(&mut m, 10_000);
        check(10, 0, &read_n(&mut a, 10_000), "warm-up");
        // 8 kB are sent and lost on the way.
        lab.lose(pp, mp);
        down.write(&mut m, 8_000);
        thread::sleep(Duration::from_millis(5));
        lab.block(&lab.m1.clone(), pp, mp, true, true);
        lab.unlose();
        let (img, r) = hand_over(
            &mut lab,
            m,
            pp,
            mp,
            &RestoreOptions {
                unacked: policy,
                ..RestoreOptions::default()
            },
        );
        assert_eq!(
            img.send.unacked.len(),
            8_000,
            "all 8 kB sent and unacknowledged"
        );
        assert!(img.send.unsent.is_empty());
        lab.unblock(&lab.m2.clone());
        let ra = reader_n(a.try_clone().unwrap(), 8_000);
        let t0 = Instant::now();
        restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
        let (got, at) = ra.join().unwrap().unwrap();
        check(10, 10_000, &got, "restored bytes");
        let dt = at.duration_since(t0);
        r.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        a.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        eprintln!("  {policy:?}: restart -> peer holds all 8000 unacked bytes: {dt:?}");
        figures.push((policy, dt));
        assert_eq!(lab.peer_rsts(), 0);
    }
    let (_, auto) = figures[0];
    assert!(
        auto < Duration::from_millis(200),
        "unacked bytes re-sent as new took {auto:?}"
    );
}

/// Many bytes in flight whose ACKs the freeze dropped (the peer has them all): more
/// than the restored socket's first flight. `Auto` restores them as sent so the peer's
/// ACK (beyond what a re-sending socket would have sent) is accepted.
#[test]
fn large_flight_with_lost_acks_moves() {
    let _g = serial();
    let mut lab = Lab::new(false);
    let mp = 7020;
    let LostAcks {
        a: _peer,
        m,
        pp,
        mut down,
        ra,
        ..
    } = flight_with_lost_acks(&lab, mp, "reno", 11, 400_000);
    let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
    eprintln!(
        "  in flight at capture: {} B ({} segments)",
        img.send.unacked.len(),
        img.send.unacked.len().div_ceil(img.options.mss as usize)
    );
    assert!(
        img.send.unacked.len() > 10 * img.options.mss as usize,
        "need more than 10 segments in flight"
    );
    lab.unblock(&lab.m2.clone());
    let t0 = Instant::now();
    restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
    down.write(&mut r, 100_000);
    r.shutdown(Shutdown::Write).unwrap();
    let (got, _) = ra.join().unwrap().expect("peer read");
    eprintln!("  restart -> peer EOF: {:?}", t0.elapsed());
    assert_eq!(got.len() as u64, down.off);
    check(11, 0, &got, "whole stream");
    assert_eq!(lab.peer_rsts(), 0);
}

/// The same large flight restored as msrd restores it: the new host gives the peer a
/// route whose initial window covers the flight (`initcwnd`, as msrd's flight route
/// does), so `Auto` re-sends the flight as new data. The peer has every byte and its
/// ACKs are beyond anything the restored socket sent until the whole flight is out
/// again: if the socket stops short of it, every ACK the peer sends is one of unsent
/// data, which the kernel drops, and the connection never moves again. `cc` is the
/// MSR socket's congestion control.
fn large_flight_with_an_initial_window_that_covers_it(cc: &'static str, mp: u16) {
    let _g = serial();
    let mut lab = Lab::new(false);
    let f = flight_with_lost_acks(&lab, mp, cc, 12, 400_000);
    let img = capture(f.m.as_fd()).unwrap();
    let segs = first_flight(&img, img.options.mss as usize) + 1;
    eprintln!(
        "  in flight at capture: {} B ({segs} segments)",
        img.send.unacked.len()
    );
    assert!(segs > 20, "need a large flight");
    restart_behind_flight_route(&mut lab, f, img, cc);
}

#[test]
fn a_large_flight_re_sent_with_bbr_reaches_the_peer() {
    large_flight_with_an_initial_window_that_covers_it("bbr", 7021);
}

#[test]
fn a_large_flight_re_sent_with_cubic_reaches_the_peer() {
    large_flight_with_an_initial_window_that_covers_it("cubic", 7022);
}

/// An image whose last bytes are queued as unsent although the peer has them: a copy
/// of the connection at an earlier MSR sent them (found by the unmodified-MH test of
/// the testbed: a download stalled for good after a move, the restored socket having
/// re-sent 135 segments of a flight and the MH acknowledging 32 segments beyond). The
/// restored socket's first flight must reach the end of its queue, or the peer's
/// ACKs are all of "unsent data", which the kernel drops, and the connection never
/// moves again.
#[test]
fn bytes_the_peer_has_queued_as_unsent_do_not_stall_the_restored_socket() {
    let _g = serial();
    let mut lab = Lab::new(false);
    let f = flight_with_lost_acks(&lab, 7023, "bbr", 13, 300_000);
    let mut img = capture(f.m.as_fd()).unwrap();
    assert!(img.send.unsent.is_empty() && img.send.unacked.len() > 100_000);
    // The last 32 segments' worth: sent (the peer has them), recorded as unsent.
    let cut = img.send.unacked.len() - 32 * 1448;
    img.send.unsent = img.send.unacked.split_off(cut);
    restart_behind_flight_route(&mut lab, f, img, "bbr");
}

/// A flight lost on the way (sent into the MH's old cell) behind which more is queued
/// than the peer's window takes, restored as msrd restores it (behind a flight route
/// whose initial window covers the queue): `Auto` re-sends the flight as new data and
/// the peer has it within milliseconds. The flight was restored as sent whenever the
/// whole queue exceeded the peer's window: it filled that window, the restored socket
/// could send nothing new to draw the SACKs that repair it, and it waited for its
/// retransmission timeout; on a slow cell with room in the window, the repair of the
/// head queued behind the whole first flight (`bench firstbyte`: ~1 move in 20 read its
/// first byte after ~300 ms). The peer cannot hold bytes beyond the window's right
/// edge, which never moves back, so a first flight that reaches it is enough.
#[test]
fn a_lost_flight_behind_a_full_window_is_re_sent_at_once() {
    let _g = serial();
    let mut lab = Lab::new(false);
    let mp = 7024;
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let peer = Tune {
        rcvbuf: Some(32 << 10),
        ..Tune::default()
    };
    let (mut a, mut m) = pair(&lab, &l, mp, &peer);
    let pp = a.local_addr().unwrap().port();
    let mut down = Gen::new(14);
    down.write(&mut m, 100_000);
    check(14, 0, &read_n(&mut a, 100_000), "warm-up");
    // A window's worth is sent and lost; the rest waits behind it.
    lab.lose(pp, mp);
    down.write_nb(&mut m, 300_000);
    thread::sleep(Duration::from_millis(20));
    lab.block(&lab.m1.clone(), pp, mp, true, true);
    lab.unlose();
    let img = capture(m.as_fd()).unwrap();
    let (unacked, unsent) = (img.send.unacked.len(), img.send.unsent.len());
    eprintln!(
        "  lost in flight {unacked} B, unsent {unsent} B, the peer's window {} B",
        img.window.snd_wnd
    );
    assert!(unacked > 0, "nothing in flight");
    assert!(
        unacked + unsent > img.window.snd_wnd as usize,
        "the queue must exceed the peer's window"
    );
    delete(OwnedFd::from(m)).unwrap();
    lab.block(&lab.m2.clone(), pp, mp, true, false);
    lab.move_to_m2();
    let segs = first_flight(&img, img.options.mss as usize) + 1;
    let route = format!(
        "route replace {}/32 dev vm initcwnd {}",
        lab.peer_ip(),
        segs + 2
    );
    ip(&lab.m2.clone(), &route);
    let r = in_ns(&lab.m2.clone(), || {
        restore(&img, &RestoreOptions::default())
    })
    .unwrap();
    let r = TcpStream::from(r);
    lab.unblock(&lab.m2.clone());
    let ra = reader_n(a.try_clone().unwrap(), unacked);
    let t0 = Instant::now();
    restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
    let (got, at) = ra.join().unwrap().unwrap();
    check(14, 100_000, &got, "the lost flight");
    let dt = at.duration_since(t0);
    eprintln!("  restart -> the peer holds the lost flight: {dt:?}");
    assert!(
        dt < Duration::from_millis(100),
        "the lost flight took {dt:?}"
    );
    // The rest follows, every byte once.
    let rest = unacked + unsent;
    let tail = read_n(&mut a, rest - unacked);
    check(
        14,
        100_000 + unacked as u64,
        &tail,
        "the bytes queued behind it",
    );
    assert_eq!(lab.peer_rsts(), 0);
}

/// A connection (MSR side `m` on port `mp` with congestion control `cc`, seeded
/// stream `seed`) whose window grew over 4 MB, then whose peer's ACKs were dropped
/// while `flight` more bytes reached it: the peer has them all. The flow is blocked
/// both ways at M1.
struct LostAcks {
    a: TcpStream,
    m: TcpStream,
    pp: u16,
    mp: u16,
    down: Gen,
    ra: JoinHandle<io::Result<(Vec<u8>, Option<Instant>)>>,
}

fn flight_with_lost_acks(
    lab: &Lab,
    mp: u16,
    cc: &'static str,
    seed: u64,
    flight: usize,
) -> LostAcks {
    let tune = Tune {
        cc: Some(cc),
        sndbuf: Some(4 << 20),
        ..Tune::default()
    };
    let l = listen(&lab.m1, lab.msr_addr(mp), &tune);
    let (a, mut m) = pair(
        lab,
        &l,
        mp,
        &Tune {
            rcvbuf: Some(4 << 20),
            ..Tune::default()
        },
    );
    let pp = a.local_addr().unwrap().port();
    let mut down = Gen::new(seed);
    // Grow the congestion window.
    let ra = reader(a.try_clone().unwrap(), 0);
    down.write(&mut m, 4_000_000);
    thread::sleep(Duration::from_millis(50));
    // ACKs from the peer are dropped from now on; data still reaches it.
    lab.block(&lab.m1.clone(), pp, mp, true, false);
    down.write_nb(&mut m, flight);
    thread::sleep(Duration::from_millis(30));
    lab.unblock(&lab.m1.clone());
    lab.block(&lab.m1.clone(), pp, mp, true, true);
    LostAcks {
        a,
        m,
        pp,
        mp,
        down,
        ra,
    }
}

/// Moves `f` to M2 as msrd would with image `img`: the original deleted, restored
/// behind a route whose initial window is msrd's flight route's (the first flight and
/// 2 more), restarted; then 100 kB more and the close. The peer must read the whole
/// stream within 5 s, with no RST.
fn restart_behind_flight_route(lab: &mut Lab, f: LostAcks, img: SocketImage, what: &str) {
    let LostAcks {
        a,
        m,
        pp,
        mp,
        mut down,
        ra,
    } = f;
    delete(OwnedFd::from(m)).unwrap();
    lab.block(&lab.m2.clone(), pp, mp, true, false);
    lab.move_to_m2();
    let segs = first_flight(&img, img.options.mss as usize) + 1;
    ip(
        &lab.m2.clone(),
        &format!(
            "route replace {}/32 dev vm initcwnd {}",
            lab.peer_ip(),
            segs + 2
        ),
    );
    let r = in_ns(&lab.m2.clone(), || {
        restore(&img, &RestoreOptions::default())
    })
    .unwrap();
    let mut r = TcpStream::from(r);
    lab.unblock(&lab.m2.clone());
    let t0 = Instant::now();
    restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
    down.write(&mut r, 100_000);
    r.shutdown(Shutdown::Write).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ra.is_finished() {
        assert!(
            Instant::now() < deadline,
            "{what}: the peer had not all {} B 5 s after the restart: it holds {} B unread, \
             the restored socket {} B unacknowledged",
            down.off,
            ioctl_u32(&a, libc::FIONREAD),
            ioctl_u32(&r, libc::TIOCOUTQ)
        );
        thread::sleep(Duration::from_millis(10));
    }
    let (got, _) = ra.join().unwrap().expect("peer read");
    eprintln!("  {what}: restart -> peer EOF: {:?}", t0.elapsed());
    assert_eq!(got.len() as u64, down.off);
    check(down.seed, 0, &got, "whole stream");
    assert_eq!(lab.peer_rsts(), 0);
}

/// A connection whose peer (`a`) has sent 8000 bytes the MSR socket (`m`) received
/// and acknowledged, every ACK lost: the peer still holds them as unacknowledged. The
/// flow is blocked both ways at M1 and the loss is over. Returns (a, m, peer port, the
/// peer's stream after 18000 bytes).
fn acks_lost(lab: &Lab, mp: u16, seed: u64) -> (TcpStream, TcpStream, u16, Gen) {
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let (mut a, mut m) = pair(lab, &l, mp, &Tune::default());
    let pp = a.local_addr().unwrap().port();
    let mut up = Gen::new(seed);
    up.write(&mut a, 10_000);
    check(seed, 0, &read_n(&mut m, 10_000), "warm-up");
    // The MSR's ACKs are lost from now on; the peer's bytes still reach it.
    lab.lose(pp, mp);
    up.write(&mut a, 8_000);
    wait_until("8 kB at the MSR", Duration::from_secs(2), || {
        ioctl_u32(&m, libc::FIONREAD) == 8_000
    });
    assert_eq!(
        ioctl_u32(&a, libc::TIOCOUTQ),
        8_000,
        "the peer holds its bytes as unacknowledged"
    );
    lab.block(&lab.m1, pp, mp, true, true);
    lab.unlose();
    (a, m, pp, up)
}

/// Waits (2 s at most) until the peer holds nothing unacknowledged, after `what`.
fn wait_acknowledged(a: &TcpStream, t0: Instant, what: &str) {
    let end = t0 + Duration::from_secs(2);
    while ioctl_u32(a, libc::TIOCOUTQ) != 0 {
        assert!(
            Instant::now() < end,
            "the peer's snd_una did not advance in 2 s: it still holds {} B \
             unacknowledged (the socket sent it no acceptable ACK after {what})",
            ioctl_u32(a, libc::TIOCOUTQ)
        );
        thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "  peer's bytes acknowledged {:?} after {what}",
        t0.elapsed()
    );
}

/// The peer's bytes reached the old MSR and were acknowledged, but the ACKs were lost
/// on the way back (a downlink queue full of other traffic), so the peer still holds
/// them as unacknowledged. The MSR side never sent a byte (the accepted side of an
/// upload). The restored socket must tell the peer on its own, with an ACK the peer
/// accepts, even while none of the peer's retransmissions reach it (msrd's network
/// detection drops the MH's first packet in a new cell; here the new MSR's hold stays
/// on). The repair-off window probe alone does not do it: its sequence number is
/// `snd_una - 1` by design, so the peer answers it but ignores its ACK field.
#[test]
fn restored_socket_acknowledges_bytes_whose_acks_were_lost() {
    let _g = serial();
    let mut lab = Lab::new(false);
    let mp = 7025;
    let (mut a, m, pp, mut up) = acks_lost(&lab, mp, 18);
    let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
    assert!(img.send.unacked.is_empty() && img.send.unsent.is_empty());
    assert_eq!(img.recv.data.len(), 8_000);
    // Restart behind the hold: the peer's retransmissions keep being dropped.
    let t0 = Instant::now();
    restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
    wait_acknowledged(&a, t0, "restart");
    lab.unblock(&lab.m2.clone());
    check(18, 10_000, &read_n(&mut r, 8_000), "queued bytes");
    up.write(&mut a, 20_000);
    check(18, 18_000, &read_n(&mut r, 20_000), "after the move");
    assert_eq!(lab.peer_rsts(), 0);
}

/// Rollback: bytes the peer sent and the MSR received, whose ACKs were lost, are
/// acknowledged as the socket unfreezes, while the peer's retransmissions still do not
/// get through (the window probe alone tells the peer nothing it accepts).
#[test]
fn unfrozen_socket_acknowledges_bytes_whose_acks_were_lost() {
    let _g = serial();
    let lab = Lab::new(false);
    let mp = 7026;
    let (mut a, mut m, pp, mut up) = acks_lost(&lab, mp, 19);
    capture(m.as_fd()).unwrap();
    // Rolling back: the MSR may send again, the peer's retransmissions still drop.
    lab.unblock(&lab.m1);
    lab.block(&lab.m1, pp, mp, true, false);
    let t0 = Instant::now();
    in_ns(&lab.m1, || unfreeze(m.as_fd(), 0)).unwrap();
    wait_acknowledged(&a, t0, "unfreeze");
    lab.unblock(&lab.m1);
    check(19, 10_000, &read_n(&mut m, 8_000), "queued bytes");
    up.write(&mut a, 5_000);
    check(19, 18_000, &read_n(&mut m, 5_000), "after the rollback");
    assert_eq!(lab.peer_rsts(), 0);
}

/// A restored socket whose peer had more of its bytes than the image said (their ACKs
/// died in the freeze) hears the peer's ACK land inside a restored segment. The kernel
/// trims a partly acknowledged segment only when it spans several MSS: a one-MSS
/// segment keeps its acknowledged head, so the send queue holds more bytes than
/// SIOCOUTQ counts. Moving that connection again must capture just the unacknowledged
/// ones (seen in a soak: "SIOCOUTQ says 1237 data bytes, peek returned 2649", the
/// MH's handoff refused again and again).
#[test]
fn a_partly_acknowledged_segment_moves_again() {
    let _g = serial();
    let mut lab = Lab::new(false);
    let mp = 7027;
    let seed = 21;
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
    setopt(&m, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    let pp = a.local_addr().unwrap().port();
    let mut down = Gen::new(seed);
    down.write(&mut m, 10_000);
    check(seed, 0, &read_n(&mut a, 10_000), "warm-up");
    // The peer gets 600 bytes, its ACK is lost; the next 600 are lost on the way.
    lab.block(&lab.m1.clone(), pp, mp, true, false);
    down.write(&mut m, 600);
    check(seed, 10_000, &read_n(&mut a, 600), "first 600");
    lab.lose(pp, mp);
    down.write(&mut m, 600);
    thread::sleep(Duration::from_millis(5));
    lab.unblock(&lab.m1.clone());
    lab.block(&lab.m1.clone(), pp, mp, true, true);
    lab.unlose();
    let as_sent = RestoreOptions {
        unacked: UnackedRestore::AsSent,
        ..RestoreOptions::default()
    };
    let (img, r) = hand_over(&mut lab, m, pp, mp, &as_sent);
    assert_eq!(img.send.unacked.len(), 1_200, "both writes unacknowledged");
    // Restarted; what it sends stays lost, so the 1200-byte segment stays queued.
    lab.lose(pp, mp);
    lab.unblock(&lab.m2.clone());
    restart_in(&lab.m2, &r, &img, &as_sent);
    // The peer's next segment carries its ACK: 600 bytes into the restored segment.
    a.write_all(b"ping").unwrap();
    let mut r = r;
    assert_eq!(read_n(&mut r, 4), b"ping");
    wait_until(
        "the peer's ACK at the restored socket",
        Duration::from_secs(2),
        || ioctl_u32(&r, libc::TIOCOUTQ) == 600,
    );
    // Moved again, within M2.
    lab.block(&lab.m2.clone(), pp, mp, true, true);
    let img2 = capture(r.as_fd()).expect("capture of a partly acknowledged segment");
    eprintln!("  second image: {}", describe(&img2));
    assert_eq!(img2.send.una, img.send.una.wrapping_add(600));
    check(seed, 10_600, &img2.send.unacked, "unacknowledged bytes");
    assert!(img2.send.unsent.is_empty());
    delete(OwnedFd::from(r)).unwrap();
    let fd = in_ns(&lab.m2.clone(), || {
        restore(&img2, &RestoreOptions::default())
    })
    .unwrap();
    let mut r = TcpStream::from(fd);
    lab.unlose();
    lab.unblock(&lab.m2.clone());
    restart_in(&lab.m2, &r, &img2, &RestoreOptions::default());
    down.write(&mut r, 5_000);
    r.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    a.read_to_end(&mut rest).unwrap();
    assert_eq!(
        rest.len() as u64,
        down.off - 10_600,
        "bytes after the first 600"
    );
    check(seed, 10_600, &rest, "after both moves");
    assert_eq!(lab.peer_rsts(), 0);
}

/// An idle connection (everything sent both ways acknowledged) is restarted with one
/// segment to the peer, its current ACK: with nothing of ours to send and the peer's
/// window open, the answer to a window probe would tell the socket nothing, and a
/// thousand such connections moving at once cost the hosts 2000 packets more. It used
/// to send the probe too (2 segments at the peer). The connection then runs both ways.
#[test]
fn an_idle_restored_connection_sends_the_peer_only_its_ack() {
    let _g = serial();
    let mut lab = Lab::new(false);
    let mp = 7031;
    let seed = 23;
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
    let pp = a.local_addr().unwrap().port();
    let (mut up, mut down) = (Gen::new(seed), Gen::new(seed + 1));
    up.write(&mut a, 5_000);
    check(seed, 0, &read_n(&mut m, 5_000), "upload");
    down.write(&mut m, 5_000);
    check(seed + 1, 0, &read_n(&mut a, 5_000), "download");
    wait_until("all acknowledged", Duration::from_secs(2), || {
        ioctl_u32(&a, libc::TIOCOUTQ) == 0 && ioctl_u32(&m, libc::TIOCOUTQ) == 0
    });
    lab.block(&lab.m1.clone(), pp, mp, true, true);
    let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
    assert!(img.nothing_to_send(), "{}", describe(&img));
    lab.unblock(&lab.m2.clone());
    let segs_in = || itcp_handoff::repair::tcp_info(a.as_fd()).unwrap().segs_in;
    let before = segs_in();
    restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        segs_in() - before,
        1,
        "segments the peer received from the restarted idle socket"
    );
    up.write(&mut a, 20_000);
    check(
        seed,
        5_000,
        &read_n(&mut r, 20_000),
        "upload after the move",
    );
    down.write(&mut r, 20_000);
    check(
        seed + 1,
        5_000,
        &read_n(&mut a, 20_000),
        "download after the move",
    );
    assert_eq!(lab.peer_rsts(), 0);
}

/// Test 4: rollback: capture, then unfreeze in place: the connection keeps working.
#[test]
fn rollback_unfreeze_keeps_the_connection() {
    let _g = serial();
    let lab = Lab::new(false);
    let mp = 7030;
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
    let pp = a.local_addr().unwrap().port();
    let (mut down, mut up) = (Gen::new(12), Gen::new(13));
    down.write(&mut m, 5_000);
    check(12, 0, &read_n(&mut a, 5_000), "before");
    up.write(&mut a, 7_000);
    wait_until("queued", Duration::from_secs(2), || {
        ioctl_u32(&m, libc::FIONREAD) == 7_000
    });
    lab.lose(pp, mp);
    down.write(&mut m, 8_000);
    thread::sleep(Duration::from_millis(5));
    lab.block(&lab.m1, pp, mp, true, true);
    lab.unlose();
    let img = capture(m.as_fd()).unwrap();
    eprintln!("  image: {}", describe(&img));
    assert_eq!(img.send.unacked.len(), 8_000);
    assert_eq!(img.recv.data.len(), 7_000);
    // Reads fail while frozen.
    assert!(
        (&m).read(&mut [0u8; 10]).is_err(),
        "a frozen socket must not be readable"
    );
    lab.unblock(&lab.m1);
    in_ns(&lab.m1, || unfreeze(m.as_fd(), 0)).unwrap();
    check(12, 5_000, &read_n(&mut a, 8_000), "after rollback, down");
    check(13, 0, &read_n(&mut m, 7_000), "after rollback, queued up");
    up.write(&mut a, 9_000);
    check(13, 7_000, &read_n(&mut m, 9_000), "after rollback, up");
    assert_eq!(lab.peer_rsts(), 0);
}

/// IPv6: a connection with queued bytes and the peer's FIN moves.
#[test]
fn ipv6_half_closed_moves() {
    let _g = serial();
    let mut lab = Lab::new(true);
    let mp = 7040;
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let (mut a, mut m) = pair(
        &lab,
        &l,
        mp,
        &Tune {
            rcvbuf: Some(4096),
            ..Tune::default()
        },
    );
    let pp = a.local_addr().unwrap().port();
    let (mut down, mut up) = (Gen::new(14), Gen::new(15));
    up.write(&mut a, 12_000);
    a.shutdown(Shutdown::Write).unwrap();
    wait_until("CLOSE_WAIT", Duration::from_secs(2), || tcp_state(&m) == 8);
    assert_eq!(down.write_nb(&mut m, 50_000), 50_000);
    lab.block(&lab.m1.clone(), pp, mp, true, true);
    let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
    assert!(img.local.is_ipv6());
    assert_eq!(img.state, TcpState::CloseWait);
    lab.unblock(&lab.m2.clone());
    restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
    let ra = reader(a.try_clone().unwrap(), 0);
    let mut got = Vec::new();
    r.read_to_end(&mut got).unwrap();
    check(15, 0, &got, "peer's bytes before its FIN");
    assert_eq!(got.len(), 12_000);
    down.write(&mut r, 1_000);
    r.shutdown(Shutdown::Write).unwrap();
    let (got, _) = ra.join().unwrap().unwrap();
    assert_eq!(got.len(), 51_000);
    check(14, 0, &got, "our bytes");
    assert_eq!(lab.peer_rsts(), 0);
}

/// Capture, restore and restart cost per socket: 50 idle connections moved together,
/// and one with ~1 MB queued each way. Prints the figures.
#[test]
fn bench_capture_restore_per_socket() {
    let _g = serial();

    // Empty queues: 50 connections.
    {
        let mut lab = Lab::new(false);
        let mp = 7050;
        let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
        let n = 50;
        let mut peers = Vec::new();
        let mut msrs = Vec::new();
        for i in 0..n {
            let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
            m.write_all(&[i as u8; 100]).unwrap();
            assert_eq!(read_n(&mut a, 100), vec![i as u8; 100]);
            a.write_all(&[i as u8; 10]).unwrap();
            assert_eq!(read_n(&mut m, 10), vec![i as u8; 10]);
            peers.push(a);
            msrs.push(m);
        }
        lab.block_port(&lab.m1.clone(), mp);
        let t = Instant::now();
        let imgs: Vec<SocketImage> = msrs.iter().map(|m| capture(m.as_fd()).unwrap()).collect();
        let cap = t.elapsed();
        let t = Instant::now();
        let wire: Vec<Vec<u8>> = imgs.iter().map(|i| i.to_bytes()).collect();
        let imgs: Vec<SocketImage> = wire
            .iter()
            .map(|w| SocketImage::from_bytes(w).unwrap())
            .collect();
        let enc = t.elapsed();
        let t = Instant::now();
        for m in msrs {
            delete(OwnedFd::from(m)).unwrap();
        }
        let del = t.elapsed();
        lab.block_port(&lab.m2.clone(), mp);
        lab.move_to_m2();
        let t = Instant::now();
        let restored: Vec<TcpStream> = in_ns(&lab.m2.clone(), || {
            imgs.iter()
                .map(|i| TcpStream::from(restore(i, &RestoreOptions::default()).unwrap()))
                .collect()
        });
        let res = t.elapsed();
        lab.unblock(&lab.m2.clone());
        let t = Instant::now();
        in_ns(&lab.m2, || {
            for (r, i) in restored.iter().zip(&imgs) {
                restart(r.as_fd(), i, &RestoreOptions::default()).unwrap();
            }
        });
        let rst = t.elapsed();
        let per = |d: Duration| d / n as u32;
        eprintln!(
            "empty queues, {n} sockets: per socket capture {:?}, encode+decode {:?}, delete {:?}, restore {:?}, restart {:?} (image {} B)",
            per(cap),
            per(enc),
            per(del),
            per(res),
            per(rst),
            wire[0].len()
        );
        for (i, (mut a, mut r)) in peers.into_iter().zip(restored).enumerate() {
            r.write_all(&[i as u8; 50]).unwrap();
            assert_eq!(read_n(&mut a, 50), vec![i as u8; 50]);
            a.write_all(&[i as u8; 20]).unwrap();
            assert_eq!(read_n(&mut r, 20), vec![i as u8; 20]);
        }
        assert_eq!(lab.peer_rsts(), 0);
    }

    // ~1 MB queued each way.
    {
        let mut lab = Lab::new(false);
        let mp = 7051;
        let big = Tune {
            rcvbuf: Some(4 << 20),
            sndbuf: Some(4 << 20),
            ..Tune::default()
        };
        let l = listen(&lab.m1, lab.msr_addr(mp), &big);
        let (mut a, mut m) = pair(
            &lab,
            &l,
            mp,
            &Tune {
                rcvbuf: Some(64 << 10),
                sndbuf: Some(4 << 20),
                ..Tune::default()
            },
        );
        let pp = a.local_addr().unwrap().port();
        let (mut down, mut up) = (Gen::new(16), Gen::new(17));
        let mb = 1 << 20;
        assert_eq!(up.write_nb(&mut a, mb), mb);
        wait_until(
            "1 MB in the MSR's receive queue",
            Duration::from_secs(5),
            || ioctl_u32(&m, libc::FIONREAD) == mb as u32,
        );
        assert_eq!(down.write_nb(&mut m, mb), mb);
        thread::sleep(Duration::from_millis(20));
        lab.block(&lab.m1.clone(), pp, mp, true, true);
        let (img, r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
        assert_eq!(img.recv.data.len(), mb);
        lab.unblock(&lab.m2.clone());
        let t = Instant::now();
        restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
        eprintln!(
            "1 MB each way ({} B send queue, {} B receive queue): restart {:?}",
            img.send.unacked.len() + img.send.unsent.len(),
            img.recv.data.len(),
            t.elapsed()
        );
        let ra = reader(a.try_clone().unwrap(), 0);
        let mut rr = r.try_clone().unwrap();
        let got_up = thread::spawn(move || {
            let mut v = vec![0; mb];
            rr.read_exact(&mut v).map(|_| v)
        });
        r.shutdown(Shutdown::Write).unwrap();
        let (got, _) = ra.join().unwrap().unwrap();
        assert_eq!(got.len(), mb);
        check(16, 0, &got, "down");
        check(17, 0, &got_up.join().unwrap().unwrap(), "up");
        assert_eq!(lab.peer_rsts(), 0);
    }
}

/// Control: without a hold at the new MSR and without a restored socket, the peer's
/// next segment is answered with RST — the failure the hold prevents, and proof that
/// the RST counter sees it.
#[test]
fn control_without_hold_the_peer_gets_rst() {
    let _g = serial();
    let mut lab = Lab::new(false);
    let mp = 7060;
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let (mut a, m) = pair(&lab, &l, mp, &Tune::default());
    let pp = a.local_addr().unwrap().port();
    lab.block(&lab.m1.clone(), pp, mp, true, true);
    delete(OwnedFd::from(m)).unwrap();
    lab.move_to_m2();
    a.write_all(b"hello").unwrap();
    let mut buf = [0u8; 1];
    let e = a.read(&mut buf).expect_err("the peer must get RST");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    assert!(lab.peer_rsts() >= 1, "the RST counter missed it");
}

/// The socket options we set travel with the image.
#[test]
fn socket_options_are_carried() {
    let _g = serial();
    let mut lab = Lab::new(false);
    let mp = 7070;
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
    let pp = a.local_addr().unwrap().port();
    let opts: [(i32, i32, i32); 9] = [
        (libc::IPPROTO_TCP, libc::TCP_NODELAY, 1),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 33),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 7),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 4),
        (libc::SOL_SOCKET, libc::SO_MARK, 0x77),
        (libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, 32768),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 25_000),
        (libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP, 300_000),
    ];
    for (level, name, v) in opts {
        setopt(&m, level, name, v);
    }
    set_cc(&m, "reno");
    let get = |s: &TcpStream, level, name| {
        itcp_handoff::repair::get_int(s.as_fd(), level, name, "test getsockopt").unwrap()
    };
    let sndbuf = get(&m, libc::SOL_SOCKET, libc::SO_SNDBUF);
    let clamp = get(&m, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP);
    m.write_all(b"x").unwrap();
    read_n(&mut a, 1);
    lab.block(&lab.m1.clone(), pp, mp, true, true);
    let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
    assert_eq!(img.sockopts.congestion.as_deref(), Some("reno"));
    lab.unblock(&lab.m2.clone());
    restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
    for (level, name, v) in opts {
        let want = if name == libc::TCP_WINDOW_CLAMP {
            clamp
        } else {
            v
        };
        assert_eq!(get(&r, level, name), want, "option {level}/{name}");
    }
    assert_eq!(
        get(&r, libc::SOL_SOCKET, libc::SO_SNDBUF),
        sndbuf,
        "SO_SNDBUF"
    );
    let cc =
        itcp_handoff::repair::get_string(r.as_fd(), libc::IPPROTO_TCP, libc::TCP_CONGESTION, "cc")
            .unwrap();
    assert_eq!(cc, "reno");
    r.write_all(b"y").unwrap();
    assert_eq!(read_n(&mut a, 1), b"y");
    assert_eq!(lab.peer_rsts(), 0);
}

/// Sockets that have no image are refused with errors that say why; `delete` of a live
/// (never captured) socket is silent too.
#[test]
fn refusals_and_silent_delete() {
    let _g = serial();
    let lab = Lab::new(false);
    let mp = 7080;
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let e = capture(l.as_fd()).unwrap_err().to_string();
    assert!(e.contains("LISTEN") && e.contains("re-create"), "{e}");

    // Never connected: CLOSED.
    let fresh = in_ns(&lab.a, || raw_socket(&lab.msr_addr(mp), &Tune::default()));
    let e = capture(fresh.as_fd()).unwrap_err().to_string();
    assert!(e.contains("CLOSED"), "{e}");

    // Handshake in progress: SYN_SENT (the MSR drops the SYN).
    nft(
        &lab.m1,
        "table inet syn {\n chain in { type filter hook prerouting priority -300; tcp dport 9999 drop; }\n}\n",
    );
    let s = in_ns(&lab.a, || raw_socket(&lab.msr_addr(9999), &Tune::default()));
    itcp_handoff::repair::set_nonblocking(s.as_fd(), true).unwrap();
    // Non-blocking: EINPROGRESS.
    let _ = socket2::SockRef::from(&s).connect(&lab.msr_addr(9999).into());
    assert_eq!(tcp_state(&s), 2, "SYN_SENT");
    let e = capture(s.as_fd()).unwrap_err().to_string();
    assert!(e.contains("SYN_SENT") && e.contains("handshake"), "{e}");
    assert!(
        !itcp_handoff::repair::in_repair(s.as_fd()).unwrap(),
        "left as found"
    );

    // delete() of a live socket sends neither FIN nor RST.
    let (mut a, m) = pair(&lab, &l, mp, &Tune::default());
    delete(OwnedFd::from(m)).unwrap();
    a.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let e = a.read(&mut [0u8; 1]).expect_err("nothing may arrive");
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{e}"
    );
    assert_eq!(lab.peer_rsts(), 0);
}

/// Urgent data the MSR socket has not read yet: a reader that does not keep urgent
/// bytes inline gets the stream without the urgent byte (taken out of band instead).
/// SIOCINQ counts only the bytes before the urgent mark and a peek stops there, so a
/// capture took those bytes as the whole queue and placed them at its end: the bytes
/// after the mark were lost and those before it read twice. The image holds what such a
/// reader would read; the urgent byte itself cannot be restored as urgent and is left
/// out (msrd passes it on out of band before reading past it).
#[test]
fn urgent_data_in_the_receive_queue_moves() {
    // Bytes before the mark left unread, and none (the reader is at the mark).
    urgent_data_moves(1_000, 7028, 22);
    urgent_data_moves(3_000, 7029, 23);
}

fn urgent_data_moves(read_before: usize, mp: u16, seed: u64) {
    let _g = serial();
    let mut lab = Lab::new(false);
    let l = listen(&lab.m1, lab.msr_addr(mp), &msr_tune());
    let (mut a, mut m) = pair(&lab, &l, mp, &Tune::default());
    setopt(&a, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    let pp = a.local_addr().unwrap().port();
    let mut up = Gen::new(seed);
    up.write(&mut a, 3_000);
    check(seed, 0, &read_n(&mut m, read_before), "read before");
    // SAFETY: one byte of a live buffer on an open socket.
    let r = unsafe { libc::send(a.as_raw_fd(), b"!".as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(r, 1);
    thread::sleep(Duration::from_millis(20));
    up.write(&mut a, 5_000);
    wait_until(
        "8000 bytes and the urgent one at the MSR",
        Duration::from_secs(2),
        || {
            // SIOCINQ stops at the urgent mark, unless urgent bytes are kept inline.
            let before_mark = ioctl_u32(&m, libc::FIONREAD);
            setopt(&m, libc::SOL_SOCKET, libc::SO_OOBINLINE, 1);
            let all = ioctl_u32(&m, libc::FIONREAD);
            setopt(&m, libc::SOL_SOCKET, libc::SO_OOBINLINE, 0);
            (before_mark, all) == (3_000 - read_before as u32, 8_001 - read_before as u32)
        },
    );
    lab.block(&lab.m1.clone(), pp, mp, true, true);
    let (img, mut r) = hand_over(&mut lab, m, pp, mp, &RestoreOptions::default());
    let queued = 8_000 - read_before;
    assert_eq!(
        img.recv.data.len(),
        queued,
        "the bytes around the urgent one"
    );
    lab.unblock(&lab.m2.clone());
    restart_in(&lab.m2, &r, &img, &RestoreOptions::default());
    check(
        seed,
        read_before as u64,
        &read_n(&mut r, queued),
        "the moved receive queue",
    );
    up.write(&mut a, 2_000);
    a.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    check(seed, 8_000, &rest, "after the move");
    assert_eq!(rest.len(), 2_000);
    assert_eq!(lab.peer_rsts(), 0);
}
