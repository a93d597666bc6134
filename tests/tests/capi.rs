//! End-to-end tests of the C library (`libitcp`, `itcp.h`) and the `LD_PRELOAD` shim
//! (`libitcp_preload.so`) on the lab: a C program compiled here with `cc` against the
//! header, and unmodified programs (curl, python3), run inside the MH's namespace
//! against real msrd processes. Each test checks that the traffic really went through
//! msrd as explicit I-TCP (msrd's sessions, counters and log), not by plain routing.
//! Needs root and a C compiler.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use itcp_testbed::lab::{addr, bin_path, Host, Lab, LabConfig};
use itcp_testbed::sys::in_netns;

// ---------------------------------------------------------------------------------
// Building the C program

/// The directory holding libitcp.so/.a and libitcp_preload.so (cargo builds them as
/// dev-dependencies of this crate, next to the test binary in target/*/deps).
fn lib_dir() -> PathBuf {
    let so = bin_path("libitcp.so");
    assert!(
        so.exists(),
        "{} not found: build the workspace (cargo builds libitcp as a dev-dependency of itcp-testbed)",
        so.display()
    );
    so.parent().unwrap().to_path_buf()
}

fn preload_so() -> PathBuf {
    let p = lib_dir().join("libitcp_preload.so");
    assert!(p.exists(), "{} not found", p.display());
    p
}

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mh-lib/capi/include")
}

