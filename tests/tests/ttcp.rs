//! Integration tests of the `ttcp` binary on loopback (127.0.0.1, ephemeral ports).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use itcp_testbed::ttcp::{RecvReport, RrReport, SendReport};

const TIMEOUT: Duration = Duration::from_secs(10);

fn ttcp(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ttcp"));
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A running ttcp process whose output is collected in the background.
struct Proc {
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
    /// The address from "ttcp: listening on ADDR", for listeners.
    addr: Option<SocketAddr>,
}

struct Done {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        Self::start(args, false)
    }

    /// Spawns a listening ttcp (`--listen 127.0.0.1:0` in args) and waits until it
    /// announces its address.
    fn listener(args: &[&str]) -> Proc {
        Self::start(args, true)
    }

    fn start(args: &[&str], listening: bool) -> Proc {
        let mut child = ttcp(args).spawn().expect("spawn ttcp");
        let mut out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let stdout = thread::spawn(move || {
            let mut s = String::new();
            out.read_to_string(&mut s).unwrap();
            s
        });
        let (tx, rx) = mpsc::channel();
        let stderr = thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(err).lines() {
                let line = line.unwrap();
                if let Some(a) = line.strip_prefix("ttcp: listening on ") {
                    let _ = tx.send(a.parse::<SocketAddr>().unwrap());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let mut p = Proc {
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
            addr: None,
        };
        if listening {
            match rx.recv_timeout(TIMEOUT) {
                Ok(a) => p.addr = Some(a),
                Err(_) => {
                    let d = p.wait();
                    panic!("listener did not announce its address: {}", d.stderr);
                }
            }
        }
        p
    }

    fn addr(&self) -> String {
        self.addr.unwrap().to_string()
    }

    /// Waits (killing the process after TIMEOUT) and collects its output.
    fn wait(&mut self) -> Done {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > TIMEOUT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("ttcp did not exit within {TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(5));
        };
        Done {
            code: status.code().unwrap_or(-1),
            stdout: self.stdout.take().unwrap().join().unwrap(),
            stderr: self.stderr.take().unwrap().join().unwrap(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn run(args: &[&str]) -> Done {
    Proc::spawn(args).wait()
}

fn tmp_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ttcp-test-{}-{name}.json", std::process::id()))
}

fn one_line(s: &str) -> &str {
    let mut lines = s.lines();
    let l = lines.next().expect("a JSON line on stdout");
    assert!(lines.next().is_none(), "more than one stdout line: {s}");
    l
}

#[test]
fn transfer_20mb_verifies_and_reports_consistently() {
    let json = tmp_file("20mb");
    let mut recv = Proc::listener(&[
        "recv",
        "--listen",
        "127.0.0.1:0",
        "--bytes",
        "20M",
        "--seed",
        "7",
        "--json",
        json.to_str().unwrap(),
    ]);
    let send = run(&[
        "send",
        "--connect",
        &recv.addr(),
        "--bytes",
        "20M",
        "--seed",
        "7",
    ]);
    let d = recv.wait();
    assert_eq!(d.code, 0, "recv failed: {}", d.stderr);
    assert_eq!(send.code, 0, "send failed: {}", send.stderr);

    let line = one_line(&d.stdout);
    let file = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(file.trim_end(), line, "--json file equals the stdout line");
    let r: RecvReport = serde_json::from_str(line).unwrap();
    let n = 20 * 1024 * 1024;
    assert_eq!(r.role, "recv");
    assert!(r.ok && r.error.is_none(), "{r:?}");
    assert_eq!(r.bytes, n);
    assert_eq!(r.expected_bytes, Some(n));
    assert_eq!(r.seed, 7);
    assert!(r.t0_mono_ns > 0);
    assert_eq!(
        r.timeline_bytes.iter().sum::<u64>(),
        n,
        "timeline sums to bytes"
    );
    assert_eq!(r.bin_s, 0.1);
    assert_eq!(
        r.timeline_bytes.len(),
        (r.last_byte_s / 0.1).floor() as usize + 1,
        "timeline ends in the last byte's bin"
    );
    assert!(0.0 < r.first_byte_s && r.first_byte_s <= r.last_byte_s);
    assert_eq!(r.duration_s, r.last_byte_s);
    let expect_bps = n as f64 * 8.0 / r.duration_s;
    assert!((r.goodput_bps - expect_bps).abs() < 1e-6 * expect_bps);
    assert!(r.longest_stall_s > 0.0 && r.longest_stall_s <= r.last_byte_s);
    assert!(r.longest_stall_at_s + r.longest_stall_s <= r.last_byte_s + 1e-9);
    assert!(r.peer.starts_with("127.0.0.1:") && r.local == recv.addr());
    let ti = r.tcp_info.expect("tcp_info");
    assert!(ti.rcv_mss > 0);

    let s: SendReport = serde_json::from_str(one_line(&send.stdout)).unwrap();
    assert!(
        s.ok && s.role == "send" && s.bytes == n && s.seed == 7,
        "{s:?}"
    );
    assert!(s.duration_s > 0.0 && s.goodput_bps > 0.0);
    assert_eq!(s.peer, recv.addr());
    assert!(s.tcp_info.is_some());
}

#[test]
fn wrong_seed_fails_at_offset_0() {
    let mut recv = Proc::listener(&["recv", "--listen", "127.0.0.1:0", "--seed", "8"]);
    let _send = run(&[
        "send",
        "--connect",
        &recv.addr(),
        "--bytes",
        "1M",
        "--seed",
        "7",
    ]);
    let d = recv.wait();
    assert_eq!(d.code, 1, "{}", d.stderr);
    assert!(
        d.stderr.contains("stream mismatch at byte offset 0:"),
        "{}",
        d.stderr
    );
}

#[test]
fn corrupted_byte_is_detected_at_its_offset() {
    let mut recv = Proc::listener(&["recv", "--listen", "127.0.0.1:0", "--bytes", "2M"]);
    let _send = run(&[
        "send",
        "--connect",
        &recv.addr(),
        "--bytes",
        "2M",
        "--corrupt-at",
        "1000003",
    ]);
    let d = recv.wait();
    assert_eq!(d.code, 1, "{}", d.stderr);
    assert!(
        d.stderr
            .contains("ttcp: stream mismatch at byte offset 1000003:"),
        "{}",
        d.stderr
    );
    let r: RecvReport = serde_json::from_str(one_line(&d.stdout)).unwrap();
    assert!(!r.ok);
    assert!(r.error.unwrap().contains("byte offset 1000003"));
}

#[test]
fn short_stream_names_the_offset_where_it_ended() {
    let mut recv = Proc::listener(&["recv", "--listen", "127.0.0.1:0", "--bytes", "3M"]);
    let send = run(&["send", "--connect", &recv.addr(), "--bytes", "1M"]);
    let d = recv.wait();
    assert_eq!(send.code, 0, "{}", send.stderr);
    assert_eq!(d.code, 1);
    let msg = "stream ended at byte offset 1048576, expected 3145728 bytes";
    assert!(d.stderr.contains(msg), "{}", d.stderr);
    let r: RecvReport = serde_json::from_str(one_line(&d.stdout)).unwrap();
    assert_eq!(r.error.as_deref(), Some(msg));
    assert_eq!(r.bytes, 1 << 20);
    assert_eq!(r.timeline_bytes.iter().sum::<u64>(), 1 << 20);
}

#[test]
fn excess_data_is_an_error() {
    let mut recv = Proc::listener(&["recv", "--listen", "127.0.0.1:0", "--bytes", "100000"]);
    let _send = run(&["send", "--connect", &recv.addr(), "--bytes", "1M"]);
    let d = recv.wait();
    assert_eq!(d.code, 1);
    assert!(
        d.stderr.contains("excess data at byte offset 100000"),
        "{}",
        d.stderr
    );
}

#[test]
fn small_buffers_and_reversed_roles_work() {
    // The sender listens and the receiver connects; both limit their buffers to 16K.
    let mut send = Proc::listener(&[
        "send",
        "--listen",
        "127.0.0.1:0",
        "--bytes",
        "1M",
        "--buf",
        "16K",
        "--chunk",
        "3000",
    ]);
    let recv = run(&[
        "recv",
        "--connect",
        &send.addr(),
        "--bytes",
        "1M",
        "--buf",
        "16K",
    ]);
    let s = send.wait();
    assert_eq!(recv.code, 0, "{}", recv.stderr);
    assert_eq!(s.code, 0, "{}", s.stderr);
    let r: RecvReport = serde_json::from_str(one_line(&recv.stdout)).unwrap();
    assert!(r.ok && r.bytes == 1 << 20);
}

#[test]
fn duration_and_no_verify() {
    let mut recv = Proc::listener(&["recv", "--listen", "127.0.0.1:0", "--no-verify"]);
    let send = run(&[
        "send",
        "--connect",
        &recv.addr(),
        "--duration",
        "0.3",
        "--seed",
        "5",
    ]);
    let d = recv.wait();
    assert_eq!(d.code, 0, "{}", d.stderr);
    let r: RecvReport = serde_json::from_str(one_line(&d.stdout)).unwrap();
    let s: SendReport = serde_json::from_str(one_line(&send.stdout)).unwrap();
    assert!(!r.verified && r.ok && s.ok);
    assert_eq!(r.bytes, s.bytes);
    assert!(r.bytes > 0);
    assert!(
        s.duration_s >= 0.3 && s.duration_s < 3.0,
        "{}",
        s.duration_s
    );
}

#[test]
fn connect_retries_until_the_listener_is_up() {
    // Reserve a port, release it, start the sender first, the receiver 300 ms later.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let mut send = Proc::spawn(&["send", "--connect", &port, "--bytes", "64K"]);
    thread::sleep(Duration::from_millis(300));
    let recv = run(&["recv", "--listen", &port, "--bytes", "64K"]);
    let s = send.wait();
    assert_eq!(recv.code, 0, "{}", recv.stderr);
    assert_eq!(s.code, 0, "{}", s.stderr);
}

#[test]
fn ipv6_loopback_if_available() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback; skipped");
        return;
    }
    let mut recv = Proc::listener(&["recv", "--listen", "[::1]:0", "--bytes", "1M"]);
    let send = run(&["send", "--connect", &recv.addr(), "--bytes", "1M"]);
    let d = recv.wait();
    assert_eq!(d.code, 0, "{}", d.stderr);
    assert_eq!(send.code, 0, "{}", send.stderr);
    let r: RecvReport = serde_json::from_str(one_line(&d.stdout)).unwrap();
    assert!(r.peer.starts_with("[::1]:"));
}

#[test]
fn rr_against_echo_once() {
    let mut echo = Proc::listener(&["echo", "--listen", "127.0.0.1:0", "--once"]);
    let rr = run(&[
        "rr",
        "--connect",
        &echo.addr(),
        "--count",
        "200",
        "--size",
        "100",
    ]);
    assert_eq!(rr.code, 0, "{}", rr.stderr);
    let r: RrReport = serde_json::from_str(one_line(&rr.stdout)).unwrap();
    assert!(r.ok && r.role == "rr", "{r:?}");
    assert_eq!(r.count, 200);
    assert_eq!(r.size, 100);
    assert!(r.p50_us > 0.0);
    assert!(r.min_us <= r.p50_us && r.p50_us <= r.p90_us && r.p90_us <= r.p99_us);
    assert!(r.p99_us <= r.max_us && r.min_us <= r.mean_us && r.mean_us <= r.max_us);
    // --once: the server exits by itself after that one connection.
    let e = echo.wait();
    assert_eq!(e.code, 0, "{}", e.stderr);
}

#[test]
fn usage_errors_exit_2_and_name_the_problem() {
    let d = run(&[
        "send",
        "--connect",
        "127.0.0.1:9",
        "--bytes",
        "1M",
        "--frobnicate",
    ]);
    assert_eq!(d.code, 2);
    assert!(d.stderr.contains("--frobnicate"), "{}", d.stderr);
    assert!(d.stderr.contains("usage:"), "{}", d.stderr);
    assert!(d.stdout.is_empty());

    let d = run(&["recv", "--listen", "127.0.0.1:0", "--buf", "12Q"]);
    assert_eq!(d.code, 2);
    assert!(
        d.stderr.contains("'12Q'") && d.stderr.contains("--buf"),
        "{}",
        d.stderr
    );

    let d = run(&["recv", "--listen", "not-an-address"]);
    assert_eq!(d.code, 2);
    assert!(d.stderr.contains("--listen"), "{}", d.stderr);

    let d = run(&["send", "--connect", "127.0.0.1:9"]);
    assert_eq!(d.code, 2);
    assert!(d.stderr.contains("--bytes or --duration"), "{}", d.stderr);

    let d = run(&["recv", "--corrupt-at", "5", "--listen", "127.0.0.1:0"]);
    assert_eq!(d.code, 2, "--corrupt-at is a sender flag");
    assert!(d.stderr.contains("--corrupt-at"), "{}", d.stderr);

    let d = run(&["bogus"]);
    assert_eq!(d.code, 2);
    assert!(d.stderr.contains("'bogus'"), "{}", d.stderr);

    let d = run(&[]);
    assert_eq!(d.code, 2);

    let d = run(&["--help"]);
    assert_eq!(d.code, 0);
    assert!(d.stdout.contains("ttcp send") && d.stdout.contains("ttcp rr"));
}

#[test]
fn connect_failure_is_a_transfer_error() {
    // Nothing listens on a port we just released: refused until the timeout.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let d = run(&["recv", "--connect", &port, "--connect-timeout", "0.2"]);
    assert_eq!(d.code, 1);
    assert!(d.stderr.contains("ttcp: connect to"), "{}", d.stderr);
    let r: RecvReport = serde_json::from_str(one_line(&d.stdout)).unwrap();
    assert!(!r.ok);
}

/// `tcp_info` reads the kernel's retransmission-timeout counters (past the end of
/// libc's struct): a sender whose segments are dropped for a while times out.
#[test]
fn tcp_info_counts_retransmission_timeouts() {
    use std::io::Write;
    let ns = format!("ittcp-{}", std::process::id());
    let sh = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    };
    sh(&["netns", "add", &ns]);
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    let _del = Del(ns.clone());
    sh(&["-n", &ns, "link", "set", "lo", "up"]);
    let nft = |rule: &str| sh(&["netns", "exec", &ns, "nft", rule]);
    // Dropped on the way in: a drop on the way out is a local error to TCP, not a loss.
    nft("add table inet t; add chain inet t in { type filter hook input priority 0; }");
    let (a, b) = itcp_testbed::sys::in_netns(&ns, || {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let a = std::net::TcpStream::connect(l.local_addr()?)?;
        let (b, _) = l.accept()?;
        Ok((a, b))
    })
    .unwrap();
    let before = itcp_testbed::ttcp::tcp_info(&a).unwrap();
    assert_eq!(before.total_rto, 0, "{before:?}");
    let port = b.local_addr().unwrap().port();
    nft(&format!("add rule inet t in tcp dport {port} drop"));
    (&a).write_all(&[7; 1000]).unwrap();
    // The first timeout comes after ~200 ms (the minimum RTO on loopback), the next
    // after twice that.
    thread::sleep(Duration::from_millis(800));
    nft("flush chain inet t in");
    let mut got = [0u8; 1000];
    (&b).read_exact(&mut got).unwrap();
    thread::sleep(Duration::from_millis(50)); // the ACK reaches the sender
    let after = itcp_testbed::ttcp::tcp_info(&a).unwrap();
    assert!(
        (1..=4).contains(&after.total_rto) && after.total_rto_time_ms >= 150,
        "{after:?}"
    );
}