/// Compiles tests/tests/c/itcp_demo.c against itcp.h into `dir`: linked with the shared
/// libitcp (rpath set) or with libitcp.a.
fn compile_demo(dir: &Path, static_link: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/itcp_demo.c");
    let out = dir.join(if static_link {
        "itcp_demo_static"
    } else {
        "itcp_demo"
    });
    let libs = lib_dir();
    let mut cmd = std::process::Command::new("cc");
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(include_dir())
        .arg(&src)
        .arg("-o")
        .arg(&out);
    if static_link {
        cmd.arg(libs.join("libitcp.a"))
            .args(["-lpthread", "-ldl", "-lm"]);
    } else {
        cmd.arg("-L")
            .arg(&libs)
            .arg("-litcp")
            .arg(format!("-Wl,-rpath,{}", libs.display()))
            .arg("-lpthread");
    }
    let o = cmd.output().expect("cc (a C compiler) is needed");
    assert!(
        o.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// What binutils' `tool flag f` prints (readelf, objdump).
fn binutils(tool: &str, flag: &str, f: &Path) -> String {
    let o = std::process::Command::new(tool)
        .arg(flag)
        .arg(f)
        .output()
        .unwrap_or_else(|e| panic!("{tool} (binutils) is needed: {e}"));
    assert!(o.status.success(), "{tool} {flag} {}", f.display());
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `readelf -d` of an ELF file: its dynamic section.
fn dynamic_section(f: &Path) -> String {
    binutils("readelf", "-d", f)
}

/// libitcp.so names its ABI (SONAME `libitcp.so.MAJOR`), a program linked against it
/// records that name, and finds it next to libitcp.so in cargo's output directory.
#[test]
fn libitcp_has_a_soname_that_programs_record_and_find() {
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    let soname = format!("libitcp.so.{major}");
    let lib = dynamic_section(&lib_dir().join("libitcp.so"));
    assert!(
        lib.contains(&format!("(SONAME)             Library soname: [{soname}]")),
        "libitcp.so has no SONAME {soname}:\n{lib}"
    );
    let dir = std::env::temp_dir().join(format!("itcp-soname-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let demo = compile_demo(&dir, false);
    let needed = dynamic_section(&demo);
    assert!(
        needed.contains(&format!("Shared library: [{soname}]")),
        "the program does not record {soname}:\n{needed}"
    );
    let ldd = std::process::Command::new("ldd")
        .arg(&demo)
        .output()
        .unwrap();
    let ldd = String::from_utf8_lossy(&ldd.stdout);
    assert!(
        ldd.contains(&soname) && !ldd.contains("not found"),
        "the program does not find {soname}:\n{ldd}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `objdump -p` or `-T` of `f`.
fn objdump(flag: &str, f: &Path) -> String {
    binutils("objdump", flag, f)
}

/// Every function libitcp.so exports carries the symbol version `libitcp.so.MAJOR`,
/// and a program linked against it records that version for each one it calls: a
/// later library can then keep an old function's behaviour under the old version.
#[test]
fn libitcp_versions_its_symbols_and_programs_record_the_version() {
    let version = format!("libitcp.so.{}", env!("CARGO_PKG_VERSION_MAJOR"));
    let exports = objdump("-T", &lib_dir().join("libitcp.so"));
    let ours: Vec<&str> = exports
        .lines()
        .filter(|l| {
            l.contains(" .text")
                && l.split_whitespace()
                    .last()
                    .is_some_and(|n| n.starts_with("itcp_"))
        })
        .collect();
    assert!(
        ours.len() >= 10,
        "libitcp.so exports {} functions:\n{exports}",
        ours.len()
    );
    let unversioned: Vec<&&str> = ours.iter().filter(|l| !l.contains(&version)).collect();
    assert!(
        unversioned.is_empty(),
        "exported without the version {version}: {unversioned:#?}"
    );
    let dir = std::env::temp_dir().join(format!("itcp-symver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let demo = compile_demo(&dir, false);
    let refs = objdump("-p", &demo);
    assert!(
        refs.contains(&format!("required from {version}:"))
            && refs.contains(&format!(" {version}\n")),
        "the program records no version of {version}:\n{refs}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------
// Running programs in the lab

/// A process in a lab host, killed when dropped.
struct Proc {
    child: Child,
    out: Option<std::thread::JoinHandle<String>>,
    err: Option<std::thread::JoinHandle<String>>,
}

impl Proc {
    fn start(lab: &Lab, h: Host, program: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = lab.command(h, program).unwrap();
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let read = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            })
        };
        let out = child.stdout.take().map(|o| read(Box::new(o)));
        let err = child.stderr.take().map(|e| read(Box::new(e)));
        Proc { child, out, err }
    }

    /// Waits for the exit (killing it after `timeout`): (success, stdout, stderr).
    fn finish(mut self, timeout: Duration) -> (bool, String, String) {
        let deadline = Instant::now() + timeout;
        let ok = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st.success();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self.out.take().unwrap().join().unwrap_or_default();
        let mut err = self.err.take().unwrap().join().unwrap_or_default();
        if Instant::now() > deadline {
            err += &format!("\n(killed after {timeout:?})");
        }
        (ok, out, err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gateway_env() -> String {
    format!("{}:1080", addr::CELL_GW)
}

/// A lab with msrd on MSR1 (no transparent interception: only explicit I-TCP reaches
/// msrd; everything else is routed past it).
fn lab_with_msrd() -> Lab {
    let mut lab = Lab::new(LabConfig::default()).unwrap();
    let cfg = lab.msrd_config(1, "");
    lab.start_msrd(1, &cfg).unwrap();
    lab
}

fn msrd_log(lab: &Lab, k: usize) -> String {
    std::fs::read_to_string(lab.dir.join(format!("msrd{k}.log"))).unwrap_or_default()
}

/// msrd's log lines that say a connection of `kind` (Connect, Accept) opened with the
/// fixed side `fh` (a substring such as "fh=10.0.0.1:8080").
fn opened(lab: &Lab, k: usize, kind: &str, fh: &str) -> usize {
    msrd_log(lab, k)
        .lines()
        .filter(|l| {
            l.contains("connection open") && l.contains(&format!("kind={kind}")) && l.contains(fh)
        })
        .count()
}

fn connections_total(lab: &Lab) -> u64 {
    lab.msrd_stats(1).unwrap().stats.connections_total
}

/// Waits until msrd on MSR `k` logs that it listens for the MH on `port`.
fn wait_msr_listening(lab: &Lab, k: usize, port: u16, what: impl Fn() -> String) {
    let needle = format!("{}:{port}", addr::MH);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !msrd_log(lab, k)
        .lines()
        .any(|l| l.contains("listening for the MH") && l.contains(&needle))
    {
        assert!(
            Instant::now() < deadline,
            "msrd never listened on {needle}: {}\nmsrd log:\n{}",
            what(),
            msrd_log(lab, k)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The byte pattern of itcp_demo.c.
fn pattern(i: u64) -> u8 {
    ((i * 7) % 251) as u8
}

/// A one-connection server on the FH: reads to EOF, checks the pattern, answers
/// "fh got N bytes (W wrong) from PEER". Returns the peer it saw.
fn fh_pattern_server(lab: &Lab, port: u16) -> std::thread::JoinHandle<(SocketAddr, u64)> {
    let l = in_netns(&lab.ns(Host::Fh), || {
        TcpListener::bind(SocketAddr::from((addr::FH, port)))
    })
    .unwrap();
    std::thread::spawn(move || {
        let (mut s, peer) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let (mut n, mut bad) = (0u64, 0u64);
        let mut buf = vec![0u8; 65536];
        loop {
            let r = s.read(&mut buf).unwrap();
            if r == 0 {
                break;
            }
            for &b in &buf[..r] {
                if b != pattern(n) {
                    bad += 1;
                }
                n += 1;
            }
        }
        s.write_all(format!("fh got {n} bytes ({bad} wrong) from {peer}").as_bytes())
            .unwrap();
        (peer, n)
    })
}

// ---------------------------------------------------------------------------------
// The C library

#[test]
fn c_program_connects_and_transfers_through_msrd_shared_and_static() {
    let lab = lab_with_msrd();
    let shared = compile_demo(&lab.dir, false);
    let statik = compile_demo(&lab.dir, true);
    let gw = gateway_env();
    let env = [("ITCP_GATEWAY", gw.as_str())];
    for (i, prog) in [&shared, &statik].into_iter().enumerate() {
        let port = 7101 + i as u16;
        let fh = fh_pattern_server(&lab, port);
        let p = Proc::start(
            &lab,
            Host::Mh,
            prog,
            &[
                "connect",
                &addr::FH.to_string(),
                &port.to_string(),
                "1000000",
            ],
            &env,
        );
        let (ok, out, err) = p.finish(Duration::from_secs(60));
        assert!(
            ok,
            "{}: {out}\n{err}\nmsrd:\n{}",
            prog.display(),
            msrd_log(&lab, 1)
        );
        let (peer, n) = fh.join().unwrap();
        assert_eq!(n, 1_000_000);
        assert_eq!(
            peer.ip(),
            std::net::IpAddr::V4(addr::MH),
            "the FH sees the MH"
        );
        assert!(
            out.contains(&format!(
                "answer fh got 1000000 bytes (0 wrong) from {peer}"
            )),
            "{out}"
        );
        // Through msrd, as an explicit I-TCP (SOCKS CONNECT) session.
        assert_eq!(
            opened(&lab, 1, "Connect", &format!("fh={}:{port}", addr::FH)),
            1,
            "msrd log:\n{}",
            msrd_log(&lab, 1)
        );
    }
    assert_eq!(connections_total(&lab), 2);

    // Errors arrive as errno, with a message naming the gateway and the target.
    let p = Proc::start(
        &lab,
        Host::Mh,
        &shared,
        &["refused", &addr::FH.to_string(), "7199"],
        &env,
    );
    let (ok, out, err) = p.finish(Duration::from_secs(30));
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("errno ECONNREFUSED"), "{out}");
    assert!(
        out.contains(&format!("could not connect to {}:7199", addr::FH)),
        "{out}"
    );
    // No gateway there: the errno of reaching it.
    let p = Proc::start(
        &lab,
        Host::Mh,
        &shared,
        &["refused", &addr::FH.to_string(), "7101"],
        &[("ITCP_GATEWAY", &format!("{}:1", addr::CELL_GW))],
    );
    let (ok, out, err) = p.finish(Duration::from_secs(30));
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("errno ECONNREFUSED") && out.contains("cannot reach I-TCP gateway"),
        "{out}"
    );
}

#[test]
fn c_program_listens_and_accepts_through_msrd() {
    let lab = lab_with_msrd();
    let prog = compile_demo(&lab.dir, false);
    let gw = gateway_env();
    let p = Proc::start(
        &lab,
        Host::Mh,
        &prog,
        &["listen", "7200"],
        &[("ITCP_GATEWAY", gw.as_str())],
    );
    wait_msr_listening(&lab, 1, 7200, String::new);
    let n = 300_000u64;
    let (local, answer) = in_netns(&lab.ns(Host::Fh), || {
        let mut s = TcpStream::connect_timeout(
            &SocketAddr::from((addr::MH, 7200)),
            Duration::from_secs(10),
        )?;
        let data: Vec<u8> = (0..n).map(pattern).collect();
        s.write_all(&data)?;
        s.shutdown(Shutdown::Write)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        Ok((s.local_addr()?, answer))
    })
    .unwrap();
    let (ok, out, err) = p.finish(Duration::from_secs(30));
    assert!(ok, "{out}\n{err}\nmsrd:\n{}", msrd_log(&lab, 1));
    assert!(
        out.contains(&format!("listening {}:7200", addr::MH)),
        "{out}"
    );
    assert!(out.contains(&format!("accepted {local}")), "{out}");
    assert_eq!(answer, format!("got {n} bytes (0 wrong) from {local}"));
    assert_eq!(
        opened(&lab, 1, "Accept", &format!("fh={local}")),
        1,
        "msrd log:\n{}",
        msrd_log(&lab, 1)
    );

    // itcp_close of a listener ends an itcp_accept blocked on it in another thread.
    let p = Proc::start(
        &lab,
        Host::Mh,
        &prog,
        &["listen-close", "7201"],
        &[("ITCP_GATEWAY", gw.as_str())],
    );
    let (ok, out, err) = p.finish(Duration::from_secs(30));
    assert!(ok, "{out}\n{err}\nmsrd:\n{}", msrd_log(&lab, 1));
    assert!(
        out.contains("closed\naccept returned -1 errno ENOENT"),
        "{out}"
    );
    assert!(msrd_log(&lab, 1)
        .lines()
        .any(|l| l.contains("listener closed") && l.contains(&format!("{}:7201", addr::MH))));
}

/// Two MSRs with handoff and no itcp-mh-agent: the C program runs the agent itself
/// (itcp_agent_start) and gets its events through the callback.
#[test]
fn c_program_gets_mobility_events_and_its_connection_survives_the_move() {
    let mut lab = Lab::new(LabConfig::clean(2, 21)).unwrap();
    // What Lab::start_itcp_mobility does, minus its agent process.
    let mh_route = format!("{}/32", addr::MH);
    for args in [
        &["route", "del", mh_route.as_str()][..],
        &["route", "replace", "10.2.0.0/24", "dev", "br0"][..],
    ] {
        let o = lab.run(Host::Gw, "ip", args).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    for k in 1..=2 {
        let extra = lab.handoff_config(k);
        let cfg = lab.msrd_config(k, &extra);
        lab.start_msrd(k, &cfg).unwrap();
    }
    let prog = compile_demo(&lab.dir, false);
    let log = lab.dir.join("demo.events");
    let gw = gateway_env();
    let n = 4_000_000u64;
    let fh = fh_pattern_server(&lab, 7300);
    let p = Proc::start(
        &lab,
        Host::Mh,
        &prog,
        &[
            "mobile",
            log.to_str().unwrap(),
            &addr::FH.to_string(),
            "7300",
            &n.to_string(),
        ],
        &[("ITCP_GATEWAY", gw.as_str())],
    );
    let events = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait = |what: &str, secs: u64| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !events().contains(what) {
            let e = events();
            assert!(
                !e.contains("error"),
                "{e}\nmsrd1:\n{}\nmsrd2:\n{}",
                msrd_log(&lab, 1),
                msrd_log(&lab, 2)
            );
            assert!(
                Instant::now() < deadline,
                "no {what:?} in {secs} s:\n{e}\nmsrd1:\n{}\nmsrd2:\n{}",
                msrd_log(&lab, 1),
                msrd_log(&lab, 2)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait("event attached from= to=msr1", 20);
    wait("half sent", 30);
    // Into cell 2 with an overlap, then out of cell 1: the agent moves the connection.
    lab.assoc(&[1, 2]).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    lab.assoc(&[2]).unwrap();
    wait("event moved from=msr1 to=msr2 connections=1", 30);
    wait("answer", 60);
    let (peer, got) = fh.join().unwrap();
    assert_eq!(got, n);
    assert!(
        events().contains(&format!("answer fh got {n} bytes (0 wrong) from {peer}")),
        "{}",
        events()
    );
    // Out of every cell: DISCONNECTED once the beacons expire; back: RECONNECTED.
    lab.assoc(&[]).unwrap();
    wait("event disconnected from=msr2", 30);
    lab.assoc(&[2]).unwrap();
    wait("event reconnected from=msr2 to=msr2", 30);
    wait("done", 10);
    let (ok, out, err) = p.finish(Duration::from_secs(10));
    assert!(ok, "{out}\n{err}\n{}", events());
    // The user pointer reached the callback; the handoff was msrd's.
    assert!(events().contains("tag=demo"));
    let recs = lab.handoff_records(2);
    assert!(
        recs.iter()
            .any(|r| r.outcome == itcp_handoff::log::Outcome::Moved && r.connections.len() == 1),
        "{recs:?}"
    );
}

// ---------------------------------------------------------------------------------
// The preload shim

/// An HTTP/1.0 server on the FH answering every request with "hello <peer>", until
/// `count` requests are served. Returns the peers.
fn fh_http(lab: &Lab, port: u16, count: usize) -> std::thread::JoinHandle<Vec<SocketAddr>> {
    let l = in_netns(&lab.ns(Host::Fh), || {
        TcpListener::bind(SocketAddr::from((addr::FH, port)))
    })
    .unwrap();
    std::thread::spawn(move || {
        let mut peers = Vec::new();
        for _ in 0..count {
            let (mut s, peer) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            let body = format!("hello {peer}\n");
            let _ = s.write_all(
                format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
            peers.push(peer);
        }
        peers
    })
}

fn program(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is needed (scripts/setup.sh installs it)");
}

#[test]
fn preload_sends_unmodified_curl_and_python_through_itcp() {
    let lab = lab_with_msrd();
    let so = preload_so();
    let so = so.to_str().unwrap();
    let gw = gateway_env();
    let server = fh_http(&lab, 8080, 3);
    let url = format!("http://{}:8080/", addr::FH);

    // Control: without the shim, curl reaches the FH by plain routing, past msrd.
    let p = Proc::start(
        &lab,
        Host::Mh,
        &program("curl"),
        &["-sS", "--max-time", "20", &url],
        &[],
    );
    let (ok, out, err) = p.finish(Duration::from_secs(30));
    assert!(ok, "{out}\n{err}");
    assert!(out.starts_with(&format!("hello {}:", addr::MH)), "{out}");
    assert_eq!(connections_total(&lab), 0, "plain routing must bypass msrd");

    // With the shim: the same unmodified curl, through I-TCP.
    let p = Proc::start(
        &lab,
        Host::Mh,
        &program("curl"),
        &["-sS", "--max-time", "20", &url],
        &[
            ("LD_PRELOAD", so),
            ("ITCP_GATEWAY", &gw),
            ("ITCP_PRELOAD_PORTS", "8080"),
            ("ITCP_PRELOAD_DEBUG", "1"),
        ],
    );
    let (ok, out, err) = p.finish(Duration::from_secs(30));
    assert!(ok, "{out}\n{err}\nmsrd:\n{}", msrd_log(&lab, 1));
    assert!(out.starts_with(&format!("hello {}:", addr::MH)), "{out}");
    assert!(
        err.contains(&format!("to {}:8080: through I-TCP gateway {gw}", addr::FH)),
        "{err}"
    );
    assert_eq!(connections_total(&lab), 1);
    assert_eq!(
        opened(&lab, 1, "Connect", &format!("fh={}:8080", addr::FH)),
        1,
        "msrd log:\n{}",
        msrd_log(&lab, 1)
    );

    // python3's http.client, selected by prefix; getpeername names the FH, not the
    // gateway.
    let script = format!(
        "import http.client\n\
         c = http.client.HTTPConnection('{fh}', 8080, timeout=20)\n\
         c.connect()\n\
         print('peer', c.sock.getpeername())\n\
         c.request('GET', '/')\n\
         r = c.getresponse()\n\
         print(r.status, r.read().decode().strip())\n",
        fh = addr::FH
    );
    let p = Proc::start(
        &lab,
        Host::Mh,
        &program("python3"),
        &["-c", &script],
        &[
            ("LD_PRELOAD", so),
            ("ITCP_GATEWAY", &gw),
            ("ITCP_PRELOAD_PREFIXES", "10.0.0.0/24"),
        ],
    );
    let (ok, out, err) = p.finish(Duration::from_secs(30));
    assert!(ok, "{out}\n{err}\nmsrd:\n{}", msrd_log(&lab, 1));
    assert!(out.contains(&format!("200 hello {}:", addr::MH)), "{out}");
    assert!(
        out.contains(&format!("peer ('{}', 8080)", addr::FH)),
        "{out}"
    );
    assert_eq!(connections_total(&lab), 2);
    assert_eq!(
        opened(&lab, 1, "Connect", &format!("fh={}:8080", addr::FH)),
        2
    );
    let peers = server.join().unwrap();
    assert!(peers
        .iter()
        .all(|p| p.ip() == std::net::IpAddr::V4(addr::MH)));
}

#[test]
fn preload_lets_an_unmodified_python_server_accept_through_itcp() {
    let lab = lab_with_msrd();
    let so = preload_so();
    let gw = gateway_env();
    // A plain socket server: select() for readiness, then accept(), as servers do.
    let script = "import select, socket, sys, time\n\
         s = socket.socket()\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('0.0.0.0', 7400))\n\
         s.listen(5)\n\
         r, _, _ = select.select([s], [], [], 30)\n\
         assert r, 'no connection within 30 s'\n\
         c, a = s.accept()\n\
         data = b''\n\
         while True:\n\
         \x20   b = c.recv(65536)\n\
         \x20   if not b: break\n\
         \x20   data += b\n\
         c.sendall(b'python got %d bytes from %s:%d' % (len(data), a[0].encode(), a[1]))\n\
         print('peer', c.getpeername())\n\
         c.close()\n\
         s.close()\n\
         # Still running: only the shim's close() can have told the MSR.\n\
         for _ in range(200):\n\
         \x20   if any('listener closed' in l and '10.2.0.100:7400' in l for l in open(sys.argv[1])):\n\
         \x20       print('msr listener closed'); break\n\
         \x20   time.sleep(0.05)\n";
    let p = Proc::start(
        &lab,
        Host::Mh,
        &program("python3"),
        &["-c", script, lab.dir.join("msrd1.log").to_str().unwrap()],
        &[
            ("LD_PRELOAD", so.to_str().unwrap()),
            ("ITCP_GATEWAY", &gw),
            ("ITCP_PRELOAD_LISTEN_PORTS", "7400"),
            ("ITCP_PRELOAD_DEBUG", "1"),
        ],
    );
    wait_msr_listening(&lab, 1, 7400, String::new);
    let fh = in_netns(&lab.ns(Host::Fh), || {
        let mut s = TcpStream::connect_timeout(
            &SocketAddr::from((addr::MH, 7400)),
            Duration::from_secs(10),
        )?;
        s.write_all(&b"ping".repeat(10_000))?;
        s.shutdown(Shutdown::Write)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        Ok((s.local_addr()?, answer))
    });
    let (ok, out, err) = p.finish(Duration::from_secs(30));
    let (local, answer) = fh.unwrap_or_else(|e| {
        panic!(
            "FH: {e}\npython: {out}\n{err}\nmsrd:\n{}",
            msrd_log(&lab, 1)
        )
    });
    assert!(ok, "{out}\n{err}\nmsrd:\n{}", msrd_log(&lab, 1));
    assert_eq!(
        answer,
        format!(
            "python got 40000 bytes from {}:{}",
            local.ip(),
            local.port()
        )
    );
    assert!(
        out.contains(&format!("peer ('{}', {})", local.ip(), local.port())),
        "{out}"
    );
    // msrd accepted it for the MH (an explicit I-TCP ACCEPT), not plain routing.
    assert_eq!(
        opened(&lab, 1, "Accept", &format!("fh={local}")),
        1,
        "msrd log:\n{}\nshim:\n{err}",
        msrd_log(&lab, 1)
    );
    assert!(err.contains("I-TCP connection from"), "{err}");
    assert!(out.contains("msr listener closed"), "{out}\n{err}");
}
